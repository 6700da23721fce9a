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
