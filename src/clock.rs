//! The real clock in Unix ms, and Unix ms as PostgreSQL's timestamptz: the
//! ground every allocator and message reads time from.

use pgrx::prelude::*;

/// The wall clock in Unix ms: CLOCK_REALTIME (through the vDSO, no system
/// call, unless libfaketime stands in), read as the leased clients read it.
/// Before 1970 (a badly set clock) it is negative.
#[inline]
pub fn now_unix_ms() -> i64 {
    ticket_client::clock::wall_ms()
}

/// PostgreSQL timestamps count microseconds from 2000-01-01.
const PG_EPOCH_UNIX_MS: i64 = 946_684_800_000;

/// Unix ms as a timestamptz (None if PostgreSQL cannot represent it).
pub fn timestamptz_of_unix_ms(unix_ms: i64) -> Option<TimestampWithTimeZone> {
    TimestampWithTimeZone::try_from((unix_ms - PG_EPOCH_UNIX_MS) * 1000).ok()
}

/// Unix ms as a timestamptz, or an error for a time PostgreSQL cannot hold.
pub fn timestamptz_or_error(unix_ms: i64) -> TimestampWithTimeZone {
    timestamptz_of_unix_ms(unix_ms).unwrap_or_else(|| pgrx::error!("pg_ticket: cannot represent {unix_ms} ms as a timestamp"))
}

/// The millisecond (rounded down) of a finite timestamptz, in Unix ms.
pub fn unix_ms_of_timestamptz(at: TimestampWithTimeZone) -> i64 {
    let micros_since_2000: i64 = at.into_inner();
    micros_since_2000.div_euclid(1000) + PG_EPOCH_UNIX_MS
}

/// When the postmaster started (Unix ms).
pub fn postmaster_start_ms() -> i64 {
    unix_ms_of_timestamptz(TimestampWithTimeZone::try_from(unsafe { pgrx::pg_sys::PgStartTime }).expect("a start time"))
}

/// When this timeline began: its history file is written at promotion (or
/// at the end of an archive recovery). Timeline 1 has none.
pub fn timeline_start_ms(timeline: i32) -> Option<i64> {
    let modified = std::fs::metadata(format!("pg_wal/{timeline:08X}.history")).ok()?.modified().ok()?;
    Some(modified.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as i64)
}
