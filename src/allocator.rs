//! The allocation core shared by scoped counters and blocks.
//!
//! The first allocation from a scope in a transaction locks its row and takes
//! the values in one `UPDATE` (see `store`). Later allocations in the same
//! transaction are served from backend-local state with no SQL, which keeps
//! the cost per ID constant however many a transaction takes. The final
//! marks are written once per touched scope just before commit (or PREPARE).
//!
//! Savepoints: the first change to a scope inside a subtransaction records
//! the value to restore if it aborts; a scope first locked inside it is
//! forgotten instead (the abort released the lock and undid the row).

use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;

use crate::errors::TicketError;
use crate::store::{self, Locked};
use ticket_core::counter;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Scope = 0,
    Block = 1,
}

impl Kind {
    fn what(self) -> &'static str {
        match self {
            Kind::Scope => "scoped counter",
            Kind::Block => "block",
        }
    }
}

const TOP_SUBXACT: pg_sys::SubTransactionId = 1;

/// A row this transaction holds locked.
struct Held {
    /// The mark as the row stores it now.
    stored: i64,
    /// The mark including values taken since, not yet written.
    mark: i64,
    /// The last subtransaction that recorded an undo entry for this scope.
    logged_in: pg_sys::SubTransactionId,
}

enum UndoAction {
    Restore(i64),
    Forget,
}

struct Undo {
    subxact: pg_sys::SubTransactionId,
    key: Box<[u8]>,
    action: UndoAction,
}

#[derive(Default)]
struct XactState {
    /// Key: kind byte, first name, NUL, second name (text never holds NUL).
    held: HashMap<Box<[u8]>, Held>,
    undo: Vec<Undo>,
    /// Set once the marks were written at pre-commit.
    flushed: bool,
    callbacks_registered: bool,
    key_buf: Vec<u8>,
}

thread_local! {
    static STATE: RefCell<XactState> = RefCell::new(XactState::default());
}

fn encode_key(buf: &mut Vec<u8>, kind: Kind, a: &str, b: &str) {
    buf.clear();
    buf.push(kind as u8);
    buf.extend_from_slice(a.as_bytes());
    buf.push(0);
    buf.extend_from_slice(b.as_bytes());
}

fn decode_key(key: &[u8]) -> (Kind, &str, &str) {
    let kind = if key[0] == Kind::Scope as u8 { Kind::Scope } else { Kind::Block };
    let rest = &key[1..];
    let nul = rest.iter().position(|&c| c == 0).expect("key has a separator");
    // The bytes came from Rust &str values, so they are valid UTF-8.
    let a = std::str::from_utf8(&rest[..nul]).expect("utf-8 key");
    let b = std::str::from_utf8(&rest[nul + 1..]).expect("utf-8 key");
    (kind, a, b)
}

/// Allocations write (or, for snowflakes, must not run on a standby that
/// shares the primary's machine id), so read-only transactions and hot
/// standbys refuse them, as they refuse nextval().
#[inline]
pub fn check_writable() -> Result<(), TicketError> {
    // During recovery every transaction is read-only, so one flag covers both.
    if unsafe { pg_sys::XactReadOnly } {
        return Err(TicketError::ReadOnly { standby: unsafe { pg_sys::RecoveryInProgress() } });
    }
    Ok(())
}

/// What an allocation does to a mark.
#[derive(Clone, Copy)]
enum Change {
    /// Take `n` (≥ 1) values.
    Take(i64),
    /// Move the mark to this value, never back.
    AdvanceTo(i64),
}

impl Change {
    fn apply(self, kind: Kind, mark: i64) -> Result<i64, TicketError> {
        match self {
            Change::Take(n) => Ok(counter::take(kind.what(), mark, n)?),
            Change::AdvanceTo(to) if to < mark => {
                Err(TicketError::MarkBackwards { what: kind.what(), current: mark, requested: to })
            }
            Change::AdvanceTo(to) => Ok(to),
        }
    }

    /// What the statement that locks the row takes in the same write.
    fn taken_by_lock(self) -> i64 {
        match self {
            Change::Take(n) => n,
            Change::AdvanceTo(_) => 0,
        }
    }
}

/// Take `n` (≥ 1) values from the mark of `(kind, a, b)`; returns the new mark.
pub fn take(kind: Kind, a: &str, b: &str, n: i64) -> Result<i64, TicketError> {
    update_mark(kind, a, b, Change::Take(n))
}

/// Move the mark of `(kind, a, b)` to `to`, which must not be below it.
pub fn advance(kind: Kind, a: &str, b: &str, to: i64) -> Result<i64, TicketError> {
    update_mark(kind, a, b, Change::AdvanceTo(to))
}

/// The current mark as this transaction sees it, without locking.
pub fn current(kind: Kind, a: &str, b: &str) -> i64 {
    let local = STATE.with(|s| {
        let mut s = s.borrow_mut();
        let s = &mut *s;
        encode_key(&mut s.key_buf, kind, a, b);
        s.held.get(&s.key_buf[..]).map(|h| h.mark)
    });
    local.unwrap_or_else(|| store::read(kind, a, b))
}

fn update_mark(kind: Kind, a: &str, b: &str, change: Change) -> Result<i64, TicketError> {
    check_writable()?;
    let subxact = unsafe { pg_sys::GetCurrentSubTransactionId() };
    let fast = STATE.with(|s| -> Option<Result<i64, TicketError>> {
        let mut s = s.borrow_mut();
        let s = &mut *s;
        if s.flushed {
            return Some(Err(TicketError::AllocationAfterFlush));
        }
        encode_key(&mut s.key_buf, kind, a, b);
        let held = s.held.get_mut(&s.key_buf[..])?;
        Some(change.apply(kind, held.mark).map(|new_mark| {
            if subxact != TOP_SUBXACT && held.logged_in != subxact {
                held.logged_in = subxact;
                s.undo.push(Undo {
                    subxact,
                    key: s.key_buf.clone().into_boxed_slice(),
                    action: UndoAction::Restore(held.mark),
                });
            }
            held.mark = new_mark;
            new_mark
        }))
    });
    if let Some(result) = fast {
        return result;
    }

    register_callbacks();
    let taken = change.taken_by_lock();
    let stored = match store::lock_and_take(kind, a, b, taken) {
        Locked::Took(stored) => stored,
        Locked::WouldOverflow(mark) => return Err(counter::CounterError::Overflow { what: kind.what(), mark, n: taken }.into()),
    };
    // The row is ours until the transaction (or this subtransaction) ends.
    let mark = match change {
        Change::Take(_) => stored,
        Change::AdvanceTo(_) => change.apply(kind, stored)?,
    };
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        let s = &mut *s;
        encode_key(&mut s.key_buf, kind, a, b);
        let key: Box<[u8]> = s.key_buf.clone().into_boxed_slice();
        if subxact != TOP_SUBXACT {
            s.undo.push(Undo { subxact, key: key.clone(), action: UndoAction::Forget });
        }
        s.held.insert(key, Held { stored, mark, logged_in: subxact });
    });
    Ok(mark)
}

fn register_callbacks() {
    let first = STATE.with(|s| !std::mem::replace(&mut s.borrow_mut().callbacks_registered, true));
    if first {
        // Registered once for the backend's life: pgrx's own per-transaction
        // hooks survive PREPARE TRANSACTION and fire in the next transaction.
        unsafe {
            pg_sys::RegisterXactCallback(Some(on_xact_event), std::ptr::null_mut());
            pg_sys::RegisterSubXactCallback(Some(on_subxact_event), std::ptr::null_mut());
        }
    }
}

fn flush_marks() {
    let dirty: Vec<(Box<[u8]>, i64)> = STATE.with(|s| {
        let mut s = s.borrow_mut();
        s.flushed = true;
        s.held
            .iter()
            .filter(|(_, h)| h.mark != h.stored)
            .map(|(k, h)| (k.clone(), h.mark))
            .collect()
    });
    if dirty.is_empty() {
        return;
    }
    // Pre-commit runs after the last statement's snapshot was released.
    unsafe { pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot()) };
    for (key, mark) in &dirty {
        let (kind, a, b) = decode_key(key);
        store::write(kind, a, b, *mark);
    }
    unsafe { pg_sys::PopActiveSnapshot() };
}

fn forget_all() {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        s.held.clear();
        s.undo.clear();
        s.flushed = false;
    });
}

#[pg_guard]
unsafe extern "C-unwind" fn on_xact_event(event: pg_sys::XactEvent::Type, _arg: *mut c_void) {
    let idle = STATE.with(|s| {
        let s = s.borrow();
        s.held.is_empty() && !s.flushed
    });
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
        let mut s = s.borrow_mut();
        if s.undo.last().is_none_or(|u| u.subxact != my_subid) {
            return;
        }
        match event {
            pg_sys::SubXactEvent::SUBXACT_EVENT_COMMIT_SUB => {
                // The entries of a subtransaction (its committed children's
                // included) sit at the end of the log; they now belong to
                // the parent, and the top level needs none.
                let start = s.undo.iter().rposition(|u| u.subxact != my_subid).map_or(0, |i| i + 1);
                if parent_subid == TOP_SUBXACT {
                    s.undo.truncate(start);
                } else {
                    s.undo[start..].iter_mut().for_each(|u| u.subxact = parent_subid);
                }
            }
            pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB => {
                while s.undo.last().is_some_and(|u| u.subxact == my_subid) {
                    let undo = s.undo.pop().unwrap();
                    match undo.action {
                        UndoAction::Restore(mark) => {
                            if let Some(h) = s.held.get_mut(&undo.key) {
                                h.mark = mark;
                            }
                        }
                        UndoAction::Forget => {
                            s.held.remove(&undo.key);
                        }
                    }
                }
            }
            _ => {}
        }
    });
}
