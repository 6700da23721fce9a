//! The SQL-facing functions: check arguments, call the core, convert.
//! Not STRICT: a NULL argument is an error (22004), not a NULL result.
//! Each body runs inside `postgres_errors_as_raised`, so an ERROR that
//! PostgreSQL raises under it reaches the client as PostgreSQL raised it.

use pgrx::prelude::*;

use crate::args::{name_arg, required, scope_args, unix_ms_of};
use crate::clock::timestamptz_or_error;
use crate::counters::{self, Kind};
use crate::errors::{postgres_errors_as_raised, OrRaise, TicketError};
use crate::names::Name;
use crate::{leases, settings, snowflake};
use ticket_core::counter::{check_block_size, CounterError};

/// Blocks have one name; the second key part is empty.
const NO_NAME: Name<'static> = Name(b"");

/// The next value of the counter `(queue, domain)`, created at 1 on first use.
#[pg_extern(volatile, parallel_unsafe)]
fn next_scoped_id(queue: Option<Name<'_>>, domain: Option<Name<'_>>) -> i64 {
    postgres_errors_as_raised(|| {
        if let (Some(queue), Some(domain)) = (queue, domain) {
            if let Some(id) = counters::take_again(Kind::Scope, queue, domain, 1) {
                return id;
            }
        }
        let (queue, domain) = scope_args(queue, domain);
        counters::take(Kind::Scope, queue, domain, 1).or_raise()
    })
}

/// Reserve `size` consecutive IDs from the block counter `name`.
#[pg_extern(volatile, parallel_unsafe)]
fn reserve_block(
    name: Option<Name<'_>>,
    size: Option<i64>,
) -> TableIterator<'static, (name!(first_id, i64), name!(last_id, i64))> {
    postgres_errors_as_raised(|| {
        let name = name_arg("name", name);
        let size = required("size", size);
        check_block_size(size).or_raise();
        let ceiling = settings::max_block_size();
        if size > ceiling {
            TicketError::from(CounterError::SizeOverCeiling { size, limit: ceiling }).about(Kind::Block.label(name, NO_NAME)).raise();
        }
        let last = counters::take(Kind::Block, name, NO_NAME, size).or_raise();
        TableIterator::once((last - size + 1, last))
    })
}

/// The mark of `(queue, domain)` as this transaction sees it: the last value
/// handed out, 0 if never used. Takes nothing and locks nothing.
#[pg_extern(volatile, parallel_unsafe)]
fn current_scoped_id(queue: Option<Name<'_>>, domain: Option<Name<'_>>) -> i64 {
    postgres_errors_as_raised(|| {
        let (queue, domain) = scope_args(queue, domain);
        counters::current(Kind::Scope, queue, domain).or_raise()
    })
}

/// The mark of block counter `name`: the last ID reserved, 0 if never used.
#[pg_extern(volatile, parallel_unsafe)]
fn current_block_mark(name: Option<Name<'_>>) -> i64 {
    postgres_errors_as_raised(|| counters::current(Kind::Block, name_arg("name", name), NO_NAME).or_raise())
}

/// Admin: move the mark of `(queue, domain)` forward to `mark` (never back),
/// e.g. after restoring an old backup or importing from another system.
#[pg_extern(volatile, parallel_unsafe, schema = "pgticket")]
fn advance_scoped_id(queue: Option<Name<'_>>, domain: Option<Name<'_>>, mark: Option<i64>) -> i64 {
    postgres_errors_as_raised(|| {
        let (queue, domain) = scope_args(queue, domain);
        counters::advance(Kind::Scope, queue, domain, required("mark", mark)).or_raise()
    })
}

/// Admin: move the mark of block counter `name` forward to `mark`.
#[pg_extern(name = "advance_block", volatile, parallel_unsafe, schema = "pgticket")]
fn advance_block_mark(name: Option<Name<'_>>, mark: Option<i64>) -> i64 {
    postgres_errors_as_raised(|| {
        let name = name_arg("name", name);
        counters::advance(Kind::Block, name, NO_NAME, required("mark", mark)).or_raise()
    })
}

/// Admin: the highest value `(queue, domain)` may hand out (creating the
/// scope if new), e.g. 2147483647 for a series feeding an `integer` column.
/// Never below the values already handed out. Returns the limit.
#[pg_extern(name = "set_scoped_id_limit", volatile, parallel_unsafe, schema = "pgticket")]
fn set_scoped_limit(queue: Option<Name<'_>>, domain: Option<Name<'_>>, max: Option<i64>) -> i64 {
    postgres_errors_as_raised(|| {
        let (queue, domain) = scope_args(queue, domain);
        counters::limit(Kind::Scope, queue, domain, required("max", max)).or_raise()
    })
}

/// Admin: the highest ID block counter `name` may reserve.
#[pg_extern(volatile, parallel_unsafe, schema = "pgticket")]
fn set_block_limit(name: Option<Name<'_>>, max: Option<i64>) -> i64 {
    postgres_errors_as_raised(|| {
        let name = name_arg("name", name);
        counters::limit(Kind::Block, name, NO_NAME, required("max", max)).or_raise()
    })
}

/// Admin: close a scoped counter for good, keeping its mark (its limit
/// becomes its mark: a later take is 2200H, and the name never counts from
/// 1 again). The mark.
#[pg_extern(name = "retire_scoped_id", volatile, parallel_unsafe, schema = "pgticket")]
fn retire_scope(queue: Option<Name<'_>>, domain: Option<Name<'_>>) -> i64 {
    postgres_errors_as_raised(|| {
        let (queue, domain) = scope_args(queue, domain);
        counters::retire(Kind::Scope, queue, domain).or_raise()
    })
}

/// Admin: close a block name for good, keeping its mark. The mark.
#[pg_extern(volatile, parallel_unsafe, schema = "pgticket")]
fn retire_block(name: Option<Name<'_>>) -> i64 {
    postgres_errors_as_raised(|| {
        let name = name_arg("name", name);
        counters::retire(Kind::Block, name, NO_NAME).or_raise()
    })
}

/// A 64-bit time-ordered ID from this server's shared generator.
#[pg_extern(volatile, parallel_unsafe)]
fn snowflake_id() -> i64 {
    postgres_errors_as_raised(|| snowflake::next_id(leases::check_own_id_unleased))
}

/// The parts of a snowflake ID, read with this server's epoch. STABLE, not
/// IMMUTABLE: the epoch is a server setting.
#[pg_extern(stable, parallel_safe)]
fn snowflake_decode(
    id: Option<i64>,
) -> TableIterator<'static, (name!(created_at, TimestampWithTimeZone), name!(machine_id, i32), name!(sequence, i32))> {
    let (unix_ms, machine_id, sequence) = snowflake::decode(required("id", id));
    TableIterator::once((timestamptz_or_error(unix_ms), i32::from(machine_id), i32::from(sequence)))
}

/// The lowest snowflake ID any machine can have in the millisecond of `at`
/// (machine 0, sequence 0): `id >= snowflake_min_id(a)` is an index range.
#[pg_extern(stable, parallel_safe)]
fn snowflake_min_id(at: Option<TimestampWithTimeZone>) -> i64 {
    snowflake::id_range_of_millisecond(unix_ms_of(at), "snowflake_min_id").0
}

/// The highest snowflake ID any machine can have in the millisecond of `at`
/// (the last machine id and sequence: all 22 low bits set, in every layout).
#[pg_extern(stable, parallel_safe)]
fn snowflake_max_id(at: Option<TimestampWithTimeZone>) -> i64 {
    snowflake::id_range_of_millisecond(unix_ms_of(at), "snowflake_max_id").1
}

