//! Sharded IDs (SPEC §15, Instagram's layout): `0 | 41 bits ms since the
//! epoch | 12 bits shard | 10 bits sequence`, the sequence per shard and
//! millisecond (1 024), so the database that owns a logical shard numbers
//! its rows in time order with no coordination, and the shard is read back
//! from the ID.
//!
//! Each shard's state is one `u64`, `(ms << 10) | sequence`, advanced by
//! compare-and-swap like the snowflake generator's: shards share no lock
//! and no cache line (the server pads them). They share the snowflake
//! generator's clock rules (a step back of up to 10 ms is waited out, more
//! refused) and its durable mark (`snowflake::cover`, written to WAL
//! before use): after a restart, a crash or a failover every shard starts
//! above the mark, as snowflakes do.
//!
//! A shard moves between servers with [`release`] on the old owner, which
//! closes the shard (`CLOSED`: no caller can issue from it any more, the
//! swap that closes it returns the last state exactly) and gives the
//! handover point, and [`accept`] on the new owner, which puts the shard
//! above that point, in memory and in its durable mark.

use std::sync::atomic::{AtomicU64, Ordering};
use thiserror::Error;

use crate::snowflake::{self, Clock, MarkStore, SharedState, SnowflakeError, Step, MAX_BACKWARD_WAIT_MS, MAX_TIMESTAMP_MS, RESERVE_AHEAD_MS};

pub const SHARD_BITS: u32 = 12;
pub const SEQUENCE_BITS: u32 = 10;
pub const MAX_SHARD: u16 = (1 << SHARD_BITS) - 1;
pub const MAX_SEQUENCE: u16 = (1 << SEQUENCE_BITS) - 1;
/// How far ahead of this server's clock a handover point may be: accepting
/// it waits that long at most.
pub const MAX_HANDOVER_AHEAD_MS: u64 = RESERVE_AHEAD_MS + 10_000;

/// A released shard's state: nothing can be issued from it.
const CLOSED: u64 = u64::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardedParts {
    pub millis: u64,
    pub shard: u16,
    pub sequence: u16,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ShardError {
    #[error("shard {0} is out of range 0-{MAX_SHARD}")]
    OutOfRange(i64),
    #[error("{0} is not a sharded ID: sharded IDs are never negative")]
    NegativeId(i64),
    #[error("shard {0} was released from this server (sharded_release); it issues again only after sharded_accept()")]
    Released(u16),
    #[error("the handover point of shard {shard} is {ahead_ms} ms ahead of this server's clock, more than {MAX_HANDOVER_AHEAD_MS} ms: fix the clocks first")]
    HandoverAhead { shard: u16, ahead_ms: u64 },
    #[error("pg_ticket.shards: {0:?} is not a list of shards within 0-{MAX_SHARD} (e.g. '0-63, 128')")]
    BadList(String),
    #[error(transparent)]
    Snowflake(#[from] SnowflakeError),
}

/// The shards a server owns (`pg_ticket.shards`), e.g. "0-63, 128"; empty:
/// none.
pub fn parse_shard_list(text: &str) -> Result<Vec<u16>, ShardError> {
    crate::leases::parse_ranges(text, MAX_SHARD).ok_or_else(|| ShardError::BadList(text.to_string()))
}

#[inline]
pub fn compose(parts: ShardedParts) -> i64 {
    let ms = parts.millis & MAX_TIMESTAMP_MS;
    let shard = u64::from(parts.shard & MAX_SHARD);
    let seq = u64::from(parts.sequence & MAX_SEQUENCE);
    ((ms << (SHARD_BITS + SEQUENCE_BITS)) | (shard << SEQUENCE_BITS) | seq) as i64
}

pub fn decompose(id: i64) -> Result<ShardedParts, ShardError> {
    if id < 0 {
        return Err(ShardError::NegativeId(id));
    }
    let id = id as u64;
    Ok(ShardedParts {
        millis: id >> (SHARD_BITS + SEQUENCE_BITS),
        shard: ((id >> SEQUENCE_BITS) & u64::from(MAX_SHARD)) as u16,
        sequence: (id & u64::from(MAX_SEQUENCE)) as u16,
    })
}

pub fn check_shard(shard: i64) -> Result<u16, ShardError> {
    u16::try_from(shard).ok().filter(|s| *s <= MAX_SHARD).ok_or(ShardError::OutOfRange(shard))
}

/// The lowest and highest ID any shard can have in the millisecond
/// `unix_ms` (`id BETWEEN min AND max` over a time range is an index range
/// scan).
pub fn id_range_of_millisecond(unix_ms: i64, epoch_unix_ms: i64) -> Result<(i64, i64), SnowflakeError> {
    let millis = unix_ms
        .checked_sub(epoch_unix_ms)
        .and_then(|ms| u64::try_from(ms).ok())
        .filter(|ms| *ms <= MAX_TIMESTAMP_MS)
        .ok_or(SnowflakeError::TimeOutOfRange { unix_ms, epoch_ms: epoch_unix_ms })?;
    Ok((
        compose(ShardedParts { millis, shard: 0, sequence: 0 }),
        compose(ShardedParts { millis, shard: MAX_SHARD, sequence: MAX_SEQUENCE }),
    ))
}

/// The shard of `key` among `shard_count` (1 .. 4 096): FNV-1a (64 bits)
/// of the key's bytes, modulo the count. Stable across versions and
/// platforms, and a few lines in any language (docs/reference.md gives
/// them): an application computes it too, to find a row's shard from its
/// key without asking.
pub fn shard_of(key: &[u8], shard_count: u16) -> u16 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let hash = key.iter().fold(OFFSET, |h, &b| (h ^ u64::from(b)).wrapping_mul(PRIME));
    (hash % u64::from(shard_count.max(1))) as u16
}

/// One shard's state: `(ms << 10) | sequence` of its last ID, `CLOSED`
/// once released. The server gives each its own cache line.
#[derive(Default)]
pub struct ShardState {
    last: AtomicU64,
}

/// The state after the last sequence of `millis`.
fn after_millisecond(millis: u64) -> u64 {
    (millis << SEQUENCE_BITS) | u64::from(MAX_SEQUENCE)
}

/// The next ID of `shard`. `clock_shared` is the snowflake generator's
/// state, whose durable mark covers every shard's timestamps.
pub fn next_id(
    clock_shared: &SharedState,
    state: &ShardState,
    clock: &impl Clock,
    store: &impl MarkStore,
    epoch_unix_ms: i64,
    shard: u16,
) -> Result<i64, ShardError> {
    let floor = snowflake::load_mark(clock_shared, clock, store, epoch_unix_ms)?.map(after_millisecond);
    loop {
        // The state before the clock, as the snowflake generator reads them
        // (a caller paused between the two must not see others' IDs as a
        // clock step back).
        let last = state.last.load(Ordering::Acquire);
        if last == CLOSED {
            return Err(ShardError::Released(shard));
        }
        if let Some(floor) = floor.filter(|f| last < *f) {
            // First use since the start: above the mark.
            let _ = state.last.compare_exchange(last, floor, Ordering::AcqRel, Ordering::Acquire);
            continue;
        }
        let now_unix_ms = clock.now_unix_ms();
        let since_epoch = now_unix_ms - epoch_unix_ms;
        if since_epoch < 0 {
            return Err(SnowflakeError::BeforeEpoch { now_ms: now_unix_ms, epoch_ms: epoch_unix_ms }.into());
        }
        let now_ms = since_epoch as u64;
        if now_ms > MAX_TIMESTAMP_MS {
            return Err(SnowflakeError::TimestampExhausted.into());
        }
        // Right after a start (or a handover) the state may lie up to the
        // reservation ahead of the clock: wait rather than refuse.
        let max_wait_ms = if Some(last) == floor { RESERVE_AHEAD_MS + MAX_BACKWARD_WAIT_MS } else { MAX_BACKWARD_WAIT_MS };
        match snowflake::step_in(last, now_ms, max_wait_ms, SEQUENCE_BITS) {
            Step::Issue(next) => {
                let millis = next >> SEQUENCE_BITS;
                snowflake::cover(clock_shared, clock, store, epoch_unix_ms, millis)?;
                if state.last.compare_exchange_weak(last, next, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    return Ok(compose(ShardedParts { millis, shard, sequence: (next & u64::from(MAX_SEQUENCE)) as u16 }));
                }
            }
            Step::WaitUntil(target_ms) => clock.pause(target_ms.saturating_sub(now_ms).max(1)),
            Step::Refuse { behind_ms } => return Err(SnowflakeError::ClockBehind { behind_ms, allowed_ms: max_wait_ms }.into()),
        }
    }
}

/// Close `shard` on this server and return its handover point: an ID at or
/// above every ID this server issued (or, since its last start, may have
/// issued before it: its durable mark) for the shard. Nothing is issued
/// from it afterwards here, not even by a call already under way: the swap
/// that closes it is the one every issuer must win.
pub fn release(
    clock_shared: &SharedState,
    state: &ShardState,
    clock: &impl Clock,
    store: &impl MarkStore,
    epoch_unix_ms: i64,
    shard: u16,
) -> Result<i64, ShardError> {
    let floor = snowflake::load_mark(clock_shared, clock, store, epoch_unix_ms)?.map(after_millisecond);
    let last = state.last.swap(CLOSED, Ordering::AcqRel);
    if last == CLOSED {
        return Err(ShardError::Released(shard));
    }
    let point = last.max(floor.unwrap_or(0));
    Ok(compose(ShardedParts { millis: point >> SEQUENCE_BITS, shard, sequence: (point & u64::from(MAX_SEQUENCE)) as u16 }))
}

/// Take `shard` over from another server above its handover point (an ID
/// of `release`, or any ID at or above the old owner's last): the shard's
/// state here is raised above it, and the durable mark made to cover its
/// millisecond, so neither a restart nor a failover goes below it. Waits
/// (through `Clock::sleep`) until this server's clock has passed the point,
/// at most `MAX_HANDOVER_AHEAD_MS`. Opens a released shard again.
pub fn accept(
    clock_shared: &SharedState,
    state: &ShardState,
    clock: &impl Clock,
    store: &impl MarkStore,
    epoch_unix_ms: i64,
    shard: u16,
    handover_id: i64,
) -> Result<(), ShardError> {
    let parts = decompose(handover_id)?;
    snowflake::load_mark(clock_shared, clock, store, epoch_unix_ms)?;
    let now_ms = clock.now_unix_ms().saturating_sub(epoch_unix_ms).max(0) as u64;
    if parts.millis > now_ms + MAX_HANDOVER_AHEAD_MS {
        return Err(ShardError::HandoverAhead { shard, ahead_ms: parts.millis - now_ms });
    }
    snowflake::cover(clock_shared, clock, store, epoch_unix_ms, parts.millis)?;
    let point = (parts.millis << SEQUENCE_BITS) | u64::from(parts.sequence);
    let mut current = state.last.load(Ordering::Acquire);
    loop {
        let raised = if current == CLOSED { point } else { current.max(point) };
        match state.last.compare_exchange(current, raised, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => break,
            Err(seen) => current = seen,
        }
    }
    // Returns once the clock can issue above the point.
    loop {
        let now_ms = clock.now_unix_ms().saturating_sub(epoch_unix_ms).max(0) as u64;
        if now_ms > parts.millis {
            return Ok(());
        }
        clock.sleep((parts.millis + 1 - now_ms).min(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snowflake::tests::{FakeClock, MemStore, EPOCH};

    fn ids(shared: &SharedState, state: &ShardState, clock: &FakeClock, store: &MemStore, shard: u16, n: usize) -> Vec<i64> {
        (0..n).map(|_| next_id(shared, state, clock, store, EPOCH, shard).unwrap()).collect()
    }

    #[test]
    fn the_layout_is_41_12_10_and_decodes() {
        let id = compose(ShardedParts { millis: 1_000, shard: 4_095, sequence: 1_023 });
        assert_eq!(id, (1_000 << 22) | (4_095 << 10) | 1_023);
        assert_eq!(decompose(id).unwrap(), ShardedParts { millis: 1_000, shard: 4_095, sequence: 1_023 });
        assert_eq!(decompose(-1), Err(ShardError::NegativeId(-1)));
        assert_eq!(check_shard(4_096), Err(ShardError::OutOfRange(4_096)));
        assert_eq!(check_shard(-1), Err(ShardError::OutOfRange(-1)));
        let (lo, hi) = id_range_of_millisecond(EPOCH + 5, EPOCH).unwrap();
        assert_eq!((lo, hi), (5 << 22, (6 << 22) - 1));
    }

    #[test]
    fn a_shard_issues_1024_per_millisecond_then_waits_and_shards_are_independent() {
        let (shared, store, clock) = (SharedState::default(), MemStore::default(), FakeClock::at(100));
        let (a, b) = (ShardState::default(), ShardState::default());
        let first = ids(&shared, &a, &clock, &store, 3, 1_025);
        assert!(first.windows(2).all(|w| w[0] < w[1]), "increasing");
        assert_eq!(decompose(first[1_023]).unwrap(), ShardedParts { millis: 100, shard: 3, sequence: 1_023 });
        assert_eq!(decompose(first[1_024]).unwrap(), ShardedParts { millis: 101, shard: 3, sequence: 0 }, "waited for the next ms");
        assert_eq!(clock.paused_ms.get(), 1);
        let other = ids(&shared, &b, &clock, &store, 9, 1);
        assert_eq!(decompose(other[0]).unwrap(), ShardedParts { millis: 101, shard: 9, sequence: 0 }, "shard 9 has its own sequence");
    }

    #[test]
    fn clock_rules_and_the_mark_are_the_snowflakes() {
        let (shared, store, clock) = (SharedState::default(), MemStore::default(), FakeClock::at(5_000));
        let state = ShardState::default();
        ids(&shared, &state, &clock, &store, 1, 1);
        assert_eq!(store.mark.get(), Some(EPOCH + 5_000 + RESERVE_AHEAD_MS as i64), "the mark covers the shard's stamp before it is issued");
        clock.set(4_995);
        let after_wait = ids(&shared, &state, &clock, &store, 1, 1)[0];
        assert!(decompose(after_wait).unwrap().millis >= 5_000, "a 5 ms step back is waited out");
        clock.set(4_000);
        assert!(matches!(next_id(&shared, &state, &clock, &store, EPOCH, 1), Err(ShardError::Snowflake(SnowflakeError::ClockBehind { .. }))));
        // A restart: every shard starts above the mark, even with the clock back.
        let (restarted, state_after) = (SharedState::default(), ShardState::default());
        clock.set(5_500);
        let id = ids(&restarted, &state_after, &clock, &store, 1, 1)[0];
        assert!(decompose(id).unwrap().millis > 6_000, "above the mark ({:?})", decompose(id));
    }

    #[test]
    fn a_released_shard_issues_nothing_and_its_new_owner_starts_above_the_handover_point() {
        let (old_shared, old_store, clock) = (SharedState::default(), MemStore::default(), FakeClock::at(10_000));
        let old = ShardState::default();
        let issued = ids(&old_shared, &old, &clock, &old_store, 7, 500);
        let point = release(&old_shared, &old, &clock, &old_store, EPOCH, 7).unwrap();
        assert_eq!(point, *issued.last().unwrap(), "the exact last ID when the server has not restarted");
        assert_eq!(next_id(&old_shared, &old, &clock, &old_store, EPOCH, 7), Err(ShardError::Released(7)));
        assert_eq!(release(&old_shared, &old, &clock, &old_store, EPOCH, 7), Err(ShardError::Released(7)));

        // The new owner's clock is 3 ms behind: accepting waits it out.
        let (new_shared, new_store, new_clock) = (SharedState::default(), MemStore::default(), FakeClock::at(9_997));
        let new = ShardState::default();
        accept(&new_shared, &new, &new_clock, &new_store, EPOCH, 7, point).unwrap();
        assert!(new_clock.paused_ms.get() >= 3);
        assert!(new_store.mark.get().unwrap() >= EPOCH + 10_000, "the new owner's mark covers the point");
        let next = ids(&new_shared, &new, &new_clock, &new_store, 7, 1)[0];
        assert!(next > point);
        // After the new owner restarts (its clock back within the
        // reservation), still above it.
        let (restarted, state) = (SharedState::default(), ShardState::default());
        new_clock.set(10_500);
        assert!(ids(&restarted, &state, &new_clock, &new_store, 7, 1)[0] > point);
    }

    #[test]
    fn a_release_after_a_restart_hands_over_the_mark() {
        let (shared, store, clock) = (SharedState::default(), MemStore::default(), FakeClock::at(20_000));
        ids(&shared, &ShardState::default(), &clock, &store, 2, 10);
        let (restarted, state) = (SharedState::default(), ShardState::default());
        let point = release(&restarted, &state, &clock, &store, EPOCH, 2).unwrap();
        let mark_ms = (store.mark.get().unwrap() - EPOCH) as u64;
        assert_eq!(decompose(point).unwrap(), ShardedParts { millis: mark_ms, shard: 2, sequence: MAX_SEQUENCE });
    }

    #[test]
    fn a_handover_point_far_ahead_is_refused() {
        let (shared, store, clock) = (SharedState::default(), MemStore::default(), FakeClock::at(1_000));
        let far = compose(ShardedParts { millis: 1_000 + MAX_HANDOVER_AHEAD_MS + 1, shard: 1, sequence: 0 });
        assert!(matches!(accept(&shared, &ShardState::default(), &clock, &store, EPOCH, 1, far), Err(ShardError::HandoverAhead { .. })));
    }

    #[test]
    fn shard_lists_are_ranges_within_4095() {
        assert_eq!(parse_shard_list("").unwrap(), Vec::<u16>::new());
        assert_eq!(parse_shard_list("0-3, 128,2").unwrap(), vec![0, 1, 2, 3, 128]);
        assert_eq!(parse_shard_list("4095").unwrap(), vec![4095]);
        for bad in ["4096", "0-4096", "5-3", "a", "1,-", "-1"] {
            assert_eq!(parse_shard_list(bad), Err(ShardError::BadList(bad.into())), "{bad}");
        }
    }

    #[test]
    fn shard_of_is_fnv1a_modulo_the_count() {
        // FNV-1a 64 of "" is the offset basis; of "a" is 0xaf63dc4c8601ec8c.
        assert_eq!(shard_of(b"", 4_096), (0xcbf2_9ce4_8422_2325u64 % 4_096) as u16);
        assert_eq!(shard_of(b"a", 1_000), (0xaf63_dc4c_8601_ec8cu64 % 1_000) as u16);
        assert_eq!(shard_of(b"user:42", 1), 0);
        assert!((0..1000).all(|i| shard_of(format!("k{i}").as_bytes(), 64) < 64));
    }
}
