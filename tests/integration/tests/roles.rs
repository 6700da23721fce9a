//! One role, one setting (SPEC §13.6, §13.11; issue #31): what an ordinary
//! role can do to the settings an administrator chose and to the other
//! roles of the server.

use pg_ticket_integration::{sqlstate, Cluster};
use postgres::{Client, NoTls};

/// The server's configuration a plain role tries to weaken.
const CONFIGURED: [&str; 7] = [
    "pg_ticket.scope_rights = on",
    "pg_ticket.max_scopes_per_role = 2",
    "pg_ticket.max_block_size = 10",
    "pg_ticket.max_transaction_entries = 1000",
    "pg_ticket.lease_ids = '5-6'",
    "pg_ticket.lease_max_ttl = '120s'",
    "pg_ticket.lease_margin = '2s'",
];

/// A connection as `user` with `-c name=value` in its startup options.
fn connect_with_option(c: &Cluster, user: &str, option: &str) -> Client {
    let dsn = format!("{} options='-c {option}'", c.dsn_as(user, "postgres"));
    Client::connect(&dsn, NoTls).unwrap_or_else(|e| panic!("connect with {option}: {e}"))
}

/// #31 item 1: on a server that loads pg_ticket on demand (not preloaded),
/// a plain role's connection options for a superuser-only or reload-only
/// setting (PGOPTIONS) made PostgreSQL drop the configured value for the
/// built-in default: 0.3.0 then allocated from scopes the role had no
/// grant for, past its scope cap and the block cap, and granted leases
/// outside `lease_ids` and longer than `lease_max_ttl`. Now such a session
/// runs no pg_ticket code (42501 naming the setting) and changes nothing;
/// a superuser's own option applies; without options the configuration
/// holds.
#[test]
fn connection_options_never_switch_off_what_the_configuration_set() {
    let mut conf = vec!["shared_preload_libraries = ''"];
    conf.extend(CONFIGURED);
    let c = Cluster::start("role-opts", 55620, &conf);
    let mut admin = c.connect();
    admin
        .batch_execute(
            "CREATE ROLE plain LOGIN;
             GRANT EXECUTE ON FUNCTION pgticket.lease_machine_id(text, interval) TO plain;",
        )
        .unwrap();
    let attempts = [
        ("pg_ticket.scope_rights=off", "SELECT next_scoped_id('inv', 'shop-1')"),
        ("pg_ticket.max_scopes_per_role=0", "SELECT next_scoped_id('inv', 'shop-2')"),
        ("pg_ticket.max_block_size=1000000", "SELECT first_id FROM reserve_block('big', 1000)"),
        ("pg_ticket.max_transaction_entries=100000000", "SELECT next_scoped_id('inv', 'shop-3')"),
        ("pg_ticket.lease_ids=0-1023", "SELECT machine_id FROM pgticket.lease_machine_id('h', '30s')"),
        ("pg_ticket.lease_max_ttl=600s", "SELECT machine_id FROM pgticket.lease_machine_id('h', '300s')"),
        ("pg_ticket.lease_margin=1s", "SELECT machine_id FROM pgticket.lease_machine_id('h', '30s')"),
    ];
    for (option, call) in attempts {
        let mut plain = connect_with_option(&c, "plain", option);
        let err = plain.query_one(call, &[]).expect_err(option);
        assert_eq!(sqlstate(&err), "42501", "{option}: {err}");
        let message = err.as_db_error().map(|e| e.message().to_string()).unwrap_or_default();
        assert!(message.contains(option.split('=').next().unwrap()), "{option}: the error names the setting: {message}");
        // Every later call of the session is refused the same way.
        let again = plain.query_one("SELECT next_scoped_id('inv', 'any')", &[]).expect_err(option);
        assert_eq!(sqlstate(&again), "42501", "{option}: {again}");
    }
    let marks: i64 = admin.query_one("SELECT count(*) FROM pgticket.marks", &[]).unwrap().get(0);
    assert_eq!(marks, 0, "nothing was allocated");
    let leases: i64 = admin.query_one("SELECT count(*) FROM pgticket.machine_id_leases", &[]).unwrap().get(0);
    assert_eq!(leases, 0, "nothing was leased");

    // Without options, the configuration holds: no grant, no scope; the
    // registry leases within 5-6 and at most 120 s.
    let mut plain = c.connect_as("plain", "postgres");
    let err = plain.query_one("SELECT next_scoped_id('inv', 'shop-1')", &[]).expect_err("no grant covers it");
    assert_eq!(sqlstate(&err), "42501", "{err}");
    let err = plain.query_one("SELECT machine_id FROM pgticket.lease_machine_id('h', '300s')", &[]).expect_err("over lease_max_ttl");
    assert_eq!(sqlstate(&err), "22023", "{err}");
    let id: i32 = plain.query_one("SELECT machine_id FROM pgticket.lease_machine_id('h', '30s')", &[]).unwrap().get(0);
    assert!((5..=6).contains(&id), "leased {id}, outside lease_ids");

    // A superuser's own option is a superuser's setting: applied.
    let mut su = connect_with_option(&c, "postgres", "pg_ticket.max_block_size=5");
    su.query_one("SELECT next_scoped_id('inv', 'su')", &[]).expect("a superuser's option is not refused");
    let shown: String = su.query_one("SHOW pg_ticket.max_block_size", &[]).unwrap().get(0);
    assert_eq!(shown, "5");
    let err = su.query_one("SELECT first_id FROM reserve_block('b', 6)", &[]).expect_err("over the superuser's own cap");
    assert_eq!(sqlstate(&err), "22023", "{err}");

    c.stop();
}

/// #31 item 2: the first `snowflake_id()` of a database, left prepared (or
/// open), held the ID space's lock: every `snowflake_id()`, `sharded_id()`
/// and `pgticket.lease_machine_id()` of the database, the superuser's too, failed
/// after a second with 55P03, across restarts. Now none waits for it.
#[test]
fn a_first_use_left_prepared_or_open_stalls_no_one() {
    let c = Cluster::start("role-first", 55621, &["pg_ticket.shards = '0-3'", "pg_ticket.machine_id = 3"]);
    let mut admin = c.connect();
    admin.batch_execute("CREATE ROLE plain LOGIN").unwrap();
    for (db, leave) in [("prep", "PREPARE TRANSACTION 'first-use'"), ("open", "")] {
        let mut first = c.fresh_db(db);
        first.batch_execute("GRANT EXECUTE ON FUNCTION pgticket.lease_machine_id(text, interval) TO plain").unwrap();
        first.batch_execute(&format!("BEGIN; SELECT snowflake_id(); {leave}")).unwrap();
        for user in ["plain", "postgres"] {
            let mut other = c.connect_as(user, db);
            other.batch_execute("SET statement_timeout = '5s'").unwrap();
            let started = std::time::Instant::now();
            other.query_one("SELECT snowflake_id()", &[]).unwrap_or_else(|e| panic!("{db} {user}: {e}"));
            if user == "postgres" {
                other.query_one("SELECT pgticket.accept_shard(1, 0)", &[]).unwrap();
                other.query_one("SELECT sharded_id(1)", &[]).unwrap();
            }
            other.query_one("SELECT machine_id FROM pgticket.lease_machine_id($1, '30s')", &[&format!("{db}-{user}")]).unwrap();
            assert!(started.elapsed() < std::time::Duration::from_millis(900), "{db} {user} waited {:?}", started.elapsed());
        }
        if leave.is_empty() {
            first.batch_execute("COMMIT").unwrap();
        } else {
            first.batch_execute("COMMIT PREPARED 'first-use'").unwrap();
        }
        let spaces: i64 = first.query_one("SELECT count(DISTINCT (epoch_ms, machine_bits)) FROM pgticket.id_space", &[]).unwrap().get(0);
        assert_eq!(spaces, 1, "{db}: one space recorded");
    }
    c.stop();
}

/// #31 item 5: a holder's first lease left open in its transaction stopped
/// every other grant with 55P03 though ids were free (the never-leased
/// id's insert waited on the open one's row, and every caller tries the
/// lowest never-leased id first). Now the others take other ids at once.
#[test]
fn a_grant_left_open_stops_no_other_grant() {
    let c = Cluster::start("role-grant", 55622, &["pg_ticket.lease_ids = '0-9'", "pg_ticket.machine_id = 900"]);
    let mut admin = c.connect();
    admin.batch_execute("CREATE ROLE holder LOGIN; GRANT EXECUTE ON FUNCTION pgticket.lease_machine_id(text, interval) TO holder").unwrap();
    let mut open = c.connect_as("holder", "postgres");
    open.batch_execute("BEGIN").unwrap();
    let held: i32 = open.query_one("SELECT machine_id FROM pgticket.lease_machine_id('open', '30s')", &[]).unwrap().get(0);
    let mut others = c.connect_as("holder", "postgres");
    let started = std::time::Instant::now();
    let mut got = std::collections::HashSet::new();
    for i in 0..9 {
        let id: i32 = others
            .query_one("SELECT machine_id FROM pgticket.lease_machine_id($1, '30s')", &[&format!("h{i}")])
            .unwrap_or_else(|e| panic!("grant {i} beside the open one: {e}"))
            .get(0);
        assert_ne!(id, held, "the open grant's id");
        assert!(got.insert(id), "{id} twice");
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(2), "nine grants took {:?}", started.elapsed());
    let err = others.query_one("SELECT machine_id FROM pgticket.lease_machine_id('tenth', '30s')", &[]).expect_err("all ten taken");
    assert_eq!(sqlstate(&err), "53400", "{err}");
    open.batch_execute("COMMIT").unwrap();
    c.stop();
}

/// #31 item 6: a holder renewed reporting a stamp at its new expiry plus
/// the margin (0.3.0 accepted it), then released at once: the id's next
/// holder got a `not_before_ms` a whole ttl ahead, and a self-leasing
/// server there refused every snowflake ("the system clock is 57806 ms
/// behind"). Now a renewal's report is believed only up to the time of the
/// call plus the margin, and at a grant any earlier report only up to the
/// lease's end plus the margin.
#[test]
fn a_holder_cannot_poison_its_id_for_the_next_holder() {
    let c = Cluster::start("role-poison", 55623, &["pg_ticket.lease_ids = '7'", "pg_ticket.lease_margin = '2s'", "pg_ticket.machine_id = 900"]);
    let mut db = c.connect();
    let grant = |db: &mut Client, holder: &str| -> (i32, i64, String, i64) {
        let r = db.query_one("SELECT machine_id, lease, secret, not_before_ms FROM pgticket.lease_machine_id($1, '30s')", &[&holder]).unwrap();
        (r.get(0), r.get(1), r.get(2), r.get(3))
    };
    let now_ms = |db: &mut Client| -> i64 { db.query_one("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint", &[]).unwrap().get(0) };
    let (id, lease, secret, _) = grant(&mut db, "poisoner");
    let ahead = now_ms(&mut db) + 60_000 + 2_000;
    let err = db.query_one("SELECT pgticket.renew_machine_id($1, $2, $3, '30s', $4)", &[&id, &lease, &secret, &ahead]).expect_err("a stamp a ttl ahead");
    assert_eq!(sqlstate(&err), "22023", "{err}");
    // Honest reports (up to now plus the margin) are taken.
    let honest = now_ms(&mut db) + 1_000;
    db.query_one("SELECT pgticket.renew_machine_id($1, $2, $3, '30s', $4)", &[&id, &lease, &secret, &honest]).unwrap();
    // A report 0.3.0 recorded (the row as it left it), then a release.
    db.batch_execute(&format!("UPDATE pgticket.machine_id_leases SET last_issued_ms = {ahead} WHERE machine_id = {id}")).unwrap();
    db.execute("SELECT pgticket.release_machine_id($1, $2, $3)", &[&id, &lease, &secret]).unwrap();
    let released = now_ms(&mut db);
    std::thread::sleep(std::time::Duration::from_millis(2_300));
    let (again, _, _, not_before) = grant(&mut db, "next");
    assert_eq!(again, id);
    assert!(not_before <= released + 2_000 + 100, "the next holder's floor {not_before} lies {} ms past the release", not_before - released);
    c.stop();
}

/// Review of #31 item 1 (helper 2): three more ways a setting fell back to
/// its built-in default. (a) A bad `lease_ids` in the configuration: a
/// role's own `SET pg_ticket.lease_ids` made the load believe the list was
/// good, and the registry leased from 0-1023. (b) pg_ticket loaded first
/// by a parallel worker (a PL/pgSQL function inside a parallel query)
/// defined every setting at its default (`scope_rights` off). (c) A value
/// PostgreSQL cannot take (`scope_rights = 'onn'`) was its default with a
/// WARNING: now it stops a preloading server, and a session that loads on
/// demand runs no pg_ticket code.
#[test]
fn bad_or_unappliable_values_never_become_the_defaults() {
    let c = Cluster::start(
        "role-bad",
        55624,
        &["shared_preload_libraries = ''", "pg_ticket.scope_rights = on", "pg_ticket.lease_ids = '5-6, 2000'"],
    );
    let mut admin = c.connect();
    admin.batch_execute("CREATE ROLE plain LOGIN; GRANT EXECUTE ON FUNCTION pgticket.lease_machine_id(text, interval) TO plain").unwrap();
    // (a)
    let mut plain = c.connect_as("plain", "postgres");
    let err = plain.query_one("SELECT machine_id FROM pgticket.lease_machine_id('honest', '30s')", &[]).expect_err("a bad configured list");
    assert_eq!(sqlstate(&err), "F0000", "{err}");
    let mut plain = c.connect_as("plain", "postgres");
    let _ = plain.batch_execute("SET pg_ticket.lease_ids = '5'");
    let err = plain.query_one("SELECT machine_id FROM pgticket.lease_machine_id('h1', '30s')", &[]).expect_err("the session's SET is not the configuration");
    assert_eq!(sqlstate(&err), "F0000", "{err}");
    let leases: i64 = admin.query_one("SELECT count(*) FROM pgticket.machine_id_leases", &[]).unwrap().get(0);
    assert_eq!(leases, 0);

    // (b) The library's first load in a parallel worker.
    let mut plain = c.connect_as("plain", "postgres");
    let major: i32 = plain.query_one("SELECT current_setting('server_version_num')::int / 10000", &[]).unwrap().get(0);
    let force = if major >= 16 { "debug_parallel_query" } else { "force_parallel_mode" };
    plain
        .batch_execute(&format!(
            "CREATE FUNCTION pg_temp.may(q text, d text) RETURNS boolean LANGUAGE plpgsql PARALLEL SAFE AS
               $$BEGIN RETURN pgticket.may_allocate('scoped_id', q, d); END$$;
             SET {force} = on;"
        ))
        .unwrap();
    match plain.query_one("SELECT pg_temp.may('inv', 'a')", &[]) {
        Ok(row) => assert!(!row.get::<_, bool>(0), "a parallel worker's load said yes to a scope no grant covers"),
        Err(e) => assert_eq!(sqlstate(&e), "55000", "{e}"),
    }
    c.stop();

    // (c) Preloaded: a value PostgreSQL cannot take stops the server.
    let log = pg_ticket_integration::refused_start("/tmp/pgt-role-bad2", 55625, "pg_ticket.scope_rights = 'onn'");
    assert!(log.contains("pg_ticket.scope_rights"), "the log names the setting: {log}");
    // Loaded on demand: the session runs no pg_ticket code.
    let c = Cluster::start("role-bad3", 55626, &["shared_preload_libraries = ''"]);
    let mut admin = c.connect();
    admin.batch_execute("CREATE ROLE plain LOGIN").unwrap();
    let conf = c.data_dir().join("postgresql.conf");
    let mut text = std::fs::read_to_string(&conf).unwrap();
    text.push_str("pg_ticket.max_block_size = 0\n");
    std::fs::write(&conf, text).unwrap();
    admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut plain = c.connect_as("plain", "postgres");
    let err = plain.query_one("SELECT first_id FROM reserve_block('b', 1000000)", &[]).expect_err("a bad max_block_size");
    assert_eq!(sqlstate(&err), "F0000", "{err}");
    c.stop();
}

/// #31 item 9: tickets go back when two workers of one database install out
/// of order (a retiring worker served its queue once more after leaving the
/// registry, and a backend waiting then started a second: one session got
/// `1, 111..120, 101..110, 121...`). A test build's fault point makes the
/// worker install each segment after the next one, as the second worker
/// did; every session's tickets stay increasing (the earlier segment is a
/// gap).
#[test]
fn tickets_stay_in_order_when_segments_are_installed_out_of_order() {
    let c = Cluster::start(
        "role-order",
        55627,
        &["pg_ticket.test_reorder_ticket_installs = on", "pg_ticket.ticket_step_min = 10", "pg_ticket.ticket_step_max = 10"],
    );
    let mut db = c.connect();
    let shown: String = db.query_one("SHOW pg_ticket.test_reorder_ticket_installs", &[]).unwrap().get(0);
    assert_eq!(shown, "on", "the fault point exists in test builds (make install builds one)");
    let tickets: Vec<i64> = (0..60).map(|_| db.query_one("SELECT next_ticket('order', 'x')", &[]).unwrap().get(0)).collect();
    assert!(tickets.windows(2).all(|w| w[0] < w[1]), "tickets went back: {tickets:?}");
    let refills: i64 = db.query_one("SELECT count(*) FROM pgticket.ticket_cache WHERE queue = 'order'", &[]).unwrap().get(0);
    assert_eq!(refills, 1);
    c.stop();
}

/// #31 item 7: (a) a handover point a few seconds ahead (allowed up to
/// 11 s) moved the shared snowflake mark ahead before the accept waited:
/// after a cancel or a restart every `snowflake_id()` and every other
/// shard was refused until the point passed. (b) With the clock before the
/// epoch, `pgticket.accept_shard` waited until `statement_timeout`. Now the
/// accept waits first, and a cancelled one changes nothing.
#[test]
fn an_accept_ahead_or_before_the_epoch_stalls_no_one() {
    let c = Cluster::start("role-accept", 55628, &["pg_ticket.shards = '0-3'", "pg_ticket.machine_id = 4"]);
    let mut db = c.connect();
    db.query_one("SELECT snowflake_id()", &[]).unwrap();
    let ahead: i64 = db.query_one("SELECT sharded_min_id(clock_timestamp() + interval '8 seconds') | (2 << 10)", &[]).unwrap().get(0);
    db.batch_execute("SET statement_timeout = '1s'").unwrap();
    let err = db.query_one("SELECT pgticket.accept_shard(2, $1)", &[&ahead]).expect_err("cancelled while it waits");
    assert_eq!(sqlstate(&err), "57014", "{err}");
    db.batch_execute("RESET statement_timeout").unwrap();
    c.stop_with("immediate");
    c.up(None);
    let mut db = c.connect();
    let started = std::time::Instant::now();
    db.query_one("SELECT snowflake_id()", &[]).expect("snowflakes at once after the cancelled accept and a restart");
    db.query_one("SELECT pgticket.accept_shard(1, 0)", &[]).unwrap();
    db.query_one("SELECT sharded_id(1)", &[]).expect("another shard at once");
    assert!(started.elapsed() < std::time::Duration::from_secs(3), "{:?}", started.elapsed());
    let err = db.query_one("SELECT sharded_id(2)", &[]).expect_err("the cancelled accept took nothing");
    assert_eq!(sqlstate(&err), "55000", "{err}");
    c.stop();
    // (b) the clock before the epoch: refused at once.
    c.up(Some("-400d"));
    let mut db = c.connect();
    db.batch_execute("SET statement_timeout = '5s'").unwrap();
    let started = std::time::Instant::now();
    let err = db.query_one("SELECT pgticket.accept_shard(3, 0)", &[]).expect_err("before the epoch");
    assert_eq!(sqlstate(&err), "55000", "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
    c.stop();
}

/// #31 item 4: (a) every new name of a role at `max_scopes_per_role` was
/// refused (53400), yet first took a ticket-cache slot, evicting other
/// roles' cached scopes (with 64 slots the victim lost most of them); (b)
/// the cache's fairness held between databases only, so a role flooding
/// new names evicted the other roles of its database. Now a refused name
/// takes no slot, and each role of a database keeps 16 slots or half its
/// fair share, as each database did.
#[test]
fn a_flooding_role_never_empties_another_roles_cache() {
    let c = Cluster::start(
        "role-flood",
        55629,
        &["pg_ticket.ticket_cache_scopes = 64", "pg_ticket.ticket_step_min = 5", "pg_ticket.max_scopes_per_role = 1000"],
    );
    let mut admin = c.connect();
    admin
        .batch_execute(
            "CREATE ROLE victim LOGIN; CREATE ROLE capped LOGIN; CREATE ROLE flooder LOGIN;
             ALTER ROLE capped SET pg_ticket.max_scopes_per_role = 5;",
        )
        .unwrap();
    let mut victim = c.connect_as("victim", "postgres");
    let use_all = |v: &mut Client| v.batch_execute("SELECT next_ticket('v', 'scope-' || n) FROM generate_series(1, 20) n").unwrap();
    use_all(&mut victim);
    let kept = |a: &mut Client| -> i64 { a.query_one("SELECT count(*) FROM pgticket.ticket_cache WHERE queue = 'v'", &[]).unwrap().get(0) };
    assert_eq!(kept(&mut admin), 20);

    // (a) A role at its cap: 5 names, then 300 refused ones.
    let mut capped = c.connect_as("capped", "postgres");
    capped.batch_execute("SELECT next_ticket('c', 'n' || n) FROM generate_series(1, 5) n").unwrap();
    for n in 6..306 {
        let err = capped.query_one(&format!("SELECT next_ticket('c', 'n{n}')"), &[]).expect_err("past the cap");
        assert_eq!(sqlstate(&err), "53400", "{err}");
    }
    assert_eq!(kept(&mut admin), 20, "refused names took no slot");
    let capped_slots: i64 = admin.query_one("SELECT count(*) FROM pgticket.ticket_cache WHERE queue = 'c'", &[]).unwrap().get(0);
    assert!(capped_slots <= 5, "{capped_slots} slots for 5 names");
    // Its existing names still work at the cap.
    capped.query_one("SELECT next_ticket('c', 'n1')", &[]).unwrap();

    // (b) A role under its cap floods the same database.
    let mut flooder = c.connect_as("flooder", "postgres");
    for round in 0..5 {
        use_all(&mut victim);
        flooder.batch_execute(&format!("SELECT next_ticket('f', 'r{round}-' || n) FROM generate_series(1, 100) n")).unwrap();
    }
    let kept_now = kept(&mut admin);
    assert!(kept_now >= 16, "the victim kept {kept_now} of its 20 cached scopes (each role keeps 16, or half its fair share)");
    c.stop();
}

/// #31 item 3: with `max_ticket_workers` databases kept busy (a new scope
/// now and then each, so their workers never idle out), another database's
/// `next_ticket` was refused for as long as they stayed busy (25 of 25
/// calls in 25 s). Now it waits in line and the longest-serving worker
/// retires for it: every call is served, each within a bound.
#[test]
fn busy_databases_never_keep_another_from_a_ticket_worker() {
    let c = Cluster::start("role-workers", 55630, &["pg_ticket.max_ticket_workers = 2", "max_worker_processes = 16"]);
    let busy: Vec<String> = (1..=2).map(|k| format!("busy{k}")).collect();
    for name in &busy {
        drop(c.fresh_db(name));
    }
    drop(c.fresh_db("victim"));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let attackers: Vec<_> = busy
        .iter()
        .map(|name| {
            let dsn = c.dsn_as("postgres", name);
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut db = Client::connect(&dsn, postgres::NoTls).unwrap();
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    n += 1;
                    let _ = db.query_one(&format!("SELECT next_ticket('a', 'n{n}')"), &[]);
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(1_500));
    let mut victim = c.connect_as("postgres", "victim");
    let mut took = Vec::new();
    for n in 0..8 {
        let started = std::time::Instant::now();
        victim
            .query_one(&format!("SELECT next_ticket('v', 'n{n}')"), &[])
            .unwrap_or_else(|e| panic!("call {n} of the victim refused while the others are busy: {e}"));
        took.push(started.elapsed());
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for a in attackers {
        a.join().unwrap();
    }
    took.sort();
    let worst = *took.last().unwrap();
    assert!(worst < std::time::Duration::from_secs(3), "the victim waited up to {worst:?}: {took:?}");
    c.stop();
}

/// Review of #31 item 5 (helper 3): (a) the lock that keeps two first
/// grants of one never-leased id apart was an advisory lock any role could
/// take (`pg_advisory_lock(x'70677469'::int, id)` for every id): every
/// first grant failed with 53400 though ids were free; now it is a lock no
/// SQL function can take. (b) Recording raised settings waited for a
/// settle left open (the identity table's lock): every renewal failed
/// with 55P03 until it ended; now it is skipped, as the settle records them.
#[test]
fn no_role_blocks_a_grant_or_a_renewal_through_a_lock() {
    let c = Cluster::start(
        "role-locks",
        55631,
        &["pg_ticket.lease_ids = '0-9'", "pg_ticket.machine_id = 900", "pg_ticket.lease_margin = '1s'", "pg_ticket.lease_max_ttl = '2s'"],
    );
    let mut admin = c.connect();
    admin
        .batch_execute(
            "CREATE ROLE nobody LOGIN; CREATE ROLE holder LOGIN;
             GRANT EXECUTE ON FUNCTION pgticket.lease_machine_id(text, interval),
                   pgticket.renew_machine_id(integer, bigint, text, interval, bigint) TO holder;",
        )
        .unwrap();
    // (a)
    let mut nobody = c.connect_as("nobody", "postgres");
    let held: i64 = nobody
        .query_one("SELECT count(*) FILTER (WHERE pg_try_advisory_lock(x'70677469'::int, i)) FROM generate_series(0, 1023) i", &[])
        .unwrap()
        .get(0);
    assert_eq!(held, 1024);
    let mut holder = c.connect_as("holder", "postgres");
    let lease = |h: &mut Client, name: &str| -> (i32, i64, String) {
        let r = h.query_one("SELECT machine_id, lease, secret FROM pgticket.lease_machine_id($1, '2s')", &[&name]).unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    let first = lease(&mut holder, "first");
    drop(nobody);
    // (b) A restart leaves the registry unsettled; after its hold-off a
    // grant settles in a transaction left open, and a reload raises the
    // longest ttl: the other holder's renewal goes on.
    c.stop();
    c.up(None);
    // The first call after the start begins the hold-off.
    let mut open = c.connect_as("holder", "postgres");
    let held_off = open.query_one("SELECT machine_id FROM pgticket.lease_machine_id('early', '2s')", &[]).expect_err("holds off");
    assert_eq!(sqlstate(&held_off), "55000", "{held_off}");
    std::thread::sleep(std::time::Duration::from_millis(3_300));
    open.batch_execute("BEGIN").unwrap();
    let _settling = lease(&mut open, "settles");
    let mut holder = c.connect_as("holder", "postgres");
    let other = lease(&mut holder, "other");
    let mut admin = c.connect();
    admin.batch_execute("ALTER SYSTEM SET pg_ticket.lease_max_ttl = '3s'").unwrap();
    admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let started = std::time::Instant::now();
    holder
        .query_one("SELECT pgticket.renew_machine_id($1, $2, $3, '2s')", &[&other.0, &other.1, &other.2])
        .expect("a renewal beside a settle left open");
    assert!(started.elapsed() < std::time::Duration::from_millis(900), "waited {:?}", started.elapsed());
    open.batch_execute("COMMIT").unwrap();
    let _ = first;
    c.stop();
}

/// #46 item 10: `next_ticket()` calls cancelled by `statement_timeout =
/// 2ms` on new names still made the worker create their scopes (2 484 to
/// 6 011 in 8 s from three sessions), and another role's refills queued
/// behind them (p99 600-1 300 ms, a 55000 at 5 s). Now the worker drops a
/// first use nobody waits for any more, and makes new scopes in turns by
/// role, after the refills of scopes in use. Checked: most cancelled first
/// uses make no scope, and every call of another role on its cached
/// scopes is served meanwhile.
#[test]
fn cancelled_first_uses_make_no_scopes_and_stall_no_other_role() {
    let c = Cluster::start(
        "cancel-flood",
        55703,
        // Every commit waits 100 ms (the worker's too), so a first use takes
        // longer than the callers' 2 ms: they are cancelled while queued.
        &[
            "pg_ticket.max_scopes_per_role = 100000",
            "pg_ticket.ticket_step_min = 5",
            "pg_ticket.ticket_wait_timeout = '5s'",
            "commit_delay = 100000",
            "commit_siblings = 0",
        ],
    );
    c.connect().batch_execute("CREATE ROLE victim2 LOGIN; CREATE ROLE canceller LOGIN").unwrap();
    let mut victim = c.connect_as("victim2", "postgres");
    victim.batch_execute("SELECT next_ticket('v2', 'scope-' || n) FROM generate_series(1, 10) n").unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let floods: Vec<_> = (0..3)
        .map(|k| {
            let dsn = c.dsn_as("canceller", "postgres");
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut s = Client::connect(&dsn, NoTls).unwrap();
                s.batch_execute("SET statement_timeout = '2ms'").unwrap();
                let (mut calls, mut served) = (0u64, 0u64);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    calls += 1;
                    if s.query_one(&format!("SELECT next_ticket('flood', 's{k}-{calls}')"), &[]).is_ok() {
                        served += 1;
                    }
                }
                (calls, served)
            })
        })
        .collect();
    // The victim's cached scopes are served throughout.
    let started = std::time::Instant::now();
    let mut victim_calls = 0;
    while started.elapsed() < std::time::Duration::from_secs(6) {
        victim.query_one("SELECT next_ticket('v2', 'scope-' || (1 + $1::int % 10))", &[&(victim_calls as i32)]).expect("the victim's cached scope is served");
        victim_calls += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut calls, mut served) = (0, 0);
    for f in floods {
        let (c, s) = f.join().unwrap();
        calls += c;
        served += s;
    }
    // Requests the worker had read before their caller gave up are made;
    // the rest are not.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let made: i64 = c.connect().query_one("SELECT count(*) FROM pgticket.tickets WHERE queue = 'flood'", &[]).unwrap().get(0);
    println!("{calls} cancelled-or-served first uses ({served} served), {made} scopes made; {victim_calls} victim calls");
    assert!(calls >= 300, "the flood made {calls} calls");
    assert!((made as u64) < calls / 4 + served, "{made} scopes made for {calls} calls of which {served} were served");
    c.stop();
}

/// Review of #46 item 10 (helper-3): a backend ended by FATAL while it
/// waited for a first use (`pg_terminate_backend`, a lost client) exits
/// without unwinding, and its waiter count stayed: the worker made the
/// scope for nobody. The worker is stalled here (its commit waits for a
/// synchronous standby that does not exist) while the waiters are
/// terminated; once it runs again it makes no scope for them.
#[test]
fn first_uses_of_terminated_backends_make_no_scopes() {
    let c = Cluster::start("terminated-waiters", 55704, &["pg_ticket.ticket_wait_timeout = '30s'"]);
    let mut admin = c.connect();
    admin.batch_execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'").unwrap();
    admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    // The worker's commit for this scope waits for the standby.
    let stall_dsn = c.dsn();
    let staller = std::thread::spawn(move || {
        let mut s = Client::connect(&stall_dsn, NoTls).unwrap();
        let _ = s.query_one("SELECT next_ticket('stall', 'x')", &[]);
    });
    std::thread::sleep(std::time::Duration::from_millis(500));
    let waiters: Vec<_> = (0..5)
        .map(|k| {
            let dsn = c.dsn();
            std::thread::spawn(move || {
                let mut s = Client::connect(&dsn, NoTls).unwrap();
                s.query_one(&format!("SELECT next_ticket('terminated', 'w{k}')"), &[]).expect_err("terminated while waiting");
            })
        })
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let waiting: i64 = admin.query_one("SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%''terminated''%' AND pid <> pg_backend_pid()", &[]).unwrap().get(0);
        if waiting == 5 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{waiting} of 5 waiters");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    admin.batch_execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%''terminated''%' AND pid <> pg_backend_pid()").unwrap();
    for w in waiters {
        w.join().unwrap();
    }
    // The worker runs again: the stalled commit is released.
    admin.batch_execute("ALTER SYSTEM RESET synchronous_standby_names").unwrap();
    admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    staller.join().unwrap();
    // A pass or two for the queued asks.
    admin.query_one("SELECT next_ticket('after', 'x')", &[]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let made: i64 = admin.query_one("SELECT count(*) FROM pgticket.tickets WHERE queue = 'terminated'", &[]).unwrap().get(0);
    assert_eq!(made, 0, "scopes made for terminated waiters");
    c.stop();
}
