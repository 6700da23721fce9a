//! The two clocks of a leased generator. Stamps come from the wall clock
//! (as the server's); the lease is reckoned on CLOCK_BOOTTIME, which,
//! unlike `Instant` (CLOCK_MONOTONIC), keeps counting while the host is
//! suspended: a suspended laptop or VM wakes up knowing its lease may be over.

use std::cell::Cell;
use ticket_core::leases::{Reckoning, StampRefusal};
use ticket_core::snowflake::Clock;

/// Milliseconds on CLOCK_BOOTTIME.
pub fn boot_ms() -> i64 {
    clock_ms(libc::CLOCK_BOOTTIME)
}

/// Milliseconds on CLOCK_REALTIME (Unix ms; rounded down, so negative
/// before 1970). Read directly rather than through `SystemTime`, whose
/// checked subtraction and u128 milliseconds cost a stamp a fifth of its
/// clock time.
pub fn wall_ms() -> i64 {
    clock_ms(libc::CLOCK_REALTIME)
}

fn clock_ms(clock: libc::clockid_t) -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // Cannot fail for a valid clock id and pointer.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime({clock})");
    ts.tv_sec * 1000 + ts.tv_nsec / 1_000_000
}

pub struct WallClock;

impl Clock for WallClock {
    fn now_unix_ms(&self) -> i64 {
        wall_ms()
    }
    fn pause(&self, millis: u64) {
        if millis == 0 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_millis(millis));
        }
    }
    fn pause_until(&self, unix_ms: i64, at_most_ms: u64) {
        ticket_core::snowflake::sleep_until_unix_ms(unix_ms, at_most_ms, || ())
    }
}

/// A wall-clock reading taken between two boot-clock readings, so that a
/// pause between the reads (SIGSTOP, a preemption) can hide neither a
/// passed lease end nor a clock step ([`Reckoning::check_between`]).
#[derive(Debug, Clone, Copy)]
pub struct ClockReading {
    pub boot_before_ms: i64,
    pub wall_ms: i64,
    pub boot_after_ms: i64,
}

impl ClockReading {
    pub fn now() -> Self {
        let boot_before_ms = boot_ms();
        let wall_ms = wall_ms();
        ClockReading { boot_before_ms, wall_ms, boot_after_ms: boot_ms() }
    }

    pub fn check(&self, reckoning: &Reckoning) -> Result<(), StampRefusal> {
        reckoning.check_between(self.boot_before_ms, self.wall_ms, self.boot_after_ms)
    }

    /// A reading checked against `reckoning`, with one clock read fewer
    /// when the caller kept an earlier boot reading of its own
    /// (`earlier_boot_ms`, the last reading's `boot_after_ms`): that stands
    /// in for the first boot reading, which it precedes. The check is then
    /// never less strict — a drift measured against an earlier boot reading
    /// is only larger (`Reckoning::check_between`) — but an old one may
    /// refuse where a fresh one would not (the caller was idle for longer
    /// than the drift allowed), so a refused reading is taken again in full.
    pub fn checked(reckoning: &Reckoning, earlier_boot_ms: Option<i64>) -> Result<Self, StampRefusal> {
        if let Some(boot_before_ms) = earlier_boot_ms {
            let wall_ms = wall_ms();
            let reading = ClockReading { boot_before_ms, wall_ms, boot_after_ms: boot_ms() };
            if reading.check(reckoning).is_ok() {
                return Ok(reading);
            }
        }
        let reading = ClockReading::now();
        reading.check(reckoning).map(|()| reading)
    }
}

/// A leased generator's clock for one ID: first a reading already checked
/// against the lease, then (after a wait) fresh readings, the last of which
/// is kept for the caller to check after the stamp. Waits are `inner`'s (the
/// server's checks for interrupts).
///
/// The generator reads its state before the clock, so that the clock is
/// ahead of every issue it can see; the checked reading comes before the
/// state. A reading overtaken by another issuer meanwhile only makes the
/// generator wait for the next millisecond (or, if overtaken by more than
/// its backward wait, refuse as if the clock went back): it is never
/// stamped below an issued ID.
pub struct CheckedWall<'a, C: Clock> {
    inner: &'a C,
    checked_ms: Cell<Option<i64>>,
    read_again: Cell<Option<ClockReading>>,
}

impl<'a, C: Clock> CheckedWall<'a, C> {
    pub fn starting_with(inner: &'a C, checked: ClockReading) -> Self {
        CheckedWall { inner, checked_ms: Cell::new(Some(checked.wall_ms)), read_again: Cell::new(None) }
    }

    /// The last reading after the checked one, if the generator waited.
    pub fn later_reading(&self) -> Option<ClockReading> {
        self.read_again.get()
    }
}

impl<C: Clock> Clock for CheckedWall<'_, C> {
    fn now_unix_ms(&self) -> i64 {
        self.checked_ms.take().unwrap_or_else(|| {
            let reading = ClockReading::now();
            self.read_again.set(Some(reading));
            reading.wall_ms
        })
    }
    fn pause(&self, millis: u64) {
        self.inner.pause(millis)
    }
    fn sleep(&self, millis: u64) {
        self.inner.sleep(millis)
    }
    // The inner clock reads the time for its own wait: the reading the
    // generator stamps after it is the next `now_unix_ms`, kept above.
    fn pause_until(&self, unix_ms: i64, at_most_ms: u64) {
        self.inner.pause_until(unix_ms, at_most_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lease replied to just now: 60 s ttl, drift allowed 5 s.
    fn fresh_reckoning() -> Reckoning {
        let boot = boot_ms();
        Reckoning { sent_at_ms: boot, ttl_ms: 60_000, replied_boot_ms: boot, replied_wall_ms: wall_ms(), stamp_cap_ms: i64::MAX, drift_allowed_ms: 5_000 }
    }

    #[test]
    fn the_wall_clock_reads_as_the_standard_library_does() {
        let std_ms = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
        let (a, w, b) = (std_ms(), wall_ms(), std_ms());
        assert!(a <= w && w <= b, "{a} <= {w} <= {b}");
    }

    #[test]
    fn a_checked_reading_keeps_a_recent_boot_reading_and_replaces_an_old_one() {
        let r = fresh_reckoning();
        let recent = boot_ms();
        let kept = ClockReading::checked(&r, Some(recent)).unwrap();
        assert_eq!(kept.boot_before_ms, recent, "one clock read fewer");
        assert!(kept.boot_after_ms >= recent);
        // Idle for a minute by its own last reading: that reading alone
        // would look like a 60 s step; a fresh reading stands in.
        let old = recent - 60_000;
        assert!(ClockReading { boot_before_ms: old, ..kept }.check(&r).is_err());
        let replaced = ClockReading::checked(&r, Some(old)).unwrap();
        assert!(replaced.boot_before_ms >= recent, "read again in full: {replaced:?}");
        let full = ClockReading::checked(&r, None).unwrap();
        assert!(full.boot_before_ms >= recent);
        // A lease that may have ended is refused either way.
        let ended = Reckoning { sent_at_ms: recent - 120_000, ..r };
        assert_eq!(ClockReading::checked(&ended, Some(recent)).unwrap_err(), StampRefusal::MayHaveEnded);
        assert_eq!(ClockReading::checked(&ended, None).unwrap_err(), StampRefusal::MayHaveEnded);
    }
}
