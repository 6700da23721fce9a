//! The two clocks of a leased generator. Stamps come from the wall clock
//! (as the server's); the lease is reckoned on CLOCK_BOOTTIME, which,
//! unlike `Instant` (CLOCK_MONOTONIC), keeps counting while the host is
//! suspended: a suspended laptop or VM wakes up knowing its lease may be over.

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
}
