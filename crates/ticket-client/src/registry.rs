//! The lease protocol's SQL calls (SPEC §8), each in its own autocommit
//! statement: the reply arrives only after the registry's durable commit,
//! so a reply is a lease the registry will remember. pg_ticket's functions
//! are called in the registry's schema (`Conn::registry_schema`).

use crate::clock::wall_ms;
use crate::connect::{CallError, Conn, Param, Row};
pub use ticket_core::leases::Grant;
use ticket_core::leases::{parse_secret, secret_text};
use ticket_core::snowflake::Layout;

/// The SQLSTATEs the protocol answers with.
const OBJECT_NOT_IN_PREREQUISITE_STATE: &str = "55000";
const INVALID_PARAMETER_VALUE: &str = "22023";

fn ttl_text(ttl_ms: i64) -> String {
    format!("{ttl_ms} milliseconds")
}

/// Unix ms on the registry's clock, read during the call (for the skew).
const REGISTRY_NOW: &str = "(extract(epoch FROM pg_catalog.clock_timestamp()) * 1000)::bigint";

/// A setting of the registry's that is an interval, in ms.
fn setting_ms(name: &str) -> String {
    format!("(extract(epoch FROM pg_catalog.current_setting('{name}')::interval) * 1000)::bigint")
}

/// The two clocks around one call: the registry's during it, and this
/// holder's halfway between sending it and reading its reply (the skew is
/// the difference; measured around the protocol's own statement only, not
/// the connecting and set-up before it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clocks {
    pub registry_ms: i64,
    pub local_ms: i64,
}

/// `query_one` with the clocks around it; the registry's clock is the
/// statement's column `registry_column`.
fn timed(conn: &mut Conn, sql: &str, params: &[Param<'_>], registry_column: usize, stop: &dyn Fn() -> bool) -> Result<(Row, Clocks), CallError> {
    let sent = wall_ms();
    let row = conn.query_one(sql, params, stop)?;
    let local_ms = sent + (wall_ms() - sent) / 2;
    let registry_ms = row.int(registry_column)?;
    Ok((row, Clocks { registry_ms, local_ms }))
}

/// A grant, and the clocks around the call.
pub fn lease(conn: &mut Conn, holder: &str, ttl_ms: i64, stop: &dyn Fn() -> bool) -> Result<(Grant, Clocks), CallError> {
    let schema = conn.registry_schema(stop)?;
    // The margin is read after the call has loaded the library.
    let (row, clocks) = timed(
        conn,
        &format!(
            "SELECT l.machine_id, l.lease, l.secret, l.not_before_ms, (extract(epoch FROM l.expires_at) * 1000)::bigint, l.epoch_ms, \
                    l.machine_bits, {}, {REGISTRY_NOW} \
               FROM {schema}.lease_machine_id($1, $2::interval) l",
            setting_ms("pg_ticket.lease_margin")
        ),
        &[holder.into(), (&ttl_text(ttl_ms)).into()],
        8,
        stop,
    )?;
    let layout = Layout::new(row.int(6)?).map_err(|e| CallError::Unexpected(format!("the registry's layout: {e}")))?;
    let machine_id = layout.check_machine_id(row.int(0)?).map_err(|e| CallError::Unexpected(e.to_string()))?;
    let grant = Grant {
        machine_id,
        lease: row.int(1)?,
        secret: parse_secret(row.text(2)?).map_err(|e| CallError::Unexpected(e.to_string()))?,
        not_before_ms: row.int(3)?,
        expires_at_ms: row.int(4)?,
        epoch_ms: row.int(5)?,
        layout,
        margin_ms: row.int(7)?,
    };
    Ok((grant, clocks))
}

/// The new expiry (Unix ms, the registry's clock), and the clocks around
/// the call.
pub fn renew(conn: &mut Conn, grant: &Grant, ttl_ms: i64, last_issued_ms: Option<i64>, stop: &dyn Fn() -> bool) -> Result<(i64, Clocks), CallError> {
    let schema = conn.registry_schema(stop)?;
    let (row, clocks) = timed(
        conn,
        &format!("SELECT (extract(epoch FROM {schema}.renew_machine_id($1, $2, $3, $4::interval, $5)) * 1000)::bigint, {REGISTRY_NOW}"),
        &[i32::from(grant.machine_id).into(), grant.lease.into(), (&secret_text(grant.secret)).into(), (&ttl_text(ttl_ms)).into(), last_issued_ms.into()],
        1,
        stop,
    )?;
    Ok((row.int(0)?, clocks))
}

pub fn release(conn: &mut Conn, grant: &Grant, last_issued_ms: Option<i64>, stop: &dyn Fn() -> bool) -> Result<(), CallError> {
    let schema = conn.registry_schema(stop)?;
    conn.query_one(
        &format!("SELECT 1 FROM {schema}.release_machine_id($1, $2, $3, $4)"),
        &[i32::from(grant.machine_id).into(), grant.lease.into(), (&secret_text(grant.secret)).into(), last_issued_ms.into()],
        stop,
    )?;
    Ok(())
}

/// The registry's `pg_ticket.lease_max_ttl` (after a ttl was refused as
/// longer than it allows).
pub fn max_ttl_ms(conn: &mut Conn, stop: &dyn Fn() -> bool) -> Result<i64, CallError> {
    conn.query_one(&format!("SELECT {}", setting_ms("pg_ticket.lease_max_ttl")), &[], stop)?.int(0)
}

/// Did the registry say this lease is over (expired, released, revoked,
/// superseded, never granted: SQLSTATE 55000 from a renewal)? Anything
/// else — a restart (57P01), a cancel (57014), a conflict, a lost
/// connection, no answer — may pass: the holder retries until its own
/// reckoning runs out.
pub fn lease_is_over(e: &CallError) -> bool {
    e.code() == Some(OBJECT_NOT_IN_PREREQUISITE_STATE)
}

/// A refusal no retry can change (#48 item 3): the role may not call the
/// registry's functions, they do not exist there, or an argument is wrong
/// (but not a ttl past the registry's cap: that one is lowered and asked
/// again). The text says what to do.
pub fn permanent_refusal(e: &CallError) -> Option<String> {
    let message = e.message();
    match e.code()? {
        "42501" => Some(format!(
            "{message}: the registry's role needs GRANT EXECUTE ON FUNCTION pgticket.lease_machine_id(text, interval), \
             pgticket.renew_machine_id(integer, bigint, text, interval, bigint), pgticket.release_machine_id(integer, bigint, text, bigint) \
             (docs/leases.md, \"Registry settings and privileges\")"
        )),
        "42883" | "3F000" => Some(format!(
            "{message}: pg_ticket's registry functions are not there (CREATE EXTENSION pg_ticket, or ALTER EXTENSION pg_ticket UPDATE, in the registry's database)"
        )),
        "55000" if message.contains("not installed") => Some(message),
        // A holder the registry's encoding cannot store (helper-11, #48).
        "22P05" | "22021" => Some(format!("{message}: the holder's name has a character the registry's database encoding cannot store")),
        INVALID_PARAMETER_VALUE if !ttl_refused(e) => Some(message),
        _ => None,
    }
}

/// Did the registry refuse the ttl as longer than its
/// `pg_ticket.lease_max_ttl` (22023 naming that setting; other 22023s are
/// about other arguments)?
pub fn ttl_refused(e: &CallError) -> bool {
    e.code() == Some(INVALID_PARAMETER_VALUE) && e.message().contains("pg_ticket.lease_max_ttl")
}
