//! Automatic failover under pg_auto_failover (SPEC §10): a monitor and two
//! nodes on loopback with pg_ticket preloaded and their machine ids leased
//! from a registry outside the failover group; load on every allocator
//! through the failover-aware connection string; the primary's keeper and
//! postgres killed with SIGKILL; the monitor promotes the secondary; the
//! load goes on; the old node rejoins as a secondary (pg_rewind). No
//! committed counter value, block, ticket or snowflake is handed out twice.
//!
//! Debian packages pg_auto_failover for PostgreSQL 15 only: on another
//! version this test says so and does nothing.

use pg_ticket_integration::{pg_bindir, Cluster};
use postgres::{Client, NoTls};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ROOT: &str = "/tmp/pgt-paf";
const MONITOR_PORT: u16 = 55480;
const NODE_PORTS: [u16; 2] = [55481, 55482];

fn as_postgres(script: &str) -> std::process::Output {
    let env = format!(
        "export XDG_CONFIG_HOME={ROOT}/config XDG_DATA_HOME={ROOT}/share PATH={}:$PATH; {script}",
        pg_bindir().display()
    );
    let mut cmd = if unsafe { libc::geteuid() } == 0 {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", "bash", "-c", &env]);
        c
    } else {
        let mut c = Command::new("bash");
        c.args(["-c", &env]);
        c
    };
    cmd.stdin(Stdio::null()).output().expect("run bash")
}

/// Start `pg_autoctl ARGS` in the background, its output in `log`.
fn autoctl_background(args: &str, log: &str) {
    let out = as_postgres(&format!("setsid nohup pg_autoctl {args} >> {ROOT}/{log} 2>&1 < /dev/null &"));
    assert!(out.status.success(), "{out:?}");
}

fn show_state() -> String {
    String::from_utf8_lossy(&as_postgres(&format!("pg_autoctl show state --pgdata {ROOT}/monitor 2>&1")).stdout).into_owned()
}

fn wait_for_state(what: &str, deadline: Duration, ok: impl Fn(&str) -> bool) -> Duration {
    let started = Instant::now();
    loop {
        let state = show_state();
        if ok(&state) {
            return started.elapsed();
        }
        assert!(started.elapsed() < deadline, "{what} not reached in {deadline:?}:\n{state}\n{}", diagnostics());
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// What a failed wait prints besides the state: the monitor's recent
/// events and health verdicts, and the end of each node's keeper and
/// server logs (a node marked `!` is one the monitor could not connect to).
fn diagnostics() -> String {
    let script = format!(
        "pg_autoctl show events --count 20 --pgdata {ROOT}/monitor 2>&1; \
         echo '--- monitor health checks'; grep -h -i 'health' {ROOT}/monitor/log/*.log 2>&1 | tail -n 15; \
         for n in node1 node2; do echo \"--- $n keeper\"; tail -n 25 {ROOT}/$n.log 2>&1; \
           echo \"--- $n server\"; tail -n 25 $(ls -t {ROOT}/$n/log/*.log 2>/dev/null | head -n 1) 2>&1; done"
    );
    String::from_utf8_lossy(&as_postgres(&script).stdout).into_owned()
}

fn node_line<'a>(state: &'a str, node: &str) -> &'a str {
    state.lines().find(|l| l.trim_start().starts_with(node)).unwrap_or("")
}

/// SIGKILL to every process of the `pg_autoctl` sessions whose command line
/// matches: each was started with setsid, so its keeper, its children
/// (renamed "pg_autoctl: node active" and so on) and its postgres share
/// one process group.
fn kill_sessions(pattern: &str) {
    let out = Command::new("pgrep").args(["-f", pattern]).output().unwrap();
    for pid in String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
        unsafe { libc::kill(-pid, libc::SIGKILL) };
    }
}

fn stop_everything() {
    kill_sessions(&format!("pg_autoctl (run|create) .*{ROOT}"));
    for dir in ["monitor", "node1", "node2"] {
        let pid_file = Path::new(ROOT).join(dir).join("postmaster.pid");
        if let Some(pid) = std::fs::read_to_string(&pid_file).ok().and_then(|t| t.lines().next().and_then(|l| l.trim().parse::<i32>().ok())) {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

struct Cleanup;
impl Drop for Cleanup {
    fn drop(&mut self) {
        stop_everything();
    }
}

#[derive(Default)]
struct Seen {
    counters: Vec<(Instant, i64)>,
    blocks: Vec<(i64, i64)>,
    tickets: Vec<i64>,
    snowflakes: Vec<i64>,
    successes: Vec<(Instant, u16)>,
}

#[test]
fn pg_auto_failover_kills_the_primary_under_load_and_nothing_is_handed_out_twice() {
    if !pg_bindir().starts_with("/usr/lib/postgresql/15") {
        eprintln!("skipped: Debian packages pg_auto_failover for PostgreSQL 15 only (testing {})", pg_bindir().display());
        return;
    }
    assert!(Path::new("/usr/bin/pg_autoctl").exists(), "pg_auto_failover is missing: run scripts/setup.sh");
    stop_everything();
    let _cleanup = Cleanup;
    pg_ticket_integration::owned_dir(Path::new(ROOT));
    let registry = Cluster::start("paf-registry", 55483, &["pg_ticket.lease_margin = '1s'"]);

    // The monitor, with health checks tightened so the test fails over in
    // seconds rather than the default minute.
    let out = as_postgres(&format!(
        "pg_autoctl create monitor --pgdata {ROOT}/monitor --pgport {MONITOR_PORT} --hostname localhost --auth trust --no-ssl > {ROOT}/monitor-create.log 2>&1 && \
         printf \"pgautofailover.health_check_period = 1000\\npgautofailover.health_check_timeout = 2500\\npgautofailover.health_check_max_retries = 2\\npgautofailover.health_check_retry_delay = 500\\npgautofailover.node_considered_unhealthy_timeout = 4000\\npgautofailover.primary_demote_timeout = 3000\\n\" >> {ROOT}/monitor/postgresql.conf"
    ));
    assert!(out.status.success(), "create monitor: {out:?}");
    autoctl_background(&format!("run --pgdata {ROOT}/monitor"), "monitor.log");
    let monitor = format!("postgres://autoctl_node@localhost:{MONITOR_PORT}/pg_auto_failover?sslmode=disable");

    // Node 1: our own initdb with pg_ticket preloaded (pg_autoctl adopts
    // an existing data directory); node 2 copies it with pg_basebackup.
    let registry_dsn = registry.dsn();
    let out = as_postgres(&format!(
        "initdb -D {ROOT}/node1 -U postgres -A trust -E UTF8 --locale=C.UTF-8 > {ROOT}/initdb.log && \
         printf \"shared_preload_libraries = 'pg_ticket'\\npg_ticket.machine_id = -1\\npg_ticket.registry = '{registry_dsn}'\\npg_ticket.machine_lease_ttl = '3s'\\n\" >> {ROOT}/node1/postgresql.conf"
    ));
    assert!(out.status.success(), "initdb: {out:?}");
    let started = Instant::now();
    for (i, port) in NODE_PORTS.iter().enumerate() {
        let n = i + 1;
        autoctl_background(
            &format!("create postgres --pgdata {ROOT}/node{n} --pgport {port} --hostname localhost --auth trust --no-ssl --monitor '{monitor}' --run"),
            &format!("node{n}.log"),
        );
        if n == 1 {
            wait_for_state("node 1 single", Duration::from_secs(60), |s| node_line(s, "node_1").contains("single"));
        }
    }
    wait_for_state("primary and secondary", Duration::from_secs(240), |s| {
        node_line(s, "node_1").contains("primary") && node_line(s, "node_2").matches("secondary").count() == 2
    });
    eprintln!("pg_auto_failover: monitor and two nodes up in {:?}", started.elapsed());
    let node = |port: u16| Client::connect(&format!("host=localhost port={port} user=postgres dbname=postgres"), NoTls).unwrap();
    node(NODE_PORTS[0]).batch_execute("CREATE EXTENSION pg_ticket").unwrap();

    // Load on every allocator through the failover-aware connection string.
    let dsn = format!("host=localhost,localhost port={},{} user=postgres dbname=postgres target_session_attrs=read-write connect_timeout=2", NODE_PORTS[0], NODE_PORTS[1]);
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (dsn, stop, seen) = (dsn.clone(), Arc::clone(&stop), Arc::clone(&seen));
            std::thread::spawn(move || {
                let mut conn: Option<Client> = None;
                while !stop.load(Ordering::Relaxed) {
                    let Some(c) = pg_ticket_integration::reconnected(&mut conn, &dsn) else { continue };
                    let row = c.query_one(
                        "SELECT next_scoped_id('paf', 'orders'), b.first_id, b.last_id, next_ticket('paf', 'jobs'), snowflake_id(), inet_server_port()
                           FROM reserve_block('paf', 10) b",
                        &[],
                    );
                    match row {
                        Ok(r) => {
                            let mut s = seen.lock().unwrap();
                            let now = Instant::now();
                            s.counters.push((now, r.get(0)));
                            s.blocks.push((r.get(1), r.get(2)));
                            s.tickets.push(r.get(3));
                            s.snowflakes.push(r.get(4));
                            s.successes.push((now, r.get::<_, i32>(5) as u16));
                        }
                        // Refusals while the failover runs (no lease yet,
                        // read-only) and broken connections: try again.
                        Err(_) => {
                            conn = None;
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(5));

    // Kill node 1's keeper and postgres: the monitor must fail over.
    let killed_at = Instant::now();
    let pid: i32 = std::fs::read_to_string(PathBuf::from(ROOT).join("node1/postmaster.pid")).unwrap().lines().next().unwrap().trim().parse().unwrap();
    kill_sessions(&format!("pg_autoctl (run|create) .*{ROOT}/node1"));
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let failover = wait_for_state("node 2 primary", Duration::from_secs(120), |s| {
        let n2 = node_line(s, "node_2");
        n2.contains("wait_primary") || n2.matches("primary").count() == 2
    });
    let first_write_on_2 = loop {
        if let Some((t, _)) = seen.lock().unwrap().successes.iter().find(|(t, port)| *port == NODE_PORTS[1] && *t > killed_at) {
            break t.duration_since(killed_at);
        }
        assert!(killed_at.elapsed() < Duration::from_secs(120), "no write on node 2 after the failover");
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("failover: monitor promoted node 2 {failover:?} after the kill; first write on it after {first_write_on_2:?}");
    std::thread::sleep(Duration::from_secs(3));

    // The old primary rejoins as a secondary (pg_rewind) while load goes on.
    let rejoin_started = Instant::now();
    autoctl_background(&format!("run --pgdata {ROOT}/node1"), "node1.log");
    let rejoined = wait_for_state("node 1 secondary", Duration::from_secs(120), |s| node_line(s, "node_1").matches("secondary").count() == 2);
    eprintln!("rejoin: node 1 secondary again after {rejoined:?} ({:?} since the kill)", rejoin_started.duration_since(killed_at) + rejoined);
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }

    let s = seen.lock().unwrap();
    // Split by the server that answered, not by when the reply was read: a
    // client thread descheduled between its reply and its clock reading
    // (2 cores under load) can read an older commit's reply after a newer
    // one's, and a time split then fails with nothing handed out twice.
    let answered_by = |port: u16| -> Vec<i64> { s.counters.iter().zip(&s.successes).filter(|(_, (_, p))| *p == port).map(|(c, _)| c.1).collect() };
    let (before, after) = (answered_by(NODE_PORTS[0]), answered_by(NODE_PORTS[1]));
    eprintln!(
        "checked: {} counter values ({} from node 1, {} from node 2), {} blocks, {} tickets, {} snowflakes",
        s.counters.len(),
        before.len(),
        after.len(),
        s.blocks.len(),
        s.tickets.len(),
        s.snowflakes.len()
    );
    assert!(!before.is_empty() && !after.is_empty(), "load before and after the failover");
    let distinct = |v: Vec<i64>| {
        let n = v.len();
        v.into_iter().collect::<HashSet<_>>().len() == n
    };
    assert!(distinct(s.counters.iter().map(|c| c.1).collect()), "a committed counter value twice");
    let (highest_before, lowest_after) = (before.iter().max().unwrap(), after.iter().min().unwrap());
    assert!(lowest_after > highest_before, "counters continue above the highest committed: node 2 gave {lowest_after}, node 1 had given {highest_before}");
    let mut blocks = s.blocks.clone();
    blocks.sort_unstable();
    assert!(blocks.windows(2).all(|w| w[0].1 < w[1].0), "overlapping blocks");
    assert!(distinct(s.tickets.clone()), "a ticket twice");
    assert!(distinct(s.snowflakes.clone()), "a snowflake twice");
    let by_node = |port: u16| -> HashSet<i64> {
        s.successes.iter().zip(&s.snowflakes).filter(|((_, p), _)| *p == port).map(|(_, id)| (id >> 12) & 1023).collect()
    };
    assert!(by_node(NODE_PORTS[0]).is_disjoint(&by_node(NODE_PORTS[1])), "both nodes stamped one machine id");
    drop(s);
}
