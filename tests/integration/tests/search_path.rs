//! SPEC §20.1, another role's rights with our own names (issue #46 item 1).
//! 0.4.0 ran `SELECT transaction::text::bigint FROM pg_prepared_xacts` as
//! the state table's owner with the caller's `search_path`: a login role's
//! `CREATE DOMAIN pg_temp.text ... CHECK (evil())` ran `evil()` as the
//! superuser who created the extension (`ALTER ROLE mallory SUPERUSER`
//! succeeded), and `max(lease)` in the registry resolved in the caller's
//! schemas the same way.
//!
//! Here a login role shadows every type name of `pg_catalog` in `pg_temp`,
//! and every function, aggregate and operator name of `pg_catalog` (those
//! a plain role can create over types it can name) in a schema it owns,
//! first in its `search_path`; the database's default path (what the
//! ticket worker runs with) is set to that schema too. Then it drives
//! every entry point that switches to the state tables' owner: first uses
//! of a scope, a block and a ticket scope (the worker), the quota, a first
//! snowflake with a prepared transaction of its own in the database, the
//! registry's grant, renewal and release, the number_rows() trigger. None
//! of the shadows may ever run as anyone but the role itself, and the role
//! stays what it was.

use pg_ticket_integration::{shared_cluster, Cluster};
use postgres::Client;

fn cluster() -> &'static Cluster {
    shared_cluster("search-path", 55700, &["pg_ticket.max_scopes_per_role = 1000"])
}

/// The role's trap: every shadow calls it; it records who ran it and tries
/// to make the role a superuser.
const TRAP: &str = r#"
CREATE SCHEMA mallory AUTHORIZATION mallory;
SET ROLE mallory;
CREATE TABLE mallory.ran (who text, what text);
GRANT INSERT ON mallory.ran TO PUBLIC;
GRANT USAGE ON SCHEMA mallory TO PUBLIC;
CREATE FUNCTION mallory.evil(what text) RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
    INSERT INTO mallory.ran VALUES (current_user, what);
    BEGIN
        EXECUTE 'ALTER ROLE mallory SUPERUSER';
    EXCEPTION WHEN OTHERS THEN NULL;
    END;
    RETURN true;
END $$;
GRANT EXECUTE ON FUNCTION mallory.evil(text) TO PUBLIC;
RESET ROLE;
"#;

/// Shadows of every function and operator of `pg_catalog` that a plain
/// role can declare (no polymorphic or pseudo types), and of the usual
/// aggregates, in schema `mallory`. Run as mallory.
const SCHEMA_SHADOWS: &str = r#"
DO $shadows$
DECLARE
    f record;
    made integer := 0;
BEGIN
    FOR f IN
        SELECT p.proname, pg_catalog.pg_get_function_identity_arguments(p.oid) AS args,
               pg_catalog.format_type(p.prorettype, NULL) AS ret, p.proretset
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.prokind = 'f'
           AND NOT EXISTS (SELECT FROM pg_catalog.pg_type t
                            WHERE t.oid = ANY (p.proargtypes::oid[] || p.prorettype) AND t.typtype = 'p')
           AND p.proargmodes IS NULL
    LOOP
        BEGIN
            EXECUTE format('CREATE FUNCTION mallory.%I(%s) RETURNS %s%s LANGUAGE plpgsql AS %L',
                f.proname, f.args, CASE WHEN f.proretset THEN 'SETOF ' ELSE '' END, f.ret,
                format('BEGIN PERFORM mallory.evil(%L); RETURN%s; END', 'function ' || f.proname,
                       CASE WHEN f.proretset THEN '' ELSE ' NULL' END));
            made := made + 1;
        EXCEPTION WHEN OTHERS THEN NULL;
        END;
    END LOOP;
    IF made < 1000 THEN
        RAISE 'only % function shadows were made', made;
    END IF;
END $shadows$;

CREATE FUNCTION mallory.trap_any(anyelement, anyelement) RETURNS anyelement LANGUAGE plpgsql AS $$
BEGIN PERFORM mallory.evil('aggregate'); RETURN $2; END $$;
DO $aggs$
DECLARE
    t text;
    a text;
BEGIN
    FOREACH a IN ARRAY ARRAY['max', 'min', 'sum', 'count', 'every', 'bool_or', 'bool_and', 'string_agg', 'array_agg'] LOOP
        FOREACH t IN ARRAY ARRAY['bigint', 'integer', 'text', 'timestamp with time zone', 'boolean', 'numeric', 'oid', 'interval', 'bytea', 'name', 'xid'] LOOP
            BEGIN
                EXECUTE format('CREATE AGGREGATE mallory.%I(%s) (sfunc = mallory.trap_any, stype = %s)', a, t, t);
            EXCEPTION WHEN OTHERS THEN NULL;
            END;
        END LOOP;
    END LOOP;
END $aggs$;

DO $ops$
DECLARE
    o record;
    made integer := 0;
BEGIN
    FOR o IN
        SELECT op.oprname, op.oprkind,
               pg_catalog.format_type(op.oprleft, NULL) AS l, pg_catalog.format_type(op.oprright, NULL) AS r,
               pg_catalog.format_type(op.oprresult, NULL) AS res, op.oid
          FROM pg_catalog.pg_operator op
         WHERE op.oprnamespace = 'pg_catalog'::regnamespace
           AND NOT EXISTS (SELECT FROM pg_catalog.pg_type t
                            WHERE t.oid IN (op.oprleft, op.oprright, op.oprresult) AND t.typtype = 'p')
    LOOP
        BEGIN
            IF o.oprkind = 'b' THEN
                EXECUTE format('CREATE FUNCTION mallory.op_%s(%s, %s) RETURNS %s LANGUAGE plpgsql AS %L',
                    o.oid, o.l, o.r, o.res, format('BEGIN PERFORM mallory.evil(%L); RETURN NULL; END', 'operator ' || o.oprname));
                EXECUTE format('CREATE OPERATOR mallory.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = mallory.op_%s)',
                    o.oprname, o.l, o.r, o.oid);
            ELSE
                EXECUTE format('CREATE FUNCTION mallory.op_%s(%s) RETURNS %s LANGUAGE plpgsql AS %L',
                    o.oid, o.r, o.res, format('BEGIN PERFORM mallory.evil(%L); RETURN NULL; END', 'operator ' || o.oprname));
                EXECUTE format('CREATE OPERATOR mallory.%s (RIGHTARG = %s, FUNCTION = mallory.op_%s)', o.oprname, o.r, o.oid);
            END IF;
            made := made + 1;
        EXCEPTION WHEN OTHERS THEN NULL;
        END;
    END LOOP;
    IF made < 300 THEN
        RAISE 'only % operator shadows were made', made;
    END IF;
END $ops$;
"#;

/// Domains named as every base type of `pg_catalog`, in the session's
/// `pg_temp` (searched first for types). Run as mallory, per session.
const TEMP_SHADOWS: &str = r#"
DO $temp$
DECLARE
    t record;
    made integer := 0;
BEGIN
    FOR t IN SELECT typname FROM pg_catalog.pg_type
              WHERE typnamespace = 'pg_catalog'::regnamespace AND typtype = 'b' AND typname NOT LIKE '\_%'
    LOOP
        BEGIN
            EXECUTE format('CREATE DOMAIN pg_temp.%I AS pg_catalog.%I CHECK (mallory.evil(%L))', t.typname, t.typname, 'type ' || t.typname);
            made := made + 1;
        EXCEPTION WHEN OTHERS THEN NULL;
        END;
    END LOOP;
    IF made < 40 THEN
        RAISE 'only % type shadows were made', made;
    END IF;
END $temp$;
"#;

/// A session of mallory's with every shadow in its path.
fn mallory_session(c: &Cluster, db: &str) -> Client {
    let mut s = c.connect_as("mallory", db);
    // The database's default path is mallory's: the loop runs without it.
    s.batch_execute("SET search_path = pg_catalog").unwrap();
    s.batch_execute(TEMP_SHADOWS).unwrap();
    s.batch_execute("SET search_path = mallory, pg_catalog, public").unwrap();
    s
}

/// A database with the extension, mallory's trap and shadows, its default
/// path (the ticket worker's) through mallory's schema.
fn trapped_db(c: &Cluster, name: &str) -> Client {
    // The role is a cluster's: made by one test at a time (two making it
    // at once both found it missing: 23505 on pg_authid, seen in a make
    // test run), on whichever cluster this is.
    static MAKING_ROLES: std::sync::Mutex<()> = std::sync::Mutex::new(());
    {
        let _one_at_a_time = MAKING_ROLES.lock().unwrap_or_else(|p| p.into_inner());
        c.connect()
            .batch_execute("DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'mallory') THEN CREATE ROLE mallory LOGIN; END IF; END $$")
            .unwrap();
    }
    let mut admin = c.fresh_db(name);
    admin
        .batch_execute(&format!(
            "GRANT CREATE ON DATABASE {name} TO mallory;
             GRANT EXECUTE ON FUNCTION pgticket.lease_machine_id(text, interval),
                   pgticket.renew_machine_id(integer, bigint, text, interval, bigint),
                   pgticket.release_machine_id(integer, bigint, text, bigint) TO mallory;
             {TRAP}
             ALTER DATABASE {name} SET search_path = mallory, pg_catalog, public;"
        ))
        .unwrap();
    // Made with a path of pg_catalog alone, so the loops do not call the
    // shadows they make.
    let mut m = c.connect_as("mallory", name);
    m.batch_execute("SET search_path = pg_catalog").unwrap();
    m.batch_execute(SCHEMA_SHADOWS).unwrap();
    admin
}

fn ran_as_others(admin: &mut Client) -> Vec<(String, String)> {
    admin
        .query("SELECT DISTINCT who, what FROM mallory.ran WHERE who <> 'mallory' ORDER BY 1, 2", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

fn is_superuser(admin: &mut Client) -> bool {
    admin.query_one("SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory'", &[]).unwrap().get(0)
}

/// The shadows are live: in mallory's own statements they do run (as
/// mallory), so a pass below is not a trap that never fires.
fn assert_shadows_fire(c: &Cluster, db: &str, admin: &mut Client) {
    let mut m = mallory_session(c, db);
    m.batch_execute("SELECT 'x'::text; SELECT max(x) FROM (VALUES (1::bigint), (2::bigint)) v(x); SELECT 1 = 1")
        .unwrap();
    let fired: Vec<String> = admin
        .query("SELECT DISTINCT what FROM mallory.ran WHERE who = 'mallory' ORDER BY 1", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(fired.iter().any(|w| w == "type text"), "the pg_temp.text domain must fire in mallory's own cast: {fired:?}");
    assert!(fired.iter().any(|w| w == "aggregate"), "mallory.max(bigint) must fire in mallory's own query: {fired:?}");
    assert!(fired.iter().any(|w| w.starts_with("operator =")), "mallory's = must fire in mallory's own query: {fired:?}");
    admin.batch_execute("TRUNCATE mallory.ran").unwrap();
}

#[test]
fn no_shadowed_name_runs_as_the_owner_on_any_path_that_switches_roles() {
    let c = cluster();
    let mut admin = trapped_db(c, "shadowed");
    assert_shadows_fire(c, "shadowed", &mut admin);

    let mut m = mallory_session(c, "shadowed");
    // A prepared transaction of mallory's own in the database: the first
    // snowflake's look at pg_prepared_xacts reads its row (0.4.0 cast it
    // through the caller's `text`).
    m.batch_execute("BEGIN; SELECT 1; PREPARE TRANSACTION 'mallory_prepared'").unwrap();
    let mut m = mallory_session(c, "shadowed");
    m.batch_execute("SELECT snowflake_id()").unwrap();
    m.batch_execute("SELECT next_scoped_id('mq', 'md'); SELECT next_scoped_id('mq', 'md')").unwrap();
    m.batch_execute("BEGIN; SELECT next_scoped_id('mq2', 'md'); SAVEPOINT a; SELECT next_scoped_id('mq2', 'md'); ROLLBACK TO a; COMMIT")
        .unwrap();
    m.batch_execute("SELECT * FROM reserve_block('mblock', 10); SELECT * FROM reserve_block('mblock', 10)").unwrap();
    m.batch_execute("SELECT next_ticket('mq', 'md'); SELECT next_ticket('mq', 'md2')").unwrap();
    m.batch_execute(
        "CREATE TABLE mallory.invoices (shop text, no bigint);
         SELECT number_rows('mallory.invoices'::regclass, 'no', 'shop', domain => 'invoice');
         INSERT INTO mallory.invoices (shop) VALUES ('s1'), ('s2');
         UPDATE mallory.invoices SET no = NULL",
    )
    .unwrap();
    let (id, lease, secret): (i32, i64, String) = m
        .query_one("SELECT machine_id, lease, secret FROM pgticket.lease_machine_id('mallory-holder', '30 seconds')", &[])
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .unwrap();
    m.query_one("SELECT pgticket.renew_machine_id($1, $2, $3, '30 seconds')", &[&id, &lease, &secret]).unwrap();
    m.execute("SELECT pgticket.release_machine_id($1, $2, $3)", &[&id, &lease, &secret]).unwrap();
    admin.batch_execute("COMMIT PREPARED 'mallory_prepared'").unwrap();

    assert_eq!(ran_as_others(&mut admin), Vec::<(String, String)>::new(), "a shadow of mallory's ran with another role's rights");
    assert!(!is_superuser(&mut admin), "mallory became a superuser");
}

/// The same on a registry that loads pg_ticket on demand (the library not
/// preloaded): its first grant records the database's space as the owner.
#[test]
fn no_shadowed_name_runs_as_the_owner_in_a_registry_that_is_not_preloaded() {
    let c = Cluster::start("search-path-lazy", 55701, &["shared_preload_libraries = ''"]);
    let mut admin = trapped_db(&c, "lazy_registry");
    assert_shadows_fire(&c, "lazy_registry", &mut admin);
    let mut m = mallory_session(&c, "lazy_registry");
    m.batch_execute("BEGIN; SELECT 1; PREPARE TRANSACTION 'mallory_prepared_lazy'").unwrap();
    let mut m = mallory_session(&c, "lazy_registry");
    let (id, lease, secret): (i32, i64, String) = m
        .query_one("SELECT machine_id, lease, secret FROM pgticket.lease_machine_id('mallory-holder', '30 seconds')", &[])
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .unwrap();
    m.query_one("SELECT pgticket.renew_machine_id($1, $2, $3, '30 seconds')", &[&id, &lease, &secret]).unwrap();
    m.execute("SELECT pgticket.release_machine_id($1, $2, $3)", &[&id, &lease, &secret]).unwrap();
    m.batch_execute("SELECT next_scoped_id('lq', 'ld'); SELECT * FROM reserve_block('lblock', 5)").unwrap();
    admin.batch_execute("COMMIT PREPARED 'mallory_prepared_lazy'").unwrap();
    assert_eq!(ran_as_others(&mut admin), Vec::<(String, String)>::new(), "a shadow of mallory's ran with another role's rights");
    assert!(!is_superuser(&mut admin), "mallory became a superuser");
}

/// Operators a database owner plants in `public` (the extension's schema
/// when created there) for every pair of common types, where pg_catalog
/// may have no exact match: a `numeric * integer` binds to one of these
/// rather than to pg_catalog's `numeric * numeric`.
const PLANTED_OPERATORS: &str = r#"
CREATE FUNCTION public.planted(a anyelement, b anyelement) RETURNS anyelement LANGUAGE sql AS 'SELECT $1';
DO $ops$
DECLARE
    l text;
    r text;
    o text;
BEGIN
    FOREACH o IN ARRAY ARRAY['+', '-', '*', '/', '<', '>', '<=', '>=', '=', '<>', '||'] LOOP
        FOREACH l IN ARRAY ARRAY['smallint', 'integer', 'bigint', 'numeric', 'double precision', 'text', 'timestamp with time zone', 'interval', 'boolean', 'oid'] LOOP
            FOREACH r IN ARRAY ARRAY['smallint', 'integer', 'bigint', 'numeric', 'double precision', 'text', 'timestamp with time zone', 'interval', 'boolean', 'oid'] LOOP
                BEGIN
                    EXECUTE format('CREATE FUNCTION public."planted %s %s %s"(%s, %s) RETURNS %s LANGUAGE sql AS %L', l, o, r, l, r, l, 'SELECT $1');
                    EXECUTE format('CREATE OPERATOR public.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = public."planted %s %s %s")', o, l, r, l, o, r);
                EXCEPTION WHEN OTHERS THEN NULL;
                END;
            END LOOP;
        END LOOP;
    END LOOP;
END $ops$;
"#;

/// What the extension's objects were bound to at creation that is neither
/// pg_catalog's nor the extension's own: its members, and the triggers,
/// constraints, defaults and views on its tables.
const BOUND_OUTSIDE: &str = r#"
WITH ext AS (SELECT oid FROM pg_extension WHERE extname = 'pg_ticket'),
members AS (SELECT d.classid, d.objid FROM pg_depend d, ext
             WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e'),
tables AS (SELECT objid AS rel FROM members WHERE classid = 'pg_class'::regclass),
objects AS (
    SELECT classid, objid FROM members
    UNION SELECT 'pg_trigger'::regclass, t.oid FROM pg_trigger t JOIN tables ON t.tgrelid = tables.rel
    UNION SELECT 'pg_constraint'::regclass, c.oid FROM pg_constraint c JOIN tables ON c.conrelid = tables.rel
    UNION SELECT 'pg_attrdef'::regclass, a.oid FROM pg_attrdef a JOIN tables ON a.adrelid = tables.rel
    UNION SELECT 'pg_rewrite'::regclass, w.oid FROM pg_rewrite w JOIN tables ON w.ev_class = tables.rel)
SELECT DISTINCT pg_describe_object(d.classid, d.objid, 0) || ' -> ' || pg_describe_object(d.refclassid, d.refobjid, 0)
  FROM pg_depend d JOIN objects o ON o.classid = d.classid AND o.objid = d.objid
 WHERE d.refclassid IN ('pg_operator'::regclass, 'pg_proc'::regclass)
   AND NOT EXISTS (SELECT FROM members m WHERE m.classid = d.refclassid AND m.objid = d.refobjid)
   AND CASE d.refclassid
         WHEN 'pg_operator'::regclass THEN (SELECT oprnamespace FROM pg_operator WHERE oid = d.refobjid)
         ELSE (SELECT pronamespace FROM pg_proc WHERE oid = d.refobjid) END <> 'pg_catalog'::regnamespace
 ORDER BY 1
"#;

/// Review of #46 (helper-1, SPEC §20.1 at install time): the machine-id
/// leases' `forward_only` trigger multiplied a numeric by an integer,
/// which pg_catalog has no exact operator for, so `CREATE EXTENSION` in a
/// database whose owner (not a superuser) had planted `public.*(numeric,
/// integer)` bound the trigger to it, and every lease released and granted
/// again ran it as the table's owner (the role became superuser). Now
/// nothing the extension creates, fresh or updated from 0.4.0, is bound to
/// an operator or function outside pg_catalog and the extension.
#[test]
fn nothing_the_extension_creates_binds_a_database_owners_operators() {
    let c = cluster();
    let mut admin = c.connect();
    admin.batch_execute("DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'dbo') THEN CREATE ROLE dbo LOGIN; END IF; END $$").unwrap();
    for db in ["planted_fresh", "planted_updated"] {
        admin.batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)")).unwrap();
        admin.batch_execute(&format!("CREATE DATABASE {db} OWNER dbo")).unwrap();
    }
    for (db, create) in [("planted_fresh", "CREATE EXTENSION pg_ticket"), ("planted_updated", "CREATE EXTENSION pg_ticket VERSION '0.4.0'; ALTER EXTENSION pg_ticket UPDATE")] {
        // pg_database_owner owns public from PostgreSQL 15 on; before, a
        // grant does it.
        c.connect_as("postgres", db).batch_execute("GRANT CREATE ON SCHEMA public TO dbo").unwrap();
        let mut owner = c.connect_as("dbo", db);
        owner.batch_execute(PLANTED_OPERATORS).unwrap();
        let planted: i64 = owner.query_one("SELECT count(*) FROM pg_operator WHERE oprnamespace = 'public'::regnamespace", &[]).unwrap().get(0);
        assert!(planted >= 500, "{planted} operators planted");
        let mut su = c.connect_as("postgres", db);
        su.batch_execute(create).unwrap();
        let bound: Vec<String> = su.query(BOUND_OUTSIDE, &[]).unwrap().iter().map(|r| r.get(0)).collect();
        assert_eq!(bound, Vec::<String>::new(), "{db}: bound outside pg_catalog and the extension");
    }
}

/// #47's review: the group's look at pglogical's subscriptions ran as the
/// state tables' owner and read `pglogical.subscription` by name, so a role
/// that may CREATE in the database made a schema `pglogical` with a view of
/// that name calling its code, and the first allocation ran it as the
/// superuser (0.5.0 before the fix: mallory became a superuser). Only the
/// pglogical extension's own table counts now.
#[test]
fn a_schema_named_pglogical_with_a_view_runs_nothing_as_the_owner() {
    let c = cluster();
    let mut admin = trapped_db(c, "fake_pglogical");
    let mut m = c.connect_as("mallory", "fake_pglogical");
    m.batch_execute(
        "SET search_path = pg_catalog;
         CREATE SCHEMA pglogical;
         CREATE FUNCTION pglogical.boom() RETURNS SETOF integer LANGUAGE plpgsql AS $$
         BEGIN PERFORM mallory.evil('pglogical.subscription'); RETURN NEXT 1; RETURN NEXT 2; END $$;
         CREATE VIEW pglogical.subscription AS SELECT * FROM pglogical.boom();
         SELECT count(*) FROM pglogical.subscription",
    )
    .unwrap();
    let fired: i64 = admin.query_one("SELECT count(*) FROM mallory.ran WHERE who = 'mallory'", &[]).unwrap().get(0);
    assert!(fired > 0, "the view's trap fires when mallory reads it");
    admin.batch_execute("TRUNCATE mallory.ran").unwrap();
    m.batch_execute("SET search_path = public, pg_catalog; SELECT snowflake_id(); SELECT next_ticket('pq', 'pd'); SELECT next_scoped_id('pq', 'pd')").unwrap();
    assert_eq!(ran_as_others(&mut admin), Vec::<(String, String)>::new(), "the fake pglogical table ran as another role");
    assert!(!is_superuser(&mut admin), "mallory became a superuser");
    // Its two fake rows are no subscriptions either: the allocators served.
    let n: i64 = m.query_one("SELECT next_scoped_id('pq', 'pd')", &[]).unwrap().get(0);
    assert_eq!(n, 2);
}
