//! Harness for pg_ticket's integration tests: real PostgreSQL clusters of the
//! version whose pg_config is in `$PG_CONFIG` (default 15; started with
//! `scripts/cluster.sh`, the extension preloaded) and real client
//! connections. Every test binary starts its own cluster on its own
//! port, so binaries never share state; tests inside one binary share it and
//! use distinct scope names.

use postgres::{Client, NoTls};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repo root")
}

/// A test's registry is new to its fleet: it grants at once instead of
/// holding off as a created registry does (tests of that hold-off create
/// the extension themselves).
pub const CREATE_EXTENSION: &str = "CREATE EXTENSION pg_ticket; SELECT pgticket.end_lease_hold_off()";

pub struct Cluster {
    pub dir: PathBuf,
    pub port: u16,
}

impl Cluster {
    /// A fresh cluster in /tmp/pgt-NAME with `CREATE EXTENSION pg_ticket` done.
    pub fn start(name: &str, port: u16, conf: &[&str]) -> Cluster {
        let dir = PathBuf::from(format!("/tmp/pgt-{name}"));
        let status = Command::new(repo_root().join("scripts/cluster.sh"))
            .arg("start")
            .arg(&dir)
            .arg(port.to_string())
            .args(conf)
            .status()
            .expect("run scripts/cluster.sh");
        assert!(status.success(), "cluster {name} did not start; see {}/server.log", dir.display());
        let cluster = Cluster { dir, port };
        cluster.connect().batch_execute(CREATE_EXTENSION).expect("create extension");
        cluster
    }

    /// A hot standby of `self` made with `pg_basebackup -R` in
    /// /tmp/pgt-NAME, with `conf` lines added, started.
    pub fn standby(&self, name: &str, port: u16, conf: &[&str]) -> Cluster {
        let dir = PathBuf::from(format!("/tmp/pgt-{name}"));
        owned_dir(&dir);
        let data = dir.join("data");
        let primary_port = self.port.to_string();
        pg_tool(
            "pg_basebackup",
            &["-D", data.to_str().unwrap(), "-R", "-X", "stream", "-h", self.dir.to_str().unwrap(), "-p", &primary_port, "-U", "postgres"],
        );
        let mut lines = format!("port = {port}\nunix_socket_directories = '{}'\n", dir.display());
        for line in conf {
            lines.push_str(line);
            lines.push('\n');
        }
        let mut f = std::fs::OpenOptions::new().append(true).open(data.join("postgresql.conf")).unwrap();
        std::io::Write::write_all(&mut f, lines.as_bytes()).unwrap();
        let standby = Cluster::attach(&dir, port);
        standby.up(None);
        standby
    }

    /// Promote this standby and wait until it accepts writes.
    pub fn promote(&self) {
        pg_tool("pg_ctl", &["promote", "-w", "-D", self.data_dir().to_str().unwrap()]);
    }

    /// A cluster made elsewhere (a standby from pg_basebackup) in `dir`.
    pub fn attach(dir: &Path, port: u16) -> Cluster {
        Cluster { dir: dir.to_path_buf(), port }
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    pub fn dsn(&self) -> String {
        self.dsn_as("postgres", "postgres")
    }

    pub fn dsn_as(&self, user: &str, dbname: &str) -> String {
        format!("host={} port={} user={user} dbname={dbname}", self.dir.display(), self.port)
    }

    pub fn connect(&self) -> Client {
        self.connect_as("postgres", "postgres")
    }

    /// A connection as `user` to database `dbname` (trust authentication).
    pub fn connect_as(&self, user: &str, dbname: &str) -> Client {
        let dsn = self.dsn_as(user, dbname);
        Client::connect(&dsn, NoTls).unwrap_or_else(|e| panic!("connect to {dsn}: {e}"))
    }

    pub fn stop(&self) {
        let _ = Command::new(repo_root().join("scripts/cluster.sh")).arg("stop").arg(&self.dir).status();
    }

    /// Stop with `pg_ctl stop -m MODE` (fast, immediate).
    pub fn stop_with(&self, mode: &str) {
        let status = Command::new(repo_root().join("scripts/cluster.sh"))
            .args(["stop".as_ref(), self.dir.as_os_str(), mode.as_ref()])
            .status()
            .unwrap();
        assert!(status.success(), "pg_ctl stop -m {mode} failed");
    }

    /// Start this (stopped) cluster again; with an offset such as "-5m",
    /// under faketime with the server's clock that far off.
    pub fn up(&self, clock_offset: Option<&str>) {
        let mut cmd = Command::new(repo_root().join("scripts/cluster.sh"));
        cmd.arg("up").arg(&self.dir);
        if let Some(offset) = clock_offset {
            cmd.env("FAKETIME_OFFSET", offset);
        }
        assert!(cmd.status().unwrap().success(), "cluster did not start; see {}/server.log", self.dir.display());
    }

    /// Start this (stopped) cluster under libfaketime reading its clock's
    /// offset from `file` on every call ("+0", "+3600s"): writing the file
    /// steps the clock of the running server (not its boot clock).
    pub fn up_with_clock_file(&self, file: &Path) {
        let mut cmd = Command::new(repo_root().join("scripts/cluster.sh"));
        cmd.arg("up").arg(&self.dir).env("FAKETIME_FILE", file);
        assert!(cmd.status().unwrap().success(), "cluster did not start; see {}/server.log", self.dir.display());
    }

    /// A database of its own (dropped first if a failed run left it) with
    /// the extension, so a test may drop, alter or fill it.
    pub fn fresh_db(&self, name: &str) -> Client {
        let mut admin = self.connect();
        admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).unwrap();
        admin.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
        let mut db = self.connect_as("postgres", name);
        db.batch_execute(CREATE_EXTENSION).unwrap();
        db
    }

    /// `ALTER SYSTEM SET pg_ticket.shards` and a reload, waited for until a
    /// new session reads the new list.
    pub fn reload_shards(&self, shards: &str) {
        let mut admin = self.connect();
        admin.batch_execute(&format!("ALTER SYSTEM SET pg_ticket.shards = '{shards}'")).unwrap();
        admin.batch_execute("SELECT pg_reload_conf()").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.connect().query_one("SHOW pg_ticket.shards", &[]).unwrap().get::<_, String>(0) != shards {
            assert!(Instant::now() < deadline, "pg_ticket.shards never became {shards:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Connect, retrying while the server restarts (crash recovery), up to 60 s.
    pub fn connect_when_ready(&self) -> Client {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let attempt = Client::connect(&self.dsn(), NoTls).and_then(|mut c| c.simple_query("SELECT 1").map(|_| c));
            match attempt {
                Ok(c) => return c,
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
                Err(e) => panic!("server at {} did not come back: {e}", self.dsn()),
            }
        }
    }
}

/// A test that fails leaves no server behind to break the next run.
impl Drop for Cluster {
    fn drop(&mut self) {
        if self.data_dir().join("postmaster.pid").exists() {
            let _ = Command::new(repo_root().join("scripts/cluster.sh"))
                .args(["stop".as_ref(), self.dir.as_os_str(), "immediate".as_ref()])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

/// A load client's connection, made again when lost: the open one, or a
/// new one to `dsn` (the failover tests' multi-host strings); None after a
/// failed attempt and 100 ms, for the caller's loop to try again.
pub fn reconnected<'a>(conn: &'a mut Option<Client>, dsn: &str) -> Option<&'a mut Client> {
    if conn.as_ref().is_none_or(|c| c.is_closed()) {
        match Client::connect(dsn, NoTls) {
            Ok(c) => *conn = Some(c),
            Err(_) => {
                std::thread::sleep(Duration::from_millis(100));
                return None;
            }
        }
    }
    conn.as_mut()
}

/// The tested PostgreSQL's program directory (`pg_config --bindir` of
/// `$PG_CONFIG`, default 15).
pub fn pg_bindir() -> &'static Path {
    static BINDIR: OnceLock<PathBuf> = OnceLock::new();
    BINDIR.get_or_init(|| {
        let pg_config = std::env::var("PG_CONFIG").unwrap_or_else(|_| "/usr/lib/postgresql/15/bin/pg_config".into());
        let out = Command::new(&pg_config).arg("--bindir").output().unwrap_or_else(|e| panic!("run {pg_config}: {e}"));
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

/// A program of the tested PostgreSQL, run as the cluster's OS user
/// (`postgres` when we are root); panics with its output if it fails.
pub fn pg_tool(program: &str, args: &[&str]) -> Output {
    let bin = pg_bindir().join(program);
    let output = if unsafe { geteuid() } == 0 {
        Command::new("runuser").args(["-u", "postgres", "--"]).arg(&bin).args(args).output()
    } else {
        Command::new(&bin).args(args).output()
    }
    .unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// An empty directory the cluster's OS user can write (a server a failed
/// run left there is stopped first).
pub fn owned_dir(path: &Path) {
    drop(Cluster::attach(path, 0));
    let _ = std::fs::remove_dir_all(path);
    std::fs::create_dir_all(path).unwrap();
    if unsafe { geteuid() } == 0 {
        let ok = Command::new("chown").arg("postgres:").arg(path).status().unwrap().success();
        assert!(ok, "chown {}", path.display());
    }
}

static SHARED: OnceLock<Cluster> = OnceLock::new();

extern "C" {
    fn atexit(callback: extern "C" fn()) -> i32;
    fn geteuid() -> u32;
}

extern "C" fn stop_shared() {
    if let Some(c) = SHARED.get() {
        c.stop();
    }
}

/// One cluster per test binary, stopped when the binary exits.
pub fn shared_cluster(name: &str, port: u16, conf: &[&str]) -> &'static Cluster {
    SHARED.get_or_init(|| {
        let c = Cluster::start(name, port, conf);
        unsafe { atexit(stop_shared) };
        c
    })
}

/// Starts a server in `dir` with `line` in postgresql.conf, which must
/// refuse to start; returns its log.
pub fn refused_start(dir: &str, port: u16, line: &str) -> String {
    let status = Command::new(repo_root().join("scripts/cluster.sh"))
        .args(["start", dir, &port.to_string(), line])
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success(), "a server with {line:?} must not start");
    std::fs::read_to_string(format!("{dir}/server.log")).unwrap()
}

/// Starts the stopped `cluster` again with `lines` added to its
/// postgresql.conf, which must refuse to start (`why` says why it must);
/// returns its log.
pub fn refused_restart(cluster: &Cluster, lines: &str, why: &str) -> String {
    let conf = cluster.data_dir().join("postgresql.conf");
    let mut text = std::fs::read_to_string(&conf).unwrap();
    text.push_str(lines);
    std::fs::write(&conf, &text).unwrap();
    let status = Command::new(repo_root().join("scripts/cluster.sh"))
        .args(["up", cluster.dir.to_str().unwrap()])
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success(), "{why}");
    std::fs::read_to_string(cluster.dir.join("server.log")).unwrap()
}

/// The SQLSTATE of a failed statement, or "" if it did not fail with one.
pub fn sqlstate(err: &postgres::Error) -> String {
    err.code().map(|c| c.code().to_string()).unwrap_or_default()
}
