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
//! replaced whole: write, flush, rename).
//! Only a preloading server writes it (the records need its resource
//! manager); a registry that loads the library on demand keeps none, and
//! its server stamps no snowflake either.

use std::path::Path;

use pgrx::prelude::*;
use pgrx::{pg_shmem_init, pg_sys, PGRXSharedMemory, PgLwLock};
use ticket_core::leases::LeaseError;
use ticket_core::ledger::{Ledger, Line, OwnIdRefusal};

use crate::backend_local::BackendLocal;
use crate::clock::{now_unix_ms, timeline_start_ms};
use crate::errors::TicketError;
use crate::settings;

pub const LEDGER_FILE: &str = "pg_ticket_leases.ledger";

fn read() -> Result<Ledger, String> {
    match std::fs::read_to_string(LEDGER_FILE) {
        Ok(text) => Ledger::parse(&text).map_err(|e| format!("the lease ledger {LEDGER_FILE} is damaged: {e}")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Ledger::default()),
        Err(e) => Err(format!("cannot read the lease ledger {LEDGER_FILE}: {e}")),
    }
}

fn apply_to_file(line: &Line) -> Result<(), String> {
    let mut ledger = read()?;
    if ledger.apply(line) {
        ticket_core::snowflake::write_atomically(Path::new(LEDGER_FILE), &ledger.text())?;
    }
    Ok(())
}

/// A record replayed (crash recovery, a standby): the file takes it in.
pub(super) fn replay(text: &str) -> Result<(), String> {
    apply_to_file(&Line::parse(text)?)
}

/// The writers' lock (no data of its own).
#[derive(Clone, Copy, Default)]
pub struct Writers;

// No data: valid in shared memory.
unsafe impl PGRXSharedMemory for Writers {}

static WRITERS: PgLwLock<Writers> = unsafe { PgLwLock::new(c"pg_ticket_lease_ledger") };

pub fn init_shared_memory() {
    pg_shmem_init!(WRITERS);
}

fn record(line_of: impl Fn(&Ledger) -> Option<Line>) -> Result<(), TicketError> {
    if !settings::preloaded() {
        return Ok(());
    }
    // Most calls record nothing (a renewal within the line written ahead):
    // they take no lock.
    if line_of(&read().map_err(TicketError::BadConfiguration)?).is_none() {
        return Ok(());
    }
    let (text, lsn) = {
        let _writing = WRITERS.exclusive();
        let ledger = read().map_err(TicketError::BadConfiguration)?;
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
    let ledger = read().map_err(TicketError::BadConfiguration)?;
    Ok((ledger.max_ttl_ms, ledger.margin_ms))
}

/// Found clear in this backend (a start's server never grants its own id,
/// and the refusal after a start only ends).
static OWN_ID_CLEAR: BackendLocal<bool> = BackendLocal::new(false);

/// SPEC §17.4 per server (#46 item 6): the fixed id `own` is refused while
/// a lease of it is in the ledger, and after this server's promotion while
/// it is among the ids a registry of its timeline may lease (longest ttl
/// plus margin, of the ledger and of this server's settings). Checked in every database, before the
/// first stamp; not during recovery (nothing is stamped then).
pub fn check_own_id(own: u16) -> Result<(), TicketError> {
    if OWN_ID_CLEAR.get() {
        return Ok(());
    }
    let mut ledger = read().map_err(TicketError::BadConfiguration)?;
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
            OWN_ID_CLEAR.set(true);
            Ok(())
        }
        Some(OwnIdRefusal::Leased { until_ms }) => Err(LeaseError::OwnIdInLedger { machine_id: own, until_ms }.into()),
        Some(OwnIdRefusal::Leasable { until_ms }) => Err(LeaseError::OwnIdLeasable { machine_id: own, until_ms }.into()),
    }
}
