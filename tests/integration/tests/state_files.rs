//! State that lives beside PostgreSQL (SPEC §17, issue #30): the mark file
//! and the shard book under what PostgreSQL's own tools and a failing disk
//! do to them.

use pg_ticket_integration::{owned_dir, sqlstate, Cluster};
use postgres::Client;
use std::path::Path;
use std::time::{Duration, Instant};


/// A directory where the file's temporary copy goes: every write of that
/// file fails, as on a full or read-only disk.
fn block_writes_of(c: &Cluster, file: &str) -> std::path::PathBuf {
    let tmp = c.data_dir().join(Path::new(file).with_extension("tmp"));
    owned_dir(&tmp);
    tmp
}

/// Waits until the server no longer runs (its postmaster gone), up to 60 s.
fn wait_stopped(c: &Cluster) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while c.data_dir().join("postmaster.pid").exists() {
        assert!(Instant::now() < deadline, "the server kept running");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn server_runs(c: &Cluster) -> bool {
    Client::connect(&c.dsn(), postgres::NoTls).and_then(|mut k| k.simple_query("SELECT 1").map(|_| ())).is_ok()
}

/// SPEC §17.2: `sharded_release` logs its record (standbys replay it),
/// then its file write fails. 0.3.0 answered with an error and ran on with
/// the old book, so a clean restart with the shard listed issued it
/// again. Now the server stops at the failed write, does not start while
/// the book cannot be written, and once it can, recovery writes the
/// release into it.
#[test]
fn a_release_whose_book_write_failed_is_not_forgotten_at_the_next_start() {
    let c = Cluster::start("bookwrite", 55600, &["pg_ticket.shards = '0-3'"]);
    let mut admin = c.connect();
    admin.query_one("SELECT sharded_accept(1, 0)", &[]).unwrap();
    admin.query_one("SELECT max(sharded_id(1)) FROM generate_series(1, 1000)", &[]).unwrap();
    c.reload_shards("0,2-3");
    let blocker = block_writes_of(&c, "pg_ticket_shards.book");
    let mut admin = c.connect();
    let released = admin.query_one("SELECT sharded_release(1)", &[]);
    assert!(released.is_err(), "a release whose book write failed must not succeed");

    // Stopped at the failure (PANIC), and not started again while the book
    // cannot be written (recovery replays the release into it and fails).
    wait_stopped(&c);
    let log = std::fs::read_to_string(c.dir.join("server.log")).unwrap();
    assert!(log.contains("PANIC") && log.contains("shard book"), "the stop names the shard book: {log}");
    std::fs::remove_dir_all(&blocker).unwrap();
    c.up(None);
    c.reload_shards("0-3");
    let mut admin = c.connect();
    let err = admin.query_one("SELECT sharded_id(1)", &[]).expect_err("a released shard must not issue after the restart");
    assert_eq!(sqlstate(&err), "55000", "{err}");
    assert!(err.as_db_error().unwrap().message().contains("released"), "{err}");
    // A clean restart still knows it.
    c.stop();
    c.up(None);
    let err = c.connect().query_one("SELECT sharded_id(1)", &[]).expect_err("still released after a clean restart");
    assert!(err.as_db_error().unwrap().message().contains("released"), "{err}");
}

/// The same for the snowflake mark: a mark in WAL whose file write failed
/// stops the server, which starts again above it once the file can be
/// written.
#[test]
fn a_mark_whose_file_write_failed_stops_the_server_and_is_kept() {
    let c = Cluster::start("markwrite", 55601, &[]);
    let mut admin = c.connect();
    let before: i64 = admin.query_one("SELECT snowflake_id()", &[]).unwrap().get(0);
    let blocker = block_writes_of(&c, "pg_ticket_snowflake.mark");
    // The mark moves ahead within seconds under load; its write fails.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = before;
    loop {
        match admin.query_one("SELECT max(snowflake_id()) FROM generate_series(1, 100000)", &[]) {
            Ok(row) => last = row.get(0),
            Err(_) => break,
        }
        assert!(Instant::now() < deadline, "the mark never moved ahead");
    }
    wait_stopped(&c);
    let log = std::fs::read_to_string(c.dir.join("server.log")).unwrap();
    assert!(log.contains("PANIC") && log.contains("snowflake mark"), "the stop names the mark: {log}");
    assert!(!server_runs(&c));
    std::fs::remove_dir_all(&blocker).unwrap();
    c.up(None);
    let next: i64 = c.connect().query_one("SELECT snowflake_id()", &[]).unwrap().get(0);
    assert!(next > last, "after the restart {next} must be above {last}");
}
