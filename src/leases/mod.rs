//! Machine-id leases (SPEC §8): a registry that hands snowflake machine ids
//! to processes (and servers) for a time, so that no two live generators
//! share one.
//!
//! - `registry`: the table access, the concurrency of grants, and the
//!   registry's identity (the hold-off after a restore or promotion).
//! - this file: the SQL functions and the view.
//!
//! The rules themselves (ttl bounds, which id, when an id frees,
//! `not_before_ms`, who may renew) are `ticket_core::leases`, shared with
//! `crates/ticket-client`. Touches only `pgticket.machine_id_leases`,
//! `pgticket.lease_registry` and `pgticket.lease_tokens`.

mod registry;

use pgrx::datum::Interval;
use pgrx::prelude::*;

use crate::api::{name_arg, required};
use crate::errors::{postgres_errors_as_raised, OrRaise};
use crate::names::Name;
use crate::snowflake::timestamptz_or_error;

/// A ttl in ms; months count as 30 days (anything that long is refused).
fn ttl_ms(ttl: Option<Interval>) -> i64 {
    let ttl = required("ttl", ttl);
    let days = i64::from(ttl.months()) * 30 + i64::from(ttl.days());
    days.saturating_mul(86_400_000).saturating_add(ttl.micros().div_euclid(1000))
}

fn machine_id_arg(machine_id: Option<i32>) -> u16 {
    let id = required("machine_id", machine_id);
    ticket_core::snowflake::check_machine_id(i64::from(id)).or_raise()
}

/// Lease a machine id for `ttl`: the id, the lease's fencing token, the
/// time to stamp above, the expiry, and the ID space's epoch.
#[pg_extern(volatile, parallel_unsafe)]
fn lease_machine_id(
    holder: Option<Name<'_>>,
    ttl: default!(Option<Interval>, "'60 seconds'"),
) -> TableIterator<
    'static,
    (
        name!(machine_id, i32),
        name!(lease, i64),
        name!(not_before_ms, i64),
        name!(expires_at, TimestampWithTimeZone),
        name!(epoch_ms, i64),
    ),
> {
    postgres_errors_as_raised(|| {
        let holder = name_arg("holder", holder);
        let grant = registry::lease(holder, ttl_ms(ttl)).or_raise();
        TableIterator::once((
            i32::from(grant.machine_id),
            grant.lease,
            grant.not_before_ms,
            timestamptz_or_error(grant.expires_at_ms),
            grant.epoch_ms,
        ))
    })
}

/// Extend a live lease by `ttl` from now; the new expiry.
#[pg_extern(volatile, parallel_unsafe)]
fn renew_machine_id(
    machine_id: Option<i32>,
    lease: Option<i64>,
    ttl: default!(Option<Interval>, "'60 seconds'"),
    last_issued_ms: default!(Option<i64>, "NULL"),
) -> TimestampWithTimeZone {
    postgres_errors_as_raised(|| {
        let id = machine_id_arg(machine_id);
        let lease = required("lease", lease);
        timestamptz_or_error(registry::renew(id, lease, ttl_ms(ttl), last_issued_ms).or_raise())
    })
}

/// End a lease now, reporting the last timestamp stamped with it.
#[pg_extern(volatile, parallel_unsafe)]
fn release_machine_id(machine_id: Option<i32>, lease: Option<i64>, last_issued_ms: default!(Option<i64>, "NULL")) {
    postgres_errors_as_raised(|| {
        let id = machine_id_arg(machine_id);
        let lease = required("lease", lease);
        registry::release(id, lease, last_issued_ms).or_raise()
    })
}

/// Admin: end the id's live lease now (its id stays unleased until the
/// lease's own expiry plus the margin). False if it had none.
#[pg_extern(volatile, parallel_unsafe)]
fn revoke_machine_lease(machine_id: Option<i32>) -> bool {
    postgres_errors_as_raised(|| registry::revoke(machine_id_arg(machine_id)).or_raise())
}

extension_sql!(
    r#"
CREATE VIEW pgticket.machine_leases AS
    SELECT machine_id, holder, lease, leased_at, expires_at, last_issued_ms,
           CASE WHEN revoked THEN 'revoked'
                WHEN ended_at IS NOT NULL THEN 'released'
                WHEN expires_at > pg_catalog.clock_timestamp() THEN 'held'
                ELSE 'expired' END AS state
      FROM pgticket.machine_id_leases;
COMMENT ON VIEW pgticket.machine_leases IS
    'Each machine id''s latest lease: holder, fencing token, times, last reported stamp, state';
REVOKE ALL ON pgticket.machine_leases FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION lease_machine_id(text, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION renew_machine_id(integer, bigint, interval, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION release_machine_id(integer, bigint, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION revoke_machine_lease(integer) FROM PUBLIC;
"#,
    name = "lease_views",
    requires = [lease_machine_id, renew_machine_id, release_machine_id, revoke_machine_lease, "schema"]
);
