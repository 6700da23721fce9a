//! The lease protocol's SQL calls (SPEC §8), each in its own autocommit
//! statement: the reply arrives only after the registry's durable commit,
//! so a reply is a lease the registry will remember.

use postgres::Client;
pub use ticket_core::leases::Grant;

fn ttl_text(ttl_ms: i64) -> String {
    format!("{ttl_ms} milliseconds")
}

pub fn lease(client: &mut Client, holder: &str, ttl_ms: i64) -> Result<Grant, postgres::Error> {
    // The setting is read after the call has loaded the library.
    let row = client.query_one(
        "SELECT l.machine_id, l.lease, l.not_before_ms, (extract(epoch FROM l.expires_at) * 1000)::bigint, l.epoch_ms,
                (extract(epoch FROM current_setting('pg_ticket.lease_margin')::interval) * 1000)::bigint
           FROM lease_machine_id($1, $2::text::interval) l",
        &[&holder, &ttl_text(ttl_ms)],
    )?;
    Ok(Grant {
        machine_id: row.get::<_, i32>(0) as u16,
        lease: row.get(1),
        not_before_ms: row.get(2),
        expires_at_ms: row.get(3),
        epoch_ms: row.get(4),
        margin_ms: row.get(5),
    })
}

/// The new expiry (Unix ms, the registry's clock).
pub fn renew(client: &mut Client, grant: &Grant, ttl_ms: i64, last_issued_ms: Option<i64>) -> Result<i64, postgres::Error> {
    let row = client.query_one(
        "SELECT (extract(epoch FROM renew_machine_id($1, $2, $3::text::interval, $4)) * 1000)::bigint",
        &[&i32::from(grant.machine_id), &grant.lease, &ttl_text(ttl_ms), &last_issued_ms],
    )?;
    Ok(row.get(0))
}

pub fn release(client: &mut Client, grant: &Grant, last_issued_ms: Option<i64>) -> Result<(), postgres::Error> {
    client.execute("SELECT release_machine_id($1, $2, $3)", &[&i32::from(grant.machine_id), &grant.lease, &last_issued_ms])?;
    Ok(())
}

/// Did the registry answer with a refusal (an SQLSTATE), rather than the
/// connection failing (when the call may or may not have happened)?
pub fn is_refusal(e: &postgres::Error) -> bool {
    e.code().is_some()
}
