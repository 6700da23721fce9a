//! Public IDs (#50, docs/public-ids.md): `pgticket.public_id(id, key)` and
//! `pgticket.private_id(form, key)` in SQL, against the vectors
//! `ticket_core::public_id` and the Python package share; keys made,
//! rotated and retired; grants per key; a form looked up by the primary
//! key's index; a dump and restore.

use pg_ticket_integration::{pg_tool, shared_cluster, sqlstate, Cluster};
use postgres::Client;

fn cluster() -> &'static Cluster {
    shared_cluster("public-ids", 55436, &[])
}

/// The vectors of `ticket_core::public_id` (key bytes 0..=31, version 1).
const VECTORS: &[(i64, &str)] = &[
    (0, "01AHN4TC7RHJWK0"),
    (1, "0G9P3KZK4JK77JC"),
    (2, "0F7VNYDRHB74GNS"),
    (42, "0F8R8BWDRQ5F6SB"),
    (1000000, "0QK1R1QA2MW62CA"),
    (i64::MAX, "0N1K0PTREZBAR34"),
    (-1, "011XZ2HEGG8ZSHS"),
    (i64::MIN, "05JNEXGYWDHWZ83"),
];

fn vectors_key(db: &mut Client) {
    db.batch_execute("INSERT INTO pgticket.public_keys (name, version, key) SELECT 'vectors', 1, decode(string_agg(lpad(to_hex(b), 2, '0'), '' ORDER BY b), 'hex') FROM generate_series(0, 31) b")
        .unwrap();
}

fn code(result: Result<postgres::Row, postgres::Error>) -> String {
    sqlstate(&result.expect_err("refused"))
}

#[test]
fn forms_match_the_shared_vectors_and_round_trip_over_the_whole_range() {
    let mut db = cluster().fresh_db("pid_vectors");
    vectors_key(&mut db);
    for (id, form) in VECTORS {
        let got: String = db.query_one("SELECT pgticket.public_id($1, 'vectors')", &[id]).unwrap().get(0);
        assert_eq!(&got, form, "public_id({id})");
        // As people copy it: lower case, hyphens, I/L for 1, O for 0.
        let typed = form.to_lowercase().replace('1', "l").replace('0', "o");
        let typed = format!("{}-{}-{}", &typed[..5], &typed[5..10], &typed[10..]);
        let back: i64 = db.query_one("SELECT pgticket.private_id($1, 'vectors')", &[&typed]).unwrap().get(0);
        assert_eq!(back, *id, "private_id({typed})");
    }
    db.batch_execute("SELECT pgticket.create_public_key('k')").unwrap();
    let wrong: i64 = db
        .query_one(
            "SELECT count(*) FROM (SELECT i FROM generate_series(-9223372036854775808, -9223372036854765808) i
                                    UNION ALL SELECT i FROM generate_series(9223372036854765807, 9223372036854775807) i
                                    UNION ALL SELECT i FROM generate_series(-5000, 5000) i
                                    UNION ALL SELECT (random() * 1.8e19 - 9e18)::bigint FROM generate_series(1, 20000)) t
              WHERE pgticket.private_id(pgticket.public_id(i, 'k'), 'k') IS DISTINCT FROM i",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(wrong, 0);
    let (forms, distinct): (i64, i64) = {
        let r = db.query_one("SELECT count(*), count(DISTINCT pgticket.public_id(i, 'k')) FROM generate_series(1, 50000) i", &[]).unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(forms, distinct, "a permutation");
    let null: Option<String> = db.query_one("SELECT pgticket.public_id(NULL, 'k')", &[]).unwrap().get(0);
    assert_eq!(null, None);
}

#[test]
fn a_mistyped_a_forged_or_another_keys_form_is_refused_not_read_as_another_id() {
    let mut db = cluster().fresh_db("pid_refused");
    db.batch_execute("SELECT pgticket.create_public_key('a'), pgticket.create_public_key('b')").unwrap();
    let form: String = db.query_one("SELECT pgticket.public_id(123456789, 'a')", &[]).unwrap().get(0);
    const ALPHABET: &str = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    let mut changed = 0;
    for i in 0..form.len() {
        for c in ALPHABET.chars().filter(|c| *c != form.as_bytes()[i] as char) {
            let typo = format!("{}{c}{}", &form[..i], &form[i + 1..]);
            assert_eq!(code(db.query_one("SELECT pgticket.private_id($1, 'a')", &[&typo])), "22P02", "{typo}");
            changed += 1;
        }
    }
    assert_eq!(changed, 15 * 31, "every one-character change, the check character's forgeries among them");
    for bad in ["", "0", &form[..14], &format!("{form}0"), "01AHN4TC7RHJWK!", "01AHN4TC7RHJWKU"] {
        assert_eq!(code(db.query_one("SELECT pgticket.private_id($1, 'a')", &[&bad])), "22P02", "{bad:?}");
    }
    // Another key's forms: refused but for about 1 in 64, which decodes to
    // an unrelated ID.
    let rows = db
        .query("SELECT i, pgticket.public_id(i, 'a') FROM generate_series(1, 640::bigint) i", &[])
        .unwrap();
    let mut read = 0;
    for row in rows {
        let (id, form): (i64, String) = (row.get(0), row.get(1));
        match db.query_one("SELECT pgticket.private_id($1, 'b')", &[&form]) {
            Ok(r) => {
                read += 1;
                assert_ne!(r.get::<_, i64>(0), id, "another key never gives the ID back");
            }
            Err(e) => assert_eq!(sqlstate(&e), "22P02"),
        }
    }
    assert!(read < 40, "another key's forms refused but for about 1 in 64: {read} of 640 read");
    assert_eq!(code(db.query_one("SELECT pgticket.public_id(1, 'missing')", &[])), "42704");
    assert_eq!(code(db.query_one("SELECT pgticket.private_id('01AHN4TC7RHJWK0', 'missing')", &[])), "42704");
    assert_eq!(code(db.query_one("SELECT pgticket.public_id(1, '')", &[])), "22023");
}

#[test]
fn a_rotated_key_decodes_old_forms_until_their_version_is_retired() {
    let mut db = cluster().fresh_db("pid_rotate");
    let v: i32 = db.query_one("SELECT pgticket.create_public_key('r')", &[]).unwrap().get(0);
    assert_eq!(v, 1);
    let old: String = db.query_one("SELECT pgticket.public_id(42, 'r')", &[]).unwrap().get(0);
    let v: i32 = db.query_one("SELECT pgticket.create_public_key('r')", &[]).unwrap().get(0);
    assert_eq!(v, 2);
    let new: String = db.query_one("SELECT pgticket.public_id(42, 'r')", &[]).unwrap().get(0);
    assert_ne!(old, new);
    assert!(old.starts_with('0') && new.starts_with('1'), "the version's slot leads: {old} {new}");
    for form in [&old, &new] {
        let id: i64 = db.query_one("SELECT pgticket.private_id($1, 'r')", &[form]).unwrap().get(0);
        assert_eq!(id, 42);
    }
    let retired: bool = db.query_one("SELECT pgticket.retire_public_key('r', 1)", &[]).unwrap().get(0);
    assert!(retired);
    assert_eq!(code(db.query_one("SELECT pgticket.private_id($1, 'r')", &[&old])), "22P02", "a retired version decodes nothing");
    let id: i64 = db.query_one("SELECT pgticket.private_id($1, 'r')", &[&new]).unwrap().get(0);
    assert_eq!(id, 42);
    // At most 32 live versions (their forms' slots): 3..=33 fill them.
    for want in 3..=33 {
        let v: i32 = db.query_one("SELECT pgticket.create_public_key('r')", &[]).unwrap().get(0);
        assert_eq!(v, want);
    }
    assert_eq!(code(db.query_one("SELECT pgticket.create_public_key('r')", &[])), "22023", "version 34 shares version 2's slot");
    db.batch_execute("SELECT pgticket.retire_public_key('r', 2)").unwrap();
    let v: i32 = db.query_one("SELECT pgticket.create_public_key('r')", &[]).unwrap().get(0);
    assert_eq!(v, 34);
    let newest: String = db.query_one("SELECT pgticket.public_id(42, 'r')", &[]).unwrap().get(0);
    assert!(newest.starts_with('1'), "{newest}");
    assert_eq!(code(db.query_one("SELECT pgticket.private_id($1, 'r')", &[&new])), "22P02", "version 2's form, its slot now version 34's");
    db.batch_execute("UPDATE pgticket.public_keys SET retired_at = now() WHERE name = 'r'").unwrap();
    let err = db.query_one("SELECT pgticket.public_id(42, 'r')", &[]).expect_err("every version retired");
    assert_eq!(sqlstate(&err), "42704");
    assert!(err.as_db_error().unwrap().message().contains("every version of it is retired"), "{err:?}");
}

#[test]
fn a_key_is_used_only_by_the_roles_granted_it() {
    let c = cluster();
    let mut db = c.fresh_db("pid_rights");
    c.connect().batch_execute("DROP ROLE IF EXISTS pid_app; CREATE ROLE pid_app LOGIN").unwrap();
    db.batch_execute("SELECT pgticket.create_public_key('receipts'), pgticket.create_public_key('payroll')").unwrap();
    let form: String = db.query_one("SELECT pgticket.public_id(7, 'receipts')", &[]).unwrap().get(0);
    let mut app = c.connect_as("pid_app", "pid_rights");
    let err = app.query_one("SELECT pgticket.public_id(7, 'receipts')", &[]).expect_err("no grant");
    assert_eq!(sqlstate(&err), "42501");
    assert!(err.as_db_error().unwrap().hint().unwrap_or_default().contains("grant_public_key"), "{err:?}");
    assert_eq!(code(app.query_one("SELECT pgticket.private_id($1, 'receipts')", &[&form])), "42501");
    assert_eq!(code(app.query_one("SELECT pgticket.create_public_key('mine')", &[])), "42501", "making keys is an administrator's");
    assert_eq!(code(app.query_one("SELECT key FROM pgticket.public_keys", &[])), "42501", "the keys are the owner's to read");
    db.batch_execute("SELECT pgticket.grant_public_key('pid_app', 'receipts')").unwrap();
    let id: i64 = app.query_one("SELECT pgticket.private_id($1, 'receipts')", &[&form]).unwrap().get(0);
    assert_eq!(id, 7);
    assert_eq!(code(app.query_one("SELECT pgticket.public_id(7, 'payroll')", &[])), "42501", "one key's grant is not another's");
    let listed: String = db.query_one("SELECT public_key FROM pgticket.scope_grants WHERE role = 'pid_app'::regrole", &[]).unwrap().get(0);
    assert_eq!(listed, "receipts");
    db.batch_execute("SELECT pgticket.revoke_public_key('pid_app', 'receipts')").unwrap();
    assert_eq!(code(app.query_one("SELECT pgticket.public_id(7, 'receipts')", &[])), "42501", "a revoke reaches a session that used the key");
}

#[test]
fn a_form_is_looked_up_by_the_primary_key_and_survives_a_dump_and_restore() {
    let c = cluster();
    let mut db = c.fresh_db("pid_src");
    db.batch_execute(
        "SELECT pgticket.create_public_key('receipts');
         CREATE TABLE receipts (id bigint PRIMARY KEY, total numeric);
         INSERT INTO receipts SELECT i, i FROM generate_series(1, 100000) i;
         ANALYZE receipts",
    )
    .unwrap();
    let form: String = db.query_one("SELECT pgticket.public_id(31337, 'receipts')", &[]).unwrap().get(0);
    let plan: String = db
        .query("EXPLAIN SELECT total FROM receipts WHERE id = pgticket.private_id($1, 'receipts')", &[&form])
        .unwrap()
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(plan.contains("Index Scan using receipts_pkey"), "{plan}");
    let total: String = db.query_one("SELECT total::text FROM receipts WHERE id = pgticket.private_id($1, 'receipts')", &[&form]).unwrap().get(0);
    assert_eq!(total, "31337");

    let dump = c.dir.join("pid.dump");
    let (host, port) = (c.dir.to_str().unwrap().to_string(), c.port.to_string());
    let conn = ["-h", host.as_str(), "-p", port.as_str(), "-U", "postgres"];
    pg_tool("pg_dump", &[&conn[..], &["-Fc", "-f", dump.to_str().unwrap(), "pid_src"]].concat());
    let mut admin = c.connect();
    admin.batch_execute("DROP DATABASE IF EXISTS pid_copy WITH (FORCE)").unwrap();
    admin.batch_execute("CREATE DATABASE pid_copy").unwrap();
    pg_tool("pg_restore", &[&conn[..], &["-d", "pid_copy", dump.to_str().unwrap()]].concat());
    let mut copy = c.connect_as("postgres", "pid_copy");
    let id: i64 = copy.query_one("SELECT pgticket.private_id($1, 'receipts')", &[&form]).unwrap().get(0);
    assert_eq!(id, 31337, "the restored database reads the forms");
    // Restored into the database it came from: the key is there already.
    pg_tool("pg_restore", &[&conn[..], &["-a", "-t", "public_keys", "-n", "pgticket", "-d", "pid_src", dump.to_str().unwrap()]].concat());
    let versions: i64 = db.query_one("SELECT count(*) FROM pgticket.public_keys", &[]).unwrap().get(0);
    assert_eq!(versions, 1);
}


/// helper-12's review (#50), each failing on the previous commit: a
/// REPEATABLE READ session kept the versions its snapshot saw after a
/// retirement, for good; two REPEATABLE READ sessions making one key's
/// next version hit 23505; a key named with a `*` could not be granted
/// alone; a LATIN1 database's form outside UTF-8 was XX000.
#[test]
fn a_retirement_reaches_a_repeatable_read_session_and_odd_input_is_refused_plainly() {
    let c = cluster();
    let mut admin = c.fresh_db("pid_review");
    admin.batch_execute("SELECT pgticket.create_public_key('rr')").unwrap();
    let old: String = admin.query_one("SELECT pgticket.public_id(7, 'rr')", &[]).unwrap().get(0);
    admin.batch_execute("SELECT pgticket.create_public_key('rr'); CREATE TABLE touched (x int)").unwrap();
    let mut s1 = c.connect_as("postgres", "pid_review");
    s1.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ").unwrap();
    let id: i64 = s1.query_one("SELECT pgticket.private_id($1, 'rr')", &[&old]).unwrap().get(0);
    assert_eq!(id, 7);
    admin.batch_execute("SELECT pgticket.retire_public_key('rr', 1)").unwrap();
    // A new lock takes in the invalidation; the keys are read again.
    let _ = s1.query("SELECT count(*) FROM touched", &[]).unwrap();
    let _ = s1.query_one("SELECT pgticket.private_id($1, 'rr')", &[&old]);
    s1.batch_execute("ROLLBACK").unwrap();
    assert_eq!(code(s1.query_one("SELECT pgticket.private_id($1, 'rr')", &[&old])), "22P02", "the retirement reached the session");

    let mut s2 = c.connect_as("postgres", "pid_review");
    s2.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1").unwrap();
    admin.batch_execute("SELECT pgticket.create_public_key('both')").unwrap();
    let v: i32 = s2.query_one("SELECT pgticket.create_public_key('both')", &[]).unwrap().get(0);
    assert_eq!(v, 2, "the version made meanwhile is seen");
    s2.batch_execute("COMMIT").unwrap();

    assert_eq!(code(admin.query_one("SELECT pgticket.create_public_key('pay*')", &[])), "22023");

    let mut postgres = c.connect();
    postgres.batch_execute("DROP DATABASE IF EXISTS pid_latin1 WITH (FORCE)").unwrap();
    postgres.batch_execute("CREATE DATABASE pid_latin1 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0").unwrap();
    let mut latin1 = c.connect_as("postgres", "pid_latin1");
    latin1.batch_execute(&format!("{}; SELECT pgticket.create_public_key('k')", pg_ticket_integration::CREATE_EXTENSION)).unwrap();
    let err = latin1.query_one("SELECT pgticket.private_id(convert_from('\\xe9e9e9', 'LATIN1'), 'k')", &[]).expect_err("not a form");
    assert_eq!(sqlstate(&err), "22P02", "{err:?}");
}
