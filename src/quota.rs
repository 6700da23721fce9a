//! New scopes per role (SPEC §13.11, issue #24 item 5). Every scope, ticket
//! scope and block name is a permanent row: its mark must outlive any use
//! (a name removed would count from 1 again). So the rows one role creates
//! in a database are capped by `pg_ticket.max_scopes_per_role` (superusers
//! set it; 0: no cap); superusers and the tables' owners are not counted.
//!
//! Counted in `pgticket.scope_quota`: per role, a few rows that are only
//! ever added to, never waited for — a transaction adds what it created to
//! a row nobody else holds (`FOR UPDATE SKIP LOCKED`, else a new row), once,
//! at its pre-commit, so no scope waits on another (§13.5) and a bulk
//! insert into new scopes costs one write. Until then the transaction keeps
//! its new rows in memory, per subtransaction (a savepoint rolled back
//! takes its rows and their count with it). Room is checked before each new
//! row: the committed sum, read once a transaction, plus what the
//! transaction made. Other transactions' uncommitted rows are not seen, so
//! concurrent transactions of one role can pass the cap by what each has in
//! flight — a bound on disk use, not an exact count. Not dumped: role ids
//! differ between clusters, and a restored database counts anew.
//!
//! The ticket worker counts the scopes it creates for the role that asked
//! (`count_now`), in its own transaction, with the same never-waiting write.
//! Touches: `pgticket.scope_quota`, as its owner.

use pgrx::prelude::*;
use std::cell::RefCell;

use crate::errors::TicketError;
use crate::{settings, state_tables};

#[derive(Default)]
struct Pending {
    /// (subtransaction, role) of every row this transaction created.
    created: Vec<(pg_sys::SubTransactionId, pg_sys::Oid)>,
    /// Committed sums read this transaction, per role.
    committed: Vec<(pg_sys::Oid, i64)>,
}

thread_local! {
    static PENDING: RefCell<Pending> = RefCell::new(Pending::default());
}

/// The role creating a row now (before any switch to the tables' owner).
pub fn creator() -> pg_sys::Oid {
    unsafe { pg_sys::GetUserId() }
}

/// The cap `role` runs under in this session (0: none).
pub fn session_cap() -> i64 {
    settings::max_scopes_per_role()
}

/// The quota table, if `role` is capped at `cap`.
fn capped(role: pg_sys::Oid, cap: i64) -> Option<state_tables::Table> {
    if cap == 0 || unsafe { pg_sys::superuser_arg(role) } {
        return None;
    }
    let tables = state_tables::lookup()?;
    let table = tables.scope_quota?; // None on 0.2.0's objects
    (!tables.owners().contains(&role)).then_some(table)
}

/// The committed count of `role` (a plain read: it never waits).
fn committed(table: state_tables::Table, role: pg_sys::Oid) -> i64 {
    state_tables::as_owner_of(table, || {
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
    .unwrap_or(0)
}

fn refusal(role: pg_sys::Oid, created: i64, cap: i64) -> TicketError {
    TicketError::TooManyScopes { role: role_name(role), created, cap }
}

/// Is there room for one more row created by `role` in this transaction?
/// 53400 if its committed rows and this transaction's reach the cap.
pub fn check_room(role: pg_sys::Oid) -> Result<(), TicketError> {
    let cap = session_cap();
    let Some(table) = capped(role, cap) else { return Ok(()) };
    let seen = PENDING.with(|p| p.borrow().committed.iter().find(|(r, _)| *r == role).map(|(_, n)| *n));
    let committed = seen.unwrap_or_else(|| {
        let n = committed(table, role);
        PENDING.with(|p| p.borrow_mut().committed.push((role, n)));
        n
    });
    let mine = PENDING.with(|p| p.borrow().created.iter().filter(|(_, r)| *r == role).count() as i64);
    if committed + mine >= cap {
        return Err(refusal(role, committed + mine, cap));
    }
    Ok(())
}

/// `role` created a row in this (sub)transaction.
pub fn created(role: pg_sys::Oid) {
    if capped(role, session_cap()).is_some() {
        let subxact = unsafe { pg_sys::GetCurrentSubTransactionId() };
        PENDING.with(|p| p.borrow_mut().created.push((subxact, role)));
    }
}

pub fn on_subxact_commit(mine: pg_sys::SubTransactionId, parent: pg_sys::SubTransactionId) {
    PENDING.with(|p| {
        for entry in p.borrow_mut().created.iter_mut().filter(|(s, _)| *s == mine) {
            entry.0 = parent;
        }
    });
}

pub fn on_subxact_abort(mine: pg_sys::SubTransactionId) {
    PENDING.with(|p| p.borrow_mut().created.retain(|(s, _)| *s != mine));
}

/// Did this transaction create rows still to be counted?
pub fn pending() -> bool {
    PENDING.with(|p| !p.borrow().created.is_empty())
}

/// Pre-commit: add what this transaction created, per role.
pub fn flush() {
    let created = PENDING.with(|p| std::mem::take(&mut p.borrow_mut().created));
    let mut roles: Vec<pg_sys::Oid> = created.iter().map(|(_, r)| *r).collect();
    roles.sort_unstable_by_key(|r| r.to_u32());
    roles.dedup();
    for role in roles {
        let n = created.iter().filter(|(_, r)| *r == role).count() as i64;
        if let Some(table) = state_tables::lookup().and_then(|t| t.scope_quota) {
            add(table, role, n);
        }
    }
}

/// Commit or abort: nothing pending any more.
pub fn forget() {
    PENDING.with(|p| *p.borrow_mut() = Pending::default());
}

/// Add `n` to one of `role`'s rows that no other transaction holds, or to a
/// new one: never a wait.
fn add(table: state_tables::Table, role: pg_sys::Oid, n: i64) {
    state_tables::as_owner_of(table, || {
        Spi::connect_mut(|client| {
            let updated = client.update(
                "UPDATE pgticket.scope_quota q SET scopes = q.scopes OPERATOR(pg_catalog.+) $2 \
                   FROM (SELECT shard FROM pgticket.scope_quota WHERE role OPERATOR(pg_catalog.=) $1 \
                          ORDER BY shard FOR UPDATE SKIP LOCKED LIMIT 1) free \
                  WHERE q.role OPERATOR(pg_catalog.=) $1 AND q.shard OPERATOR(pg_catalog.=) free.shard",
                None,
                &[role.into(), n.into()],
            )?;
            if updated.len() > 0 {
                return Ok(());
            }
            // None, or all held: a row of its own (a random shard; a clash
            // only picks another).
            loop {
                let inserted = client.update(
                    "INSERT INTO pgticket.scope_quota (role, shard, scopes) \
                     VALUES ($1, (pg_catalog.random() OPERATOR(pg_catalog.*) 2147483647)::pg_catalog.int4, $2) \
                     ON CONFLICT DO NOTHING RETURNING 1",
                    None,
                    &[role.into(), n.into()],
                )?;
                if !inserted.is_empty() {
                    return Ok::<(), pgrx::spi::Error>(());
                }
            }
        })
    })
    .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot count new scopes: {e}"));
}

/// The ticket worker, in its own transaction: room for one more scope of
/// `role` (capped at `cap`, the asking session's setting), counted at once
/// if `create` says it was made.
pub fn check_room_for(role: pg_sys::Oid, cap: i64) -> Result<(), TicketError> {
    let Some(table) = capped(role, cap) else { return Ok(()) };
    let created = committed(table, role);
    if created >= cap {
        return Err(refusal(role, created, cap));
    }
    Ok(())
}

/// The ticket worker made a scope for `role` (capped at `cap`).
pub fn count_now(role: pg_sys::Oid, cap: i64) {
    if let Some(table) = capped(role, cap) {
        add(table, role, 1);
    }
}

pub fn role_name(role: pg_sys::Oid) -> String {
    let name = unsafe { pg_sys::GetUserNameFromId(role, true) };
    if name.is_null() {
        return role.to_u32().to_string();
    }
    unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy().into_owned()
}
