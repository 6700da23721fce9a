//! `next_ticket()` with real clients, crashes, workers killed, odd/even
//! servers and a cache smaller than the scopes in use (SPEC §7).

use pg_ticket_integration::{shared_cluster, sqlstate, Cluster};
use std::collections::HashSet;
use std::time::{Duration, Instant};

fn cluster() -> &'static Cluster {
    // A small cache, so that eviction happens; small segments, so refills
    // happen often.
    shared_cluster(
        "tickets",
        55434,
        &["pg_ticket.ticket_cache_scopes = 16", "pg_ticket.ticket_step_min = 5", "pg_ticket.ticket_step_max = 50"],
    )
}

const CLIENTS: usize = 8;

/// `clients` connections each take `per_client` tickets from `scopes(i)`;
/// returns, per client, (scope, ticket) in the order received.
fn draw(c: &Cluster, per_client: usize, scope: impl Fn(usize, usize) -> String + Sync) -> Vec<Vec<(String, i64)>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..CLIENTS)
            .map(|client_no| {
                let scope = &scope;
                s.spawn(move || {
                    let mut client = c.connect();
                    let stmt = client.prepare("SELECT next_ticket($1, 'd')").unwrap();
                    (0..per_client)
                        .map(|i| {
                            let name = scope(client_no, i);
                            let t: i64 = client.query_one(&stmt, &[&name]).unwrap().get(0);
                            (name, t)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn assert_unique_and_increasing(per_client: &[Vec<(String, i64)>]) -> usize {
    let mut seen = HashSet::new();
    for received in per_client {
        let mut last_per_scope = std::collections::HashMap::new();
        for (scope, t) in received {
            assert!(seen.insert((scope.clone(), *t)), "ticket {t} of {scope} handed out twice");
            if let Some(prev) = last_per_scope.insert(scope.clone(), *t) {
                assert!(*t > prev, "{scope}: {t} after {prev} in one session");
            }
        }
    }
    seen.len()
}

#[test]
fn eight_clients_on_one_hot_scope_get_distinct_increasing_tickets() {
    let c = cluster();
    let got = draw(c, 3000, |_, _| "hot".to_string());
    assert_eq!(assert_unique_and_increasing(&got), CLIENTS * 3000);
    let waits: i64 = c.connect().query_one("SELECT coalesce(sum(waits), 0)::bigint FROM pgticket.ticket_cache WHERE queue = 'hot'", &[]).unwrap().get(0);
    println!("24 000 tickets on one scope, {waits} waits for a refill");
}

#[test]
fn more_scopes_than_the_cache_holds_stay_unique_with_gaps_only() {
    let c = cluster();
    // 100 scopes through a 16-slot cache: evictions all the time.
    let got = draw(c, 1000, |client, i| format!("evict-{}", (client * 7 + i * 13) % 100));
    assert_eq!(assert_unique_and_increasing(&got), CLIENTS * 1000);
}

#[test]
fn a_rolled_back_ticket_is_not_handed_out_again() {
    let c = cluster();
    let mut client = c.connect();
    let mut tx = client.transaction().unwrap();
    let lost: i64 = tx.query_one("SELECT next_ticket('rollback', 'd')", &[]).unwrap().get(0);
    tx.rollback().unwrap();
    let next: i64 = client.query_one("SELECT next_ticket('rollback', 'd')", &[]).unwrap().get(0);
    assert!(next > lost);
}

#[test]
fn the_worker_killed_while_backends_wait_gives_each_a_value_or_a_clear_error() {
    let c = cluster();
    let mut admin = c.connect();
    let killer = std::thread::spawn({
        let dsn = c.dsn();
        move || {
            let mut k = postgres::Client::connect(&dsn, postgres::NoTls).unwrap();
            let mut kills = 0;
            let until = Instant::now() + Duration::from_secs(3);
            while Instant::now() < until {
                kills += k
                    .query_one(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE backend_type = 'pg_ticket tickets'",
                        &[],
                    )
                    .unwrap()
                    .get::<_, i64>(0);
                std::thread::sleep(Duration::from_millis(50));
            }
            kills
        }
    });
    let got = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|n| {
                s.spawn(move || {
                    let mut client = c.connect();
                    let mut ok = Vec::new();
                    let until = Instant::now() + Duration::from_secs(3);
                    let mut i = 0;
                    while Instant::now() < until {
                        // Fresh scopes: every call needs the worker.
                        match client.query_one("SELECT next_ticket($1, 'd')", &[&format!("killed-{n}-{i}")]) {
                            Ok(row) => ok.push(row.get::<_, i64>(0)),
                            Err(e) => assert_eq!(sqlstate(&e), "55000", "{e}"),
                        }
                        i += 1;
                    }
                    ok
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
    });
    let kills = killer.join().unwrap();
    let served: usize = got.iter().map(Vec::len).sum();
    println!("worker terminated {kills} times; {served} first tickets served meanwhile");
    assert!(kills > 0, "the worker was running and killed");
    assert!(served > 0, "backends got values between the kills");
    // And it comes back for the next caller.
    let t: i64 = admin.query_one("SELECT next_ticket('after-kills', 'd')", &[]).unwrap().get(0);
    assert_eq!(t, 1);
}

/// Tickets received before the server went down, per scope.
fn load_until_crash(c: &Cluster, crash: impl FnOnce(&mut postgres::Client)) -> Vec<i64> {
    let stop = std::sync::atomic::AtomicBool::new(false);
    let received: Vec<Vec<i64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let stop = &stop;
                s.spawn(move || {
                    let mut client = c.connect();
                    let mut got = Vec::new();
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        match client.query_one("SELECT next_ticket('crash', 'd')", &[]) {
                            Ok(row) => got.push(row.get::<_, i64>(0)),
                            Err(_) => break,
                        }
                    }
                    got
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(1500));
        crash(&mut c.connect());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    received.concat()
}

fn assert_above_after_restart(c: &Cluster, before: &[i64]) {
    assert!(before.len() > 100, "the load ran: {} tickets", before.len());
    let distinct: HashSet<_> = before.iter().collect();
    assert_eq!(distinct.len(), before.len(), "a ticket was handed out twice before the crash");
    let max = *before.iter().max().unwrap();
    let mut client = c.connect_when_ready();
    let after: i64 = client.query_one("SELECT next_ticket('crash', 'd')", &[]).unwrap().get(0);
    println!("{} tickets before the crash, the highest {max}; the first after it {after}", before.len());
    assert!(after > max, "after the restart {after} is not above {max}");
}

#[test]
fn an_immediate_shutdown_under_load_never_reissues_a_ticket() {
    let c = Cluster::start("tickets-crash", 55433, &["pg_ticket.ticket_step_max = 1000"]);
    let before = load_until_crash(&c, |_| c.stop_with("immediate"));
    c.up(None);
    assert_above_after_restart(&c, &before);
    c.stop();
}

/// Load on a cluster of its own, then SIGKILL of the process `pid_query`
/// names: the postmaster resets every backend and shared memory.
fn sigkill_under_load(name: &str, port: u16, pid_query: &str) {
    let c = Cluster::start(name, port, &["pg_ticket.ticket_step_max = 1000"]);
    let before = load_until_crash(&c, |admin| {
        let pid: i32 = admin.query_one(pid_query, &[]).unwrap().get(0);
        assert!(std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap().success());
    });
    assert_above_after_restart(&c, &before);
    c.stop();
}

#[test]
fn the_worker_killed_with_sigkill_under_load_never_reissues_a_ticket() {
    sigkill_under_load("tickets-kill", 55429, "SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_ticket tickets'");
}

#[test]
fn a_client_backend_killed_with_sigkill_under_load_never_reissues_a_ticket() {
    sigkill_under_load(
        "tickets-kill-backend",
        55424,
        "SELECT pid FROM pg_stat_activity WHERE query LIKE 'SELECT next_ticket%' AND pid <> pg_backend_pid() LIMIT 1",
    );
}

#[test]
fn odd_and_even_servers_hand_out_disjoint_tickets_and_refuse_each_others_scopes() {
    let odd = Cluster::start("tickets-odd", 55428, &["pg_ticket.ticket_increment = 2", "pg_ticket.ticket_offset = 1"]);
    let even = Cluster::start("tickets-even", 55427, &["pg_ticket.ticket_increment = 2", "pg_ticket.ticket_offset = 2"]);
    let take = |c: &Cluster| -> Vec<i64> {
        c.connect().query("SELECT next_ticket('shared', 'd') FROM generate_series(1, 5000)", &[]).unwrap().iter().map(|r| r.get(0)).collect()
    };
    let (o, e) = (take(&odd), take(&even));
    assert!(o.iter().all(|t| t % 2 == 1) && e.iter().all(|t| t % 2 == 0));
    assert_eq!(o[0], 1);
    assert_eq!(e[0], 2);
    let all: HashSet<i64> = o.iter().chain(e.iter()).copied().collect();
    assert_eq!(all.len(), 10_000, "disjoint");

    // The odd server restarted as an even one: its scopes refuse, naming both series.
    odd.stop();
    let conf = odd.data_dir().join("postgresql.conf");
    let mut text = std::fs::read_to_string(&conf).unwrap();
    text = text.replace("pg_ticket.ticket_offset = 1", "pg_ticket.ticket_offset = 2");
    std::fs::write(&conf, text).unwrap();
    odd.up(None);
    let err = odd.connect().query_one("SELECT next_ticket('shared', 'd')", &[]).unwrap_err();
    assert_eq!(sqlstate(&err), "55000", "{err}");
    let message = err.as_db_error().unwrap().message().to_string();
    assert!(message.contains("offset 1 and increment 2") && message.contains("offset 2 and increment 2"), "{message}");
    let fresh: i64 = odd.connect().query_one("SELECT next_ticket('new', 'd')", &[]).unwrap().get(0);
    assert_eq!(fresh, 2, "new scopes follow the new series");
    odd.stop();
    even.stop();
}

#[test]
fn a_synchronous_standby_refuses_tickets_and_its_promotion_continues_above_every_one_handed_out() {
    let primary = Cluster::start("tickets-primary", 55426, &[]);
    primary.connect().query_one("SELECT next_ticket('ha', 'd')", &[]).unwrap();
    // The walreceiver names itself after cluster_name.
    let standby = primary.standby("tickets-standby", 55425, &["cluster_name = 'ticket_standby'"]);
    let mut p = primary.connect();
    p.batch_execute("ALTER SYSTEM SET synchronous_standby_names = 'ticket_standby'").unwrap();
    p.batch_execute("SELECT pg_reload_conf()").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while p
        .query("SELECT 1 FROM pg_stat_replication WHERE application_name = 'ticket_standby' AND sync_state = 'sync'", &[])
        .unwrap()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "the standby never became synchronous");
        std::thread::sleep(Duration::from_millis(50));
    }
    let err = standby.connect_when_ready().query_one("SELECT next_ticket('ha', 'd')", &[]).unwrap_err();
    assert_eq!(sqlstate(&err), "25006", "{err}");

    // Load, then the primary dies at once (no shutdown checkpoint, nothing
    // more sent): only what the standby confirmed survives.
    let before = load_until_crash(&primary, |_| primary.stop_with("immediate"));
    standby.promote();
    let max = *before.iter().max().unwrap();
    let mut s = standby.connect_when_ready();
    let after: Vec<i64> =
        s.query("SELECT next_ticket('crash', 'd') FROM generate_series(1, 1000)", &[]).unwrap().iter().map(|r| r.get(0)).collect();
    println!("{} tickets before the primary died, the highest {max}; the promoted standby's first {}", before.len(), after[0]);
    assert!(after.iter().all(|t| *t > max), "the promoted standby handed out a ticket at or below {max}");
    standby.stop();
}

#[test]
fn an_idle_worker_exits_so_its_database_can_be_dropped_and_comes_back_when_needed() {
    let c = cluster();
    let mut admin = c.connect();
    admin.batch_execute("CREATE DATABASE t_idle").unwrap();
    let mut db = c.connect_as("postgres", "t_idle");
    db.batch_execute("CREATE EXTENSION pg_ticket").unwrap();
    assert_eq!(db.query_one("SELECT next_ticket('idle', 'd')", &[]).unwrap().get::<_, i64>(0), 1);
    let workers = |admin: &mut postgres::Client| -> i64 {
        admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_ticket tickets' AND datname = 't_idle'",
                &[],
            )
            .unwrap()
            .get(0)
    };
    assert_eq!(workers(&mut admin), 1, "a worker serves the database");
    let deadline = Instant::now() + Duration::from_secs(30);
    while workers(&mut admin) > 0 {
        assert!(Instant::now() < deadline, "the idle worker never exited");
        std::thread::sleep(Duration::from_millis(200));
    }
    // From the cache (2), or — if the 16-slot cache evicted it meanwhile —
    // from a new segment the restarted worker reserved.
    assert!(db.query_one("SELECT next_ticket('idle', 'd')", &[]).unwrap().get::<_, i64>(0) > 1);
    assert!(db.query_one("SELECT next_ticket('idle-2', 'd')", &[]).unwrap().get::<_, i64>(0) == 1, "a new worker for a new scope");
    drop(db);
    let deadline = Instant::now() + Duration::from_secs(30);
    while workers(&mut admin) > 0 {
        assert!(Instant::now() < deadline, "the idle worker never exited");
        std::thread::sleep(Duration::from_millis(200));
    }
    admin.batch_execute("DROP DATABASE t_idle").unwrap();
}

/// Found under pg_auto_failover: a ticket worker whose commit waits for a
/// synchronous standby that is gone must still let a fast shutdown finish
/// (it takes SIGTERM as a backend does, which ends that wait).
#[test]
fn a_fast_shutdown_ends_a_ticket_worker_waiting_for_a_synchronous_standby_that_is_gone() {
    let c = Cluster::start("tickets-syncwait", 55472, &["pg_ticket.ticket_wait_timeout = '1s'"]);
    let mut db = c.connect();
    db.batch_execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'").unwrap();
    db.batch_execute("SELECT pg_reload_conf()").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let err = db.query_one("SELECT next_ticket('syncwait', 'x')", &[]).unwrap_err();
    assert_eq!(sqlstate(&err), "55000", "the worker's commit waits for the standby: {err:?}");
    let waiting: i64 = db
        .query_one("SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'pg_ticket tickets%' AND wait_event = 'SyncRep'", &[])
        .unwrap()
        .get(0);
    assert_eq!(waiting, 1, "the ticket worker waits for the synchronous standby");
    drop(db);
    let started = Instant::now();
    c.stop_with("fast");
    assert!(started.elapsed() < Duration::from_secs(20), "fast shutdown took {:?}", started.elapsed());
}
