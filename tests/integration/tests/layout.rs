//! Machine bits sized for churn (SPEC §15, issue #21): `pg_ticket.machine_bits`
//! splits the 22 bits below a snowflake's timestamp between machine id and
//! sequence; the server stamps, decodes and reports in it, refuses to start
//! once its IDs were made in another, and a registry leases ids up to its
//! size with the layout in every grant, which the client stamps in.

use pg_ticket_integration::{refused_restart, refused_start, sqlstate, Cluster};
use std::collections::HashSet;
use std::time::Duration;
use ticket_client::{GeneratorConfig, LeasedGenerator};

#[test]
fn a_server_with_12_machine_bits_stamps_decodes_and_reports_them_and_refuses_to_start_with_10() {
    let c = Cluster::start("layout-12", 55526, &["pg_ticket.machine_bits = 12", "pg_ticket.machine_id = 3000"]);
    let mut db = c.connect();
    let ids: Vec<i64> = db.query_one("SELECT array_agg(snowflake_id() ORDER BY g) FROM generate_series(1, 20000) g", &[]).unwrap().get(0);
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), ids.len(), "no ID twice");
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "increasing");
    let rows = db
        .query("SELECT d.machine_id, d.sequence FROM unnest($1::bigint[]) id, snowflake_decode(id) d", &[&ids])
        .unwrap();
    assert!(rows.iter().all(|r| r.get::<_, i32>(0) == 3000), "machine id 3000 needs 12 bits: decoded in them");
    let top = rows.iter().map(|r| r.get::<_, i32>(1)).max().unwrap();
    assert!(top <= 1023, "10 bits of sequence: {top}");
    for id in &ids {
        assert_eq!((id >> 10) & 4095, 3000, "the machine id sits above 10 sequence bits in {id}");
    }
    let (bits, status_bits): (i32, i32) = {
        let r = db.query_one("SELECT (SELECT machine_bits FROM pgticket.snowflake_id_space()), machine_bits FROM pgticket.status", &[]).unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!((bits, status_bits), (12, 12));
    // The range of a millisecond covers every ID of it, in this layout too.
    let inside: bool = db
        .query_one("SELECT bool_and(id BETWEEN snowflake_min_id(d.created_at) AND snowflake_max_id(d.created_at)) FROM unnest($1::bigint[]) id, snowflake_decode(id) d", &[&ids])
        .unwrap()
        .get(0);
    assert!(inside);
    drop(db);
    c.stop();

    // The same data directory set back to 10 bits: its IDs would read as
    // other machines' (and 3000 is no 10-bit id): refused, naming both.
    let log = refused_restart(
        &c,
        "pg_ticket.machine_bits = 10\npg_ticket.machine_id = 7\n",
        "a server whose IDs were made with 12 machine bits must not start with 10",
    );
    assert!(
        log.contains("pg_ticket.machine_bits: the snowflake IDs of file")
            && log.contains("were made with epoch 2026-01-01 00:00:00 UTC and 12 machine bits, but this server is set for epoch 2026-01-01 00:00:00 UTC and 10 machine bits"),
        "{log}"
    );
}

#[test]
fn machine_bits_out_of_range_and_a_machine_id_beyond_them_stop_the_server() {
    for bad in ["9", "17", "x"] {
        let log = refused_start("/tmp/pgt-bad-bits", 55527, &format!("pg_ticket.machine_bits = '{bad}'"));
        assert!(log.contains("pg_ticket.machine_bits:"), "{bad}: {log}");
    }
    // 3000 is a machine id of 12 bits, not of the default 10.
    let log = refused_start("/tmp/pgt-bad-bits", 55527, "pg_ticket.machine_id = 3000");
    assert!(log.contains("pg_ticket.machine_id: machine id 3000 is out of range 0-1023"), "{log}");
}

#[test]
fn a_registry_with_12_machine_bits_leases_ids_beyond_1023_and_its_clients_stamp_in_12_bits() {
    let registry = Cluster::start("layout-registry", 55528, &["pg_ticket.machine_bits = 12", "pg_ticket.lease_ids = '4000-4095'"]);
    let mut db = registry.connect();
    // Ids past the layout are refused when set, and the list stays.
    let err = db.batch_execute("ALTER SYSTEM SET pg_ticket.lease_ids = '4000-4096'").unwrap_err();
    assert_eq!(sqlstate(&err), "22023", "{err}");
    let row = db.query_one("SELECT machine_id, machine_bits, epoch_ms FROM pgticket.lease_machine_id('sql-holder', '10 s')", &[]).unwrap();
    let (id, bits): (i32, i32) = (row.get(0), row.get(1));
    assert!((4000..=4095).contains(&id), "{id}");
    assert_eq!(bits, 12, "a grant carries the layout");

    let mut config = GeneratorConfig::new(registry.dsn(), "layout-client");
    config.ttl = Duration::from_secs(10);
    let generator = LeasedGenerator::start(config).unwrap();
    let grant = generator.wait_for_lease(Duration::from_secs(10)).unwrap();
    assert_eq!(grant.layout.machine_bits(), 12);
    assert!((4000..=4095).contains(&grant.machine_id) && i32::from(grant.machine_id) != id, "{grant:?}");
    let ids: Vec<i64> = (0..50_000).map(|_| generator.next_id().unwrap()).collect();
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), ids.len());
    for id in &ids {
        let parts = grant.layout.decompose(*id).unwrap();
        assert_eq!(parts.machine_id, grant.machine_id, "{id}");
        assert!(parts.sequence <= 1023);
    }
    // The registry's server reads them the same way.
    let decoded: Vec<i32> = db
        .query_one("SELECT array_agg(DISTINCT d.machine_id) FROM unnest($1::bigint[]) id, snowflake_decode(id) d", &[&ids])
        .unwrap()
        .get(0);
    assert_eq!(decoded, vec![i32::from(grant.machine_id)]);
    drop(generator);
    registry.stop();
}

/// Review of #21 (helper 15): a registry that loads the library on demand
/// takes its space from the server's configuration alone. A connection's
/// options, ALTER ROLE and ALTER DATABASE set a placeholder's reset value
/// too, and the first lease records the space for good: an ordinary role
/// had every later holder granted in 16 machine bits and the epoch 2020.
#[test]
fn an_unloaded_registry_leases_only_in_the_space_its_configuration_names() {
    let c = Cluster::start("layout-unloaded", 55529, &["shared_preload_libraries = ''", "pg_ticket.machine_bits = 12"]);
    let mut admin = c.connect();
    admin
        .batch_execute(
            "CREATE ROLE app LOGIN; GRANT EXECUTE ON FUNCTION pgticket.lease_machine_id(text, interval) TO app; \
             SELECT pgticket.end_lease_hold_off()",
        )
        .unwrap();
    let as_app = |options: &str| {
        let dsn = format!("{} user=app options='{options}'", c.dsn());
        postgres::Client::connect(&dsn, postgres::NoTls).unwrap()
    };
    for options in ["-c pg_ticket.machine_bits=16", "-c pg_ticket.epoch=2020-01-01"] {
        let err = as_app(options).query_one("SELECT machine_bits FROM pgticket.lease_machine_id('evil', '10 s')", &[]).unwrap_err();
        assert_eq!(sqlstate(&err), "F0000", "{options}: {err}");
        assert!(err.as_db_error().unwrap().message().contains("the connection's options"), "{err}");
    }
    admin.batch_execute("ALTER ROLE app SET pg_ticket.machine_bits = 16").unwrap();
    let err = as_app("").query_one("SELECT machine_bits FROM pgticket.lease_machine_id('evil', '10 s')", &[]).unwrap_err();
    assert!(err.as_db_error().unwrap().message().contains("ALTER ROLE ... SET"), "{err}");
    admin.batch_execute("ALTER ROLE app RESET pg_ticket.machine_bits").unwrap();
    let recorded: i64 = admin.query_one("SELECT count(*) FROM pgticket.id_space", &[]).unwrap().get(0);
    assert_eq!(recorded, 0, "a refused lease records no space");
    // A session SET changes nothing either; the configuration's 12 bits hold.
    let mut honest = as_app("");
    honest.batch_execute("SET pg_ticket.machine_bits = 16").unwrap();
    let bits: i32 = honest.query_one("SELECT machine_bits FROM pgticket.lease_machine_id('honest', '10 s')", &[]).unwrap().get(0);
    assert_eq!(bits, 12);
    let recorded: i32 = admin.query_one("SELECT machine_bits FROM pgticket.id_space", &[]).unwrap().get(0);
    assert_eq!(recorded, 12);
    c.stop();
}

/// Appends `lines` to the cluster's postgresql.conf and reloads it; waits
/// until a new session shows `setting` as `value`.
fn reload_with(c: &Cluster, lines: &str, setting: &str, value: &str) {
    let conf = c.data_dir().join("postgresql.conf");
    let mut text = std::fs::read_to_string(&conf).unwrap();
    text.push_str(lines);
    std::fs::write(&conf, &text).unwrap();
    c.connect().batch_execute("SELECT pg_reload_conf()").unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while c.connect().query_one(&format!("SHOW {setting}"), &[]).unwrap().get::<_, String>(0) != value {
        assert!(std::time::Instant::now() < deadline, "{setting} never became {value}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Review of #21 (helper 16), on a registry that loads the library on
/// demand: two first leases under different configurations recorded two
/// spaces (both granted); a space emptied under live leases let the next
/// grant record another; and leases granted in the recorded 12 bits could
/// not be renewed, released or revoked once the configuration said 10.
#[test]
fn first_leases_record_one_space_an_emptied_space_is_refused_and_recorded_leases_stay_manageable() {
    let c = Cluster::start("layout-first", 55534, &["shared_preload_libraries = ''", "pg_ticket.lease_ids = '1-3'"]);
    let mut a = c.fresh_db("race");
    a.batch_execute("SELECT pgticket.end_lease_hold_off(); BEGIN").unwrap();
    let bits: i32 = a.query_one("SELECT machine_bits FROM pgticket.lease_machine_id('A', '10 s')", &[]).unwrap().get(0);
    assert_eq!(bits, 10);
    reload_with(&c, "pg_ticket.machine_bits = 12\n", "pg_ticket.machine_bits", "12");
    let dsn = format!("{} dbname=race", c.dsn());
    let mut b = postgres::Client::connect(&dsn, postgres::NoTls).unwrap();
    // While A's first use is in progress, B's of another space is refused
    // at once (0.4.0: no lock held across A's transaction; 0.3.0 waited a
    // second at a time with 55P03), then takes A's space once A commits.
    let started = std::time::Instant::now();
    let err = b.query_one("SELECT machine_bits FROM pgticket.lease_machine_id('B', '10 s')", &[]).expect_err("another space in progress");
    assert_eq!(sqlstate(&err), "55000", "{err}");
    assert!(started.elapsed() < Duration::from_millis(900), "waited {:?}", started.elapsed());
    a.batch_execute("COMMIT").unwrap();
    // Once A committed, the database's space is A's, which this server is
    // no longer set for: refused, as a preloaded registry refuses (#46
    // item 9; 0.4.0 granted B in A's space).
    let err = b.query_one("SELECT machine_bits FROM pgticket.lease_machine_id('B', '10 s')", &[]).expect_err("the recorded space is not the configured one");
    assert_eq!(sqlstate(&err), "55000", "{err}");
    let spaces: i64 = a.query_one("SELECT count(*) FROM pgticket.id_space", &[]).unwrap().get(0);
    assert_eq!(spaces, 1);

    // A database recorded in 12 bits, an id past 1023 leased in it.
    reload_with(&c, "pg_ticket.lease_ids = '3000'\n", "pg_ticket.lease_ids", "3000");
    let mut db = c.fresh_db("wide");
    db.batch_execute("SELECT pgticket.end_lease_hold_off()").unwrap();
    let row = db.query_one("SELECT machine_id, lease, secret, machine_bits FROM pgticket.lease_machine_id('C', '30 s')", &[]).unwrap();
    let (id, lease, secret, bits): (i32, i64, String, i32) = (row.get(0), row.get(1), row.get(2), row.get(3));
    assert_eq!((id, bits), (3000, 12));
    // Emptied under the live lease: no grant records another space.
    db.batch_execute("DELETE FROM pgticket.id_space").unwrap();
    let err = db.query_one("SELECT machine_id FROM pgticket.lease_machine_id('D', '10 s')", &[]).unwrap_err();
    assert_eq!(sqlstate(&err), "F0000", "{err}");
    assert!(err.as_db_error().unwrap().message().contains("emptied under them"), "{err}");
    db.batch_execute("INSERT INTO pgticket.id_space (epoch_ms, machine_bits) VALUES (1767225600000, 12)").unwrap();
    // The configuration back at 10 bits: the lease of the recorded space is
    // still renewed, revoked and released by its id.
    reload_with(&c, "pg_ticket.machine_bits = 10\npg_ticket.lease_ids = '1-3'\n", "pg_ticket.machine_bits", "10");
    let mut db = c.connect_as("postgres", "wide");
    db.query_one("SELECT pgticket.renew_machine_id(3000, $1, $2, '30 s')", &[&lease, &secret]).expect("renewed by its id");
    db.query_one("SELECT pgticket.release_machine_id(3000, $1, $2)", &[&lease, &secret]).expect("released by its id");
    db.query_one("SELECT pgticket.revoke_machine_id(3000)", &[]).expect("revoke takes it");
    c.stop();
}

/// Review of #21 (helper 16): a preloaded registry that never stamped a
/// snowflake had no mark, so a restart with other machine bits started,
/// and its own snowflakes met its holders' IDs. A grant records the space
/// in the mark.
#[test]
fn a_registry_that_granted_does_not_start_in_another_layout_though_it_never_stamped() {
    let c = Cluster::start("layout-granted", 55535, &["pg_ticket.machine_id = 5", "pg_ticket.lease_ids = '1'"]);
    let mut db = c.connect();
    db.batch_execute("SELECT pgticket.end_lease_hold_off()").unwrap();
    let bits: i32 = db.query_one("SELECT machine_bits FROM pgticket.lease_machine_id('H', '30 s')", &[]).unwrap().get(0);
    assert_eq!(bits, 10);
    drop(db);
    c.stop();
    let log = refused_restart(&c, "pg_ticket.machine_bits = 12\n", "a registry whose holders stamp in 10 bits must not start in 12");
    assert!(log.contains("pg_ticket.machine_bits: the snowflake IDs of file") && log.contains("and 10 machine bits, but this server is set for"), "{log}");
}

/// Review of #21 (helper 17): a first use that waited for the lock and
/// found the space recorded held the lock to its transaction's end, so
/// concurrent first snowflake_id()s in a new database failed in a cascade
/// (5 of 8 with 55P03).
#[test]
fn concurrent_first_snowflakes_of_a_new_database_all_succeed() {
    let c = Cluster::start("layout-concurrent", 55536, &["pg_ticket.machine_id = 9"]);
    drop(c.fresh_db("fresh"));
    let dsn = format!("{} dbname=fresh", c.dsn());
    let sessions: Vec<_> = (0..8)
        .map(|_| {
            let dsn = dsn.clone();
            std::thread::spawn(move || {
                let mut s = postgres::Client::connect(&dsn, postgres::NoTls).unwrap();
                let mut t = s.transaction().unwrap();
                let id: i64 = t.query_one("SELECT snowflake_id()", &[])?.get(0);
                t.batch_execute("SELECT pg_sleep(0.4)")?;
                t.commit()?;
                Ok::<i64, postgres::Error>(id)
            })
        })
        .collect();
    let ids: Vec<i64> = sessions.into_iter().map(|s| s.join().unwrap().expect("every first use succeeds")).collect();
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 8);
    // 0.4.0: each first use records its row with no lock held (#31 item
    // 2); they all say one space.
    let spaces: i64 =
        c.connect_as("postgres", "fresh").query_one("SELECT count(DISTINCT (epoch_ms, machine_bits)) FROM pgticket.id_space", &[]).unwrap().get(0);
    assert_eq!(spaces, 1);
    c.stop();
}

/// #32 item 7: a database restored from a server of another ID space holds
/// that space's IDs; `snowflake_decode()` and the range functions read them
/// in the space recorded with it, not in this server's bits (machine 5 of
/// 12 bits read as machine 1 of 10), and refuse a database holding two.
#[test]
fn a_database_of_another_recorded_space_is_read_in_its_own_space() {
    let c = Cluster::start("layout-read", 55632, &["pg_ticket.machine_id = 7"]);
    let server_epoch: i64 =
        c.connect().query_one("SELECT epoch_ms FROM pgticket.snowflake_id_space()", &[]).unwrap().get(0);
    // Made 1 s after its epoch by machine 5 of a 12-bit server whose epoch
    // is a day before this server's: 10 sequence bits.
    let id: i64 = (1000_i64 << 22) | (5 << 10) | 3;
    let decode = "SELECT (extract(epoch FROM created_at) * 1000)::bigint, machine_id, sequence FROM snowflake_decode($1)";
    let mut restored = c.fresh_db("restored");
    restored
        .execute("INSERT INTO pgticket.id_space (epoch_ms, machine_bits) VALUES ($1, 12)", &[&(server_epoch - 86_400_000)])
        .unwrap();
    let r = restored.query_one(decode, &[&id]).unwrap();
    assert_eq!((r.get::<_, i64>(0), r.get::<_, i32>(1), r.get::<_, i32>(2)), (server_epoch - 86_400_000 + 1000, 5, 3));
    let (low, high): (i64, i64) = {
        let r = restored
            .query_one("SELECT snowflake_min_id(to_timestamp($1::bigint / 1000.0)), snowflake_max_id(to_timestamp($1::bigint / 1000.0))", &[&(server_epoch - 86_400_000 + 1000)])
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert!(low <= id && id <= high, "the range of its millisecond, in its epoch, holds it: {low} {id} {high}");
    // Its own snowflakes stay refused (another space).
    let err = restored.query_one("SELECT snowflake_id()", &[]).unwrap_err();
    assert_eq!(sqlstate(&err), "55000", "{err}");

    // A database of this server's space reads the same bits as this server.
    let mut own = c.fresh_db("own");
    let r = own.query_one(decode, &[&id]).unwrap();
    assert_eq!((r.get::<_, i64>(0), r.get::<_, i32>(1), r.get::<_, i32>(2)), (server_epoch + 1000, 1, 1024 + 3));

    // A database holding IDs of two spaces: no single reading, refused.
    restored.execute("INSERT INTO pgticket.id_space (epoch_ms, machine_bits) VALUES ($1, 10)", &[&server_epoch]).unwrap();
    let err = restored.query_one(decode, &[&id]).unwrap_err();
    assert_eq!(sqlstate(&err), "55000", "{err}");
    c.stop();
}

/// #46 item 9: a registry that loads pg_ticket on demand, restarted with
/// another `pg_ticket.epoch` (or `machine_bits`) after its first grant,
/// granted in its old space (0.4.0) where the docs promise 55000 and a
/// preloaded registry refuses. Now it refuses too, naming both spaces;
/// set back, it grants again.
#[test]
fn a_registry_loading_on_demand_refuses_to_grant_after_its_space_moved() {
    let c = Cluster::start("layout-moved", 55535, &["shared_preload_libraries = ''", "pg_ticket.lease_ids = '1-3'"]);
    let mut db = c.fresh_db("moved");
    db.batch_execute("SELECT pgticket.end_lease_hold_off()").unwrap();
    db.query_one("SELECT machine_id FROM pgticket.lease_machine_id('first', '10 s')", &[]).unwrap();
    drop(db);
    for (line, setting) in [("pg_ticket.epoch = '2025-06-01 00:00:00+00'\n", "epoch"), ("pg_ticket.machine_bits = 12\n", "machine bits")] {
        c.stop();
        let conf = c.data_dir().join("postgresql.conf");
        let original = std::fs::read_to_string(&conf).unwrap();
        std::fs::write(&conf, format!("{original}{line}")).unwrap();
        c.up(None);
        let mut db = c.connect_as("postgres", "moved");
        db.batch_execute("SELECT pgticket.end_lease_hold_off()").unwrap();
        let err = db.query_one("SELECT machine_id FROM pgticket.lease_machine_id('after', '10 s')", &[]).expect_err(setting);
        assert_eq!(sqlstate(&err), "55000", "{setting}: {err}");
        drop(db);
        c.stop();
        std::fs::write(&conf, original).unwrap();
        c.up(None);
    }
    let mut db = c.connect_as("postgres", "moved");
    db.batch_execute("SELECT pgticket.end_lease_hold_off()").unwrap();
    db.query_one("SELECT machine_id FROM pgticket.lease_machine_id('back', '10 s')", &[]).expect("set back, it grants");
    c.stop();
}
