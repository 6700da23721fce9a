//! The snowflake mark's standby wait and the counters' two-phase commit
//! against what an adversary tries (SPEC §13.2, §13.3, §13.4, §13.8); each
//! test failed on 0.2.0.

use pg_ticket_integration::{sqlstate, Cluster};
use postgres::Client;
use std::time::{Duration, Instant};

fn reload_with_standby(c: &Cluster, names: Option<&str>) {
    let mut admin = c.connect();
    match names {
        Some(names) => admin.batch_execute(&format!("ALTER SYSTEM SET synchronous_standby_names = '{names}'")).unwrap(),
        None => admin.batch_execute("ALTER SYSTEM RESET synchronous_standby_names").unwrap(),
    }
    admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    std::thread::sleep(Duration::from_millis(300));
}

/// The pid of the one backend of `user` waiting for the synchronous
/// standby, once it waits (up to 10 s).
fn waiting_for_standby(admin: &mut Client, user: &str) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(row) = admin
            .query_opt("SELECT pid FROM pg_stat_activity WHERE usename = $1 AND wait_event = 'SyncRep' LIMIT 1", &[&user])
            .unwrap()
        {
            return row.get(0);
        }
        assert!(Instant::now() < deadline, "no backend of {user} waits for the synchronous standby");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Time for the mark's reservation to run out, so the next call writes it.
fn until_the_mark_is_written_again() {
    std::thread::sleep(Duration::from_millis(2_500));
}

#[test]
fn the_marks_standby_wait_holds_for_every_session_and_a_cancelled_or_terminated_wait_issues_nothing() {
    let c = Cluster::start("mark-syncrep", 55488, &[]);
    let mut admin = c.connect();
    admin.batch_execute("CREATE ROLE mark_plain LOGIN").unwrap();
    // The database's first use records its ID space under a lock that a
    // writer waiting for the standby would hold: made before, and the
    // mark's reservation let run out.
    admin.query_one("SELECT snowflake_id()", &[]).unwrap();
    until_the_mark_is_written_again();
    reload_with_standby(&c, Some("nobody"));

    // A session that says synchronous_commit = local still waits for the
    // standby (0.2.0: an ID at once, under a mark no standby had), and its
    // cancelled wait (statement_timeout) is a refusal, not an ID.
    let mut local = c.connect_as("mark_plain", "postgres");
    local.batch_execute("SET synchronous_commit = local; SET statement_timeout = '1s'").unwrap();
    match local.query_one("SELECT snowflake_id()", &[]) {
        Ok(row) => panic!("snowflake {} stamped under a mark the standby never confirmed", row.get::<_, i64>(0)),
        Err(e) => assert_eq!(sqlstate(&e), "58030", "{e:?}"),
    }

    // A writer waiting for the standby holds the others: they wait for real
    // (0.2.0 gave up after ~10 ms with 58030) and their wait ends with their
    // own statement_timeout (57014).
    let writer = std::thread::spawn({
        let dsn = c.dsn_as("mark_plain", "postgres");
        move || postgres::Client::connect(&dsn, postgres::NoTls).unwrap().query_one("SELECT snowflake_id()", &[]).map(|r| r.get::<_, i64>(0))
    });
    let writer_pid = waiting_for_standby(&mut admin, "mark_plain");
    let mut other = c.connect();
    other.batch_execute("SET statement_timeout = '2s'").unwrap();
    let err = other.query_one("SELECT snowflake_id()", &[]).unwrap_err();
    assert_eq!(sqlstate(&err), "57014", "another backend's mark write is waited for, until our own timeout: {err:?}");
    // Waited out (10 s), the refusal names the standby wait, not the
    // storage (#31 item 8: 0.3.0 said "the storage under the data
    // directory may be stalled").
    other.batch_execute("SET statement_timeout = '20s'").unwrap();
    let err = other.query_one("SELECT snowflake_id()", &[]).unwrap_err();
    assert_eq!(sqlstate(&err), "55000", "{err:?}");
    let message = err.as_db_error().map(|e| e.message().to_string()).unwrap_or_default();
    assert!(message.contains("synchronous standbys"), "{message}");
    // The writer's wait cancelled: a refusal, not an ID.
    admin.query_one("SELECT pg_cancel_backend($1)", &[&writer_pid]).unwrap();
    match writer.join().unwrap() {
        Ok(id) => panic!("snowflake {id} stamped after a cancelled standby wait"),
        Err(e) => assert_eq!(sqlstate(&e), "58030", "{e:?}"),
    }

    // An ordinary role terminates its own waiting session: the server's
    // generator is not wedged (0.2.0: 58030 "waited 10000 ms for another
    // backend" on every call until a restart).
    let victim = std::thread::spawn({
        let dsn = c.dsn_as("mark_plain", "postgres");
        move || postgres::Client::connect(&dsn, postgres::NoTls).unwrap().query_one("SELECT snowflake_id()", &[]).is_ok()
    });
    let victim_pid = waiting_for_standby(&mut admin, "mark_plain");
    let mut same_role = c.connect_as("mark_plain", "postgres");
    let ended: bool = same_role.query_one("SELECT pg_terminate_backend($1)", &[&victim_pid]).unwrap().get(0);
    assert!(ended);
    assert!(!victim.join().unwrap(), "the terminated session got no ID");
    reload_with_standby(&c, None);
    until_the_mark_is_written_again();
    let ids: Vec<i64> = c.connect().query("SELECT snowflake_id() FROM generate_series(1, 1000)", &[]).unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(ids.len(), 1000);
    c.stop();
}

/// Found by review: PREPARE TRANSACTION skipped the durable commit, so a
/// session with synchronous_commit = local prepared numbers no standby had.
#[test]
fn prepare_transaction_waits_for_the_standby_like_commit() {
    let c = Cluster::start("prepare-syncrep", 55489, &[]);
    let mut admin = c.connect();
    admin.batch_execute("CREATE ROLE prep_user LOGIN").unwrap();
    reload_with_standby(&c, Some("nobody"));
    let preparer = std::thread::spawn({
        let dsn = c.dsn_as("prep_user", "postgres");
        move || {
            let mut s = postgres::Client::connect(&dsn, postgres::NoTls).unwrap();
            s.batch_execute("SET synchronous_commit = local; BEGIN").unwrap();
            let n: i64 = s.query_one("SELECT next_scoped_id('prep', 'd')", &[]).unwrap().get(0);
            s.batch_execute("PREPARE TRANSACTION 'p1'").map(|_| n)
        }
    });
    let pid = waiting_for_standby(&mut admin, "prep_user");
    admin.query_one("SELECT pg_cancel_backend($1)", &[&pid]).unwrap();
    // PostgreSQL's own rule: a cancelled wait leaves the PREPARE done here.
    assert_eq!(preparer.join().unwrap().unwrap(), 1);
    // ROLLBACK PREPARED waits for the standby too: let it go first.
    reload_with_standby(&c, None);
    admin.batch_execute("ROLLBACK PREPARED 'p1'").unwrap();
    c.stop();
}

/// Found by review: a transaction's state that could not grow aborted the
/// backend (a Rust allocation failure), and the postmaster reinitialised
/// the whole cluster. Now it is an ERROR (53200) for that transaction, and
/// the cap an ordinary role cannot raise.
#[test]
fn running_out_of_memory_for_a_transactions_scopes_is_an_error_not_a_crash() {
    let c = Cluster::start("oom", 55477, &[]);
    let mut admin = c.connect();
    admin.batch_execute("CREATE ROLE oom_plain LOGIN").unwrap();
    let err = c.connect_as("oom_plain", "postgres").batch_execute("SET pg_ticket.max_transaction_entries = 10000000").unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "an ordinary role may not raise the cap: {err:?}");

    let started: String = admin.query_one("SELECT pg_postmaster_start_time()::text", &[]).unwrap().get(0);
    let postmaster: i32 = admin.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    let postmaster = std::fs::read_to_string(format!("/proc/{postmaster}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("PPid:")).map(|l| l[5..].trim().to_string()))
        .unwrap();
    let vm_kb: u64 = std::fs::read_to_string(format!("/proc/{postmaster}/status"))
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmSize:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap()
        .parse()
        .unwrap();
    // New backends inherit the postmaster's address-space limit: 48 MB
    // more than it has, far less than a million scopes need.
    let limit = (vm_kb + 48 * 1024) * 1024;
    // The soft limit, as the cluster's OS user (root may lack the capability
    // to change another user's limits in a container).
    let prlimit = ["prlimit".to_string(), "--pid".into(), postmaster.clone(), format!("--as={limit}:")];
    let status = if std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m)).unwrap_or(1) == 0 {
        std::process::Command::new("runuser").args(["-u", "postgres", "--"]).args(&prlimit).status()
    } else {
        std::process::Command::new(&prlimit[0]).args(&prlimit[1..]).status()
    };
    assert!(status.unwrap().success(), "prlimit");
    let mut big = c.connect();
    big.batch_execute("SET pg_ticket.max_transaction_entries = 10000000; BEGIN").unwrap();
    let err = big.query_one("SELECT count(next_scoped_id('oom' || g, 'd')) FROM generate_series(1, 1000000) g", &[]).unwrap_err();
    assert_eq!(sqlstate(&err), "53200", "{err:?}");
    drop(big);
    let now: String = c.connect_when_ready().query_one("SELECT pg_postmaster_start_time()::text", &[]).unwrap().get(0);
    assert_eq!(now, started, "the server was not reinitialised");
    let restarts = std::fs::read_to_string(c.dir.join("server.log")).unwrap().matches("terminated by signal").count();
    assert_eq!(restarts, 0, "no backend died");
    c.stop();
}

/// Found by review: the mark's record held DELAY_CHKPT_START across the
/// standby wait, so a checkpoint (which is also what applies a changed
/// synchronous_standby_names) waited for the standby too, and every commit
/// on the server behind it.
#[test]
fn a_mark_waiting_for_a_standby_holds_up_no_checkpoint() {
    let c = Cluster::start("mark-checkpoint", 55491, &[]);
    let mut admin = c.connect();
    admin.batch_execute("CREATE ROLE ckpt_plain LOGIN").unwrap();
    reload_with_standby(&c, Some("nobody"));
    let writer = std::thread::spawn({
        let dsn = c.dsn_as("ckpt_plain", "postgres");
        move || postgres::Client::connect(&dsn, postgres::NoTls).unwrap().query_one("SELECT snowflake_id()", &[]).is_ok()
    });
    let pid = waiting_for_standby(&mut admin, "ckpt_plain");
    admin.batch_execute("SET statement_timeout = '20s'").unwrap();
    admin.batch_execute("CHECKPOINT").expect("the checkpoint does not wait for the mark's standby wait");
    // Clearing the standby setting releases the writer, as for any commit.
    admin.batch_execute("ALTER SYSTEM RESET synchronous_standby_names").unwrap();
    admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while admin.query_opt("SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'SyncRep'", &[&pid]).unwrap().is_some() {
        assert!(Instant::now() < deadline, "the writer still waits after the standby setting was cleared");
        std::thread::sleep(Duration::from_millis(50));
    }
    writer.join().unwrap();
    c.stop();
}

/// Found by review: the lease registry's durable commit was set inside the
/// owner's block, whose settings are undone after it, so a caller with
/// synchronous_commit = off got a grant that a crash could forget (and a
/// standby never had). Since #46 item 6 a grant waits twice: first for its
/// line in the lease ledger (refused if that wait is cancelled: nothing has
/// committed, and a promoted standby must know every lease its primary may
/// have granted), then at its commit (cancelled, PostgreSQL commits here
/// with a warning, as for any commit).
#[test]
fn a_lease_granted_to_a_session_with_synchronous_commit_off_waits_for_the_standby() {
    let c = Cluster::start("lease-durable", 55492, &[]);
    let mut admin = c.connect();
    admin.batch_execute("CREATE ROLE lease_user LOGIN").unwrap();
    admin.batch_execute("GRANT EXECUTE ON FUNCTION pgticket.lease_machine_id(text, interval) TO lease_user").unwrap();
    // A registry's first grant writes its mark (waiting for the standby
    // too): written before, so that the waits cancelled are the grant's.
    admin.query_one("SELECT snowflake_id()", &[]).unwrap();
    reload_with_standby(&c, Some("nobody"));
    let leaser = |admin: &mut Client| {
        let leaser = std::thread::spawn({
            let dsn = c.dsn_as("lease_user", "postgres");
            move || {
                let mut s = postgres::Client::connect(&dsn, postgres::NoTls).unwrap();
                s.batch_execute("SET synchronous_commit = off").unwrap();
                s.query_one("SELECT machine_id FROM pgticket.lease_machine_id('durable', '30 seconds')", &[]).map(|r| r.get::<_, i32>(0))
            }
        });
        let pid = waiting_for_standby(admin, "lease_user");
        admin.query_one("SELECT pg_cancel_backend($1)", &[&pid]).unwrap();
        leaser.join().unwrap()
    };
    let leases = |admin: &mut Client| -> i64 {
        admin.query_one("SELECT count(*) FROM pgticket.machine_id_leases WHERE holder = 'durable'", &[]).unwrap().get(0)
    };
    // Two lines are new (the registry's settings, then the lease): each
    // wait cancelled refuses the grant and leaves no lease; each line stays
    // in the ledger (it says too much, never too little), so the same grant
    // again waits at the next, then at its commit only.
    let mut refusals = 0;
    let id = loop {
        match leaser(&mut admin) {
            Ok(id) => break id,
            Err(refused) => {
                let e = refused.as_db_error().expect("a database error");
                assert_eq!(e.code().code(), "55000", "{e:?}");
                assert!(e.message().contains("lease ledger") && e.message().contains("nothing is granted"), "{e:?}");
                assert!(e.hint().is_some_and(|h| h.contains("synchronous_standby_names")), "{e:?}");
                assert_eq!(leases(&mut admin), 0, "a refused grant left a lease");
                refusals += 1;
                assert!(refusals <= 2, "a grant refused more often than it has new ledger lines");
            }
        }
    };
    assert_eq!(refusals, 2, "each new ledger line waits for the standby");
    assert!(id > 0);
    assert_eq!(leases(&mut admin), 1);
    c.stop();
}

/// Found by review: synchronous_standby_names set on a server without WAL
/// senders (PostgreSQL then waits for nothing) refused every snowflake and
/// ticket as "not confirmed".
#[test]
fn standby_names_without_wal_senders_refuse_nothing() {
    let c = Cluster::start("no-senders", 55493, &["max_wal_senders = 0", "synchronous_standby_names = '*'"]);
    let mut db = c.connect();
    db.query_one("SELECT snowflake_id()", &[]).expect("a snowflake");
    let t: i64 = db.query_one("SELECT next_ticket('s', 'd')", &[]).expect("a ticket").get(0);
    assert_eq!(t, 1);
    c.stop();
}
