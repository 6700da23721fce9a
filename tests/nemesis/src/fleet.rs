//! The fleet on loopback (SPEC §14): a registry with an asynchronous
//! standby of its own fixed machine id, one the registry may lease out
//! (#46 item 6(b)), the two swapping slots at each registry failover;
//! lineage `p1`, a primary that leases its machine id from the registry
//! (through the proxy) with a synchronous standby, swapping slots the same
//! way; lineage `p2`, a primary with a fixed machine id and the even
//! ticket series (p1 has the odd). Every server runs under libfaketime reading its clock's
//! offset from a file of its own, so the nemesis steps running clocks.

use pg_ticket_integration::{owned_dir, pg_tool, repo_root};
use postgres::{Client, NoTls};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const REGISTRY_DB: &str = "registry";
pub const WORK_DB: &str = "postgres";

/// Which fleet of this machine (`nemesis run --fleet N`): fleet 0 lives in
/// /tmp/pgt-nem-* on ports 55530-55534, fleet N in /tmp/pgt-nemN-* ten
/// ports up per N, so that two runs (say, one against another release)
/// share a machine.
static FLEET: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);

pub fn choose_fleet(n: u16) {
    FLEET.store(n, std::sync::atomic::Ordering::SeqCst);
}

/// The directory of server `name` in this fleet.
pub fn server_dir(name: &str) -> PathBuf {
    match FLEET.load(std::sync::atomic::Ordering::SeqCst) {
        0 => PathBuf::from(format!("/tmp/pgt-nem-{name}")),
        n => PathBuf::from(format!("/tmp/pgt-nem{n}-{name}")),
    }
}

/// `port` of fleet 0 moved to this fleet's.
pub fn port(port: u16) -> u16 {
    port + 10 * FLEET.load(std::sync::atomic::Ordering::SeqCst)
}

pub struct Server {
    pub name: String,
    pub dir: PathBuf,
    pub port: u16,
    pub clock: PathBuf,
}

impl Server {
    fn new(name: &str, port: u16, clock: &Path) -> Server {
        Server { name: name.into(), dir: server_dir(name), port: self::port(port), clock: clock.to_path_buf() }
    }

    /// initdb, `conf`, start under the clock file.
    fn create(name: &str, port: u16, clock: &Path, conf: &[String]) -> Server {
        let server = Server::new(name, port, clock);
        let status = Command::new(repo_root().join("scripts/cluster.sh"))
            .arg("start")
            .arg(&server.dir)
            .arg(server.port.to_string())
            .args(conf)
            .status()
            .expect("scripts/cluster.sh");
        assert!(status.success(), "{name} did not start; see {}/server.log", server.dir.display());
        server.stop("fast");
        server.up().unwrap_or_else(|e| panic!("{e}"));
        server
    }

    pub fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    pub fn dsn(&self, db: &str) -> String {
        format!("host={} port={} user=postgres dbname={db} connect_timeout=5", self.dir.display(), self.port)
    }

    pub fn connect(&self, db: &str) -> Result<Client, postgres::Error> {
        Client::connect(&self.dsn(db), NoTls)
    }

    /// Start it (again) under its clock file, retrying while a killed
    /// server's processes let go of its shared memory: at most 60 s. After
    /// 10 s, processes of this data directory that outlived their
    /// postmaster are killed, as an operator would: a backend waiting on an
    /// LWLock whose holder was SIGKILLed while the postmaster was already
    /// gone waits for ever (PostgreSQL resets shared memory only from a
    /// live postmaster), and holds the old segment (seen in a 60-minute
    /// soak: p2 never came back).
    pub fn up(&self) -> Result<(), String> {
        let started = Instant::now();
        let deadline = started + Duration::from_secs(60);
        let mut orphans_killed = false;
        loop {
            if !orphans_killed && started.elapsed() > Duration::from_secs(10) && !self.running() {
                orphans_killed = true;
                let orphans = self.orphans();
                for pid in &orphans {
                    unsafe { libc::kill(*pid, libc::SIGKILL) };
                }
                if !orphans.is_empty() {
                    eprintln!("nemesis: {}: killed {} process(es) that outlived its postmaster: {orphans:?}", self.name, orphans.len());
                }
            }
            let status = Command::new(repo_root().join("scripts/cluster.sh"))
                .arg("up")
                .arg(&self.dir)
                .env("FAKETIME_FILE", &self.clock)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .expect("scripts/cluster.sh");
            if status.success() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("{} did not start again; see {}/server.log", self.name, self.dir.display()));
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// Processes whose working directory is this data directory and whose
    /// parent is init: a dead postmaster's children.
    fn orphans(&self) -> Vec<i32> {
        let data = self.data().canonicalize().unwrap_or_else(|_| self.data());
        let Ok(entries) = std::fs::read_dir("/proc") else { return vec![] };
        entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd == data))
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .ok()
                    .and_then(|stat| stat.rsplit_once(") ").and_then(|(_, rest)| rest.split(' ').nth(1)?.parse::<i32>().ok()))
                    == Some(1)
            })
            .collect()
    }

    /// `pg_ctl stop -m MODE`, which gives up after 60 s; a server still
    /// running then is stopped immediately, as an operator would. Seen in
    /// soaks on PostgreSQL 16.2 and 18.6, and on a plain 18.6 cluster
    /// without pg_ticket: a fast shutdown requested while the server was in
    /// crash recovery (a backend had been killed a moment before) never
    /// ended — the startup process exited at the request, and the
    /// postmaster then waited for a checkpointer it never told to finish
    /// (idle in its 5-minute sleep), for ever.
    pub fn stop(&self, mode: &str) {
        let pg_ctl = |mode: &str| {
            let _ = Command::new(repo_root().join("scripts/cluster.sh"))
                .args(["stop".as_ref(), self.dir.as_os_str(), mode.as_ref()])
                .stderr(std::process::Stdio::null())
                .status();
        };
        pg_ctl(mode);
        if mode != "immediate" && self.running() {
            eprintln!("nemesis: {}: a {mode} stop did not end within pg_ctl's 60 s; stopped immediately", self.name);
            pg_ctl("immediate");
        }
    }

    pub fn postmaster(&self) -> Option<i32> {
        let pid = std::fs::read_to_string(self.data().join("postmaster.pid")).ok()?;
        let pid: i32 = pid.lines().next()?.trim().parse().ok()?;
        (unsafe { libc::kill(pid, 0) } == 0).then_some(pid)
    }

    pub fn running(&self) -> bool {
        self.postmaster().is_some()
    }

    /// The postmaster and its children.
    pub fn processes(&self) -> Vec<i32> {
        let Some(pm) = self.postmaster() else { return vec![] };
        let children = Command::new("pgrep").args(["-P", &pm.to_string()]).output().map(|o| o.stdout).unwrap_or_default();
        let mut pids = vec![pm];
        pids.extend(String::from_utf8_lossy(&children).split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
        pids
    }

    pub fn signal_all(&self, signal: i32) -> usize {
        let pids = self.processes();
        for pid in &pids {
            unsafe { libc::kill(*pid, signal) };
        }
        pids.len()
    }

    /// `ALTER SYSTEM SET setting = 'value'` and a reload.
    pub fn alter_system(&self, db: &str, setting: &str, value: &str) -> Result<(), postgres::Error> {
        let mut c = self.connect(db)?;
        c.batch_execute(&format!("ALTER SYSTEM SET {setting} = '{value}'"))?;
        c.batch_execute("SELECT pg_reload_conf()")
    }

    /// `pg_ticket.shards` set to `list` and reloaded, waited for (at most 10 s).
    pub fn set_shards(&self, db: &str, list: &str) -> Result<(), String> {
        self.alter_system(db, "pg_ticket.shards", list).map_err(|e| format!("{}: set pg_ticket.shards: {e}", self.name))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let shown = self.connect(db).and_then(|mut c| c.query_one("SHOW pg_ticket.shards", &[])).map(|r| r.get::<_, String>(0));
            if shown.as_deref().is_ok_and(|s| s == list) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("{}: pg_ticket.shards is {shown:?}, not {list:?}, 10 s after the reload", self.name));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Set this server's clock offset (libfaketime: "+0", "+30s", "-5s").
    pub fn set_clock(&self, offset: &str) {
        set_clock(&self.clock, offset);
    }

    /// Wait until it answers and (if `writable`) is out of recovery.
    pub fn wait_ready(&self, writable: bool) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let ready = self
                .connect(WORK_DB)
                .and_then(|mut c| c.query_one("SELECT pg_is_in_recovery()", &[]))
                .map(|row| !writable || !row.get::<_, bool>(0));
            if matches!(ready, Ok(true)) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("{} is not ready after 90 s ({ready:?}); see {}/server.log", self.name, self.dir.display()));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The Unix socket it listens on.
    pub fn socket(&self) -> PathBuf {
        self.dir.join(format!(".s.PGSQL.{}", self.port))
    }

    /// A hot standby of `primary` in `slot`'s directory (made anew).
    fn standby_of(slot: Slot, clock: &Path, primary: &Server) -> Server {
        let server = Server::new(slot.name, slot.port, clock);
        server.signal_all(libc::SIGKILL);
        owned_dir(&server.dir);
        pg_tool(
            "pg_basebackup",
            // A fast checkpoint: a spread one takes up to 90% of checkpoint_timeout
            // (minutes), and the fleet waits for it.
            &["-D", server.data().to_str().unwrap(), "-R", "-X", "stream", "-c", "fast", "-h", primary.dir.to_str().unwrap(), "-p", &primary.port.to_string(), "-U", "postgres"],
        );
        slot.configure(&server);
        server.up().unwrap_or_else(|e| panic!("{e}"));
        server
    }
}

/// One of the two places a pair's servers live in: its name, port, and
/// fixed machine id (none: whatever the copied configuration says).
#[derive(Clone, Copy)]
pub struct Slot {
    pub name: &'static str,
    pub port: u16,
    pub machine_id: Option<i32>,
}

impl Slot {
    /// Its own lines appended to a copied configuration (a base backup's,
    /// a standby's): they come last, so they win.
    pub fn configure(&self, server: &Server) {
        let mut lines = vec![format!("port = {}", server.port), format!("unix_socket_directories = '{}'", server.dir.display())];
        lines.extend(self.machine_id.map(|id| format!("pg_ticket.machine_id = {id}")));
        append_conf(&server.data(), &lines);
    }
}

pub fn set_clock(file: &Path, offset: &str) {
    std::fs::write(file, format!("{offset}\n")).unwrap_or_else(|e| panic!("write {}: {e}", file.display()));
}

fn append_conf(data: &Path, lines: &[String]) {
    let mut f = std::fs::OpenOptions::new().append(true).open(data.join("postgresql.conf")).unwrap();
    for line in lines {
        std::io::Write::write_all(&mut f, format!("{line}\n").as_bytes()).unwrap();
    }
}

/// A primary and its standby (lineage p1, the registry); they swap slots
/// at each promotion.
pub struct Pair {
    pub primary: Server,
    pub standby: Option<Server>,
    slots: [Slot; 2],
    /// Commits on the primary wait for the standby (p1's do, the
    /// registry's do not: an asynchronous standby loses grants at a
    /// failover, #46 item 6(c)).
    synchronous: bool,
}

impl Pair {
    /// The slot the primary is not in.
    fn other_slot(&self) -> Slot {
        *self.slots.iter().find(|s| s.name != self.primary.name).unwrap()
    }

    pub fn slot_of(&self, server: &Server) -> Slot {
        *self.slots.iter().find(|s| s.name == server.name).unwrap()
    }

    /// A new standby for the primary, in the other slot.
    pub fn rebuild_standby(&mut self) {
        self.standby = Some(Server::standby_of(self.other_slot(), &self.primary.clock, &self.primary));
        if self.synchronous {
            if let Err(e) = make_synchronous(&self.primary) {
                eprintln!("nemesis: synchronous_standby_names on {}: {e}", self.primary.name);
            }
        }
    }

    /// Database `db` through whichever of the two is the primary now.
    pub fn dsn(&self, db: &str) -> String {
        let [a, b] = self.slots;
        format!(
            "host={},{} port={},{} user=postgres dbname={db} target_session_attrs=read-write connect_timeout=5",
            server_dir(a.name).display(),
            server_dir(b.name).display(),
            port(a.port),
            port(b.port)
        )
    }
}

pub struct Fleet {
    pub registry: Mutex<Pair>,
    pub p1: Mutex<Pair>,
    pub p2: Server,
    pub work: PathBuf,
}

pub const REGISTRY_PORT: u16 = 55530;
pub const P2_PORT: u16 = 55533;
/// The registry's slots: "r" has a fixed id outside `lease_ids`, "r2" one
/// inside (docs/leases.md advises against it; the lease ledger makes it
/// safe, and the nemesis checks that it does).
const REGISTRY_SLOTS: [Slot; 2] = [Slot { name: "r", port: REGISTRY_PORT, machine_id: Some(999) }, Slot { name: "r2", port: 55534, machine_id: Some(8) }];
const P1_SLOTS: [Slot; 2] = [Slot { name: "a", port: 55531, machine_id: None }, Slot { name: "b", port: 55532, machine_id: None }];

/// (offset, increment) of each lineage's tickets.
pub const SERIES: [(&str, (i64, i64)); 2] = [("p1", (1, 2)), ("p2", (2, 2))];

impl Fleet {
    pub fn start(work: &Path, registry_via_proxy: impl Fn(&Server) -> String) -> Fleet {
        let clock = |name: &str| {
            let path = work.join(format!("clock-{name}"));
            set_clock(&path, "+0");
            path
        };
        let common = ["max_connections = 100".to_string(), "pg_ticket.ticket_wait_timeout = '5s'".into()];
        let registry = Server::create(
            REGISTRY_SLOTS[0].name,
            REGISTRY_SLOTS[0].port,
            &clock("r"),
            &[
                common.to_vec(),
                vec![
                    "pg_ticket.machine_id = 999".into(),
                    "pg_ticket.lease_ids = '1-8'".into(), // few: a restored registry soon reuses a live one
                    "pg_ticket.lease_margin = '1s'".into(),
                    "pg_ticket.lease_max_ttl = '10s'".into(),
                ],
            ]
            .concat(),
        );
        let mut admin = registry.connect("postgres").expect("registry");
        admin.batch_execute(&format!("CREATE DATABASE {REGISTRY_DB}")).unwrap();
        create_extension(&registry, REGISTRY_DB).expect("the registry's extension");
        let registry_dsn = registry_via_proxy(&registry);
        let mut registry = Pair { primary: registry, standby: None, slots: REGISTRY_SLOTS, synchronous: false };
        registry.rebuild_standby();
        let p1_clock = clock("p1");
        let primary = Server::create(
            P1_SLOTS[0].name,
            P1_SLOTS[0].port,
            &p1_clock,
            &[
                common.to_vec(),
                vec![
                    "pg_ticket.machine_id = -1".into(),
                    format!("pg_ticket.registry = '{registry_dsn}'"),
                    "pg_ticket.machine_lease_ttl = '3s'".into(),
                    "pg_ticket.ticket_offset = 1".into(),
                    "pg_ticket.ticket_increment = 2".into(),
                    "wal_keep_size = '256MB'".into(),
                ],
            ]
            .concat(),
        );
        create_extension(&primary, WORK_DB).expect("p1's extension");
        let mut p1 = Pair { primary, standby: None, slots: P1_SLOTS, synchronous: true };
        p1.rebuild_standby();
        let p2 = Server::create(
            "p2",
            P2_PORT,
            &clock("p2"),
            &[
                common.to_vec(),
                vec![
                    "pg_ticket.machine_id = 900".into(),
                    "pg_ticket.ticket_offset = 2".into(),
                    "pg_ticket.ticket_increment = 2".into(),
                    "pg_ticket.shards = '0-3'".into(),
                ],
            ]
            .concat(),
        );
        create_extension(&p2, WORK_DB).expect("p2's extension");
        p2.connect(WORK_DB)
            .and_then(|mut c| c.batch_execute(&format!("SELECT {}(s, 0) FROM generate_series(0, 3) s", crate::dialect::name("pgticket.accept_shard"))))
            .expect("p2 accepts its shards");
        Fleet { registry: Mutex::new(registry), p1: Mutex::new(p1), p2, work: work.to_path_buf() }
    }

    pub fn all_servers(&self, f: &mut dyn FnMut(&Server)) {
        f(&self.p2);
        for pair in [&self.registry, &self.p1] {
            let pair = pair.lock().unwrap_or_else(|p| p.into_inner());
            f(&pair.primary);
            if let Some(s) = &pair.standby {
                f(s);
            }
        }
    }

    pub fn stop_all(&self) {
        self.all_servers(&mut |s| {
            s.signal_all(libc::SIGCONT);
            s.stop("immediate");
        });
    }
}

/// Commits on `primary` wait for its standby (set once it has one: a
/// primary without its standby would wait for ever).
fn make_synchronous(primary: &Server) -> Result<(), postgres::Error> {
    primary.alter_system(WORK_DB, "synchronous_standby_names", "*")
}

/// `CREATE EXTENSION pg_ticket`, and the registry's "new to its fleet": a
/// created registry otherwise holds off its first grants for
/// `lease_max_ttl` + margin.
pub fn create_extension(server: &Server, db: &str) -> Result<(), postgres::Error> {
    let mut c = server.connect(db)?;
    c.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_ticket")?;
    let version: String = c.query_one("SELECT extversion FROM pg_extension WHERE extname = 'pg_ticket'", &[])?.get(0);
    crate::dialect::learn(&version);
    if db == REGISTRY_DB {
        c.batch_execute(&format!("SELECT {}()", crate::dialect::name("pgticket.end_lease_hold_off")))?;
    }
    Ok(())
}
