//! New scopes per role (SPEC §13.11, issue #24 item 5). Every scope, ticket
//! scope and block name is a permanent row: its mark must outlive any use
//! (a name removed would count from 1 again). So the rows one role can
//! create are capped by `pg_ticket.max_scopes_per_role` (superusers set
//! it; 0: no cap); superusers and the tables' owners are not counted.
//!
//! Counted in `pgticket.scope_quota`, in the creating transaction (a scope
//! rolled back counts nothing), in one of `SHARDS` rows per role chosen by
//! the backend's process id, so that sessions of one role creating scopes
//! at once seldom wait on each other's row. Room is checked before a row is
//! made and counted after; the sum read misses what other sessions have not
//! committed yet, so the cap can be passed by what is in flight at that
//! moment — a bound on disk use, not an exact count. Not dumped: role ids
//! differ between clusters, and a restored database counts anew.
//! Touches: `pgticket.scope_quota`, as its owner.

use pgrx::prelude::*;

use crate::errors::TicketError;
use crate::{settings, state_tables};

const SHARDS: i32 = 16;

/// The role creating a row now (before any switch to the tables' owner).
pub fn creator() -> pg_sys::Oid {
    unsafe { pg_sys::GetUserId() }
}

/// Is there room for one more row created by `role`? An error (53400)
/// if it created `pg_ticket.max_scopes_per_role` already. Checked before
/// the row is inserted, counted (`count`) after.
pub fn check_room(role: pg_sys::Oid) -> Result<(), TicketError> {
    let Some((table, cap)) = capped(role) else { return Ok(()) };
    let created = state_tables::as_owner_of(table, || {
        Spi::connect(|client| {
            client
                .select(
                    "SELECT coalesce(sum(scopes), 0)::pg_catalog.int8 FROM pgticket.scope_quota WHERE role OPERATOR(pg_catalog.=) $1",
                    Some(1),
                    &[role.into()],
                )?
                .first()
                .get_one::<i64>()
        })
    })
    .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot read pgticket.scope_quota: {e}"))
    .unwrap_or(0);
    if created >= cap {
        return Err(TicketError::TooManyScopes { role: role_name(role), created, cap });
    }
    Ok(())
}

/// Count one new row created by `role` (in this transaction).
pub fn count(role: pg_sys::Oid) {
    let Some((table, _)) = capped(role) else { return };
    let shard = unsafe { pg_sys::MyProcPid } % SHARDS;
    state_tables::as_owner_of(table, || {
        Spi::connect_mut(|client| {
            client
                .update(
                    "INSERT INTO pgticket.scope_quota AS q (role, shard, scopes) VALUES ($1, $2, 1) \
                     ON CONFLICT (role, shard) DO UPDATE SET scopes = q.scopes OPERATOR(pg_catalog.+) 1",
                    None,
                    &[role.into(), shard.into()],
                )
                .map(|_| ())
        })
    })
    .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot count a new scope: {e}"));
}

/// The quota table and the cap, if `role` is capped.
fn capped(role: pg_sys::Oid) -> Option<(state_tables::Table, i64)> {
    let cap = settings::max_scopes_per_role();
    if cap == 0 || unsafe { pg_sys::superuser_arg(role) } {
        return None;
    }
    let tables = state_tables::lookup()?;
    let table = tables.scope_quota?; // None on 0.2.0's objects
    (!tables.owners().contains(&role)).then_some((table, cap))
}

pub fn role_name(role: pg_sys::Oid) -> String {
    let name = unsafe { pg_sys::GetUserNameFromId(role, true) };
    if name.is_null() {
        return role.to_u32().to_string();
    }
    unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy().into_owned()
}
