//! The SQL-facing functions: check arguments, call the core, convert.
//! Not STRICT: a NULL argument is an error (22004), not a NULL result.

use pgrx::prelude::*;

use crate::allocator::{self, Kind};
use crate::errors::{OrRaise, TicketError};
use crate::snowflake;
use ticket_core::counter::{check_block_size, check_name};

fn required<T>(what: &'static str, value: Option<T>) -> T {
    value.unwrap_or_else(|| TicketError::NullArgument(what).raise())
}

fn name_arg<'a>(what: &'static str, value: Option<&'a str>) -> &'a str {
    let name = required(what, value);
    check_name(what, name).or_raise();
    name
}

fn scope_args<'a>(queue: Option<&'a str>, domain: Option<&'a str>) -> (&'a str, &'a str) {
    (name_arg("queue", queue), name_arg("domain", domain))
}

/// The next value of the counter `(queue, domain)`, created at 1 on first use.
#[pg_extern(volatile, parallel_unsafe)]
fn next_scoped_id(queue: Option<&str>, domain: Option<&str>) -> i64 {
    let (queue, domain) = scope_args(queue, domain);
    allocator::take(Kind::Scope, queue, domain, 1).or_raise()
}

/// Reserve `size` consecutive IDs from the block counter `name`.
#[pg_extern(volatile, parallel_unsafe)]
fn reserve_block(
    name: Option<&str>,
    size: Option<i64>,
) -> TableIterator<'static, (name!(first_id, i64), name!(last_id, i64))> {
    let name = name_arg("name", name);
    let size = required("size", size);
    check_block_size(size).or_raise();
    let last = allocator::take(Kind::Block, name, "", size).or_raise();
    TableIterator::once((last - size + 1, last))
}

/// The mark of `(queue, domain)` as this transaction sees it: the last value
/// handed out, 0 if never used. Takes nothing and locks nothing.
#[pg_extern(volatile, parallel_unsafe)]
fn current_scoped_id(queue: Option<&str>, domain: Option<&str>) -> i64 {
    let (queue, domain) = scope_args(queue, domain);
    allocator::current(Kind::Scope, queue, domain)
}

/// The mark of block counter `name`: the last ID reserved, 0 if never used.
#[pg_extern(volatile, parallel_unsafe)]
fn current_block_mark(name: Option<&str>) -> i64 {
    allocator::current(Kind::Block, name_arg("name", name), "")
}

/// Admin: move the mark of `(queue, domain)` forward to `mark` (never back),
/// e.g. after restoring an old backup or importing from another system.
#[pg_extern(volatile, parallel_unsafe)]
fn advance_scoped_id(queue: Option<&str>, domain: Option<&str>, mark: Option<i64>) -> i64 {
    let (queue, domain) = scope_args(queue, domain);
    allocator::advance(Kind::Scope, queue, domain, required("mark", mark)).or_raise()
}

/// Admin: move the mark of block counter `name` forward to `mark`.
#[pg_extern(volatile, parallel_unsafe)]
fn advance_block_mark(name: Option<&str>, mark: Option<i64>) -> i64 {
    let name = name_arg("name", name);
    allocator::advance(Kind::Block, name, "", required("mark", mark)).or_raise()
}

/// A 64-bit time-ordered ID from this server's shared generator.
#[pg_extern(volatile, parallel_unsafe)]
fn snowflake_id() -> i64 {
    snowflake::next_id()
}

/// The parts of a snowflake ID, read with this server's epoch.
#[pg_extern(immutable, parallel_safe)]
fn snowflake_decode(
    id: Option<i64>,
) -> TableIterator<'static, (name!(created_at, TimestampWithTimeZone), name!(machine_id, i32), name!(sequence, i32))> {
    let (unix_ms, machine_id, sequence) = snowflake::decode(required("id", id));
    // PostgreSQL timestamps count microseconds from 2000-01-01.
    const PG_EPOCH_UNIX_MS: i64 = 946_684_800_000;
    let created_at = TimestampWithTimeZone::try_from((unix_ms - PG_EPOCH_UNIX_MS) * 1000)
        .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot represent the timestamp of {unix_ms} ms: {e:?}"));
    TableIterator::once((created_at, i32::from(machine_id), i32::from(sequence)))
}

extension_sql!(
    r#"
REVOKE EXECUTE ON FUNCTION advance_scoped_id(text, text, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION advance_block_mark(text, bigint) FROM PUBLIC;
"#,
    name = "admin_privileges",
    finalize
);
