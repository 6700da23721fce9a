//! The machine-id registry (SPEC §8) under time, concurrency, restarts and
//! restores: what pg_regress `leases` cannot show with fixed output.

use pg_ticket_integration::{pg_tool, sqlstate, Cluster};
use postgres::Client;
use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

#[derive(Debug, Clone)]
struct Grant {
    machine_id: i32,
    lease: i64,
    secret: String,
    not_before_ms: i64,
    expires_ms: i64,
}

fn lease(c: &mut Client, holder: &str, ttl: &str) -> Result<Grant, postgres::Error> {
    let row = c.query_one(
        "SELECT machine_id, lease, secret, not_before_ms, (extract(epoch FROM expires_at) * 1000)::bigint
           FROM pgticket.lease_machine_id($1, $2::text::interval)",
        &[&holder, &ttl],
    )?;
    Ok(Grant { machine_id: row.get(0), lease: row.get(1), secret: row.get(2), not_before_ms: row.get(3), expires_ms: row.get(4) })
}

fn renew(c: &mut Client, g: &Grant) -> Result<(), postgres::Error> {
    c.execute("SELECT pgticket.renew_machine_id($1, $2, $3, '3 seconds')", &[&g.machine_id, &g.lease, &g.secret]).map(|_| ())
}

fn release(c: &mut Client, g: &Grant, last_issued_ms: Option<i64>) {
    c.execute("SELECT pgticket.release_machine_id($1, $2, $3, $4)", &[&g.machine_id, &g.lease, &g.secret, &last_issued_ms]).unwrap();
}

fn message(err: &postgres::Error) -> String {
    err.as_db_error().map(|e| e.message().to_string()).unwrap_or_else(|| err.to_string())
}

fn refused(result: Result<Grant, postgres::Error>) -> String {
    match result {
        Ok(g) => panic!("granted {g:?}, expected a refusal"),
        Err(e) => sqlstate(&e),
    }
}

#[test]
fn concurrent_leasers_never_share_an_id() {
    let c = Cluster::start("leases-race", 55453, &["pg_ticket.machine_id = 7", "pg_ticket.lease_ids = '0-15'", "pg_ticket.lease_margin = '1s'"]);
    // 32 at once for 15 ids (7 is the server's own): 15 distinct grants, 17 × 53400.
    let outcomes: Vec<Result<Grant, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..32)
            .map(|i| {
                let c = &c;
                s.spawn(move || {
                    let mut client = c.connect();
                    lease(&mut client, &format!("racer-{i}"), "30 seconds").map_err(|e| sqlstate(&e))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut ids: Vec<i32> = outcomes.iter().filter_map(|o| o.as_ref().ok().map(|g| g.machine_id)).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..16).filter(|&i| i != 7).collect::<Vec<_>>(), "every leasable id exactly once");
    assert!(outcomes.iter().filter_map(|o| o.as_ref().err()).all(|s| s == "53400"), "{outcomes:?}");
    for g in outcomes.iter().filter_map(|o| o.as_ref().ok()) {
        release(&mut c.connect(), g, None);
    }
    std::thread::sleep(Duration::from_millis(1_200));

    // Churn: 32 holders lease, hold briefly, release, lease again, over 15
    // ids with a 1 s margin. Two holders of one id would show as
    // overlapping holdings (from the grant's reply to the release's send).
    let holdings: Vec<(i32, i64, i64, i64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..32)
            .map(|i| {
                let c = &c;
                s.spawn(move || {
                    let mut client = c.connect();
                    let mut mine = Vec::new();
                    let deadline = now_ms() + 8_000;
                    while now_ms() < deadline {
                        match lease(&mut client, &format!("churn-{i}"), "5 seconds") {
                            Ok(g) => {
                                let from = now_ms();
                                std::thread::sleep(Duration::from_millis(50));
                                let to = now_ms();
                                release(&mut client, &g, Some(to));
                                mine.push((g.machine_id, g.lease, from, to));
                            }
                            Err(e) => {
                                assert_eq!(sqlstate(&e), "53400", "{e}");
                                std::thread::sleep(Duration::from_millis(20));
                            }
                        }
                    }
                    mine
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let mut by_id: HashMap<i32, Vec<(i64, i64, i64)>> = HashMap::new();
    for (id, token, from, to) in &holdings {
        by_id.entry(*id).or_default().push((*from, *to, *token));
    }
    assert!(holdings.len() >= 30, "churn granted only {} leases", holdings.len());
    let mut tokens: Vec<i64> = holdings.iter().map(|h| h.1).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), holdings.len(), "every grant has its own token");
    for (id, mut spans) in by_id {
        spans.sort_unstable();
        for w in spans.windows(2) {
            assert!(w[0].1 < w[1].0, "id {id} held twice at once: {:?} and {:?}", w[0], w[1]);
            assert!(w[0].2 < w[1].2, "id {id}: a later grant has a lower token");
        }
    }
    assert!(!holdings.iter().any(|h| h.0 == 7), "never the server's own id");
}

#[test]
fn an_id_frees_only_after_its_lease_ended_plus_the_margin() {
    let c = Cluster::start("leases-margin", 55454, &["pg_ticket.lease_ids = '1'", "pg_ticket.lease_margin = '2s'"]);
    let mut db = c.connect();
    let first = lease(&mut db, "a", "30 seconds").unwrap();
    // Never leased: nothing to stamp above but the end of the hold-off
    // (ended by pgticket.end_lease_hold_off() at CREATE EXTENSION, already past).
    assert_eq!(first.machine_id, 1);
    assert!(first.not_before_ms > 0 && first.not_before_ms <= now_ms(), "never leased: {first:?}");
    assert_eq!(refused(lease(&mut db, "b", "30 seconds")), "53400");

    // Released, reporting a stamp ahead of the registry's clock (within the
    // margin: a stamp past the release plus the margin is refused, 22023).
    let ahead = now_ms() + 1_500;
    release(&mut db, &first, Some(ahead));
    let released_at = now_ms();
    assert_eq!(refused(lease(&mut db, "b", "30 seconds")), "53400", "within the margin");
    std::thread::sleep(Duration::from_millis(2_300));
    let second = lease(&mut db, "b", "1 second").unwrap();
    assert_eq!(second.machine_id, 1);
    assert!(second.lease > first.lease, "tokens increase");
    assert!(second.not_before_ms >= ahead, "above the reported stamp: {} < {ahead}", second.not_before_ms);
    assert!(second.not_before_ms >= released_at - 100 + 2_000, "above the release plus the margin");
    assert_eq!(renew(&mut db, &first).map_err(|e| sqlstate(&e)), Err("55000".into()), "a stale token");

    // Expiry with a 1 s ttl: the renewal is refused, the id frees only
    // after the expiry plus the margin, and its next holder stamps above.
    std::thread::sleep(Duration::from_millis((second.expires_ms - now_ms()).max(0) as u64 + 100));
    let err = renew(&mut db, &second).unwrap_err();
    assert_eq!(sqlstate(&err), "55000");
    assert!(message(&err).contains("expired"), "{}", message(&err));
    assert_eq!(refused(lease(&mut db, "c", "30 seconds")), "53400", "expired but within the margin");
    std::thread::sleep(Duration::from_millis((second.expires_ms + 2_000 - now_ms()).max(0) as u64 + 200));
    let third = lease(&mut db, "c", "30 seconds").unwrap();
    assert!(third.not_before_ms >= second.expires_ms + 2_000, "{third:?} vs expiry {}", second.expires_ms);
    assert_eq!(renew(&mut db, &second).map_err(|e| sqlstate(&e)), Err("55000".into()));
    renew(&mut db, &third).unwrap();
}

/// SPEC §8 rule 7: any start may be a copy, so a registry holds off new
/// grants after every start — a restart, a dump restored — for the longest
/// ttl plus the margin, and renews the leases it knows meanwhile.
#[test]
fn tokens_increase_across_a_restart_and_a_restore_and_a_started_registry_holds_off_but_renews() {
    let c = Cluster::start("leases-restore", 55455, &["pg_ticket.lease_margin = '1s'", "pg_ticket.lease_max_ttl = '3s'"]);
    let mut db = c.connect();
    let before = lease(&mut db, "before-restart", "3 seconds").unwrap();
    drop(db);
    c.stop_with("immediate");
    c.up(None);
    let restarted_at = now_ms();
    let mut db = c.connect_when_ready();
    let err = lease(&mut db, "after-restart", "3 seconds").unwrap_err();
    assert_eq!(sqlstate(&err), "55000", "a restart may be a copy: {}", message(&err));
    assert!(message(&err).contains("grants again from"), "{}", message(&err));
    renew(&mut db, &before).expect("a lease the registry knows is renewed during the hold-off");
    std::thread::sleep(Duration::from_millis((restarted_at + 4_000 - now_ms()).max(0) as u64 + 300));
    let after_restart = lease(&mut db, "after-restart", "3 seconds").unwrap();
    assert!(after_restart.lease > before.lease, "a restart keeps the tokens");
    assert_ne!(after_restart.machine_id, before.machine_id, "the renewed lease still holds its id");
    let rows: i64 = db.query_one("SELECT count(*) FROM pgticket.lease_registry", &[]).unwrap().get(0);
    assert_eq!(rows, 1, "one identity row once settled");
    lease(&mut db, "settled", "3 seconds").expect("settled: no second hold-off");

    let dump = c.dir.join("registry.dump");
    let (host, port) = (c.dir.to_str().unwrap().to_string(), c.port.to_string());
    let conn = ["-h", host.as_str(), "-p", port.as_str(), "-U", "postgres"];
    pg_tool("pg_dump", &[&conn[..], &["-Fc", "-f", dump.to_str().unwrap(), "postgres"]].concat());
    // Granted after the dump: the restored registry cannot know of it.
    let forgotten = lease(&mut db, "after-dump", "3 seconds").unwrap();
    db.batch_execute("CREATE DATABASE restored").unwrap();
    pg_tool("pg_restore", &[&conn[..], &["-d", "restored", dump.to_str().unwrap()]].concat());
    let restored_at = now_ms();
    let mut restored = c.connect_as("postgres", "restored");
    let err = lease(&mut restored, "x", "3 seconds").unwrap_err();
    assert_eq!(sqlstate(&err), "55000");
    assert!(message(&err).contains("grants again from"), "{}", message(&err));
    renew(&mut restored, &after_restart).expect("the restored registry renews a lease it knows, for the holder with its secret");
    // The longest ttl (3 s) plus the margin (1 s) after the restore.
    std::thread::sleep(Duration::from_millis((restored_at + 4_000 - now_ms()).max(0) as u64 + 300));
    let resumed = lease(&mut restored, "after-hold-off", "3 seconds").unwrap();
    assert!(resumed.lease > forgotten.lease, "token {} after the restore repeats {} granted after the dump", resumed.lease, forgotten.lease);
    // The source registry was never restored: it grants without holding off.
    lease(&mut db, "source", "3 seconds").unwrap();
}
