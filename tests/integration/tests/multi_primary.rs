//! Many primaries on PostgreSQL's own logical replication (SPEC §19,
//! #47): pg_ticket's state tables travel with a `FOR ALL TABLES`
//! publication, and what arrives merges (§19.1) and disables nothing
//! (§19.2). One direction on every version; both directions
//! (`origin = none`) on 16 and later.

use pg_ticket_integration::Cluster;
use postgres::Client;
use std::time::{Duration, Instant};

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn node_conf(machine_id: u16, offset: u16) -> Vec<String> {
    vec![
        "wal_level = logical".into(),
        format!("pg_ticket.machine_id = {machine_id}"),
        "pg_ticket.ticket_increment = 2".into(),
        format!("pg_ticket.ticket_offset = {offset}"),
    ]
}

fn start(name: &str, port: u16, machine_id: u16, offset: u16) -> Cluster {
    let conf = node_conf(machine_id, offset);
    Cluster::start(name, port, &conf.iter().map(String::as_str).collect::<Vec<_>>())
}

const DB: &str = "mp_app";

/// `subscriber` subscribes to everything `publisher` publishes in `DB`.
fn subscribe(subscriber: &mut Client, name: &str, publisher: &Cluster, options: &str) {
    subscriber
        .batch_execute(&format!(
            "CREATE SUBSCRIPTION {name} CONNECTION '{}' PUBLICATION everything WITH ({options})",
            publisher.dsn_as("postgres", DB)
        ))
        .unwrap();
}

/// Every table of the subscription copied and streaming.
fn wait_for_sync(db: &mut Client) {
    wait_until("the subscription's tables are in sync", Duration::from_secs(60), || {
        db.query_one("SELECT count(*) FILTER (WHERE srsubstate <> 'r'), count(*) FROM pg_subscription_rel", &[])
            .map(|r| r.get::<_, i64>(0) == 0 && r.get::<_, i64>(1) > 0)
            .unwrap()
    });
}

/// Until a row written on the publisher after everything else is here.
fn wait_for_row(db: &mut Client, id: i64) {
    wait_until("a replicated row arrives", Duration::from_secs(60), || {
        db.query_one("SELECT count(*) FROM items WHERE id = $1", &[&id]).unwrap().get::<_, i64>(0) == 1
    });
}

fn apply_errors(db: &mut Client) -> i64 {
    db.query_one("SELECT coalesce(sum(apply_error_count + sync_error_count), 0)::bigint FROM pg_stat_subscription_stats", &[])
        .unwrap()
        .get(0)
}

fn scoped(db: &mut Client, n: i64) -> i64 {
    db.query_one("SELECT max(next_scoped_id('shop', 'invoice')) FROM generate_series(1, $1::bigint)", &[&n]).unwrap().get(0)
}

/// A database that already allocated subscribes to a publisher that
/// allocated less: the initial copy keeps the higher marks, and the
/// publisher's next write-backs (51 after this node's 80) do not set them
/// back (0.4.0: the counter went from 81 to 51, and 52..81 were handed out
/// again). The publisher's ID space and ticket scope, replicated, are not
/// this node's: 0.4.0 refused every snowflake here (read as a lost mark)
/// and the ticket scope (created with the other offset).
#[test]
fn a_subscriber_keeps_its_higher_marks_and_another_nodes_rows_disable_nothing() {
    let a = start("mp-a", 55650, 1, 1);
    let b = start("mp-b", 55651, 2, 2);
    let (mut on_a, mut on_b) = (a.fresh_db(DB), b.fresh_db(DB));
    for db in [&mut on_a, &mut on_b] {
        db.batch_execute("CREATE TABLE items (id bigint PRIMARY KEY, node text NOT NULL)").unwrap();
    }
    assert_eq!(scoped(&mut on_b, 80), 80);
    on_b.query_one("SELECT last_id FROM reserve_block('batch', 80)", &[]).unwrap();
    assert_eq!(scoped(&mut on_a, 50), 50);
    on_a.query_one("SELECT last_id FROM reserve_block('batch', 50)", &[]).unwrap();
    on_a.batch_execute("INSERT INTO items SELECT snowflake_id(), 'a'; SELECT next_ticket('q', 'd') FROM generate_series(1, 3)").unwrap();
    on_a.batch_execute("CREATE PUBLICATION everything FOR ALL TABLES").unwrap();
    subscribe(&mut on_b, "from_a", &a, "copy_data = true");
    wait_for_sync(&mut on_b);
    let current = |db: &mut Client| -> (i64, i64) {
        let r = db.query_one("SELECT current_scoped_id('shop', 'invoice'), current_block_mark('batch')", &[]).unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(current(&mut on_b), (80, 80), "the initial copy keeps this node's higher marks");
    // The publisher writes its marks back (51); the row that follows them
    // tells when they have been applied here.
    assert_eq!(scoped(&mut on_a, 1), 51);
    on_a.query_one("SELECT last_id FROM reserve_block('batch', 1)", &[]).unwrap();
    let last: i64 = on_a.query_one("INSERT INTO items SELECT snowflake_id(), 'a' RETURNING id", &[]).unwrap().get(0);
    wait_for_row(&mut on_b, last);
    assert_eq!(current(&mut on_b), (80, 80), "a replicated write-back never lowers a mark");
    assert_eq!(scoped(&mut on_b, 1), 81);
    let first: i64 = on_b.query_one("SELECT first_id FROM reserve_block('batch', 1)", &[]).unwrap().get(0);
    assert_eq!(first, 81);
    // Another node's rows: its ID space and its ticket scope.
    let id: i64 = on_b.query_one("SELECT snowflake_id()", &[]).expect("the publisher's ID space is not this node's lost mark").get(0);
    let machine: i32 = on_b.query_one("SELECT machine_id FROM snowflake_decode($1)", &[&id]).unwrap().get(0);
    assert_eq!(machine, 2);
    let ticket: i64 = on_b.query_one("SELECT next_ticket('q', 'd')", &[]).expect("a ticket scope another node created is served here").get(0);
    assert_eq!(ticket % 2, 0, "this node's residue class (offset 2 of 2): {ticket}");
    let ticket: i64 = on_a.query_one("SELECT next_ticket('q', 'd')", &[]).unwrap().get(0);
    assert_eq!(ticket % 2, 1, "the publisher's: {ticket}");
    // The publisher's own registry and space stay its own.
    let spaces: i64 = on_b.query_one("SELECT count(*) FROM pgticket.id_space", &[]).unwrap().get(0);
    assert_eq!(spaces, 1, "this node's first snowflake recorded its own space only");
    assert_eq!(apply_errors(&mut on_b), 0, "no apply error");
    drop(on_b);
    b.stop();
    a.stop();
}

/// Two primaries replicating to each other (16+: `origin = none`), both
/// allocating at once: tickets in each node's residue class and snowflakes
/// with each node's machine id fill one table from both sides, and every
/// row reaches the other node with no apply error (0.4.0 refused the
/// second node's tickets and snowflakes at its first replicated row).
#[test]
fn two_primaries_replicating_both_ways_allocate_at_once_without_an_apply_error() {
    let a = start("mp-both-a", 55652, 1, 1);
    let version: i32 = a.connect().query_one("SELECT current_setting('server_version_num')::int", &[]).unwrap().get(0);
    if version < 160000 {
        eprintln!("skipped: origin = none needs PostgreSQL 16 (this is {version})");
        a.stop();
        return;
    }
    let b = start("mp-both-b", 55653, 2, 2);
    let (mut on_a, mut on_b) = (a.fresh_db(DB), b.fresh_db(DB));
    for db in [&mut on_a, &mut on_b] {
        db.batch_execute("CREATE TABLE items (id bigint PRIMARY KEY, node text NOT NULL); CREATE PUBLICATION everything FOR ALL TABLES")
            .unwrap();
    }
    subscribe(&mut on_b, "from_a", &a, "copy_data = false, origin = none");
    subscribe(&mut on_a, "from_b", &b, "copy_data = false, origin = none");
    wait_for_sync(&mut on_a);
    wait_for_sync(&mut on_b);
    let load = |cluster: &Cluster, node: &'static str| {
        let dsn = cluster.dsn_as("postgres", DB);
        std::thread::spawn(move || {
            let mut db = Client::connect(&dsn, postgres::NoTls).unwrap();
            for _ in 0..20 {
                db.batch_execute(&format!(
                    "INSERT INTO items SELECT next_ticket('orders', 'eu'), '{node}' FROM generate_series(1, 10);
                     INSERT INTO items SELECT snowflake_id(), '{node}' FROM generate_series(1, 10)"
                ))
                .unwrap();
            }
        })
    };
    let (la, lb) = (load(&a, "a"), load(&b, "b"));
    la.join().unwrap();
    lb.join().unwrap();
    let count = |db: &mut Client| -> i64 { db.query_one("SELECT count(*) FROM items", &[]).unwrap().get(0) };
    wait_until("both nodes hold every row", Duration::from_secs(60), || count(&mut on_a) == 800 && count(&mut on_b) == 800);
    let odd_even: i64 = on_a
        .query_one("SELECT count(*) FROM items WHERE id < 1000000 AND (id % 2 = 1) <> (node = 'a')", &[])
        .unwrap()
        .get(0);
    assert_eq!(odd_even, 0, "each node's tickets are in its own residue class");
    assert_eq!(apply_errors(&mut on_a) + apply_errors(&mut on_b), 0, "no apply error on either node");
    for db in [&mut on_a, &mut on_b] {
        let spaces: i64 = db.query_one("SELECT count(*) FROM pgticket.id_space", &[]).unwrap().get(0);
        assert_eq!(spaces, 1, "each node records its own space only");
    }
    drop((on_a, on_b));
    b.stop();
    a.stop();
}
