//! A value of this backend's own in a plain static, for the hot paths.
//!
//! A `thread_local!` in a shared library is reached through
//! `__tls_get_addr`, a function call on every access: a few percent of a
//! call as short as `snowflake_id()`. A PostgreSQL backend (and each of our
//! background workers) is one process with one thread, and pg_ticket starts
//! no threads inside the server; each process starts from the postmaster's
//! copy, which never sets these. So a static `Cell` is as private to a
//! backend as a thread-local is, and no access can overlap another.
//! That holds only inside the server: a plain `#[test]` (cargo runs them on
//! several threads) or a thread of ours in the server would make these a
//! data race; keep such code away from them (tests of this crate run as
//! `#[pg_test]`, each in a backend of its own).

use std::cell::{Cell, RefCell};

pub struct BackendLocal<T>(Cell<T>);

// Only the backend's own thread reads or writes it (module comment).
unsafe impl<T: Send> Sync for BackendLocal<T> {}

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

// Only the backend's own thread reads or writes it (module comment).
unsafe impl<T: Send> Sync for BackendRefCell<T> {}

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
