//! Many real client connections at once against one server.

use pg_ticket_integration::{shared_cluster, sqlstate, Cluster};
use rand::Rng;
use std::collections::HashSet;
use std::time::{Duration, Instant};

fn cluster() -> &'static Cluster {
    // Commit durability is not what these tests are about; asynchronous
    // commit keeps thousands of single-ID transactions quick on 2 cores.
    shared_cluster("conc", 55441, &["synchronous_commit = off"])
}

const CLIENTS: usize = 8;

#[test]
fn eight_clients_with_random_rollbacks_commit_exactly_1_to_n() {
    let c = cluster();
    let per_client = 1000;
    let committed: Vec<Vec<i64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..CLIENTS)
            .map(|_| {
                s.spawn(|| {
                    let mut client = c.connect();
                    let mut rng = rand::thread_rng();
                    let mut mine = Vec::new();
                    for _ in 0..per_client {
                        let mut tx = client.transaction().unwrap();
                        let v: i64 = tx.query_one("SELECT next_scoped_id('gapfree', 'one')", &[]).unwrap().get(0);
                        if rng.gen_bool(0.3) {
                            tx.rollback().unwrap();
                        } else {
                            tx.commit().unwrap();
                            mine.push(v);
                        }
                    }
                    mine
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for mine in &committed {
        assert!(mine.windows(2).all(|w| w[0] < w[1]), "each client sees increasing values");
    }
    let mut all: Vec<i64> = committed.concat();
    all.sort_unstable();
    let n = all.len() as i64;
    assert!(n > 0);
    assert_eq!(all, (1..=n).collect::<Vec<_>>(), "committed values are exactly 1..N: no gap, no duplicate");
    let mark: i64 = c.connect().query_one("SELECT current_scoped_id('gapfree', 'one')", &[]).unwrap().get(0);
    assert_eq!(mark, n);
}

#[test]
fn eight_clients_drawing_snowflakes_get_distinct_increasing_ids() {
    let c = cluster();
    let per_client: Vec<Vec<i64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..CLIENTS)
            .map(|_| {
                s.spawn(|| {
                    let mut client = c.connect();
                    let mut ids = Vec::new();
                    for _ in 0..10 {
                        for row in client.query("SELECT snowflake_id() FROM generate_series(1, 5000)", &[]).unwrap() {
                            ids.push(row.get::<_, i64>(0));
                        }
                    }
                    ids
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ids in &per_client {
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "strictly increasing within a connection");
    }
    let all: HashSet<i64> = per_client.iter().flatten().copied().collect();
    assert_eq!(all.len(), CLIENTS * 50_000, "no ID issued twice across connections");
}

#[test]
fn concurrent_block_reservations_are_disjoint() {
    let c = cluster();
    let ranges: Vec<(i64, i64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..CLIENTS)
            .map(|_| {
                s.spawn(|| {
                    let mut client = c.connect();
                    let mut rng = rand::thread_rng();
                    (0..200)
                        .map(|_| {
                            let size: i64 = rng.gen_range(1..=50);
                            let row = client.query_one("SELECT * FROM reserve_block('conc-blocks', $1)", &[&size]).unwrap();
                            let (first, last): (i64, i64) = (row.get(0), row.get(1));
                            assert_eq!(last - first + 1, size);
                            (first, last)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let mut sorted = ranges.clone();
    sorted.sort_unstable();
    assert_eq!(sorted[0].0, 1);
    for w in sorted.windows(2) {
        assert_eq!(w[1].0, w[0].1 + 1, "ranges {:?} and {:?} overlap or leave a gap", w[0], w[1]);
    }
}

/// Waits until `pid` is blocked on a lock, or fails after 10 s.
fn wait_until_blocked(c: &Cluster, pid: i32) {
    let mut observer = c.connect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: bool = observer
            .query_one("SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1", &[&pid])
            .unwrap()
            .get(0);
        if waiting {
            return;
        }
        assert!(Instant::now() < deadline, "backend {pid} never waited for the lock");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_second_session_on_the_same_scope_waits_for_the_first_to_commit() {
    let c = cluster();
    let mut first = c.connect();
    first.batch_execute("BEGIN").unwrap();
    let v1: i64 = first.query_one("SELECT next_scoped_id('waits', 'same')", &[]).unwrap().get(0);
    assert_eq!(v1, 1);

    // A different scope never waits, even while `first` holds its row.
    let mut other = c.connect();
    let o: i64 = other.query_one("SELECT next_scoped_id('waits', 'other')", &[]).unwrap().get(0);
    assert_eq!(o, 1);

    let mut second = c.connect();
    let pid: i32 = second.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    std::thread::scope(|s| {
        let waiter = s.spawn(move || second.query_one("SELECT next_scoped_id('waits', 'same')", &[]).unwrap().get::<_, i64>(0));
        wait_until_blocked(c, pid);
        assert!(!waiter.is_finished(), "the second session must wait while the first holds the scope");
        first.batch_execute("COMMIT").unwrap();
        assert_eq!(waiter.join().unwrap(), 2, "after the commit the waiter gets the next value");
    });
}

#[test]
fn under_repeatable_read_the_waiter_gets_a_serialization_failure() {
    let c = cluster();
    let mut setup = c.connect();
    setup.query_one("SELECT next_scoped_id('rr', 'x')", &[]).unwrap();

    let mut rr = c.connect();
    rr.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1").unwrap();
    let pid: i32 = rr.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);

    let mut holder = c.connect();
    holder.batch_execute("BEGIN").unwrap();
    assert_eq!(holder.query_one("SELECT next_scoped_id('rr', 'x')", &[]).unwrap().get::<_, i64>(0), 2);

    std::thread::scope(|s| {
        let waiter = s.spawn(move || {
            let err = rr.query_one("SELECT next_scoped_id('rr', 'x')", &[]).unwrap_err();
            sqlstate(&err)
        });
        wait_until_blocked(c, pid);
        holder.batch_execute("COMMIT").unwrap();
        assert_eq!(waiter.join().unwrap(), "40001");
    });
    let mark: i64 = setup.query_one("SELECT current_scoped_id('rr', 'x')", &[]).unwrap().get(0);
    assert_eq!(mark, 2, "the failed transaction took nothing");
}

#[test]
fn repeatable_read_on_a_scope_created_concurrently_fails_cleanly() {
    let c = cluster();
    let mut rr = c.connect();
    rr.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1").unwrap();
    let mut creator = c.connect();
    creator.query_one("SELECT next_scoped_id('rr-new', 'x')", &[]).unwrap();
    let err = rr.query_one("SELECT next_scoped_id('rr-new', 'x')", &[]).unwrap_err();
    assert_eq!(sqlstate(&err), "40001", "{err}");
}

#[test]
fn eight_clients_inserting_through_the_trigger_number_one_shop_without_gaps() {
    let c = cluster();
    c.connect()
        .batch_execute(
            "CREATE TABLE trigger_invoice (shop text NOT NULL, no bigint, total int);
             CREATE TRIGGER number_invoices BEFORE INSERT OR UPDATE ON trigger_invoice
                 FOR EACH ROW EXECUTE FUNCTION assign_scoped_id('no', 'shop', 'invoice');",
        )
        .unwrap();
    let per_client = 200;
    std::thread::scope(|s| {
        for _ in 0..CLIENTS {
            s.spawn(|| {
                let mut client = c.connect();
                let mut rng = rand::thread_rng();
                for _ in 0..per_client {
                    let mut tx = client.transaction().unwrap();
                    // One to three rows per transaction, some in another
                    // shop; shops in one order, as an application that
                    // avoids deadlocks would insert them.
                    let mut shops: Vec<&str> =
                        (0..rng.gen_range(1..=3)).map(|_| if rng.gen_bool(0.8) { "shop-1" } else { "shop-2" }).collect();
                    shops.sort_unstable();
                    for shop in shops {
                        tx.execute("INSERT INTO trigger_invoice (shop, total) VALUES ($1, 1)", &[&shop]).unwrap();
                    }
                    if rng.gen_bool(0.3) {
                        tx.rollback().unwrap();
                    } else {
                        tx.commit().unwrap();
                    }
                }
            });
        }
    });
    let mut client = c.connect();
    for shop in ["shop-1", "shop-2"] {
        let numbers: Vec<i64> =
            client.query("SELECT no FROM trigger_invoice WHERE shop = $1 ORDER BY no", &[&shop]).unwrap().iter().map(|r| r.get(0)).collect();
        let n = numbers.len() as i64;
        assert!(n > 0, "{shop} has rows");
        assert_eq!(numbers, (1..=n).collect::<Vec<_>>(), "{shop}: committed rows numbered exactly 1..N");
    }
}
