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
//! - The directory (`ticket_core::directory`: a hash index from scope to
//!   slot, the free slots, the CLOCK hand, the slots per database) is read
//!   under the `pg_ticket_tickets` LWLock in shared mode (one O(1) lookup)
//!   and changed under it in exclusive mode (O(1) amortized: a free slot,
//!   or a sweep of a few slots); backends take it only when their local
//!   (slot, generation) is missing or stale — never per ticket. Nothing
//!   scans every slot under it but `empty_slots` (DROP DATABASE,
//!   `pgticket.advance_ticket`). A slot's `key_hash` changes only under it,
//!   exclusive, so the index can be maintained without the slots' locks.
//! - The worker registry is changed under the same LWLock, exclusive. Each
//!   worker's request queue has a spinlock of its own (a few instructions).
//! - Waiting for a segment is on one condition variable, with a timeout.
//!
//! Sized at server start, so it lives in our own shmem request/startup hooks
//! (pgrx's `pg_shmem_init!` only handles fixed-size types).

use pgrx::pg_sys;
use std::cell::UnsafeCell;
use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use ticket_core::directory::{self, Bucket, DbBucket, DbCounts, SlotView};
use ticket_core::tickets::Cache;

/// queue (≤ 255 bytes), NUL, domain (≤ 255 bytes).
pub const KEY_MAX: usize = 511;
/// Databases served at once, one worker each (`pg_ticket.max_ticket_workers`
/// at most this).
pub use crate::settings::MOST_TICKET_WORKERS as MAX_WORKERS;
/// Databases that can wait in line for a ticket worker at once; one more
/// is refused (55000) rather than left to wait without a bound.
pub const WAITING_MAX: usize = 256;
/// Requests a worker's queue holds (a slot once however often it asks);
/// past it the worker looks at every slot once.
const QUEUE: usize = 1024;
const TRANCHE: &CStr = c"pg_ticket_tickets";
const SHMEM_NAME: &CStr = c"pg_ticket ticket cache";

/// Why a scope cannot be served; raised by every caller that meets it until
/// the slot is emptied (pgticket.advance_ticket, eviction) — the worker saw it in the
/// table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    OtherSeries { offset: i64, increment: i64 },
    Overflow { mark: i64 },
    /// A new scope's role created `pg_ticket.max_scopes_per_role` already.
    TooManyScopes { role: u32, created: i64, cap: i64 },
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
    /// Who it counts against in the sweep: the role that placed it, in its
    /// database (`directory::owner_of`).
    pub owner: u32,
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
    /// Backends waiting now for this scope's first segment here (#46 item
    /// 10): a scope with nothing installed and nobody waiting any more
    /// (the calls were cancelled) is not reserved by the worker.
    pub waiters: u32,
    /// Counts the asks: the worker answers the ask it read, and one made
    /// while it reserved stays asked.
    pub asks: u64,
    /// The scope's row was locked by another transaction at the worker's
    /// last try (it tries again while asked).
    pub busy: bool,
    /// The last value of every segment installed here so far: the next one
    /// starts above it even if the row says less (rows deleted or the table
    /// emptied behind the worker's back).
    pub reserved_to: i64,
    pub failure: Option<Failure>,
    /// When it was last used (`coarse_ms`): a slot idle for
    /// `SPARE_IDLE_MS` is not spared by the sweep.
    pub last_used_ms: u64,
    /// Used since the CLOCK hand last passed (its second chance).
    pub referenced: bool,
    /// The role that last asked with nothing cached, the cap it runs
    /// under, and the new names its transaction made and has not counted
    /// yet: a new row is checked and counted for it.
    pub creator: u32,
    pub creator_cap: i64,
    pub creator_pending: i64,
    /// Unix ms when the last segment was installed (for the step).
    pub installed_at_ms: i64,
    pub refills: u64,
    pub waits: u64,
}

#[repr(C)]
pub struct Slot {
    spin: AtomicBool,
    pub generation: AtomicU64,
    /// The hash of the scope it holds, for the index (changed only under
    /// the directory lock, exclusive).
    key_hash: AtomicU64,
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
            owner: 0,
            table: 0,
            hash: 0,
            key_len: 0,
            key: [0; KEY_MAX],
            cache: Cache::default(),
            step: 0,
            requested: false,
            waiters: 0,
            asks: 0,
            busy: false,
            reserved_to: 0,
            failure: None,
            last_used_ms: 0,
            referenced: false,
            creator: 0,
            creator_cap: 0,
            creator_pending: 0,
            installed_at_ms: 0,
            refills: 0,
            waits: 0,
        }
    }

    /// Give the slot to another scope (or none): everything cached goes,
    /// a gap. The caller bumps the generation.
    /// This session asks: a new row would be its role's (`crate::quota`).
    pub fn set_creator(&mut self) {
        let asker = crate::quota::this_session();
        self.creator = asker.role.to_u32();
        self.creator_cap = asker.cap;
        self.creator_pending = asker.pending;
    }

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
    /// Since when (monotonic ms) the worker's commit waits — for the
    /// synchronous standbys, if any are named; 0 while it does not commit.
    /// For the message of a backend that waited in vain (#31 item 8).
    pub committing_since_ms: AtomicU64,
    /// The slots that asked for a segment since the worker last looked, so
    /// a pass costs what was asked, not the size of the cache.
    queue_spin: AtomicBool,
    queue_len: AtomicU32,
    /// More asked than the queue holds: look at every slot.
    overflow: AtomicBool,
    queue: [AtomicU32; QUEUE],
}

impl WorkerSlot {
    fn with_queue<R>(&self, f: impl FnOnce(&Self) -> R) -> R {
        let mut spins = 0u32;
        while self.queue_spin.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            spins += 1;
            if spins % 128 == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        let r = f(self);
        self.queue_spin.store(false, Ordering::Release);
        r
    }

    /// Slot `i` asks for a segment (once in the queue however often).
    pub fn push(&self, i: usize) {
        self.with_queue(|w| {
            let len = w.queue_len.load(Ordering::Relaxed) as usize;
            if w.queue[..len].iter().any(|q| q.load(Ordering::Relaxed) == i as u32) {
                return;
            }
            if len < QUEUE {
                w.queue[len].store(i as u32, Ordering::Relaxed);
                w.queue_len.store(len as u32 + 1, Ordering::Relaxed);
            } else {
                w.overflow.store(true, Ordering::Relaxed);
            }
        });
    }

    /// What was asked since the last call (sorted, once each), and whether
    /// more was asked than the queue held.
    pub fn drain(&self) -> (Vec<usize>, bool) {
        // Copied out under the spinlock, allocated after it.
        let mut copy = [0u32; QUEUE];
        let (len, overflow) = self.with_queue(|w| {
            let len = w.queue_len.swap(0, Ordering::Relaxed) as usize;
            for (k, entry) in copy[..len].iter_mut().enumerate() {
                *entry = w.queue[k].load(Ordering::Relaxed);
            }
            (len, w.overflow.swap(false, Ordering::Relaxed))
        });
        let mut asked: Vec<usize> = copy[..len].iter().map(|&i| i as usize).collect();
        asked.sort_unstable();
        asked.dedup();
        (asked, overflow)
    }

}

/// The directory's scalars (changed under its lock, exclusive).
#[repr(C)]
struct DirState {
    hand: usize,
    free_len: usize,
    active_dbs: u32,
    active_owners: u32,
}

#[repr(C)]
pub struct Header {
    pub nslots: usize,
    /// The key scopes are hashed with, drawn from the secure random source
    /// when shared memory is made: nobody can compute where a name lands.
    pub hash_key: [u64; 2],
    pub cv: pg_sys::ConditionVariable,
    pub workers: [WorkerSlot; MAX_WORKERS],
    /// Databases that need a worker while every worker slot is taken (SPEC
    /// §13.11): the longest-serving worker retires for them, and the one
    /// that waited longest takes the slot (`worker::start`). Changed under
    /// the directory lock (exclusive), read lock-free.
    pub waiting: [WaitingDb; WAITING_MAX],
    dir: UnsafeCell<DirState>,
}

/// A database waiting for a ticket worker: since when, and when a backend
/// last asked for it (monotonic ms). 0: none.
#[derive(Default)]
pub struct WaitingDb {
    pub db: AtomicU32,
    pub since_ms: AtomicU64,
    pub asked_ms: AtomicU64,
}

static mut SHARED: *mut Header = std::ptr::null_mut();
static mut LOCK: *mut pg_sys::LWLock = std::ptr::null_mut();
static mut NSLOTS: usize = 0;
static mut PREV_REQUEST: pg_sys::shmem_request_hook_type = None;
static mut PREV_STARTUP: pg_sys::shmem_startup_hook_type = None;

// Laid out after the header: the slots, the scope index, the database
// table (both `directory::buckets_for(nslots)` buckets), the free stack.
fn offsets(nslots: usize) -> (usize, usize, usize, usize, usize) {
    let buckets = directory::buckets_for(nslots);
    let slots = std::mem::size_of::<Header>();
    let index = slots + nslots * std::mem::size_of::<Slot>();
    let dbs = index + buckets * std::mem::size_of::<Bucket>();
    // The owners' counts follow the databases' (same size): `owners_at`.
    let free = dbs + 2 * buckets * std::mem::size_of::<DbBucket>();
    let end = free + nslots * std::mem::size_of::<u32>();
    (slots, index, dbs, free, end)
}

/// Where the owners' counts start: after the databases'.
fn owners_at(nslots: usize) -> usize {
    offsets(nslots).2 + directory::buckets_for(nslots) * std::mem::size_of::<DbBucket>()
}

fn size(nslots: usize) -> usize {
    offsets(nslots).4
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
            let mut key = [0u8; 16];
            if !pg_sys::pg_strong_random(key.as_mut_ptr().cast(), key.len()) {
                pgrx::error!("pg_ticket: could not draw the ticket cache's hash key");
            }
            (*header).hash_key = [u64::from_le_bytes(key[..8].try_into().unwrap()), u64::from_le_bytes(key[8..].try_into().unwrap())];
            pg_sys::ConditionVariableInit(&mut (*header).cv);
        }
        SHARED = header;
        if !found {
            for slot in slots() {
                std::ptr::write(slot.data.get(), SlotData::empty());
            }
            // Every slot free, taken from 0 up.
            let (_, _, _, free, _) = offsets(NSLOTS);
            let stack = std::slice::from_raw_parts_mut((SHARED as *mut u8).add(free) as *mut u32, NSLOTS);
            for (k, entry) in stack.iter_mut().enumerate() {
                *entry = (NSLOTS - 1 - k) as u32;
            }
            (*(*header).dir.get()).free_len = NSLOTS;
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
        let first = (SHARED as *mut u8).add(offsets((*SHARED).nslots).0) as *const Slot;
        std::slice::from_raw_parts(first, (*SHARED).nslots)
    }
}

/// The array at `offset`, `len` long (under the directory lock).
unsafe fn array<T>(offset: usize, len: usize) -> *mut [T] {
    unsafe { std::ptr::slice_from_raw_parts_mut((SHARED as *mut u8).add(offset) as *mut T, len) }
}

pub fn cv() -> *mut pg_sys::ConditionVariable {
    unsafe { &mut (*SHARED).cv }
}

/// Holds the directory LWLock; released on drop (an ERROR's abort releases
/// every LWLock too).
pub struct Directory {
    exclusive: bool,
}

impl Directory {
    pub fn lock(exclusive: bool) -> Directory {
        let mode = if exclusive { pg_sys::LWLockMode::LW_EXCLUSIVE } else { pg_sys::LWLockMode::LW_SHARED };
        unsafe { pg_sys::LWLockAcquire(LOCK, mode) };
        Directory { exclusive }
    }

    fn buckets(&self) -> usize {
        directory::buckets_for(header().nslots)
    }

    /// The slot holding `scope` (one index probe).
    pub fn lookup(&self, scope: &ScopeId<'_>) -> Option<usize> {
        let slots = slots();
        // SAFETY: the lock is held; writers hold it exclusively.
        let index = unsafe { &*array::<Bucket>(offsets(header().nslots).1, self.buckets()) };
        directory::lookup(index, scope.hash, |i| slots[i].lock().matches(scope))
    }

    /// Give `scope` a slot: a free one, else the sweep's victim (what that
    /// cached becomes a gap). Its generation, bumped, is returned.
    pub fn place(&mut self, scope: &ScopeId<'_>, step: i64) -> (usize, u64) {
        assert!(self.exclusive, "the directory is changed under its exclusive lock");
        let (slots, n, buckets) = (slots(), header().nslots, self.buckets());
        let (_, index_at, dbs_at, free_at, _) = offsets(n);
        let owner = directory::owner_of(scope.db, crate::quota::creator().to_u32());
        // SAFETY: held exclusively: nobody else reads or writes these.
        let (state, owners, free) = unsafe { (&mut *header().dir.get(), &mut *array::<DbBucket>(owners_at(n), buckets), &mut *array::<u32>(free_at, n)) };
        let i = if state.free_len > 0 {
            state.free_len -= 1;
            free[state.free_len] as usize
        } else {
            let counts = DbCounts { table: owners, active: &mut state.active_owners };
            let now_ms = coarse_ms();
            directory::sweep(&mut state.hand, n, owner, &counts, |i| {
                let mut g = slots[i].lock();
                let idle = now_ms.saturating_sub(g.last_used_ms) > SPARE_IDLE_MS;
                let view = SlotView { in_use: g.in_use, db: g.owner, referenced: g.referenced, idle };
                g.referenced = false;
                view
            })
        };
        self.vacate(i);
        let slot = &slots[i];
        let mut g = slot.lock();
        g.reset();
        g.in_use = true;
        g.db = scope.db;
        g.owner = owner;
        g.table = scope.table;
        g.hash = scope.hash;
        g.key_len = scope.key.len() as u16;
        g.key[..scope.key.len()].copy_from_slice(scope.key);
        g.step = step;
        g.set_creator();
        // Not marked as used: a scope placed and never used again is the
        // first to go (and a turn of the hand never finds every slot marked).
        g.last_used_ms = coarse_ms();
        let generation = slot.generation.fetch_add(1, Ordering::AcqRel) + 1;
        drop(g);
        slot.key_hash.store(scope.hash, Ordering::Relaxed);
        // SAFETY: held exclusively.
        let (index, dbs, state) = unsafe { (&mut *array::<Bucket>(index_at, buckets), &mut *array::<DbBucket>(dbs_at, buckets), &mut *header().dir.get()) };
        directory::insert(index, scope.hash, i);
        DbCounts { table: dbs, active: &mut state.active_dbs }.add(scope.db);
        // SAFETY: held exclusively.
        let owners = unsafe { &mut *array::<DbBucket>(owners_at(n), buckets) };
        DbCounts { table: owners, active: &mut state.active_owners }.add(owner);
        (i, generation)
    }

    /// Slots database `db` holds.
    pub fn slots_of(&mut self, db: u32) -> u32 {
        assert!(self.exclusive, "read under the exclusive lock");
        let n = header().nslots;
        // SAFETY: held exclusively.
        let (dbs, state) = unsafe { (&mut *array::<DbBucket>(offsets(n).2, self.buckets()), &mut *header().dir.get()) };
        DbCounts { table: dbs, active: &mut state.active_dbs }.count(db)
    }

    /// Take slot `i` out of the index and its database's count, emptied
    /// (generation bumped), if it holds a scope.
    fn vacate(&mut self, i: usize) {
        assert!(self.exclusive, "the directory is changed under its exclusive lock");
        let (slots, n, buckets) = (slots(), header().nslots, self.buckets());
        let (_, index_at, dbs_at, _, _) = offsets(n);
        let (in_use, db, owner) = {
            let g = slots[i].lock();
            (g.in_use, g.db, g.owner)
        };
        if !in_use {
            return;
        }
        // SAFETY: held exclusively.
        let (index, dbs, state) = unsafe { (&mut *array::<Bucket>(index_at, buckets), &mut *array::<DbBucket>(dbs_at, buckets), &mut *header().dir.get()) };
        directory::remove(index, slots[i].key_hash.load(Ordering::Relaxed), i, |j| slots[j].key_hash.load(Ordering::Relaxed));
        DbCounts { table: dbs, active: &mut state.active_dbs }.take(db);
        // SAFETY: held exclusively.
        let owners = unsafe { &mut *array::<DbBucket>(owners_at(n), buckets) };
        DbCounts { table: owners, active: &mut state.active_owners }.take(owner);
        let mut g = slots[i].lock();
        g.reset();
        slots[i].generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Empty slot `i` and make it free.
    fn release(&mut self, i: usize) {
        let was_in_use = slots()[i].lock().in_use;
        if !was_in_use {
            return;
        }
        self.vacate(i);
        let n = header().nslots;
        // SAFETY: held exclusively.
        let (state, free) = unsafe { (&mut *header().dir.get(), &mut *array::<u32>(offsets(n).3, n)) };
        free[state.free_len] = i as u32;
        state.free_len += 1;
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
    let mut dir = Directory::lock(true);
    empty_picked(&mut dir, pick);
}

/// Empty every slot of database `db`: none to look at if it holds none.
pub fn empty_database(db: u32) {
    let mut dir = Directory::lock(true);
    if dir.slots_of(db) > 0 {
        empty_picked(&mut dir, |g| g.in_use && g.db == db);
    }
}

fn empty_picked(dir: &mut Directory, pick: impl Fn(&SlotData) -> bool) {
    for (i, slot) in slots().iter().enumerate() {
        let picked = pick(&slot.lock());
        if picked {
            dir.release(i);
        }
    }
}

/// A tick of the LRU clock.
/// The monotonic clock in ms, coarse (a tick's precision, no system call):
/// cheap enough for every take.
pub fn coarse_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// A slot of an owner within its share stays spared by the sweep while it
/// is used at least this often.
pub const SPARE_IDLE_MS: u64 = 10_000;
