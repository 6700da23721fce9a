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
pub use registry::{check_own_id_unleased, merge_loaded};

use pgrx::datum::Interval;
use pgrx::prelude::*;

use crate::args::{name_arg, required};
use crate::errors::{postgres_errors_as_raised, OrRaise, TicketError};
use ticket_core::leases;
use crate::names::Name;
use crate::clock::timestamptz_or_error;
use ticket_core::snowflake::Layout;

/// A ttl in ms; months count as 30 days (anything that long is refused).
fn ttl_ms(ttl: Option<Interval>) -> i64 {
    let ttl = required("ttl", ttl);
    let days = i64::from(ttl.months()) * 30 + i64::from(ttl.days());
    days.saturating_mul(86_400_000).saturating_add(ttl.micros().div_euclid(1000))
}

fn machine_id_arg(machine_id: Option<i32>) -> u16 {
    let id = required("machine_id", machine_id);
    // Any layout's: a lease is found by its id, and one granted in the
    // space this database recorded must stay renewable, releasable and
    // revocable whatever the configuration says now.
    Layout::WIDEST.check_machine_id(i64::from(id)).or_raise()
}

/// Lease a machine id for `ttl`: the id, the lease's fencing token, its
/// secret (renew and release need it), the time to stamp above, the expiry,
/// and the ID space: its epoch and machine bits.
#[pg_extern(name = "lease_machine_id", volatile, parallel_unsafe, schema = "pgticket")]
fn lease_machine_id_with_secret(
    holder: Option<Name<'_>>,
    ttl: default!(Option<Interval>, "'30 seconds'"),
) -> TableIterator<
    'static,
    (
        name!(machine_id, i32),
        name!(lease, i64),
        name!(secret, String),
        name!(not_before_ms, i64),
        name!(expires_at, TimestampWithTimeZone),
        name!(epoch_ms, i64),
        name!(machine_bits, i32),
    ),
> {
    postgres_errors_as_raised(|| {
        let holder = name_arg("holder", holder);
        let grant = registry::lease(holder, ttl_ms(ttl)).or_raise();
        TableIterator::once((
            i32::from(grant.machine_id),
            grant.lease,
            leases::secret_text(grant.secret),
            grant.not_before_ms,
            timestamptz_or_error(grant.expires_at_ms),
            grant.epoch_ms,
            grant.layout.machine_bits() as i32,
        ))
    })
}

fn secret_arg(secret: Option<&str>) -> u128 {
    leases::parse_secret(required("secret", secret)).or_raise()
}

/// Extend a live lease to `ttl` from now (never earlier than it ran); the
/// new expiry.
#[pg_extern(name = "renew_machine_id", volatile, parallel_unsafe, schema = "pgticket")]
fn renew_machine_id_with_secret(
    machine_id: Option<i32>,
    lease: Option<i64>,
    secret: Option<&str>,
    ttl: default!(Option<Interval>, "'30 seconds'"),
    last_issued_ms: default!(Option<i64>, "NULL"),
) -> TimestampWithTimeZone {
    postgres_errors_as_raised(|| {
        let id = machine_id_arg(machine_id);
        let lease = required("lease", lease);
        let secret = secret_arg(secret);
        timestamptz_or_error(registry::renew(id, lease, secret, ttl_ms(ttl), last_issued_ms).or_raise())
    })
}

/// End a lease now, reporting the last timestamp stamped with it.
#[pg_extern(name = "release_machine_id", volatile, parallel_unsafe, schema = "pgticket")]
fn release_machine_id_with_secret(
    machine_id: Option<i32>,
    lease: Option<i64>,
    secret: Option<&str>,
    last_issued_ms: default!(Option<i64>, "NULL"),
) {
    postgres_errors_as_raised(|| {
        let id = machine_id_arg(machine_id);
        let lease = required("lease", lease);
        let secret = secret_arg(secret);
        registry::release(id, lease, secret, last_issued_ms).or_raise()
    })
}

/// 0.2.0's lease functions (bound to these symbols) on this library, before
/// `ALTER EXTENSION pg_ticket UPDATE`: their leases have no secret, so
/// they are refused rather than served (SPEC §8 rule 9).
fn needs_update() -> ! {
    TicketError::StateTableUnfit(
        "machine-id leases need ALTER EXTENSION pg_ticket UPDATE: leases have had a secret since 0.3.0, and the catalog has 0.2.0's functions".into(),
    )
    .raise()
}

#[pg_extern(sql = false)]
fn lease_machine_id(_holder: Option<&str>, _ttl: Option<Interval>) -> TableIterator<'static, (name!(machine_id, i32),)> {
    needs_update()
}

#[pg_extern(sql = false)]
fn renew_machine_id(_machine_id: Option<i32>, _lease: Option<i64>, _ttl: Option<Interval>, _last: Option<i64>) -> TimestampWithTimeZone {
    needs_update()
}

#[pg_extern(sql = false)]
fn release_machine_id(_machine_id: Option<i32>, _lease: Option<i64>, _last: Option<i64>) {
    needs_update()
}

/// Admin: end the id's live lease now (its id stays unleased until the
/// lease's own expiry plus the margin). False if it had none.
#[pg_extern(name = "revoke_machine_id", volatile, parallel_unsafe, schema = "pgticket")]
fn revoke_machine_lease(machine_id: Option<i32>) -> bool {
    postgres_errors_as_raised(|| registry::revoke(machine_id_arg(machine_id)).or_raise())
}

/// Admin: a registry that holds off (after a start, a restore, or its
/// creation) grants at once — the administrator vouches that no lease of its
/// earlier life can still be live. False if it was not holding off.
#[pg_extern(volatile, parallel_unsafe, schema = "pgticket")]
fn end_lease_hold_off() -> bool {
    postgres_errors_as_raised(|| registry::end_hold_off().or_raise())
}

extension_sql!(
    r#"
CREATE VIEW pgticket.machine_ids AS
    SELECT l.machine_id, l.holder,
           CASE WHEN pg_catalog.pg_has_role(c.relowner, 'USAGE') THEN l.lease END AS lease,
           l.leased_at, l.expires_at, l.last_issued_ms,
           CASE WHEN l.revoked THEN 'revoked'
                WHEN l.ended_at IS NOT NULL THEN 'released'
                WHEN l.expires_at > pg_catalog.clock_timestamp() THEN 'held'
                ELSE 'expired' END AS state
      FROM pgticket.machine_id_leases l, pg_catalog.pg_class c
     WHERE c.oid OPERATOR(pg_catalog.=) 'pgticket.machine_id_leases'::pg_catalog.regclass;
COMMENT ON VIEW pgticket.machine_ids IS
    'Each machine id''s latest lease: holder, fencing token (shown to the registry''s owner only), times, last reported stamp, state';
REVOKE ALL ON pgticket.machine_ids FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgticket.lease_machine_id(text, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgticket.renew_machine_id(integer, bigint, text, interval, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgticket.release_machine_id(integer, bigint, text, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgticket.revoke_machine_id(integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgticket.end_lease_hold_off() FROM PUBLIC;
"#,
    name = "lease_views",
    requires = [lease_machine_id_with_secret, renew_machine_id_with_secret, release_machine_id_with_secret, revoke_machine_lease, end_lease_hold_off, "schema"]
);
