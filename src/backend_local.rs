//! A process's own values in plain statics: every per-backend value of
//! the extension (allocation state, caches, flags) lives in one of these.
//!
//! A `thread_local!` in a shared library is reached through
//! `__tls_get_addr`, a function call on every access: a few percent of a
//! call as short as `snowflake_id()`, and 11% of a `next_scoped_id()` served
//! from the transaction's marks. A PostgreSQL backend (and each of our
//! background workers) is one process with one thread, and pg_ticket starts
//! no threads inside the server; each process starts from its own copy of
//! the postmaster's (made by fork, as a thread-local's would be), which sets
//! none of these. So a static `Cell` is as private to a backend as a
//! thread-local is, and no access can overlap another.
//! That holds only inside the server: a plain `#[test]` (cargo runs them on
//! several threads) or a thread of ours in the server would make these a
//! data race; keep such code away from them (tests of this crate run as
//! `#[pg_test]`, each in a backend of its own).

use std::cell::{Cell, RefCell};

pub struct BackendLocal<T>(Cell<T>);

// Only the backend's own thread reads or writes it (module comment), so
// no value crosses threads either: `T` need not be `Send` (an SPI plan).
unsafe impl<T> Sync for BackendLocal<T> {}

impl<T: Copy> BackendLocal<T> {
    pub const fn new(value: T) -> Self {
        BackendLocal(Cell::new(value))
    }

    #[inline]
    pub fn get(&self) -> T {
        self.0.get()
    }

    #[inline]
    pub fn set(&self, value: T) {
        self.0.set(value)
    }

    #[inline]
    pub fn replace(&self, value: T) -> T {
        self.0.replace(value)
    }
}

/// A backend's own value that is not `Copy` (maps, buffers), made on first
/// use.
pub struct BackendRefCell<T>(RefCell<Option<T>>);

// As for BackendLocal.
unsafe impl<T> Sync for BackendRefCell<T> {}

impl<T: Default> BackendRefCell<T> {
    pub const fn new() -> Self {
        BackendRefCell(RefCell::new(None))
    }

    /// `f` on the value. A call inside `f` that reaches the same value
    /// again panics (as a thread-local's `RefCell` would).
    #[inline]
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        f(self.0.borrow_mut().get_or_insert_with(T::default))
    }
}
