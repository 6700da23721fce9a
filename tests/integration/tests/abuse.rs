//! One role against the others (SPEC §13.11, §20; issue #46 items 2, 3):
//! what a plain login role reaches of another role's series through the
//! helpers an application uses.

use pg_ticket_integration::{shared_cluster, sqlstate, Cluster};
use postgres::Client;

/// The cluster, with the plain login roles `tenant` (who must not touch
/// the shops' series) and `importer` (granted the advance by one test).
fn cluster() -> &'static Cluster {
    static ROLES: std::sync::Once = std::sync::Once::new();
    let c = shared_cluster("abuse", 55702, &["pg_ticket.max_scopes_per_role = 2"]);
    ROLES.call_once(|| c.connect().batch_execute("CREATE ROLE tenant LOGIN; CREATE ROLE importer LOGIN").unwrap());
    c
}

/// A database of its own with the extension.
fn db(c: &Cluster, name: &str) -> Client {
    c.fresh_db(name)
}

fn one(client: &mut Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).unwrap().get(0)
}

/// #46 item 2: 0.4.0 let a plain role's trigger made with `on_explicit =>
/// 'advance'` on its own TEMP table move any other role's series: one
/// INSERT of 2^63-1 exhausted `shop-42`'s invoices for good (2200H from
/// then on), a given ticket held the victim's ticket scope for as long as
/// the transaction stayed open, and ticket scopes made that way ignored
/// `pg_ticket.max_scopes_per_role`. Now a claim takes what
/// `pgticket.advance_scoped_id` / `pgticket.advance_ticket` take (42501
/// without it, nothing changed), and the scopes it makes count.
#[test]
fn a_number_given_to_a_trigger_moves_a_series_only_with_the_right_to_advance_it() {
    let c = cluster();
    let mut admin = db(c, "advance_right");
    assert_eq!(one(&mut admin, "SELECT next_scoped_id('shop-42', 'invoice')"), 1);
    let ticket = one(&mut admin, "SELECT next_ticket('shop-42', 'invoice')");

    let mut tenant = c.connect_as("tenant", "advance_right");
    tenant
        .batch_execute(
            "CREATE TEMP TABLE grab (shop text, no bigint);
             SELECT number_rows('pg_temp.grab', 'no', 'shop', domain => 'invoice', on_explicit => 'advance');
             CREATE TEMP TABLE grab_ticket (shop text, no bigint);
             SELECT number_rows('pg_temp.grab_ticket', 'no', 'shop', domain => 'invoice', kind => 'ticket', on_explicit => 'advance');",
        )
        .unwrap();
    let e = tenant.batch_execute("INSERT INTO grab VALUES ('shop-42', 9223372036854775807)").unwrap_err();
    assert_eq!(sqlstate(&e), "42501", "{e:?}");
    assert!(e.as_db_error().unwrap().message().contains("pgticket.advance_scoped_id"), "{e:?}");
    let e = tenant.batch_execute("BEGIN; INSERT INTO grab_ticket VALUES ('shop-42', 1000000)").unwrap_err();
    assert_eq!(sqlstate(&e), "42501", "{e:?}");
    tenant.batch_execute("ROLLBACK").unwrap();
    // Left open: nothing is held.
    tenant.batch_execute("BEGIN; SELECT 1").unwrap();
    // The shop's series go on as they were.
    assert_eq!(one(&mut admin, "SELECT next_scoped_id('shop-42', 'invoice')"), 2);
    assert!(one(&mut admin, "SELECT next_ticket('shop-42', 'invoice')") > ticket);
    assert!(one(&mut admin, "SELECT next_ticket('shop-42', 'invoice')") < 1_000_000);
    tenant.batch_execute("ROLLBACK").unwrap();
    // Numbers the tenant leaves to the trigger are still its to take.
    tenant.batch_execute("INSERT INTO grab (shop) VALUES ('tenant-1')").unwrap();

    // With the right, the claim works as documented, and the scopes it
    // makes count against the role's cap (2 here).
    admin
        .batch_execute(
            "GRANT EXECUTE ON FUNCTION pgticket.advance_scoped_id(text, text, bigint), pgticket.advance_ticket(text, text, bigint) TO importer",
        )
        .unwrap();
    let mut importer = c.connect_as("importer", "advance_right");
    importer
        .batch_execute(
            "CREATE TEMP TABLE imp (shop text, no bigint);
             SELECT number_rows('pg_temp.imp', 'no', 'shop', domain => 'invoice', kind => 'ticket', on_explicit => 'advance');
             INSERT INTO imp VALUES ('imp-1', 500), ('imp-2', 600);",
        )
        .unwrap();
    assert!(one(&mut admin, "SELECT next_ticket('imp-1', 'invoice')") > 500);
    let e = importer.batch_execute("INSERT INTO imp SELECT 'many-' || g, 100 FROM generate_series(1, 5000) g").unwrap_err();
    assert_eq!(sqlstate(&e), "53400", "{e:?}");
    let made: i64 = one(&mut admin, "SELECT count(*) FROM pgticket.tickets WHERE queue LIKE 'many-%'");
    assert_eq!(made, 0, "a refused INSERT makes no scope");
}

/// `EXPLAIN ANALYZE` of `pgticket.marks` under `cond` (`$probe$` replaced
/// by `probe`), without timings or buffers, the probe taken out again.
fn explained(client: &mut Client, cond: &str, probe: &str) -> String {
    let sql = format!(
        "EXPLAIN (ANALYZE, TIMING OFF, COSTS OFF, SUMMARY OFF, BUFFERS OFF) SELECT * FROM pgticket.marks WHERE {}",
        cond.replace("$probe$", probe)
    );
    let lines: Vec<String> = client.query(&sql, &[]).unwrap().iter().map(|r| r.get::<_, String>(0)).collect();
    lines.join("\n").replace(probe, "<probe>")
}

/// #46 item 3: with `scope_rights = on`, 0.4.0's security-barrier view let
/// a caller's leakproof condition into the tables' index scans ahead of
/// the rights filter, and `EXPLAIN ANALYZE` printed how many rows of other
/// roles' scopes it removed: 1 160 EXPLAINs recovered every series name of
/// another shop. Now whatever a role asks of `pgticket.marks`, the answer
/// (rows and plan alike) is the same whether another role's scope of that
/// name exists or not.
#[test]
fn another_roles_scope_names_are_not_observable_through_the_marks() {
    let c = cluster();
    let mut admin = db(c, "marks_leak");
    admin
        .batch_execute(
            "ALTER DATABASE marks_leak SET pg_ticket.scope_rights = on;
             SELECT next_scoped_id('shop-7', 'secret-series-' || g) FROM generate_series(1, 5) g;
             SELECT * FROM reserve_block('shop-7-block', 3);
             SELECT next_ticket('shop-7', 'secret-tickets');
             SELECT next_scoped_id('tenant', 'own');
             SELECT pgticket.grant_scope('tenant', 'tenant');",
        )
        .unwrap();
    let mut tenant = c.connect_as("tenant", "marks_leak");
    let seen: Vec<String> =
        tenant.query("SELECT kind || ':' || coalesce(queue, block_name) FROM pgticket.marks ORDER BY 1", &[]).unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(seen, vec!["scoped_id:tenant".to_string()]);
    let conditions = [
        "queue = '$probe$'",
        "queue >= '$probe$' AND queue < '$probe$~'",
        "domain = '$probe$'",
        "block_name = '$probe$'",
        "(queue, domain) = ('$probe$', '$probe$')",
        "queue LIKE '$probe$%'",
    ];
    for cond in conditions {
        for (present, absent) in [("shop-7", "shop-8"), ("secret-series-1", "secret-series-9"), ("shop-7-block", "shop-9-block"), ("secret-tickets", "secret-ticketz")] {
            let a = explained(&mut tenant, cond, present);
            let b = explained(&mut tenant, cond, absent);
            assert_eq!(a, b, "{cond}: a name of another role's ({present}) shows against one that does not exist ({absent})");
        }
    }
}
