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
             GRANT EXECUTE ON FUNCTION lease_machine_id(text, interval) TO plain;",
        )
        .unwrap();
    let attempts = [
        ("pg_ticket.scope_rights=off", "SELECT next_scoped_id('inv', 'shop-1')"),
        ("pg_ticket.max_scopes_per_role=0", "SELECT next_scoped_id('inv', 'shop-2')"),
        ("pg_ticket.max_block_size=1000000", "SELECT first_id FROM reserve_block('big', 1000)"),
        ("pg_ticket.max_transaction_entries=100000000", "SELECT next_scoped_id('inv', 'shop-3')"),
        ("pg_ticket.lease_ids=0-1023", "SELECT machine_id FROM lease_machine_id('h', '60s')"),
        ("pg_ticket.lease_max_ttl=600s", "SELECT machine_id FROM lease_machine_id('h', '300s')"),
        ("pg_ticket.lease_margin=1s", "SELECT machine_id FROM lease_machine_id('h', '60s')"),
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
    let err = plain.query_one("SELECT machine_id FROM lease_machine_id('h', '300s')", &[]).expect_err("over lease_max_ttl");
    assert_eq!(sqlstate(&err), "22023", "{err}");
    let id: i32 = plain.query_one("SELECT machine_id FROM lease_machine_id('h', '60s')", &[]).unwrap().get(0);
    assert!((5..=6).contains(&id), "leased {id}, outside lease_ids");

    // A superuser's own option is a superuser's setting: applied.
    let mut su = connect_with_option(&c, "postgres", "pg_ticket.max_block_size=5");
    su.query_one("SELECT next_scoped_id('inv', 'su')", &[]).expect("a superuser's option is not refused");
    let shown: String = su.query_one("SHOW pg_ticket.max_block_size", &[]).unwrap().get(0);
    assert_eq!(shown, "5");
    let err = su.query_one("SELECT first_id FROM reserve_block('b', 6)", &[]).expect_err("over the superuser's own cap");
    assert_eq!(sqlstate(&err), "22023", "{err}");

    // PostgreSQL 16 and later: ALTER ROLE ... SET ... USER SET makes the
    // role's own value a placeholder's reset value too.
    let major: i32 = admin.query_one("SELECT current_setting('server_version_num')::int / 10000", &[]).unwrap().get(0);
    if major >= 16 {
        admin.batch_execute("ALTER ROLE plain SET pg_ticket.scope_rights = off USER SET").unwrap();
        let mut plain = c.connect_as("plain", "postgres");
        let err = plain.query_one("SELECT next_scoped_id('inv', 'shop-1')", &[]).expect_err("USER SET is the role's own value");
        assert_eq!(sqlstate(&err), "42501", "{err}");
        assert!(format!("{err:?}").contains("pg_ticket.scope_rights"), "{err:?}");
        admin.batch_execute("ALTER ROLE plain RESET pg_ticket.scope_rights").unwrap();
    }
    c.stop();
}

/// #31 item 2: the first `snowflake_id()` of a database, left prepared (or
/// open), held the ID space's lock: every `snowflake_id()`, `sharded_id()`
/// and `lease_machine_id()` of the database, the superuser's too, failed
/// after a second with 55P03, across restarts. Now none waits for it.
#[test]
fn a_first_use_left_prepared_or_open_stalls_no_one() {
    let c = Cluster::start("role-first", 55621, &["pg_ticket.shards = '0-3'", "pg_ticket.machine_id = 3"]);
    let mut admin = c.connect();
    admin.batch_execute("CREATE ROLE plain LOGIN").unwrap();
    for (db, leave) in [("prep", "PREPARE TRANSACTION 'first-use'"), ("open", "")] {
        let mut first = c.fresh_db(db);
        first.batch_execute("GRANT EXECUTE ON FUNCTION lease_machine_id(text, interval) TO plain").unwrap();
        first.batch_execute(&format!("BEGIN; SELECT snowflake_id(); {leave}")).unwrap();
        for user in ["plain", "postgres"] {
            let mut other = c.connect_as(user, db);
            other.batch_execute("SET statement_timeout = '5s'").unwrap();
            let started = std::time::Instant::now();
            other.query_one("SELECT snowflake_id()", &[]).unwrap_or_else(|e| panic!("{db} {user}: {e}"));
            if user == "postgres" {
                other.query_one("SELECT sharded_accept(1, 0)", &[]).unwrap();
                other.query_one("SELECT sharded_id(1)", &[]).unwrap();
            }
            other.query_one("SELECT machine_id FROM lease_machine_id($1, '60s')", &[&format!("{db}-{user}")]).unwrap();
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
    admin.batch_execute("CREATE ROLE holder LOGIN; GRANT EXECUTE ON FUNCTION lease_machine_id(text, interval) TO holder").unwrap();
    let mut open = c.connect_as("holder", "postgres");
    open.batch_execute("BEGIN").unwrap();
    let held: i32 = open.query_one("SELECT machine_id FROM lease_machine_id('open', '60s')", &[]).unwrap().get(0);
    let mut others = c.connect_as("holder", "postgres");
    let started = std::time::Instant::now();
    let mut got = std::collections::HashSet::new();
    for i in 0..9 {
        let id: i32 = others
            .query_one("SELECT machine_id FROM lease_machine_id($1, '60s')", &[&format!("h{i}")])
            .unwrap_or_else(|e| panic!("grant {i} beside the open one: {e}"))
            .get(0);
        assert_ne!(id, held, "the open grant's id");
        assert!(got.insert(id), "{id} twice");
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(2), "nine grants took {:?}", started.elapsed());
    let err = others.query_one("SELECT machine_id FROM lease_machine_id('tenth', '60s')", &[]).expect_err("all ten taken");
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
        let r = db.query_one("SELECT machine_id, lease, secret, not_before_ms FROM lease_machine_id($1, '60s')", &[&holder]).unwrap();
        (r.get(0), r.get(1), r.get(2), r.get(3))
    };
    let now_ms = |db: &mut Client| -> i64 { db.query_one("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint", &[]).unwrap().get(0) };
    let (id, lease, secret, _) = grant(&mut db, "poisoner");
    let ahead = now_ms(&mut db) + 60_000 + 2_000;
    let err = db.query_one("SELECT renew_machine_id($1, $2, $3, '60s', $4)", &[&id, &lease, &secret, &ahead]).expect_err("a stamp a ttl ahead");
    assert_eq!(sqlstate(&err), "22023", "{err}");
    // Honest reports (up to now plus the margin) are taken.
    let honest = now_ms(&mut db) + 1_000;
    db.query_one("SELECT renew_machine_id($1, $2, $3, '60s', $4)", &[&id, &lease, &secret, &honest]).unwrap();
    // A report 0.3.0 recorded (the row as it left it), then a release.
    db.batch_execute(&format!("UPDATE pgticket.machine_id_leases SET last_issued_ms = {ahead} WHERE machine_id = {id}")).unwrap();
    db.execute("SELECT release_machine_id($1, $2, $3)", &[&id, &lease, &secret]).unwrap();
    let released = now_ms(&mut db);
    std::thread::sleep(std::time::Duration::from_millis(2_300));
    let (again, _, _, not_before) = grant(&mut db, "next");
    assert_eq!(again, id);
    assert!(not_before <= released + 2_000 + 100, "the next holder's floor {not_before} lies {} ms past the release", not_before - released);
    c.stop();
}
