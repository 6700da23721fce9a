//! New scopes per role (SPEC §13.11, issue #24 item 5). Every scope, ticket
//! scope and block name is a permanent row: its mark must outlive any use
//! (a name removed would count from 1 again). So the rows one role creates
//! in a database are capped by `pg_ticket.max_scopes_per_role` (superusers
//! set it; 0: no cap); superusers and the tables' owners are not counted.
//!
//! Counted in `pgticket.scope_quota` as rows that are only ever inserted:
//! at its pre-commit a transaction inserts one row per role saying how many
//! it created (a random shard; a clash picks another), so no creator waits
//! on another (§13.5), none updates a row another committed since its
//! snapshot (40001 under REPEATABLE READ), and a bulk insert into new
//! scopes costs one row. A READ COMMITTED transaction that saw more than
//! `COMPACT_AFTER` rows of its role folds them into one (`DELETE` of rows
//! nobody holds, `SKIP LOCKED`, and one `INSERT` of their sum, in one
//! statement); other levels never delete (a row deleted since their
//! snapshot would be 40001).
//!
//! Room is checked before each new row: the committed sum, read once per
//! transaction, plus what the transaction made. The sum is read from the
//! heap with `SnapshotSelf` (the latest committed rows, not the snapshot's,
//! and no SERIALIZABLE predicate lock, which would make concurrent
//! creators fail each other). Other transactions' uncommitted rows are not
//! seen, so concurrent transactions of one role can pass the cap by what
//! each has in flight (and a read that meets a fold as it commits may miss
//! the folded rows once): a bound on disk use, not an exact count. Not
//! dumped: role ids differ between clusters, and a restored database counts
//! anew.
//!
//! In memory: what this transaction created, in creation order, tagged
//! with the subtransaction that made it. Subtransaction ids only grow, so
//! the rows made in a subtransaction and its children are exactly the tail
//! tagged at or above its id: a savepoint rolled back pops them (and their
//! count). Checks are O(1): a running count per role.
//!
//! The ticket worker counts the scopes it creates for the role that asked
//! (`check_room_for`, `count_now`), in its own transaction.
//! Touches: `pgticket.scope_quota`, as its owner.

use pgrx::prelude::*;
use std::cell::RefCell;
use std::collections::HashMap;

use crate::errors::TicketError;
use crate::{settings, state_tables};

/// Rows of one role beyond which a READ COMMITTED commit folds them.
const COMPACT_AFTER: i64 = 32;

struct Created {
    subxact: pg_sys::SubTransactionId,
    role: pg_sys::Oid,
    /// The quota table it counts in (another after DROP/CREATE EXTENSION).
    table: pg_sys::Oid,
}

/// What is committed for a role, as read this transaction.
#[derive(Clone, Copy)]
struct Committed {
    scopes: i64,
    rows: i64,
}

#[derive(Default)]
struct Pending {
    created: Vec<Created>,
    mine: HashMap<pg_sys::Oid, i64>,
    committed: HashMap<pg_sys::Oid, Committed>,
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

/// The committed rows of `role`, read through the primary key with
/// `SnapshotSelf`: never waits, takes no predicate lock.
fn read_committed(table: state_tables::Table, role: pg_sys::Oid) -> Committed {
    const ROLE_COLUMN: i16 = 1;
    const SCOPES_COLUMN: i32 = 3;
    let mut found = Committed { scopes: 0, rows: 0 };
    unsafe {
        let rel = pg_sys::table_open(table.oid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        pg_sys::list_free(pg_sys::RelationGetIndexList(rel)); // sets rd_pkindex
        let mut key = pg_sys::ScanKeyData::default();
        pg_sys::ScanKeyInit(
            &mut key,
            ROLE_COLUMN,
            pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
            pg_sys::RegProcedure::from(pg_sys::F_OIDEQ),
            pg_sys::Datum::from(role),
        );
        let scan = pg_sys::systable_beginscan(rel, (*rel).rd_pkindex, true, &raw mut pg_sys::SnapshotSelfData, 1, &mut key);
        loop {
            let tuple = pg_sys::systable_getnext(scan);
            if tuple.is_null() {
                break;
            }
            let mut is_null = false;
            let scopes = pg_sys::heap_getattr(tuple, SCOPES_COLUMN, (*rel).rd_att, &mut is_null);
            if !is_null {
                found.scopes = found.scopes.saturating_add(scopes.value() as i64);
            }
            found.rows += 1;
        }
        pg_sys::systable_endscan(scan);
        pg_sys::table_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
    }
    found
}

fn refusal(role: pg_sys::Oid, created: i64, cap: i64) -> TicketError {
    TicketError::TooManyScopes { role: role_name(role), created, cap }
}

/// Is there room for one more row created by `role` in this transaction?
/// 53400 if its committed rows and this transaction's reach the cap.
pub fn check_room(role: pg_sys::Oid) -> Result<(), TicketError> {
    let cap = session_cap();
    let Some(table) = capped(role, cap) else { return Ok(()) };
    let known = PENDING.with(|p| p.borrow().committed.get(&role).copied());
    let committed = known.unwrap_or_else(|| {
        let read = read_committed(table, role);
        PENDING.with(|p| p.borrow_mut().committed.insert(role, read));
        read
    });
    let mine = PENDING.with(|p| p.borrow().mine.get(&role).copied().unwrap_or(0));
    let created = committed.scopes.saturating_add(mine);
    if created >= cap {
        return Err(refusal(role, created, cap));
    }
    Ok(())
}

/// `role` created a row in this (sub)transaction.
pub fn created(role: pg_sys::Oid) {
    let Some(table) = capped(role, session_cap()) else { return };
    let subxact = unsafe { pg_sys::GetCurrentSubTransactionId() };
    PENDING.with(|p| {
        let mut p = p.borrow_mut();
        p.created.push(Created { subxact, role, table: table.oid });
        *p.mine.entry(role).or_insert(0) += 1;
    });
}

/// A savepoint rolled back: the rows it and its children made are gone.
pub fn on_subxact_abort(aborted: pg_sys::SubTransactionId) {
    PENDING.with(|p| {
        let mut p = p.borrow_mut();
        while p.created.last().is_some_and(|c| c.subxact >= aborted) {
            let gone = p.created.pop().expect("checked");
            *p.mine.get_mut(&gone.role).expect("counted when created") -= 1;
        }
    });
}

/// Does this transaction hold anything (rows to count, sums read)?
pub fn idle() -> bool {
    PENDING.with(|p| {
        let p = p.borrow();
        p.created.is_empty() && p.committed.is_empty()
    })
}

/// Did this transaction create rows still to be counted?
pub fn pending() -> bool {
    PENDING.with(|p| !p.borrow().created.is_empty())
}

/// Pre-commit: count what this transaction created, per role, in the quota
/// table there is now (one dropped in this transaction took its counts).
pub fn flush() {
    let (created, committed) = PENDING.with(|p| {
        let mut p = p.borrow_mut();
        (std::mem::take(&mut p.created), p.committed.clone())
    });
    let Some(table) = state_tables::lookup().and_then(|t| t.scope_quota) else { return };
    let mut per_role: Vec<(pg_sys::Oid, i64)> = Vec::new();
    for c in created.iter().filter(|c| c.table == table.oid) {
        match per_role.iter_mut().find(|(r, _)| *r == c.role) {
            Some((_, n)) => *n += 1,
            None => per_role.push((c.role, 1)),
        }
    }
    for (role, n) in per_role {
        let rows = committed.get(&role).map_or(0, |c| c.rows);
        add(table, role, n, rows >= COMPACT_AFTER);
    }
}

/// Commit or abort: nothing pending any more.
pub fn forget() {
    PENDING.with(|p| *p.borrow_mut() = Pending::default());
}

/// Insert a row counting `n` new names of `role`, and fold its rows if
/// `compact` and this transaction is READ COMMITTED: never a wait.
fn add(table: state_tables::Table, role: pg_sys::Oid, n: i64, compact: bool) {
    let read_committed = unsafe { pg_sys::XactIsoLevel } == pg_sys::XACT_READ_COMMITTED as i32;
    state_tables::as_owner_of(table, || {
        Spi::connect_mut(|client| {
            // A clash of random shards only picks another.
            loop {
                let inserted = client.update(
                    "INSERT INTO pgticket.scope_quota (role, shard, scopes) \
                     VALUES ($1, (pg_catalog.random() OPERATOR(pg_catalog.*) 2147483647)::pg_catalog.int4, $2) \
                     ON CONFLICT DO NOTHING RETURNING 1",
                    None,
                    &[role.into(), n.into()],
                )?;
                if !inserted.is_empty() {
                    break;
                }
            }
            if compact && read_committed {
                // The sum takes the smallest shard of the rows it replaces
                // (deleted by this statement, so no clash).
                client.update(
                    "WITH gone AS ( \
                       DELETE FROM pgticket.scope_quota WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY( \
                         SELECT ctid FROM pgticket.scope_quota WHERE role OPERATOR(pg_catalog.=) $1 \
                          FOR UPDATE SKIP LOCKED LIMIT 1000)) \
                       RETURNING shard, scopes) \
                     INSERT INTO pgticket.scope_quota (role, shard, scopes) \
                     SELECT $1, pg_catalog.min(shard), pg_catalog.sum(scopes)::pg_catalog.int8 FROM gone \
                     HAVING pg_catalog.count(*) OPERATOR(pg_catalog.>) 0",
                    None,
                    &[role.into()],
                )?;
            }
            Ok::<(), pgrx::spi::Error>(())
        })
    })
    .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot count new scopes: {e}"));
}

/// The ticket worker, in its own transaction: room for one more scope of
/// `role`, capped at `cap` (the asking session's setting)?
pub fn check_room_for(role: pg_sys::Oid, cap: i64) -> Result<(), TicketError> {
    let Some(table) = capped(role, cap) else { return Ok(()) };
    let created = read_committed(table, role).scopes;
    if created >= cap {
        return Err(refusal(role, created, cap));
    }
    Ok(())
}

/// The ticket worker made a scope for `role` (capped at `cap`).
pub fn count_now(role: pg_sys::Oid, cap: i64) {
    if let Some(table) = capped(role, cap) {
        let rows = read_committed(table, role).rows;
        add(table, role, 1, rows >= COMPACT_AFTER);
    }
}

/// A role's name for a message, in double quotes.
pub fn role_name(role: pg_sys::Oid) -> String {
    let name = unsafe { pg_sys::GetUserNameFromId(role, true) };
    if name.is_null() {
        return format!("with OID {}", role.to_u32());
    }
    crate::names::quoted(unsafe { std::ffi::CStr::from_ptr(name) }.to_bytes())
}
