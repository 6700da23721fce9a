//! Arguments of the SQL-facing functions, checked the same way everywhere:
//! a NULL is 22004, a name outside the limits or an infinite time 22023.
//! Ground: the allocators' own SQL functions use it too.

use pgrx::prelude::*;

use crate::clock::unix_ms_of_timestamptz;
use crate::errors::{OrRaise, TicketError};
use crate::names::Name;
use ticket_core::counter::check_name;

/// A required argument, or 22004.
pub(crate) fn required<T>(what: &'static str, value: Option<T>) -> T {
    value.unwrap_or_else(|| TicketError::NullArgument(what).raise())
}

/// A required name within the limits, or 22004 / 22023.
pub(crate) fn name_arg<'a>(what: &'static str, value: Option<Name<'a>>) -> Name<'a> {
    let name = required(what, value);
    check_name(what, name.bytes()).or_raise();
    name
}

pub(crate) fn scope_args<'a>(queue: Option<Name<'a>>, domain: Option<Name<'a>>) -> (Name<'a>, Name<'a>) {
    (name_arg("queue", queue), name_arg("domain", domain))
}

/// The millisecond of `at` in Unix ms (rounded down); infinity is refused.
pub(crate) fn unix_ms_of(at: Option<TimestampWithTimeZone>) -> i64 {
    let at = required("at", at);
    if !at.is_finite() {
        TicketError::InfiniteTime.raise();
    }
    unix_ms_of_timestamptz(at)
}
