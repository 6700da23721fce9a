//! Never twice, under faults (issue #4): crashes under load, a clock set
//! back across a restart, dump/restore, a hot standby and its promotion.
//! Each test runs its own cluster, since it stops and starts it.

use pg_ticket_integration::{pg_tool, sqlstate, Cluster};
use postgres::Client;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What clients saw before the server went down.
#[derive(Default)]
struct Seen {
    committed_scoped: Vec<i64>,
    committed_blocks: Vec<(i64, i64)>,
    /// Every snowflake a client received, committed or not.
    snowflakes: Vec<i64>,
}

/// `clients` connections allocate from all three functions in a loop until
/// their connection dies (or 60 s pass); `crash` runs once they are busy.
fn load_until_crash(c: &Cluster, clients: usize, crash: impl FnOnce(&[i32])) -> Seen {
    let stop = AtomicBool::new(false);
    let mut pids = Vec::new();
    let mut conns: Vec<Client> = (0..clients).map(|_| c.connect()).collect();
    for conn in &mut conns {
        pids.push(conn.query_one("SELECT pg_backend_pid()", &[]).unwrap().get::<_, i32>(0));
    }
    let results: Vec<Seen> = std::thread::scope(|s| {
        let handles: Vec<_> = conns
            .into_iter()
            .map(|mut conn| {
                let stop = &stop;
                s.spawn(move || {
                    let mut seen = Seen::default();
                    let deadline = Instant::now() + Duration::from_secs(60);
                    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                        let round = (|| -> Result<(), postgres::Error> {
                            let mut tx = conn.transaction()?;
                            let v: i64 = tx.query_one("SELECT next_scoped_id('crash', 'load')", &[])?.get(0);
                            let r = tx.query_one("SELECT * FROM reserve_block('crash', 5)", &[])?;
                            let sf: i64 = tx.query_one("SELECT snowflake_id()", &[])?.get(0);
                            seen.snowflakes.push(sf);
                            tx.commit()?;
                            seen.committed_scoped.push(v);
                            seen.committed_blocks.push((r.get(0), r.get(1)));
                            Ok(())
                        })();
                        if round.is_err() {
                            break;
                        }
                    }
                    seen
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(1500));
        crash(&pids);
        let all = handles.into_iter().map(|h| h.join().unwrap()).collect();
        stop.store(true, Ordering::Relaxed);
        all
    });
    let mut seen = Seen::default();
    for r in results {
        seen.committed_scoped.extend(r.committed_scoped);
        seen.committed_blocks.extend(r.committed_blocks);
        seen.snowflakes.extend(r.snowflakes);
    }
    seen
}

fn assert_never_twice_after_restart(c: &Cluster, seen: &Seen) {
    let mut client = c.connect_when_ready();
    assert!(seen.committed_scoped.len() > 10, "the load ran: {} commits", seen.committed_scoped.len());

    let distinct: HashSet<_> = seen.committed_scoped.iter().collect();
    assert_eq!(distinct.len(), seen.committed_scoped.len(), "a committed scoped value was handed out twice");
    let max_committed = *seen.committed_scoped.iter().max().unwrap();
    let next: i64 = client.query_one("SELECT next_scoped_id('crash', 'load')", &[]).unwrap().get(0);
    assert!(next > max_committed, "after restart {next} is not above the highest committed {max_committed}");

    let mut blocks = seen.committed_blocks.clone();
    blocks.sort_unstable();
    for w in blocks.windows(2) {
        assert!(w[1].0 > w[0].1, "committed blocks {:?} and {:?} overlap", w[0], w[1]);
    }
    let first: i64 = client.query_one("SELECT first_id FROM reserve_block('crash', 5)", &[]).unwrap().get(0);
    assert!(first > blocks.last().unwrap().1, "a block after restart overlaps a committed one");

    let mut flakes: HashSet<i64> = seen.snowflakes.iter().copied().collect();
    assert_eq!(flakes.len(), seen.snowflakes.len(), "a snowflake was issued twice before the crash");
    let max_flake = *seen.snowflakes.iter().max().unwrap();
    for row in client.query("SELECT snowflake_id() FROM generate_series(1, 1000)", &[]).unwrap() {
        let id: i64 = row.get(0);
        assert!(id > max_flake && flakes.insert(id), "snowflake {id} after restart repeats or precedes one issued before");
    }
    println!(
        "{} committed transactions, {} snowflakes received before the crash; all unique after restart",
        seen.committed_scoped.len(),
        seen.snowflakes.len()
    );
}

#[test]
fn immediate_shutdown_under_load_never_reissues() {
    let c = Cluster::start("crash-stop", 55442, &[]);
    let seen = load_until_crash(&c, 4, |_| c.stop_with("immediate"));
    c.up(None);
    assert_never_twice_after_restart(&c, &seen);
    c.stop();
}

#[test]
fn a_backend_killed_under_load_never_reissues() {
    let c = Cluster::start("crash-kill", 55443, &[]);
    let seen = load_until_crash(&c, 4, |pids| {
        // SIGKILL makes the postmaster reset every backend and shared memory.
        let ok = std::process::Command::new("kill").args(["-KILL", &pids[0].to_string()]).status().unwrap().success();
        assert!(ok, "kill -KILL {}", pids[0]);
    });
    assert_never_twice_after_restart(&c, &seen);
    c.stop();
}

fn snowflakes(client: &mut Client, n: i32) -> Result<Vec<i64>, postgres::Error> {
    Ok(client
        .query("SELECT snowflake_id() FROM generate_series(1, $1)", &[&n])?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

#[test]
fn a_restart_with_the_clock_set_back_never_reissues_snowflakes() {
    let c = Cluster::start("clock", 55444, &[]);
    let mut client = c.connect();
    let before = snowflakes(&mut client, 5000).unwrap();
    let max_before = *before.iter().max().unwrap();
    let mark_file = c.data_dir().join("pg_ticket_snowflake.mark");
    // The mark, then the ID space it is for.
    let mark: i64 = std::fs::read_to_string(&mark_file).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    let last_ms: i64 = client
        .query_one("SELECT (extract(epoch FROM created_at) * 1000)::bigint FROM snowflake_decode($1)", &[&max_before])
        .unwrap()
        .get(0);
    assert!(mark >= last_ms, "the durable mark {mark} covers the last issued timestamp {last_ms}");
    drop(client);

    // Five minutes back: refused, saying by how much; counters unaffected.
    c.stop_with("fast");
    c.up(Some("-5m"));
    let mut client = c.connect();
    let err = client.query_one("SELECT snowflake_id()", &[]).unwrap_err();
    assert_eq!(sqlstate(&err), "55000", "{err}");
    let message = err.as_db_error().unwrap().message().to_string();
    let behind = duration_ms(message.split("clock is ").nth(1).unwrap().split(" behind").next().unwrap());
    // 5 min, less the time since the mark was reserved and the restart took
    // (seconds on a loaded machine), plus at most the 1 s reserved ahead.
    assert!((200_000..=301_100).contains(&behind), "{message}");
    println!("clock 5 min back: refused with {message:?}");
    assert_eq!(client.query_one("SELECT next_scoped_id('clock', 'x')", &[]).unwrap().get::<_, i64>(0), 1);
    drop(client);

    // Half a second back: within the reservation, so it waits, then issues above.
    c.stop_with("fast");
    c.up(Some("-0.5"));
    let mut client = c.connect();
    let started = Instant::now();
    let after_small = snowflakes(&mut client, 1000).unwrap();
    println!("clock 0.5 s back: first IDs after {:?}", started.elapsed());
    assert!(after_small.iter().all(|id| *id > max_before), "an ID at or below one issued before the restart");
    let max_small = *after_small.iter().max().unwrap();
    drop(client);

    c.stop_with("fast");
    c.up(None);
    let mut client = c.connect();
    let after = snowflakes(&mut client, 1000).unwrap();
    assert!(after.iter().all(|id| *id > max_small));
    c.stop();
}

fn marks(client: &mut Client) -> Vec<(String, String, i64)> {
    client
        .query("SELECT kind, coalesce(queue, block_name), coalesce(domain, ''), mark FROM pgticket.marks ORDER BY 1, 2, 3", &[])
        .unwrap()
        .iter()
        .map(|r| (format!("{}:{}", r.get::<_, String>(0), r.get::<_, String>(1)), r.get(2), r.get(3)))
        .collect()
}

/// #30 item 3 (SPEC §17.3): a dump restored into a database that already
/// allocated from some of its scopes. 0.3.0's COPY of each state table
/// failed on the primary key and every mark stayed the target's (2, 1 and a
/// ticket below 50 came next); now each scope keeps the higher mark of the
/// two, the restore runs without an error, and the target's cached tickets
/// (below the dump's mark) are dropped.
#[test]
fn a_restore_into_a_database_that_already_allocated_keeps_the_higher_mark_of_each_scope() {
    let c = Cluster::start("dump-used", 55447, &[]);
    let mut admin = c.connect();
    for name in ["src", "used"] {
        admin.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
    }
    let db = |name: &str| c.connect_as("postgres", name);
    let mut src = db("src");
    src.batch_execute("CREATE EXTENSION pg_ticket").unwrap();
    src.batch_execute(
        "SELECT next_scoped_id('inv', 'shop-1') FROM generate_series(1, 50);
         SELECT next_scoped_id('other', 'x') FROM generate_series(1, 7);
         SELECT next_scoped_id('low', 'x') FROM generate_series(1, 3);
         SELECT reserve_block('workers', 30);
         SELECT next_ticket('res', 'vm') FROM generate_series(1, 50);",
    )
    .unwrap();
    let mut used = db("used");
    used.batch_execute("CREATE EXTENSION pg_ticket").unwrap();
    used.batch_execute(
        "SELECT next_scoped_id('inv', 'shop-1');
         SELECT next_scoped_id('low', 'x') FROM generate_series(1, 10);
         SELECT reserve_block('workers', 5);",
    )
    .unwrap();
    let cached: i64 = used.query_one("SELECT next_ticket('res', 'vm')", &[]).unwrap().get(0);
    assert_eq!(cached, 1, "the target's cache holds the scope's first segment");

    let dump = c.dir.join("src.dump");
    let port = c.port.to_string();
    let host = c.dir.to_str().unwrap().to_string();
    let conn = ["-h", host.as_str(), "-p", port.as_str(), "-U", "postgres"];
    pg_tool("pg_dump", &[&conn[..], &["-Fc", "-f", dump.to_str().unwrap(), "src"]].concat());
    // pg_tool asserts the restore ran without an error.
    pg_tool("pg_restore", &[&conn[..], &["-d", "used", dump.to_str().unwrap()]].concat());

    let next = |d: &mut Client, q: &str| -> i64 { d.query_one(&format!("SELECT next_scoped_id('{q}', 'x')"), &[]).unwrap().get(0) };
    assert_eq!(used.query_one("SELECT next_scoped_id('inv', 'shop-1')", &[]).unwrap().get::<_, i64>(0), 51, "the dump's mark is higher");
    assert_eq!(next(&mut used, "other"), 8, "a scope only the dump had");
    assert_eq!(next(&mut used, "low"), 11, "the target's mark is higher");
    assert_eq!(used.query_one("SELECT first_id FROM reserve_block('workers', 1)", &[]).unwrap().get::<_, i64>(0), 31);
    let tickets: Vec<i64> = used.query("SELECT next_ticket('res', 'vm') FROM generate_series(1, 20)", &[]).unwrap().iter().map(|r| r.get(0)).collect();
    assert!(tickets.iter().all(|t| *t > 50), "no ticket at or below the dump's mark: {tickets:?}");
    c.stop();
}

/// docs/operations.md's way to keep the marks across DROP and CREATE
/// EXTENSION (#32 item 1): a data-only dump of the extension, loaded into
/// the new one, continues every scope. The docs said `pg_dump -a -n
/// pgticket`, which dumps no rows (an extension's tables come only with
/// the extension): invoices 1..3 existed and the next one was 1.
#[test]
fn marks_dumped_before_drop_extension_load_into_the_new_one() {
    let c = Cluster::start("dropkeep", 55608, &[]);
    let mut db = c.connect();
    // The application's own table too: the dump must carry the marks only
    // (#32 review, helper 4: `pg_dump -a -e pg_ticket` also dumped every
    // user table, and loading it doubled their rows).
    db.batch_execute(
        "CREATE TABLE invoice (no bigint PRIMARY KEY DEFAULT next_scoped_id('inv', 'shop-1'));
         INSERT INTO invoice SELECT FROM generate_series(1, 3);
         SELECT reserve_block('workers', 30);
         SELECT next_ticket('res', 'vm') FROM generate_series(1, 5);",
    )
    .unwrap();
    let marks_sql = c.dir.join("marks.sql");
    let port = c.port.to_string();
    let host = c.dir.to_str().unwrap().to_string();
    let conn = ["-h", host.as_str(), "-p", port.as_str(), "-U", "postgres"];
    pg_tool("pg_dump", &[&conn[..], &["-a", "-e", "pg_ticket", "-n", "pgticket", "-f", marks_sql.to_str().unwrap(), "postgres"]].concat());
    db.batch_execute("DROP EXTENSION pg_ticket CASCADE; CREATE EXTENSION pg_ticket").unwrap();
    db.batch_execute("ALTER TABLE invoice ALTER COLUMN no SET DEFAULT next_scoped_id('inv', 'shop-1')").unwrap();
    pg_tool("psql", &[&conn[..], &["-v", "ON_ERROR_STOP=1", "-q", "-d", "postgres", "-f", marks_sql.to_str().unwrap()]].concat());
    let mut db = c.connect();
    let invoices: i64 = db.query_one("SELECT count(*) FROM invoice", &[]).unwrap().get(0);
    assert_eq!(invoices, 3, "the application's rows are not loaded again");
    let next: i64 = db.query_one("INSERT INTO invoice DEFAULT VALUES RETURNING no", &[]).unwrap().get(0);
    assert_eq!(next, 4);
    assert_eq!(db.query_one("SELECT first_id FROM reserve_block('workers', 1)", &[]).unwrap().get::<_, i64>(0), 31);
    let ticket: i64 = db.query_one("SELECT next_ticket('res', 'vm')", &[]).unwrap().get(0);
    assert!(ticket > 5, "a ticket after the reload ({ticket}) above the five before");
    c.stop();
}

/// SPEC §17.3 for the registry: an older dump of a registry restored into
/// it keeps the later state of every lease. 0.3.0's COPY of the leases
/// failed on the primary key (the restore ended in an error, and a lease
/// row only the dump had was lost with the rest of the table).
#[test]
fn an_older_dump_restored_into_a_registry_keeps_the_later_leases() {
    let c = Cluster::start("regkeep", 55609, &["pg_ticket.lease_margin = '1s'"]);
    let mut db = c.connect();
    let lease = |db: &mut Client, holder: &str| -> (i32, i64, String) {
        let r = db.query_one("SELECT machine_id, lease, secret FROM pgticket.lease_machine_id($1, '30s')", &[&holder]).unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    let (first, first_token, first_secret) = lease(&mut db, "h1");
    let dump = c.dir.join("reg.dump");
    let port = c.port.to_string();
    let host = c.dir.to_str().unwrap().to_string();
    let conn = ["-h", host.as_str(), "-p", port.as_str(), "-U", "postgres"];
    pg_tool("pg_dump", &[&conn[..], &["-Fc", "-f", dump.to_str().unwrap(), "postgres"]].concat());
    // After the dump: h1 releases, h2 leases (a later token).
    db.execute("SELECT pgticket.release_machine_id($1, $2, $3)", &[&first, &first_token, &first_secret]).unwrap();
    let (second, second_token, _) = lease(&mut db, "h2");
    pg_tool("pg_restore", &[&conn[..], &["-d", "postgres", dump.to_str().unwrap()]].concat());
    let rows: Vec<(i32, i64, String, bool)> = db
        .query("SELECT machine_id, lease, holder, ended_at IS NOT NULL FROM pgticket.machine_id_leases ORDER BY machine_id", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert!(rows.contains(&(first, first_token, "h1".into(), true)), "h1's lease stays released: {rows:?}");
    assert!(rows.contains(&(second, second_token, "h2".into(), false)), "h2's later lease stays: {rows:?}");
    assert_eq!(rows.len(), 2, "{rows:?}");
    c.stop();
}

#[test]
fn dump_and_restore_continue_every_mark() {
    let c = Cluster::start("dump", 55445, &[]);
    let mut admin = c.connect();
    for name in ["src", "restored", "restored_pre", "restored_sql"] {
        admin.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
    }
    let db = |name: &str| c.connect_as("postgres", name);
    let mut src = db("src");
    // Committed first: the ticket worker reserves in its own transactions.
    src.batch_execute("CREATE EXTENSION pg_ticket").unwrap();
    src.batch_execute(
        "SELECT next_scoped_id('shop', '2026') FROM generate_series(1, 5);
         SELECT next_scoped_id('shop', '2027') FROM generate_series(1, 3);
         SELECT reserve_block('workers', 30);
         SELECT pgticket.advance_scoped_id('imported', 'legacy', 1000000);
         SELECT next_ticket('resources', 'vm') FROM generate_series(1, 7);",
    )
    .unwrap();
    let before = marks(&mut src);
    assert_eq!(before.len(), 5);
    let tickets_handed_out = 7;

    let dump = c.dir.join("src.dump");
    let port = c.port.to_string();
    let host = c.dir.to_str().unwrap().to_string();
    let conn = ["-h", host.as_str(), "-p", port.as_str(), "-U", "postgres"];
    pg_tool("pg_dump", &[&conn[..], &["-Fc", "-f", dump.to_str().unwrap(), "src"]].concat());
    // As a user would: into an empty database, and into one where the
    // extension was already created.
    pg_tool("pg_restore", &[&conn[..], &["-d", "restored", dump.to_str().unwrap()]].concat());
    db("restored_pre").batch_execute("CREATE EXTENSION pg_ticket").unwrap();
    pg_tool("pg_restore", &[&conn[..], &["-d", "restored_pre", dump.to_str().unwrap()]].concat());
    let sql = c.dir.join("src.sql");
    pg_tool("pg_dump", &[&conn[..], &["-f", sql.to_str().unwrap(), "src"]].concat());
    pg_tool("psql", &[&conn[..], &["-v", "ON_ERROR_STOP=1", "-q", "-d", "restored_sql", "-f", sql.to_str().unwrap()]].concat());

    for name in ["restored", "restored_pre", "restored_sql"] {
        let mut d = db(name);
        // The ticket worker may fetch ahead (a higher ticket mark) between
        // the snapshot above and a dump: at least the snapshot's, then.
        let split = |m: Vec<(String, String, i64)>| m.into_iter().partition::<Vec<_>, _>(|(k, _, _)| k.starts_with("ticket:"));
        let (tickets_now, rest_now) = split(marks(&mut d));
        let (tickets_then, rest_then) = split(before.clone());
        assert_eq!(rest_now, rest_then, "{name} carries every mark");
        assert_eq!(tickets_now.len(), tickets_then.len(), "{name}");
        for ((k, d1, now), (_, _, then)) in tickets_now.iter().zip(&tickets_then) {
            assert!(now >= then, "{name}: {k}/{d1} at {now}, below the source's {then}");
        }
        assert_eq!(d.query_one("SELECT next_scoped_id('shop', '2026')", &[]).unwrap().get::<_, i64>(0), 6, "{name}");
        assert_eq!(d.query_one("SELECT next_scoped_id('shop', '2027')", &[]).unwrap().get::<_, i64>(0), 4, "{name}");
        assert_eq!(d.query_one("SELECT first_id FROM reserve_block('workers', 10)", &[]).unwrap().get::<_, i64>(0), 31, "{name}");
        assert_eq!(d.query_one("SELECT next_scoped_id('imported', 'legacy')", &[]).unwrap().get::<_, i64>(0), 1_000_001, "{name}");
        let ticket: i64 = d.query_one("SELECT next_ticket('resources', 'vm')", &[]).unwrap().get(0);
        assert!(ticket > tickets_handed_out, "{name}: ticket {ticket} after a restore repeats one handed out before");
    }
    c.stop();
}

#[test]
fn a_hot_standby_refuses_and_its_promotion_continues_above_the_primary() {
    let primary = Cluster::start("primary", 55446, &[]);
    let mut p = primary.connect();
    p.batch_execute("SELECT next_scoped_id('ha', 'x') FROM generate_series(1, 10); SELECT reserve_block('ha', 100)").unwrap();
    let mut flakes = snowflakes(&mut p, 1000).unwrap();

    let standby = primary.standby("standby", 55447, &[]);
    let mut s = standby.connect_when_ready();

    for stmt in [
        "SELECT next_scoped_id('ha', 'x')",
        "SELECT reserve_block('ha', 1)",
        "SELECT snowflake_id()",
        "SELECT pgticket.advance_scoped_id('ha', 'x', 100)",
    ] {
        let err = s.query_one(stmt, &[]).unwrap_err();
        assert_eq!(sqlstate(&err), "25006", "{stmt}: {err}");
    }
    let err = s.query_one("SELECT next_scoped_id('ha', 'x')", &[]).unwrap_err();
    println!("standby says: {:?}", err.as_db_error().map(|e| (e.message().to_string(), e.hint().map(str::to_string))));

    // More commits on the primary, replayed before the failover.
    p.batch_execute("SELECT next_scoped_id('ha', 'x') FROM generate_series(1, 10); SELECT reserve_block('ha', 50)").unwrap();
    flakes.extend(snowflakes(&mut p, 1000).unwrap());
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.query_one("SELECT current_scoped_id('ha', 'x')", &[]).unwrap().get::<_, i64>(0) < 20 {
        assert!(Instant::now() < deadline, "the standby never replayed the primary's commits");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(p);
    primary.stop_with("fast");
    standby.promote();

    let mut s = standby.connect_when_ready();
    assert_eq!(s.query_one("SELECT next_scoped_id('ha', 'x')", &[]).unwrap().get::<_, i64>(0), 21);
    assert_eq!(s.query_one("SELECT first_id FROM reserve_block('ha', 1)", &[]).unwrap().get::<_, i64>(0), 151);
    let max_primary = *flakes.iter().max().unwrap();
    let after = snowflakes(&mut s, 1000).unwrap();
    assert!(after.iter().all(|id| *id > max_primary), "a snowflake after promotion repeats or precedes the old primary's");
    standby.stop();
}

/// A duration as messages write it ("4 min 58 s", "1.5 s", "250 ms"), in ms.
fn duration_ms(text: &str) -> i64 {
    let words: Vec<&str> = text.split_whitespace().collect();
    words
        .chunks(2)
        .map(|pair| {
            let n: f64 = pair[0].parse().unwrap_or_else(|_| panic!("a duration: {text:?}"));
            let unit = match pair[1] {
                "ms" => 1.0,
                "s" => 1_000.0,
                "min" => 60_000.0,
                "h" => 3_600_000.0,
                "d" => 86_400_000.0,
                other => panic!("unit {other:?} in {text:?}"),
            };
            (n * unit) as i64
        })
        .sum()
}
