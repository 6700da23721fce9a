//! The allocation core shared by scoped counters and blocks.
//!
//! The first allocation from a scope in a transaction locks its row and takes
//! the values in one `UPDATE` (see `store`). Later allocations in the same
//! transaction are served from backend-local state (`ticket_core::local_marks`,
//! which also keeps the savepoint undo) with no SQL, which keeps the cost per
//! ID constant however many a transaction takes. The final marks are written
//! once per touched scope just before commit (or PREPARE), and that commit is
//! made durable: the values may already have left the database.
//!
//! Keys carry the state table's relation id, so what a transaction holds
//! belongs to the tables it was taken from: after `DROP EXTENSION` (and a new
//! `CREATE EXTENSION`) in the same transaction, the old entries match nothing
//! and are not written to a table that no longer exists.

use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::c_void;

use super::store::{self, Locked};
use crate::backend_local::BackendRefCell;
use crate::state_tables::{self, Table, Tables};
use crate::errors::TicketError;
use crate::names::Name;
use crate::settings;
use crate::xact;
use ticket_core::counter::{Change, CounterError, Mark};
use ticket_core::fast_map::same_key;
use ticket_core::local_marks::LocalMarks;
use ticket_core::rights::RightKind;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Scope = 0,
    Block = 1,
}

impl Kind {
    pub fn what(self) -> &'static str {
        match self {
            Kind::Scope => "scoped counter",
            Kind::Block => "block",
        }
    }

    /// How a message names the scope or block `(a, b)`.
    pub fn label(self, a: Name<'_>, b: Name<'_>) -> String {
        match self {
            Kind::Scope => crate::names::label("scope", a, Some(b)),
            Kind::Block => crate::names::label("block", a, None),
        }
    }

    /// The grants that cover it (`pg_ticket.scope_rights`).
    pub fn right(self) -> RightKind {
        match self {
            Kind::Scope => RightKind::Scope,
            Kind::Block => RightKind::Block,
        }
    }

    /// Refused (42501) unless the current user may use `(a, b)`.
    pub fn check_right(self, a: Name<'_>, b: Name<'_>) -> Result<(), TicketError> {
        crate::rights::check(self.right(), a, b, || self.label(a, b))
    }

    /// This kind's state table.
    pub fn table(self, tables: &Tables) -> Table {
        match self {
            Kind::Scope => tables.scoped_counters,
            Kind::Block => tables.blocks,
        }
    }
}

#[derive(Default)]
struct XactState {
    marks: LocalMarks,
    /// Set once the marks were written at pre-commit.
    flushed: bool,
    callbacks_registered: bool,
    key_buf: Vec<u8>,
    /// The state tables' generation the scope served last was keyed at
    /// (its key holds its table's relation id): `take_again` serves it
    /// while the generation stays, without looking the tables up.
    served_at: Option<u64>,
    /// Who was permitted the scope served last, with `pg_ticket.scope_rights`
    /// on (None: off, or nothing served): `take_again` serves the same
    /// asker without deciding again.
    permitted: Option<crate::rights::Asker>,
}

static STATE: BackendRefCell<XactState> = BackendRefCell::new();

/// Key: kind byte, the table's relation id, first name, NUL, second name
/// (text never holds NUL). Names are the database's bytes.
fn encode_key(buf: &mut Vec<u8>, kind: Kind, table: pg_sys::Oid, a: Name<'_>, b: Name<'_>) {
    buf.clear();
    buf.push(kind as u8);
    buf.extend_from_slice(&table.to_u32().to_le_bytes());
    buf.extend_from_slice(a.bytes());
    buf.push(0);
    buf.extend_from_slice(b.bytes());
}

/// Where a key's names start: after the kind byte and the relation id.
const NAMES_AT: usize = 5;

fn decode_key(key: &[u8]) -> (Kind, pg_sys::Oid, Name<'_>, Name<'_>) {
    let kind = if key[0] == Kind::Scope as u8 { Kind::Scope } else { Kind::Block };
    let table = pg_sys::Oid::from(u32::from_le_bytes(key[1..NAMES_AT].try_into().expect("4 bytes")));
    let rest = &key[NAMES_AT..];
    let nul = rest.iter().position(|&c| c == 0).expect("key has a separator");
    (kind, table, Name(&rest[..nul]), Name(&rest[nul + 1..]))
}

/// Whether `key` is `(kind, a, b)`'s, in whichever table: compared in
/// place, without writing the key of `(kind, a, b)`.
#[inline]
fn is_key_of(key: &[u8], kind: Kind, a: Name<'_>, b: Name<'_>) -> bool {
    let (a, b) = (a.bytes(), b.bytes());
    let nul = NAMES_AT + a.len();
    key.len() == nul + 1 + b.len()
        && key[0] == kind as u8
        && same_key(&key[NAMES_AT..nul], a)
        && key[nul] == 0
        && same_key(&key[nul + 1..], b)
}

/// Take `n` (≥ 1) values from the mark of `(kind, a, b)`; returns the new mark.
pub fn take(kind: Kind, a: Name<'_>, b: Name<'_>, n: i64) -> Result<i64, TicketError> {
    update_mark(kind, a, b, Change::Take(n))
}

/// `take` for a call on the scope this transaction served last, again (a
/// bulk INSERT's run, a loop): no key written, no table looked up, no
/// hash. None wherever `take` has more to do or something to refuse, and
/// then nothing changed. What may have changed since the last call is
/// checked again: a read-only transaction, the state tables (the
/// generation the scope was keyed at), the end of the transaction, the
/// subtransaction's undo entry, and with `pg_ticket.scope_rights` on the
/// asker (the right is not decided again: the same user with no role or
/// grant changed is permitted again; a `SET ROLE` goes the full way).
/// Names outside the limits are declined first: the full path refuses
/// them before it reads any state (22023, not a state table's 55000).
#[inline]
pub fn take_again(kind: Kind, a: Name<'_>, b: Name<'_>, n: i64) -> Option<i64> {
    if !within_limits(a) || !within_limits(b) || xact::read_only() {
        return None;
    }
    let generation = state_tables::cached_generation()?;
    let asker = crate::rights::asker();
    let subxact = xact::current_subtransaction();
    STATE.with(|s| {
        if s.flushed || s.served_at != Some(generation) || (asker.is_some() && s.permitted != asker) {
            return None;
        }
        s.marks.take_again(|key| is_key_of(key, kind, a, b), subxact, n)
    })
}

#[inline]
fn within_limits(name: Name<'_>) -> bool {
    ticket_core::counter::check_name("name", name.bytes()).is_ok()
}

/// Move the mark of `(kind, a, b)` to `to`, which must not be below it.
pub fn advance(kind: Kind, a: Name<'_>, b: Name<'_>, to: i64) -> Result<i64, TicketError> {
    update_mark(kind, a, b, Change::AdvanceTo(to))
}

/// A value given explicitly for `(kind, a, b)` (a numbering trigger's
/// `on_explicit => 'advance'`) becomes its mark, if above it: the series
/// goes on above it, never below.
pub fn claim(kind: Kind, a: Name<'_>, b: Name<'_>, value: i64) -> Result<i64, TicketError> {
    update_mark(kind, a, b, Change::Claim(value))
}

/// Close a counter at its mark (its limit becomes its mark); the mark.
pub fn retire(kind: Kind, a: Name<'_>, b: Name<'_>) -> Result<i64, TicketError> {
    update_row(kind, a, b, Change::Retire).map(|row| row.mark)
}

/// Set the limit of `(kind, a, b)` (creating it if new); never below its
/// mark. Returns the limit.
pub fn limit(kind: Kind, a: Name<'_>, b: Name<'_>, max: i64) -> Result<i64, TicketError> {
    if max < 0 {
        return Err(CounterError::NegativeMark(max).into());
    }
    update_row(kind, a, b, Change::LimitTo(max)).map(|row| row.limit)
}

/// The current mark as this transaction sees it, without locking.
pub fn current(kind: Kind, a: Name<'_>, b: Name<'_>) -> Result<i64, TicketError> {
    kind.check_right(a, b)?;
    let table = kind.table(&state_tables::current()).oid;
    let local = STATE.with(|s| {
        encode_key(&mut s.key_buf, kind, table, a, b);
        s.marks.mark(&s.key_buf)
    });
    Ok(local.unwrap_or_else(|| store::read(kind, a, b)))
}

fn update_mark(kind: Kind, a: Name<'_>, b: Name<'_>, change: Change) -> Result<i64, TicketError> {
    update_row(kind, a, b, change).map(|row| row.mark)
}

/// A counter's refusal names its scope or block (as `nextval` names its
/// sequence): one INSERT may number rows of many.
fn update_row(kind: Kind, a: Name<'_>, b: Name<'_>, change: Change) -> Result<Mark, TicketError> {
    update_row_unnamed(kind, a, b, change).map_err(|e| match e {
        TicketError::Counter(_) => e.about(kind.label(a, b)),
        other => other,
    })
}

fn update_row_unnamed(kind: Kind, a: Name<'_>, b: Name<'_>, change: Change) -> Result<Mark, TicketError> {
    xact::check_writable()?;
    // At every call, not only a scope's first in the transaction: a
    // SET ROLE or a SECURITY DEFINER function may change the user between
    // two (a memo lookup when on, one flag read when off).
    let asker = crate::rights::asker();
    kind.check_right(a, b)?;
    let subxact = xact::current_subtransaction();
    let table = kind.table(&state_tables::current()).oid;
    let generation = state_tables::cached_generation();
    let fast = STATE.with(|s| -> Option<Result<Mark, TicketError>> {
        if s.flushed {
            return Some(Err(TicketError::AllocationAfterFlush));
        }
        encode_key(&mut s.key_buf, kind, table, a, b);
        let served = s.marks.update(&s.key_buf, subxact, |row| Ok::<_, TicketError>(change.apply(kind.what(), row)?));
        if served.is_some() {
            // Served last, under this key, to this asker; a refusal too:
            // `update` made this key the last, and `take_again` must not
            // serve it to an asker permitted another scope.
            (s.served_at, s.permitted) = (generation, asker);
        }
        served
    });
    if let Some(result) = fast {
        return result;
    }

    // Refuse at the cap before locking, so nothing is held that the
    // backend-local state does not know of.
    STATE.with(|s| {
        s.marks.set_max_entries(settings::max_transaction_entries());
        s.marks.room_for_new_scope(subxact)
    })?;
    register_callbacks();
    let taken = change.taken_by_lock();
    let stored = match store::lock_and_take(kind, a, b, taken) {
        Locked::Took(stored) => stored,
        Locked::WouldOverflow(Mark { mark, limit }) => {
            return Err(CounterError::Overflow { what: kind.what(), mark, n: taken, limit }.into())
        }
    };
    // The row is ours until the transaction (or this subtransaction) ends;
    // a refused change still holds it, with nothing changed.
    let current = match change {
        Change::Take(_) => Ok(stored),
        other => other.apply(kind.what(), stored),
    };
    STATE.with(|s| {
        encode_key(&mut s.key_buf, kind, table, a, b);
        s.marks.hold(&s.key_buf, subxact, stored, *current.as_ref().unwrap_or(&stored))?;
        // Served last, under a key of the tables of `generation` (any
        // invalidation while the row was locked moved the generation on),
        // to this asker.
        (s.served_at, s.permitted) = (generation, asker);
        Ok::<_, TicketError>(())
    })?;
    Ok(current?)
}

fn register_callbacks() {
    let first = STATE.with(|s| !std::mem::replace(&mut s.callbacks_registered, true));
    if first {
        // Registered once for the backend's life: pgrx's own per-transaction
        // hooks survive PREPARE TRANSACTION and fire in the next transaction.
        unsafe {
            pg_sys::RegisterXactCallback(Some(on_xact_event), std::ptr::null_mut());
            pg_sys::RegisterSubXactCallback(Some(on_subxact_event), std::ptr::null_mut());
        }
    }
}

/// Pre-commit (or pre-prepare): write every moved mark back, and make the
/// commit (or the PREPARE: two-phase commit is a commit, SPEC §13.8)
/// durable.
fn flush_marks() {
    let dirty: Vec<(Box<[u8]>, Mark)> = STATE.with(|s| {
        s.flushed = true;
        s.marks.dirty().map(|(k, m)| (Box::from(k), m)).collect()
    });
    // Values were taken (the row lock's own UPDATE took them even when no
    // mark moved since), and they may have left the database already.
    if settings::durable_commit() {
        xact::make_commit_durable();
    }
    if dirty.is_empty() && !crate::quota::pending() {
        return;
    }
    // Pre-commit runs after the last statement's snapshot was released.
    unsafe { pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot()) };
    let now: Option<Tables> = state_tables::lookup();
    {
        // Values already taken are stored even if the transaction was made
        // READ ONLY after taking them.
        let _writable = xact::WritableForCommit::new();
        for (key, row) in &dirty {
            let (kind, table, a, b) = decode_key(key);
            // A table dropped in this transaction (DROP EXTENSION) took its
            // rows, and their marks, with it.
            if now.is_some_and(|t| kind.table(&t).oid == table) {
                store::write(kind, a, b, *row);
            }
        }
        crate::quota::flush();
    }
    unsafe { pg_sys::PopActiveSnapshot() };
}

fn forget_all() {
    STATE.with(|s| {
        s.marks.clear();
        s.flushed = false;
    });
    crate::quota::forget();
}

#[pg_guard]
unsafe extern "C-unwind" fn on_xact_event(event: pg_sys::XactEvent::Type, _arg: *mut c_void) {
    // A refused new scope leaves no mark but a quota sum read: forgotten
    // at the end like the rest, or the next transaction would trust it.
    let idle = STATE.with(|s| {
        s.marks.is_empty() && !s.flushed
    }) && crate::quota::idle();
    if idle {
        return;
    }
    match event {
        pg_sys::XactEvent::XACT_EVENT_PRE_COMMIT | pg_sys::XactEvent::XACT_EVENT_PRE_PREPARE => flush_marks(),
        pg_sys::XactEvent::XACT_EVENT_COMMIT
        | pg_sys::XactEvent::XACT_EVENT_ABORT
        | pg_sys::XactEvent::XACT_EVENT_PREPARE => forget_all(),
        _ => {}
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn on_subxact_event(
    event: pg_sys::SubXactEvent::Type,
    my_subid: pg_sys::SubTransactionId,
    parent_subid: pg_sys::SubTransactionId,
    _arg: *mut c_void,
) {
    STATE.with(|s| {
        match event {
            pg_sys::SubXactEvent::SUBXACT_EVENT_COMMIT_SUB => s.marks.commit_sub(my_subid, parent_subid),
            pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB => s.marks.abort_sub(my_subid),
            _ => {}
        }
    });
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        crate::quota::on_subxact_abort(my_subid);
    }
}
