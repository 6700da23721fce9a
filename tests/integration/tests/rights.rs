//! Rights per scope (SPEC §16, issue #22): with `pg_ticket.scope_rights`
//! on (here per database), a role allocates only where a grant covers the
//! scope or block name; off, as in 0.2.0. Each test has a database and
//! roles of its own (roles are the cluster's: their names carry the test's).

use pg_ticket_integration::{pg_tool, shared_cluster, sqlstate, Cluster};
use postgres::Client;

fn cluster() -> &'static Cluster {
    shared_cluster("rights", 55430, &[])
}

/// A fresh database `db` (rights on if `on`), and login roles `roles`
/// created anew.
fn setup(db: &str, roles: &[&str], on: bool) -> Client {
    let c = cluster();
    let mut admin = c.fresh_db(db);
    for role in roles {
        let mut postgres = c.connect();
        // A previous run's role may hold grants in other databases: none
        // depends on it (grants name it by OID).
        postgres.batch_execute(&format!("DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN")).unwrap();
    }
    if on {
        admin.batch_execute(&format!("ALTER DATABASE {db} SET pg_ticket.scope_rights = on")).unwrap();
    }
    admin
}

fn as_role(db: &str, role: &str) -> Client {
    cluster().connect_as(role, db)
}

/// The value of a one-value query, or the error's SQLSTATE and message.
fn value(c: &mut Client, sql: &str) -> Result<i64, (String, String)> {
    c.query_one(sql, &[]).map(|r| r.get(0)).map_err(|e| (sqlstate(&e), e.as_db_error().map(|d| d.message().to_string()).unwrap_or_default()))
}

#[track_caller]
fn refused(c: &mut Client, sql: &str, names: &str) {
    match value(c, sql) {
        Err((state, message)) => {
            assert_eq!(state, "42501", "{sql}: {message}");
            assert!(message.contains(names), "{sql}: the refusal {message:?} names {names:?}");
        }
        Ok(v) => panic!("{sql} was allowed (returned {v})"),
    }
}

fn count(c: &mut Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).unwrap().get(0)
}

#[test]
fn exact_and_prefix_grants_decide_for_counters_tickets_blocks_and_triggers() {
    let db = "rights_grants";
    let mut admin = setup(db, &["rg_alice", "rg_bob"], true);
    admin
        .batch_execute(
            "SELECT pgticket.grant_scope('rg_alice', 'invoices', 'shop-17/2026');
             SELECT pgticket.grant_scope('rg_alice', 'orders-*');
             SELECT pgticket.grant_scope('rg_alice', 'tix', 't-*');
             SELECT pgticket.grant_block('rg_alice', 'batch-*');
             CREATE TABLE inv (id bigint, q text, d text);
             SELECT number_rows('inv', 'id', 'q', domain_column => 'd');
             CREATE TABLE res (id bigint, q text, d text);
             SELECT number_rows('res', 'id', 'q', domain_column => 'd', kind => 'ticket');
             GRANT SELECT, INSERT ON inv, res TO rg_alice, rg_bob;",
        )
        .unwrap();
    let mut alice = as_role(db, "rg_alice");
    assert_eq!(value(&mut alice, "SELECT next_scoped_id('invoices', 'shop-17/2026')"), Ok(1));
    refused(&mut alice, "SELECT next_scoped_id('invoices', 'shop-17/2027')", r#"scope ("invoices", "shop-17/2027"): no grant covers it for role "rg_alice""#);
    refused(&mut alice, "SELECT current_scoped_id('invoices', 'shop-17/2027')", r#""shop-17/2027""#);
    assert_eq!(value(&mut alice, "SELECT next_scoped_id('orders-eu', 'any')"), Ok(1), "a queue prefix with every domain");
    refused(&mut alice, "SELECT next_scoped_id('orders', 'any')", r#"scope ("orders", "any")"#);
    assert_eq!(value(&mut alice, "SELECT last_id FROM reserve_block('batch-7', 5)"), Ok(5));
    refused(&mut alice, "SELECT last_id FROM reserve_block('other', 5)", r#"block "other""#);
    refused(&mut alice, "SELECT next_scoped_id('batch-7', 'x')", "scope"); // a block grant is not a scope grant
    assert_eq!(value(&mut alice, "SELECT next_ticket('tix', 't-1')"), Ok(1));
    refused(&mut alice, "SELECT next_ticket('tix', 'u-1')", r#"ticket scope ("tix", "u-1")"#);
    // The triggers, row by row.
    assert_eq!(value(&mut alice, "INSERT INTO inv (q, d) VALUES ('invoices', 'shop-17/2026') RETURNING id"), Ok(2));
    refused(&mut alice, "INSERT INTO inv (q, d) VALUES ('invoices', 'shop-18/2026') RETURNING id", r#""shop-18/2026""#);
    assert!(value(&mut alice, "INSERT INTO res (q, d) VALUES ('tix', 't-9') RETURNING id").is_ok());
    refused(&mut alice, "INSERT INTO res (q, d) VALUES ('tix', 'zz') RETURNING id", r#"ticket scope ("tix", "zz")"#);

    // No grant: every allocation refused.
    let mut bob = as_role(db, "rg_bob");
    refused(&mut bob, "SELECT next_scoped_id('invoices', 'shop-17/2026')", r#"role "rg_bob""#);
    refused(&mut bob, "SELECT next_ticket('tix', 't-1')", r#"role "rg_bob""#);
    refused(&mut bob, "SELECT last_id FROM reserve_block('batch-7', 5)", r#"role "rg_bob""#);
    refused(&mut bob, "INSERT INTO inv (q, d) VALUES ('invoices', 'shop-17/2026') RETURNING id", r#"role "rg_bob""#);

    // Refusals changed nothing; the superuser needs no grant.
    assert_eq!(count(&mut admin, "SELECT count(*) FROM pgticket.scoped_counters WHERE domain IN ('shop-17/2027', 'shop-18/2026') OR queue = 'orders'"), 0);
    assert_eq!(count(&mut admin, "SELECT count(*) FROM pgticket.blocks WHERE name = 'other'"), 0);
    assert_eq!(value(&mut admin, "SELECT next_scoped_id('invoices', 'shop-17/2026')"), Ok(3));
    assert_eq!(value(&mut admin, "SELECT next_scoped_id('anything', 'at all')"), Ok(1));
}

#[test]
fn the_state_tables_owner_needs_no_grant() {
    let db = "rights_owner";
    let mut admin = setup(db, &["rg_owner"], true);
    admin
        .batch_execute("ALTER TABLE pgticket.scoped_counters OWNER TO rg_owner; ALTER TABLE pgticket.blocks OWNER TO rg_owner; ALTER TABLE pgticket.tickets OWNER TO rg_owner")
        .unwrap();
    let mut owner = as_role(db, "rg_owner");
    assert_eq!(value(&mut owner, "SELECT next_scoped_id('q', 'd')"), Ok(1));
    assert_eq!(value(&mut owner, "SELECT last_id FROM reserve_block('b', 2)"), Ok(2));
    assert_eq!(value(&mut owner, "SELECT next_ticket('q', 'd')"), Ok(1));
}

#[test]
fn grants_and_revokes_are_transactional_and_reach_open_sessions() {
    let db = "rights_xact";
    let mut admin = setup(db, &["rg_carol"], true);
    let mut carol = as_role(db, "rg_carol");
    let take = "SELECT next_scoped_id('ledger', 'eu')";
    refused(&mut carol, take, r#""ledger""#);
    let mut tx = admin.transaction().unwrap();
    tx.execute("SELECT pgticket.grant_scope('rg_carol', 'ledger', 'eu')", &[]).unwrap();
    refused(&mut carol, take, r#""ledger""#); // not committed
    tx.rollback().unwrap();
    refused(&mut carol, take, r#""ledger""#);
    assert_eq!(count(&mut admin, "SELECT count(*) FROM pgticket.scope_grants"), 0, "a rolled-back grant is gone");

    let granted: bool = admin.query_one("SELECT pgticket.grant_scope('rg_carol', 'ledger', 'eu')", &[]).unwrap().get(0);
    assert!(granted);
    assert_eq!(value(&mut carol, take), Ok(1), "a committed grant reaches an open session at its next transaction");
    assert_eq!(value(&mut carol, "SELECT current_scoped_id('ledger', 'eu')"), Ok(1));
    let again: bool = admin.query_one("SELECT pgticket.grant_scope('rg_carol', 'ledger', 'eu')", &[]).unwrap().get(0);
    assert!(!again, "granting twice is one grant");

    let mut tx = admin.transaction().unwrap();
    let revoked: bool = tx.query_one("SELECT pgticket.revoke_scope('rg_carol', 'ledger', 'eu')", &[]).unwrap().get(0);
    assert!(revoked);
    assert_eq!(value(&mut carol, take), Ok(2), "a revoke counts from its commit");
    tx.commit().unwrap();
    refused(&mut carol, take, r#""ledger""#);
    let twice: bool = admin.query_one("SELECT pgticket.revoke_scope('rg_carol', 'ledger', 'eu')", &[]).unwrap().get(0);
    assert!(!twice, "nothing left to revoke");
    // A revoke names the grant as made: revoking one domain of a grant of
    // every domain removes nothing.
    admin.execute("SELECT pgticket.grant_scope('rg_carol', 'ledger')", &[]).unwrap();
    let partial: bool = admin.query_one("SELECT pgticket.revoke_scope('rg_carol', 'ledger', 'eu')", &[]).unwrap().get(0);
    assert!(!partial);
    assert_eq!(value(&mut carol, take), Ok(3));
}

#[test]
fn a_revoke_committed_while_a_statement_or_snapshot_runs_is_not_read_back() {
    let db = "rights_snapshot";
    let mut admin = setup(db, &["rg_gina"], true);
    admin.batch_execute("SELECT pgticket.grant_scope('rg_gina', 'rc')").unwrap();
    let mut gina = as_role(db, "rg_gina");
    assert_eq!(value(&mut gina, "SELECT next_scoped_id('rc', 'd0')"), Ok(1));
    // One statement spanning the revoke's commit: its later rows lock new
    // scopes, which takes in the invalidation while its snapshot still
    // shows the grant.
    let revoker = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(700));
        admin.batch_execute("SELECT pgticket.revoke_scope('rg_gina', 'rc')").unwrap();
        admin
    });
    let _ = gina.query(
        "SELECT i, CASE WHEN pg_sleep(CASE WHEN i = 1 THEN 2 ELSE 0 END) IS NOT NULL THEN next_scoped_id('rc', 'd' || i) END FROM generate_series(1, 3) i",
        &[],
    );
    let mut admin = revoker.join().unwrap();
    refused(&mut gina, "SELECT next_scoped_id('rc', 'd1')", r#"role "rg_gina""#);
    refused(&mut gina, "SELECT next_scoped_id('rc', 'd0')", r#"role "rg_gina""#);

    // A REPEATABLE READ transaction whose snapshot predates the revoke.
    admin.batch_execute("SELECT pgticket.grant_scope('rg_gina', 'rr'); CREATE TABLE untouched (x int); GRANT SELECT ON untouched TO rg_gina").unwrap();
    gina.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ").unwrap();
    assert_eq!(value(&mut gina, "SELECT next_scoped_id('rr', 'a')"), Ok(1));
    admin.batch_execute("SELECT pgticket.revoke_scope('rg_gina', 'rr')").unwrap();
    gina.batch_execute("SELECT count(*) FROM untouched").unwrap(); // a new lock: the invalidation is in
    let _ = value(&mut gina, "SELECT next_scoped_id('rr', 'b')");
    gina.batch_execute("ROLLBACK").unwrap();
    refused(&mut gina, "SELECT next_scoped_id('rr', 'a')", r#"role "rg_gina""#);
    assert!(!gina.query_one("SELECT pgticket.may_allocate('scoped_id', 'rr', 'a')", &[]).unwrap().get::<_, bool>(0));
}

#[test]
fn a_grants_table_without_its_trigger_is_refused() {
    let db = "rights_trigger";
    let mut admin = setup(db, &["rg_hal"], true);
    admin.batch_execute("SELECT pgticket.grant_scope('rg_hal', 'q'); DROP TRIGGER changed ON pgticket.rights").unwrap();
    let mut hal = as_role(db, "rg_hal");
    match value(&mut hal, "SELECT next_scoped_id('q', 'd')") {
        Err((state, message)) => assert!(state == "55000" && message.contains("\"changed\""), "{state}: {message}"),
        Ok(v) => panic!("allocated {v} while revokes could not reach the session"),
    }
    // Bad arguments are refused as such, before any state is read (the
    // shorter path for a repeat of the scope served last, tried first at
    // every call, checks the names before it asks for a grant).
    for sql in ["SELECT next_scoped_id('', 'd')", "SELECT next_scoped_id('q', repeat('d', 256))"] {
        let got = value(&mut hal, sql);
        assert!(matches!(&got, Err((state, _)) if state == "22023"), "{sql}: {got:?}");
    }
    admin
        .batch_execute(
            "CREATE TRIGGER changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON pgticket.rights
                 FOR EACH STATEMENT EXECUTE FUNCTION pgticket.rights_changed();
             ALTER TABLE pgticket.rights ENABLE ALWAYS TRIGGER changed;",
        )
        .unwrap();
    assert_eq!(value(&mut hal, "SELECT next_scoped_id('q', 'd')"), Ok(1));
    // A trigger of that name but another shape (per row) carries no
    // TRUNCATE: refused too.
    admin
        .batch_execute(
            "DROP TRIGGER changed ON pgticket.rights;
             CREATE TRIGGER changed AFTER INSERT ON pgticket.rights FOR EACH ROW EXECUTE FUNCTION pgticket.rights_changed();",
        )
        .unwrap();
    let mut hal = as_role(db, "rg_hal");
    assert!(matches!(value(&mut hal, "SELECT next_scoped_id('q', 'd')"), Err((state, _)) if state == "55000"));
    // With the setting off, nothing reads the grants: nothing is blocked.
    let off = "rights_trigger_off";
    let mut admin_off = setup(off, &[], false);
    admin_off.batch_execute("DROP TRIGGER changed ON pgticket.rights").unwrap();
    assert_eq!(value(&mut admin_off, "SELECT next_scoped_id('q', 'd')"), Ok(1));
}

#[test]
fn a_dropped_roles_grants_are_not_dumped_and_go_at_the_next_change() {
    let db = "rights_dropped";
    let mut admin = setup(db, &["rg_doomed", "rg_kept"], true);
    admin.batch_execute("SELECT pgticket.grant_scope('rg_doomed', 'secret'); SELECT pgticket.grant_scope('rg_kept', 'open')").unwrap();
    cluster().connect().batch_execute("DROP ROLE rg_doomed").unwrap();
    assert_eq!(count(&mut admin, "SELECT count(*) FROM pgticket.rights"), 2, "the row stays, showing an OID");
    let c = cluster();
    let (host, port) = (c.dir.to_str().unwrap().to_string(), c.port.to_string());
    let dump = pg_tool("pg_dump", &["-h", &host, "-p", &port, "-U", "postgres", "--data-only", "-t", "pgticket.rights", db]);
    let text = String::from_utf8_lossy(&dump.stdout);
    assert!(text.contains("rg_kept") && !text.contains("secret"), "a dropped role's grant was dumped (its OID may be another role's elsewhere):\n{text}");
    admin.batch_execute("SELECT pgticket.grant_scope('rg_kept', 'more')").unwrap();
    assert_eq!(count(&mut admin, "SELECT count(*) FROM pgticket.rights WHERE queue = 'secret'"), 0, "a change clears rows of dropped roles");
}

#[test]
fn a_grant_changed_meanwhile_does_not_fail_a_serializable_allocation() {
    let db = "rights_serializable";
    let mut admin = setup(db, &["rg_ivy"], true);
    admin.batch_execute("SELECT pgticket.grant_scope('rg_ivy', 'rr')").unwrap();
    let mut ivy = as_role(db, "rg_ivy");
    ivy.batch_execute("BEGIN ISOLATION LEVEL SERIALIZABLE").unwrap();
    assert_eq!(value(&mut ivy, "SELECT next_scoped_id('rr', 'd')"), Ok(1));
    admin
        .batch_execute(
            "BEGIN ISOLATION LEVEL SERIALIZABLE;
             SELECT mark FROM pgticket.scoped_counters WHERE queue = 'rr';
             SELECT pgticket.grant_scope('rg_ivy', 'other', 'x');
             COMMIT;",
        )
        .unwrap();
    ivy.batch_execute("COMMIT").unwrap();
}

#[test]
fn grants_survive_a_dump_and_restore() {
    let db = "rights_dump";
    let mut admin = setup(db, &["rg_dave"], true);
    admin.batch_execute("SELECT pgticket.grant_scope('rg_dave', 'q*', 'd'); SELECT pgticket.grant_block('rg_dave', 'pool')").unwrap();
    let c = cluster();
    let dump = c.dir.join("rights.dump");
    let (host, port) = (c.dir.to_str().unwrap().to_string(), c.port.to_string());
    let conn = ["-h", host.as_str(), "-p", port.as_str(), "-U", "postgres"];
    pg_tool("pg_dump", &[&conn[..], &["-Fc", "-f", dump.to_str().unwrap(), db]].concat());
    let mut postgres = c.connect();
    for sql in ["DROP DATABASE IF EXISTS rights_restored WITH (FORCE)", "CREATE DATABASE rights_restored", "ALTER DATABASE rights_restored SET pg_ticket.scope_rights = on"] {
        postgres.batch_execute(sql).unwrap();
    }
    pg_tool("pg_restore", &[&conn[..], &["-d", "rights_restored", dump.to_str().unwrap()]].concat());
    let grants = |c: &mut Client| -> Vec<String> {
        c.query("SELECT format('%s %s %s %s %s', role, kind, queue, domain, block_name) FROM pgticket.scope_grants ORDER BY 1", &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    };
    let mut restored = c.connect_as("postgres", "rights_restored");
    assert_eq!(grants(&mut restored), grants(&mut admin));
    assert_eq!(grants(&mut restored).len(), 2);
    let mut dave = as_role("rights_restored", "rg_dave");
    assert_eq!(value(&mut dave, "SELECT next_scoped_id('queue', 'd')"), Ok(1));
    assert_eq!(value(&mut dave, "SELECT last_id FROM reserve_block('pool', 3)"), Ok(3));
    refused(&mut dave, "SELECT next_scoped_id('queue', 'e')", r#""e""#);
}

#[test]
fn a_plain_role_sees_only_the_marks_and_cached_tickets_it_may_use() {
    let db = "rights_views";
    let mut admin = setup(db, &["rg_erin"], true);
    admin
        .batch_execute(
            "SELECT pgticket.grant_scope('rg_erin', 'mine', '*'); SELECT pgticket.grant_block('rg_erin', 'my-*');
             SELECT next_scoped_id('mine', 'a'), next_scoped_id('theirs', 'a');
             SELECT reserve_block('my-pool', 10), reserve_block('their-pool', 10);
             SELECT next_ticket('mine', 't'), next_ticket('theirs', 't');",
        )
        .unwrap();
    let rows = |c: &mut Client, sql: &str| -> Vec<String> { c.query(sql, &[]).unwrap().iter().map(|r| r.get(0)).collect() };
    let marks = "SELECT format('%s %s %s', kind, coalesce(queue, block_name), coalesce(domain, '-')) FROM pgticket.marks ORDER BY 1";
    let cache = "SELECT format('%s %s', queue, domain) FROM pgticket.ticket_cache ORDER BY 1";
    let mut erin = as_role(db, "rg_erin");
    assert_eq!(rows(&mut erin, marks), ["block my-pool -", "scoped_id mine a", "ticket mine t"]);
    assert_eq!(rows(&mut erin, cache), ["mine t"]);
    assert_eq!(rows(&mut admin, marks).len(), 6, "the superuser sees every row");
    assert_eq!(rows(&mut admin, cache).len(), 2);
    let may: Vec<bool> = erin
        .query_one("SELECT pgticket.may_allocate('scoped_id', 'mine', 'x'), pgticket.may_allocate('ticket', 'theirs', 't'), pgticket.may_allocate('block', 'my-x', NULL)", &[])
        .map(|r| vec![r.get(0), r.get(1), r.get(2)])
        .unwrap();
    assert_eq!(may, [true, false, true]);
    // A block name has no domain (#32 review: one given was ignored).
    let err = erin.query_one("SELECT pgticket.may_allocate('block', 'my-x', 'anything')", &[]).unwrap_err();
    assert_eq!(sqlstate(&err), "22023", "{err}");
    // A cheap function of the caller's in the WHERE clause (one that
    // records its arguments) never runs on a row the view filters out.
    erin.batch_execute(
        "CREATE TEMP TABLE seen (q text);
         CREATE FUNCTION pg_temp.leak(q text) RETURNS boolean VOLATILE COST 0.0000001 LANGUAGE plpgsql
             AS $$ BEGIN INSERT INTO seen VALUES (q); RETURN true; END $$;",
    )
    .unwrap();
    erin.query("SELECT * FROM pgticket.marks WHERE pg_temp.leak(coalesce(queue, block_name))", &[]).unwrap();
    assert_eq!(rows(&mut erin, "SELECT q FROM seen ORDER BY q"), ["mine", "mine", "my-pool"], "the caller's function saw only its own rows");
}

#[test]
fn off_lets_every_role_allocate_as_0_2_0_did_and_no_role_turns_it_off() {
    let db = "rights_off";
    let mut admin = setup(db, &["rg_frank"], false);
    admin.batch_execute("SELECT pgticket.grant_scope('rg_frank', 'only-this', 'one')").unwrap();
    let mut frank = as_role(db, "rg_frank");
    assert_eq!(value(&mut frank, "SELECT next_scoped_id('anything', 'x')"), Ok(1));
    assert_eq!(value(&mut frank, "SELECT next_ticket('anything', 'x')"), Ok(1));
    assert_eq!(value(&mut frank, "SELECT last_id FROM reserve_block('any', 4)"), Ok(4));
    assert_eq!(count(&mut frank, "SELECT count(*) FROM pgticket.marks"), 3, "every row is visible while off");
    assert_eq!(count(&mut frank, "SELECT count(*) FROM pgticket.ticket_cache"), 1);
    let on = "rights_on";
    setup(on, &[], true);
    let mut frank_on = as_role(on, "rg_frank");
    let err = frank_on.batch_execute("SET pg_ticket.scope_rights = off").unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "{err}");
    refused(&mut frank_on, "SELECT next_scoped_id('anything', 'x')", r#"role "rg_frank""#);
}

#[test]
fn the_scope_served_last_is_served_again_only_to_whom_it_was_permitted() {
    let db = "rights_last";
    let mut admin = setup(db, &["rg_last_b", "rg_last_a"], true);
    admin
        .batch_execute(
            "SELECT pgticket.grant_scope('rg_last_b', 'qb', 'd'); SELECT pgticket.grant_scope('rg_last_a', 'qa', 'd');
             GRANT EXECUTE ON FUNCTION pgticket.advance_scoped_id TO rg_last_b;",
        )
        .unwrap();
    let mut su = as_role(db, "postgres");
    su.batch_execute("BEGIN; SET ROLE rg_last_b").unwrap();
    assert_eq!(value(&mut su, "SELECT next_scoped_id('qb', 'd')"), Ok(1));
    assert_eq!(value(&mut su, "SELECT next_scoped_id('qb', 'd')"), Ok(2));
    su.batch_execute("SET ROLE rg_last_a").unwrap();
    assert_eq!(value(&mut su, "SELECT next_scoped_id('qa', 'd')"), Ok(1));
    assert_eq!(value(&mut su, "SELECT next_scoped_id('qa', 'd')"), Ok(2));
    // rg_last_b's refused change makes qb the scope touched last; rg_last_a, whose
    // right to qa was the last decided, is still refused qb.
    su.batch_execute("SET ROLE rg_last_b; SAVEPOINT s").unwrap();
    let got = value(&mut su, "SELECT pgticket.advance_scoped_id('qb', 'd', 1)");
    assert!(matches!(&got, Err((state, _)) if state == "22023"), "{got:?}");
    su.batch_execute("ROLLBACK TO s; RELEASE s; SET ROLE rg_last_a").unwrap();
    refused(&mut su, "SELECT next_scoped_id('qb', 'd')", r#"role "rg_last_a""#);
    su.batch_execute("ROLLBACK").unwrap();
}

#[test]
fn a_grant_to_the_database_owner_follows_the_owner_into_open_sessions() {
    let db = "rights_dbo";
    let mut admin = setup(db, &["rg_dbo"], true);
    admin.batch_execute(&format!("ALTER DATABASE {db} OWNER TO rg_dbo; SELECT pgticket.grant_scope('pg_database_owner', 'dbo', 'd')")).unwrap();
    let mut owner = as_role(db, "rg_dbo");
    assert_eq!(value(&mut owner, "SELECT next_scoped_id('dbo', 'd')"), Ok(1));
    admin.batch_execute(&format!("ALTER DATABASE {db} OWNER TO postgres")).unwrap();
    refused(&mut owner, "SELECT next_scoped_id('dbo', 'd')", r#"role "rg_dbo""#);
    assert!(!owner.query_one("SELECT pgticket.may_allocate('scoped_id', 'dbo', 'd')", &[]).unwrap().get::<_, bool>(0));
}

#[test]
fn membership_set_role_and_bad_input() {
    let db = "rights_roles";
    let mut admin = setup(db, &["rg_group", "rg_heir", "rg_plain"], true);
    admin
        .batch_execute(
            "ALTER ROLE rg_plain NOINHERIT; GRANT rg_group TO rg_heir; GRANT rg_group TO rg_plain;
             SELECT pgticket.grant_scope('rg_group', 'team', 'x');",
        )
        .unwrap();
    let take = "SELECT next_scoped_id('team', 'x')";
    let mut heir = as_role(db, "rg_heir");
    assert_eq!(value(&mut heir, take), Ok(1), "a member that inherits its group's privileges inherits its grants");
    let mut plain = as_role(db, "rg_plain");
    refused(&mut plain, take, r#"role "rg_plain""#);
    // SET ROLE is checked at every call, also for a scope this transaction
    // already holds.
    plain.batch_execute("BEGIN; SET ROLE rg_group").unwrap();
    assert_eq!(value(&mut plain, take), Ok(2));
    plain.batch_execute("RESET ROLE").unwrap();
    refused(&mut plain, take, r#"role "rg_plain""#);
    plain.batch_execute("ROLLBACK").unwrap();
    // A membership revoked, or a grant withdrawn, inside the transaction
    // counts from the next call, also on the scope it served last. (A
    // superuser's session opened after the setting was turned on.)
    let mut superuser = as_role(db, "postgres");
    for change in ["REVOKE rg_group FROM rg_heir", "SELECT pgticket.revoke_scope('rg_group', 'team', 'x')"] {
        superuser.batch_execute("BEGIN; SET ROLE rg_heir").unwrap();
        assert_eq!(value(&mut superuser, take), Ok(2));
        assert_eq!(value(&mut superuser, take), Ok(3));
        superuser.batch_execute(&format!("RESET ROLE; {change}; SET ROLE rg_heir")).unwrap();
        refused(&mut superuser, take, r#"role "rg_heir""#);
        superuser.batch_execute("ROLLBACK").unwrap();
    }
    // A membership or attribute changed since reaches an open session.
    admin.batch_execute("REVOKE rg_group FROM rg_heir").unwrap();
    refused(&mut heir, take, r#"role "rg_heir""#);
    admin.batch_execute("GRANT rg_group TO rg_heir").unwrap();
    assert_eq!(value(&mut heir, take), Ok(2));
    // Inheriting stopped: a role attribute up to PostgreSQL 15; from 16 on
    // each membership has its own INHERIT option (the attribute is only
    // the default for new grants).
    let version: i32 = admin.query_one("SELECT current_setting('server_version_num')::int", &[]).unwrap().get(0);
    admin
        .batch_execute(if version >= 160000 { "GRANT rg_group TO rg_heir WITH INHERIT FALSE" } else { "ALTER ROLE rg_heir NOINHERIT" })
        .unwrap();
    refused(&mut heir, take, r#"role "rg_heir""#);
    admin.batch_execute("ALTER ROLE rg_plain SUPERUSER").unwrap();
    assert_eq!(value(&mut plain, "SELECT next_scoped_id('anything', 'x')"), Ok(1));
    admin.batch_execute("ALTER ROLE rg_plain NOSUPERUSER").unwrap();
    refused(&mut plain, "SELECT next_scoped_id('anything', 'x')", r#"role "rg_plain""#);

    for (sql, state) in [
        ("SELECT pgticket.grant_scope(NULL, 'q')", "22004"),
        ("SELECT pgticket.grant_scope('rg_plain', NULL)", "22004"),
        ("SELECT pgticket.grant_scope('rg_plain', '')", "22023"),
        ("SELECT pgticket.grant_scope('rg_plain', 'q', '')", "22023"),
        ("SELECT pgticket.grant_scope('rg_plain', repeat('q', 256))", "22023"),
        ("SELECT pgticket.grant_block('rg_plain', repeat('q', 256) || '*x')", "22023"),
        ("SELECT pgticket.grant_scope('rg_nobody_at_all', 'q')", "42704"),
        ("SELECT pgticket.may_allocate('sequence', 'q', 'd')", "22023"),
        ("SELECT pgticket.may_allocate('scoped_id', repeat('q', 256), 'd')", "22023"),
        ("SELECT pgticket.may_allocate('scoped_id', 'q', '')", "22023"),
        ("SELECT pgticket.may_allocate('block', '', NULL)", "22023"),
    ] {
        let err = admin.batch_execute(sql).unwrap_err();
        assert_eq!(sqlstate(&err), state, "{sql}: {err}");
    }
    assert!(admin.batch_execute("SELECT pgticket.grant_block('rg_plain', repeat('q', 255) || '*')").is_ok(), "a 255-byte prefix");
    assert_eq!(count(&mut admin, "SELECT count(*) FROM pgticket.scope_grants WHERE role = 'rg_plain'::regrole"), 1);
    // Administration is not for PUBLIC.
    for sql in ["SELECT pgticket.grant_scope('rg_plain', 'q')", "SELECT pgticket.revoke_scope('rg_group', 'team', 'x')", "SELECT pgticket.grant_block('rg_plain', 'b')", "TABLE pgticket.scope_grants"] {
        let err = heir.batch_execute(sql).unwrap_err();
        assert_eq!(sqlstate(&err), "42501", "{sql}: {err}");
    }
}
