//! Failover and server identity (SPEC §10): the snowflake mark reaches
//! standbys through WAL; servers that lease their machine id never share
//! one, through promotion, split brain and copied data directories.

use pg_ticket_integration::{sqlstate, Cluster};
use postgres::Client;
use std::time::{Duration, Instant};

fn snowflakes(c: &mut Client, n: i64) -> Result<Vec<i64>, postgres::Error> {
    Ok(c.query("SELECT snowflake_id() FROM generate_series(1, $1::bigint)", &[&n])?.iter().map(|r| r.get(0)).collect())
}

fn wait_for_replay(primary: &mut Client, standby: &mut Client) {
    let target: String = primary.query_one("SELECT pg_current_wal_flush_lsn()::text", &[]).unwrap().get(0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !standby
        .query_one("SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn", &[&target])
        .unwrap()
        .get::<_, bool>(0)
    {
        assert!(Instant::now() < deadline, "the standby did not replay up to {target}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The regression test of 0.1.0's failover gap: the primary's clock 6 s
/// ahead, a base backup, 9 s more of snowflakes (the standby's real clock
/// passes the mark file it copied but stays below the primary's latest
/// IDs), replay, promotion. Measured on 0.1.0: the promoted standby's first
/// IDs were 5.5 s below the old primary's last ones, same machine id.
#[test]
fn a_promoted_standby_stamps_above_a_primary_whose_clock_ran_ahead() {
    let primary = Cluster::start("wal-ahead-p", 55462, &[]);
    primary.stop_with("fast");
    primary.up(Some("+6s"));
    let mut p = primary.connect_when_ready();
    let mut issued = snowflakes(&mut p, 1000).unwrap();
    let standby = primary.standby("wal-ahead-s", 55463, &[]);
    let mut s = standby.connect_when_ready();
    let until = Instant::now() + Duration::from_secs(9);
    while Instant::now() < until {
        issued.extend(snowflakes(&mut p, 200).unwrap());
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_for_replay(&mut p, &mut s);
    let max_primary = *issued.iter().max().unwrap();
    drop(p);
    primary.stop_with("fast");
    standby.promote();
    let mut s = standby.connect_when_ready();
    // Refused (the clock is behind the replayed mark) or waited, until the
    // standby's clock passes it; never an ID at or below the primary's.
    let promoted_at = Instant::now();
    let mut refusals = 0;
    let first = loop {
        match s.query_one("SELECT snowflake_id()", &[]) {
            Ok(row) => break row.get::<_, i64>(0),
            Err(e) => {
                assert_eq!(sqlstate(&e), "55000", "{e:?}");
                refusals += 1;
                assert!(promoted_at.elapsed() < Duration::from_secs(20), "still refusing 20 s after promotion");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    };
    eprintln!(
        "promoted standby: {refusals} refusals over {:?}, first ID {first} vs the old primary's last {max_primary} ({} ms above)",
        promoted_at.elapsed(),
        (first >> 22) - (max_primary >> 22)
    );
    assert!(first > max_primary, "the promoted standby stamped {first} at or below the old primary's {max_primary}");
    let after = snowflakes(&mut s, 1000).unwrap();
    assert!(after.iter().all(|id| *id > max_primary));
}

fn leased_conf(registry: &Cluster) -> Vec<String> {
    vec![
        "pg_ticket.machine_id = -1".into(),
        format!("pg_ticket.registry = '{}'", registry.dsn()),
        "pg_ticket.machine_lease_ttl = '3s'".into(),
    ]
}

/// The machine id this server's lease holds now, waiting for one.
fn leased_id(c: &mut Client) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(id) = c.query_one("SELECT machine_id FROM pgticket.status", &[]).unwrap().get::<_, Option<i32>>(0) {
            return id;
        }
        assert!(Instant::now() < deadline, "no machine-id lease after 20 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn machine_ids(ids: &[i64]) -> std::collections::BTreeSet<i64> {
    ids.iter().map(|id| (id >> 12) & 1023).collect()
}

fn duplicates(ids: &[i64]) -> usize {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    ids.len() - sorted.len()
}

/// Draws snowflakes from `c` on a thread until `stop`, keeping every ID it
/// received and counting refusals.
fn drawing(
    dsn: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<(Vec<i64>, usize)> {
    std::thread::spawn(move || {
        let mut c = Client::connect(&dsn, postgres::NoTls).unwrap();
        let (mut ids, mut refusals) = (Vec::new(), 0);
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            match snowflakes(&mut c, 100) {
                Ok(batch) => ids.extend(batch),
                Err(e) => {
                    assert_eq!(sqlstate(&e), "55000", "{e:?}");
                    refusals += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        (ids, refusals)
    })
}

#[test]
fn split_brain_with_leased_ids_never_shares_an_id_and_an_unreachable_registry_stops_snowflakes_only() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let registry = Cluster::start("fo-registry", 55464, &["pg_ticket.lease_margin = '1s'", "pg_ticket.lease_max_ttl = '6s'"]);
    let conf = leased_conf(&registry);
    let conf: Vec<&str> = conf.iter().map(String::as_str).collect();
    let primary = Cluster::start("fo-primary", 55465, &conf);
    let mut p = primary.connect();
    let primary_id = leased_id(&mut p);
    // The lease's token is the holder's proof: superusers see it in the
    // PUBLIC status view, other roles do not (0.2.0 showed it to all).
    p.batch_execute("CREATE ROLE status_plain LOGIN").unwrap();
    let token: Option<i64> = p.query_one("SELECT machine_lease FROM pgticket.status", &[]).unwrap().get(0);
    assert!(token.is_some(), "a superuser sees the lease token");
    let mut plain = primary.connect_as("status_plain", "postgres");
    let (id, token): (Option<i32>, Option<i64>) =
        plain.query_one("SELECT machine_id, machine_lease FROM pgticket.status", &[]).map(|r| (r.get(0), r.get(1))).unwrap();
    assert_eq!((id, token), (Some(i32::from(primary_id)), None), "another role sees the id, not the token");
    let standby = primary.standby("fo-standby", 55466, &[]);
    let mut s = standby.connect_when_ready();
    let err = s.query_one("SELECT snowflake_id()", &[]).unwrap_err();
    assert_eq!(sqlstate(&err), "25006");
    assert_eq!(s.query_one("SELECT machine_id FROM pgticket.status", &[]).unwrap().get::<_, Option<i32>>(0), None, "a standby holds no lease");

    // Split brain: the standby promoted while the primary keeps issuing.
    let stop = Arc::new(AtomicBool::new(false));
    let on_primary = drawing(primary.dsn(), Arc::clone(&stop));
    std::thread::sleep(Duration::from_millis(500));
    standby.promote();
    let mut s = standby.connect_when_ready();
    let standby_id = leased_id(&mut s);
    let on_standby = drawing(standby.dsn(), Arc::clone(&stop));
    std::thread::sleep(Duration::from_secs(4));
    stop.store(true, Ordering::Relaxed);
    let (from_primary, _) = on_primary.join().unwrap();
    let (from_standby, _) = on_standby.join().unwrap();
    eprintln!(
        "split brain: {} IDs from the old primary (machine id {primary_id}), {} from the promoted standby (machine id {standby_id})",
        from_primary.len(),
        from_standby.len()
    );
    assert_ne!(primary_id, standby_id);
    assert!(from_primary.len() > 1000 && from_standby.len() > 1000);
    assert_eq!(machine_ids(&from_primary), [i64::from(primary_id)].into());
    assert_eq!(machine_ids(&from_standby), [i64::from(standby_id)].into());
    let all: Vec<i64> = from_primary.iter().chain(&from_standby).copied().collect();
    assert_eq!(duplicates(&all), 0);

    // The registry unreachable for longer than the ttl (3 s): snowflakes
    // stop before the lease can have ended; scoped counters go on.
    let registry_stopped_at = Instant::now();
    registry.stop_with("immediate");
    // The lease's end as the registry last set it: no renewal can move it now.
    let lease_end_ms: i64 = p
        .query_one("SELECT (extract(epoch FROM machine_lease_expires_at) * 1000)::bigint FROM pgticket.status", &[])
        .unwrap()
        .get(0);
    let stopped_after = loop {
        match p.query_one("SELECT snowflake_id()", &[]) {
            Ok(row) => {
                let id: i64 = row.get(0);
                let stamp_ms = (id >> 22) + 1_767_225_600_000;
                assert!(stamp_ms < lease_end_ms, "stamped {stamp_ms} at or after the lease's end {lease_end_ms}");
                // The last renewal was sent before the stop: its reckoning ends
                // within the ttl (plus this query's own latency).
                assert!(registry_stopped_at.elapsed() < Duration::from_millis(3_500), "issued past the ttl with the registry gone");
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                assert_eq!(sqlstate(&e), "55000", "{e:?}");
                break registry_stopped_at.elapsed();
            }
        }
    };
    eprintln!("registry down: snowflakes refused after {stopped_after:?} (ttl 3 s)");
    p.query_one("SELECT next_scoped_id('fo', 'x')", &[]).expect("counters work without the registry");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(sqlstate(&p.query_one("SELECT snowflake_id()", &[]).unwrap_err()), "55000");
    registry.up(None);
    let resumed_at = Instant::now();
    loop {
        if p.query_one("SELECT snowflake_id()", &[]).is_ok() {
            break;
        }
        assert!(resumed_at.elapsed() < Duration::from_secs(20), "no snowflakes 20 s after the registry came back");
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("registry back: snowflakes again after {:?}", resumed_at.elapsed());

    // pg_ticket.machine_lease_ttl is reloadable: the next renewal uses it.
    // (The registry allows 6 s: it holds off that long plus the margin after
    // its restart above.)
    p.batch_execute("ALTER SYSTEM SET pg_ticket.machine_lease_ttl = '6s'").unwrap();
    p.batch_execute("SELECT pg_reload_conf()").unwrap();
    let reloaded = Instant::now();
    while p
        .query_one("SELECT machine_lease_expires_at < now() + interval '4.5 seconds' FROM pgticket.status", &[])
        .unwrap()
        .get::<_, Option<bool>>(0)
        != Some(false)
    {
        assert!(reloaded.elapsed() < Duration::from_secs(10), "the reloaded ttl was not used");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_copied_data_directory_started_beside_its_original_leases_another_id() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let registry = Cluster::start("fo-registry2", 55467, &["pg_ticket.lease_margin = '1s'"]);
    let conf = leased_conf(&registry);
    let conf: Vec<&str> = conf.iter().map(String::as_str).collect();
    let original = Cluster::start("fo-original", 55468, &conf);
    leased_id(&mut original.connect());
    original.stop_with("fast");
    let clone_dir = std::path::PathBuf::from("/tmp/pgt-fo-clone");
    pg_ticket_integration::owned_dir(&clone_dir);
    let copied = std::process::Command::new("cp").arg("-a").arg(original.data_dir()).arg(&clone_dir).status().unwrap();
    assert!(copied.success());
    let mut f = std::fs::OpenOptions::new().append(true).open(clone_dir.join("data/postgresql.conf")).unwrap();
    std::io::Write::write_all(&mut f, format!("port = 55469\nunix_socket_directories = '{}'\n", clone_dir.display()).as_bytes()).unwrap();
    let clone = Cluster::attach(&clone_dir, 55469);
    original.up(None);
    clone.up(None);
    let original_id = leased_id(&mut original.connect_when_ready());
    let clone_id = leased_id(&mut clone.connect_when_ready());
    assert_ne!(original_id, clone_id, "a copy of the data directory reuses the lease");
    let stop = Arc::new(AtomicBool::new(false));
    let a = drawing(original.dsn(), Arc::clone(&stop));
    let b = drawing(clone.dsn(), Arc::clone(&stop));
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let (from_original, _) = a.join().unwrap();
    let (from_clone, _) = b.join().unwrap();
    eprintln!("clone: {} + {} IDs, machine ids {original_id} and {clone_id}", from_original.len(), from_clone.len());
    let all: Vec<i64> = from_original.iter().chain(&from_clone).copied().collect();
    assert_eq!(duplicates(&all), 0);
    assert!(machine_ids(&from_original).is_disjoint(&machine_ids(&from_clone)));
    clone.stop();
}
