//! `pgticket.status`: what this server's pg_ticket is and has done since it
//! started — the snowflake identity and clock, and counts of refusals and
//! waits — for monitoring; and `pgticket.marks`, the marks a role may see.
//!
//! It reads counters kept elsewhere: refusals and ticket waits in
//! `refusals` (where `errors` counts them), the snowflake waits in the
//! generator itself (`ticket_core::snowflake::Activity`).

use pgrx::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::clock::{now_unix_ms, timestamptz_of_unix_ms as timestamp};
use crate::errors::{postgres_errors_as_raised, TicketError};
use crate::names::{Name, Text};
use crate::refusals;
use crate::settings::{self, MachineId};
use crate::snowflake;
use crate::state_tables;
use ticket_core::rights::RightKind;
use ticket_core::snowflake::MAX_TIMESTAMP_MS;

const MS_PER_YEAR: f64 = 365.25 * 86_400_000.0;


/// One row: this server's status (see the view `pgticket.status`). Without
/// preloading only `preloaded` (false) is known.
#[pg_extern(name = "status_rows", volatile, parallel_safe, schema = "pgticket")]
fn ticket_status() -> TableIterator<
    'static,
    (
        name!(preloaded, bool),
        name!(epoch, Option<TimestampWithTimeZone>),
        name!(machine_id, Option<i32>),
        name!(last_snowflake_at, Option<TimestampWithTimeZone>),
        name!(reserved_until, Option<TimestampWithTimeZone>),
        name!(years_left, Option<f64>),
        name!(refusals_clock_behind, Option<i64>),
        name!(refusals_overflow, Option<i64>),
        name!(refusals_read_only, Option<i64>),
        name!(waits_full_millisecond, Option<i64>),
        name!(waits_clock_back, Option<i64>),
        name!(waits_ticket_refill, Option<i64>),
        name!(reset_at, Option<TimestampWithTimeZone>),
        name!(machine_lease, Option<i64>),
        name!(machine_lease_expires_at, Option<TimestampWithTimeZone>),
    ),
> {
    postgres_errors_as_raised(|| {
        let Some(c) = refusals::counters() else {
            return TableIterator::once((false, None, None, None, None, None, None, None, None, None, None, None, None, None, None));
        };
        let epoch = settings::epoch_unix_ms();
        let activity = snowflake::activity();
        let count = |a: &AtomicU64| Some(a.load(Ordering::Relaxed) as i64);
        let since_epoch = now_unix_ms() - epoch;
        let reset_at = c.reset_at.load(Ordering::Relaxed);
        // A leased id shows while the lease is held (NULL between leases).
        // The lease's token only to superusers: the view is PUBLIC, and a
        // token is what a holder proves itself with (SPEC §8 rule 9).
        let may_see_token = unsafe { pg_sys::superuser() };
        let (machine_id, lease) = match settings::machine_id() {
            MachineId::Fixed(id) => (Some(i32::from(id)), None),
            MachineId::Leased => {
                let s = snowflake::lease_snapshot();
                (s.machine_id.map(i32::from), s.machine_id.map(|_| (may_see_token.then_some(s.token), s.expires_at_unix_ms)))
            }
        };
        TableIterator::once((
            true,
            timestamp(epoch),
            machine_id,
            activity.last_millis.and_then(|ms| timestamp(epoch + ms as i64)),
            activity.reserved_until_millis.and_then(|ms| timestamp(epoch + ms as i64)),
            Some((MAX_TIMESTAMP_MS as i64 - since_epoch) as f64 / MS_PER_YEAR),
            count(&c.refusals_clock_behind),
            count(&c.refusals_overflow),
            count(&c.refusals_read_only),
            Some(activity.waits_full_millisecond as i64),
            Some(activity.waits_clock_back as i64),
            count(&c.waits_ticket_refill),
            (reset_at != 0).then(|| timestamp(reset_at)).flatten(),
            lease.and_then(|(token, _)| token),
            lease.and_then(|(_, expires)| timestamp(expires)),
        ))
    })
}

/// Where this server's machine id comes from: `setting`, `lease`, or
/// `default` (`pg_ticket.machine_id` left unset: two servers of one
/// keyspace both on 0 would share IDs). A function of its own, not a column
/// of `ticket_status()`, so that 0.3.0 keeps 0.2.0's signature and the view
/// is replaced, not dropped (views and grants built on it survive).
#[pg_extern(name = "machine_id_source", volatile, parallel_safe, schema = "pgticket")]
fn ticket_machine_id_source() -> Option<&'static str> {
    settings::preloaded().then(settings::machine_id_source)
}

/// Admin: zero the counters of `pgticket.status`.
#[pg_extern(name = "reset_status", volatile, parallel_unsafe, schema = "pgticket")]
fn reset_ticket_status() {
    postgres_errors_as_raised(|| {
        let Some(c) = refusals::counters() else {
            TicketError::NotPreloaded("pgticket.reset_status").raise();
        };
        for counter in [&c.refusals_clock_behind, &c.refusals_overflow, &c.refusals_read_only, &c.waits_ticket_refill] {
            counter.store(0, Ordering::Relaxed);
        }
        snowflake::reset_counters();
        c.reset_at.store(now_unix_ms(), Ordering::Relaxed);
    })
}

extension_sql!(
    r#"
CREATE VIEW pgticket.status AS SELECT s.*, pgticket.machine_id_source() AS machine_id_source,
    (SELECT machine_bits FROM pgticket.snowflake_id_space()) AS machine_bits FROM pgticket.status_rows() s;
COMMENT ON VIEW pgticket.status IS
    'pg_ticket on this server: snowflake identity and clock, refusals and waits since start';
GRANT SELECT ON pgticket.status TO PUBLIC;
REVOKE EXECUTE ON FUNCTION pgticket.reset_status() FROM PUBLIC;
"#,
    name = "status_view",
    requires = [ticket_status, ticket_machine_id_source, reset_ticket_status, "id_space", "schema"]
);

/// The rows of `pgticket.marks`: every scoped counter, block name and ticket
/// scope of this database with its committed mark (as this statement's
/// snapshot sees it), those the current user may use only (SPEC §16).
///
/// A function, not a view over the tables (#46 item 3): a caller's
/// leakproof condition on a security-barrier view is pushed below its
/// filter, into the tables' index scans, and `EXPLAIN ANALYZE`'s "Rows
/// Removed by Filter" then counted the rows of other roles' scopes that
/// matched it (1 160 EXPLAINs recovered every series name of another
/// shop). A caller's condition on a function's rows sees only what it
/// returns. Each table is read as its owner, the rights decided after,
/// as the current user.
#[pg_extern(name = "marks_rows", stable, parallel_restricted, schema = "pgticket")]
fn marks_rows() -> TableIterator<
    'static,
    (
        name!(kind, String),
        name!(queue, Option<Text>),
        name!(domain, Option<Text>),
        name!(block_name, Option<Text>),
        name!(mark, i64),
        name!(remaining, i64),
        name!(max_mark, i64),
    ),
> {
    postgres_errors_as_raised(|| {
        let tables = state_tables::current();
        let limit = if tables.has_limits { "max_mark" } else { "9223372036854775807::pg_catalog.int8" };
        let bytes = |column: &str| format!("pg_catalog.convert_to({column}, pg_catalog.getdatabaseencoding())");
        let mut sources = vec![
            ("scoped_id", RightKind::Scope, tables.scoped_counters, format!("SELECT {}, {}, mark, {limit} FROM pgticket.scoped_counters", bytes("queue"), bytes("domain"))),
            ("block", RightKind::Block, tables.blocks, format!("SELECT {}, NULL::pg_catalog.bytea, mark, {limit} FROM pgticket.blocks", bytes("name"))),
        ];
        if let Some(tickets) = tables.tickets {
            sources.push((
                "ticket",
                RightKind::Scope,
                tickets,
                format!("SELECT {}, {}, mark, 9223372036854775807::pg_catalog.int8 FROM pgticket.tickets", bytes("queue"), bytes("domain")),
            ));
        }
        let mut rows = Vec::new();
        for (kind, right, table, sql) in sources {
            let read: Vec<(Vec<u8>, Option<Vec<u8>>, i64, i64)> = state_tables::as_owner_of(table, || {
                Spi::connect(|client| {
                    client
                        .select(&sql, None, &[])?
                        .map(|row| Ok((row.get::<Vec<u8>>(1)?.unwrap_or_default(), row.get::<Vec<u8>>(2)?, row.get::<i64>(3)?.unwrap_or(0), row.get::<i64>(4)?.unwrap_or(i64::MAX))))
                        .collect::<Result<Vec<_>, pgrx::spi::Error>>()
                })
            })
            .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot read the marks: {e}"));
            for (a, b, mark, max_mark) in read {
                let domain = b.as_deref().unwrap_or(b"");
                if crate::rights::check(right, Name(&a), Name(domain), String::new).is_err() {
                    continue;
                }
                let remaining = max_mark.saturating_sub(mark);
                rows.push(match right {
                    RightKind::Block | RightKind::PublicKey => (kind.to_string(), None, None, Some(Text(a)), mark, remaining, max_mark),
                    RightKind::Scope => (kind.to_string(), Some(Text(a)), b.map(Text), None, mark, remaining, max_mark),
                });
            }
        }
        TableIterator::new(rows)
    })
}
