//! The lease protocol's SQL calls (SPEC §8), each in its own autocommit
//! statement: the reply arrives only after the registry's durable commit,
//! so a reply is a lease the registry will remember.

use crate::connect::{CallError, Conn};
pub use ticket_core::leases::Grant;
use ticket_core::leases::{parse_secret, secret_text};

fn ttl_text(ttl_ms: i64) -> String {
    format!("{ttl_ms} milliseconds")
}

/// Unix ms on the registry's clock, read during the call (for the skew).
const REGISTRY_NOW: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// A grant, and the registry's clock during the call.
pub fn lease(conn: &mut Conn, holder: &str, ttl_ms: i64, stop: &dyn Fn() -> bool) -> Result<(Grant, i64), CallError> {
    // The setting is read after the call has loaded the library.
    let row = conn.query_one(
        &format!("SELECT l.machine_id, l.lease, l.secret, l.not_before_ms, (extract(epoch FROM l.expires_at) * 1000)::bigint, l.epoch_ms,
                (extract(epoch FROM current_setting('pg_ticket.lease_margin')::interval) * 1000)::bigint, {REGISTRY_NOW}
           FROM lease_machine_id($1, $2::text::interval) l"),
        &[&holder, &ttl_text(ttl_ms)],
        stop,
    )?;
    let secret: String = row.get(2);
    let grant = Grant {
        machine_id: row.get::<_, i32>(0) as u16,
        lease: row.get(1),
        // The registry made it; one it cannot have made is its bug, and
        // a lease that cannot be renewed is simply left to expire.
        secret: parse_secret(&secret).unwrap_or_default(),
        not_before_ms: row.get(3),
        expires_at_ms: row.get(4),
        epoch_ms: row.get(5),
        margin_ms: row.get(6),
    };
    Ok((grant, row.get(7)))
}

/// The new expiry (Unix ms, the registry's clock), and the registry's clock
/// during the call.
pub fn renew(conn: &mut Conn, grant: &Grant, ttl_ms: i64, last_issued_ms: Option<i64>, stop: &dyn Fn() -> bool) -> Result<(i64, i64), CallError> {
    let row = conn.query_one(
        &format!("SELECT (extract(epoch FROM renew_machine_id($1, $2, $3, $4::text::interval, $5)) * 1000)::bigint, {REGISTRY_NOW}"),
        &[&i32::from(grant.machine_id), &grant.lease, &secret_text(grant.secret), &ttl_text(ttl_ms), &last_issued_ms],
        stop,
    )?;
    Ok((row.get(0), row.get(1)))
}

pub fn release(conn: &mut Conn, grant: &Grant, last_issued_ms: Option<i64>, stop: &dyn Fn() -> bool) -> Result<(), CallError> {
    conn.query_one(
        "SELECT 1 FROM release_machine_id($1, $2, $3, $4)",
        &[&i32::from(grant.machine_id), &grant.lease, &secret_text(grant.secret), &last_issued_ms],
        stop,
    )?;
    Ok(())
}

/// The registry's `pg_ticket.lease_max_ttl` (after a ttl was refused as
/// longer than it allows).
pub fn max_ttl_ms(conn: &mut Conn, stop: &dyn Fn() -> bool) -> Result<i64, CallError> {
    let row = conn.query_one("SELECT (extract(epoch FROM current_setting('pg_ticket.lease_max_ttl')::interval) * 1000)::bigint", &[], stop)?;
    Ok(row.get(0))
}

/// Did the registry say this lease is over (expired, released, revoked,
/// superseded, never granted: SQLSTATE 55000 from a renewal)? Anything
/// else — a restart (57P01), a cancel (57014), a conflict, a lost
/// connection, no answer — may pass: the holder retries until its own
/// reckoning runs out.
pub fn lease_is_over(e: &CallError) -> bool {
    e.code() == Some(&tokio_postgres::error::SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE)
}

/// Did the registry refuse the ttl (22023: longer than its
/// `pg_ticket.lease_max_ttl`)?
pub fn ttl_refused(e: &CallError) -> bool {
    e.code() == Some(&tokio_postgres::error::SqlState::INVALID_PARAMETER_VALUE)
}
