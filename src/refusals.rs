//! The refusal and wait counts behind `pgticket.status`: ground, so that
//! `errors` can count a refusal as it raises it without reaching up to the
//! view.
//!
//! Shared memory: one struct of atomic counters (relaxed increments, no
//! lock; a reader may see one counter a moment ahead of another). They
//! exist only when the library is preloaded; without that every count is
//! skipped. A crash restart reinitialises shared memory, so "since start"
//! means since the last start or crash restart.

use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgAtomic};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

#[derive(Default)]
pub struct Counters {
    pub refusals_clock_behind: AtomicU64,
    pub refusals_overflow: AtomicU64,
    pub refusals_read_only: AtomicU64,
    pub waits_ticket_refill: AtomicU64,
    /// Unix ms of the last reset (0: none since start).
    pub reset_at: AtomicI64,
}

// Atomics only: valid in shared memory across processes.
unsafe impl PGRXSharedMemory for Counters {}

static COUNTERS: PgAtomic<Counters> = unsafe { PgAtomic::new(c"pg_ticket_status") };

/// Set in the postmaster while preloading, inherited by every backend.
static ATTACHED: AtomicBool = AtomicBool::new(false);

pub fn init_shared_memory() {
    pg_shmem_init!(COUNTERS);
    ATTACHED.store(true, Ordering::Relaxed);
}

/// The counters, where they exist (a preloaded library).
pub fn counters() -> Option<&'static Counters> {
    ATTACHED.load(Ordering::Relaxed).then(|| COUNTERS.get())
}

/// What a refusal is counted as in `pgticket.status`.
#[derive(Debug, Clone, Copy)]
pub enum Refusal {
    ClockBehind,
    Overflow,
    ReadOnly,
}

pub fn count_refusal(refusal: Refusal) {
    if let Some(c) = counters() {
        let counter = match refusal {
            Refusal::ClockBehind => &c.refusals_clock_behind,
            Refusal::Overflow => &c.refusals_overflow,
            Refusal::ReadOnly => &c.refusals_read_only,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Count a `next_ticket()` caller that had to wait for a segment.
pub fn count_ticket_wait() {
    if let Some(c) = counters() {
        c.waits_ticket_refill.fetch_add(1, Ordering::Relaxed);
    }
}
