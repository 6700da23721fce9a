//! Every `pg_ticket.*` setting, and what `_PG_init` does in which order.
//!
//! The snowflake settings are `postmaster`-context: one generator per server
//! must not change its machine id or epoch while running. PostgreSQL forbids
//! defining such a setting on a lazy load (`CREATE EXTENSION` without
//! preloading is FATAL otherwise), so they exist only when preloaded.

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use ticket_core::epoch::parse_epoch_ms;

pub const DEFAULT_EPOCH: &str = "2026-01-01";
const DEFAULT_EPOCH_UNIX_MS: i64 = 1_767_225_600_000;

static MACHINE_ID: GucSetting<i32> = GucSetting::<i32>::new(0);
static EPOCH: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c"2026-01-01"));

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
        if !pg_sys::process_shared_preload_libraries_in_progress {
            return;
        }
    }
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
    GucRegistry::define_string_guc(
        c"pg_ticket.epoch",
        c"UTC date (and time) from which snowflake_id() counts milliseconds.",
        c"Format 'YYYY-MM-DD' or 'YYYY-MM-DD HH:MM:SS', UTC. Changing it on a server that issued IDs can reissue them.",
        &EPOCH,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    unsafe { pg_sys::MarkGUCPrefixReserved(c"pg_ticket".as_ptr()) };

    let epoch_text = EPOCH
        .get()
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_else(|| DEFAULT_EPOCH.to_string());
    match parse_epoch_ms(&epoch_text) {
        Ok(ms) => EPOCH_UNIX_MS.store(ms, Ordering::Relaxed),
        // During preload an ERROR stops the server with this message, which
        // is what a wrong epoch deserves: IDs from it would be wrong forever.
        Err(e) => pgrx::error!("pg_ticket.epoch: {e}"),
    }
    MACHINE.store(i64::from(MACHINE_ID.get()), Ordering::Relaxed);
    PRELOADED.store(true, Ordering::Relaxed);
    crate::snowflake::init_shared_memory();
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
