//! Snowflake layout and clock rules, free of PostgreSQL.
//!
//! An ID is `0 | 41 bits ms since epoch | 10 bits machine | 12 bits sequence`.
//! The generator's whole state is one `u64` holding the last issued
//! `(ms << 12) | sequence`, so every backend can advance it with a single
//! compare-and-swap: no lock is held across calls and IDs are strictly
//! increasing in the order the swaps succeed.

use std::sync::atomic::{AtomicU64, Ordering};
use thiserror::Error;

pub const TIMESTAMP_BITS: u32 = 41;
pub const MACHINE_BITS: u32 = 10;
pub const SEQUENCE_BITS: u32 = 12;
pub const MAX_TIMESTAMP_MS: u64 = (1 << TIMESTAMP_BITS) - 1;
pub const MAX_MACHINE_ID: u16 = (1 << MACHINE_BITS) - 1;
pub const MAX_SEQUENCE: u16 = (1 << SEQUENCE_BITS) - 1;
/// A backwards clock step up to this size is waited out; a larger one is refused.
pub const MAX_BACKWARD_WAIT_MS: u64 = 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parts {
    pub millis: u64,
    pub machine_id: u16,
    pub sequence: u16,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum SnowflakeError {
    #[error("the system clock moved backwards by {behind_ms} ms, more than the {MAX_BACKWARD_WAIT_MS} ms pg_ticket waits out")]
    ClockBehind { behind_ms: u64 },
    #[error("the system clock ({now_ms} ms since 1970) is before the configured epoch ({epoch_ms} ms since 1970)")]
    BeforeEpoch { now_ms: i64, epoch_ms: i64 },
    #[error("the 41-bit timestamp is exhausted: more than {MAX_TIMESTAMP_MS} ms have passed since the epoch")]
    TimestampExhausted,
    #[error("machine id {0} is out of range 0..={MAX_MACHINE_ID}")]
    MachineOutOfRange(i64),
    #[error("{0} is not a snowflake ID: snowflake IDs are never negative")]
    NegativeId(i64),
}

/// The ID for `parts`. Parts must already be in range (the generator
/// guarantees it); masks keep an out-of-range part from corrupting its
/// neighbours.
#[inline]
pub fn compose(parts: Parts) -> i64 {
    let ms = parts.millis & MAX_TIMESTAMP_MS;
    let machine = u64::from(parts.machine_id & MAX_MACHINE_ID);
    let seq = u64::from(parts.sequence & MAX_SEQUENCE);
    ((ms << (MACHINE_BITS + SEQUENCE_BITS)) | (machine << SEQUENCE_BITS) | seq) as i64
}

pub fn decompose(id: i64) -> Result<Parts, SnowflakeError> {
    if id < 0 {
        return Err(SnowflakeError::NegativeId(id));
    }
    let id = id as u64;
    Ok(Parts {
        millis: id >> (MACHINE_BITS + SEQUENCE_BITS),
        machine_id: ((id >> SEQUENCE_BITS) & u64::from(MAX_MACHINE_ID)) as u16,
        sequence: (id & u64::from(MAX_SEQUENCE)) as u16,
    })
}

pub fn check_machine_id(machine_id: i64) -> Result<u16, SnowflakeError> {
    u16::try_from(machine_id)
        .ok()
        .filter(|m| *m <= MAX_MACHINE_ID)
        .ok_or(SnowflakeError::MachineOutOfRange(machine_id))
}

/// The generator state that says "the last ID was issued at `millis`, with
/// the last sequence number": the next ID must come from a later millisecond.
/// Used to resume above a persisted high-water mark.
#[inline]
pub fn state_after_millisecond(millis: u64) -> u64 {
    (millis << SEQUENCE_BITS) | u64::from(MAX_SEQUENCE)
}

#[inline]
pub fn state_millis(state: u64) -> u64 {
    state >> SEQUENCE_BITS
}

/// What the generator does next, given its last issued state and the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Issue the ID for this packed `(ms << 12) | sequence` state.
    Issue(u64),
    /// Wait until the clock reads this many ms since the epoch, then retry.
    WaitUntil(u64),
    /// Refuse: the clock is this many ms behind the last issued timestamp.
    Refuse { behind_ms: u64 },
}

/// The clock rule as a pure function.
#[inline]
pub fn step(last_state: u64, now_ms: u64) -> Step {
    let last_ms = last_state >> SEQUENCE_BITS;
    let last_seq = last_state & u64::from(MAX_SEQUENCE);
    if now_ms > last_ms {
        Step::Issue(now_ms << SEQUENCE_BITS)
    } else if now_ms == last_ms {
        if last_seq < u64::from(MAX_SEQUENCE) {
            Step::Issue(last_state + 1)
        } else {
            Step::WaitUntil(last_ms + 1)
        }
    } else {
        let behind_ms = last_ms - now_ms;
        if behind_ms <= MAX_BACKWARD_WAIT_MS {
            Step::WaitUntil(last_ms)
        } else {
            Step::Refuse { behind_ms }
        }
    }
}

/// Where the generator reads time from; the real one lives with the
/// PostgreSQL glue, tests use a fake one.
pub trait Clock {
    /// Milliseconds since 1970-01-01 UTC.
    fn now_unix_ms(&self) -> i64;
    /// Let about `millis` ms pass (the caller reads the clock again after).
    fn pause(&self, millis: u64);
}

/// Issue the next ID from the shared `state`.
pub fn next_id(
    state: &AtomicU64,
    clock: &impl Clock,
    epoch_unix_ms: i64,
    machine_id: u16,
) -> Result<i64, SnowflakeError> {
    loop {
        let now_unix_ms = clock.now_unix_ms();
        let since_epoch = now_unix_ms - epoch_unix_ms;
        if since_epoch < 0 {
            return Err(SnowflakeError::BeforeEpoch { now_ms: now_unix_ms, epoch_ms: epoch_unix_ms });
        }
        let now_ms = since_epoch as u64;
        if now_ms > MAX_TIMESTAMP_MS {
            return Err(SnowflakeError::TimestampExhausted);
        }
        let last = state.load(Ordering::Acquire);
        match step(last, now_ms) {
            Step::Issue(next) => {
                if state
                    .compare_exchange_weak(last, next, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    return Ok(compose(Parts {
                        millis: next >> SEQUENCE_BITS,
                        machine_id,
                        sequence: (next & u64::from(MAX_SEQUENCE)) as u16,
                    }));
                }
            }
            Step::WaitUntil(target_ms) => clock.pause(target_ms.saturating_sub(now_ms).max(1)),
            Step::Refuse { behind_ms } => return Err(SnowflakeError::ClockBehind { behind_ms }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    const EPOCH: i64 = 1_767_225_600_000; // 2026-01-01 UTC

    /// A clock that only moves when told to, and counts the pauses asked of it.
    struct FakeClock {
        now: Cell<i64>,
        paused_ms: Cell<u64>,
    }

    impl FakeClock {
        fn at(since_epoch_ms: i64) -> Self {
            FakeClock { now: Cell::new(EPOCH + since_epoch_ms), paused_ms: Cell::new(0) }
        }
        fn set(&self, since_epoch_ms: i64) {
            self.now.set(EPOCH + since_epoch_ms);
        }
    }

    impl Clock for FakeClock {
        fn now_unix_ms(&self) -> i64 {
            self.now.get()
        }
        fn pause(&self, millis: u64) {
            self.paused_ms.set(self.paused_ms.get() + millis);
            self.now.set(self.now.get() + millis as i64);
        }
    }

    fn gen(state: &AtomicU64, clock: &FakeClock) -> Result<i64, SnowflakeError> {
        next_id(state, clock, EPOCH, 7)
    }

    #[test]
    fn spec_worked_example() {
        let id = compose(Parts { millis: 24_000_000_000, machine_id: 7, sequence: 3 });
        assert_eq!(id, 24_000_000_000i64 * (1 << 22) + 7 * (1 << 12) + 3);
        assert_eq!(decompose(id), Ok(Parts { millis: 24_000_000_000, machine_id: 7, sequence: 3 }));
    }

    #[test]
    fn decompose_inverts_compose_at_the_edges() {
        for parts in [
            Parts { millis: 0, machine_id: 0, sequence: 0 },
            Parts { millis: MAX_TIMESTAMP_MS, machine_id: MAX_MACHINE_ID, sequence: MAX_SEQUENCE },
            Parts { millis: 1, machine_id: 1023, sequence: 0 },
            Parts { millis: 123_456_789, machine_id: 512, sequence: 4095 },
        ] {
            let id = compose(parts);
            assert!(id >= 0, "sign bit must stay 0 for {parts:?}");
            assert_eq!(decompose(id), Ok(parts));
        }
        assert_eq!(compose(Parts { millis: MAX_TIMESTAMP_MS, machine_id: MAX_MACHINE_ID, sequence: MAX_SEQUENCE }), i64::MAX);
        assert_eq!(decompose(-1), Err(SnowflakeError::NegativeId(-1)));
    }

    #[test]
    fn machine_id_range() {
        assert_eq!(check_machine_id(0), Ok(0));
        assert_eq!(check_machine_id(1023), Ok(1023));
        assert_eq!(check_machine_id(1024), Err(SnowflakeError::MachineOutOfRange(1024)));
        assert_eq!(check_machine_id(-1), Err(SnowflakeError::MachineOutOfRange(-1)));
    }

    #[test]
    fn same_millisecond_counts_the_sequence() {
        let state = AtomicU64::new(0);
        let clock = FakeClock::at(1000);
        let ids: Vec<i64> = (0..5).map(|_| gen(&state, &clock).unwrap()).collect();
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(decompose(*id).unwrap(), Parts { millis: 1000, machine_id: 7, sequence: i as u16 });
        }
        assert_eq!(clock.paused_ms.get(), 0);
    }

    #[test]
    fn a_new_millisecond_restarts_the_sequence() {
        let state = AtomicU64::new(0);
        let clock = FakeClock::at(1000);
        gen(&state, &clock).unwrap();
        gen(&state, &clock).unwrap();
        clock.set(1001);
        let id = gen(&state, &clock).unwrap();
        assert_eq!(decompose(id).unwrap(), Parts { millis: 1001, machine_id: 7, sequence: 0 });
    }

    #[test]
    fn the_4097th_id_in_a_millisecond_waits_for_the_next() {
        let state = AtomicU64::new(0);
        let clock = FakeClock::at(5000);
        let mut last = -1;
        for _ in 0..4096 {
            let id = gen(&state, &clock).unwrap();
            assert!(id > last);
            last = id;
        }
        assert_eq!(decompose(last).unwrap().sequence, MAX_SEQUENCE);
        assert_eq!(clock.paused_ms.get(), 0, "4096 IDs fit in one millisecond");
        let next = gen(&state, &clock).unwrap();
        assert_eq!(clock.paused_ms.get(), 1);
        assert_eq!(decompose(next).unwrap(), Parts { millis: 5001, machine_id: 7, sequence: 0 });
        assert!(next > last);
    }

    #[test]
    fn clock_back_up_to_10ms_is_waited_out() {
        let state = AtomicU64::new(0);
        let clock = FakeClock::at(10_000);
        let before = gen(&state, &clock).unwrap();
        clock.set(10_000 - 10);
        let after = gen(&state, &clock).unwrap();
        assert_eq!(clock.paused_ms.get(), 10, "waited until the clock caught up");
        assert!(after > before);
        assert_eq!(decompose(after).unwrap(), Parts { millis: 10_000, machine_id: 7, sequence: 1 });
    }

    #[test]
    fn clock_back_more_than_10ms_is_refused_and_says_by_how_much() {
        let state = AtomicU64::new(0);
        let clock = FakeClock::at(10_000);
        gen(&state, &clock).unwrap();
        let saved = state.load(Ordering::SeqCst);
        clock.set(10_000 - 11);
        let err = gen(&state, &clock).unwrap_err();
        assert_eq!(err, SnowflakeError::ClockBehind { behind_ms: 11 });
        assert!(err.to_string().contains("11 ms"), "{err}");
        assert_eq!(state.load(Ordering::SeqCst), saved, "a refusal changes nothing");
        assert_eq!(clock.paused_ms.get(), 0);
        clock.set(10_001);
        assert!(gen(&state, &clock).is_ok(), "recovers once the clock is past the last ID");
    }

    #[test]
    fn resuming_after_a_persisted_millisecond_never_reuses_it() {
        let state = AtomicU64::new(state_after_millisecond(20_000));
        let clock = FakeClock::at(20_000);
        let id = gen(&state, &clock).unwrap();
        assert_eq!(decompose(id).unwrap().millis, 20_001);
        assert_eq!(state_millis(state.load(Ordering::SeqCst)), 20_001);
    }

    #[test]
    fn clock_before_epoch_or_past_41_bits_is_refused() {
        let state = AtomicU64::new(0);
        assert!(matches!(gen(&state, &FakeClock::at(-1)), Err(SnowflakeError::BeforeEpoch { .. })));
        let late = FakeClock::at(MAX_TIMESTAMP_MS as i64 + 1);
        assert_eq!(gen(&state, &late), Err(SnowflakeError::TimestampExhausted));
    }

    #[test]
    fn threads_sharing_one_state_never_collide() {
        struct SystemClock;
        impl Clock for SystemClock {
            fn now_unix_ms(&self) -> i64 {
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
            }
            fn pause(&self, _millis: u64) {
                std::thread::yield_now();
            }
        }
        let state = AtomicU64::new(0);
        let per_thread: Vec<Vec<i64>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..20_000).map(|_| next_id(&state, &SystemClock, EPOCH, 1).unwrap()).collect::<Vec<_>>()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for ids in &per_thread {
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "increasing within a thread");
        }
        let mut all: Vec<i64> = per_thread.concat();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 80_000);
    }
}
