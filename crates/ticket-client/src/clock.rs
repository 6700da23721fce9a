//! The two clocks of a leased generator. Stamps come from the wall clock
//! (as the server's); the lease is reckoned on CLOCK_BOOTTIME, which,
//! unlike `Instant` (CLOCK_MONOTONIC), keeps counting while the host is
//! suspended: a suspended laptop or VM wakes up knowing its lease may be over.

use std::cell::Cell;
use ticket_core::leases::{Reckoning, StampRefusal};
use ticket_core::snowflake::{Clock, SnowflakeError};

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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockReading {
    pub boot_before_ms: i64,
    pub wall_ms: i64,
    pub boot_after_ms: i64,
}

impl ClockReading {
    pub fn now() -> Self {
        Self::read_on(&wall_ms, &boot_ms)
    }

    fn read_on(wall: &impl Fn() -> i64, boot: &impl Fn() -> i64) -> Self {
        let boot_before_ms = boot();
        let wall_ms = wall();
        ClockReading { boot_before_ms, wall_ms, boot_after_ms: boot() }
    }

    pub fn check(&self, reckoning: &Reckoning) -> Result<(), StampRefusal> {
        reckoning.check_between(self.boot_before_ms, self.wall_ms, self.boot_after_ms)
    }

    /// A reading checked against `reckoning`, with one clock read fewer
    /// when the caller kept an earlier boot reading of its own
    /// (`earlier_boot_ms`, its last reading's `boot_after_ms`): that stands
    /// in for the first boot reading, which it precedes. The check is then
    /// never less strict — a drift measured against an earlier boot reading
    /// is only larger (`Reckoning::check_between`) — but an old one may
    /// refuse where a fresh one would not (the caller was idle for longer
    /// than the drift allowed), so a refused reading is taken again in full.
    /// The boot clock is read after the wall clock at every stamp, even in
    /// a millisecond already checked: SPEC §8 rule 10 checks every stamp
    /// for a step and a passed end, and a wall clock that stands still is
    /// both.
    pub fn checked(reckoning: &Reckoning, earlier_boot_ms: Option<i64>) -> Result<Self, StampRefusal> {
        Self::checked_on(reckoning, earlier_boot_ms, &wall_ms, &boot_ms)
    }

    fn checked_on(reckoning: &Reckoning, earlier_boot_ms: Option<i64>, wall: &impl Fn() -> i64, boot: &impl Fn() -> i64) -> Result<Self, StampRefusal> {
        if let Some(boot_before_ms) = earlier_boot_ms {
            let wall_ms = wall();
            let reading = ClockReading { boot_before_ms, wall_ms, boot_after_ms: boot() };
            if reading.check(reckoning).is_ok() {
                return Ok(reading);
            }
        }
        let reading = Self::read_on(wall, boot);
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
///
/// Every reading after a wait is checked too, before the generator stamps
/// it (#46 item 11): 0.4.0 checked it only after the stamp, so a wall clock
/// stepped forward during a wait entered the generator's state, and the
/// generator, its last stamp in the future, refused every stamp for the
/// step's length once the clock came back.
pub struct CheckedWall<'a, C: Clock> {
    inner: &'a C,
    checked_ms: Cell<Option<i64>>,
    check_again: Box<dyn Fn() -> Result<ClockReading, StampRefusal> + 'a>,
    refused: Cell<Option<StampRefusal>>,
}

impl<'a, C: Clock> CheckedWall<'a, C> {
    /// The generator's clock for one stamp: `checked` first, then, after a
    /// wait, fresh readings checked against `reckoning`.
    pub fn starting_with(inner: &'a C, checked: ClockReading, reckoning: Reckoning) -> Self {
        Self::checking_again_with(inner, checked, move || ClockReading::checked(&reckoning, None))
    }

    /// As `starting_with`, a later reading taken and checked by `check_again`.
    pub fn checking_again_with(inner: &'a C, checked: ClockReading, check_again: impl Fn() -> Result<ClockReading, StampRefusal> + 'a) -> Self {
        CheckedWall {
            inner,
            checked_ms: Cell::new(Some(checked.wall_ms)),
            check_again: Box::new(check_again),
            refused: Cell::new(None),
        }
    }

    /// Why a later reading was refused (the generator then answered
    /// `SnowflakeError::ReadingRefused` and stamped nothing).
    pub fn refusal(&self) -> Option<StampRefusal> {
        self.refused.get()
    }
}

impl<C: Clock> Clock for CheckedWall<'_, C> {
    // The generator reads `stamp_unix_ms`; this is a plain reading.
    fn now_unix_ms(&self) -> i64 {
        self.checked_ms.take().unwrap_or_else(wall_ms)
    }
    fn stamp_unix_ms(&self) -> Result<i64, SnowflakeError> {
        if let Some(first) = self.checked_ms.take() {
            return Ok(first);
        }
        match (self.check_again)() {
            Ok(reading) => Ok(reading.wall_ms),
            Err(refusal) => {
                self.refused.set(Some(refusal));
                Err(SnowflakeError::ReadingRefused)
            }
        }
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

    /// Clocks that count their reads: boot at `boot`, wall at `wall`.
    struct FakeClocks {
        boot: Cell<i64>,
        wall: Cell<i64>,
        boot_reads: Cell<u32>,
        wall_reads: Cell<u32>,
    }

    impl FakeClocks {
        fn at(boot: i64, wall: i64) -> Self {
            FakeClocks { boot: Cell::new(boot), wall: Cell::new(wall), boot_reads: Cell::new(0), wall_reads: Cell::new(0) }
        }
        fn checked(&self, r: &Reckoning, earlier_boot_ms: Option<i64>) -> Result<ClockReading, StampRefusal> {
            self.boot_reads.set(0);
            self.wall_reads.set(0);
            let boot = || {
                self.boot_reads.set(self.boot_reads.get() + 1);
                self.boot.get()
            };
            let wall = || {
                self.wall_reads.set(self.wall_reads.get() + 1);
                self.wall.get()
            };
            ClockReading::checked_on(r, earlier_boot_ms, &wall, &boot)
        }
        fn reads(&self) -> (u32, u32) {
            (self.wall_reads.get(), self.boot_reads.get())
        }
    }

    /// Replied at boot 10 000 / wall 500 000; 60 s ttl, drift allowed 5 s.
    fn reckoning() -> Reckoning {
        Reckoning { sent_at_ms: 10_000, ttl_ms: 60_000, replied_boot_ms: 10_000, replied_wall_ms: 500_000, stamp_cap_ms: 565_000, drift_allowed_ms: 5_000 }
    }

    #[test]
    fn the_wall_clock_reads_as_the_standard_library_does() {
        let std_ms = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
        let (a, w, b) = (std_ms(), wall_ms(), std_ms());
        assert!(a <= w && w <= b, "{a} <= {w} <= {b}");
    }

    #[test]
    fn a_checked_reading_keeps_a_recent_boot_reading_and_replaces_an_old_one() {
        let r = reckoning();
        let clocks = FakeClocks::at(20_000, 510_000);
        let full = clocks.checked(&r, None).unwrap();
        assert_eq!(clocks.reads(), (1, 2), "without a last reading: boot, wall, boot");
        let last = Some(full.boot_after_ms);
        clocks.boot.set(20_001);
        clocks.wall.set(510_001);
        let kept = clocks.checked(&r, last).unwrap();
        assert_eq!(kept, ClockReading { boot_before_ms: 20_000, wall_ms: 510_001, boot_after_ms: 20_001 }, "the last boot reading stands in");
        assert_eq!(clocks.reads(), (1, 1));
        // Idle for 20 s by its own last reading: that reading alone would
        // look like a 20 s step; a fresh reading stands in.
        clocks.boot.set(40_000);
        clocks.wall.set(530_000);
        let replaced = clocks.checked(&r, last).unwrap();
        assert_eq!(replaced, ClockReading { boot_before_ms: 40_000, wall_ms: 530_000, boot_after_ms: 40_000 }, "read again in full");
        assert_eq!(clocks.reads(), (2, 3));
        // A stepped wall clock is refused either way.
        clocks.wall.set(536_000);
        assert_eq!(clocks.checked(&r, last), Err(StampRefusal::ClockStepped { drift_ms: 6_000 }));
        clocks.boot.set(80_000);
        clocks.wall.set(570_000);
        // A lease that may have ended is refused either way.
        assert_eq!(clocks.checked(&r, last).unwrap_err(), StampRefusal::MayHaveEnded);
        assert_eq!(clocks.checked(&r, None).unwrap_err(), StampRefusal::MayHaveEnded);
    }

    #[test]
    fn a_wall_clock_that_stands_still_is_refused_in_the_millisecond_it_stamped() {
        // Review of 45425bd: a millisecond already checked was stamped again
        // without a boot reading, so a frozen wall clock went on stamping
        // past the lease's end and past the drift allowed.
        let r = reckoning();
        let clocks = FakeClocks::at(20_000, 510_000);
        let first = clocks.checked(&r, None).unwrap();
        clocks.boot.set(30_000);
        assert_eq!(clocks.checked(&r, Some(first.boot_after_ms)), Err(StampRefusal::ClockStepped { drift_ms: -10_000 }));
        assert_eq!(clocks.reads(), (2, 3), "the boot clock read after the wall clock, then in full");
        clocks.boot.set(70_000);
        assert_eq!(clocks.checked(&r, Some(first.boot_after_ms)), Err(StampRefusal::MayHaveEnded));
    }

    #[test]
    fn the_real_clocks_pass_a_fresh_lease() {
        let boot = boot_ms();
        let r = Reckoning { sent_at_ms: boot, ttl_ms: 60_000, replied_boot_ms: boot, replied_wall_ms: wall_ms(), stamp_cap_ms: i64::MAX, drift_allowed_ms: 5_000 };
        let first = ClockReading::checked(&r, None).unwrap();
        assert!(first.boot_before_ms >= boot && first.boot_after_ms >= first.boot_before_ms);
        let next = ClockReading::checked(&r, Some(first.boot_after_ms)).unwrap();
        assert!(next.wall_ms >= first.wall_ms);
    }
}
