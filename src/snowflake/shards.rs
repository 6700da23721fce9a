//! Sharded IDs (`sharded_id(shard)`, SPEC §15): `ms << 22 | shard << 10 |
//! sequence` for the logical shards this server owns (`pg_ticket.shards`).
//! The layout, the per-shard clock rule and the handover are
//! `ticket_core::sharded`; here are the shared memory and the SQL.
//!
//! Shared memory: one `ShardState` (an atomic) per shard, each on its own
//! cache line, so shards issued in parallel never contend; no lock. They
//! are stamped on the snowflake generator's clock and durable mark (the
//! mark file and its WAL record), so a restart, a crash or a promoted
//! standby starts every shard above what was issued, as for snowflakes.
//! Every wait goes through the snowflake clock (interruptible).

use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgAtomic};
use ticket_core::sharded::{self as layout, Server, ShardTable, MAX_SHARD};

use super::{wal, SystemClock, GENERATOR};
use crate::args::required;
use crate::errors::{postgres_errors_as_raised, OrRaise, TicketError};
use crate::names::Name;
use crate::settings;

#[derive(Default)]
#[repr(transparent)]
pub struct Shards(ShardTable);

// Atomics only: valid in shared memory across processes.
unsafe impl PGRXSharedMemory for Shards {}

static SHARDS: PgAtomic<Shards> = unsafe { PgAtomic::new(c"pg_ticket_shards") };

pub fn init_shared_memory() {
    pg_shmem_init!(SHARDS);
}

/// This server's shards, generator, clock, mark and book.
fn server() -> Server<'static, SystemClock, wal::WalMarkStore, wal::WalShardBook> {
    Server {
        generator: &GENERATOR.get().0,
        table: &SHARDS.get().0,
        clock: &SystemClock,
        mark: &wal::WalMarkStore,
        book: &wal::WalShardBook,
        epoch_unix_ms: settings::epoch_unix_ms(),
    }
}

/// The book read into memory, its holds applied (`raise_snowflake_mark`:
/// a vouch leaves nothing of a restored start pending).
pub fn load_book() -> Result<(), TicketError> {
    server().load().map_err(TicketError::from)
}

/// The shard argument, checked, on a preloading server that may write.
fn shard_arg(shard: Option<i32>, function: &'static str) -> u16 {
    if !settings::preloaded() {
        TicketError::NotPreloaded(function).raise();
    }
    let shard = layout::check_shard(i64::from(required("shard", shard))).or_raise();
    crate::xact::check_writable().or_raise();
    shard
}

/// The next ID of `shard`, which this server owns: listed in
/// `pg_ticket.shards` and accepted here.
#[pg_extern(volatile, parallel_unsafe)]
fn sharded_id(shard: Option<i32>) -> i64 {
    postgres_errors_as_raised(|| {
        let shard = shard_arg(shard, "sharded_id");
        super::space::check_database().or_raise();
        super::history::check().or_raise();
        server().next_id(shard, settings::owns_shard(shard)).map_err(|e| super::name_the_wait(e.into())).or_raise()
    })
}

/// Admin, on the shard's old owner, after removing it from
/// `pg_ticket.shards` and reloading: close the shard here for good (until
/// accepted again; recorded in WAL, so standbys have it too) and return the
/// handover point for `pgticket.accept_shard()` on its new owner (the same point
/// when asked again).
#[pg_extern(name = "release_shard", volatile, parallel_unsafe, schema = "pgticket")]
fn sharded_release(shard: Option<i32>) -> i64 {
    postgres_errors_as_raised(|| {
        let shard = shard_arg(shard, "pgticket.release_shard");
        // Its point stands above the mark: not a mark this server lost.
        super::history::check().or_raise();
        server().release(shard, settings::owns_shard(shard)).map_err(|e| super::name_the_wait(e.into())).or_raise()
    })
}

/// Admin, on the shard's new owner, after adding it to `pg_ticket.shards`
/// and reloading: issue the shard here, only above `handover_id` (its old
/// owner's `pgticket.release_shard()`; 0 for a shard no server issued before),
/// here and after a restart or failover. Waits until this server's clock
/// has passed it (at most 11 s). Returns the shard's first ID here. Not
/// transactional, like `pgticket.release_shard()`: in effect once called, whatever
/// becomes of the call or its transaction (an error, a cancel, a rollback).
#[pg_extern(name = "accept_shard", volatile, parallel_unsafe, schema = "pgticket")]
fn sharded_accept(shard: Option<i32>, handover_id: Option<i64>) -> i64 {
    postgres_errors_as_raised(|| {
        let shard = shard_arg(shard, "pgticket.accept_shard");
        // It issues the shard's first ID: in this database's ID space only,
        // and above the lost mark of a server that lost it.
        super::space::check_database().or_raise();
        super::history::check().or_raise();
        let handover_id = required("handover_id", handover_id);
        let point = layout::decompose(handover_id).or_raise();
        if handover_id != 0 && point.shard != shard {
            TicketError::InvalidArgument(format!("{handover_id} is an ID of shard {}, not of shard {shard}", point.shard)).raise();
        }
        let listed = settings::owns_shard(shard);
        server().accept(shard, listed, handover_id).map_err(|e| super::name_the_wait(e.into())).or_raise();
        server().next_id(shard, listed).map_err(|e| super::name_the_wait(e.into())).or_raise()
    })
}

/// The parts of a sharded ID, read in this database's epoch (`epoch_for`).
#[pg_extern(stable, parallel_safe)]
fn sharded_decode(
    id: Option<i64>,
) -> TableIterator<'static, (name!(created_at, TimestampWithTimeZone), name!(shard, i32), name!(sequence, i32))> {
    postgres_errors_as_raised(|| {
        let epoch = super::epoch_for("sharded_decode");
        let parts = layout::decompose(required("id", id)).or_raise();
        TableIterator::once((crate::clock::timestamptz_or_error(epoch + parts.millis as i64), i32::from(parts.shard), i32::from(parts.sequence)))
    })
}

/// The lowest sharded ID any shard can have in the millisecond of `at`.
#[pg_extern(stable, parallel_safe)]
fn sharded_min_id(at: Option<TimestampWithTimeZone>) -> i64 {
    postgres_errors_as_raised(|| {
        let epoch = super::epoch_for("sharded_min_id");
        layout::id_range_of_millisecond(crate::args::unix_ms_of(at), epoch).or_raise().0
    })
}

/// The highest sharded ID any shard can have in the millisecond of `at`.
#[pg_extern(stable, parallel_safe)]
fn sharded_max_id(at: Option<TimestampWithTimeZone>) -> i64 {
    postgres_errors_as_raised(|| {
        let epoch = super::epoch_for("sharded_max_id");
        layout::id_range_of_millisecond(crate::args::unix_ms_of(at), epoch).or_raise().1
    })
}

/// The shard of `key` among `shard_count` (1 .. 4096): FNV-1a (64 bits) of
/// the key's bytes in the database's encoding, modulo the count — stable,
/// and computed the same by `ticket_client::shard_of`.
#[pg_extern(immutable, parallel_safe)]
fn shard_of(key: Option<Name<'_>>, shard_count: Option<i32>) -> i32 {
    postgres_errors_as_raised(|| {
        let key = required("key", key);
        let count = required("shard_count", shard_count);
        let count = u16::try_from(count).ok().filter(|c| (1..=MAX_SHARD + 1).contains(c)).unwrap_or_else(|| {
            TicketError::InvalidArgument(format!("shard_count is 1..{}, not {count}", MAX_SHARD + 1)).raise()
        });
        i32::from(layout::shard_of(key.bytes(), count))
    })
}

extension_sql!(
    r#"
REVOKE EXECUTE ON FUNCTION pgticket.release_shard(integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgticket.accept_shard(integer, bigint) FROM PUBLIC;
"#,
    name = "shard_privileges",
    requires = [sharded_release, sharded_accept]
);
