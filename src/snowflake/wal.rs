//! The snowflake mark in WAL (SPEC §10): every time the reserved mark is
//! moved ahead, the new value is written to WAL (a record of pg_ticket's
//! own resource manager) and flushed before the file is written and any ID
//! is stamped with it. A standby's startup process replays the record into
//! the standby's own mark file, so a promoted standby starts above what the
//! old primary had reserved — not only above the file it copied at
//! pg_basebackup time, and whatever its own clock says.
//!
//! Why a custom resource manager (PostgreSQL 15+): the generator is one per
//! server, and its mark must follow the server's WAL, not a database's. A
//! sequence or a generic-WAL page would live in one database's relation;
//! this record belongs to no database, costs one small WAL record per mark
//! move (about two per second under load, none when idle), and its replay
//! feeds the same file a restart reads, so restart and failover share one
//! mechanism. With synchronous replication the record is also waited for
//! like a commit, so a synchronous standby has it before any ID uses it.
//!
//! The record's resource-manager id (`RMGR_ID`) must be free on the
//! server: another extension registering the same id stops the server at
//! start with a message. Standbys must preload pg_ticket too (they replay
//! the records), and a server that wrote such WAL must keep pg_ticket
//! preloaded until a clean shutdown or checkpoint has passed its last one.
//!
//! The same resource manager carries the shard book of `sharded_id()`
//! (which shards this server accepted or released, `XLOG_SHARD`): a
//! standby replays it into its own book file, so a shard released on the
//! primary stays released on a promoted standby, and one accepted there is
//! accepted there too.
//!
//! And the lease ledger (`ledger`, `XLOG_LEDGER`): which ids this server's
//! registries leased out, and their longest ttl, replayed the same way.
//!
//! Touches: WAL (insert, flush, sync-rep wait), the mark file, the shard
//! book file and the ledger file. Runs in the backend that moves the mark
//! or changes the book (holding the generator's `busy` flag, no LWLock) or
//! writes the ledger (holding its lock, `ledger`) and, on replay, in the
//! startup process.

use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::CStr;
use std::path::Path;
use ticket_core::sharded::{BookFile, ShardBook, Standing};
use ticket_core::snowflake::{FileMarkStore, IdSpace, MarkStore, SnowflakeError};

use super::{MARK_FILE, SHARD_BOOK_FILE};

/// pg_ticket's resource manager id, in PostgreSQL's custom range (128-255).
pub const RMGR_ID: u8 = 157;
const RMGR_NAME: &CStr = c"pg_ticket_snowflake";
/// The only record kind: "the mark is now at least this" (Unix ms, i64 LE),
/// then (0.3.0) the ID space it is for: epoch (Unix ms, i64 LE) and machine
/// bits (u32 LE). A record of 0.2.0 holds the mark alone.
const XLOG_MARK: u8 = 0x00;
const RECORD_LEN: usize = 20;
/// "Shard S is now accepted (1) / released (2) at point P": S u16 LE, the
/// kind u8, P (a sharded state, `ms << 10 | sequence`) u64 LE.
const XLOG_SHARD: u8 = 0x10;
const SHARD_RECORD_LEN: usize = 11;
/// A line of the lease ledger (`ledger`), its text as in the file.
const XLOG_LEDGER: u8 = 0x20;

static mut RMGR: pg_sys::RmgrData = pg_sys::RmgrData {
    rm_name: RMGR_NAME.as_ptr(),
    rm_redo: Some(redo),
    rm_desc: Some(desc),
    rm_identify: Some(identify),
    rm_startup: None,
    rm_cleanup: None,
    rm_mask: None,
    rm_decode: None,
};

/// At preload only (PostgreSQL's rule for custom resource managers).
pub fn register() {
    unsafe { pg_sys::RegisterCustomRmgr(RMGR_ID, std::ptr::addr_of_mut!(RMGR) as _) };
}

/// The mark file, with every save written to WAL first.
pub struct WalMarkStore;

impl MarkStore for WalMarkStore {
    fn load(&self) -> Result<Option<i64>, SnowflakeError> {
        file().load()
    }

    fn save(&self, reserved_until_unix_ms: i64) -> Result<(), String> {
        let space = super::id_space();
        let mut bytes = [0u8; RECORD_LEN];
        bytes[..8].copy_from_slice(&reserved_until_unix_ms.to_le_bytes());
        bytes[8..16].copy_from_slice(&space.epoch_unix_ms.to_le_bytes());
        bytes[16..].copy_from_slice(&space.machine_bits.to_le_bytes());
        // A mark in the file that no ID uses yet is harmless (higher is
        // always safe); no ID is stamped under it until the standbys have
        // it: the caller raises its reservation only on Ok.
        logged_write(XLOG_MARK, &bytes, &format!("the new snowflake mark ({reserved_until_unix_ms} Unix ms)"), || file().save(reserved_until_unix_ms)).map_err(|NotReplicated| {
            "the synchronous standbys did not confirm the new snowflake mark (the wait was cancelled or \
                 the session is ending): no ID is stamped under it"
                .into()
        })
    }

    fn location(&self) -> String {
        file().location()
    }
}

/// The synchronous standbys did not confirm a record (the wait was
/// cancelled or the session is ending).
struct NotReplicated;

/// A WAL record of ours, flushed, then the file it stands for written by
/// `write_file`, then the synchronous standbys' confirmation awaited.
/// A record in WAL is in effect (SPEC §17.2): standbys replay it, so a
/// file write that fails after it must not leave the server running on
/// the older file, which a clean restart would believe (a released shard
/// issuing again). It stops the server as PostgreSQL stops on a failed
/// write of its own state (PANIC): crash recovery replays the record into
/// the file, or the server does not start while the file cannot be
/// written. The
/// caller holds the generator's writer flag (freed at exit by MarkWriter).
/// A checkpoint may not start between the record and the file write (a
/// base backup whose start checkpoint fell between them would copy the old
/// file and never replay the record), as PostgreSQL guards its own
/// record-then-file writes; held for those two writes only, never across
/// the standby wait: the checkpointer is also what applies a changed
/// synchronous_standby_names and releases waiters. Only while issuing,
/// never during recovery.
fn logged_write(info: u8, bytes: &[u8], what: &str, write_file: impl FnOnce() -> Result<(), String>) -> Result<(), NotReplicated> {
    let _writing = super::MarkWriter::enter();
    let lsn = logged_write_unwaited(info, bytes, what, write_file);
    let _waiting = super::StandbyWaiting::begin();
    if !crate::xact::wait_for_synchronous_standbys(lsn) {
        return Err(NotReplicated);
    }
    Ok(())
}

/// A line of the lease ledger: in WAL, then in the file (as `logged_write`,
/// by a caller holding the ledger's lock rather than the generator's
/// writer flag, who waits for the synchronous standbys once it let go).
pub fn logged_ledger_write(line: &str, write_file: impl FnOnce() -> Result<(), String>) -> pg_sys::XLogRecPtr {
    logged_write_unwaited(XLOG_LEDGER, line.as_bytes(), &format!("the lease ledger's line {line:?}"), write_file)
}

/// The record and the file write of `logged_write`, with checkpoints held
/// off between them; the record's position.
fn logged_write_unwaited(info: u8, bytes: &[u8], what: &str, write_file: impl FnOnce() -> Result<(), String>) -> pg_sys::XLogRecPtr {
    let _no_checkpoint = DelayCheckpointStart::new();
    let lsn = unsafe {
        pg_sys::XLogBeginInsert();
        pg_sys::XLogRegisterData(bytes.as_ptr() as _, bytes.len() as _);
        let lsn = pg_sys::XLogInsert(RMGR_ID, info);
        pg_sys::XLogFlush(lsn);
        lsn
    };
    if let Err(e) = write_file() {
        pgrx::ereport!(
            PANIC,
            PgSqlErrorCode::ERRCODE_IO_ERROR,
            format!("pg_ticket: {what} is in WAL but its file could not be written: {e}"),
            "The server stops so that the record is not forgotten: crash recovery writes the file from WAL once the data directory is writable (free space, permissions)."
        );
    }
    lsn
}

/// The shard book file, with every change written to WAL first.
pub struct WalShardBook;

/// Present from a start that cannot prove the shard book is this server's
/// latest until the book's accepted shards are held (its first load).
pub const HOLD_MARKER: &str = "pg_ticket_shards.hold";

/// At preload, in the postmaster, for a start from a base backup or a
/// point-in-time recovery (`start`): it may be an old copy started in the
/// server's place, whose book says it owns shards that moved since and
/// whose mark is older than what its old self stamped (SPEC §17.1). It
/// holds both, as the registry holds off: its accepted shards until
/// accepted again, every snowflake and sharded ID until vouched for
/// (`history`). A standby follows its primary's WAL, records of the mark
/// and the shards included, and is not held. A crash restart, and a cold
/// copy or a file system snapshot (no backup_label), look alike and are
/// not held: the docs say so.
pub fn hold_a_restored_start() -> Result<(), String> {
    if Path::new(HOLD_MARKER).exists() {
        return Ok(());
    }
    ticket_core::snowflake::write_atomically(Path::new(HOLD_MARKER), "accepted shards are held until accepted again\n")
        .map_err(|e| format!("this start is from a base backup or a point-in-time recovery, and {e}"))
}

pub fn book_file() -> BookFile<'static> {
    BookFile { path: Path::new(SHARD_BOOK_FILE) }
}

impl ShardBook for WalShardBook {
    /// At the first load after a start that could not prove the book is
    /// the latest (`start`, at preload), every accepted shard is held first
    /// (SPEC §17.1): after recovery, so that the records it replayed are
    /// held too. Each hold is a WAL record before the marker goes (SPEC
    /// §20.3, #46 item 4): 0.4.0 rewrote the file alone, and a crash
    /// before the next checkpoint (a PITR promoted with `pg_ctl promote`,
    /// whose checkpoint is spread) replayed the old "accepted" records over
    /// it, and the copy issued the shards beside their new owners. During
    /// recovery nothing is loaded: the hold is applied once it ends.
    fn load(&self) -> Result<Vec<(u16, Standing)>, String> {
        let marker = Path::new(HOLD_MARKER);
        if marker.exists() {
            if unsafe { pg_sys::RecoveryInProgress() } {
                return Err("this server started from a base backup or a point-in-time recovery and is still in recovery: its accepted shards are held once it ends".into());
            }
            let holds = ticket_core::sharded::holds(&book_file().read()?);
            for &(shard, standing) in &holds {
                self.record(shard, standing)?;
            }
            if !holds.is_empty() {
                let held: Vec<String> = holds.iter().map(|(shard, _)| shard.to_string()).collect();
                pgrx::log!(
                    "pg_ticket: this server started from a base backup or a point-in-time recovery: shards {} are held until accepted again (pgticket.accept_shard)",
                    held.join(", ")
                );
            }
            std::fs::remove_file(marker).map_err(|e| format!("cannot remove {HOLD_MARKER}: {e}"))?;
            super::flush_data_directory()?;
        }
        book_file().read()
    }

    fn record(&self, shard: u16, standing: Standing) -> Result<(), String> {
        // A damaged book is refused before anything is logged: a record it
        // could not be applied to would be replayed at the next start.
        book_file().read()?;
        let mut bytes = [0u8; SHARD_RECORD_LEN];
        bytes[..2].copy_from_slice(&shard.to_le_bytes());
        let (kind, point) = match standing {
            Standing::Accepted(p) => (1u8, p),
            Standing::Released(p) => (2u8, p),
            Standing::Held(p) => (3u8, p),
        };
        bytes[2] = kind;
        bytes[3..].copy_from_slice(&point.to_le_bytes());
        logged_write(XLOG_SHARD, &bytes, &format!("the shard book's new standing of shard {shard}"), || book_file().set(shard, standing)).map_err(
            |NotReplicated| {
                format!(
                    "the synchronous standbys did not confirm the shard book's new standing of shard {shard} (the wait was cancelled or the session is ending)"
                )
            },
        )
    }
}

fn record_data(record: *mut pg_sys::XLogReaderState) -> &'static [u8] {
    unsafe {
        let decoded = (*record).record;
        if decoded.is_null() {
            return &[];
        }
        std::slice::from_raw_parts((*decoded).main_data as *const u8, (*decoded).main_data_len as usize)
    }
}

fn record_info(record: *mut pg_sys::XLogReaderState) -> u8 {
    unsafe {
        let decoded = (*record).record;
        if decoded.is_null() { 0xff } else { (*decoded).header.xl_info & !(pg_sys::XLR_INFO_MASK as u8) }
    }
}

/// A shard record's shard and standing.
fn record_shard(record: *mut pg_sys::XLogReaderState) -> Option<(u16, Standing)> {
    let data = record_data(record);
    if data.len() != SHARD_RECORD_LEN {
        return None;
    }
    let shard = u16::from_le_bytes(data[..2].try_into().ok()?);
    let point = u64::from_le_bytes(data[3..].try_into().ok()?);
    match data[2] {
        1 => Some((shard, Standing::Accepted(point))),
        2 => Some((shard, Standing::Released(point))),
        3 => Some((shard, Standing::Held(point))),
        _ => None,
    }
}

/// `DELAY_CHKPT_START` for this backend while alive (RecordTransactionCommit
/// does the same around its commit record and clog update).
struct DelayCheckpointStart;

/// PostgreSQL's `DELAY_CHKPT_START` (proc.h, 15 and later).
const DELAY_CHKPT_START: i32 = 1 << 0;

impl DelayCheckpointStart {
    fn new() -> Self {
        unsafe { (*pg_sys::MyProc).delayChkptFlags |= DELAY_CHKPT_START };
        DelayCheckpointStart
    }
}

impl Drop for DelayCheckpointStart {
    fn drop(&mut self) {
        unsafe { (*pg_sys::MyProc).delayChkptFlags &= !DELAY_CHKPT_START };
    }
}

/// The mark file, for this server's ID space.
pub fn file() -> FileMarkStore<'static> {
    FileMarkStore { path: Path::new(MARK_FILE), space: super::id_space() }
}

/// A record's mark and the ID space it is for (one of 0.2.0 is in this
/// server's epoch and 0.2.0's one layout).
fn record_mark(record: *mut pg_sys::XLogReaderState) -> Option<(i64, IdSpace)> {
    unsafe {
        let decoded = (*record).record;
        let len = if decoded.is_null() { 0 } else { (*decoded).main_data_len as usize };
        if len != 8 && len != RECORD_LEN {
            return None;
        }
        let data = std::slice::from_raw_parts((*decoded).main_data as *const u8, len);
        let mark = i64::from_le_bytes(data[..8].try_into().ok()?);
        let space = if len == RECORD_LEN {
            IdSpace {
                epoch_unix_ms: i64::from_le_bytes(data[8..16].try_into().ok()?),
                machine_bits: u32::from_le_bytes(data[16..].try_into().ok()?),
            }
        } else {
            IdSpace::of_0_2_0(super::id_space().epoch_unix_ms)
        };
        Some((mark, space))
    }
}

/// Replay: the file takes the record's mark unless it already holds a
/// later one (replaying a primary's own WAL after a crash changes nothing).
/// A damaged file is replaced: the record is the primary's word.
#[pg_guard]
unsafe extern "C-unwind" fn redo(record: *mut pg_sys::XLogReaderState) {
    if record_info(record) == XLOG_LEDGER {
        let line = std::str::from_utf8(record_data(record)).unwrap_or_default();
        if let Err(e) = super::ledger::replay(line) {
            pgrx::error!("pg_ticket: cannot replay the lease ledger's line {line:?}: {e}");
        }
        return;
    }
    if record_info(record) == XLOG_SHARD {
        let Some((shard, standing)) = record_shard(record) else {
            pgrx::error!("pg_ticket: a shard book WAL record of the wrong form");
        };
        // The primary's word: the standing it recorded replaces this one's.
        match book_file().set_replacing_damage(shard, standing) {
            Ok(false) => {}
            Ok(true) => pgrx::warning!(
                "pg_ticket: the shard book {SHARD_BOOK_FILE} was damaged: moved aside, and started anew from the WAL record of shard {shard}; the shards it named are refused until accepted again"
            ),
            Err(e) => pgrx::error!("pg_ticket: cannot write the shard book while replaying WAL: {e}"),
        }
        return;
    }
    let Some((mark, space)) = record_mark(record) else {
        pgrx::error!("pg_ticket: a snowflake mark WAL record of the wrong size");
    };
    // In the primary's space: a standby set for another one refuses to
    // issue from it once promoted, rather than stamp into the wrong space.
    let store = FileMarkStore { path: Path::new(MARK_FILE), space };
    if matches!(store.load(), Ok(Some(current)) if current >= mark) {
        return;
    }
    if let Err(e) = store.save(mark) {
        pgrx::error!("pg_ticket: cannot write the snowflake mark {} while replaying WAL: {e}", store.location());
    }
}

/// For pg_waldump and pg_walinspect.
#[pg_guard]
unsafe extern "C-unwind" fn desc(buf: pg_sys::StringInfo, record: *mut pg_sys::XLogReaderState) {
    let text = if record_info(record) == XLOG_LEDGER {
        format!("lease ledger: {}", String::from_utf8_lossy(record_data(record)))
    } else if record_info(record) == XLOG_SHARD {
        match record_shard(record) {
            Some((shard, Standing::Accepted(p))) => format!("shard {shard} accepted above ms {} sequence {}", p >> 10, p & 1023),
            Some((shard, Standing::Released(p))) => format!("shard {shard} released at ms {} sequence {}", p >> 10, p & 1023),
            Some((shard, Standing::Held(p))) => format!("shard {shard} held at ms {} sequence {}", p >> 10, p & 1023),
            None => "shard standing (malformed)".to_string(),
        }
    } else {
        match record_mark(record) {
            Some((mark, space)) => format!("snowflake mark {mark} ms, {space}"),
            None => "snowflake mark (malformed)".to_string(),
        }
    };
    let text = std::ffi::CString::new(text).unwrap_or_default();
    unsafe { pg_sys::appendStringInfoString(buf, text.as_ptr()) };
}

#[pg_guard]
unsafe extern "C-unwind" fn identify(info: u8) -> *const std::ffi::c_char {
    match info & !pg_sys::XLR_INFO_MASK as u8 {
        XLOG_MARK => c"MARK".as_ptr(),
        XLOG_SHARD => c"SHARD".as_ptr(),
        XLOG_LEDGER => c"LEDGER".as_ptr(),
        _ => std::ptr::null(),
    }
}
