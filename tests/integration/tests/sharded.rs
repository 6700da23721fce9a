//! Sharded IDs (SPEC §15, issue #21): unique and increasing per shard
//! across clients, a crash, a clock set back and a promotion; a shard not
//! listed, or listed and not accepted, is refused; a shard handed over
//! never goes below its old owner's last ID, and a released one stays
//! released on the old owner after a restart and on its promoted standby.

use pg_ticket_integration::{sqlstate, Cluster};
use postgres::Client;
use std::collections::HashSet;
use std::time::{Duration, Instant};

fn ids(c: &mut Client, shard: i32, n: i32) -> Result<Vec<i64>, postgres::Error> {
    Ok(c.query_one("SELECT array_agg(sharded_id($1) ORDER BY g) FROM generate_series(1, $2) g", &[&shard, &n])?.get(0))
}

fn shard_and_millis(c: &mut Client, id: i64) -> (i32, i64) {
    let row = c.query_one("SELECT shard, (extract(epoch FROM created_at) * 1000)::bigint FROM sharded_decode($1)", &[&id]).unwrap();
    (row.get(0), row.get(1))
}

/// New shards (no server issued them before) accepted at 0.
fn accept_new(c: &mut Client, shards: &[i32]) {
    for shard in shards {
        c.query_one("SELECT pgticket.accept_shard($1, 0)", &[shard]).unwrap();
    }
}


#[test]
fn eight_clients_on_four_shards_never_share_an_id_and_each_shard_increases() {
    let c = Cluster::start("sharded-8", 55431, &["pg_ticket.shards = '0-4'"]);
    let mut admin = c.connect();
    let err = admin.query_one("SELECT sharded_id(0)", &[]).unwrap_err();
    assert_eq!(sqlstate(&err), "55000", "listed but never accepted: {err}");
    assert!(err.as_db_error().unwrap().message().contains("never accepted"), "{err}");
    accept_new(&mut admin, &[0, 1, 2, 3]);
    let dsn = c.dsn();
    let workers: Vec<_> = (0..8)
        .map(|i| {
            let dsn = dsn.clone();
            std::thread::spawn(move || {
                let mut client = Client::connect(&dsn, postgres::NoTls).unwrap();
                let shard = i % 4;
                let mut mine = Vec::new();
                for _ in 0..10 {
                    mine.extend(ids(&mut client, shard, 2_000).unwrap());
                }
                (shard, mine)
            })
        })
        .collect();
    let mut all = HashSet::new();
    let mut client = c.connect();
    for w in workers {
        let (shard, mine) = w.join().unwrap();
        assert!(mine.windows(2).all(|w| w[0] < w[1]), "a client's IDs of shard {shard} do not increase");
        for id in &mine {
            assert!(all.insert(*id), "ID {id} handed out twice");
        }
        assert_eq!(shard_and_millis(&mut client, mine[0]).0, shard);
    }
    assert_eq!(all.len(), 160_000);
    // Another server's shard, and shards out of range.
    for (sql, state) in [
        ("SELECT sharded_id(4)", "55000"),
        ("SELECT sharded_id(5)", "55000"),
        ("SELECT pgticket.accept_shard(5, 0)", "55000"),
        ("SELECT sharded_id(4096)", "22023"),
        ("SELECT sharded_id(-1)", "22023"),
        ("SELECT sharded_id(NULL)", "22004"),
        ("SELECT shard_of('k', 0)", "22023"),
        ("SELECT shard_of('k', 4097)", "22023"),
        ("SELECT pgticket.release_shard(0)", "55000"),
        ("SELECT sharded_decode(-1)", "22023"),
    ] {
        let err = client.query_one(sql, &[]).unwrap_err();
        assert_eq!(sqlstate(&err), state, "{sql}: {err}");
    }
    let err = client.query_one("SELECT sharded_id(5)", &[]).unwrap_err();
    assert!(err.as_db_error().unwrap().message().contains("pg_ticket.shards"), "{err}");
    c.stop();
}

#[test]
fn a_crash_and_a_clock_set_back_never_reissue_a_shards_ids() {
    let c = Cluster::start("sharded-crash", 55451, &["pg_ticket.shards = '7'"]);
    let mut client = c.connect();
    accept_new(&mut client, &[7]);
    let before = ids(&mut client, 7, 5_000).unwrap();
    let max_before = *before.iter().max().unwrap();
    drop(client);
    c.stop_with("immediate");
    // Half a second back, within the reservation (up to 1 s ahead of the
    // last ID; a second has passed): waits, then above.
    std::thread::sleep(Duration::from_secs(1));
    c.up(Some("-0.5"));
    let mut client = c.connect_when_ready();
    let after = ids(&mut client, 7, 1_000).unwrap();
    assert!(after.iter().all(|id| *id > max_before), "an ID at or below one issued before the crash");
    let max_after = *after.iter().max().unwrap();
    drop(client);
    // Five minutes back: refused, nothing issued.
    c.stop_with("immediate");
    c.up(Some("-5m"));
    let mut client = c.connect_when_ready();
    let err = ids(&mut client, 7, 1).unwrap_err();
    assert_eq!(sqlstate(&err), "55000", "{err}");
    assert!(err.as_db_error().unwrap().message().contains("behind"), "{err}");
    drop(client);
    c.stop_with("fast");
    c.up(None);
    let mut client = c.connect();
    assert!(ids(&mut client, 7, 1_000).unwrap().iter().all(|id| *id > max_after));
    c.stop();
}

#[test]
fn a_promoted_standby_continues_each_shard_above_the_primary() {
    let primary = Cluster::start("sharded-primary", 55452, &["pg_ticket.shards = '1-3'"]);
    let mut p = primary.connect();
    accept_new(&mut p, &[1, 2, 3]);
    let mut issued = ids(&mut p, 1, 3_000).unwrap();
    let standby = primary.standby("sharded-standby", 55471, &["pg_ticket.shards = '1-3'"]);
    let mut s = standby.connect_when_ready();
    let err = ids(&mut s, 1, 1).unwrap_err();
    assert_eq!(sqlstate(&err), "25006", "a hot standby issues none: {err}");
    issued.extend(ids(&mut p, 1, 3_000).unwrap());
    issued.extend(ids(&mut p, 2, 3_000).unwrap());
    // Shard 3 leaves the primary (its new owner is elsewhere): released in
    // WAL, so the standby has it released too, whatever its settings say.
    primary.reload_shards("1-2");
    let mut p = primary.connect();
    p.query_one("SELECT pgticket.release_shard(3)", &[]).unwrap();
    p.batch_execute("SELECT next_scoped_id('replayed', 'x')").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.query_one("SELECT current_scoped_id('replayed', 'x')", &[]).unwrap().get::<_, i64>(0) < 1 {
        assert!(Instant::now() < deadline, "the standby never replayed the primary's commit");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(p);
    primary.stop_with("fast");
    standby.promote();
    let mut s = standby.connect_when_ready();
    let max_primary = *issued.iter().max().unwrap();
    for shard in [1, 2] {
        let after = ids(&mut s, shard, 1_000).unwrap();
        assert!(after.iter().all(|id| *id > max_primary), "shard {shard} after promotion repeats or precedes the old primary's");
    }
    let err = ids(&mut s, 3, 1).unwrap_err();
    assert_eq!(sqlstate(&err), "55000", "the promoted standby issued a shard its primary released: {err}");
    assert!(err.as_db_error().unwrap().message().contains("released"), "{err}");
    standby.stop();
}

#[test]
fn a_shard_handed_over_never_goes_below_its_old_owners_last_id() {
    let old = Cluster::start("sharded-old", 55490, &["pg_ticket.shards = '0-7'"]);
    let new = Cluster::start("sharded-new", 55499, &["pg_ticket.shards = '8-15'"]);
    let mut o = old.connect();
    accept_new(&mut o, &[5]);
    let issued = ids(&mut o, 5, 5_000).unwrap();
    let last = *issued.iter().max().unwrap();
    let err = o.query_one("SELECT pgticket.release_shard(5)", &[]).unwrap_err();
    assert_eq!(sqlstate(&err), "55000", "released while still owned: {err}");

    old.reload_shards("0-4,6-7");
    let mut o = old.connect();
    let point: i64 = o.query_one("SELECT pgticket.release_shard(5)", &[]).unwrap().get(0);
    assert_eq!(point, last, "the handover point is the last ID issued");
    let again: i64 = o.query_one("SELECT pgticket.release_shard(5)", &[]).unwrap().get(0);
    assert_eq!(again, point, "a lost answer is asked again");
    let err = ids(&mut o, 5, 1).unwrap_err();
    assert_eq!(sqlstate(&err), "55000", "{err}");
    // Listed again and restarted, the old owner still refuses it.
    drop(o);
    old.reload_shards("0-7");
    old.stop_with("immediate");
    old.up(None);
    let mut o = old.connect_when_ready();
    let err = ids(&mut o, 5, 1).unwrap_err();
    assert_eq!(sqlstate(&err), "55000", "a released shard issued again after a restart: {err}");

    let mut n = new.connect();
    let err = n.query_one("SELECT pgticket.accept_shard(5, $1)", &[&point]).unwrap_err();
    assert_eq!(sqlstate(&err), "55000", "accepted a shard not in pg_ticket.shards: {err}");
    new.reload_shards("5,8-15");
    let mut n = new.connect();
    let err = ids(&mut n, 5, 1).unwrap_err();
    assert_eq!(sqlstate(&err), "55000", "listed on the new owner before the handover: {err}");
    let err = n.query_one("SELECT pgticket.accept_shard(5, $1)", &[&(point + 1024)]).unwrap_err();
    assert_eq!(sqlstate(&err), "22023", "another shard's ID as the handover point: {err}");
    let first: i64 = n.query_one("SELECT pgticket.accept_shard(5, $1)", &[&point]).unwrap().get(0);
    assert!(first > point);
    assert!(ids(&mut n, 5, 2_000).unwrap().iter().all(|id| *id > point));
    // A crash of the new owner: still above the point.
    drop(n);
    new.stop_with("immediate");
    new.up(None);
    let mut n = new.connect_when_ready();
    assert!(ids(&mut n, 5, 1_000).unwrap().iter().all(|id| *id > point));
    // Administration is not for PUBLIC.
    n.batch_execute("CREATE ROLE shard_plain LOGIN").unwrap();
    let mut plain = new.connect_as("shard_plain", "postgres");
    for sql in ["SELECT pgticket.release_shard(9)", "SELECT pgticket.accept_shard(9, 0)"] {
        let err = plain.query_one(sql, &[]).unwrap_err();
        assert_eq!(sqlstate(&err), "42501", "{sql}: {err}");
    }
    old.stop();
    new.stop();
}

/// Review of #21 (helper 14): an accept issues the shard's first ID, so a
/// database whose recorded ID space is another server's (a restored dump)
/// refuses it as it refuses sharded_id(), and accepts nothing.
#[test]
fn an_accept_in_a_database_of_another_id_space_is_refused_and_accepts_nothing() {
    let c = Cluster::start("sharded-space", 55525, &["pg_ticket.shards = '0-3'"]);
    let mut restored = c.fresh_db("restored");
    restored
        .batch_execute("INSERT INTO pgticket.id_space (epoch_ms, machine_bits) VALUES (1780272000000, 10)")
        .unwrap();
    let err = restored.query_one("SELECT pgticket.accept_shard(2, 0)", &[]).unwrap_err();
    assert_eq!(sqlstate(&err), "55000", "{err}");
    assert!(err.as_db_error().unwrap().message().contains("this database (pgticket.id_space"), "{err}");
    let mut admin = c.connect();
    let err = admin.query_one("SELECT sharded_id(2)", &[]).unwrap_err();
    assert!(err.as_db_error().unwrap().message().contains("never accepted"), "the refused accept accepted: {err}");
    accept_new(&mut admin, &[2]);
    let first = ids(&mut admin, 2, 1).unwrap()[0];
    assert_eq!(shard_and_millis(&mut admin, first).0, 2);
    c.stop();
}
