//! pg_ticket: ID allocation inside PostgreSQL.
//!
//! Module map:
//! - `api`: the SQL-facing functions (thin: validate, call, convert).
//! - `allocator`: the allocation core shared by scoped counters and blocks:
//!   backend-local marks for the current transaction, savepoint undo, and the
//!   transaction callbacks that write marks back at commit.
//! - `store`: table access for the marks (SPI statements, run as the owner).
//! - `snowflake`: the shared-memory generator and the real clock; the layout
//!   and clock rules live in the PostgreSQL-free `ticket-core` crate.
//! - `settings`: every `pg_ticket.*` server setting, and `_PG_init` ordering.
//! - `errors`: every error pg_ticket raises, with its SQLSTATE.

use pgrx::prelude::*;

mod allocator;
mod api;
mod errors;
mod settings;
mod snowflake;
mod store;

::pgrx::pg_module_magic!(name, version);

extension_sql_file!("../sql/schema.sql", name = "schema", bootstrap);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    settings::init();
}

#[cfg(any(test, feature = "pg_test"))]
mod pg_tests;

#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec!["shared_preload_libraries = 'pg_ticket'", "max_prepared_transactions = 10"]
    }
}
