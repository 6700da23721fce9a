//! Every `pg_ticket.*` setting, and what `_PG_init` does in which order.
//!
//! The snowflake settings are `postmaster`-context: one generator per server
//! must not change its machine id or epoch while running. PostgreSQL forbids
//! defining such a setting on a lazy load (`CREATE EXTENSION` without
//! preloading is FATAL otherwise), so they exist only when preloaded. The
//! per-session settings exist either way.
//!
//! A value in postgresql.conf that the setting's own checks reject is, at
//! preload, only a WARNING to PostgreSQL, which then runs with the default:
//! a mistyped machine id would silently become machine 0, another server's
//! id. So the raw values are read and validated here first, and a bad one
//! stops the server with a message.

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use ticket_core::epoch::parse_epoch_ms;
use ticket_core::snowflake::check_machine_id;

const DEFAULT_EPOCH_UNIX_MS: i64 = 1_767_225_600_000;

static MACHINE_ID: GucSetting<i32> = GucSetting::<i32>::new(0);
static EPOCH: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c"2026-01-01"));
static DURABLE_COMMIT: GucSetting<bool> = GucSetting::<bool>::new(true);
static MAX_TRANSACTION_ENTRIES: GucSetting<i32> = GucSetting::<i32>::new(1_000_000);

/// Set once in `_PG_init`; read on every `snowflake_id()` call, so kept as
/// plain atomics rather than re-reading and re-parsing the settings.
static PRELOADED: AtomicBool = AtomicBool::new(false);
static EPOCH_UNIX_MS: AtomicI64 = AtomicI64::new(DEFAULT_EPOCH_UNIX_MS);
static MACHINE: AtomicI64 = AtomicI64::new(0);

pub fn init() {
    unsafe {
        if pg_sys::IsBinaryUpgrade {
            return;
        }
    }
    GucRegistry::define_bool_guc(
        c"pg_ticket.durable_commit",
        c"Commit transactions that took scoped IDs or blocks as synchronous_commit = on would.",
        c"Values from next_scoped_id() and reserve_block() may leave the database before a crash; with this off, a transaction committed with synchronous_commit = off can lose them and hand them out again.",
        &DURABLE_COMMIT,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_ticket.max_transaction_entries",
        c"Most scopes and savepoint entries one transaction may hold in backend memory.",
        c"Past it an allocation fails with 54000; bounds memory that PostgreSQL does not account for.",
        &MAX_TRANSACTION_ENTRIES,
        10,
        i32::MAX,
        GucContext::Userset,
        GucFlags::default(),
    );
    if !unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        return;
    }

    let machine_id = match raw_setting(c"pg_ticket.machine_id") {
        None => 0,
        Some(text) => parse_machine_id(&text).unwrap_or_else(|e| pgrx::error!("pg_ticket.machine_id: {e}")),
    };
    let epoch_ms = match raw_setting(c"pg_ticket.epoch") {
        None => DEFAULT_EPOCH_UNIX_MS,
        // During preload an ERROR stops the server with this message, which
        // is what a wrong epoch deserves: IDs from it would be wrong forever.
        Some(text) => parse_epoch_ms(&text).unwrap_or_else(|e| pgrx::error!("pg_ticket.epoch: {e}")),
    };

    GucRegistry::define_int_guc(
        c"pg_ticket.machine_id",
        c"Machine id (0-1023) stamped into every snowflake_id() of this server.",
        c"Servers issuing snowflake IDs into one keyspace must each have a different machine id.",
        &MACHINE_ID,
        0,
        i32::from(ticket_core::snowflake::MAX_MACHINE_ID),
        GucContext::Postmaster,
        GucFlags::default(),
    );
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"pg_ticket.epoch",
            c"UTC date (and time) from which snowflake_id() counts milliseconds.",
            c"Format 'YYYY-MM-DD' or 'YYYY-MM-DD HH:MM:SS', UTC. Changing it on a server that issued IDs can reissue them.",
            &EPOCH,
            GucContext::Postmaster,
            GucFlags::default(),
            Some(check_epoch),
            None,
            None,
        );
        pg_sys::MarkGUCPrefixReserved(c"pg_ticket".as_ptr());
    }

    EPOCH_UNIX_MS.store(epoch_ms, Ordering::Relaxed);
    MACHINE.store(i64::from(machine_id), Ordering::Relaxed);
    PRELOADED.store(true, Ordering::Relaxed);
    crate::snowflake::init_shared_memory();
    crate::status::init_shared_memory();
}

/// The value postgresql.conf (or ALTER SYSTEM, or the command line) gave a
/// setting before it was defined, if any.
fn raw_setting(name: &CStr) -> Option<String> {
    let value = unsafe { pg_sys::GetConfigOption(name.as_ptr(), true, false) };
    (!value.is_null()).then(|| unsafe { CStr::from_ptr(value) }.to_string_lossy().into_owned())
}

fn parse_machine_id(text: &str) -> Result<u16, String> {
    let number: i64 = text.trim().parse().map_err(|_| format!("{text:?} is not a whole number"))?;
    check_machine_id(number).map_err(|e| e.to_string())
}

/// Rejects a bad epoch at `SET`/`ALTER SYSTEM` time (22023), not at the
/// next restart.
#[pg_guard]
unsafe extern "C-unwind" fn check_epoch(newval: *mut *mut c_char, _extra: *mut *mut c_void, _source: pg_sys::GucSource::Type) -> bool {
    let value = unsafe { *newval };
    if value.is_null() {
        return true;
    }
    let text = unsafe { CStr::from_ptr(value) }.to_string_lossy();
    match parse_epoch_ms(&text) {
        Ok(_) => true,
        Err(e) => {
            let detail = CString::new(e.to_string()).unwrap_or_default();
            unsafe { pg_sys::GUC_check_errdetail_string = pg_sys::pstrdup(detail.as_ptr()) };
            false
        }
    }
}

pub fn preloaded() -> bool {
    PRELOADED.load(Ordering::Relaxed)
}

pub fn epoch_unix_ms() -> i64 {
    EPOCH_UNIX_MS.load(Ordering::Relaxed)
}

pub fn machine_id() -> u16 {
    MACHINE.load(Ordering::Relaxed) as u16
}

pub fn durable_commit() -> bool {
    DURABLE_COMMIT.get()
}

pub fn max_transaction_entries() -> usize {
    MAX_TRANSACTION_ENTRIES.get() as usize
}
