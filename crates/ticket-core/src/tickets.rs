//! Tickets (SPEC §7), free of PostgreSQL: what `next_ticket()` will hand
//! out, decided without a server so that the extension's shared-memory
//! cache and background worker only move values around.
//!
//! - `Series`: Flickr's odd/even servers. A server hands out only values
//!   ≡ offset (mod increment); a scope remembers the series it was created
//!   in, and another series refuses it.
//! - `Segment`: a run of a scope's values reserved in one durable write (the
//!   worker's commit), `size` values of the series after the stored mark.
//! - `Cache`: a cached scope's double buffer (Leaf): the segment being handed
//!   out and the one fetched ahead, so a steady consumer never waits.
//! - `next_step`: the segment size follows the consumption rate between a
//!   minimum and a maximum; the maximum bounds what a crash can lose.
//!
//! Not wired into the extension yet (the shared-memory cache and the worker
//! come next); see issue "Tickets".

use thiserror::Error;

#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum TicketsError {
    #[error("ticket offset {offset} and increment {increment} do not make a series: the increment must be at least 1 and the offset between 1 and the increment")]
    BadSeries { offset: i64, increment: i64 },
    #[error("this ticket scope was created with offset {created_offset} and increment {created_increment}, but this server hands out offset {offset} and increment {increment}")]
    OtherSeries { created_offset: i64, created_increment: i64, offset: i64, increment: i64 },
    #[error("no ticket is left above {mark}: tickets stop at 9223372036854775807")]
    Overflow { mark: i64, size: i64 },
}

/// Values ≡ `offset` (mod `increment`), offset in 1..=increment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Series {
    pub offset: i64,
    pub increment: i64,
}

/// Values `first, first + increment, ..., last` of a series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub first: i64,
    pub last: i64,
}

impl Segment {
    /// Whether a reserved segment may go into a slot whose segments so far
    /// end at `reserved_to`: only one above all of them (SPEC §7, tickets
    /// in real-time order). A segment at or below it was reserved before
    /// one already installed — by a second worker of the database, which a
    /// retiring one can meet, or installed late — and is a gap.
    pub fn installs_after(&self, reserved_to: i64) -> bool {
        self.first > reserved_to
    }
}

impl Series {
    pub fn new(offset: i64, increment: i64) -> Result<Series, TicketsError> {
        if increment < 1 || !(1..=increment).contains(&offset) {
            return Err(TicketsError::BadSeries { offset, increment });
        }
        Ok(Series { offset, increment })
    }

    pub fn contains(&self, value: i64) -> bool {
        value >= self.offset && (value - self.offset) % self.increment == 0
    }

    /// A scope created in `created` may be served by this server only if it
    /// is the same series.
    pub fn check_same(&self, created: Series) -> Result<(), TicketsError> {
        if created != *self {
            return Err(TicketsError::OtherSeries {
                created_offset: created.offset,
                created_increment: created.increment,
                offset: self.offset,
                increment: self.increment,
            });
        }
        Ok(())
    }

    /// Up to `size` (≥ 1) values of the series above `mark` (the last value
    /// reserved, 0: none yet; a mark moved by an admin need not be in the
    /// series); the new mark is the segment's `last`. Fewer at the top of
    /// bigint; none past it (`Overflow`).
    pub fn segment_after(&self, mark: i64, size: i64) -> Result<Segment, TicketsError> {
        let overflow = TicketsError::Overflow { mark, size };
        let above = mark.checked_add(1).ok_or(overflow.clone())?;
        let first = above.checked_add((self.offset - above).rem_euclid(self.increment)).ok_or(overflow.clone())?;
        // Near the top of bigint a segment is whatever is left of the series.
        let last = (size - 1)
            .checked_mul(self.increment)
            .and_then(|span| first.checked_add(span))
            .unwrap_or(first + (i64::MAX - first) / self.increment * self.increment);
        Ok(Segment { first, last })
    }
}

/// A cached scope: the segment being handed out and the one fetched ahead.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cache {
    /// The segment being handed out, and its next value.
    current: Option<(Segment, i64)>,
    ahead: Option<Segment>,
}

/// What a `take` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// Hand out `value`. `fetch_ahead`: nothing is fetched ahead and half of
    /// the current segment is used, so the next one should be asked for now
    /// (a scope used once or twice does not reserve a second segment).
    Value { value: i64, fetch_ahead: bool },
    /// Nothing cached: wait for a segment.
    Empty,
}

impl Cache {
    /// Take the next value, moving to the segment fetched ahead when the
    /// current one is used up.
    pub fn take(&mut self, series: Series) -> Take {
        let (segment, next) = match self.current {
            Some(current) => current,
            None => match self.ahead.take() {
                Some(segment) => (segment, segment.first),
                None => return Take::Empty,
            },
        };
        // The value after `next` may not exist (the top of bigint): then the
        // segment ends here.
        let after = next.checked_add(series.increment).filter(|after| *after <= segment.last);
        self.current = after.map(|after| (segment, after));
        let used = (next - segment.first) / series.increment + 1;
        let left = after.map_or(0, |after| (segment.last - after) / series.increment + 1);
        Take::Value { value: next, fetch_ahead: self.ahead.is_none() && used >= left }
    }

    /// The next value and the end of what is cached (for the view).
    pub fn next_and_end(&self) -> Option<(i64, i64)> {
        match (self.current, self.ahead) {
            (Some((segment, next)), ahead) => Some((next, ahead.map_or(segment.last, |a| a.last))),
            (None, Some(ahead)) => Some((ahead.first, ahead.last)),
            (None, None) => None,
        }
    }

    /// Values still cached, current and ahead.
    pub fn cached(&self, series: Series) -> i64 {
        let count = |from: i64, to: i64| (to - from) / series.increment + 1;
        self.current.map_or(0, |(segment, next)| count(next, segment.last)) + self.ahead.map_or(0, |s| count(s.first, s.last))
    }

    /// A newly reserved segment: handed out at once if nothing is cached,
    /// else kept ahead. Returns false (and keeps nothing) if a segment is
    /// already ahead: the caller asked for more than it needed.
    pub fn add(&mut self, segment: Segment) -> bool {
        if self.current.is_none() && self.ahead.is_none() {
            self.current = Some((segment, segment.first));
        } else if self.ahead.is_none() {
            self.ahead = Some(segment);
        } else {
            return false;
        }
        true
    }
}

/// Leaf's dynamic step: a segment that lasted less than `fast_ms` doubles
/// the next one, one that lasted more than `slow_ms` halves it, always
/// within `min..=max`.
pub fn next_step(step: i64, lasted_ms: u64, min: i64, max: i64, fast_ms: u64, slow_ms: u64) -> i64 {
    let step = if lasted_ms < fast_ms {
        step.saturating_mul(2)
    } else if lasted_ms > slow_ms {
        step / 2
    } else {
        step
    };
    step.clamp(min, max.max(min))
}

/// At most `n` of `items`, taken in turns from each owner (`owner_of`) in
/// the order they first appear, starting at owner `start` (modulo their
/// number: a caller rotates it), each owner's in its own order; and the
/// rest. The ticket worker's first uses of a pass (#46 item 10): one role
/// asking for thousands of new scopes gets its turn, not the pass.
pub fn take_in_turns<T>(items: Vec<T>, owner_of: impl Fn(&T) -> u32, n: usize, start: usize) -> (Vec<T>, Vec<T>) {
    if items.len() <= n {
        return (items, Vec::new());
    }
    let mut owners: Vec<(u32, std::collections::VecDeque<T>)> = Vec::new();
    for item in items {
        let owner = owner_of(&item);
        match owners.iter_mut().find(|(o, _)| *o == owner) {
            Some((_, queue)) => queue.push_back(item),
            None => owners.push((owner, std::collections::VecDeque::from([item]))),
        }
    }
    let first = start % owners.len();
    owners.rotate_left(first);
    let mut taken = Vec::with_capacity(n);
    while taken.len() < n {
        let before = taken.len();
        for (_, queue) in owners.iter_mut() {
            if taken.len() == n {
                break;
            }
            if let Some(item) = queue.pop_front() {
                taken.push(item);
            }
        }
        if taken.len() == before {
            break;
        }
    }
    let rest = owners.into_iter().flat_map(|(_, queue)| queue).collect();
    (taken, rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_reserved_before_one_installed_is_a_gap() {
        // #31 item 9: two workers of one database; the later segment went
        // in first, then the earlier one arrived.
        let (earlier, later) = (Segment { first: 101, last: 110 }, Segment { first: 111, last: 120 });
        assert!(earlier.installs_after(100));
        assert!(later.installs_after(110));
        assert!(!earlier.installs_after(later.last), "an earlier segment after a later one would go back");
        assert!(!Segment { first: 120, last: 130 }.installs_after(120));
    }

    #[test]
    fn a_series_needs_an_offset_within_its_increment() {
        assert!(Series::new(1, 1).is_ok());
        assert!(Series::new(2, 2).is_ok());
        for (offset, increment) in [(0, 1), (3, 2), (1, 0), (-1, 2)] {
            assert_eq!(Series::new(offset, increment), Err(TicketsError::BadSeries { offset, increment }));
        }
    }

    #[test]
    fn odd_and_even_servers_never_meet() {
        let (odd, even) = (Series::new(1, 2).unwrap(), Series::new(2, 2).unwrap());
        let values = |series: Series| {
            let mut mark = 0;
            let mut all = Vec::new();
            for size in [1, 3, 10] {
                let s = series.segment_after(mark, size).unwrap();
                all.extend((s.first..=s.last).step_by(2));
                mark = s.last;
            }
            all
        };
        let (o, e) = (values(odd), values(even));
        assert_eq!(&o[..4], &[1, 3, 5, 7]);
        assert_eq!(&e[..4], &[2, 4, 6, 8]);
        assert_eq!(o.len(), 14);
        assert!(o.iter().all(|v| v % 2 == 1) && e.iter().all(|v| v % 2 == 0));
    }

    #[test]
    fn segments_follow_the_mark_and_stop_at_the_top() {
        let one = Series::new(1, 1).unwrap();
        assert_eq!(one.segment_after(0, 100), Ok(Segment { first: 1, last: 100 }));
        assert_eq!(one.segment_after(100, 50), Ok(Segment { first: 101, last: 150 }));
        assert_eq!(one.segment_after(i64::MAX - 10, 10), Ok(Segment { first: i64::MAX - 9, last: i64::MAX }));
        assert_eq!(one.segment_after(i64::MAX - 10, 100), Ok(Segment { first: i64::MAX - 9, last: i64::MAX }), "what is left");
        let odd = Series::new(1, 2).unwrap();
        assert_eq!(odd.segment_after(i64::MAX - 5, 100), Ok(Segment { first: i64::MAX - 4, last: i64::MAX }), "i64::MAX is odd");
        let even = Series::new(2, 2).unwrap();
        assert_eq!(even.segment_after(i64::MAX - 5, 100), Ok(Segment { first: i64::MAX - 5 + 2, last: i64::MAX - 1 }));
        assert_eq!(even.segment_after(i64::MAX - 1, 1), Err(TicketsError::Overflow { mark: i64::MAX - 1, size: 1 }), "no even value left");
        assert_eq!(one.segment_after(i64::MAX, 1), Err(TicketsError::Overflow { mark: i64::MAX, size: 1 }));
        let even = Series::new(2, 2).unwrap();
        assert_eq!(even.segment_after(7, 2), Ok(Segment { first: 8, last: 10 }), "a mark moved off the series: the next value of it");
        assert_eq!(even.segment_after(8, 1), Ok(Segment { first: 10, last: 10 }));
        let third = Series::new(3, 5).unwrap();
        assert_eq!(third.segment_after(0, 2), Ok(Segment { first: 3, last: 8 }));
        assert_eq!(third.segment_after(4, 1), Ok(Segment { first: 8, last: 8 }));
    }

    #[test]
    fn a_scope_of_another_series_is_refused_naming_both() {
        let here = Series::new(1, 2).unwrap();
        let err = here.check_same(Series::new(2, 2).unwrap()).unwrap_err();
        assert!(err.to_string().contains("offset 2 and increment 2") && err.to_string().contains("offset 1 and increment 2"), "{err}");
        assert!(here.check_same(here).is_ok());
    }

    #[test]
    fn the_cache_hands_out_the_current_segment_then_the_one_ahead() {
        let odd = Series::new(1, 2).unwrap();
        let mut cache = Cache::default();
        assert_eq!(cache.take(odd), Take::Empty);
        assert!(cache.add(Segment { first: 1, last: 7 })); // 1 3 5 7
        let mut asked = Vec::new();
        let mut values = Vec::new();
        while let Take::Value { value, fetch_ahead } = cache.take(odd) {
            values.push(value);
            asked.push(fetch_ahead);
        }
        assert_eq!(values, [1, 3, 5, 7]);
        assert_eq!(asked, [false, true, true, true], "ask ahead once half the segment is used");
        assert!(cache.add(Segment { first: 9, last: 11 }));
        assert!(cache.add(Segment { first: 13, last: 15 }), "one ahead");
        assert!(!cache.add(Segment { first: 17, last: 19 }), "never two ahead");
        assert_eq!(cache.cached(odd), 4);
        let drained: Vec<i64> =
            std::iter::from_fn(|| match cache.take(odd) { Take::Value { value, .. } => Some(value), Take::Empty => None }).collect();
        assert_eq!(drained, [9, 11, 13, 15], "strictly increasing across segments");
    }

    #[test]
    fn a_segment_at_the_top_of_bigint_ends_there() {
        let one = Series::new(1, 1).unwrap();
        let mut cache = Cache::default();
        cache.add(one.segment_after(i64::MAX - 2, 2).unwrap());
        assert!(matches!(cache.take(one), Take::Value { value, .. } if value == i64::MAX - 1));
        assert!(matches!(cache.take(one), Take::Value { value: i64::MAX, .. }));
        assert_eq!(cache.take(one), Take::Empty);
    }

    #[test]
    fn the_step_follows_the_rate_within_its_bounds() {
        assert_eq!(next_step(100, 10, 10, 1000, 500, 10_000), 200, "used up fast: double");
        assert_eq!(next_step(800, 10, 10, 1000, 500, 10_000), 1000, "never past the maximum");
        assert_eq!(next_step(100, 60_000, 10, 1000, 500, 10_000), 50, "slow: halve");
        assert_eq!(next_step(15, 60_000, 10, 1000, 500, 10_000), 10, "never below the minimum");
        assert_eq!(next_step(100, 2_000, 10, 1000, 500, 10_000), 100, "steady: keep");
    }

    #[test]
    fn first_uses_are_taken_in_turns_by_role() {
        // Role 7 asks for 1 000 new scopes, roles 8 and 9 for two each.
        let mut items: Vec<(u32, usize)> = (0..1000).map(|k| (7, k)).collect();
        items.insert(500, (8, 0));
        items.push((9, 0));
        items.push((8, 1));
        items.push((9, 1));
        let (taken, rest) = take_in_turns(items.clone(), |i| i.0, 10, 0);
        assert_eq!(taken.len(), 10);
        for role in [8, 9] {
            assert_eq!(taken.iter().filter(|i| i.0 == role).count(), 2, "role {role} has both its scopes taken");
        }
        assert_eq!(taken.iter().filter(|i| i.0 == 7).map(|i| i.1).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4, 5], "the flooder's in its own order");
        assert_eq!(rest.len(), items.len() - 10);
        let mut all: Vec<_> = taken.iter().chain(rest.iter()).copied().collect();
        all.sort_unstable();
        items.sort_unstable();
        assert_eq!(all, items, "nothing lost or made twice");
        let (few, none) = take_in_turns(vec![(1, 0), (1, 1)], |i| i.0, 10, 3);
        assert_eq!((few.len(), none.len()), (2, 0));
        // More owners than room: the start rotates who goes first, so
        // every owner is served within a few passes.
        let many: Vec<(u32, usize)> = (0..30).map(|o| (o, 0)).collect();
        let mut served = std::collections::HashSet::new();
        for pass in 0..3 {
            let (taken, _) = take_in_turns(many.clone(), |i| i.0, 10, pass * 10);
            served.extend(taken.iter().map(|i| i.0));
        }
        assert_eq!(served.len(), 30, "every owner within three passes");
    }
}
