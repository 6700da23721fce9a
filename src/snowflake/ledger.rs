//! This server's lease ledger (`ticket_core::ledger`): the file
//! `pg_ticket_leases.ledger` beside the mark, each line written to WAL
//! first (`wal`, `XLOG_LEDGER`) so that crash recovery, a base backup and
//! a standby's replay carry it as they carry the mark (#46 item 6).
//!
//! Written by the registries of every database of the server, before a
//! grant or renewal commits (a transaction that rolls back leaves a line
//! that says too much, never too little); read by `snowflake_id()` before
//! its first stamp in each backend (any database), and by a registry's
//! hold-off (the longest ttl and margin its timeline recorded).
//!
//! Locking: writers serialise on one LWLock, held only while a line is
//! logged and the file replaced (a WAL flush and a file write, as
//! PostgreSQL holds its own LWLocks over I/O), never across a transaction
//! or the synchronous standbys' wait: a grant left open in a transaction
//! holds nothing of it (§13.11). Readers take no lock (the file is
//! replaced whole: write, flush, rename). An atomic generation in shared
//! memory moves after every change of the file (read before the file, so a
//! reader that raced a writer reads again at its next stamp).
//! Only a preloading server writes it (the records need its resource
//! manager); a registry that loads the library on demand keeps none, and
//! its server stamps no snowflake either.

use std::path::Path;

use pgrx::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};

use pgrx::{pg_shmem_init, pg_sys, PGRXSharedMemory, PgAtomic, PgLwLock};
use ticket_core::leases::LeaseError;
use ticket_core::ledger::{Ledger, Line, OwnIdRefusal};

use crate::backend_local::BackendLocal;
use crate::clock::{now_unix_ms, timeline_start_ms};
use crate::errors::TicketError;
use crate::settings;

pub const LEDGER_FILE: &str = "pg_ticket_leases.ledger";

/// Where a ledger found damaged at replay is moved aside (kept for the
/// administrator; the replay goes on with the lines that parse).
pub const DAMAGED_FILE: &str = "pg_ticket_leases.ledger.damaged";

/// The file's text; bytes that are not UTF-8 become U+FFFD, so a line
/// holding them reads as damaged, not the whole file as unreadable (review:
/// a replay stopped on it, and the server did not start).
fn read_text() -> Result<String, String> {
    // One line per id and one of settings: far below this.
    const MOST_BYTES: u64 = 4 << 20;
    if let Ok(meta) = std::fs::metadata(LEDGER_FILE) {
        if meta.len() > MOST_BYTES {
            return Err(format!("the lease ledger {LEDGER_FILE} is {} bytes, more than any ledger holds", meta.len()));
        }
    }
    match std::fs::read(LEDGER_FILE) {
        Ok(bytes) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(format!("cannot read the lease ledger {LEDGER_FILE}: {e}")),
    }
}

fn read() -> Result<Ledger, TicketError> {
    let text = read_text().map_err(TicketError::BadConfiguration)?;
    Ledger::parse(&text).map_err(|why| TicketError::DamagedLedger { why })
}

fn apply_to_file(line: &Line) -> Result<(), String> {
    let mut ledger = read().map_err(|e| e.to_string())?;
    if ledger.apply(line) {
        write(&ledger)?;
    }
    Ok(())
}

fn write(ledger: &Ledger) -> Result<(), String> {
    ticket_core::snowflake::write_atomically(Path::new(LEDGER_FILE), &ledger.text())?;
    GENERATION.get().0.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

/// A record replayed (crash recovery, a standby): the file takes it in. A
/// damaged file does not stop the replay (a standby that cannot replay
/// stops following its primary, and a server that cannot recover does
/// not start): its lines that parse are kept with the record's, the file
/// is moved aside, and the lines lost are named in a WARNING.
pub(super) fn replay(text: &str) -> Result<(), String> {
    let line = Line::parse(text)?;
    let (mut ledger, damaged) = match read_text() {
        Ok(text) => Ledger::parse_lenient(&text),
        // Too big, or unreadable: nothing of it is kept.
        Err(why) => (Ledger::default(), vec![why]),
    };
    if damaged.is_empty() {
        if ledger.apply(&line) {
            write(&ledger)?;
        }
        return Ok(());
    }
    std::fs::rename(LEDGER_FILE, DAMAGED_FILE).map_err(|e| format!("cannot move the damaged lease ledger aside: {e}"))?;
    ledger.apply(&line);
    write(&ledger)?;
    // Named, but a few and short: a huge damaged file must not make a
    // message past what the server can hold.
    let named: Vec<String> = damaged.iter().take(3).map(|l| l.chars().take(80).collect()).collect();
    pgrx::warning!(
        "pg_ticket: the lease ledger {LEDGER_FILE} was damaged: moved aside to {DAMAGED_FILE}, and kept without its {} line(s) that do not parse (the first: {named:?}); a lease they recorded is not checked until it is recorded again (its holder's next renewal)",
        damaged.len()
    );
    Ok(())
}

/// Moved by every change of the file: a backend that found its own id
/// clear checks again after any new line (a lease recorded from a
/// restore or a registry's first preloaded use).
#[derive(Default)]
pub struct Generation(AtomicU64);

// An atomic only.
unsafe impl PGRXSharedMemory for Generation {}

static GENERATION: PgAtomic<Generation> = unsafe { PgAtomic::new(c"pg_ticket_lease_ledger_generation") };

/// The writers' lock (no data of its own).
#[derive(Clone, Copy, Default)]
pub struct Writers;

// No data: valid in shared memory.
unsafe impl PGRXSharedMemory for Writers {}

static WRITERS: PgLwLock<Writers> = unsafe { PgLwLock::new(c"pg_ticket_lease_ledger") };

pub fn init_shared_memory() {
    pg_shmem_init!(WRITERS);
    pg_shmem_init!(GENERATION);
}

fn record(line_of: impl Fn(&Ledger) -> Option<Line>) -> Result<(), TicketError> {
    if !settings::preloaded() {
        return Ok(());
    }
    // Most calls record nothing (a renewal within the line written ahead):
    // they take no lock.
    if line_of(&read()?).is_none() {
        return Ok(());
    }
    let (text, lsn) = {
        let _writing = WRITERS.exclusive();
        let ledger = read()?;
        let Some(line) = line_of(&ledger) else { return Ok(()) };
        let text = line.text();
        let lsn = super::wal::logged_ledger_write(&text, || apply_to_file(&line));
        (text, lsn)
    };
    if !crate::xact::wait_for_synchronous_standbys(lsn) {
        return Err(TicketError::LedgerNotConfirmed { line: text });
    }
    Ok(())
}

/// Before a grant or renewal of `id` for `ttl_ms` whose holder may stamp
/// until `free_from_ms` (its end plus the margin).
pub fn record_lease(id: u16, free_from_ms: i64, ttl_ms: i64) -> Result<(), TicketError> {
    record(|ledger| ledger.lease_to_record(id, free_from_ms, ttl_ms))
}

/// Before a grant: the registry's settings now and the ids it may lease.
pub fn record_registry(max_ttl_ms: i64, margin_ms: i64, ids: &[u16]) -> Result<(), TicketError> {
    record(|ledger| ledger.registry_to_record(max_ttl_ms, margin_ms, ids))
}

/// The longest ttl and margin any registry of this server's timeline
/// recorded (0 where none did), for a registry's hold-off.
pub fn longest_ttl_and_margin() -> Result<(i64, i64), TicketError> {
    let ledger = read()?;
    Ok((ledger.max_ttl_ms, ledger.margin_ms))
}

/// A lease found in a registry's rows that no grant of a preloaded server
/// recorded (rows restored or loaded from outside, a registry that ran
/// before its server preloaded pg_ticket): recorded as it stands.
pub fn record_found_lease(id: u16, free_from_ms: i64) -> Result<(), TicketError> {
    record(|ledger| ledger.lease_to_record(id, free_from_ms, 0))
}

/// The ledger's generation at which this backend found its own id clear:
/// a server never grants its own id, and the refusal after a start only
/// ends, but a lease recorded from outside a grant (a restore, a
/// registry's first preloaded use) moves the generation.
static OWN_ID_CLEAR: BackendLocal<Option<(u64, u16)>> = BackendLocal::new(None);

pub fn check_own_id(own: u16) -> Result<(), TicketError> {
    let generation = GENERATION.get().0.load(Ordering::Acquire);
    if OWN_ID_CLEAR.get() == Some((generation, own)) {
        return Ok(());
    }
    let mut ledger = read()?;
    // This server's own settings count as well: a standby set higher than
    // its primary's record (review of item 6).
    ledger.max_ttl_ms = ledger.max_ttl_ms.max(settings::lease_max_ttl_ms());
    ledger.margin_ms = ledger.margin_ms.max(settings::lease_margin_ms());
    // Grants lost in flight exist only across a promotion (or a recovery
    // that ended on a timeline of its own): a restart replays all of this
    // server's WAL, so its ledger is whole (review: a hold at every
    // restart that no setting could end).
    let timeline = unsafe { pg_sys::GetWALInsertionTimeLine() } as i32;
    let began_ms = timeline_start_ms(timeline).unwrap_or(i64::MIN);
    match ledger.own_id_refused_until(own, began_ms, now_unix_ms()) {
        None => {
            OWN_ID_CLEAR.set(Some((generation, own)));
            Ok(())
        }
        Some(OwnIdRefusal::Leased { until_ms }) => Err(LeaseError::OwnIdInLedger { machine_id: own, until_ms }.into()),
        Some(OwnIdRefusal::Leasable { until_ms }) => Err(LeaseError::OwnIdLeasable { machine_id: own, until_ms }.into()),
    }
}
