//! A value of this backend's own in a plain static, for the hot paths.
//!
//! A `thread_local!` in a shared library is reached through
//! `__tls_get_addr`, a function call on every access: a few percent of a
//! call as short as `snowflake_id()`. A backend runs SQL functions on its
//! one thread; the only threads of ours in a PostgreSQL process are
//! libpq connection helpers of the lease worker (`ticket_client::connect`),
//! which touch none of these. So a static `Cell` is as private to a backend
//! as a thread-local is, and no access can overlap another.

use std::cell::Cell;

pub struct BackendLocal<T>(Cell<T>);

// Only the backend's own thread reads or writes it (module comment).
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
}
