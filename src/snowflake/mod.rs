//! The server's one snowflake generator: its state in shared memory,
//! advanced by compare-and-swap (see `ticket_core::snowflake`, whose module
//! comment has the locking rule), the real clock it reads, and the file that
//! carries its reserved mark across restarts.
//!
//! - `wal`: the mark written to WAL before each use, replayed by standbys
//!   into their own mark file (failover).
//! - `lease`: the machine id leased by this server's own worker
//!   (`pg_ticket.machine_id = -1`).
//! - `space`: the ID space (epoch, layout) recorded with a database.
//! - `shards`: `sharded_id()`, per-shard states on this generator's clock
//!   and mark.
//! - `history`: which servers' IDs the mark stands for; a database whose
//!   IDs it does not cover is refused (`pg_upgrade`, restores: SPEC §17.1).
//! - `ledger`: which ids this server's registries (any database) leased
//!   out, carried in WAL; a fixed id is checked against it (§17.4).
//! - `start`: what a start is (new cluster of `pg_upgrade`, its old one, a
//!   restored copy, an ordinary restart), decided once at preload (§20.4).
//!
//! Shared memory: one `SharedState` of atomics, no LWLock. Every wait
//! checks for interrupts, so cancel, statement_timeout and terminate work:
//! a full millisecond or a clock step back of up to 10 ms goes through
//! `SystemClock::pause_until` (sleeps of at most 1 ms, then yields, bounded
//! by the generator's own reading); another backend's mark write through
//! `pause` (a yield) and `sleep` (the latch, 1 ms at a time).

use crate::backend_local::BackendLocal;
use crate::clock::now_unix_ms;
use crate::errors::{OrRaise, TicketError};
use crate::settings::{self, MachineId};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgAtomic};
use ticket_core::snowflake::{self as layout, Clock, SharedState};

mod history;
mod lease;
pub mod ledger;
mod shards;
mod space;
mod wal;
pub use lease::{register_worker as register_lease_worker, snapshot as lease_snapshot};
pub use space::registry_space;
mod start;
pub use start::at_start;
pub use wal::register as register_wal;

/// Relative to the data directory (every backend's working directory), so
/// pg_basebackup copies it with the cluster. Written ahead, at most once per
/// `RESERVE_AHEAD_MS` of issued timestamps.
pub const MARK_FILE: &str = "pg_ticket_snowflake.mark";
/// Which shards this server accepted or released (`sharded_id()`), beside
/// the mark, carried in WAL as it is.
pub const SHARD_BOOK_FILE: &str = "pg_ticket_shards.book";

#[derive(Default)]
#[repr(transparent)]
pub struct Shared(SharedState);

// Atomics only: valid in shared memory across processes.
unsafe impl PGRXSharedMemory for Shared {}

static GENERATOR: PgAtomic<Shared> = unsafe { PgAtomic::new(c"pg_ticket_snowflake") };

/// Since when (Unix ms) the mark's writer waits for the synchronous
/// standbys to confirm its WAL record (0: it does not): callers that wait
/// for the writer say so when they give up (#31 item 8).
#[derive(Default)]
pub struct StandbyWait(std::sync::atomic::AtomicI64);

// An atomic only.
unsafe impl PGRXSharedMemory for StandbyWait {}

static MARK_STANDBY_WAIT: PgAtomic<StandbyWait> = unsafe { PgAtomic::new(c"pg_ticket_mark_standby_wait") };

pub fn init_shared_memory() {
    pg_shmem_init!(GENERATOR);
    pg_shmem_init!(MARK_STANDBY_WAIT);
    history::init_shared_memory();
    lease::init_shared_memory();
    ledger::init_shared_memory();
    shards::init_shared_memory();
}

/// The ID space this server stamps into.
pub fn id_space() -> layout::IdSpace {
    layout::IdSpace::new(settings::epoch_unix_ms(), settings::layout())
}

/// At start (preloading): a mark file written for another ID space stops
/// the server — a changed epoch would reissue the IDs of an earlier time
/// (SPEC §13.10). Any other trouble with the file is the first call's.
pub fn refuse_another_id_space() {
    if let Err(e @ layout::SnowflakeError::OtherIdSpace { recorded, configured, .. }) = ticket_core::snowflake::MarkStore::load(&wal::file()) {
        let setting = if recorded.epoch_unix_ms == configured.epoch_unix_ms { "pg_ticket.machine_bits" } else { "pg_ticket.epoch" };
        pgrx::error!("{setting}: {e}");
    }
}

/// Records this server's ID space in its mark, writing one (and its WAL
/// record) if the server has none: a registry's grants are of its space
/// too, so a registry restarted in another space does not start, even if
/// it never stamped a snowflake itself (its holders' IDs and its own would
/// meet). A mark loaded or written since start records the space already
/// (one of another space is refused on load), so only the first grant of
/// a server that never had a mark writes it.
/// Not where the database's space was recorded before this transaction, or
/// where `pg_upgrade` lost the mark: one written now would hide the loss
/// (`history`).
pub fn record_space_in_mark() -> Result<(), TicketError> {
    let generator = &GENERATOR.get().0;
    let epoch = settings::epoch_unix_ms();
    layout::load_mark(generator, &SystemClock, &wal::WalMarkStore, epoch)?;
    if !layout::has_mark(generator) && history::first_mark_allowed() {
        let now_ms = u64::try_from(now_unix_ms() - epoch).unwrap_or(0);
        layout::cover(generator, &SystemClock, &wal::WalMarkStore, epoch, now_ms)?;
    }
    Ok(())
}

/// The data directory (the working directory) flushed, so that files
/// created, renamed or removed in it stay so after a crash.
fn flush_data_directory() -> Result<(), String> {
    std::fs::File::open(".").and_then(|d| d.sync_all()).map_err(|e| format!("cannot flush the data directory: {e}"))
}

/// Issue nothing at or before this Unix ms (a new lease's `not_before_ms`).
fn raise_floor(floor_unix_ms: i64) {
    GENERATOR.get().0.raise_floor(floor_unix_ms, settings::epoch_unix_ms());
}

/// The last timestamp issued (Unix ms), if any.
fn last_stamp_unix_ms() -> Option<i64> {
    GENERATOR.get().0.last_millis().map(|ms| settings::epoch_unix_ms() + ms as i64)
}

/// Marks this process as the mark's writer while a write is under way, so
/// that an exit in the middle of it (FATAL, proc_exit: no Rust unwinding)
/// still frees the generator's writer flag — otherwise every later call
/// would wait for a writer that is gone, until a restart (SPEC §13.3).
struct MarkWriter;

static WRITING: BackendLocal<bool> = BackendLocal::new(false);
static EXIT_CALLBACK: BackendLocal<bool> = BackendLocal::new(false);

impl MarkWriter {
    fn enter() -> MarkWriter {
        if !EXIT_CALLBACK.replace(true) {
            unsafe { pg_sys::before_shmem_exit(Some(free_writer_flag_on_exit), pg_sys::Datum::from(0)) };
        }
        WRITING.set(true);
        MarkWriter
    }
}

impl Drop for MarkWriter {
    fn drop(&mut self) {
        WRITING.set(false);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn free_writer_flag_on_exit(_code: i32, _arg: pg_sys::Datum) {
    if WRITING.get() {
        MARK_STANDBY_WAIT.get().0.store(0, std::sync::atomic::Ordering::Release);
        GENERATOR.get().0.release_mark_writer_on_exit();
    }
}

/// The mark's writer waits for the synchronous standbys while it lives.
struct StandbyWaiting;

impl StandbyWaiting {
    fn begin() -> StandbyWaiting {
        MARK_STANDBY_WAIT.get().0.store(now_unix_ms().max(1), std::sync::atomic::Ordering::Release);
        StandbyWaiting
    }
}

impl Drop for StandbyWaiting {
    fn drop(&mut self) {
        MARK_STANDBY_WAIT.get().0.store(0, std::sync::atomic::Ordering::Release);
    }
}

/// A caller that gave up waiting for the mark's writer, told why when the
/// writer waits for the synchronous standbys (not the storage).
pub fn name_the_wait(e: TicketError) -> TicketError {
    match e {
        TicketError::Snowflake(layout::SnowflakeError::MarkBusy { waited_ms }) => {
            let since = MARK_STANDBY_WAIT.get().0.load(std::sync::atomic::Ordering::Acquire);
            if since == 0 {
                return TicketError::Snowflake(layout::SnowflakeError::MarkBusy { waited_ms });
            }
            TicketError::MarkWaitsForStandby { waited_ms, standby_wait_ms: (now_unix_ms() - since).max(0) }
        }
        other => other,
    }
}

pub(super) struct SystemClock;

impl Clock for SystemClock {
    #[inline]
    fn now_unix_ms(&self) -> i64 {
        now_unix_ms()
    }

    fn sleep(&self, millis: u64) {
        pgrx::check_for_interrupts!();
        unsafe {
            pg_sys::WaitLatch(
                pg_sys::MyLatch,
                (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
                millis.max(1) as std::ffi::c_long,
                pg_sys::PG_WAIT_EXTENSION,
            );
            pg_sys::ResetLatch(pg_sys::MyLatch);
        }
        pgrx::check_for_interrupts!();
    }

    fn pause(&self, millis: u64) {
        pgrx::check_for_interrupts!();
        if millis == 0 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_millis(millis));
        }
    }

    fn pause_until(&self, unix_ms: i64, at_most_ms: u64) {
        layout::sleep_until_unix_ms(unix_ms, at_most_ms, || {
            pgrx::check_for_interrupts!();
        });
    }
}

/// The next ID. `own_id_unleased` checks a fixed machine id against the
/// leases this database's registry serves (SPEC §17.4): the registry's
/// table is `leases`', a layer above, so the SQL surface passes its check in.
pub fn next_id(own_id_unleased: impl FnOnce(u16) -> Result<(), TicketError>) -> i64 {
    if !settings::preloaded() {
        TicketError::NotPreloaded("snowflake_id").raise();
    }
    crate::xact::check_writable().or_raise();
    space::check_database().or_raise();
    history::check().or_raise();
    crate::group::check_allocator(ticket_core::group::Use::Snowflakes).or_raise();
    let issued: Result<i64, TicketError> = match settings::machine_id() {
        MachineId::Fixed(id) => {
            ledger::check_own_id(id).or_raise();
            own_id_unleased(id).or_raise();
            issue(&SystemClock, id, i64::MAX).map_err(TicketError::from)
        }
        MachineId::Leased => lease::next_id(|clock, id, stamp_cap_unix_ms| issue(clock, id, stamp_cap_unix_ms)).map_err(TicketError::from),
    };
    issued.map_err(name_the_wait).or_raise()
}

fn issue(clock: &impl Clock, machine_id: u16, stamp_cap_unix_ms: i64) -> Result<i64, layout::SnowflakeError> {
    layout::next_id(
        &GENERATOR.get().0,
        clock,
        &wal::WalMarkStore,
        settings::epoch_unix_ms(),
        settings::layout(),
        machine_id,
        stamp_cap_unix_ms,
    )
}

/// The space this database's IDs are read in (`space::for_reading`).
/// Without preloading and with no space recorded, the epoch setting does
/// not exist, so reading IDs with the default could silently be wrong:
/// refused.
fn space_for(function: &'static str) -> (i64, layout::Layout) {
    let Some(space) = space::for_reading().or_raise() else {
        TicketError::NotPreloaded(function).raise();
    };
    let Some(layout) = space.layout() else {
        TicketError::BadConfiguration(format!(
            "this database's recorded ID space (pgticket.id_space) has {} machine bits, which no layout has",
            space.machine_bits
        ))
        .raise();
    };
    (space.epoch_unix_ms, layout)
}

/// The epoch this database's IDs (snowflake and sharded) are read in.
fn epoch_for(function: &'static str) -> i64 {
    space_for(function).0
}

/// (timestamp as Unix ms, machine id, sequence) of an ID, in this
/// database's space.
pub fn decode(id: i64) -> (i64, u16, u16) {
    let (epoch, layout) = space_for("snowflake_decode");
    let parts = layout.decompose(id).or_raise();
    (epoch + parts.millis as i64, parts.machine_id, parts.sequence)
}

/// The lowest and highest ID of any machine in the millisecond `unix_ms`,
/// for `function`.
pub fn id_range_of_millisecond(unix_ms: i64, function: &'static str) -> (i64, i64) {
    layout::id_range_of_millisecond(unix_ms, epoch_for(function)).or_raise()
}

/// What the generator has done since start (for `pgticket.status`).
pub fn activity() -> layout::Activity {
    GENERATOR.get().0.activity()
}

pub fn reset_counters() {
    GENERATOR.get().0.reset_counters();
}
