//! The snowflake settings as a server administrator sets them.

use pg_ticket_integration::{refused_start, Cluster};

#[test]
fn a_custom_epoch_and_machine_id_are_stamped_into_ids() {
    let c = Cluster::start("settings", 55449, &["pg_ticket.machine_id = 513", "pg_ticket.epoch = '2025-06-01 12:00:00'"]);
    let mut client = c.connect();
    let row = client
        .query_one(
            "SELECT id >> 22,
                    (extract(epoch FROM clock_timestamp() - '2025-06-01 12:00:00+00'::timestamptz) * 1000)::bigint,
                    d.machine_id, abs(extract(epoch FROM d.created_at - clock_timestamp())) < 5
               FROM (SELECT snowflake_id() AS id) s, snowflake_decode(s.id) d",
            &[],
        )
        .unwrap();
    let (millis, expected, machine, now_ish): (i64, i64, i32, bool) = (row.get(0), row.get(1), row.get(2), row.get(3));
    assert!((expected - millis).abs() < 5_000, "ms since the configured epoch: {millis}, expected about {expected}");
    assert_eq!(machine, 513);
    assert!(now_ish, "decoding with the same epoch gives back the current time");
}

// Different directories and ports: the tests of a binary run in parallel.

#[test]
fn an_invalid_epoch_stops_the_server_with_a_message() {
    let log = refused_start("/tmp/pgt-bad-epoch", 55436, "pg_ticket.epoch = '2026-13-45'");
    assert!(log.contains("pg_ticket.epoch: invalid epoch \"2026-13-45\""), "{log}");
}

#[test]
fn an_invalid_machine_id_stops_the_server_instead_of_becoming_machine_0() {
    for bad in ["1024", "-2", "abc"] {
        let log = refused_start("/tmp/pgt-bad-machine", 55450, &format!("pg_ticket.machine_id = '{bad}'"));
        assert!(log.contains("pg_ticket.machine_id:"), "{bad}: {log}");
    }
    // -1 leases an id, and so needs a registry to lease it from.
    let log = refused_start("/tmp/pgt-bad-machine", 55450, "pg_ticket.machine_id = -1");
    assert!(log.contains("pg_ticket.machine_id: -1 (lease one) needs pg_ticket.registry"), "{log}");
}

/// Found by review: '010' is 8 to PostgreSQL (SHOW) but was 10 in the IDs.
#[test]
fn the_machine_id_stamped_is_the_one_show_reports() {
    let c = Cluster::start("settings-octal", 55476, &["pg_ticket.machine_id = '010'"]);
    let mut client = c.connect();
    let shown: String = client.query_one("SHOW pg_ticket.machine_id", &[]).unwrap().get(0);
    let stamped: i32 = client.query_one("SELECT machine_id FROM snowflake_decode(snowflake_id())", &[]).unwrap().get(0);
    assert_eq!((shown.as_str(), stamped), ("8", 8));
    c.stop();
}
