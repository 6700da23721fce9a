//! pg_ticket: ID allocation inside PostgreSQL.
//!
//! Modules in layers: each imports only from its own layer or the ones
//! below, and no modules import each other round a circle (a folder is one
//! module; `scripts/layers-check.py` in `make test-docs` holds this list to
//! the code). A change to the ground can touch everything; a change to the
//! surface touches nothing below it.
//!
//! 1. Ground: what everything uses, importing nothing above it.
//! - `names`: `text` arguments as the database's bytes (any encoding).
//! - `backend_local`: every per-backend value, in plain statics (no TLS).
//! - `clock`: the real clock in Unix ms, and timestamptz conversions.
//! - `refusals`: the refusal and wait counts behind `pgticket.status`.
//! - `errors`: every error pg_ticket raises, with its SQLSTATE.
//! - `settings`: every `pg_ticket.*` setting, defined and checked once.
//! - `args`: SQL arguments checked alike (NULL, name limits, infinity).
//!
//! 2. PostgreSQL plumbing: the catalog, the transaction, who may do what.
//! - `state_tables`: which relations the state tables are, who owns each,
//!   and running statements as that owner.
//! - `xact`: what an allocation asks of the transaction (writable, durable).
//! - `quota`: how many scopes each role may create.
//! - `rights`: which roles may allocate from which scopes (SPEC §16).
//! - `group`: a group of primaries replicating to each other (SPEC §19.3):
//!   this node, the nodes known, a gap-free scope's home and who creates.
//!
//! 3. Allocators.
//! - `counters/`: scoped counters and blocks: the transaction's held marks,
//!   savepoint undo, commit-time write-back, and the only table access.
//! - `tickets/`: `next_ticket()`: the scope cache in shared memory and the
//!   per-database workers that reserve its segments.
//! - `snowflake/`: the shared-memory generator, its mark in WAL, the ID
//!   space, self-leasing and sharded IDs; the layout and clock rules live in
//!   the PostgreSQL-free `ticket-core` crate.
//! - `leases/`: the machine-id registry (lease, renew, release, revoke);
//!   its grants record the ID space in the generator's mark.
//!
//! 4. SQL surface: what wires allocators together for a caller.
//! - `api`: the SQL-facing allocator functions (validate, call, convert).
//! - `triggers`: `number_rows()` and its per-row scopes.
//! - `loads`: rows loaded into the mark tables (a restore into a used
//!   database) keep the higher mark.
//! - `convert`: a sequence's key column converted to tickets or snowflakes
//!   and back (SPEC §19.4), SQL only.
//! - `replicated`: rows replicated from another primary of a group merge
//!   (SPEC §19): a series' mark never goes back, a node's own state stays.
//! - `public_ids`: public IDs (#50): keys, grants, `public_id` and
//!   `private_id` over `ticket-core`'s cipher.
//! - `status`: the `pgticket.status` view.
//! - `pg_tests`: the pgrx tests, run in a server by `make test-pgrx`.
//! - this file: `_PG_init`, the start-up wiring.

use pgrx::prelude::*;

mod api;
mod args;
mod backend_local;
mod clock;
mod convert;
mod counters;
mod errors;
mod group;
mod leases;
mod loads;
mod names;
mod public_ids;
mod quota;
mod refusals;
mod replicated;
mod rights;
mod settings;
mod snowflake;
mod state_tables;
mod status;
mod tickets;
mod triggers;
mod xact;

::pgrx::pg_module_magic!(name, version);

extension_sql_file!("../sql/schema.sql", name = "schema", bootstrap);
extension_sql_file!("../sql/finalize.sql", name = "finalize", finalize);

/// The extension's own schema (created by sql/schema.sql): administration,
/// monitoring, the registry, shard handover and rights live here, the
/// everyday allocators in the schema the extension is created in (SPEC
/// §18.3). Functions name it with `#[pg_extern(schema = "pgticket")]`.
#[pg_schema]
mod pgticket {}

/// Start-up, as pg_cron orders it: nothing during pg_upgrade (but what its
/// clusters must not lose, `snowflake::at_start`); settings;
/// then, only while preloading, shared memory, hooks, the WAL resource
/// manager and the workers.
#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    if unsafe { pgrx::pg_sys::IsBinaryUpgrade } {
        // pg_upgrade: nothing runs, but its new cluster never inherits a
        // mark it cannot prove and its old one is refused while held (SPEC
        // §17.1, §20.4) — at preload, or when pg_upgrade LOADs the library
        // to check for it (whether or not the new server preloads it yet).
        snowflake::at_start();
        return;
    }
    let Some(preloaded) = settings::init() else { return };
    tickets::init_shared_memory(preloaded.ticket_cache_scopes);
    tickets::install_hooks();
    snowflake::init_shared_memory();
    snowflake::register_wal();
    snowflake::refuse_another_id_space();
    snowflake::at_start();
    if preloaded.self_leasing {
        snowflake::register_lease_worker();
    }
    refusals::init_shared_memory();
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
