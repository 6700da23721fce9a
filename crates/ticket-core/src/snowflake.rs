//! Snowflake layout and clock rules, free of PostgreSQL.
//!
//! An ID is `0 | 41 bits ms since epoch | machine | sequence`, the 22 low
//! bits split by the ID space's [`Layout`] (10 machine bits and 12 sequence
//! bits unless `pg_ticket.machine_bits` says otherwise). The generator's
//! whole state is one `u64` holding the last issued `(ms << 22) | sequence`
//! (the same packing for every layout; the layout bounds the sequence), so
//! every backend can advance it with a single compare-and-swap: no lock is
//! held across calls and IDs are strictly increasing in the order the swaps
//! succeed.
//!
//! Restarts: a timestamp is reserved ahead of use in a durable mark (see
//! `MarkStore`), `RESERVE_AHEAD_MS` ahead. A restarted server starts above
//! the reserved mark, so a clock set back while it was down cannot make it
//! reissue an ID: a small gap is waited out, a large one refused.
//!
//! Locking rule: `last` and `reserved_until` are atomics, advanced by CAS or
//! `fetch_max`; nothing is held while issuing. `busy` is a try-lock held by
//! the one backend that loads or writes the durable mark (a file write and
//! two fsyncs). Once half the reservation is used, the backend that notices
//! *tries* `busy` and renews the mark while everyone keeps issuing from what
//! is left, so in steady state nobody waits. Only a caller that finds the
//! reservation used up (the writer stalled for half a reservation) waits for
//! `busy`, pausing through `Clock::pause` (which in the server sleeps and
//! honours cancel, statement_timeout and terminate) and giving up with
//! `MarkBusy` after `MARK_WAIT_LIMIT_MS`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use thiserror::Error;

pub const TIMESTAMP_BITS: u32 = 41;
/// The bits below the timestamp, machine id and sequence, in every layout.
pub const LOW_BITS: u32 = 22;
pub const MAX_TIMESTAMP_MS: u64 = (1 << TIMESTAMP_BITS) - 1;
/// The generator's state packs the millisecond above this many bits.
const STATE_SHIFT: u32 = LOW_BITS;
const STATE_SEQUENCE_MASK: u64 = (1 << STATE_SHIFT) - 1;
/// A backwards clock step up to this size is waited out; a larger one is refused.
pub const MAX_BACKWARD_WAIT_MS: u64 = 10;
/// How far ahead of the IDs being issued the durable mark is written.
pub const RESERVE_AHEAD_MS: u64 = 1000;
/// Once an ID is issued within this many ms of the reserved mark, the mark is
/// renewed early by one backend that finds the lock free: about one write
/// per `RESERVE_AHEAD_MS - RENEW_WITHIN_MS` under continuous load.
pub const RENEW_WITHIN_MS: u64 = RESERVE_AHEAD_MS / 2;
/// How long a caller waits for another backend's mark write (or load)
/// before it gives up with `MarkBusy`.
pub const MARK_WAIT_LIMIT_MS: u64 = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parts {
    pub millis: u64,
    pub machine_id: u16,
    pub sequence: u16,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum SnowflakeError {
    #[error("the system clock is {} behind the last snowflake timestamp issued (or reserved before a restart); pg_ticket waits out at most {}", crate::epoch::format_duration_ms(*.behind_ms as i64), crate::epoch::format_duration_ms(*.allowed_ms as i64))]
    ClockBehind { behind_ms: u64, allowed_ms: u64 },
    #[error("cannot read or write the snowflake mark: {0}")]
    MarkStore(String),
    #[error("the snowflake mark {location} is damaged: {why}")]
    DamagedMark { location: String, why: String },
    #[error("waited {} for another backend to write the snowflake mark; the storage under the data directory may be stalled", crate::epoch::format_duration_ms(*.waited_ms as i64))]
    MarkBusy { waited_ms: u64 },
    #[error("the system clock ({}) is before the configured epoch ({})", crate::epoch::format_unix_ms(*.now_ms), crate::epoch::format_unix_ms(*.epoch_ms))]
    BeforeEpoch { now_ms: i64, epoch_ms: i64 },
    #[error("the 41-bit timestamp is exhausted: more than 41 bits of milliseconds (about 69 years) have passed since the epoch")]
    TimestampExhausted,
    #[error("machine id {id} is out of range 0-{max}")]
    MachineOutOfRange { id: i64, max: u16 },
    #[error("{0} machine bits is out of range {min}-{max}: the 22 bits below an ID's timestamp hold the machine id and at least 6 bits of sequence", min = Layout::MIN_MACHINE_BITS, max = Layout::MAX_MACHINE_BITS)]
    MachineBitsOutOfRange(i64),
    #[error("{0} is not a snowflake ID: snowflake IDs are never negative")]
    NegativeId(i64),
    #[error("{} is outside the snowflake time range: from the epoch ({}) to {} (41 bits of milliseconds, about 69 years)", crate::epoch::format_unix_ms(*.unix_ms), crate::epoch::format_unix_ms(*.epoch_ms), crate::epoch::format_unix_ms(*.epoch_ms + MAX_TIMESTAMP_MS as i64))]
    TimeOutOfRange { unix_ms: i64, epoch_ms: i64 },
    #[error("the machine-id lease ends at {} (plus half the margin): no later timestamp may be stamped under it; waiting for its renewal", crate::epoch::format_unix_ms(*.stamp_cap_unix_ms))]
    PastLease { stamp_cap_unix_ms: i64 },
    #[error("the snowflake IDs of {location} were made with {recorded}, but this server is set for {configured}: IDs of the two can collide; set it back")]
    OtherIdSpace { location: String, recorded: IdSpace, configured: IdSpace },
    /// The clock's owner refused a reading before it entered the state
    /// (`Clock::stamp_unix_ms`); it says why.
    #[error("a clock reading was refused before it was stamped")]
    ReadingRefused,
}

/// The split of an ID's 22 low bits between machine id and sequence
/// (SPEC §15), fixed for an ID space: more machine bits for a fleet whose
/// holders churn through machine ids faster than leases free them, each
/// bit halving the IDs one machine can stamp in a millisecond.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    machine_bits: u32,
}

impl Layout {
    /// 1 024 machines, 4 096 IDs each per millisecond (Twitter's split).
    pub const DEFAULT: Layout = Layout { machine_bits: 10 };
    /// Fewer machine bits would give one machine more sequence numbers
    /// than its generator can stamp in a millisecond.
    pub const MIN_MACHINE_BITS: u32 = 10;
    /// At least 64 IDs per machine per millisecond.
    pub const MAX_MACHINE_BITS: u32 = LOW_BITS - 6;
    /// The most machine ids a layout has.
    pub const WIDEST: Layout = Layout { machine_bits: Self::MAX_MACHINE_BITS };

    pub fn new(machine_bits: i64) -> Result<Layout, SnowflakeError> {
        u32::try_from(machine_bits)
            .ok()
            .filter(|bits| (Self::MIN_MACHINE_BITS..=Self::MAX_MACHINE_BITS).contains(bits))
            .map(|machine_bits| Layout { machine_bits })
            .ok_or(SnowflakeError::MachineBitsOutOfRange(machine_bits))
    }

    pub const fn machine_bits(self) -> u32 {
        self.machine_bits
    }

    pub const fn sequence_bits(self) -> u32 {
        LOW_BITS - self.machine_bits
    }

    pub const fn max_machine_id(self) -> u16 {
        ((1u32 << self.machine_bits) - 1) as u16
    }

    pub const fn max_sequence(self) -> u16 {
        ((1u32 << self.sequence_bits()) - 1) as u16
    }

    /// The ID for `parts`. Parts must already be in range (the generator
    /// guarantees it); masks keep an out-of-range part from corrupting its
    /// neighbours.
    #[inline]
    pub fn compose(self, parts: Parts) -> i64 {
        let ms = parts.millis & MAX_TIMESTAMP_MS;
        let machine = u64::from(parts.machine_id & self.max_machine_id());
        let seq = u64::from(parts.sequence & self.max_sequence());
        ((ms << LOW_BITS) | (machine << self.sequence_bits()) | seq) as i64
    }

    pub fn decompose(self, id: i64) -> Result<Parts, SnowflakeError> {
        if id < 0 {
            return Err(SnowflakeError::NegativeId(id));
        }
        let id = id as u64;
        Ok(Parts {
            millis: id >> LOW_BITS,
            machine_id: ((id >> self.sequence_bits()) & u64::from(self.max_machine_id())) as u16,
            sequence: (id & u64::from(self.max_sequence())) as u16,
        })
    }

    pub fn check_machine_id(self, machine_id: i64) -> Result<u16, SnowflakeError> {
        u16::try_from(machine_id)
            .ok()
            .filter(|m| *m <= self.max_machine_id())
            .ok_or(SnowflakeError::MachineOutOfRange { id: machine_id, max: self.max_machine_id() })
    }
}

impl Default for Layout {
    fn default() -> Self {
        Layout::DEFAULT
    }
}

/// The space snowflake IDs are stamped into: the epoch and the layout. IDs
/// compare only within one space, and a generator must never stamp into
/// another space than the IDs it made before (a later epoch reissues the
/// IDs of an earlier time, another layout reads one machine's IDs as
/// another's), so the space is recorded with the mark and with the
/// database's state (SPEC §13.10). `machine_bits` is as recorded: a record
/// may hold a value no layout has, and is then simply another space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdSpace {
    pub epoch_unix_ms: i64,
    pub machine_bits: u32,
}

impl IdSpace {
    pub fn new(epoch_unix_ms: i64, layout: Layout) -> Self {
        IdSpace { epoch_unix_ms, machine_bits: layout.machine_bits }
    }

    /// The space of what 0.2.0 recorded without one (a mark, a WAL
    /// record): it had one layout, and did not record its epoch.
    pub fn of_0_2_0(epoch_unix_ms: i64) -> Self {
        IdSpace::new(epoch_unix_ms, Layout::DEFAULT)
    }

    /// The layout, if the recorded bits are one.
    pub fn layout(&self) -> Option<Layout> {
        Layout::new(i64::from(self.machine_bits)).ok()
    }
}

impl std::fmt::Display for IdSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "epoch {} and {} machine bits", crate::epoch::format_unix_ms(self.epoch_unix_ms), self.machine_bits)
    }
}

/// The lowest and highest ID that can have the millisecond `unix_ms` (all
/// 22 low bits clear; all set), so that `id BETWEEN min AND max` over a
/// time range is an index range scan. The time sits above the same 22 bits
/// in every layout of 41 bits of time (the sharded one too), so the range
/// is the same in every one.
pub fn id_range_of_millisecond(unix_ms: i64, epoch_unix_ms: i64) -> Result<(i64, i64), SnowflakeError> {
    let millis = unix_ms
        .checked_sub(epoch_unix_ms)
        .and_then(|ms| u64::try_from(ms).ok())
        .filter(|ms| *ms <= MAX_TIMESTAMP_MS)
        .ok_or(SnowflakeError::TimeOutOfRange { unix_ms, epoch_ms: epoch_unix_ms })?;
    let first = (millis << LOW_BITS) as i64;
    Ok((first, first | ((1 << LOW_BITS) - 1)))
}

/// The generator state that says "the last ID was issued at `millis`, with
/// the last sequence number": the next ID must come from a later millisecond.
/// Used to resume above a persisted high-water mark.
#[inline]
pub fn state_after_millisecond(millis: u64) -> u64 {
    (millis << STATE_SHIFT) | STATE_SEQUENCE_MASK
}

/// What the generator does next, given its last issued state and the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Issue the ID for this packed `(ms << 22) | sequence` state.
    Issue(u64),
    /// Wait until the clock reads this many ms since the epoch, then retry.
    WaitUntil(u64),
    /// Refuse: the clock is this many ms behind the last issued timestamp.
    Refuse { behind_ms: u64 },
}

/// The clock rule as a pure function: a clock behind the last issued
/// timestamp by up to `max_wait_ms` is waited out, by more refused.
#[inline]
pub fn step(last_state: u64, now_ms: u64, max_wait_ms: u64, layout: Layout) -> Step {
    step_packed(last_state, now_ms, max_wait_ms, STATE_SHIFT, u64::from(layout.max_sequence()))
}

/// [`step`] for a layout whose state is `(ms << sequence_bits) | sequence`.
#[inline]
pub fn step_in(last_state: u64, now_ms: u64, max_wait_ms: u64, sequence_bits: u32) -> Step {
    step_packed(last_state, now_ms, max_wait_ms, sequence_bits, (1u64 << sequence_bits) - 1)
}

/// The state is `(ms << shift) | sequence`, the sequence at most `max_sequence`.
#[inline]
fn step_packed(last_state: u64, now_ms: u64, max_wait_ms: u64, shift: u32, max_sequence: u64) -> Step {
    let last_ms = last_state >> shift;
    let last_seq = last_state & ((1u64 << shift) - 1);
    if now_ms > last_ms {
        Step::Issue(now_ms << shift)
    } else if now_ms == last_ms {
        if last_seq < max_sequence {
            Step::Issue(last_state + 1)
        } else {
            Step::WaitUntil(last_ms + 1)
        }
    } else {
        let behind_ms = last_ms - now_ms;
        if behind_ms <= max_wait_ms {
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
    /// The reading a stamp is made of: `now_unix_ms`, unless the clock's
    /// owner checks every reading before it enters the generator's state
    /// (a leased stamp: the first reading and every one after a wait, #46
    /// item 11); `Err` leaves the state untouched.
    fn stamp_unix_ms(&self) -> Result<i64, SnowflakeError> {
        Ok(self.now_unix_ms())
    }
    /// Let about `millis` ms pass (0: just yield; the caller reads the clock
    /// again after). The server's also checks for interrupts here, so every
    /// wait of the generator can be cancelled.
    fn pause(&self, millis: u64);
    /// Sleep for real for `millis` (at least 1): a bounded wait for another
    /// process, not a wait for the next millisecond to begin. The server's
    /// clock sleeps on its latch and checks for interrupts.
    fn sleep(&self, millis: u64) {
        self.pause(millis)
    }
    /// Wait for the millisecond `unix_ms` to begin, for at most
    /// `at_most_ms` (what the caller's own clock reading left until it: a
    /// wall clock stepped back after that reading must not stretch the
    /// wait). The generator's wait for its next millisecond, never more
    /// than `RESERVE_AHEAD_MS + MAX_BACKWARD_WAIT_MS + 1`. This default
    /// pauses `at_most_ms`; the real clocks sleep until just before the
    /// millisecond begins ([`sleep_until_unix_ms`]).
    fn pause_until(&self, unix_ms: i64, at_most_ms: u64) {
        let _ = unix_ms;
        self.pause(at_most_ms)
    }
}

/// How near a millisecond's start a real clock stops sleeping and yields
/// instead: Linux wakes a sleeper up to its timer slack (50 µs by default)
/// late, which would be lost from the millisecond.
const YIELD_WITHIN_NS: i128 = 80_000;

fn wall_ns() -> i128 {
    match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i128,
        Err(e) => -(e.duration().as_nanos() as i128),
    }
}

/// The longest single sleep of a wait: `each_turn` (the server's interrupt
/// check) runs at least this often.
const SLEEP_SLICE_NS: i128 = 1_000_000;

/// Wait until the wall clock reaches `unix_ms`: asleep until just short of
/// it, then yielding, so a generator whose millisecond is full spends the
/// rest of it asleep instead of spinning through it (#36 item 4: at 16
/// machine bits a millisecond holds 64 IDs, made in a few µs). Never longer
/// than `at_most_ms` of monotonic time (the caller's own reading's
/// distance to the target), whatever the wall clock does meanwhile: a
/// clock stepped back ends the wait early, and the caller reads the clock
/// again. `each_turn` runs before every sleep or yield, at least once a
/// millisecond (the server checks for interrupts there).
pub fn sleep_until_unix_ms(unix_ms: i64, at_most_ms: u64, mut each_turn: impl FnMut()) {
    let target_ns = i128::from(unix_ms) * 1_000_000;
    let first_left_ns = (target_ns - wall_ns()).min(i128::from(at_most_ms) * 1_000_000);
    if first_left_ns <= 0 {
        return;
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_nanos(first_left_ns as u64);
    loop {
        let left_ns = (target_ns - wall_ns()).min(deadline.saturating_duration_since(std::time::Instant::now()).as_nanos() as i128);
        if left_ns <= 0 {
            return;
        }
        each_turn();
        if left_ns > YIELD_WITHIN_NS {
            std::thread::sleep(std::time::Duration::from_nanos((left_ns - YIELD_WITHIN_NS).min(SLEEP_SLICE_NS) as u64));
        } else {
            std::thread::yield_now();
        }
    }
}

/// Where the reserved mark survives a restart (a file in the data directory
/// in the server; memory in tests). Values are Unix milliseconds.
pub trait MarkStore {
    /// The mark, None if none was ever written; an unreadable one is
    /// `MarkStore`, a damaged one `DamagedMark`.
    fn load(&self) -> Result<Option<i64>, SnowflakeError>;
    fn save(&self, reserved_until_unix_ms: i64) -> Result<(), String>;
    /// Where the mark lives, for messages.
    fn location(&self) -> String;
}

/// The generator's shared state: in shared memory in the server.
#[derive(Default)]
pub struct SharedState {
    /// Last issued `(ms << 22) | sequence`.
    last: AtomicU64,
    /// Every timestamp up to this one (ms since epoch) is covered by the
    /// durable mark.
    reserved_until: AtomicU64,
    /// The state the durable mark put `last` at on load (u64::MAX: none);
    /// while `last` still equals it nothing was issued since the restart.
    floor: AtomicU64,
    loaded: AtomicBool,
    /// Guards loading and writing the durable mark.
    busy: AtomicBool,
    /// Waits since start, for monitoring: a full millisecond (every sequence
    /// number used) and a clock step back waited out.
    waits_full_millisecond: AtomicU64,
    waits_clock_back: AtomicU64,
}

/// What the generator has done since start, for `pgticket.status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Activity {
    /// Last issued timestamp, ms since the epoch (None: nothing issued or
    /// reserved yet).
    pub last_millis: Option<u64>,
    /// The durable mark, ms since the epoch (None: not loaded or written yet).
    pub reserved_until_millis: Option<u64>,
    pub waits_full_millisecond: u64,
    pub waits_clock_back: u64,
}

impl SharedState {
    /// A generator that needs no durable mark and issues only above
    /// `floor_unix_ms`: a leased generator (`crates/ticket-client`), whose
    /// lease says how far back earlier holders of its machine id may have
    /// stamped (`not_before_ms`). A clock behind the floor is waited out up
    /// to `MAX_BACKWARD_WAIT_MS`, refused beyond.
    pub fn starting_after(floor_unix_ms: i64, epoch_unix_ms: i64) -> Self {
        let floor_ms = floor_unix_ms.saturating_sub(epoch_unix_ms).clamp(0, MAX_TIMESTAMP_MS as i64) as u64;
        SharedState {
            last: AtomicU64::new(if floor_unix_ms < epoch_unix_ms { 0 } else { state_after_millisecond(floor_ms) }),
            reserved_until: AtomicU64::new(MAX_TIMESTAMP_MS),
            floor: AtomicU64::new(u64::MAX),
            loaded: AtomicBool::new(true),
            ..SharedState::default()
        }
    }

    /// Issue nothing at or before `floor_unix_ms` from now on (a new lease's
    /// `not_before_ms`); a floor already passed changes nothing.
    pub fn raise_floor(&self, floor_unix_ms: i64, epoch_unix_ms: i64) {
        if floor_unix_ms >= epoch_unix_ms {
            let floor_ms = ((floor_unix_ms - epoch_unix_ms) as u64).min(MAX_TIMESTAMP_MS);
            self.last.fetch_max(state_after_millisecond(floor_ms), Ordering::AcqRel);
        }
    }

    pub fn last_state(&self) -> u64 {
        self.last.load(Ordering::Acquire)
    }

    /// The millisecond (since the epoch) of the last ID issued, if any.
    pub fn last_millis(&self) -> Option<u64> {
        let last = self.last_state();
        (last != 0).then_some(last >> STATE_SHIFT)
    }

    pub fn activity(&self) -> Activity {
        let reserved = self.reserved_until.load(Ordering::Acquire);
        Activity {
            last_millis: self.last_millis(),
            reserved_until_millis: (reserved != 0).then_some(reserved),
            waits_full_millisecond: self.waits_full_millisecond.load(Ordering::Relaxed),
            waits_clock_back: self.waits_clock_back.load(Ordering::Relaxed),
        }
    }

    /// The flag of the one writer of this generator's durable files (the
    /// mark, and the shard book of `sharded`).
    pub(crate) fn writer_flag(&self) -> &AtomicBool {
        &self.busy
    }

    /// Free the mark-writer flag held by a process that is exiting in the
    /// middle of a write (it will never drop its guard): the caller knows
    /// it was the writer.
    pub fn release_mark_writer_on_exit(&self) {
        self.busy.store(false, Ordering::Release);
    }

    /// Zero the wait counters (the admin's reset).
    pub fn reset_counters(&self) {
        self.waits_full_millisecond.store(0, Ordering::Relaxed);
        self.waits_clock_back.store(0, Ordering::Relaxed);
    }
}

pub(crate) struct Busy<'a>(&'a AtomicBool);

impl<'a> Busy<'a> {
    pub(crate) fn try_acquire(flag: &'a AtomicBool) -> Option<Self> {
        flag.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).ok().map(|_| Busy(flag))
    }

    /// Wait for the flag: a few yields, then 1 ms pauses, up to
    /// `MARK_WAIT_LIMIT_MS` of them.
    pub(crate) fn acquire(flag: &'a AtomicBool, clock: &impl Clock) -> Result<Self, SnowflakeError> {
        const YIELDS: u32 = 16;
        let mut yields = 0;
        let mut waited_ms = 0;
        loop {
            if let Some(busy) = Busy::try_acquire(flag) {
                return Ok(busy);
            }
            if yields < YIELDS {
                yields += 1;
                clock.pause(0);
            } else if waited_ms < MARK_WAIT_LIMIT_MS {
                waited_ms += 1;
                clock.sleep(1);
            } else {
                return Err(SnowflakeError::MarkBusy { waited_ms });
            }
        }
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The mark as ms since the epoch; one that cannot be a mark this server
/// wrote (unrepresentable or past the 41 bits) is damaged, not clamped: a
/// mark clamped to the top would refuse every call forever.
fn mark_millis(store: &impl MarkStore, unix_ms: i64, epoch_unix_ms: i64) -> Result<u64, SnowflakeError> {
    let damaged = |why: String| SnowflakeError::DamagedMark { location: store.location(), why };
    let since_epoch = unix_ms
        .checked_sub(epoch_unix_ms)
        .ok_or_else(|| damaged(format!("{unix_ms} is not a time in milliseconds since 1970")))?;
    if since_epoch > MAX_TIMESTAMP_MS as i64 {
        return Err(damaged(format!("{unix_ms} is past the last millisecond the 41 bits can hold")));
    }
    // A mark before the epoch (the epoch was moved later) holds nothing back.
    Ok(since_epoch.max(0) as u64)
}

fn ensure_loaded(shared: &SharedState, clock: &impl Clock, store: &impl MarkStore, epoch_unix_ms: i64) -> Result<(), SnowflakeError> {
    if shared.loaded.load(Ordering::Acquire) {
        return Ok(());
    }
    let _busy = Busy::acquire(&shared.busy, clock)?;
    if shared.loaded.load(Ordering::Acquire) {
        return Ok(());
    }
    shared.floor.store(u64::MAX, Ordering::Relaxed);
    if let Some(unix_ms) = store.load()? {
        let millis = mark_millis(store, unix_ms, epoch_unix_ms)?;
        let floor = state_after_millisecond(millis);
        shared.last.fetch_max(floor, Ordering::AcqRel);
        shared.floor.store(floor, Ordering::Relaxed);
        shared.reserved_until.store(millis, Ordering::Relaxed);
    }
    shared.loaded.store(true, Ordering::Release);
    Ok(())
}

/// Write the durable mark `RESERVE_AHEAD_MS` past `millis`; the caller holds `busy`.
fn write_mark(shared: &SharedState, store: &impl MarkStore, epoch_unix_ms: i64, millis: u64) -> Result<(), SnowflakeError> {
    let until = (millis + RESERVE_AHEAD_MS).min(MAX_TIMESTAMP_MS);
    store.save(epoch_unix_ms + until as i64).map_err(SnowflakeError::MarkStore)?;
    shared.reserved_until.fetch_max(until, Ordering::AcqRel);
    Ok(())
}

/// Make the durable mark cover `millis` before an ID with it is issued,
/// waiting for a write another backend has under way.
fn reserve(shared: &SharedState, clock: &impl Clock, store: &impl MarkStore, epoch_unix_ms: i64, millis: u64) -> Result<(), SnowflakeError> {
    let _busy = Busy::acquire(&shared.busy, clock)?;
    if millis <= shared.reserved_until.load(Ordering::Acquire) {
        return Ok(());
    }
    write_mark(shared, store, epoch_unix_ms, millis)
}

/// Renew the mark ahead of need if no other backend is writing it. A failed
/// write is not this call's error: what is left of the reservation still
/// covers its ID, and the caller that runs out reports the failure.
fn renew_early(shared: &SharedState, store: &impl MarkStore, epoch_unix_ms: i64, millis: u64) {
    if let Some(_busy) = Busy::try_acquire(&shared.busy) {
        if millis + RENEW_WITHIN_MS > shared.reserved_until.load(Ordering::Acquire) {
            let _ = write_mark(shared, store, epoch_unix_ms, millis);
        }
    }
}

/// For another layout stamped on this generator's clock and durable mark
/// (sharded IDs): the mark loaded, after a start, and the millisecond it
/// puts every ID above (None: there was no mark).
pub fn load_mark(shared: &SharedState, clock: &impl Clock, store: &impl MarkStore, epoch_unix_ms: i64) -> Result<Option<u64>, SnowflakeError> {
    ensure_loaded(shared, clock, store, epoch_unix_ms)?;
    let floor = shared.floor.load(Ordering::Acquire);
    Ok((floor != u64::MAX).then_some(floor >> STATE_SHIFT))
}

/// Whether the server has a durable mark: loaded at start or written
/// since (false before the first load).
pub fn has_mark(shared: &SharedState) -> bool {
    shared.reserved_until.load(Ordering::Acquire) != 0
}

/// An administrator's word for a mark that was lost (SPEC §17.1: a
/// `pg_upgrade` or a restore that did not carry the file): every ID from
/// now on, of this generator and of every layout on its mark (sharded), is
/// after `after_ms` (ms since the epoch), as if a mark at `after_ms` had
/// been loaded at start — in memory at once, and in the durable mark,
/// which is written at `after_ms` (plus the reservation) unless it is
/// already past it. Returns the mark (ms since the epoch). A clock behind
/// `after_ms` is refused by the next call, as after a start.
pub fn raise_mark(shared: &SharedState, clock: &impl Clock, store: &impl MarkStore, epoch_unix_ms: i64, after_ms: u64) -> Result<u64, SnowflakeError> {
    ensure_loaded(shared, clock, store, epoch_unix_ms)?;
    let after_ms = after_ms.min(MAX_TIMESTAMP_MS);
    let _busy = Busy::acquire(&shared.busy, clock)?;
    if after_ms + RESERVE_AHEAD_MS > shared.reserved_until.load(Ordering::Acquire) {
        write_mark(shared, store, epoch_unix_ms, after_ms)?;
    }
    // After the write: a failed one changes nothing here either.
    let floor = state_after_millisecond(after_ms);
    shared.last.fetch_max(floor, Ordering::AcqRel);
    let loaded_floor = shared.floor.load(Ordering::Acquire);
    if loaded_floor == u64::MAX || loaded_floor < floor {
        shared.floor.store(floor, Ordering::Release);
    }
    Ok(shared.reserved_until.load(Ordering::Acquire))
}

/// For another layout: make the durable mark cover `millis` before an ID
/// of it is issued (waiting for a write under way only when it must), and
/// renew it early as the generator does.
pub fn cover(shared: &SharedState, clock: &impl Clock, store: &impl MarkStore, epoch_unix_ms: i64, millis: u64) -> Result<(), SnowflakeError> {
    let reserved_until = shared.reserved_until.load(Ordering::Acquire);
    if millis > reserved_until {
        reserve(shared, clock, store, epoch_unix_ms, millis)
    } else {
        if millis + RENEW_WITHIN_MS > reserved_until {
            renew_early(shared, store, epoch_unix_ms, millis);
        }
        Ok(())
    }
}

/// Issue the next ID from the shared state, in `layout`. `stamp_cap_unix_ms` is the last
/// millisecond this caller may stamp (a leased machine id's end plus half
/// the margin; `i64::MAX` for a fixed one): a later timestamp is refused
/// before it enters the state or the mark, so a clock stepped far ahead
/// leaves no trace that would hold later IDs back.
pub fn next_id(
    shared: &SharedState,
    clock: &impl Clock,
    store: &impl MarkStore,
    epoch_unix_ms: i64,
    layout: Layout,
    machine_id: u16,
    stamp_cap_unix_ms: i64,
) -> Result<i64, SnowflakeError> {
    ensure_loaded(shared, clock, store, epoch_unix_ms)?;
    loop {
        // Load the state before reading the clock: a backend paused between
        // the two must not compare a stale clock with IDs others issued
        // meanwhile (that looks like the clock going back). In this order
        // the clock is read after every issue it can see, so it is ahead.
        let last = shared.last.load(Ordering::Acquire);
        let now_unix_ms = clock.stamp_unix_ms()?;
        let since_epoch = now_unix_ms - epoch_unix_ms;
        if since_epoch < 0 {
            return Err(SnowflakeError::BeforeEpoch { now_ms: now_unix_ms, epoch_ms: epoch_unix_ms });
        }
        let now_ms = since_epoch as u64;
        if now_ms > MAX_TIMESTAMP_MS {
            return Err(SnowflakeError::TimestampExhausted);
        }
        // Right after a restart the mark may lie up to RESERVE_AHEAD_MS
        // ahead of the last ID really issued, so a clock that far behind
        // it may be right: wait rather than refuse.
        let max_wait_ms = if last == shared.floor.load(Ordering::Relaxed) {
            RESERVE_AHEAD_MS + MAX_BACKWARD_WAIT_MS
        } else {
            MAX_BACKWARD_WAIT_MS
        };
        match step(last, now_ms, max_wait_ms, layout) {
            Step::Issue(next) => {
                let millis = next >> STATE_SHIFT;
                if epoch_unix_ms.saturating_add(millis as i64) > stamp_cap_unix_ms {
                    return Err(SnowflakeError::PastLease { stamp_cap_unix_ms });
                }
                let reserved_until = shared.reserved_until.load(Ordering::Acquire);
                if millis > reserved_until {
                    reserve(shared, clock, store, epoch_unix_ms, millis)?;
                    continue;
                }
                // Sequentially consistent: a server's leased stamp reads its
                // lease's counter after this swap, and the two must not
                // both miss a withdrawal (the server's `snowflake::lease`).
                // The same instruction as AcqRel on x86-64 and aarch64.
                if shared
                    .last
                    .compare_exchange_weak(last, next, Ordering::SeqCst, Ordering::Acquire)
                    .is_ok()
                {
                    if millis + RENEW_WITHIN_MS > reserved_until {
                        renew_early(shared, store, epoch_unix_ms, millis);
                    }
                    return Ok(layout.compose(Parts { millis, machine_id, sequence: (next & STATE_SEQUENCE_MASK) as u16 }));
                }
            }
            Step::WaitUntil(target_ms) => {
                let counter = if now_ms < last >> STATE_SHIFT {
                    &shared.waits_clock_back
                } else {
                    &shared.waits_full_millisecond
                };
                counter.fetch_add(1, Ordering::Relaxed);
                clock.pause_until(epoch_unix_ms.saturating_add(target_ms as i64), target_ms.saturating_sub(now_ms).max(1))
            }
            Step::Refuse { behind_ms } => return Err(SnowflakeError::ClockBehind { behind_ms, allowed_ms: max_wait_ms }),
        }
    }
}

/// The durable mark as a file: written to a temporary file, flushed, and
/// renamed over the old one, so a crash leaves the old or the new mark.
/// The file records the ID space it was written for (`N epoch_ms=E
/// machine_bits=B`); one of another space than `space` is refused on load.
/// A file of 0.2.0 (`N` alone) is of the epoch configured (0.2.0 recorded
/// none) and of 0.2.0's one layout.
pub struct FileMarkStore<'a> {
    pub path: &'a std::path::Path,
    pub space: IdSpace,
}

impl FileMarkStore<'_> {
    /// The space the file's mark was made in (a mark of 0.2.0: its one
    /// layout in `self.space`'s epoch); None if there is no file.
    pub fn recorded_space(&self) -> Result<Option<IdSpace>, SnowflakeError> {
        match std::fs::read_to_string(self.path) {
            Ok(text) => match self.parse(&text) {
                Ok((_, recorded)) => Ok(Some(recorded.unwrap_or(IdSpace::of_0_2_0(self.space.epoch_unix_ms)))),
                Err(why) => Err(SnowflakeError::DamagedMark { location: self.location(), why: format!("it holds {text:?}: {why}") }),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(SnowflakeError::MarkStore(format!("cannot read {}: {e}", self.path.display()))),
        }
    }

    /// The mark and the space it records.
    fn parse(&self, text: &str) -> Result<(i64, Option<IdSpace>), String> {
        let line = text.strip_suffix('\n').ok_or_else(|| "it does not end in a newline (a truncated write?)".to_string())?;
        let mut words = line.split(' ');
        let mark = words.next().unwrap_or_default().parse::<i64>().map_err(|e| format!("it is not a number: {e}"))?;
        let (mut epoch, mut bits) = (None, None);
        for word in words {
            match word.split_once('=') {
                Some(("epoch_ms", v)) => epoch = Some(v.parse::<i64>().map_err(|e| format!("epoch_ms: {e}"))?),
                Some(("machine_bits", v)) => bits = Some(v.parse::<u32>().map_err(|e| format!("machine_bits: {e}"))?),
                _ => return Err(format!("{word:?} is not part of a mark")),
            }
        }
        match (epoch, bits) {
            (None, None) => Ok((mark, None)),
            (Some(epoch_unix_ms), Some(machine_bits)) => Ok((mark, Some(IdSpace { epoch_unix_ms, machine_bits }))),
            _ => Err("it records half an ID space".into()),
        }
    }
}

impl MarkStore for FileMarkStore<'_> {
    fn load(&self) -> Result<Option<i64>, SnowflakeError> {
        match std::fs::read_to_string(self.path) {
            // save() writes the number and a newline; anything else (a
            // truncated write, an edit) is not a mark to trust.
            Ok(text) => match self.parse(&text) {
                Ok((mark, recorded)) => {
                    let recorded = recorded.unwrap_or(IdSpace::of_0_2_0(self.space.epoch_unix_ms));
                    if recorded != self.space {
                        return Err(SnowflakeError::OtherIdSpace { location: self.location(), recorded, configured: self.space });
                    }
                    Ok(Some(mark))
                }
                Err(why) => Err(SnowflakeError::DamagedMark { location: self.location(), why: format!("it holds {text:?}: {why}") }),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(SnowflakeError::MarkStore(format!("cannot read {}: {e}", self.path.display()))),
        }
    }

    fn location(&self) -> String {
        format!("file {:?} in the data directory", self.path.display().to_string())
    }

    fn save(&self, reserved_until_unix_ms: i64) -> Result<(), String> {
        let IdSpace { epoch_unix_ms, machine_bits } = self.space;
        write_atomically(self.path, &format!("{reserved_until_unix_ms} epoch_ms={epoch_unix_ms} machine_bits={machine_bits}\n"))
    }
}

/// `text` as the whole of the file at `path`: written to a temporary file,
/// flushed, renamed over the old one and the directory flushed, so a crash
/// leaves the old or the new file.
pub fn write_atomically(path: &std::path::Path, text: &str) -> Result<(), String> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let fail = |what: &str, e: std::io::Error| format!("cannot {what} {}: {e}", tmp.display());
    let mut file = std::fs::File::create(&tmp).map_err(|e| fail("create", e))?;
    file.write_all(text.as_bytes()).map_err(|e| fail("write", e))?;
    file.sync_all().map_err(|e| fail("flush", e))?;
    std::fs::rename(&tmp, path).map_err(|e| fail("rename", e))?;
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| fail("flush the directory of", e))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::cell::Cell;

    pub(crate) const EPOCH: i64 = 1_767_225_600_000; // 2026-01-01 UTC
    const L: Layout = Layout::DEFAULT;

    /// A clock that only moves when told to, and counts the pauses asked of it.
    pub(crate) struct FakeClock {
        pub(crate) now: Cell<i64>,
        pub(crate) paused_ms: Cell<u64>,
    }

    impl FakeClock {
        pub(crate) fn at(since_epoch_ms: i64) -> Self {
            FakeClock { now: Cell::new(EPOCH + since_epoch_ms), paused_ms: Cell::new(0) }
        }
        pub(crate) fn set(&self, since_epoch_ms: i64) {
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

    /// A durable mark kept in memory, counting its writes.
    #[derive(Default)]
    pub(crate) struct MemStore {
        pub(crate) mark: Cell<Option<i64>>,
        pub(crate) saves: Cell<u32>,
        pub(crate) fail: Cell<bool>,
    }

    impl MarkStore for MemStore {
        fn load(&self) -> Result<Option<i64>, SnowflakeError> {
            Ok(self.mark.get())
        }
        fn location(&self) -> String {
            "in memory".into()
        }
        fn save(&self, until: i64) -> Result<(), String> {
            if self.fail.get() {
                return Err("disk full".into());
            }
            self.saves.set(self.saves.get() + 1);
            self.mark.set(Some(until));
            Ok(())
        }
    }

    thread_local! {
        static STORE: MemStore = MemStore::default();
    }

    fn gen(state: &SharedState, clock: &FakeClock) -> Result<i64, SnowflakeError> {
        STORE.with(|store| next_id(state, clock, store, EPOCH, L, 7, i64::MAX))
    }

    #[test]
    fn spec_worked_example() {
        let id = L.compose(Parts { millis: 24_000_000_000, machine_id: 7, sequence: 3 });
        assert_eq!(id, 24_000_000_000i64 * (1 << 22) + 7 * (1 << 12) + 3);
        assert_eq!(L.decompose(id), Ok(Parts { millis: 24_000_000_000, machine_id: 7, sequence: 3 }));
    }

    #[test]
    fn decompose_inverts_compose_at_the_edges() {
        for parts in [
            Parts { millis: 0, machine_id: 0, sequence: 0 },
            Parts { millis: MAX_TIMESTAMP_MS, machine_id: L.max_machine_id(), sequence: L.max_sequence() },
            Parts { millis: 1, machine_id: 1023, sequence: 0 },
            Parts { millis: 123_456_789, machine_id: 512, sequence: 4095 },
        ] {
            let id = L.compose(parts);
            assert!(id >= 0, "sign bit must stay 0 for {parts:?}");
            assert_eq!(L.decompose(id), Ok(parts));
        }
        assert_eq!(L.compose(Parts { millis: MAX_TIMESTAMP_MS, machine_id: L.max_machine_id(), sequence: L.max_sequence() }), i64::MAX);
        assert_eq!(L.decompose(-1), Err(SnowflakeError::NegativeId(-1)));
    }

    #[test]
    fn the_id_range_of_a_millisecond_spans_every_machine_and_sequence() {
        let (min, max) = id_range_of_millisecond(EPOCH + 24_000_000_000, EPOCH).unwrap();
        assert_eq!(min, 24_000_000_000i64 << 22);
        assert_eq!(max, (24_000_000_000i64 << 22) | (1023 << 12) | 4095);
        assert_eq!(max + 1, (24_000_000_001i64 << 22), "ranges of consecutive milliseconds touch");
        assert_eq!(id_range_of_millisecond(EPOCH, EPOCH).unwrap().0, 0);
        assert_eq!(id_range_of_millisecond(EPOCH + MAX_TIMESTAMP_MS as i64, EPOCH).unwrap().1, i64::MAX);
        for outside in [EPOCH - 1, EPOCH + MAX_TIMESTAMP_MS as i64 + 1, i64::MIN] {
            assert!(matches!(id_range_of_millisecond(outside, EPOCH), Err(SnowflakeError::TimeOutOfRange { .. })), "{outside}");
        }
    }

    #[test]
    fn a_raised_mark_puts_every_later_id_after_it_and_survives_a_restart() {
        let store = MemStore::default();
        let state = SharedState::default();
        let clock = FakeClock::at(5_000);
        assert!(!has_mark(&state), "a new server has no mark");
        // The lost mark lay at 600 s (a clock that ran ahead): vouched for.
        assert_eq!(raise_mark(&state, &clock, &store, EPOCH, 600_000), Ok(600_000 + RESERVE_AHEAD_MS));
        assert!(has_mark(&state));
        assert_eq!(store.mark.get(), Some(EPOCH + 600_000 + RESERVE_AHEAD_MS as i64));
        assert_eq!(load_mark(&state, &clock, &store, EPOCH), Ok(Some(600_000)), "layouts on this mark start above it");
        // The clock is behind the vouched mark: refused, nothing issued.
        assert!(matches!(next_id(&state, &clock, &store, EPOCH, L, 7, i64::MAX), Err(SnowflakeError::ClockBehind { .. })));
        clock.set(600_001);
        let id = next_id(&state, &clock, &store, EPOCH, L, 7, i64::MAX).unwrap();
        assert!(L.decompose(id).unwrap().millis > 600_000);
        // A lower word lowers nothing; a restart loads the written mark.
        let saves = store.saves.get();
        assert_eq!(raise_mark(&state, &clock, &store, EPOCH, 1_000), Ok(600_000 + RESERVE_AHEAD_MS));
        assert_eq!((store.mark.get(), store.saves.get()), (Some(EPOCH + 600_000 + RESERVE_AHEAD_MS as i64), saves));
        let restarted = SharedState::default();
        clock.set(602_000);
        let id = next_id(&restarted, &clock, &store, EPOCH, L, 7, i64::MAX).unwrap();
        assert!(L.decompose(id).unwrap().millis > 600_000 + RESERVE_AHEAD_MS);
        // A failed write raises nothing.
        let failing = MemStore::default();
        failing.fail.set(true);
        let other = SharedState::default();
        assert!(raise_mark(&other, &clock, &failing, EPOCH, 700_000).is_err());
        assert!(!has_mark(&other));
        assert_eq!(other.last_millis(), None);
    }

    #[test]
    fn waits_are_counted_by_cause() {
        let state = SharedState::default();
        let clock = FakeClock::at(5000);
        for _ in 0..4097 {
            gen(&state, &clock).unwrap();
        }
        clock.set(5001 - 10);
        gen(&state, &clock).unwrap();
        let a = state.activity();
        assert_eq!((a.waits_full_millisecond, a.waits_clock_back), (1, 1));
        assert_eq!(a.last_millis, Some(5001));
        state.reset_counters();
        assert_eq!(state.activity().waits_full_millisecond, 0);
    }

    #[test]
    fn machine_id_range() {
        assert_eq!(L.check_machine_id(0), Ok(0));
        assert_eq!(L.check_machine_id(1023), Ok(1023));
        assert_eq!(L.check_machine_id(1024), Err(SnowflakeError::MachineOutOfRange { id: 1024, max: 1023 }));
        assert_eq!(L.check_machine_id(-1), Err(SnowflakeError::MachineOutOfRange { id: -1, max: 1023 }));
    }

    #[test]
    fn a_layout_splits_the_22_low_bits_between_10_to_16_machine_bits_and_the_sequence() {
        for bits in [10, 12, 14, 16] {
            let layout = Layout::new(bits).unwrap();
            assert_eq!(layout.machine_bits() + layout.sequence_bits(), LOW_BITS);
            assert_eq!(u32::from(layout.max_machine_id()) + 1, 1 << bits);
            assert_eq!(u32::from(layout.max_sequence()) + 1, 1 << (22 - bits));
            let top = Parts { millis: MAX_TIMESTAMP_MS, machine_id: layout.max_machine_id(), sequence: layout.max_sequence() };
            assert_eq!(layout.compose(top), i64::MAX, "{bits}: every bit used, the sign bit clear");
            let parts = Parts { millis: 123_456_789, machine_id: layout.max_machine_id() / 3, sequence: layout.max_sequence() / 5 };
            assert_eq!(layout.decompose(layout.compose(parts)), Ok(parts), "{bits}");
            let (min, max) = id_range_of_millisecond(EPOCH + 123_456_789, EPOCH).unwrap();
            assert_eq!((layout.decompose(min).unwrap().millis, layout.decompose(max).unwrap().millis), (123_456_789, 123_456_789));
            assert_eq!(
                (layout.compose(Parts { millis: 123_456_789, machine_id: 0, sequence: 0 }), layout.compose(Parts { sequence: layout.max_sequence(), machine_id: layout.max_machine_id(), ..parts })),
                (min, max),
                "{bits}: the range of a millisecond is its first and last ID in every layout"
            );
            let max = i64::from(layout.max_machine_id());
            assert_eq!(layout.check_machine_id(max), Ok(max as u16));
            assert_eq!(layout.check_machine_id(max + 1), Err(SnowflakeError::MachineOutOfRange { id: max + 1, max: max as u16 }));
        }
        for bits in [-1, 0, 6, 9, 17, 22, i64::MAX] {
            assert_eq!(Layout::new(bits), Err(SnowflakeError::MachineBitsOutOfRange(bits)));
        }
        assert_eq!(Layout::default(), Layout::new(10).unwrap());
        // The same ID reads as another machine in another layout.
        let twelve = Layout::new(12).unwrap();
        let id = L.compose(Parts { millis: 5, machine_id: 1, sequence: 0 });
        assert_eq!(twelve.decompose(id).unwrap(), Parts { millis: 5, machine_id: 4, sequence: 0 });
    }

    #[test]
    fn a_layout_with_12_machine_bits_issues_1024_ids_a_millisecond_then_waits() {
        let twelve = Layout::new(12).unwrap();
        let (state, clock) = (SharedState::default(), FakeClock::at(5_000));
        let mut last = -1;
        for sequence in 0..1024 {
            let id = STORE.with(|store| next_id(&state, &clock, store, EPOCH, twelve, 4_095, i64::MAX)).unwrap();
            assert!(id > last);
            assert_eq!(twelve.decompose(id).unwrap(), Parts { millis: 5_000, machine_id: 4_095, sequence });
            last = id;
        }
        assert_eq!(clock.paused_ms.get(), 0);
        let next = STORE.with(|store| next_id(&state, &clock, store, EPOCH, twelve, 4_095, i64::MAX)).unwrap();
        assert_eq!(twelve.decompose(next).unwrap(), Parts { millis: 5_001, machine_id: 4_095, sequence: 0 });
        assert!(clock.paused_ms.get() >= 1, "the 1 025th waited for the next millisecond");
        assert_eq!(state.activity().waits_full_millisecond, 1);
    }

    #[test]
    fn same_millisecond_counts_the_sequence() {
        let state = SharedState::default();
        let clock = FakeClock::at(1000);
        let ids: Vec<i64> = (0..5).map(|_| gen(&state, &clock).unwrap()).collect();
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(L.decompose(*id).unwrap(), Parts { millis: 1000, machine_id: 7, sequence: i as u16 });
        }
        assert_eq!(clock.paused_ms.get(), 0);
    }

    #[test]
    fn a_new_millisecond_restarts_the_sequence() {
        let state = SharedState::default();
        let clock = FakeClock::at(1000);
        gen(&state, &clock).unwrap();
        gen(&state, &clock).unwrap();
        clock.set(1001);
        let id = gen(&state, &clock).unwrap();
        assert_eq!(L.decompose(id).unwrap(), Parts { millis: 1001, machine_id: 7, sequence: 0 });
    }

    #[test]
    fn the_4097th_id_in_a_millisecond_waits_for_the_next() {
        let state = SharedState::default();
        let clock = FakeClock::at(5000);
        let mut last = -1;
        for _ in 0..4096 {
            let id = gen(&state, &clock).unwrap();
            assert!(id > last);
            last = id;
        }
        assert_eq!(L.decompose(last).unwrap().sequence, L.max_sequence());
        assert_eq!(clock.paused_ms.get(), 0, "4096 IDs fit in one millisecond");
        let next = gen(&state, &clock).unwrap();
        assert_eq!(clock.paused_ms.get(), 1);
        assert_eq!(L.decompose(next).unwrap(), Parts { millis: 5001, machine_id: 7, sequence: 0 });
        assert!(next > last);
    }

    #[test]
    fn clock_back_up_to_10ms_is_waited_out() {
        let state = SharedState::default();
        let clock = FakeClock::at(10_000);
        let before = gen(&state, &clock).unwrap();
        clock.set(10_000 - 10);
        let after = gen(&state, &clock).unwrap();
        assert_eq!(clock.paused_ms.get(), 10, "waited until the clock caught up");
        assert!(after > before);
        assert_eq!(L.decompose(after).unwrap(), Parts { millis: 10_000, machine_id: 7, sequence: 1 });
    }

    #[test]
    fn clock_back_more_than_10ms_is_refused_and_says_by_how_much() {
        let state = SharedState::default();
        let clock = FakeClock::at(10_000);
        gen(&state, &clock).unwrap();
        let saved = state.last_state();
        clock.set(10_000 - 11);
        let err = gen(&state, &clock).unwrap_err();
        assert_eq!(err, SnowflakeError::ClockBehind { behind_ms: 11, allowed_ms: 10 });
        assert!(err.to_string().contains("11 ms"), "{err}");
        assert_eq!(state.last_state(), saved, "a refusal changes nothing");
        assert_eq!(clock.paused_ms.get(), 0);
        clock.set(10_001);
        assert!(gen(&state, &clock).is_ok(), "recovers once the clock is past the last ID");
    }

    /// Another backend issues an ID (at a later clock reading) right after
    /// this one read the clock, as when this one is descheduled.
    struct PreemptedClock<'a> {
        now: Cell<i64>,
        shared: &'a SharedState,
        preempted: Cell<bool>,
    }

    impl Clock for PreemptedClock<'_> {
        fn now_unix_ms(&self) -> i64 {
            let read = self.now.get();
            if !self.preempted.replace(true) {
                self.now.set(read + 34);
                self.shared.last.store(((read + 34 - EPOCH) as u64) << STATE_SHIFT, Ordering::SeqCst);
            }
            read
        }
        fn pause(&self, _millis: u64) {}
    }

    #[test]
    fn a_backend_paused_between_clock_and_state_is_not_refused() {
        let state = SharedState::default();
        let clock = PreemptedClock { now: Cell::new(EPOCH + 1_000), shared: &state, preempted: Cell::new(false) };
        let id = STORE.with(|store| next_id(&state, &clock, store, EPOCH, L, 7, i64::MAX)).expect("a paused backend is not a clock going back");
        assert_eq!(L.decompose(id).unwrap(), Parts { millis: 1_034, machine_id: 7, sequence: 1 });
    }

    #[test]
    fn the_durable_mark_is_renewed_at_half_the_reservation() {
        let state = SharedState::default();
        let clock = FakeClock::at(1_000);
        let store = MemStore::default();
        let mut last = 0;
        for ms in (1_000..6_000).step_by(7) {
            clock.set(ms);
            let id = next_id(&state, &clock, &store, EPOCH, L, 7, i64::MAX).unwrap();
            assert!(id > last);
            last = id;
            let mark = store.mark.get().unwrap() - EPOCH;
            assert!(mark > ms + RENEW_WITHIN_MS as i64 - 7, "the mark ({mark}) stays about half a reservation ahead of {ms}");
        }
        // One write at the start, then one per ~500 ms of IDs.
        assert_eq!(store.saves.get(), 10, "5 s of IDs write the mark 10 times");
        assert_eq!(clock.paused_ms.get(), 0, "nobody waited");
    }

    #[test]
    fn while_another_backend_writes_the_mark_callers_keep_issuing_from_the_reservation() {
        let state = SharedState::default();
        let clock = FakeClock::at(1_000);
        let store = MemStore::default();
        next_id(&state, &clock, &store, EPOCH, L, 7, i64::MAX).unwrap(); // reserves up to 2 000
        state.busy.store(true, Ordering::Release); // a writer is in its fsync
        for ms in [1_600, 1_800, 2_000] {
            clock.set(ms);
            let id = next_id(&state, &clock, &store, EPOCH, L, 7, i64::MAX).unwrap();
            assert_eq!(L.decompose(id).unwrap().millis, ms as u64);
        }
        assert_eq!(store.saves.get(), 1, "the early renewal only tries the lock");
        assert_eq!(clock.paused_ms.get(), 0, "nobody waited for the writer");
    }

    #[test]
    fn a_caller_past_the_reservation_waits_for_a_stalled_writer_only_so_long() {
        let state = SharedState::default();
        let clock = FakeClock::at(1_000);
        let store = MemStore::default();
        next_id(&state, &clock, &store, EPOCH, L, 7, i64::MAX).unwrap();
        let before = state.last_state();
        state.busy.store(true, Ordering::Release); // a writer stalled on storage
        clock.set(2_001);
        let err = next_id(&state, &clock, &store, EPOCH, L, 7, i64::MAX).unwrap_err();
        assert_eq!(err, SnowflakeError::MarkBusy { waited_ms: MARK_WAIT_LIMIT_MS });
        assert_eq!(clock.paused_ms.get(), MARK_WAIT_LIMIT_MS, "waited in pauses (each one checks for interrupts)");
        assert_eq!(state.last_state(), before, "nothing issued past the mark");
        state.busy.store(false, Ordering::Release);
        assert!(next_id(&state, &clock, &store, EPOCH, L, 7, i64::MAX).is_ok(), "the writer done, issuing resumes");
    }

    #[test]
    fn a_mark_that_is_not_a_possible_timestamp_is_damaged_not_clamped() {
        for (mark, what) in [(i64::MIN, "not a time"), (EPOCH + MAX_TIMESTAMP_MS as i64 + 1, "past the last millisecond")] {
            let store = MemStore::default();
            store.mark.set(Some(mark));
            let err = next_id(&SharedState::default(), &FakeClock::at(1_000), &store, EPOCH, L, 7, i64::MAX).unwrap_err();
            assert!(matches!(&err, SnowflakeError::DamagedMark { why, .. } if why.contains(what)), "{err}");
        }
        // A mark from before a later-moved epoch holds nothing back.
        let store = MemStore::default();
        store.mark.set(Some(EPOCH - 5_000));
        assert!(next_id(&SharedState::default(), &FakeClock::at(1_000), &store, EPOCH, L, 7, i64::MAX).is_ok());
    }

    /// A server restarted (fresh shared state) over the mark a previous one left.
    fn restarted_at(since_epoch_ms: i64, mark_since_epoch_ms: i64) -> (SharedState, FakeClock, MemStore) {
        let store = MemStore::default();
        store.mark.set(Some(EPOCH + mark_since_epoch_ms));
        (SharedState::default(), FakeClock::at(since_epoch_ms), store)
    }

    #[test]
    fn after_a_restart_ids_start_above_the_mark() {
        let (state, clock, store) = restarted_at(20_000, 20_000);
        let id = next_id(&state, &clock, &store, EPOCH, L, 7, i64::MAX).unwrap();
        assert_eq!(L.decompose(id).unwrap().millis, 20_001, "never at the reserved millisecond itself");
    }

    #[test]
    fn after_a_restart_a_clock_behind_the_mark_within_the_reservation_waits() {
        let (state, clock, store) = restarted_at(20_000 - 600, 20_000);
        let id = next_id(&state, &clock, &store, EPOCH, L, 7, i64::MAX).unwrap();
        assert_eq!(L.decompose(id).unwrap().millis, 20_001);
        assert_eq!(clock.paused_ms.get(), 601);
    }

    #[test]
    fn after_a_restart_a_clock_far_behind_the_mark_is_refused() {
        let (state, clock, store) = restarted_at(400_000 - 300_000, 400_000);
        let err = next_id(&state, &clock, &store, EPOCH, L, 7, i64::MAX).unwrap_err();
        assert_eq!(err, SnowflakeError::ClockBehind { behind_ms: 300_000, allowed_ms: RESERVE_AHEAD_MS + MAX_BACKWARD_WAIT_MS });
        assert!(err.to_string().contains("5 min behind"), "{err}");
        assert_eq!(clock.paused_ms.get(), 0);
    }

    #[test]
    fn once_an_id_is_issued_after_a_restart_the_10ms_rule_applies_again() {
        let (state, clock, store) = restarted_at(20_100, 20_000);
        next_id(&state, &clock, &store, EPOCH, L, 7, i64::MAX).unwrap();
        clock.set(20_100 - 50);
        assert_eq!(
            next_id(&state, &clock, &store, EPOCH, L, 7, i64::MAX),
            Err(SnowflakeError::ClockBehind { behind_ms: 50, allowed_ms: 10 })
        );
    }

    #[test]
    fn a_mark_that_cannot_be_written_issues_nothing() {
        let state = SharedState::default();
        let clock = FakeClock::at(1_000);
        let store = MemStore::default();
        store.fail.set(true);
        assert!(matches!(next_id(&state, &clock, &store, EPOCH, L, 7, i64::MAX), Err(SnowflakeError::MarkStore(_))));
        assert_eq!(state.last_state(), 0);
        store.fail.set(false);
        assert!(next_id(&state, &clock, &store, EPOCH, L, 7, i64::MAX).is_ok());
    }

    #[test]
    fn the_file_mark_survives_a_reopen_and_rejects_garbage() {
        let dir = std::env::temp_dir().join(format!("ticket-core-mark-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("mark");
        let space = IdSpace::new(EPOCH, L);
        let store = FileMarkStore { path: &path, space };
        assert_eq!(store.load(), Ok(None));
        store.save(1_767_225_600_123).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), format!("1767225600123 epoch_ms={EPOCH} machine_bits=10\n"));
        assert_eq!(FileMarkStore { path: &path, space }.load(), Ok(Some(1_767_225_600_123)));
        // A mark of 0.2.0 records no space: the epoch configured, in 0.2.0's
        // one layout — a server set for another layout refuses it.
        std::fs::write(&path, "1767225600124\n").unwrap();
        assert_eq!(store.load(), Ok(Some(1_767_225_600_124)));
        let wider = IdSpace::new(EPOCH, Layout::new(12).unwrap());
        assert_eq!(
            FileMarkStore { path: &path, space: wider }.load(),
            Err(SnowflakeError::OtherIdSpace { location: store.location(), recorded: space, configured: wider })
        );
        for damaged in ["garbage\n", "1767225600123", "17672256\n0\n", "", "1 epoch_ms=5\n", "1 epoch_ms=x machine_bits=10\n", "1 other=2\n"] {
            std::fs::write(&path, damaged).unwrap();
            let err = store.load().unwrap_err();
            assert!(
                matches!(&err, SnowflakeError::DamagedMark { location, .. } if location.contains("mark")),
                "{damaged:?}: {err}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_timestamp_past_the_lease_cap_is_refused_before_it_enters_the_state_or_the_mark() {
        let (state, store) = (SharedState::default(), MemStore::default());
        let clock = FakeClock::at(1_000);
        let cap = EPOCH + 5_000;
        let first = next_id(&state, &clock, &store, EPOCH, L, 7, cap).unwrap();
        let mark = store.mark.get();
        clock.set(3_600_000); // the wall clock stepped an hour forward
        assert_eq!(next_id(&state, &clock, &store, EPOCH, L, 7, cap), Err(SnowflakeError::PastLease { stamp_cap_unix_ms: cap }));
        assert_eq!(state.last_millis(), Some(1_000), "the stepped clock left no trace in the state");
        assert_eq!(store.mark.get(), mark, "nor in the mark");
        clock.set(1_001); // stepped back: stamps go on
        assert!(next_id(&state, &clock, &store, EPOCH, L, 7, cap).unwrap() > first);
    }

    #[test]
    fn a_mark_of_another_id_space_is_refused_saying_both() {
        let dir = std::env::temp_dir().join(format!("ticket-core-space-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("mark");
        FileMarkStore { path: &path, space: IdSpace::new(EPOCH, L) }.save(EPOCH + 5_000).unwrap();
        let later = IdSpace::new(EPOCH + 151 * 86_400_000, L);
        let err = FileMarkStore { path: &path, space: later }.load().unwrap_err();
        assert_eq!(err, SnowflakeError::OtherIdSpace { location: FileMarkStore { path: &path, space: later }.location(), recorded: IdSpace::new(EPOCH, L), configured: later });
        let text = err.to_string();
        assert!(text.contains("epoch 2026-01-01 00:00:00 UTC") && text.contains("epoch 2026-06-01 00:00:00 UTC"), "{text}");
        // And the generator refuses to issue from it.
        let state = SharedState::default();
        let clock = FakeClock::at(200 * 86_400_000);
        assert!(matches!(next_id(&state, &clock, &FileMarkStore { path: &path, space: later }, later.epoch_unix_ms, L, 7, i64::MAX), Err(SnowflakeError::OtherIdSpace { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn clock_before_epoch_or_past_41_bits_is_refused() {
        let state = SharedState::default();
        assert!(matches!(gen(&state, &FakeClock::at(-1)), Err(SnowflakeError::BeforeEpoch { .. })));
        let late = FakeClock::at(MAX_TIMESTAMP_MS as i64 + 1);
        assert_eq!(gen(&state, &late), Err(SnowflakeError::TimestampExhausted));
    }

    struct NoStore;
    impl MarkStore for NoStore {
        fn load(&self) -> Result<Option<i64>, SnowflakeError> {
            Ok(None)
        }
        fn location(&self) -> String {
            "nowhere".into()
        }
        fn save(&self, _: i64) -> Result<(), String> {
            panic!("a generator starting after a floor writes no mark")
        }
    }

    #[test]
    fn a_generator_starting_after_a_floor_stamps_above_it_and_waits_at_most_10ms() {
        let floor = EPOCH + 50_000;
        let state = SharedState::starting_after(floor, EPOCH);
        let ahead = FakeClock::at(50_001);
        let id = next_id(&state, &ahead, &NoStore, EPOCH, L, 7, i64::MAX).unwrap();
        assert_eq!(L.decompose(id).unwrap().millis, 50_001);

        let state = SharedState::starting_after(floor, EPOCH);
        let slightly_behind = FakeClock::at(49_995);
        let id = next_id(&state, &slightly_behind, &NoStore, EPOCH, L, 7, i64::MAX).unwrap();
        assert_eq!(L.decompose(id).unwrap().millis, 50_001, "never at the floor itself");

        let state = SharedState::starting_after(floor, EPOCH);
        assert_eq!(
            next_id(&state, &FakeClock::at(49_000), &NoStore, EPOCH, L, 7, i64::MAX),
            Err(SnowflakeError::ClockBehind { behind_ms: 1_000, allowed_ms: MAX_BACKWARD_WAIT_MS })
        );
        // A floor before the epoch (an id never leased: 0) holds nothing back.
        let state = SharedState::starting_after(0, EPOCH);
        assert_eq!(L.decompose(next_id(&state, &FakeClock::at(5), &NoStore, EPOCH, L, 7, i64::MAX).unwrap()).unwrap().millis, 5);
    }

    #[test]
    fn a_raised_floor_holds_later_ids_above_it() {
        let state = SharedState::starting_after(0, EPOCH);
        let clock = FakeClock::at(1_000);
        next_id(&state, &clock, &NoStore, EPOCH, L, 1, i64::MAX).unwrap();
        state.raise_floor(EPOCH + 1_005, EPOCH);
        let id = next_id(&state, &clock, &NoStore, EPOCH, L, 2, i64::MAX).unwrap();
        assert_eq!(L.decompose(id).unwrap().millis, 1_006, "waited out 5 ms to pass the floor");
        state.raise_floor(EPOCH + 10, EPOCH);
        assert_eq!(L.decompose(next_id(&state, &clock, &NoStore, EPOCH, L, 2, i64::MAX).unwrap()).unwrap().millis, 1_006, "a lower floor changes nothing");
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
        let state = SharedState::starting_after(0, EPOCH);
        let per_thread: Vec<Vec<i64>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..20_000).map(|_| next_id(&state, &SystemClock, &NoStore, EPOCH, L, 1, i64::MAX).unwrap()).collect::<Vec<_>>()))
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

    /// #36 item 4: a full millisecond is waited out with one wait until the
    /// next one begins (the real clocks sleep through it), never a pause
    /// per retry.
    #[test]
    fn a_full_millisecond_is_waited_out_until_the_next_one_begins() {
        struct Recording {
            now: std::cell::Cell<i64>,
            waited_until: std::cell::RefCell<Vec<i64>>,
        }
        impl Clock for Recording {
            fn now_unix_ms(&self) -> i64 {
                self.now.get()
            }
            fn pause(&self, millis: u64) {
                panic!("the generator paused {millis} ms instead of waiting for a millisecond to begin");
            }
            fn pause_until(&self, unix_ms: i64, at_most_ms: u64) {
                assert_eq!(at_most_ms, (unix_ms - self.now.get()) as u64, "bounded by the generator's own reading");
                self.waited_until.borrow_mut().push(unix_ms);
                self.now.set(unix_ms);
            }
        }
        let layout = Layout::new(16).unwrap();
        let per_ms = 1 << (22 - 16);
        let clock = Recording { now: std::cell::Cell::new(EPOCH + 2_000), waited_until: Default::default() };
        let state = SharedState::starting_after(0, EPOCH);
        let ids: Vec<i64> = (0..per_ms * 3).map(|_| next_id(&state, &clock, &NoStore, EPOCH, layout, 9, i64::MAX).unwrap()).collect();
        assert_eq!(*clock.waited_until.borrow(), vec![EPOCH + 2_001, EPOCH + 2_002], "one wait per full millisecond, until the next one's start");
        assert!(ids.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(layout.decompose(ids[per_ms]).unwrap().millis, 2_001);
    }

    #[test]
    fn sleeping_until_a_millisecond_returns_once_it_has_begun_and_not_before() {
        let target = (wall_ns() / 1_000_000) as i64 + 3;
        let mut turns = 0;
        sleep_until_unix_ms(target, 10, || turns += 1);
        assert!(wall_ns() >= i128::from(target) * 1_000_000, "returned before the millisecond began");
        assert!(turns >= 1, "each sleep or yield runs the caller's turn (the server's interrupt check)");
        let mut past_turns = 0;
        sleep_until_unix_ms(target - 10, 10, || past_turns += 1);
        assert_eq!(past_turns, 0, "a millisecond already begun is not waited for");
        // A target far ahead of the caller's own reading (a wall clock
        // stepped back after it) is waited for no longer than the bound.
        let started = std::time::Instant::now();
        sleep_until_unix_ms(target + 3_600_000, 2, || ());
        assert!(started.elapsed() < std::time::Duration::from_millis(1_000), "the bound held: {:?}", started.elapsed());
    }
}
