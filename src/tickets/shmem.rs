//! The ticket cache in shared memory: a table of `pg_ticket.ticket_cache_scopes`
//! slots, one per cached (database, tickets table, scope), and the registry
//! of the per-database workers.
//!
//! A slot is keyed by the tickets table's relation id too (SPEC §13.1): a
//! dropped and re-created extension has a new table, so its scopes never
//! meet the segments cached from the old one.
//!
//! Locking rule:
//! - A slot's data (its key, cached segments, flags, counters) is read and
//!   written only under the slot's spinlock, held for a few dozen
//!   instructions (no system call, no allocation, no clock read, nothing
//!   that can ERROR): what is needed outside is copied out by value.
//! - `generation` is bumped (under the spinlock) whenever a slot is given
//!   to another scope or emptied; a backend remembers (slot, generation)
//!   and re-checks it under the spinlock, so a reused slot never hands a
//!   value to a backend that looked up the old scope. The worker installs a
//!   segment only if the generation it read is still current.
//! - The directory (which slot holds which scope; choosing a slot to reuse)
//!   is changed only under the `pg_ticket_tickets` LWLock in exclusive
//!   mode and scanned under it in shared mode; backends take it only when
//!   their local (slot, generation) is missing or stale — never per ticket.
//! - The worker registry is changed under the same LWLock, exclusive.
//! - Waiting for a segment is on one condition variable, with a timeout.
//!
//! Sized at server start, so it lives in our own shmem request/startup hooks
//! (pgrx's `pg_shmem_init!` only handles fixed-size types).

use pgrx::pg_sys;
use std::cell::UnsafeCell;
use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use ticket_core::tickets::Cache;

/// queue (≤ 255 bytes), NUL, domain (≤ 255 bytes).
pub const KEY_MAX: usize = 511;
/// Databases served at once, one worker each.
pub const MAX_WORKERS: usize = 32;
const TRANCHE: &CStr = c"pg_ticket_tickets";
const SHMEM_NAME: &CStr = c"pg_ticket ticket cache";

/// Why a scope cannot be served; raised by every caller that meets it until
/// the slot is emptied (advance_ticket, eviction) — the worker saw it in the
/// table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    OtherSeries { offset: i64, increment: i64 },
    Overflow { mark: i64 },
    /// The reservation failed (the worker logged why).
    Unavailable,
    /// The reservation committed locally but the synchronous standbys did
    /// not confirm it (the wait was cancelled or terminated): nothing of it
    /// is handed out.
    NotReplicated,
}

#[derive(Clone, Copy)]
pub struct SlotData {
    pub in_use: bool,
    pub db: u32,
    /// The tickets table's relation id.
    pub table: u32,
    pub hash: u64,
    pub key_len: u16,
    pub key: [u8; KEY_MAX],
    pub cache: Cache,
    /// Values per segment, adapted by the worker.
    pub step: i64,
    /// A segment was asked for and not yet installed.
    pub requested: bool,
    /// The scope's row was locked by another transaction at the worker's
    /// last try (it tries again while asked).
    pub busy: bool,
    /// The last value of every segment installed here so far: the next one
    /// starts above it even if the row says less (rows deleted or the table
    /// emptied behind the worker's back).
    pub reserved_to: i64,
    pub failure: Option<Failure>,
    pub last_used: u64,
    /// Unix ms when the last segment was installed (for the step).
    pub installed_at_ms: i64,
    pub refills: u64,
    pub waits: u64,
}

#[repr(C)]
pub struct Slot {
    spin: AtomicBool,
    pub generation: AtomicU64,
    data: UnsafeCell<SlotData>,
}

/// The slot's data, while its spinlock is held.
pub struct SlotGuard<'a> {
    slot: &'a Slot,
}

impl Slot {
    pub fn lock(&self) -> SlotGuard<'_> {
        let mut spins = 0u32;
        while self.spin.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            spins += 1;
            if spins % 128 == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        SlotGuard { slot: self }
    }
}

impl std::ops::Deref for SlotGuard<'_> {
    type Target = SlotData;
    fn deref(&self) -> &SlotData {
        unsafe { &*self.slot.data.get() }
    }
}

impl std::ops::DerefMut for SlotGuard<'_> {
    fn deref_mut(&mut self) -> &mut SlotData {
        unsafe { &mut *self.slot.data.get() }
    }
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.slot.spin.store(false, Ordering::Release);
    }
}

impl SlotData {
    fn empty() -> SlotData {
        SlotData {
            in_use: false,
            db: 0,
            table: 0,
            hash: 0,
            key_len: 0,
            key: [0; KEY_MAX],
            cache: Cache::default(),
            step: 0,
            requested: false,
            busy: false,
            reserved_to: 0,
            failure: None,
            last_used: 0,
            installed_at_ms: 0,
            refills: 0,
            waits: 0,
        }
    }

    /// Give the slot to another scope (or none): everything cached goes,
    /// a gap. The caller bumps the generation.
    pub fn reset(&mut self) {
        *self = SlotData::empty();
    }

    pub fn key(&self) -> &[u8] {
        &self.key[..self.key_len as usize]
    }

    pub fn matches(&self, scope: &ScopeId<'_>) -> bool {
        self.in_use && self.db == scope.db && self.table == scope.table && self.hash == scope.hash && self.key() == scope.key
    }
}

/// A scope as the cache knows it: database, tickets table, key (queue,
/// NUL, domain) and the hash of all three.
pub struct ScopeId<'a> {
    pub db: u32,
    pub table: u32,
    pub hash: u64,
    pub key: &'a [u8],
}

#[repr(C)]
pub struct WorkerSlot {
    /// 0: free.
    pub db: AtomicU32,
    /// 0 while starting.
    pub pid: AtomicI32,
    pub latch: AtomicPtr<pg_sys::Latch>,
    /// When a backend asked for this worker, on the monotonic clock (ms), to
    /// tell a slow start from a dead one whatever the wall clock does.
    pub started_at_ms: AtomicU64,
}

#[repr(C)]
pub struct Header {
    pub nslots: usize,
    pub clock: AtomicU64,
    pub cv: pg_sys::ConditionVariable,
    pub workers: [WorkerSlot; MAX_WORKERS],
}

static mut SHARED: *mut Header = std::ptr::null_mut();
static mut LOCK: *mut pg_sys::LWLock = std::ptr::null_mut();
static mut NSLOTS: usize = 0;
static mut PREV_REQUEST: pg_sys::shmem_request_hook_type = None;
static mut PREV_STARTUP: pg_sys::shmem_startup_hook_type = None;

fn size(nslots: usize) -> usize {
    std::mem::size_of::<Header>() + nslots * std::mem::size_of::<Slot>()
}

/// Called from `_PG_init` while preloading, with the configured size.
pub fn init(nslots: usize) {
    unsafe {
        NSLOTS = nslots;
        PREV_REQUEST = pg_sys::shmem_request_hook;
        pg_sys::shmem_request_hook = Some(request);
        PREV_STARTUP = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(startup);
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn request() {
    unsafe {
        if let Some(prev) = PREV_REQUEST {
            prev();
        }
        pg_sys::RequestAddinShmemSpace(size(NSLOTS));
        pg_sys::RequestNamedLWLockTranche(TRANCHE.as_ptr(), 1);
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn startup() {
    unsafe {
        if let Some(prev) = PREV_STARTUP {
            prev();
        }
        // AddinShmemInitLock is MainLWLockArray[21] (lwlocknames.txt), the
        // same in 15 and 18; the bindings have no name for it.
        let init_lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock;
        pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        let mut found = false;
        let header = pg_sys::ShmemInitStruct(SHMEM_NAME.as_ptr(), size(NSLOTS), &mut found) as *mut Header;
        if !found {
            // Zero for the atomics (free worker registry, generation 0,
            // unlocked), then every slot's data written as empty.
            std::ptr::write_bytes(header as *mut u8, 0, size(NSLOTS));
            (*header).nslots = NSLOTS;
            pg_sys::ConditionVariableInit(&mut (*header).cv);
        }
        SHARED = header;
        if !found {
            for slot in slots() {
                std::ptr::write(slot.data.get(), SlotData::empty());
            }
        }
        LOCK = &mut (*pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr())).lock;
        pg_sys::LWLockRelease(init_lock);
    }
}

pub fn header() -> &'static Header {
    unsafe { &*SHARED }
}

pub fn slots() -> &'static [Slot] {
    unsafe {
        let first = (SHARED as *mut u8).add(std::mem::size_of::<Header>()) as *const Slot;
        std::slice::from_raw_parts(first, (*SHARED).nslots)
    }
}

pub fn cv() -> *mut pg_sys::ConditionVariable {
    unsafe { &mut (*SHARED).cv }
}

/// Holds the directory LWLock; released on drop (an ERROR's abort releases
/// every LWLock too).
pub struct Directory {
    _private: (),
}

impl Directory {
    pub fn lock(exclusive: bool) -> Directory {
        let mode = if exclusive { pg_sys::LWLockMode::LW_EXCLUSIVE } else { pg_sys::LWLockMode::LW_SHARED };
        unsafe { pg_sys::LWLockAcquire(LOCK, mode) };
        Directory { _private: () }
    }
}

impl Directory {
    /// Exclusive, unless this process holds it already (an exit callback).
    pub fn lock_unless_held() -> Option<Directory> {
        (!unsafe { pg_sys::LWLockHeldByMe(LOCK) }).then(|| Directory::lock(true))
    }
}

impl Drop for Directory {
    fn drop(&mut self) {
        unsafe {
            if pg_sys::LWLockHeldByMe(LOCK) {
                pg_sys::LWLockRelease(LOCK);
            }
        }
    }
}

/// Milliseconds on CLOCK_MONOTONIC, the same clock in every process of the
/// machine, and never stepped.
pub fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// Empty every slot `pick` chooses (what it cached becomes a gap), under
/// the directory lock: a later lookup of its scope places it anew, and a
/// segment reserved for it meanwhile is not installed (generation).
pub fn empty_slots(pick: impl Fn(&SlotData) -> bool) {
    let _dir = Directory::lock(true);
    for slot in slots() {
        let mut g = slot.lock();
        if pick(&g) {
            g.reset();
            slot.generation.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// A tick of the LRU clock.
pub fn tick() -> u64 {
    header().clock.fetch_add(1, Ordering::Relaxed)
}
