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
//! scopes costs one row. A transaction that saw more than `FOLD_AFTER`
//! rows of its role folds them into one (`DELETE` of rows nobody holds,
//! `SKIP LOCKED`, and one `INSERT` of their sum, in one statement), in a
//! subtransaction of its own: a fold that fails (under REPEATABLE READ, a
//! row another fold deleted since the snapshot) is left to the next one,
//! and never fails the commit.
//!
//! Room is checked before each new row: the sum, read once per
//! transaction, plus what the transaction made. The sum is read from the
//! heap with a dirty snapshot: the latest committed rows and those still
//! being committed or prepared (a prepared transaction's count holds), and
//! no SERIALIZABLE predicate lock, which would make concurrent creators
//! fail each other. Rows a fold is replacing count twice for that moment:
//! a refusal too early, never a pass. Transactions of one role that check
//! at once do not see each other's new names before their commits, so
//! together they can pass the cap by what each has in flight: a bound on
//! disk use, not an exact count. Not dumped: role ids differ between
//! clusters, and a restored database counts anew.
//!
//! In memory: what this transaction created, in creation order, tagged
//! with the subtransaction that made it. Subtransaction ids only grow, so
//! the rows made in a subtransaction and its children are exactly the tail
//! tagged at or above its id: a savepoint rolled back pops them (and their
//! count). Checks are O(1): a running count per role.
//!
//! The ticket worker counts the scopes it creates for the role that asked
//! (`check_room_for`, `count_now`), in its own transaction, adding what
//! the asking transaction has made and not yet counted (`pending_for`);
//! the asking session reads the sum again afterwards.
//! Touches: `pgticket.scope_quota`, as its owner.

use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;
use std::collections::HashMap;

use crate::backend_local::BackendRefCell;
use crate::errors::TicketError;
use crate::{settings, state_tables};

/// Rows of one role beyond which a commit folds them.
const FOLD_AFTER: i64 = 32;

/// Tries at a free random shard before giving up (a clash is one in 2^31
/// per row; a row that never appears is a trigger or rule swallowing it).
const INSERT_TRIES: usize = 8;

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

/// (role, quota table): counts in one table are not another's.
type Counted = (pg_sys::Oid, pg_sys::Oid);

#[derive(Default)]
struct Pending {
    created: Vec<Created>,
    mine: HashMap<Counted, i64>,
    committed: HashMap<Counted, Committed>,
}

static PENDING: BackendRefCell<Pending> = BackendRefCell::new();

/// The role creating a row now (before any switch to the tables' owner).
pub fn creator() -> pg_sys::Oid {
    crate::xact::current_user()
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

/// The rows of `role`, committed or on their way (prepared, in a commit),
/// read through the primary key with a dirty snapshot: never waits, takes
/// no predicate lock.
fn read_sum(table: state_tables::Table, role: pg_sys::Oid) -> Committed {
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
        let mut dirty = pg_sys::SnapshotData { snapshot_type: pg_sys::SnapshotType::SNAPSHOT_DIRTY, ..Default::default() };
        let scan = pg_sys::systable_beginscan(rel, (*rel).rd_pkindex, true, &mut dirty, 1, &mut key);
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
    let counted = (role, table.oid);
    let known = PENDING.with(|p| p.committed.get(&counted).copied());
    let committed = known.unwrap_or_else(|| {
        let read = read_sum(table, role);
        PENDING.with(|p| p.committed.insert(counted, read));
        read
    });
    let mine = PENDING.with(|p| p.mine.get(&counted).copied().unwrap_or(0));
    let created = committed.scopes.saturating_add(mine);
    if created >= cap {
        return Err(refusal(role, created, cap));
    }
    Ok(())
}

/// `role` created a row in this (sub)transaction.
pub fn created(role: pg_sys::Oid) {
    let Some(table) = capped(role, session_cap()) else { return };
    let subxact = crate::xact::current_subtransaction();
    PENDING.with(|p| {
        p.created.push(Created { subxact, role, table: table.oid });
        *p.mine.entry((role, table.oid)).or_insert(0) += 1;
    });
}

/// A savepoint rolled back: the rows it and its children made are gone.
pub fn on_subxact_abort(aborted: pg_sys::SubTransactionId) {
    PENDING.with(|p| {
        while p.created.last().is_some_and(|c| c.subxact >= aborted) {
            let gone = p.created.pop().expect("checked");
            *p.mine.get_mut(&(gone.role, gone.table)).expect("counted when created") -= 1;
        }
    });
}

/// Does this transaction hold anything (rows to count, sums read)?
pub fn idle() -> bool {
    PENDING.with(|p| p.created.is_empty() && p.committed.is_empty())
}

/// Did this transaction create rows still to be counted?
pub fn pending() -> bool {
    PENDING.with(|p| !p.created.is_empty())
}

/// What this transaction created for `role` and has not counted yet (the
/// ticket worker adds it to the sum it reads); the sum read so far is
/// forgotten, since the worker's count will be in it.
pub fn pending_for(role: pg_sys::Oid) -> i64 {
    let Some(table) = state_tables::lookup().and_then(|t| t.scope_quota) else { return 0 };
    PENDING.with(|p| {
        p.committed.remove(&(role, table.oid));
        p.mine.get(&(role, table.oid)).copied().unwrap_or(0)
    })
}

/// Pre-commit: count what this transaction created, per role, in the quota
/// table there is now (one dropped in this transaction took its counts).
pub fn flush() {
    let (created, committed) = PENDING.with(|p| {
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
        add(table, role, n);
        if committed.get(&(role, table.oid)).is_some_and(|c| c.rows >= FOLD_AFTER) {
            fold_quietly(table, role);
        }
    }
}

/// Commit or abort: nothing pending any more.
pub fn forget() {
    PENDING.with(|p| *p = Pending::default());
}

/// Insert a row counting `n` new names of `role`: never a wait.
fn add(table: state_tables::Table, role: pg_sys::Oid, n: i64) {
    let inserted = state_tables::as_owner_of(table, || {
        Spi::connect_mut(|client| {
            for _ in 0..INSERT_TRIES {
                let inserted = client.update(
                    "INSERT INTO pgticket.scope_quota (role, shard, scopes) \
                     VALUES ($1, (pg_catalog.random() OPERATOR(pg_catalog.*) 2147483647)::pg_catalog.int4, $2) \
                     ON CONFLICT DO NOTHING RETURNING 1",
                    None,
                    &[role.into(), n.into()],
                )?;
                if !inserted.is_empty() {
                    return Ok::<bool, pgrx::spi::Error>(true);
                }
            }
            Ok(false)
        })
    })
    .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot count new scopes: {e}"));
    if !inserted {
        pgrx::error!("pg_ticket: cannot count new scopes: {INSERT_TRIES} inserts into pgticket.scope_quota stored nothing (a trigger or rule on it?)");
    }
}

/// Fold the rows of `role` nobody holds into one, in a subtransaction: a
/// fold that fails is logged and left to the next one.
fn fold_quietly(table: state_tables::Table, role: pg_sys::Oid) {
    let (context, owner) = unsafe { (pg_sys::CurrentMemoryContext, pg_sys::CurrentResourceOwner) };
    unsafe { pg_sys::BeginInternalSubTransaction(std::ptr::null()) };
    let folded = PgTryBuilder::new(|| {
        state_tables::as_owner_of(table, || {
            Spi::connect_mut(|client| {
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
                )
                .map(|_| ())
            })
        })
        .map_err(|e| e.to_string())
    })
    .catch_others(|e| match e {
        CaughtError::PostgresError(r) | CaughtError::ErrorReport(r) | CaughtError::RustPanic { ereport: r, .. } => Err(r.message().to_string()),
    })
    .execute();
    unsafe {
        match &folded {
            Ok(()) => pg_sys::ReleaseCurrentSubTransaction(),
            Err(_) => pg_sys::RollbackAndReleaseCurrentSubTransaction(),
        }
        pg_sys::MemoryContextSwitchTo(context);
        pg_sys::CurrentResourceOwner = owner;
    }
    if let Err(why) = folded {
        pgrx::log!("pg_ticket: folding the scope counts of role {} left for later: {why}", role_name(role));
    }
}

/// What the ticket worker knows of the role it makes a scope for: its
/// cap (the asking session's setting) and what the asking transaction has
/// made and not counted yet.
#[derive(Clone, Copy)]
pub struct Asker {
    pub role: pg_sys::Oid,
    pub cap: i64,
    pub pending: i64,
}

/// The asker this session is: its role, cap and uncounted scopes.
pub fn this_session() -> Asker {
    let role = creator();
    Asker { role, cap: session_cap(), pending: pending_for(role) }
}

/// The ticket worker, in its own transaction: room for one more scope of
/// the asker? Returns how many rows it has (for `count_now`).
pub fn check_room_for(asker: Asker) -> Result<i64, TicketError> {
    let Some(table) = capped(asker.role, asker.cap) else { return Ok(0) };
    let sum = read_sum(table, asker.role);
    let created = sum.scopes.saturating_add(asker.pending);
    if created >= asker.cap {
        return Err(refusal(asker.role, created, asker.cap));
    }
    Ok(sum.rows)
}

/// The ticket worker made a scope for the asker, whose role had `rows`.
pub fn count_now(asker: Asker, rows: i64) {
    if let Some(table) = capped(asker.role, asker.cap) {
        add(table, asker.role, 1);
        if rows >= FOLD_AFTER {
            fold_quietly(table, asker.role);
        }
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
