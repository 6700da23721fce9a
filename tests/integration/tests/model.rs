//! Randomized interleavings checked against a model, and privileges seen
//! from a real login role.

use pg_ticket_integration::{shared_cluster, sqlstate, Cluster};
use postgres::{Client, NoTls};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;

fn cluster() -> &'static Cluster {
    // Random lock orders deadlock now and then; find them quickly.
    shared_cluster("model", 55448, &["synchronous_commit = off", "deadlock_timeout = '20ms'"])
}

const SCOPES: [&str; 3] = ["a", "b", "c"];

/// One client's random transactions: begin, allocate from random scopes,
/// savepoint, rollback to or release a savepoint, then commit or roll
/// back. Returns the (scope, value) pairs the model says were committed.
fn random_client(c: &Cluster, seed: u64, transactions: usize) -> (Vec<(usize, i64)>, usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut client = c.connect();
    let mut committed = Vec::new();
    let mut aborted_by_server = 0;
    for _ in 0..transactions {
        // frames[0]: the transaction; frames[i]: taken since savepoint s{i}.
        let mut frames: Vec<Vec<(usize, i64)>> = vec![Vec::new()];
        client.batch_execute("BEGIN").unwrap();
        let outcome = (|| -> Result<bool, postgres::Error> {
            for _ in 0..rng.gen_range(1..=8) {
                match rng.gen_range(0..10) {
                    0..=4 => {
                        let k = rng.gen_range(0..SCOPES.len());
                        let v: i64 = client.query_one("SELECT next_scoped_id('model', $1)", &[&SCOPES[k]])?.get(0);
                        frames.last_mut().unwrap().push((k, v));
                    }
                    5..=6 => {
                        client.batch_execute(&format!("SAVEPOINT s{}", frames.len()))?;
                        frames.push(Vec::new());
                    }
                    7..=8 if frames.len() > 1 => {
                        let j = rng.gen_range(1..frames.len());
                        client.batch_execute(&format!("ROLLBACK TO SAVEPOINT s{j}"))?;
                        frames.truncate(j + 1);
                        frames[j].clear();
                    }
                    9 if frames.len() > 1 => {
                        let j = rng.gen_range(1..frames.len());
                        client.batch_execute(&format!("RELEASE SAVEPOINT s{j}"))?;
                        let released: Vec<_> = frames.drain(j..).flatten().collect();
                        frames[j - 1].extend(released);
                    }
                    _ => {}
                }
            }
            let commit = rng.gen_bool(0.7);
            client.batch_execute(if commit { "COMMIT" } else { "ROLLBACK" })?;
            Ok(commit)
        })();
        match outcome {
            Ok(true) => committed.extend(frames.into_iter().flatten()),
            Ok(false) => {}
            Err(e) => {
                // A deadlock victim: the whole transaction is gone.
                assert_eq!(sqlstate(&e), "40P01", "unexpected error: {e}");
                aborted_by_server += 1;
                client.batch_execute("ROLLBACK").unwrap();
            }
        }
    }
    (committed, aborted_by_server)
}

#[test]
fn random_savepoint_interleavings_commit_exactly_1_to_n_per_scope() {
    let c = cluster();
    let results: Vec<(Vec<(usize, i64)>, usize)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4u64).map(|seed| s.spawn(move || random_client(c, 1000 + seed, 250))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut per_scope: BTreeMap<usize, Vec<i64>> = BTreeMap::new();
    let mut deadlocks = 0;
    for (committed, aborted) in results {
        deadlocks += aborted;
        for (k, v) in committed {
            per_scope.entry(k).or_default().push(v);
        }
    }
    let mut check = c.connect();
    for (k, values) in per_scope.iter_mut() {
        values.sort_unstable();
        let n = values.len() as i64;
        assert_eq!(*values, (1..=n).collect::<Vec<_>>(), "scope {}: committed values must be exactly 1..N", SCOPES[*k]);
        let mark: i64 = check.query_one("SELECT current_scoped_id('model', $1)", &[&SCOPES[*k]]).unwrap().get(0);
        assert_eq!(mark, n, "scope {}: the stored mark is the last committed value", SCOPES[*k]);
    }
    println!(
        "committed per scope: {:?}; deadlock victims: {deadlocks}",
        per_scope.iter().map(|(k, v)| (SCOPES[*k], v.len())).collect::<Vec<_>>()
    );
}

#[test]
fn a_login_role_allocates_but_cannot_touch_state_or_admin_functions() {
    let c = cluster();
    c.connect()
        .batch_execute("DROP ROLE IF EXISTS app; CREATE ROLE app LOGIN; CREATE SCHEMA app_owned AUTHORIZATION app")
        .unwrap();
    let mut app = Client::connect(&c.dsn().replace("user=postgres", "user=app"), NoTls).unwrap();
    assert_eq!(app.query_one("SELECT next_scoped_id('priv', 'x')", &[]).unwrap().get::<_, i64>(0), 1);
    assert_eq!(app.query_one("SELECT first_id FROM reserve_block('priv', 5)", &[]).unwrap().get::<_, i64>(0), 1);
    for stmt in [
        "INSERT INTO pgticket.scoped_counters VALUES ('priv', 'y', 99)",
        "UPDATE pgticket.scoped_counters SET mark = 0 WHERE queue = 'priv'",
        "DELETE FROM pgticket.blocks WHERE name = 'priv'",
        "TRUNCATE pgticket.blocks",
        "SELECT pgticket.advance_scoped_id('priv', 'x', 100)",
        "SELECT pgticket.advance_block('priv', 100)",
    ] {
        let err = app.batch_execute(stmt).unwrap_err();
        assert_eq!(sqlstate(&err), "42501", "{stmt}: {err}");
    }
    // An object planted in a schema the role controls, first on its path,
    // shadowing what the extension's statements use.
    app.batch_execute(
        "CREATE TABLE app_owned.scoped_counters (queue text, domain text, mark bigint);
         CREATE FUNCTION app_owned.evil_eq(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';
         CREATE OPERATOR app_owned.= (LEFTARG = text, RIGHTARG = text, FUNCTION = app_owned.evil_eq);
         SET search_path = app_owned, pg_catalog, public",
    )
    .unwrap();
    assert_eq!(app.query_one("SELECT public.next_scoped_id('priv', 'x')", &[]).unwrap().get::<_, i64>(0), 2);
    assert_eq!(app.query_one("SELECT public.next_scoped_id('priv', 'other')", &[]).unwrap().get::<_, i64>(0), 1);
    assert_eq!(app.query_one("SELECT count(*) FROM app_owned.scoped_counters", &[]).unwrap().get::<_, i64>(0), 0);

    // An admin may hand the admin functions to a role explicitly.
    c.connect().batch_execute("GRANT EXECUTE ON FUNCTION pgticket.advance_scoped_id(text, text, bigint) TO app").unwrap();
    assert_eq!(app.query_one("SELECT pgticket.advance_scoped_id('priv', 'x', 100)", &[]).unwrap().get::<_, i64>(0), 100);
}
