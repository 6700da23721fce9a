//! 0.1.0 → 0.2.0 → 0.3.0 → 0.4.0 → 0.5.0, and from each release between (SPEC §11): a database whose
//! extension was created at an older release keeps working on the current
//! library before it is updated, keeps every mark (and live lease) through
//! `ALTER EXTENSION pg_ticket UPDATE`, and ends with exactly the objects a
//! fresh `CREATE EXTENSION` makes. (The pg_regress suite on upgraded
//! databases is `UPGRADE_FROM=0.1.0|0.2.0|0.3.0|0.4.0 scripts/regress.sh`, run by
//! `make test`.)

use pg_ticket_integration::{shared_cluster, sqlstate};
use postgres::Client;

/// Every object of the extension as one line of text each, with what an
/// upgrade could get wrong: signatures, volatility, strictness, security,
/// parallel safety, settings and grants of functions; tables, columns,
/// defaults, collations, indexes, constraints, views, grants, comments;
/// the config-dump registrations; the extension's own row.
const OBJECTS: &str = r#"
WITH ext AS (SELECT oid FROM pg_extension WHERE extname = 'pg_ticket'),
members AS (
    SELECT d.classid, d.objid FROM pg_depend d, ext
     WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e'),
rels AS (SELECT c.* FROM pg_class c WHERE c.relnamespace = 'pgticket'::regnamespace)
SELECT 'member ' || pg_describe_object(classid, objid, 0) FROM members
UNION ALL
SELECT format('function %s(%s) returns %s kind=%s volatile=%s strict=%s secdef=%s leakproof=%s parallel=%s cost=%s rows=%s config=%s acl=%s language=%s symbol=%s comment=%s',
              p.proname, pg_get_function_identity_arguments(p.oid), pg_get_function_result(p.oid), p.prokind,
              p.provolatile, p.proisstrict, p.prosecdef, p.proleakproof, p.proparallel, p.procost, p.prorows,
              p.proconfig, p.proacl, l.lanname, p.prosrc, obj_description(p.oid, 'pg_proc'))
  FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
  JOIN members m ON m.classid = 'pg_proc'::regclass AND m.objid = p.oid
UNION ALL
SELECT format('relation %s kind=%s acl=%s persistence=%s comment=%s', c.oid::regclass, c.relkind, c.relacl,
              c.relpersistence, obj_description(c.oid, 'pg_class'))
  FROM rels c
UNION ALL
SELECT format('column %s.%s %s notnull=%s collation=%s default=%s', c.oid::regclass, a.attname,
              format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attcollation::regcollation, pg_get_expr(ad.adbin, ad.adrelid))
  FROM rels c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
  LEFT JOIN pg_attrdef ad ON ad.adrelid = c.oid AND ad.adnum = a.attnum
UNION ALL
SELECT 'index ' || pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN rels c ON c.oid = i.indrelid
UNION ALL
SELECT format('constraint %s on %s: %s', co.conname, co.conrelid::regclass, pg_get_constraintdef(co.oid))
  FROM pg_constraint co JOIN rels c ON c.oid = co.conrelid
UNION ALL
SELECT format('trigger %s enabled=%s', pg_get_triggerdef(t.oid), t.tgenabled)
  FROM pg_trigger t JOIN rels c ON c.oid = t.tgrelid WHERE NOT t.tgisinternal
UNION ALL
SELECT format('view %s: %s', c.oid::regclass, pg_get_viewdef(c.oid)) FROM rels c WHERE c.relkind = 'v'
UNION ALL
SELECT format('schema %s acl=%s comment=%s', n.nspname, n.nspacl, obj_description(n.oid, 'pg_namespace'))
  FROM pg_namespace n WHERE n.nspname = 'pgticket'
UNION ALL
SELECT format('config dump %s where %L', u.cfg::regclass, u.cond)
  FROM pg_extension e, unnest(e.extconfig, e.extcondition) AS u(cfg, cond) WHERE e.extname = 'pg_ticket'
UNION ALL
SELECT format('extension version=%s relocatable=%s schema=%s', extversion, extrelocatable, extnamespace::regnamespace)
  FROM pg_extension WHERE extname = 'pg_ticket'
ORDER BY 1
"#;

fn objects(client: &mut Client) -> Vec<String> {
    client.query(OBJECTS, &[]).unwrap().iter().map(|r| r.get(0)).collect()
}

/// The extension's version: the root package's (this crate has its own).
fn current() -> String {
    include_str!("../../../Cargo.toml")
        .lines()
        .find_map(|line| line.strip_prefix("version = \""))
        .map(|v| v.trim_end_matches('"').to_string())
        .expect("the root Cargo.toml has a version")
}

/// The upgraded database has exactly the objects of the fresh one.
fn assert_same_objects(upgraded_db: &mut Client, fresh_db: &mut Client) {
    let (upgraded, fresh) = (objects(upgraded_db), objects(fresh_db));
    assert!(fresh.len() > 20, "the comparison sees the objects: {fresh:#?}");
    assert!(fresh.iter().any(|o| o.starts_with("trigger ")), "the comparison sees the triggers: {fresh:#?}");
    let only_upgraded: Vec<_> = upgraded.iter().filter(|o| !fresh.contains(o)).collect();
    let only_fresh: Vec<_> = fresh.iter().filter(|o| !upgraded.contains(o)).collect();
    assert!(
        only_upgraded.is_empty() && only_fresh.is_empty(),
        "the upgraded database differs from a fresh {}:\nonly upgraded: {only_upgraded:#?}\nonly fresh: {only_fresh:#?}",
        current()
    );
    assert_eq!(upgraded, fresh);
}

fn one(client: &mut Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).unwrap_or_else(|e| panic!("{sql}: {e}")).get(0)
}

#[test]
fn an_upgrade_from_0_1_0_keeps_every_mark_and_ends_as_a_fresh_install() {
    let c = shared_cluster("upgrade", 55435, &[]);
    let mut admin = c.connect();
    admin.batch_execute("CREATE DATABASE upgraded").unwrap();
    admin.batch_execute("CREATE DATABASE fresh").unwrap();
    let started: String = admin.query_one("SELECT pg_postmaster_start_time()::text", &[]).unwrap().get(0);

    // 0.1.0 objects on the current library: every function works.
    let mut old = c.connect_as("postgres", "upgraded");
    old.batch_execute("CREATE EXTENSION pg_ticket VERSION '0.1.0'").unwrap();
    assert_eq!(old.query_one("SELECT extversion FROM pg_extension WHERE extname = 'pg_ticket'", &[]).unwrap().get::<_, String>(0), "0.1.0");
    assert_eq!(one(&mut old, "SELECT next_scoped_id('up', 'd')"), 1);
    assert_eq!(one(&mut old, "SELECT next_scoped_id('up', 'd')"), 2);
    assert_eq!(one(&mut old, "SELECT last_id FROM reserve_block('up', 10)"), 10);
    // 0.1.0's names, before the update (0.4.0 moves and renames them).
    assert_eq!(one(&mut old, "SELECT advance_scoped_id('imported', 'd', 500)"), 500);
    assert_eq!(one(&mut old, "SELECT advance_block_mark('imported', 70)"), 70);
    assert_eq!(one(&mut old, "SELECT current_scoped_id('up', 'd')"), 2);
    assert_eq!(one(&mut old, "SELECT current_block_mark('up')"), 10);
    let flake = one(&mut old, "SELECT snowflake_id()");
    let machine: i32 = old.query_one("SELECT machine_id FROM snowflake_decode($1)", &[&flake]).unwrap().get(0);
    assert_eq!(machine, 0);
    // 0.4.0 names the kinds of allocator scoped_id, ticket and block.
    let before: Vec<(String, i64)> = old
        .query("SELECT replace(kind, 'scope', 'scoped_id') || ':' || coalesce(queue, block_name), mark FROM pgticket.marks ORDER BY 1", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();

    old.batch_execute("ALTER EXTENSION pg_ticket UPDATE").unwrap();
    assert_eq!(old.query_one("SELECT extversion FROM pg_extension WHERE extname = 'pg_ticket'", &[]).unwrap().get::<_, String>(0), current());
    let after: Vec<(String, i64)> =
        old.query("SELECT kind || ':' || coalesce(queue, block_name), mark FROM pgticket.marks ORDER BY 1", &[]).unwrap().iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(after, before, "every mark kept");
    assert_eq!(one(&mut old, "SELECT next_scoped_id('up', 'd')"), 3, "counting continues");
    assert_eq!(one(&mut old, "SELECT first_id FROM reserve_block('up', 5)"), 11);
    assert_eq!(one(&mut old, "SELECT next_scoped_id('imported', 'd')"), 501);
    assert!(one(&mut old, "SELECT snowflake_id()") > flake);

    let mut new = c.connect_as("postgres", "fresh");
    new.batch_execute("CREATE EXTENSION pg_ticket").unwrap();
    assert_same_objects(&mut old, &mut new);

    // A backend crash would have reset every connection, this one included.
    let now: String = admin.query_one("SELECT pg_postmaster_start_time()::text", &[]).expect("no backend crashed").get(0);
    assert_eq!(now, started, "the server was not restarted");
}

#[test]
fn an_upgrade_from_0_2_0_keeps_marks_tickets_and_live_leases_and_ends_as_a_fresh_install() {
    let c = shared_cluster("upgrade", 55435, &[]);
    let mut admin = c.connect();
    admin.batch_execute("CREATE DATABASE upgraded_020").unwrap();
    admin.batch_execute("CREATE DATABASE fresh_030").unwrap();
    let mut old = c.connect_as("postgres", "upgraded_020");
    old.batch_execute("CREATE EXTENSION pg_ticket VERSION '0.2.0'").unwrap();
    assert_eq!(one(&mut old, "SELECT next_scoped_id('up2', 'd')"), 1);
    assert_eq!(one(&mut old, "SELECT last_id FROM reserve_block('up2', 10)"), 10);
    let ticket = one(&mut old, "SELECT next_ticket('up2', 'd')");
    // 0.2.0's lease functions on this library are refused until the update:
    // their leases would have no secret.
    let err = old.query_one("SELECT machine_id FROM lease_machine_id('upgrade-holder', '30 seconds')", &[]).unwrap_err();
    assert_eq!(sqlstate(&err), "55000");
    assert!(err.as_db_error().unwrap().message().contains("ALTER EXTENSION pg_ticket UPDATE"), "{err}");
    // A lease 0.2.0 granted (before its library was replaced), as it left it.
    let (id, token): (i32, i64) = old
        .query_one(
            "INSERT INTO pgticket.machine_id_leases (machine_id, holder, lease, leased_at, expires_at, not_before_ms)
             VALUES (5, 'upgrade-holder', nextval('pgticket.lease_tokens'), now(), now() + interval '10 minutes', 0)
             RETURNING machine_id, lease",
            &[],
        )
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();

    old.batch_execute("ALTER EXTENSION pg_ticket UPDATE").unwrap();
    assert_eq!(old.query_one("SELECT extversion FROM pg_extension WHERE extname = 'pg_ticket'", &[]).unwrap().get::<_, String>(0), current());
    assert_eq!(one(&mut old, "SELECT next_scoped_id('up2', 'd')"), 2, "counting continues");
    assert_eq!(one(&mut old, "SELECT first_id FROM reserve_block('up2', 5)"), 11);
    assert!(one(&mut old, "SELECT next_ticket('up2', 'd')") > ticket);
    // The live lease is kept, holds its id to its end, and is not renewed
    // (no secret proves its holder); the updated registry holds off once.
    let err = old.query_one("SELECT pgticket.renew_machine_id($1, $2, $3, '30 seconds')", &[&id, &token, &"0".repeat(32)]).unwrap_err();
    assert_eq!(sqlstate(&err), "55000");
    assert!(err.as_db_error().unwrap().message().contains("without a secret"), "{err}");
    let state: String = old.query_one("SELECT state FROM pgticket.machine_ids WHERE machine_id = $1", &[&id]).unwrap().get(0);
    assert_eq!(state, "held");
    let err = old.query_one("SELECT machine_id FROM pgticket.lease_machine_id('after-update', '30 seconds')", &[]).unwrap_err();
    assert!(err.as_db_error().unwrap().message().contains("grants again from"), "{err}");

    let mut new = c.connect_as("postgres", "fresh_030");
    new.batch_execute("CREATE EXTENSION pg_ticket").unwrap();
    assert_same_objects(&mut old, &mut new);
}

#[test]
fn an_upgrade_from_0_3_0_keeps_marks_tickets_and_live_leases_and_ends_as_a_fresh_install() {
    let c = shared_cluster("upgrade", 55435, &[]);
    let mut admin = c.connect();
    admin.batch_execute("CREATE DATABASE upgraded_030").unwrap();
    admin.batch_execute("CREATE DATABASE fresh_040").unwrap();
    let mut old = c.connect_as("postgres", "upgraded_030");
    old.batch_execute("CREATE EXTENSION pg_ticket VERSION '0.3.0'").unwrap();
    assert_eq!(one(&mut old, "SELECT next_scoped_id('up3', 'd')"), 1);
    assert_eq!(one(&mut old, "SELECT last_id FROM reserve_block('up3', 10)"), 10);
    let ticket = one(&mut old, "SELECT next_ticket('up3', 'd')");
    let flake = one(&mut old, "SELECT snowflake_id()");
    // A live lease with its secret, granted by 0.3.0's functions (0.3.0's
    // names, before the update).
    old.batch_execute("SELECT end_lease_hold_off()").unwrap();
    let (id, token, secret): (i32, i64, String) = old
        .query_one("SELECT machine_id, lease, secret FROM lease_machine_id('upgrade-holder', '30 seconds')", &[])
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .unwrap();

    old.batch_execute("ALTER EXTENSION pg_ticket UPDATE").unwrap();
    assert_eq!(old.query_one("SELECT extversion FROM pg_extension WHERE extname = 'pg_ticket'", &[]).unwrap().get::<_, String>(0), current());
    assert_eq!(one(&mut old, "SELECT next_scoped_id('up3', 'd')"), 2, "counting continues");
    assert_eq!(one(&mut old, "SELECT first_id FROM reserve_block('up3', 5)"), 11);
    assert!(one(&mut old, "SELECT next_ticket('up3', 'd')") > ticket);
    assert!(one(&mut old, "SELECT snowflake_id()") > flake);
    // The live lease is kept and its holder renews it with its secret.
    old.query_one("SELECT pgticket.renew_machine_id($1, $2, $3, '30 seconds')", &[&id, &token, &secret]).unwrap();
    let state: String = old.query_one("SELECT state FROM pgticket.machine_ids WHERE machine_id = $1", &[&id]).unwrap().get(0);
    assert_eq!(state, "held");

    let mut new = c.connect_as("postgres", "fresh_040");
    new.batch_execute("CREATE EXTENSION pg_ticket").unwrap();
    assert_same_objects(&mut old, &mut new);
}

#[test]
fn an_upgrade_from_0_4_0_keeps_marks_tickets_and_live_leases_and_ends_as_a_fresh_install() {
    let c = shared_cluster("upgrade", 55435, &[]);
    let mut admin = c.connect();
    admin.batch_execute("CREATE DATABASE upgraded_040").unwrap();
    admin.batch_execute("CREATE DATABASE fresh_050").unwrap();
    let mut old = c.connect_as("postgres", "upgraded_040");
    old.batch_execute("CREATE EXTENSION pg_ticket VERSION '0.4.0'").unwrap();
    assert_eq!(one(&mut old, "SELECT next_scoped_id('up4', 'd')"), 1);
    assert_eq!(one(&mut old, "SELECT last_id FROM reserve_block('up4', 10)"), 10);
    let ticket = one(&mut old, "SELECT next_ticket('up4', 'd')");
    let flake = one(&mut old, "SELECT snowflake_id()");
    old.batch_execute("SELECT pgticket.end_lease_hold_off()").unwrap();
    let (id, token, secret): (i32, i64, String) = old
        .query_one("SELECT machine_id, lease, secret FROM pgticket.lease_machine_id('upgrade-holder-4', '30 seconds')", &[])
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .unwrap();

    old.batch_execute("ALTER EXTENSION pg_ticket UPDATE").unwrap();
    assert_eq!(old.query_one("SELECT extversion FROM pg_extension WHERE extname = 'pg_ticket'", &[]).unwrap().get::<_, String>(0), current());
    assert_eq!(one(&mut old, "SELECT next_scoped_id('up4', 'd')"), 2, "counting continues");
    assert_eq!(one(&mut old, "SELECT first_id FROM reserve_block('up4', 5)"), 11);
    assert!(one(&mut old, "SELECT next_ticket('up4', 'd')") > ticket);
    assert!(one(&mut old, "SELECT snowflake_id()") > flake);
    old.query_one("SELECT pgticket.renew_machine_id($1, $2, $3, '30 seconds')", &[&id, &token, &secret]).unwrap();
    let state: String = old.query_one("SELECT state FROM pgticket.machine_ids WHERE machine_id = $1", &[&id]).unwrap().get(0);
    assert_eq!(state, "held");

    let mut new = c.connect_as("postgres", "fresh_050");
    new.batch_execute("CREATE EXTENSION pg_ticket").unwrap();
    assert_same_objects(&mut old, &mut new);
}

/// #32 review (helper 5): 0.3.0's number_rows() made `BEFORE INSERT`
/// triggers, which never see an UPDATE that sets the number — (s, 3) twice
/// after `UPDATE ... SET no = 3` and two more inserts. The update to 0.4.0
/// makes them `BEFORE INSERT OR UPDATE`, same name and arguments (scope
/// text kept: the series go on), and a trigger of 0.4.0's form made by hand
/// that does not fire on UPDATE is refused at its first row.
#[test]
fn triggers_made_by_0_3_0_check_updates_after_the_update() {
    let c = shared_cluster("upgrade", 55435, &[]);
    c.connect().batch_execute("CREATE DATABASE triggers_030").unwrap();
    let mut db = c.connect_as("postgres", "triggers_030");
    // One statement at a time: a batch is one transaction, and the ticket
    // worker must see the extension committed.
    db.batch_execute("CREATE EXTENSION pg_ticket VERSION '0.3.0'").unwrap();
    db.batch_execute(
        "CREATE TABLE lg (shop numeric, no bigint);
         SELECT number_rows('lg', 'no', 'shop', domain => 'lg');
         CREATE TABLE lt (shop text, no bigint);
         SELECT number_rows('lt', 'no', 'shop', domain => 'lt', allocator => 'ticket');
         INSERT INTO lg (shop) VALUES (17), (17.0), (17);",
    )
    .unwrap();
    db.batch_execute("INSERT INTO lt (shop) VALUES ('a'), ('a')").unwrap();
    db.batch_execute("ALTER EXTENSION pg_ticket UPDATE").unwrap();
    for (table, update) in [("lg", "UPDATE lg SET no = 3 WHERE no = 1 AND shop::text = '17'"), ("lt", "UPDATE lt SET no = 3 WHERE no = 1")] {
        let err = db.execute(update, &[]).expect_err("an UPDATE that sets the number is checked");
        assert_eq!(sqlstate(&err), "428C9", "{table}: {err}");
        let def: String = db
            .query_one("SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = $1::text::regclass AND NOT tgisinternal", &[&table])
            .unwrap()
            .get(0);
        assert!(def.contains("BEFORE INSERT OR UPDATE ON"), "{def}");
    }
    // 0.3.0's scope text kept: 17 and 17.0 stay two series, and go on.
    let next: Vec<i64> = db.query("INSERT INTO lg (shop) VALUES (17), (17.0) RETURNING no", &[]).unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(next, [3, 2]);
    db.batch_execute("CREATE TABLE hand (shop text, no bigint); CREATE TRIGGER hand BEFORE INSERT ON hand FOR EACH ROW EXECUTE FUNCTION assign_scoped_id('no', 'shop', 'hand', 'on_explicit=refuse')").unwrap();
    let err = db.execute("INSERT INTO hand (shop) VALUES ('s')", &[]).expect_err("a trigger blind to UPDATE");
    assert_eq!(sqlstate(&err), "39P01", "{err}");
}

/// SPEC §18.3: every function, table, view and sequence of the extension has
/// a comment (`\df+` and `\dx+` read well), and only the everyday
/// allocators are outside the extension's own schema `pgticket`.
#[test]
fn every_object_says_what_it_is_and_only_the_allocators_live_outside_pgticket() {
    let c = shared_cluster("upgrade", 55435, &[]);
    let mut admin = c.connect();
    admin.batch_execute("CREATE DATABASE commented").unwrap();
    let mut db = c.connect_as("postgres", "commented");
    db.batch_execute("CREATE EXTENSION pg_ticket").unwrap();
    let silent: Vec<String> = db
        .query(
            "SELECT pg_describe_object(d.classid, d.objid, 0) FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
              WHERE e.extname = 'pg_ticket' AND d.deptype = 'e' AND d.classid IN ('pg_proc'::regclass, 'pg_class'::regclass)
                AND obj_description(d.objid, CASE WHEN d.classid = 'pg_proc'::regclass THEN 'pg_proc' ELSE 'pg_class' END) IS NULL
                AND NOT EXISTS (SELECT FROM pg_class i WHERE i.oid = d.objid AND d.classid = 'pg_class'::regclass AND i.relkind IN ('i', 't'))
              ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(silent.is_empty(), "objects without a comment: {silent:#?}");
    let outside: Vec<String> = db
        .query(
            "SELECT p.proname::text FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.classid = 'pg_proc'::regclass AND d.deptype = 'e'
               JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'pg_ticket'
              WHERE p.pronamespace <> 'pgticket'::regnamespace ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let everyday = [
        "assign_scoped_id", "assign_ticket", "current_block_mark", "current_scoped_id", "next_scoped_id", "next_ticket", "number_rows",
        "reserve_block", "shard_of", "sharded_decode", "sharded_id", "sharded_max_id", "sharded_min_id", "snowflake_decode", "snowflake_id",
        "snowflake_max_id", "snowflake_min_id",
    ];
    assert_eq!(outside, everyday, "the everyday allocators, and nothing else, live where the extension was created");
}

/// #46 item 13: 0.4.0's install and update scripts had UTF-8 in their
/// comments ("—", "§") and no `encoding` in the control file, so
/// PostgreSQL read them in the database's encoding: `CREATE EXTENSION`
/// failed in EUC_JP, EUC_KR, EUC_CN, EUC_TW and MULE_INTERNAL databases,
/// and so did `ALTER EXTENSION UPDATE` from 0.1.0 and 0.2.0. Now in every
/// server encoding PostgreSQL allows: a fresh install, and every release's
/// install updated to this one, each counting afterwards.
#[test]
fn the_extension_installs_and_updates_in_every_server_encoding() {
    let c = shared_cluster("upgrade", 55435, &[]);
    let mut admin = c.connect();
    let encodings: Vec<String> = admin
        .query(
            "SELECT pg_encoding_to_char(e) FROM generate_series(0, 63) e
              WHERE pg_encoding_to_char(e) <> '' AND pg_encoding_to_char(e) NOT IN
                    ('SJIS', 'BIG5', 'GBK', 'UHC', 'GB18030', 'JOHAB', 'SHIFT_JIS_2004')",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(encodings.len() >= 30, "the server encodings: {encodings:?}");
    let mut failed = Vec::new();
    for encoding in &encodings {
        let db = format!("enc_{}", encoding.to_lowercase());
        admin.batch_execute(&format!("DROP DATABASE IF EXISTS {db}")).unwrap();
        admin
            .batch_execute(&format!("CREATE DATABASE {db} TEMPLATE template0 ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C'"))
            .unwrap();
        for from in [None, Some("0.1.0"), Some("0.2.0"), Some("0.3.0"), Some("0.4.0")] {
            let steps = match from {
                None => "CREATE EXTENSION pg_ticket".to_string(),
                Some(v) => format!("CREATE EXTENSION pg_ticket VERSION '{v}'; ALTER EXTENSION pg_ticket UPDATE"),
            };
            // psql with no conversion (SQL_ASCII): this client library
            // speaks UTF-8 only, which MULE_INTERNAL has no conversion to.
            let out = std::process::Command::new(pg_ticket_integration::pg_bindir().join("psql"))
                .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", c.dir.to_str().unwrap(), "-p", &c.port.to_string(), "-U", "postgres", "-d", &db])
                .args(["-c", "DROP EXTENSION IF EXISTS pg_ticket", "-c", &steps, "-c", "SELECT next_scoped_id('enc', 'd')"])
                .env("PGCLIENTENCODING", "SQL_ASCII")
                .output()
                .unwrap();
            if !out.status.success() {
                failed.push(format!("{encoding} from {}: {}", from.unwrap_or("nothing"), String::from_utf8_lossy(&out.stderr).trim()));
            }
        }
        admin.batch_execute(&format!("DROP DATABASE {db}")).unwrap();
    }
    assert!(failed.is_empty(), "failed: {failed:#?}");
}

/// Every script PostgreSQL reads for the extension is ASCII, so it reads
/// the same in any database encoding (the control file names none).
#[test]
fn every_extension_script_is_ascii() {
    let sql = pg_ticket_integration::repo_root().join("sql");
    let mut offending = Vec::new();
    for entry in std::fs::read_dir(&sql).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read(&path).unwrap();
        if let Some(at) = text.iter().position(|b| !b.is_ascii()) {
            offending.push(format!("{}: byte {at}", path.display()));
        }
    }
    assert!(offending.is_empty(), "not ASCII: {offending:?}");
}

/// #46 item 7: a database whose extension was created at 0.2.0 and made
/// snowflakes recorded no ID space through its updates (0.3.0's recorded
/// one only where leases existed), so its dump was served at once by a
/// server with the same machine id (16 140 snowflakes twice). The update
/// to 0.5.0 records the space of the server's mark there.
#[test]
fn a_database_that_made_snowflakes_at_0_2_0_records_its_space_at_the_update() {
    let c = shared_cluster("upgrade", 55435, &[]);
    let mut admin = c.connect();
    admin.batch_execute("DROP DATABASE IF EXISTS flakes_020").unwrap();
    admin.batch_execute("CREATE DATABASE flakes_020").unwrap();
    let mut db = c.connect_as("postgres", "flakes_020");
    db.batch_execute("CREATE EXTENSION pg_ticket VERSION '0.2.0'").unwrap();
    one(&mut db, "SELECT snowflake_id()");
    db.batch_execute("ALTER EXTENSION pg_ticket UPDATE").unwrap();
    let space = db.query_one("SELECT epoch_ms, machine_bits FROM pgticket.id_space", &[]).expect("one space recorded");
    let (epoch, bits): (i64, i32) = (space.get(0), space.get(1));
    let configured = db.query_one("SELECT epoch_ms, machine_bits FROM pgticket.snowflake_id_space()", &[]).unwrap();
    assert_eq!((epoch, bits), (configured.get::<_, i64>(0), configured.get::<_, i32>(1)));
    // The database goes on making snowflakes in it.
    one(&mut db, "SELECT snowflake_id()");
    assert_eq!(db.query_one("SELECT to_regprocedure('pgticket.record_space_of_the_mark()') IS NULL", &[]).unwrap().get::<_, bool>(0), true);
}
