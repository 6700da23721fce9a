//! SPEC §18.1, §18.2 (#32 items 3, 4): the client's examples run as written
//! against a registry as the role docs/leases.md sets up (not its owner:
//! the view hides the token there, which the example once read as a
//! bigint and panicked), on a registry just created whose hold-off nobody
//! ends: the refusal names when it grants again and the call that ends the
//! wait, and the example's generator gets its lease when the hold-off
//! (55 s by default) is over, within its 90 s wait.

use pg_ticket_integration::{sqlstate, Cluster};

#[allow(dead_code)]
#[path = "../../../crates/ticket-client/examples/leased_ids.rs"]
mod leased_ids;

#[allow(dead_code)]
#[path = "../../../crates/ticket-client/examples/block_pool.rs"]
mod block_pool;

/// The role set-up of docs/leases.md, "Registry settings and privileges".
const DOCUMENTED_ROLES: &str = "
CREATE ROLE app LOGIN;
CREATE ROLE id_holders;
GRANT EXECUTE ON FUNCTION pgticket.lease_machine_id(text, interval),
                          pgticket.renew_machine_id(integer, bigint, text, interval, bigint),
                          pgticket.release_machine_id(integer, bigint, text, bigint) TO id_holders;
GRANT SELECT ON pgticket.machine_ids TO id_holders;
GRANT id_holders TO app;
";

#[test]
fn the_client_examples_run_as_the_documented_role_on_a_new_registry() {
    let c = Cluster::start("client-examples", 55633, &[]);
    c.connect().batch_execute("CREATE DATABASE ids").unwrap();
    let mut admin = c.connect_as("postgres", "ids");
    // A new registry, its hold-off left as it is.
    admin.batch_execute("CREATE EXTENSION pg_ticket").unwrap();
    admin.batch_execute(DOCUMENTED_ROLES).unwrap();

    let mut app = c.connect_as("app", "ids");
    let err = app.query_one("SELECT machine_id FROM pgticket.lease_machine_id('first-try')", &[]).unwrap_err();
    assert_eq!(sqlstate(&err), "55000", "{err}");
    let db_error = err.as_db_error().unwrap();
    let message = db_error.message();
    assert!(message.contains("grants again from") && message.contains(" UTC (in "), "a time and a duration: {message}");
    assert!(!message.contains(" ms "), "no raw milliseconds: {message}");
    let hint = db_error.hint().unwrap_or_default();
    assert!(hint.contains("SELECT pgticket.end_lease_hold_off()"), "the hint names the call: {hint}");

    let dsn = c.dsn_as("app", "ids");
    leased_ids::run(&dsn).expect("the leased_ids example, as the documented role");
    block_pool::run(&dsn).expect("the block_pool example, as an ordinary role");

    let states: Vec<String> = admin
        .query("SELECT state FROM pgticket.machine_ids WHERE holder LIKE 'example-%'", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(states, ["released"], "the example's lease, released on drop");
    let mark: i64 = admin.query_one("SELECT current_block_mark('example-orders')", &[]).unwrap().get(0);
    assert!(mark >= 10_005, "the pool's blocks were reserved: {mark}");
    c.stop();
}
