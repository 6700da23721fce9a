//! Automatic failover under Patroni with etcd (SPEC §10, #33): a group of
//! three nodes on loopback, pg_ticket preloaded and configured through
//! Patroni's dynamic configuration (the same settings on every node),
//! `synchronous_mode` on with both replicas synchronous. Load on every
//! allocator goes through the failover-aware connection string while the
//! leader's Patroni and postgres are killed (its machine lost): Patroni
//! promotes a synchronous standby once the leader key expires (ttl 20 s,
//! its least); the old leader's Patroni is started again and rejoins it
//! with pg_rewind; a switchover then makes the rewound node the leader
//! again, under the same load, so what pg_rewind gave it (the state
//! files beside the catalog included) is what it issues from. Two groups
//! run side by side: one with a fixed machine id and sharded IDs, one
//! leasing its machine ids from a registry outside it. Nothing is handed
//! out twice, each leader continues above everything its predecessors
//! handed out (counters and tickets; for the fixed id also snowflakes and
//! sharded IDs, which one shared wall clock keeps in order by itself), and
//! no client sees an error that a failover does not excuse.
//!
//! Patroni 3.0.2 and etcd 3.4 are Debian 12's packages (scripts/setup.sh);
//! Patroni drives whichever PostgreSQL `$PG_CONFIG` names. Its 3 minutes
//! are spent once per `make test` (`make test-patroni`, on 18), not in
//! every version's integration tier: the tests are `#[ignore]`d there.

use pg_ticket_integration::{owned_dir, pg_bindir, Cluster};
use postgres::{Client, NoTls};
use std::collections::HashSet;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NODES: usize = 3;

/// Run `script` with bash as the cluster's OS user.
fn as_postgres(script: &str) -> std::process::Output {
    let mut cmd = if unsafe { libc::geteuid() } == 0 {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", "bash", "-c", script]);
        c
    } else {
        let mut c = Command::new("bash");
        c.args(["-c", script]);
        c
    };
    cmd.stdin(Stdio::null()).output().expect("run bash")
}

fn pids(pattern: &str) -> Vec<i32> {
    let out = Command::new("pgrep").args(["-f", pattern]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|p| p.parse().ok()).collect()
}

/// A Patroni group: etcd, three nodes (`node1`..`node3`), their logs, in
/// /tmp/pgt-patroni-NAME; TCP ports from `base`: etcd's client and peer,
/// the nodes' PostgreSQL, the nodes' REST API. Below 32768, Linux's first
/// ephemeral port: a port in that range can be any client connection's
/// own end when a node starts again (seen: the REST API's port taken).
struct Group {
    root: PathBuf,
    base: u16,
}

impl Group {
    fn pg_port(&self, node: usize) -> u16 {
        self.base + 2 + node as u16
    }

    fn yml(&self, node: usize) -> PathBuf {
        self.root.join(format!("node{}.yml", node + 1))
    }

    /// etcd and three Patroni nodes with `parameters` in the dynamic
    /// configuration; returns once one node leads and both others stream
    /// to it synchronously.
    fn start(name: &str, base: u16, parameters: &[(&str, &str)]) -> Group {
        let group = Group { root: PathBuf::from(format!("/tmp/pgt-patroni-{name}")), base };
        group.stop_all();
        owned_dir(&group.root);
        let (client, peer) = (base, base + 1);
        let etcd = format!(
            "cd {root} || exit 1; setsid nohup etcd --name e --data-dir {root}/etcd --listen-client-urls http://127.0.0.1:{client} \
             --advertise-client-urls http://127.0.0.1:{client} --listen-peer-urls http://127.0.0.1:{peer} \
             --initial-advertise-peer-urls http://127.0.0.1:{peer} --initial-cluster e=http://127.0.0.1:{peer} \
             --enable-v2=true > {root}/etcd.log 2>&1 < /dev/null &",
            root = group.root.display()
        );
        assert!(as_postgres(&etcd).status.success());
        let parameters: String = parameters.iter().map(|(k, v)| format!("        {k}: '{v}'\n")).collect();
        for node in 0..NODES {
            let n = node + 1;
            let yml = format!(
                "scope: {name}\n\
                 name: node{n}\n\
                 log:\n  level: INFO\n\
                 restapi:\n  listen: 127.0.0.1:{rest}\n  connect_address: 127.0.0.1:{rest}\n\
                 etcd:\n  host: 127.0.0.1:{client}\n\
                 bootstrap:\n\
                 \x20 dcs:\n\
                 \x20   ttl: 20\n\
                 \x20   loop_wait: 1\n\
                 \x20   retry_timeout: 5\n\
                 \x20   synchronous_mode: true\n\
                 \x20   synchronous_node_count: 2\n\
                 \x20   postgresql:\n\
                 \x20     use_pg_rewind: true\n\
                 \x20     parameters:\n\
                 \x20       shared_preload_libraries: pg_ticket\n\
                 \x20       max_connections: 50\n\
                 {parameters}\
                 \x20 initdb:\n  - encoding: UTF8\n  - locale: C.UTF-8\n\
                 \x20 pg_hba:\n  - local all all trust\n  - host all all 127.0.0.1/32 trust\n  - host replication all 127.0.0.1/32 trust\n\
                 postgresql:\n\
                 \x20 listen: 127.0.0.1:{port}\n\
                 \x20 connect_address: 127.0.0.1:{port}\n\
                 \x20 data_dir: {root}/node{n}\n\
                 \x20 bin_dir: {bin}\n\
                 \x20 pgpass: {root}/pgpass{n}\n\
                 \x20 authentication:\n\
                 \x20   superuser: {{username: postgres, password: unused}}\n\
                 \x20   replication: {{username: postgres, password: unused}}\n\
                 \x20 parameters:\n\
                 \x20   unix_socket_directories: {root}\n",
                rest = base + 5 + node as u16,
                port = group.pg_port(node),
                root = group.root.display(),
                bin = pg_bindir().display(),
            );
            std::fs::write(group.yml(node), yml).unwrap();
        }
        let _ = Command::new("chown").arg("-R").arg("postgres:").arg(&group.root).status();
        for node in 0..NODES {
            group.start_node(node);
        }
        group.wait("a leader with two synchronous standbys", Duration::from_secs(180), |g| g.leader().is_some_and(|l| g.sync_standbys(l) == NODES - 1));
        group
    }

    fn start_node(&self, node: usize) {
        let script = format!(
            "cd {root} || exit 1; setsid nohup patroni {yml} >> {root}/patroni{n}.log 2>&1 < /dev/null &",
            root = self.root.display(),
            yml = self.yml(node).display(),
            n = node + 1
        );
        assert!(as_postgres(&script).status.success());
    }

    /// SIGKILL to a node's Patroni and every postgres process of its data
    /// directory (not only the postmaster: a backend that outlived it
    /// would hold its shared memory when Patroni starts it again): its
    /// machine lost.
    fn kill_node(&self, node: usize) {
        for pid in pids(&format!("patroni {}", self.yml(node).display())) {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let data = self.root.join(format!("node{}", node + 1));
        let of_node = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd == data));
        for pid in of_node {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }

    fn stop_all(&self) {
        for node in 0..NODES {
            self.kill_node(node);
        }
        for pid in pids(&format!("etcd --name e --data-dir {}/", self.root.display())) {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }

    fn connect(&self, node: usize) -> Option<Client> {
        Client::connect(&format!("host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=2", self.pg_port(node)), NoTls).ok()
    }

    /// The node out of recovery, if exactly one is.
    fn leader(&self) -> Option<usize> {
        let out_of_recovery: Vec<usize> = (0..NODES)
            .filter(|n| self.connect(*n).and_then(|mut c| c.query_one("SELECT NOT pg_is_in_recovery()", &[]).ok()).is_some_and(|r| r.get(0)))
            .collect();
        (out_of_recovery.len() == 1).then(|| out_of_recovery[0])
    }

    /// Standbys streaming to `leader` that its commits wait for.
    fn sync_standbys(&self, leader: usize) -> usize {
        self.connect(leader)
            .and_then(|mut c| {
                c.query_one("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum')", &[]).ok()
            })
            .map_or(0, |r| r.get::<_, i64>(0) as usize)
    }

    /// Wait until a leader `ok` accepts is the only node out of recovery.
    fn wait_for_leader(&self, what: &str, deadline: Duration, ok: impl Fn(usize) -> bool) -> usize {
        let started = Instant::now();
        loop {
            match self.leader() {
                Some(l) if ok(l) => return l,
                _ => assert!(started.elapsed() < deadline, "{what}: not within {deadline:?}\n{}", self.diagnostics()),
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    fn wait(&self, what: &str, deadline: Duration, ok: impl Fn(&Group) -> bool) -> Duration {
        let started = Instant::now();
        while !ok(self) {
            assert!(started.elapsed() < deadline, "{what}: not within {deadline:?}\n{}", self.diagnostics());
            std::thread::sleep(Duration::from_millis(300));
        }
        started.elapsed()
    }

    fn diagnostics(&self) -> String {
        let root = self.root.display();
        let script = format!(
            "patronictl -c {root}/node1.yml list 2>&1; for n in 1 2 3; do echo \"--- node$n patroni\"; tail -n 20 {root}/patroni$n.log; \
             echo \"--- node$n server\"; tail -n 20 $(ls -t {root}/node$n/log/*.log 2>/dev/null | head -n 1) 2>&1; done"
        );
        String::from_utf8_lossy(&as_postgres(&script).stdout).into_owned()
    }

    /// Every node, writable first (libpq's target_session_attrs).
    fn dsn(&self) -> String {
        let ports: Vec<String> = (0..NODES).map(|n| self.pg_port(n).to_string()).collect();
        format!(
            "host=127.0.0.1,127.0.0.1,127.0.0.1 port={} user=postgres dbname=postgres target_session_attrs=read-write connect_timeout=2",
            ports.join(",")
        )
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// Errors that no failover excuses: a unique violation, a data exception
/// or an internal error from the allocators.
fn never_excused(code: &str) -> bool {
    code.starts_with("23") || code.starts_with("22") || code.starts_with("XX")
}

/// One successful round of the load: when, from which port, the values.
struct Round {
    at: Instant,
    port: u16,
    counter: i64,
    block: (i64, i64),
    ticket: i64,
    snowflake: i64,
    sharded: Option<i64>,
}

/// Clients drawing from every allocator until `stop`; errors no failover
/// excuses go to `inexcusable`.
fn load(dsn: &str, sharded: bool, stop: &Arc<AtomicBool>, rounds: &Arc<Mutex<Vec<Round>>>, inexcusable: &Arc<Mutex<Vec<String>>>) -> Vec<std::thread::JoinHandle<()>> {
    let sql = format!(
        "SELECT next_scoped_id('pat', 'orders'), b.first_id, b.last_id, next_ticket('pat', 'jobs'), snowflake_id(), {}, inet_server_port()
           FROM reserve_block('pat', 10) b",
        if sharded { "sharded_id(1)" } else { "NULL::bigint" }
    );
    (0..4)
        .map(|_| {
            let (dsn, sql, stop, rounds, inexcusable) = (dsn.to_string(), sql.clone(), Arc::clone(stop), Arc::clone(rounds), Arc::clone(inexcusable));
            std::thread::spawn(move || {
                let mut conn: Option<Client> = None;
                while !stop.load(Ordering::Relaxed) {
                    let Some(c) = pg_ticket_integration::reconnected(&mut conn, &dsn) else { continue };
                    match c.query_one(sql.as_str(), &[]) {
                        Ok(r) => rounds.lock().unwrap().push(Round {
                            at: Instant::now(),
                            port: r.get::<_, i32>(6) as u16,
                            counter: r.get(0),
                            block: (r.get(1), r.get(2)),
                            ticket: r.get(3),
                            snowflake: r.get(4),
                            sharded: r.get(5),
                        }),
                        // Refusals while the leader changes (read-only, no
                        // lease yet, the standby wait cancelled) and broken
                        // connections: try again.
                        Err(e) => {
                            if let Some(db) = e.as_db_error().filter(|db| never_excused(db.code().code())) {
                                inexcusable.lock().unwrap().push(format!("{}: {}", db.code().code(), db.message()));
                            }
                            conn = None;
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                }
            })
        })
        .collect()
}

/// Wait until the load has a round from `port` after `since`.
fn first_round_on(rounds: &Mutex<Vec<Round>>, port: u16, since: Instant, group: &Group) -> Duration {
    loop {
        if let Some(r) = rounds.lock().unwrap().iter().find(|r| r.port == port && r.at > since) {
            return r.at.duration_since(since);
        }
        assert!(since.elapsed() < Duration::from_secs(120), "no write on port {port} within 120 s\n{}", group.diagnostics());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The rounds in the order received, cut where the answering port
/// changes: each leader's stretch.
fn stretches(rounds: &[Round]) -> Vec<Vec<&Round>> {
    let mut sorted: Vec<&Round> = rounds.iter().collect();
    sorted.sort_by_key(|r| r.at);
    let mut out: Vec<Vec<&Round>> = Vec::new();
    for r in sorted {
        match out.last_mut() {
            Some(s) if s[0].port == r.port => s.push(r),
            _ => out.push(vec![r]),
        }
    }
    out
}

/// Every value of each stretch is above every value of the stretches
/// before it: a new leader continues above what its predecessors handed out.
fn continues_above(stretches: &[Vec<&Round>], what: &str, value: impl Fn(&Round) -> i64) {
    let mut highest = i64::MIN;
    for (i, s) in stretches.iter().enumerate() {
        let lowest = s.iter().map(|r| value(r)).min().unwrap();
        assert!(lowest > highest, "{what}: leader {} (stretch {i}) handed out {lowest}, not above {highest} handed out before", s[0].port);
        highest = highest.max(s.iter().map(|r| value(r)).max().unwrap());
    }
}

fn distinct(what: &str, values: impl Iterator<Item = i64>) {
    let mut seen = HashSet::new();
    for v in values {
        assert!(seen.insert(v), "{what} {v} handed out twice");
    }
}

/// The group under load: its leader killed, the old leader rejoined and
/// made leader again by a switchover; then every check.
fn fail_over_and_back(name: &str, group: &Group, fixed_id: bool) {
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(Mutex::new(Vec::new()));
    let inexcusable = Arc::new(Mutex::new(Vec::new()));
    let clients = load(&group.dsn(), fixed_id, &stop, &rounds, &inexcusable);
    std::thread::sleep(Duration::from_secs(4));

    let first = group.wait_for_leader("a leader", Duration::from_secs(30), |_| true);
    let killed_at = Instant::now();
    group.kill_node(first);
    let second = group.wait_for_leader("another leader", Duration::from_secs(90), |l| l != first);
    let failover = first_round_on(&rounds, group.pg_port(second), killed_at, group);
    eprintln!("{name}: node{} killed; node{} took the writes {failover:?} later", first + 1, second + 1);

    group.start_node(first);
    let rejoined = group.wait("the old leader streaming synchronously again", Duration::from_secs(120), |g| {
        g.leader() == Some(second) && g.sync_standbys(second) == NODES - 1
    });
    eprintln!("{name}: node{} rejoined (pg_rewind) in {rejoined:?}", first + 1);
    // Patroni takes a switchover only to a member its DCS lists as a
    // synchronous standby, which can trail pg_stat_replication by a loop;
    // patronictl says so and exits 0: asked again until it is taken.
    let switched_at = Instant::now();
    loop {
        let out = as_postgres(&format!(
            "patronictl -c {} switchover --leader node{} --candidate node{} --force 2>&1",
            group.yml(first).display(),
            second + 1,
            first + 1
        ));
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() && !said.contains("failed") {
            break;
        }
        assert!(switched_at.elapsed() < Duration::from_secs(60), "switchover not taken within 60 s: {said}\n{}", group.diagnostics());
        std::thread::sleep(Duration::from_secs(1));
    }
    let back = first_round_on(&rounds, group.pg_port(first), switched_at, group);
    eprintln!("{name}: switchover to node{}: writes on it {back:?} after it was asked", first + 1);
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }

    let rounds = rounds.lock().unwrap();
    let stretches = stretches(&rounds);
    eprintln!(
        "{name}: checked {} rounds (counter, block, ticket, snowflake{}) from {} leaders in turn: {:?}",
        rounds.len(),
        if fixed_id { ", sharded ID" } else { "" },
        stretches.len(),
        stretches.iter().map(|s| (s[0].port, s.len())).collect::<Vec<_>>()
    );
    let ports: Vec<u16> = stretches.iter().map(|s| s[0].port).collect();
    let (first_port, second_port) = (group.pg_port(first), group.pg_port(second));
    assert!(
        ports.len() >= 3 && ports[0] == first_port && ports.contains(&second_port) && *ports.last().unwrap() == first_port,
        "writes from the first leader, the one after the kill, then the rewound first one again: {ports:?}"
    );
    let inexcusable = inexcusable.lock().unwrap();
    assert!(inexcusable.is_empty(), "errors no failover excuses: {inexcusable:?}");
    distinct("counter value", rounds.iter().map(|r| r.counter));
    continues_above(&stretches, "counters", |r| r.counter);
    let mut blocks: Vec<(i64, i64)> = rounds.iter().map(|r| r.block).collect();
    blocks.sort_unstable();
    assert!(blocks.windows(2).all(|w| w[0].1 < w[1].0), "overlapping blocks");
    distinct("ticket", rounds.iter().map(|r| r.ticket));
    // A synchronous standby has every segment the old leader handed out
    // from (the worker's commit waited for it).
    continues_above(&stretches, "tickets", |r| r.ticket);
    distinct("snowflake", rounds.iter().map(|r| r.snowflake));
    if fixed_id {
        // One machine id for the group. The nodes share one wall clock and a
        // change of leader takes seconds, so this holds by the clock alone;
        // a promoted standby whose clock is behind the old primary's mark
        // is failover.rs's test (faketime).
        continues_above(&stretches, "snowflakes", |r| r.snowflake);
        distinct("sharded ID", rounds.iter().map(|r| r.sharded.unwrap()));
        continues_above(&stretches, "sharded IDs of shard 1", |r| r.sharded.unwrap());
    }
    // (Leased ids: one node writes at a time here, so two nodes stamping one
    // id at once would need a split brain, which failover.rs makes.)
}

#[test]
#[ignore = "make test-patroni runs it, once per make test"]
fn patroni_fails_over_and_back_with_a_fixed_machine_id_and_nothing_is_handed_out_twice() {
    let group = Group::start("fixed", 25650, &[("pg_ticket.machine_id", "7"), ("pg_ticket.shards", "0-3")]);
    let leader = group.wait_for_leader("the leader", Duration::from_secs(30), |_| true);
    let mut c = group.connect(leader).unwrap();
    c.batch_execute("CREATE EXTENSION pg_ticket; SELECT pgticket.accept_shard(s, 0) FROM generate_series(0, 3) s").unwrap();
    fail_over_and_back("fixed id", &group, true);
}

#[test]
#[ignore = "make test-patroni runs it, once per make test"]
fn patroni_fails_over_and_back_with_leased_machine_ids_and_nothing_is_handed_out_twice() {
    // The registry lives outside the group it leases to.
    let registry = Cluster::start("patroni-registry", 55668, &["pg_ticket.lease_margin = '1s'"]);
    let registry_dsn = registry.dsn();
    let group = Group::start(
        "leased",
        25660,
        &[("pg_ticket.machine_id", "-1"), ("pg_ticket.registry", &registry_dsn), ("pg_ticket.machine_lease_ttl", "3s")],
    );
    let leader = group.wait_for_leader("the leader", Duration::from_secs(30), |_| true);
    group.connect(leader).unwrap().batch_execute("CREATE EXTENSION pg_ticket").unwrap();
    fail_over_and_back("leased ids", &group, false);
}
