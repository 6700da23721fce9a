//! Sharded IDs (SPEC §15, Instagram's layout): `0 | 41 bits ms since the
//! epoch | 12 bits shard | 10 bits sequence`, the sequence per shard and
//! millisecond (1 024), so the server that owns a logical shard numbers its
//! rows in time order with no coordination, and the shard is read back from
//! the ID.
//!
//! Each shard's state is one `u64`, `(ms << 10) | sequence`, advanced by
//! compare-and-swap like the snowflake generator's: shards share no lock
//! and no cache line. They share the snowflake generator's clock rules (a
//! step back of up to 10 ms is waited out, more refused) and its durable
//! mark (`snowflake::cover`, written to WAL before use): after a restart, a
//! crash or a failover every shard starts above the mark.
//!
//! Ownership is durable, not only a setting: a server issues a shard only
//! if its configuration lists it *and* its shard book (a `ShardBook`: a
//! file carried in WAL, so standbys have it) records the shard as accepted
//! there — a new shard with `accept(shard, 0)`, a moved one above its old
//! owner's handover point. `release` records the shard as released (closed
//! at once in memory: the swap that closes it is the one every issuer must
//! win, so its point is exact), and a released shard stays closed across
//! restarts and promotions until accepted again, whatever the
//! configuration says.
//!
//! Locking: per-shard atomics; the book is loaded and written under the
//! snowflake generator's writer flag (one writer of the durable files).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use thiserror::Error;

use crate::snowflake::{self, Busy, Clock, MarkStore, SharedState, SnowflakeError, Step, MAX_BACKWARD_WAIT_MS, MAX_TIMESTAMP_MS, RESERVE_AHEAD_MS};

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
    #[error("shard {0} was released from this server (pgticket.release_shard); it issues again only after pgticket.accept_shard()")]
    Released(u16),
    #[error("shard {0} is held: this server started from a base backup or a point-in-time recovery, so its shard book may be older than the shard's latest owner's. If another server issued shard {0} since, run pgticket.release_shard({0}) there and pgticket.accept_shard({0}, <the point it returns>) here; if none did, pgticket.accept_shard({0}, 0) resumes it here above what this server recorded")]
    Held(u16),
    #[error("shard {0} is in pg_ticket.shards but was never accepted here: run pgticket.accept_shard({0}, <its old owner's handover point>), or pgticket.accept_shard({0}, 0) for a shard no server issued before")]
    NotAccepted(u16),
    #[error("shard {0} is not one of this server's (pg_ticket.shards)")]
    NotListed(u16),
    #[error("shard {0} is still in pg_ticket.shards here: remove it and reload before releasing it")]
    StillListed(u16),
    #[error("{0}")]
    Book(String),
    #[error("the handover point of shard {shard} is {} ahead of this server's clock, more than {}: fix the clocks first", crate::epoch::format_duration_ms(*.ahead_ms as i64), crate::epoch::format_duration_ms(MAX_HANDOVER_AHEAD_MS as i64))]
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
/// `unix_ms`: the snowflake's, the time above the same 22 bits.
pub use crate::snowflake::id_range_of_millisecond;

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

/// What the shard book says of a shard: accepted here above a point, or
/// released here at one (points are states, `(ms << 10) | sequence`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    Accepted(u64),
    Released(u64),
    /// Accepted, but at a start that cannot prove the book is the latest
    /// (a base backup or a point-in-time recovery started in the server's
    /// place, SPEC §17.1): nothing is issued until it is accepted again.
    Held(u64),
}

impl Standing {
    /// The shard's point, whatever its standing.
    pub fn point(self) -> u64 {
        match self {
            Standing::Accepted(p) | Standing::Released(p) | Standing::Held(p) => p,
        }
    }
}

/// The standings that hold every accepted shard of a book (`Held` at its
/// point), for a start that cannot prove the book is its latest.
pub fn holds(entries: &[(u16, Standing)]) -> Vec<(u16, Standing)> {
    entries
        .iter()
        .filter_map(|&(shard, standing)| match standing {
            Standing::Accepted(p) => Some((shard, Standing::Held(p))),
            _ => None,
        })
        .collect()
}

/// The durable record of every shard's standing on this server: the
/// server's is a file written after a WAL record, so a standby replays it.
pub trait ShardBook {
    fn load(&self) -> Result<Vec<(u16, Standing)>, String>;
    /// Durable (and on the synchronous standbys) when it returns Ok.
    fn record(&self, shard: u16, standing: Standing) -> Result<(), String>;
}

/// The book as text: one `shard accepted|released point` line per shard.
pub fn format_book(entries: &[(u16, Standing)]) -> String {
    let mut text = String::new();
    for (shard, standing) in entries {
        let (word, point) = match standing {
            Standing::Accepted(p) => ("accepted", p),
            Standing::Released(p) => ("released", p),
            Standing::Held(p) => ("held", p),
        };
        text.push_str(&format!("{shard} {word} {point}\n"));
    }
    text
}

pub fn parse_book(text: &str) -> Result<Vec<(u16, Standing)>, String> {
    if !text.is_empty() && !text.ends_with('\n') {
        return Err("it does not end in a newline (a truncated write?)".into());
    }
    text.lines()
        .map(|line| {
            let words: Vec<&str> = line.split(' ').collect();
            let bad = || format!("{line:?} is not a shard's standing");
            let [shard, word, point] = words[..] else { return Err(bad()) };
            let shard = shard.parse::<u16>().ok().filter(|s| *s <= MAX_SHARD).ok_or_else(bad)?;
            let point = point.parse::<u64>().map_err(|_| bad())?;
            match word {
                "accepted" => Ok((shard, Standing::Accepted(point))),
                "released" => Ok((shard, Standing::Released(point))),
                "held" => Ok((shard, Standing::Held(point))),
                _ => Err(bad()),
            }
        })
        .collect()
}

/// The book as a file (the server's: each change under a WAL record).
pub struct BookFile<'a> {
    pub path: &'a std::path::Path,
}

impl BookFile<'_> {
    /// Every shard's standing (none: no file yet); a damaged file is an error.
    pub fn read(&self) -> Result<Vec<(u16, Standing)>, String> {
        match std::fs::read_to_string(self.path) {
            Ok(text) => parse_book(&text).map_err(|why| format!("{} is damaged: {why}", self.path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(format!("cannot read {}: {e}", self.path.display())),
        }
    }

    /// `shard`'s standing replaced, the whole file written anew atomically.
    pub fn set(&self, shard: u16, standing: Standing) -> Result<(), String> {
        self.write_with(self.read()?, shard, standing)
    }

    /// For WAL replay, where a record is the primary's word and must not
    /// stop recovery: a damaged file is moved aside (`.damaged`) and the
    /// book started anew with this record. Every shard it no longer names
    /// is refused until accepted again — the safe side. True if it was.
    pub fn set_replacing_damage(&self, shard: u16, standing: Standing) -> Result<bool, String> {
        match self.read() {
            Ok(entries) => self.write_with(entries, shard, standing).map(|()| false),
            Err(why) if why.contains("is damaged") => {
                let aside = self.path.with_extension("damaged");
                std::fs::rename(self.path, &aside).map_err(|e| format!("cannot move {} aside: {e}", self.path.display()))?;
                self.write_with(Vec::new(), shard, standing).map(|()| true)
            }
            Err(other) => Err(other),
        }
    }

    fn write_with(&self, entries: Vec<(u16, Standing)>, shard: u16, standing: Standing) -> Result<(), String> {
        let mut entries: Vec<_> = entries.into_iter().filter(|(s, _)| *s != shard).collect();
        entries.push((shard, standing));
        entries.sort_by_key(|(s, _)| *s);
        snowflake::write_atomically(self.path, &format_book(&entries))
    }
}

const ACCEPTED: u64 = 1 << 62;
const RELEASED: u64 = 1 << 63;
const HELD: u64 = ACCEPTED | RELEASED;
const POINT: u64 = ACCEPTED - 1;

fn pack(standing: Standing) -> u64 {
    match standing {
        Standing::Accepted(p) => ACCEPTED | (p & POINT),
        Standing::Released(p) => RELEASED | (p & POINT),
        Standing::Held(p) => HELD | (p & POINT),
    }
}

fn unpack(packed: u64) -> Option<Standing> {
    match packed & !POINT {
        ACCEPTED => Some(Standing::Accepted(packed & POINT)),
        RELEASED => Some(Standing::Released(packed & POINT)),
        HELD => Some(Standing::Held(packed & POINT)),
        _ => None,
    }
}

/// One shard: the state of its last ID (`CLOSED` once released) and its
/// standing as the book has it. Its own cache line.
#[derive(Default)]
#[repr(align(64))]
pub struct ShardState {
    last: AtomicU64,
    standing: AtomicU64,
}

/// Every shard of a server (in shared memory in the server).
pub struct ShardTable {
    loaded: AtomicBool,
    shards: [ShardState; MAX_SHARD as usize + 1],
}

impl Default for ShardTable {
    fn default() -> Self {
        ShardTable { loaded: AtomicBool::new(false), shards: std::array::from_fn(|_| ShardState::default()) }
    }
}

/// The state after the last sequence of `millis`.
fn after_millisecond(millis: u64) -> u64 {
    (millis << SEQUENCE_BITS) | u64::from(MAX_SEQUENCE)
}

fn id_of(state: u64, shard: u16) -> i64 {
    compose(ShardedParts { millis: state >> SEQUENCE_BITS, shard, sequence: (state & u64::from(MAX_SEQUENCE)) as u16 })
}

/// What a shard call needs of the server: the snowflake generator (clock
/// rules, mark, writer flag), its clock, mark store and epoch, and the book.
pub struct Server<'a, C: Clock, M: MarkStore, B: ShardBook> {
    pub generator: &'a SharedState,
    pub table: &'a ShardTable,
    pub clock: &'a C,
    pub mark: &'a M,
    pub book: &'a B,
    pub epoch_unix_ms: i64,
}

impl<C: Clock, M: MarkStore, B: ShardBook> Server<'_, C, M, B> {
    /// The book read into memory (once per start), and the mark's floor.
    fn ready(&self) -> Result<Option<u64>, ShardError> {
        let floor = snowflake::load_mark(self.generator, self.clock, self.mark, self.epoch_unix_ms)?.map(after_millisecond);
        if !self.table.loaded.load(Ordering::Acquire) {
            let _writer = Busy::acquire(self.generator.writer_flag(), self.clock)?;
            if !self.table.loaded.load(Ordering::Acquire) {
                for (shard, standing) in self.book.load().map_err(ShardError::Book)? {
                    self.table.shards[usize::from(shard)].standing.store(pack(standing), Ordering::Release);
                }
                self.table.loaded.store(true, Ordering::Release);
            }
        }
        Ok(floor)
    }

    /// The book read into memory now, if it was not (a vouch applies a
    /// restored start's holds at once: `WalShardBook::load`).
    pub fn load(&self) -> Result<(), ShardError> {
        self.ready().map(|_| ())
    }

    fn shard(&self, shard: u16) -> &ShardState {
        &self.table.shards[usize::from(shard)]
    }

    /// The next ID of `shard` (`listed`: in this server's configuration).
    pub fn next_id(&self, shard: u16, listed: bool) -> Result<i64, ShardError> {
        if !listed {
            return Err(ShardError::NotListed(shard));
        }
        let mark_floor = self.ready()?;
        let state = self.shard(shard);
        let accepted = match unpack(state.standing.load(Ordering::Acquire)) {
            Some(Standing::Accepted(point)) => point,
            Some(Standing::Released(_)) => return Err(ShardError::Released(shard)),
            Some(Standing::Held(_)) => return Err(ShardError::Held(shard)),
            None => return Err(ShardError::NotAccepted(shard)),
        };
        let floor = mark_floor.unwrap_or(0).max(accepted);
        loop {
            // The state before the clock, as the snowflake generator reads
            // them (a caller paused between the two must not see others'
            // IDs as a clock step back).
            let last = state.last.load(Ordering::Acquire);
            if last == CLOSED {
                return Err(ShardError::Released(shard));
            }
            if last < floor {
                // First use since the start or the acceptance: above both.
                let _ = state.last.compare_exchange(last, floor, Ordering::AcqRel, Ordering::Acquire);
                continue;
            }
            let now_unix_ms = self.clock.now_unix_ms();
            let since_epoch = now_unix_ms - self.epoch_unix_ms;
            if since_epoch < 0 {
                return Err(SnowflakeError::BeforeEpoch { now_ms: now_unix_ms, epoch_ms: self.epoch_unix_ms }.into());
            }
            let now_ms = since_epoch as u64;
            if now_ms > MAX_TIMESTAMP_MS {
                return Err(SnowflakeError::TimestampExhausted.into());
            }
            // At the floor (a start, an acceptance) the state may lie up to
            // the reservation ahead of the clock: wait rather than refuse.
            let max_wait_ms = if last == floor { RESERVE_AHEAD_MS + MAX_BACKWARD_WAIT_MS } else { MAX_BACKWARD_WAIT_MS };
            match snowflake::step_in(last, now_ms, max_wait_ms, SEQUENCE_BITS) {
                Step::Issue(next) => {
                    snowflake::cover(self.generator, self.clock, self.mark, self.epoch_unix_ms, next >> SEQUENCE_BITS)?;
                    if state.last.compare_exchange_weak(last, next, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                        return Ok(id_of(next, shard));
                    }
                }
                Step::WaitUntil(target_ms) => {
                    self.clock.pause_until(self.epoch_unix_ms.saturating_add(target_ms as i64), target_ms.saturating_sub(now_ms).max(1))
                }
                Step::Refuse { behind_ms } => return Err(SnowflakeError::ClockBehind { behind_ms, allowed_ms: max_wait_ms }.into()),
            }
        }
    }

    /// Close `shard` here for good (until accepted again) and return its
    /// handover point: an ID at or above every ID this server issued for it
    /// (since its last start, its durable mark stands for those before).
    /// Called again, it returns the same point (a lost answer is asked
    /// again) and records it again.
    pub fn release(&self, shard: u16, listed: bool) -> Result<i64, ShardError> {
        if listed {
            return Err(ShardError::StillListed(shard));
        }
        let mark_floor = self.ready()?;
        let _writer = Busy::acquire(self.generator.writer_flag(), self.clock)?;
        let state = self.shard(shard);
        let point = match unpack(state.standing.load(Ordering::Acquire)) {
            Some(Standing::Released(point)) => point,
            standing => {
                let last = state.last.swap(CLOSED, Ordering::AcqRel);
                let issued = if last == CLOSED { 0 } else { last };
                let accepted = standing.map_or(0, Standing::point);
                let point = issued.max(accepted).max(mark_floor.unwrap_or(0));
                // In memory first: a failed write below leaves the shard
                // closed, and a retry returns and records this same point.
                state.standing.store(pack(Standing::Released(point)), Ordering::Release);
                point
            }
        };
        self.book.record(shard, Standing::Released(point)).map_err(ShardError::Book)?;
        Ok(id_of(point, shard))
    }

    /// Take `shard` over above `handover_id` (its old owner's `release`, or
    /// 0 for a shard no server issued before): recorded in the book and
    /// covered by the durable mark, so neither a restart nor a promotion
    /// goes below it; never below what this server issued or released for
    /// it itself. First waits (through `Clock::sleep`, interruptible) until
    /// this server's clock has passed the point, at most
    /// `MAX_HANDOVER_AHEAD_MS`: only then is anything recorded or the
    /// shared mark moved, so a point ahead never holds the snowflake
    /// generator or another shard back, and a cancelled wait changes
    /// nothing (#31 item 7: 0.3.0 moved the mark ahead first, and after a
    /// cancel or a restart every snowflake and shard was refused until
    /// the point passed). A clock before the epoch is refused at once.
    pub fn accept(&self, shard: u16, listed: bool, handover_id: i64) -> Result<(), ShardError> {
        if !listed {
            return Err(ShardError::NotListed(shard));
        }
        let parts = decompose(handover_id)?;
        self.ready()?;
        let now_ms = self.now_ms()?;
        if parts.millis > now_ms + MAX_HANDOVER_AHEAD_MS {
            return Err(ShardError::HandoverAhead { shard, ahead_ms: parts.millis - now_ms });
        }
        self.wait_past(shard, parts.millis)?;
        // Covering may write the mark: before the writer flag is taken.
        // The point is behind the clock now, so the mark moves no further
        // than an issue of this millisecond would move it.
        snowflake::cover(self.generator, self.clock, self.mark, self.epoch_unix_ms, parts.millis)?;
        let point = {
            let _writer = Busy::acquire(self.generator.writer_flag(), self.clock)?;
            let state = self.shard(shard);
            let own = unpack(state.standing.load(Ordering::Acquire)).map_or(0, Standing::point);
            let last = state.last.load(Ordering::Acquire);
            let point = ((parts.millis << SEQUENCE_BITS) | u64::from(parts.sequence)).max(own).max(if last == CLOSED { 0 } else { last });
            // The point as raised may lie ahead (this server's own release,
            // under a clock set back since): refused, not waited.
            let now_ms = self.now_ms()?;
            if point >> SEQUENCE_BITS > now_ms + MAX_HANDOVER_AHEAD_MS {
                return Err(ShardError::HandoverAhead { shard, ahead_ms: (point >> SEQUENCE_BITS) - now_ms });
            }
            // In memory before the record: once the record is in WAL it
            // may take effect at a restart or on a standby whatever comes
            // next, so a failure below (a cancelled standby wait) leaves
            // it in effect here too, and says so; a retry records it again.
            state.standing.store(pack(Standing::Accepted(point)), Ordering::Release);
            let mut current = state.last.load(Ordering::Acquire);
            loop {
                let raised = if current == CLOSED { point } else { current.max(point) };
                match state.last.compare_exchange(current, raised, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => break,
                    Err(seen) => current = seen,
                }
            }
            self.book.record(shard, Standing::Accepted(point)).map_err(|e| {
                ShardError::Book(format!("{e}; shard {shard} is accepted here all the same (call pgticket.accept_shard again to record it)"))
            })?;
            point
        };
        // A point raised by this server's own earlier issues may still be
        // a little ahead: the shard's first ID comes once the clock passes.
        self.wait_past(shard, point >> SEQUENCE_BITS)
    }

    /// The clock, ms since the epoch (before it: refused).
    fn now_ms(&self) -> Result<u64, ShardError> {
        let now_unix_ms = self.clock.now_unix_ms();
        if now_unix_ms < self.epoch_unix_ms {
            return Err(SnowflakeError::BeforeEpoch { now_ms: now_unix_ms, epoch_ms: self.epoch_unix_ms }.into());
        }
        Ok((now_unix_ms - self.epoch_unix_ms) as u64)
    }

    /// Waits until the clock is past `millis`: at most
    /// `MAX_HANDOVER_AHEAD_MS` (a clock set back meanwhile is refused).
    fn wait_past(&self, shard: u16, millis: u64) -> Result<(), ShardError> {
        let mut waited_ms = 0;
        loop {
            let now_ms = self.now_ms()?;
            if now_ms > millis {
                return Ok(());
            }
            if waited_ms > MAX_HANDOVER_AHEAD_MS {
                return Err(ShardError::HandoverAhead { shard, ahead_ms: millis + 1 - now_ms });
            }
            let pause = (millis + 1 - now_ms).min(10);
            self.clock.sleep(pause);
            waited_ms += pause;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snowflake::tests::{FakeClock, MemStore, EPOCH};
    use std::cell::RefCell;

    /// A book kept in memory, as a file would keep it (text round trip).
    #[derive(Default)]
    struct MemBook {
        text: RefCell<String>,
        fail: std::cell::Cell<bool>,
    }

    impl ShardBook for MemBook {
        fn load(&self) -> Result<Vec<(u16, Standing)>, String> {
            parse_book(&self.text.borrow())
        }
        fn record(&self, shard: u16, standing: Standing) -> Result<(), String> {
            if self.fail.get() {
                return Err("disk full".into());
            }
            let mut entries: Vec<_> = self.load()?.into_iter().filter(|(s, _)| *s != shard).collect();
            entries.push((shard, standing));
            entries.sort_by_key(|(s, _)| *s);
            *self.text.borrow_mut() = format_book(&entries);
            Ok(())
        }
    }

    /// One server: its generator, shards, clock, mark and book (a restart
    /// keeps the clock, mark and book and starts the rest anew).
    struct Node {
        generator: SharedState,
        // 256 kB: on the heap, not on a test thread's stack.
        table: Box<ShardTable>,
        clock: FakeClock,
        mark: MemStore,
        book: MemBook,
    }

    impl Node {
        fn at(ms: i64) -> Self {
            Node { generator: SharedState::default(), table: Box::default(), clock: FakeClock::at(ms), mark: MemStore::default(), book: MemBook::default() }
        }
        fn server(&self) -> Server<'_, FakeClock, MemStore, MemBook> {
            Server { generator: &self.generator, table: &self.table, clock: &self.clock, mark: &self.mark, book: &self.book, epoch_unix_ms: EPOCH }
        }
        fn restarted(self) -> Self {
            Node { generator: SharedState::default(), table: Box::default(), ..self }
        }
        fn ids(&self, shard: u16, n: usize) -> Vec<i64> {
            (0..n).map(|_| self.server().next_id(shard, true).unwrap()).collect()
        }
        fn new_shard(&self, shard: u16) {
            self.server().accept(shard, true, 0).unwrap();
        }
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
    fn a_shard_issues_only_when_listed_and_accepted() {
        let node = Node::at(100);
        assert_eq!(node.server().next_id(3, false), Err(ShardError::NotListed(3)));
        assert_eq!(node.server().next_id(3, true), Err(ShardError::NotAccepted(3)), "listed is not enough");
        assert_eq!(node.server().accept(3, false, 0), Err(ShardError::NotListed(3)));
        node.new_shard(3);
        assert!(node.server().next_id(3, true).is_ok());
        assert_eq!(node.server().next_id(3, false), Err(ShardError::NotListed(3)), "the configuration still counts");
    }

    #[test]
    fn a_held_shard_issues_nothing_until_accepted_again_and_resumes_above_its_own_ids() {
        let node = Node::at(100);
        node.new_shard(2);
        node.new_shard(5);
        let before = node.ids(2, 3);
        // A start that cannot prove its book is the latest holds what it
        // accepted (the caller rewrites the book; released shards stay).
        node.server().release(5, false).unwrap();
        let held = holds(&node.book.load().unwrap());
        assert!(matches!(held[..], [(2, Standing::Held(_))]), "only the accepted shard: {held:?}");
        for (shard, standing) in held {
            node.book.record(shard, standing).unwrap();
        }
        let entries = node.book.load().unwrap();
        assert!(matches!(entries[..], [(2, Standing::Held(_)), (5, Standing::Released(_))]));
        assert_eq!(parse_book(&node.book.text.borrow()).unwrap(), entries, "the book keeps it as text");
        let node = node.restarted();
        assert_eq!(node.server().next_id(2, true), Err(ShardError::Held(2)));
        assert!(ShardError::Held(2).to_string().contains("pgticket.accept_shard(2, 0)"), "the hint names the call");
        assert_eq!(node.server().next_id(5, true), Err(ShardError::Released(5)), "a released shard stays released");
        // Accepting it again (here with 0: nobody else issued it) resumes
        // above everything this server issued before.
        node.new_shard(2);
        assert!(node.ids(2, 1)[0] > *before.last().unwrap());
        assert!(matches!(node.book.load().unwrap()[..], [(2, Standing::Accepted(_)), (5, Standing::Released(_))]));
        // A held shard may also be released straight away, at a point above
        // what it issued.
        for (shard, standing) in holds(&node.book.load().unwrap()) {
            node.book.record(shard, standing).unwrap();
        }
        let node = node.restarted();
        let point = node.server().release(2, false).unwrap();
        assert!(point >= *before.last().unwrap());
    }

    #[test]
    fn a_shard_issues_1024_per_millisecond_then_waits_and_shards_are_independent() {
        let node = Node::at(100);
        node.new_shard(3);
        node.new_shard(9);
        let paused = node.clock.paused_ms.get();
        let first = node.ids(3, 1_025);
        assert!(first.windows(2).all(|w| w[0] < w[1]), "increasing");
        let at = |id| decompose(id).unwrap();
        assert_eq!(at(first[1_024]).millis, at(first[1_023]).millis + 1, "waited for the next ms");
        assert_eq!((at(first[1_023]).sequence, at(first[1_024]).sequence), (1_023, 0));
        assert_eq!(node.clock.paused_ms.get() - paused, 1);
        let other = node.ids(9, 1)[0];
        assert_eq!((at(other).shard, at(other).sequence), (9, 0), "shard 9 has its own sequence");
    }

    #[test]
    fn clock_rules_and_the_mark_are_the_snowflakes() {
        let node = Node::at(5_000);
        node.new_shard(1);
        node.ids(1, 1);
        assert_eq!(node.mark.mark.get(), Some(EPOCH + 5_000 + RESERVE_AHEAD_MS as i64), "the mark covers the stamp before it is issued");
        node.clock.set(4_995);
        assert!(decompose(node.ids(1, 1)[0]).unwrap().millis >= 5_000, "a 5 ms step back is waited out");
        node.clock.set(4_000);
        assert!(matches!(node.server().next_id(1, true), Err(ShardError::Snowflake(SnowflakeError::ClockBehind { .. }))));
        // A restart keeps the acceptance, and starts above the mark.
        let node = node.restarted();
        node.clock.set(5_500);
        assert!(decompose(node.ids(1, 1)[0]).unwrap().millis > 6_000);
    }

    #[test]
    fn a_released_shard_stays_closed_across_restarts_and_its_new_owner_starts_above_the_point() {
        let old = Node::at(10_000);
        old.new_shard(7);
        let issued = old.ids(7, 500);
        assert_eq!(old.server().release(7, true), Err(ShardError::StillListed(7)));
        let point = old.server().release(7, false).unwrap();
        assert_eq!(point, *issued.last().unwrap(), "the exact last ID when the server has not restarted");
        assert_eq!(old.server().release(7, false), Ok(point), "asked again, the same point");
        assert_eq!(old.server().next_id(7, true), Err(ShardError::Released(7)));
        let old = old.restarted();
        assert_eq!(old.server().next_id(7, true), Err(ShardError::Released(7)), "listed again after a restart: still released");

        // The new owner's clock is 3 ms behind: accepting waits it out.
        let new = Node::at(9_997);
        assert_eq!(new.server().next_id(7, true), Err(ShardError::NotAccepted(7)), "listed before the handover: nothing");
        new.server().accept(7, true, point).unwrap();
        assert!(new.clock.paused_ms.get() >= 3);
        assert!(new.mark.mark.get().unwrap() >= EPOCH + 10_000, "the new owner's mark covers the point");
        assert!(new.ids(7, 1)[0] > point);
        // After the new owner restarts (its clock back within the
        // reservation), still above it.
        let new = new.restarted();
        new.clock.set(10_500);
        assert!(new.ids(7, 1)[0] > point);
    }

    #[test]
    fn accepting_back_a_shard_never_goes_below_what_this_server_released() {
        let node = Node::at(30_000);
        node.new_shard(4);
        let last = *node.ids(4, 10).last().unwrap();
        let point = node.server().release(4, false).unwrap();
        node.server().accept(4, true, 0).unwrap();
        assert!(node.ids(4, 1)[0] > point.max(last), "a handover point below this server's own release is raised to it");
    }

    #[test]
    fn a_release_whose_record_fails_stays_closed_and_a_retry_records_the_same_point() {
        let node = Node::at(40_000);
        node.new_shard(6);
        let last = *node.ids(6, 20).last().unwrap();
        node.book.fail.set(true);
        assert!(matches!(node.server().release(6, false), Err(ShardError::Book(_))));
        assert_eq!(node.server().next_id(6, true), Err(ShardError::Released(6)), "closed in memory");
        node.book.fail.set(false);
        assert_eq!(node.server().release(6, false), Ok(last));
        assert_eq!(node.book.load().unwrap(), vec![(6, Standing::Released(decompose_state(last)))]);
    }

    #[test]
    fn an_accept_whose_record_fails_is_in_effect_here_and_says_so() {
        let node = Node::at(50_000);
        node.book.fail.set(true);
        let err = node.server().accept(8, true, 0).unwrap_err();
        assert!(matches!(&err, ShardError::Book(why) if why.contains("accepted here all the same")), "{err:?}");
        assert!(node.server().next_id(8, true).is_ok(), "as the WAL record may make it at a restart");
        node.book.fail.set(false);
        node.server().accept(8, true, 0).unwrap();
        assert!(matches!(node.book.load().unwrap()[..], [(8, Standing::Accepted(_))]));
    }

    #[test]
    fn an_accept_raised_far_ahead_by_this_servers_own_release_is_refused_not_waited() {
        let node = Node::at(200_000);
        node.new_shard(5);
        node.ids(5, 1);
        node.server().release(5, false).unwrap();
        node.clock.set(100_000); // set back 100 s
        let paused = node.clock.paused_ms.get();
        assert!(matches!(node.server().accept(5, true, 0), Err(ShardError::HandoverAhead { .. })));
        assert_eq!(node.clock.paused_ms.get(), paused, "no wait");
    }

    fn decompose_state(id: i64) -> u64 {
        let p = decompose(id).unwrap();
        (p.millis << SEQUENCE_BITS) | u64::from(p.sequence)
    }

    #[test]
    fn a_release_after_a_restart_hands_over_the_mark() {
        let node = Node::at(20_000);
        node.new_shard(2);
        node.ids(2, 10);
        let node = node.restarted();
        let point = node.server().release(2, false).unwrap();
        let mark_ms = (node.mark.mark.get().unwrap() - EPOCH) as u64;
        assert_eq!(decompose(point).unwrap(), ShardedParts { millis: mark_ms, shard: 2, sequence: MAX_SEQUENCE });
    }

    #[test]
    fn an_accept_of_a_point_ahead_waits_before_it_moves_the_mark_and_records_nothing_when_refused() {
        // #31 item 7 (a): 0.3.0 covered the point first (the shared mark
        // moved seconds ahead), then waited.
        let node = Node::at(10_000);
        let ahead = compose(ShardedParts { millis: 15_000, shard: 3, sequence: 0 });
        node.server().accept(3, true, ahead).unwrap();
        assert!(node.clock.paused_ms.get() >= 5_000, "waited for the point");
        let mark_ms = (node.mark.mark.get().unwrap() - EPOCH) as u64;
        assert!(mark_ms <= 15_001 + RESERVE_AHEAD_MS, "the mark moved with the clock, not ahead of it: {mark_ms}");
        // (b) A clock before the epoch is refused at once, nothing recorded.
        let before = Node::at(-5_000);
        let paused = before.clock.paused_ms.get();
        assert!(matches!(before.server().accept(4, true, 0), Err(ShardError::Snowflake(SnowflakeError::BeforeEpoch { .. }))));
        assert_eq!(before.clock.paused_ms.get(), paused, "no wait");
        assert!(before.book.load().unwrap().is_empty(), "nothing recorded");
    }

    #[test]
    fn a_handover_point_far_ahead_is_refused() {
        let node = Node::at(1_000);
        let far = compose(ShardedParts { millis: 1_000 + MAX_HANDOVER_AHEAD_MS + 1, shard: 1, sequence: 0 });
        assert!(matches!(node.server().accept(1, true, far), Err(ShardError::HandoverAhead { .. })));
    }

    #[test]
    fn the_book_round_trips_and_refuses_damage() {
        let entries = vec![(0, Standing::Accepted(0)), (4_095, Standing::Released(123_456))];
        assert_eq!(parse_book(&format_book(&entries)).unwrap(), entries);
        assert_eq!(parse_book("").unwrap(), vec![]);
        for bad in ["7 accepted 5", "7 accepted\n", "4096 accepted 1\n", "7 owned 1\n", "x accepted 1\n"] {
            assert!(parse_book(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_book_file_keeps_one_standing_per_shard() {
        let dir = std::env::temp_dir().join(format!("pgt-book-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("book");
        let _ = std::fs::remove_file(&path);
        let file = BookFile { path: &path };
        assert_eq!(file.read().unwrap(), vec![]);
        file.set(9, Standing::Accepted(5)).unwrap();
        file.set(2, Standing::Accepted(0)).unwrap();
        file.set(9, Standing::Released(77)).unwrap();
        assert_eq!(file.read().unwrap(), vec![(2, Standing::Accepted(0)), (9, Standing::Released(77))]);
        std::fs::write(&path, "9 released").unwrap();
        assert!(file.read().unwrap_err().contains("damaged"));
        assert!(file.set(1, Standing::Accepted(0)).is_err(), "a damaged book is not written over");
        assert_eq!(file.set_replacing_damage(1, Standing::Accepted(3)), Ok(true), "replay moves it aside");
        assert_eq!(file.read().unwrap(), vec![(1, Standing::Accepted(3))]);
        assert_eq!(std::fs::read_to_string(path.with_extension("damaged")).unwrap(), "9 released");
        std::fs::remove_dir_all(&dir).unwrap();
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
