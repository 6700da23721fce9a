//! The two clocks of a leased generator. Stamps come from the wall clock
//! (as the server's); the lease is reckoned on CLOCK_BOOTTIME, which,
//! unlike `Instant` (CLOCK_MONOTONIC), keeps counting while the host is
//! suspended: a suspended laptop or VM wakes up knowing its lease may be over.

use std::cell::Cell;
use ticket_core::leases::{Reckoning, StampRefusal};
use ticket_core::snowflake::Clock;

/// Milliseconds on CLOCK_BOOTTIME.
pub fn boot_ms() -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // Cannot fail for a valid clock id and pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_BOOTTIME)");
    ts.tv_sec * 1000 + ts.tv_nsec / 1_000_000
}

pub fn wall_ms() -> i64 {
    match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_millis() as i64,
        Err(e) => -(e.duration().as_millis() as i64),
    }
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
