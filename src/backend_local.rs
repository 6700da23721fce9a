//! A value of this backend's own in a plain static, for the hot paths.
//!
//! A `thread_local!` in a shared library is reached through
//! `__tls_get_addr`, a function call on every access: a few percent of a
//! call as short as `snowflake_id()`. A PostgreSQL backend (and each of our
//! background workers) is one process with one thread, and pg_ticket starts
//! no threads inside the server; each process starts from the postmaster's
//! copy, which never sets these. So a static `Cell` is as private to a
//! backend as a thread-local is, and no access can overlap another.

use std::cell::Cell;

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
}
