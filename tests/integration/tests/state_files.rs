//! State that lives beside PostgreSQL (SPEC §17, issue #30): the mark file
//! and the shard book under what PostgreSQL's own tools and a failing disk
//! do to them.

use pg_ticket_integration::{owned_dir, pg_tool, sqlstate, Cluster};
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

/// SPEC §17.2: `pgticket.release_shard` logs its record (standbys replay it),
/// then its file write fails. 0.3.0 answered with an error and ran on with
/// the old book, so a clean restart with the shard listed issued it
/// again. Now the server stops at the failed write, does not start while
/// the book cannot be written, and once it can, recovery writes the
/// release into it.
#[test]
fn a_release_whose_book_write_failed_is_not_forgotten_at_the_next_start() {
    let c = Cluster::start("bookwrite", 55600, &["pg_ticket.shards = '0-3'"]);
    let mut admin = c.connect();
    admin.query_one("SELECT pgticket.accept_shard(1, 0)", &[]).unwrap();
    admin.query_one("SELECT max(sharded_id(1)) FROM generate_series(1, 1000)", &[]).unwrap();
    c.reload_shards("0,2-3");
    let blocker = block_writes_of(&c, "pg_ticket_shards.book");
    let mut admin = c.connect();
    let released = admin.query_one("SELECT pgticket.release_shard(1)", &[]);
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
    admin.query_one("SELECT snowflake_id()", &[]).unwrap();
    let mark_file = c.data_dir().join("pg_ticket_snowflake.mark");
    let mark_in_file = || -> i64 { std::fs::read_to_string(&mark_file).unwrap().split(' ').next().unwrap().trim().parse().unwrap() };
    let mark_before = mark_in_file();
    let blocker = block_writes_of(&c, "pg_ticket_snowflake.mark");
    // The mark moves ahead within seconds under load; its write fails.
    let deadline = Instant::now() + Duration::from_secs(30);
    while admin.query_one("SELECT max(snowflake_id()) FROM generate_series(1, 100000)", &[]).is_ok() {
        assert!(Instant::now() < deadline, "the mark never moved ahead");
    }
    wait_stopped(&c);
    let log = std::fs::read_to_string(c.dir.join("server.log")).unwrap();
    let panic = log.lines().find(|l| l.contains("PANIC") && l.contains("snowflake mark")).unwrap_or_else(|| panic!("the stop names the mark: {log}"));
    // "... the new snowflake mark (<ms> Unix ms) is in WAL but ..."
    let logged: i64 = panic.split("mark (").nth(1).and_then(|rest| rest.split(' ').next()).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{panic}"));
    assert!(logged > mark_before, "the failed record is ahead of the file it could not replace");
    assert_eq!(mark_in_file(), mark_before, "the file still holds the older mark while the server is down");
    assert!(!server_runs(&c));
    std::fs::remove_dir_all(&blocker).unwrap();
    c.up(None);
    // Recovery wrote the record into the file before any ID was asked for.
    assert!(mark_in_file() >= logged, "the mark in WAL ({logged}) is kept: the file holds {}", mark_in_file());
    c.connect().query_one("SELECT snowflake_id()", &[]).unwrap();
}

/// #30 item 1 (SPEC §17.1): server A accepts shard 2 and issues; a base
/// backup of A is taken; A hands shard 2 to B as the docs say; A is lost
/// and the backup is started in its place with A's settings. 0.3.0 issued
/// shard 2 at once beside B. The copy holds it (across its restarts too)
/// until it is accepted again; crash restarts of a server are not held.
#[test]
fn an_old_base_backup_started_in_a_servers_place_holds_its_accepted_shards() {
    let a = Cluster::start("sf-a", 55604, &["pg_ticket.shards = '2'", "pg_ticket.machine_id = 1"]);
    let b = Cluster::start("sf-b", 55605, &["pg_ticket.shards = '2'", "pg_ticket.machine_id = 2"]);
    let mut on_a = a.connect();
    on_a.query_one("SELECT pgticket.accept_shard(2, 0)", &[]).unwrap();
    let issued_by_a: i64 = on_a.query_one("SELECT max(sharded_id(2)) FROM generate_series(1, 1000)", &[]).unwrap().get(0);

    let copy_dir = std::path::PathBuf::from("/tmp/pgt-sf-a-backup");
    owned_dir(&copy_dir);
    let data = copy_dir.join("data");
    let port = a.port.to_string();
    pg_tool("pg_basebackup", &["-D", data.to_str().unwrap(), "-c", "fast", "-X", "stream", "-h", a.dir.to_str().unwrap(), "-p", &port, "-U", "postgres"]);

    // The handover, as docs/reference.md gives it.
    a.reload_shards("");
    let point: i64 = a.connect().query_one("SELECT pgticket.release_shard(2)", &[]).unwrap().get(0);
    let mut on_b = b.connect();
    on_b.query_one("SELECT pgticket.accept_shard(2, $1)", &[&point]).unwrap();
    on_b.query_one("SELECT max(sharded_id(2)) FROM generate_series(1, 1000)", &[]).unwrap();
    drop(on_a);
    a.stop_with("immediate");

    // The backup in A's place, with A's settings (and a port of its own).
    let mut f = std::fs::OpenOptions::new().append(true).open(data.join("postgresql.conf")).unwrap();
    std::io::Write::write_all(&mut f, format!("port = 55606\nunix_socket_directories = '{}'\n", copy_dir.display()).as_bytes()).unwrap();
    let copy = Cluster::attach(&copy_dir, 55606);
    copy.up(None);
    // Its snowflake mark may be older than what A stamped since (a clock
    // that ran ahead): every snowflake and sharded ID is held until an
    // administrator vouches (#30 item 7, SPEC §17.1); 0.4.0 before it
    // stamped at once.
    for call in ["SELECT snowflake_id()", "SELECT sharded_id(2)"] {
        let err = copy.connect_when_ready().query_one(call, &[]).expect_err("a restored start is held");
        assert_eq!(sqlstate(&err), "55000", "{err}");
        let db_error = err.as_db_error().unwrap();
        assert!(db_error.message().contains("base backup"), "{err}");
        assert!(db_error.hint().unwrap_or_default().contains("pgticket.raise_snowflake_mark"), "{err}");
    }
    copy.connect().query_one("SELECT pgticket.raise_snowflake_mark(now())", &[]).unwrap();
    copy.connect().query_one("SELECT snowflake_id()", &[]).expect("vouched for, it stamps");
    let held = |c: &Cluster| {
        let err = c.connect_when_ready().query_one("SELECT sharded_id(2)", &[]).expect_err("the copy does not issue the moved shard");
        assert_eq!(sqlstate(&err), "55000", "{err}");
        let text = err.as_db_error().unwrap().message().to_string();
        assert!(text.contains("shard 2 is held") && text.contains("pgticket.accept_shard(2, 0)"), "{text}");
    };
    held(&copy);
    copy.stop();
    copy.up(None);
    held(&copy);

    // A crash restart of the shard's real owner is not held.
    drop(on_b);
    b.stop_with("immediate");
    b.up(None);
    let mut on_b = b.connect_when_ready();
    let last_of_b: i64 = on_b.query_one("SELECT max(sharded_id(2)) FROM generate_series(1, 1000)", &[]).unwrap().get(0);

    // Handed back from B, the copy issues above everything B issued.
    b.reload_shards("");
    let point: i64 = b.connect().query_one("SELECT pgticket.release_shard(2)", &[]).unwrap().get(0);
    let first: i64 = copy.connect().query_one("SELECT pgticket.accept_shard(2, $1)", &[&point]).unwrap().get(0);
    assert!(first > last_of_b && first > issued_by_a, "{first} is above B's {last_of_b} and A's {issued_by_a}");
    copy.connect().query_one("SELECT sharded_id(2)", &[]).expect("accepted again, it issues");
    copy.stop();
    b.stop();
}

/// #46 item 8 (SPEC §20.4): a base backup whose first start goes by
/// without pg_ticket preloaded (its configuration kept outside the data
/// directory, as on Debian) renames `backup_label` unseen; 0.4.0's later
/// preloaded start was an ordinary restart, and it stamped and issued its
/// accepted shard at once. Now it is held as a restored start. A standby
/// (preloaded from its first start), promoted and restarted, is not.
#[test]
fn a_base_backup_first_started_without_pg_ticket_is_held_at_its_first_preloaded_start() {
    let a = Cluster::start("sf-unseen", 55636, &["pg_ticket.shards = '2'", "pg_ticket.machine_id = 1"]);
    let mut on_a = a.connect();
    on_a.query_one("SELECT pgticket.accept_shard(2, 0)", &[]).unwrap();
    on_a.query_one("SELECT max(sharded_id(2)) FROM generate_series(1, 100)", &[]).unwrap();
    on_a.batch_execute("CHECKPOINT").unwrap();
    let standby = a.standby("sf-unseen-standby", 55637, &["pg_ticket.machine_id = 3", "pg_ticket.shards = ''"]);

    let copy_dir = std::path::PathBuf::from("/tmp/pgt-sf-unseen-copy");
    owned_dir(&copy_dir);
    let data = copy_dir.join("data");
    let port = a.port.to_string();
    pg_tool("pg_basebackup", &["-D", data.to_str().unwrap(), "-c", "fast", "-X", "stream", "-h", a.dir.to_str().unwrap(), "-p", &port, "-U", "postgres"]);
    drop(on_a);
    a.stop_with("immediate");
    let conf = |lines: &str| {
        let mut f = std::fs::OpenOptions::new().append(true).open(data.join("postgresql.conf")).unwrap();
        std::io::Write::write_all(&mut f, lines.as_bytes()).unwrap();
    };
    conf(&format!("port = 55638\nunix_socket_directories = '{}'\nshared_preload_libraries = ''\n", copy_dir.display()));
    let copy = Cluster::attach(&copy_dir, 55638);
    copy.up(None);
    let mut db = copy.connect_when_ready();
    let recovering: bool = db.query_one("SELECT pg_is_in_recovery()", &[]).unwrap().get(0);
    assert!(!recovering && data.join("backup_label.old").exists(), "the backup's first start ended its recovery unpreloaded");
    drop(db);
    // A standby of this copy (preloaded) inherits its hold: promoted, it
    // is held too (review: it issued at once).
    let of_copy = copy.standby("sf-unseen-grandchild", 55642, &["shared_preload_libraries = 'pg_ticket'"]);
    of_copy.promote();
    let err = of_copy.connect_when_ready().query_one("SELECT snowflake_id()", &[]).expect_err("a standby of a copy started unseen, promoted, is held");
    assert_eq!(sqlstate(&err), "55000", "{err}");
    of_copy.stop();
    copy.stop();
    conf("shared_preload_libraries = 'pg_ticket'\n");
    copy.up(None);
    for call in ["SELECT snowflake_id()", "SELECT sharded_id(2)"] {
        let err = copy.connect_when_ready().query_one(call, &[]).expect_err("a backup first started unseen is held");
        assert_eq!(sqlstate(&err), "55000", "{err}");
        assert!(err.as_db_error().unwrap().message().contains("base backup"), "{err}");
    }
    copy.connect().query_one("SELECT pgticket.raise_snowflake_mark(now())", &[]).unwrap();
    copy.connect().query_one("SELECT snowflake_id()", &[]).expect("vouched for, it stamps");
    let err = copy.connect().query_one("SELECT sharded_id(2)", &[]).expect_err("its accepted shard is held");
    assert!(err.as_db_error().unwrap().message().contains("shard 2 is held"), "{err}");
    copy.stop();

    standby.promote();
    standby.stop();
    standby.up(None);
    standby.connect_when_ready().query_one("SELECT snowflake_id()", &[]).expect("a promoted standby, restarted, is not held");
    standby.stop();
}

/// A server in /tmp/pgt-NAME archiving its WAL into /tmp/pgt-NAME-archive
/// (returned), with `conf`.
fn archiving_primary(name: &str, port: u16, conf: &[&str]) -> (Cluster, std::path::PathBuf) {
    let archive = std::path::PathBuf::from(format!("/tmp/pgt-{name}-archive"));
    owned_dir(&archive);
    let archiving = format!("archive_command = 'cp %p {}/%f'", archive.display());
    let mut lines = conf.to_vec();
    lines.extend(["archive_mode = on", &archiving]);
    (Cluster::start(name, port, &lines), archive)
}

/// A base backup of `of` in /tmp/pgt-NAME/data, its WAL left to the archive.
fn base_backup_without_wal(of: &Cluster, name: &str) -> std::path::PathBuf {
    let copy_dir = std::path::PathBuf::from(format!("/tmp/pgt-{name}"));
    owned_dir(&copy_dir);
    let data = copy_dir.join("data");
    pg_tool("pg_basebackup", &["-D", data.to_str().unwrap(), "-c", "fast", "-X", "none", "-h", of.dir.to_str().unwrap(), "-p", &of.port.to_string(), "-U", "postgres"]);
    copy_dir
}

/// A restore point `name`, its WAL switched out and archived.
fn archive_up_to_a_restore_point(db: &mut Client, name: &str) {
    db.batch_execute(&format!("SELECT pg_create_restore_point('{name}'); SELECT pg_switch_wal()")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !db
        .query_one("SELECT last_archived_wal IS NOT NULL AND failed_count = 0 AND archived_count >= 2 FROM pg_stat_archiver", &[])
        .unwrap()
        .get::<_, bool>(0)
    {
        assert!(Instant::now() < deadline, "WAL was not archived");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The backup in `copy_dir` started on `port` as a recovery from `archive`
/// with `signal` (recovery.signal, standby.signal) and `recovery` lines.
fn recovery_of(copy_dir: &std::path::Path, port: u16, archive: &std::path::Path, signal: &str, recovery: &str) -> Cluster {
    let data = copy_dir.join("data");
    let mut f = std::fs::OpenOptions::new().append(true).open(data.join("postgresql.conf")).unwrap();
    let lines = format!(
        "port = {port}\nunix_socket_directories = '{}'\narchive_mode = off\nrestore_command = 'cp {}/%f %p'\n{recovery}",
        copy_dir.display(),
        archive.display()
    );
    std::io::Write::write_all(&mut f, lines.as_bytes()).unwrap();
    std::fs::write(data.join(signal), "").unwrap();
    let _ = std::process::Command::new("chown").args(["postgres:", data.join(signal).to_str().unwrap()]).status();
    let copy = Cluster::attach(copy_dir, port);
    copy.up(None);
    copy
}

/// The pids of the running server's processes whose title has `what`.
fn server_processes(c: &Cluster, what: &str) -> Vec<String> {
    let pid = std::fs::read_to_string(c.data_dir().join("postmaster.pid")).unwrap().lines().next().unwrap().trim().to_string();
    let out = std::process::Command::new("pgrep").args(["-P", &pid, "-f", what]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_string).collect()
}

/// #46 item 4 (SPEC §20.3): a point-in-time recovery promoted with
/// `pg_ctl promote` holds the shards its book had accepted, and 0.4.0
/// applied that hold by rewriting the book alone. Promotion's checkpoint
/// is spread; a crash before it replays the WAL since the last
/// restartpoint, the "accepted" record of the shard included, over the
/// file (24 956 and 150 446 shard IDs twice). Now the hold is a WAL record
/// before the marker goes, and the shard stays held through the crash.
/// The checkpointer is stopped (SIGSTOP) across the promotion, so the
/// crash surely comes before its checkpoint.
#[test]
fn a_promoted_point_in_time_recovery_keeps_its_shard_hold_through_a_crash() {
    let (a, archive) = archiving_primary("pitr-a", 55607, &["pg_ticket.shards = '4'", "pg_ticket.machine_id = 3"]);
    let copy_dir = base_backup_without_wal(&a, "pitr-copy");
    // After the backup: the shard accepted and issued, in WAL only.
    let mut on_a = a.connect();
    on_a.query_one("SELECT pgticket.accept_shard(4, 0)", &[]).unwrap();
    on_a.query_one("SELECT max(sharded_id(4)) FROM generate_series(1, 1000)", &[]).unwrap();
    archive_up_to_a_restore_point(&mut on_a, "pitr");
    on_a.batch_execute("CHECKPOINT").unwrap();
    drop(on_a);
    a.stop();

    // The recovery, paused at the restore point, then promoted by hand.
    let copy = recovery_of(&copy_dir, 55608, &archive, "recovery.signal", "recovery_target_name = 'pitr'\nrecovery_target_action = 'pause'\ncheckpoint_timeout = '1h'\n");
    let mut db = copy.connect_when_ready();
    let deadline = Instant::now() + Duration::from_secs(60);
    while db.query_one("SELECT pg_get_wal_replay_pause_state()", &[]).unwrap().get::<_, String>(0) != "paused" {
        assert!(Instant::now() < deadline, "recovery did not reach its target");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(db);
    let checkpointer = server_processes(&copy, "checkpointer");
    assert_eq!(checkpointer.len(), 1, "one checkpointer: {checkpointer:?}");
    let stop = |signal: &str| assert!(std::process::Command::new("kill").args([signal, &checkpointer[0]]).status().unwrap().success());
    stop("-STOP");
    copy.promote();
    let mut db = copy.connect_when_ready();
    // The operator vouches for the snowflakes (the documented first step);
    // the shard stays held until accepted again.
    db.query_one("SELECT pgticket.raise_snowflake_mark(now())", &[]).unwrap();
    let err = db.query_one("SELECT sharded_id(4)", &[]).expect_err("a promoted recovery holds its accepted shards");
    assert_eq!(sqlstate(&err), "55000", "{err}");
    drop(db);
    // The crash, before promotion's checkpoint: every process killed.
    let pid = std::fs::read_to_string(copy.data_dir().join("postmaster.pid")).unwrap().lines().next().unwrap().trim().to_string();
    let children = std::process::Command::new("pgrep").args(["-P", &pid]).output().unwrap();
    let mut pids: Vec<String> = String::from_utf8_lossy(&children.stdout).split_whitespace().map(str::to_string).collect();
    pids.push(pid);
    assert!(pids.len() > 2, "the server's processes: {pids:?}");
    // One at a time: a process may have exited meanwhile (PostgreSQL 18's
    // I/O workers go when one of their kind is killed).
    for pid in &pids {
        let _ = std::process::Command::new("kill").args(["-KILL", pid]).status();
    }
    wait_stopped_by_kill(&copy);
    copy.up(None);
    let err = copy.connect_when_ready().query_one("SELECT sharded_id(4)", &[]).expect_err("the hold outlives the crash");
    assert_eq!(sqlstate(&err), "55000", "{err}");
    assert!(err.as_db_error().unwrap().message().contains("shard 4 is held"), "{err}");
    copy.stop();
}

/// After a SIGKILL of every process: the pid file names a dead postmaster.
fn wait_stopped_by_kill(c: &Cluster) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pid = std::fs::read_to_string(c.data_dir().join("postmaster.pid")).ok().and_then(|t| t.lines().next().map(|l| l.trim().to_string()));
        let alive = pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists());
        if !alive {
            return;
        }
        assert!(Instant::now() < deadline, "the killed server is still there");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Review of #46 (helper-2): a point-in-time recovery in standby mode
/// (`standby.signal`, a recovery target, `recovery_target_action =
/// 'promote'`) was taken for a standby and not held, and issued a shard
/// its original had released since. A recovery target makes it a
/// point-in-time recovery whatever the signal file: held.
#[test]
fn a_point_in_time_recovery_in_standby_mode_is_held() {
    let (a, archive) = archiving_primary("pitr2-a", 55609, &["pg_ticket.shards = '5'", "pg_ticket.machine_id = 4"]);
    let mut on_a = a.connect();
    on_a.query_one("SELECT pgticket.accept_shard(5, 0)", &[]).unwrap();
    let copy_dir = base_backup_without_wal(&a, "pitr2-copy");
    on_a.query_one("SELECT max(sharded_id(5)) FROM generate_series(1, 100)", &[]).unwrap();
    archive_up_to_a_restore_point(&mut on_a, "pitr2");
    drop(on_a);
    a.stop();
    let copy = recovery_of(&copy_dir, 55613, &archive, "standby.signal", "recovery_target_name = 'pitr2'\nrecovery_target_action = 'promote'\n");
    let mut db = copy.connect_when_ready();
    let deadline = Instant::now() + Duration::from_secs(60);
    while db.query_one("SELECT pg_is_in_recovery()", &[]).unwrap().get::<_, bool>(0) {
        assert!(Instant::now() < deadline, "recovery did not promote at its target");
        std::thread::sleep(Duration::from_millis(100));
    }
    for call in ["SELECT snowflake_id()", "SELECT sharded_id(5)"] {
        let err = db.query_one(call, &[]).expect_err("a point-in-time recovery in standby mode is held");
        assert_eq!(sqlstate(&err), "55000", "{call}: {err}");
    }
    drop(db);
    copy.stop();
}
