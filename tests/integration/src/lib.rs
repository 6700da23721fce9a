//! Harness for pg_ticket's integration tests: real PostgreSQL 15 clusters
//! (started with `scripts/cluster.sh`, the extension preloaded) and real
//! client connections. Every test binary starts its own cluster on its own
//! port, so binaries never share state; tests inside one binary share it and
//! use distinct scope names.

use postgres::{Client, NoTls};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repo root")
}

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
        cluster.connect().batch_execute("CREATE EXTENSION pg_ticket").expect("create extension");
        cluster
    }

    pub fn dsn(&self) -> String {
        format!("host={} port={} user=postgres dbname=postgres", self.dir.display(), self.port)
    }

    pub fn connect(&self) -> Client {
        Client::connect(&self.dsn(), NoTls).unwrap_or_else(|e| panic!("connect to {}: {e}", self.dsn()))
    }

    pub fn stop(&self) {
        let _ = Command::new(repo_root().join("scripts/cluster.sh")).arg("stop").arg(&self.dir).status();
    }
}

static SHARED: OnceLock<Cluster> = OnceLock::new();

extern "C" {
    fn atexit(callback: extern "C" fn()) -> i32;
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

/// The SQLSTATE of a failed statement, or "" if it did not fail with one.
pub fn sqlstate(err: &postgres::Error) -> String {
    err.code().map(|c| c.code().to_string()).unwrap_or_default()
}
