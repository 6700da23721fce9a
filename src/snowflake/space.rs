//! The snowflake ID space recorded with a database's state (SPEC §13.10):
//! the epoch and layout of the snowflakes stored there, written by CREATE
//! EXTENSION (and the update to 0.3.0) from the server's settings and
//! carried by a dump. A server set for another space refuses to stamp in
//! that database: its IDs would be those of another time (a later epoch
//! reissues the IDs of an earlier one). The mark file records the server's
//! own space (`wal.rs`, checked at start).
//!
//! Checked once per backend and table incarnation (its relation id), so
//! `snowflake_id()` reads no table in steady state. Touches:
//! `pgticket.id_space`, read as its owner.

use pgrx::prelude::*;
use std::cell::Cell;
use ticket_core::snowflake::{IdSpace, SnowflakeError};

use crate::errors::TicketError;
use crate::{settings, state_tables};

thread_local! {
    static CHECKED: Cell<Option<pg_sys::Oid>> = const { Cell::new(None) };
}

/// This server's snowflake ID space: its epoch (Unix ms) and machine bits,
/// as a database records it (also without preloading: the epoch
/// postgresql.conf names).
#[pg_extern(stable, parallel_safe)]
fn snowflake_id_space() -> TableIterator<'static, (name!(epoch_ms, i64), name!(machine_bits, i32))> {
    let space = IdSpace::with_epoch(settings::registry_epoch_unix_ms());
    TableIterator::once((space.epoch_unix_ms, space.machine_bits as i32))
}

extension_sql!(
    r#"
CREATE TABLE pgticket.id_space (
    epoch_ms bigint NOT NULL,
    machine_bits integer NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (epoch_ms, machine_bits, recorded_at)
);
COMMENT ON TABLE pgticket.id_space IS
    'The snowflake ID space (epoch, machine bits) of the IDs made for this database; a server set for another refuses snowflake_id() here';
INSERT INTO pgticket.id_space (epoch_ms, machine_bits) SELECT epoch_ms, machine_bits FROM snowflake_id_space();
SELECT pg_catalog.pg_extension_config_dump('pgticket.id_space', '');
REVOKE ALL ON pgticket.id_space FROM PUBLIC;
"#,
    name = "id_space",
    requires = [snowflake_id_space, "schema"]
);

/// Refuses (55000) a database whose recorded ID space is not this server's.
pub fn check_database() -> Result<(), TicketError> {
    let Some(table) = state_tables::lookup().and_then(|t| t.id_space) else {
        // 0.2.0's objects, before ALTER EXTENSION pg_ticket UPDATE.
        return Ok(());
    };
    if CHECKED.get() == Some(table.oid) {
        return Ok(());
    }
    let server = super::id_space();
    let recorded = state_tables::as_owner_of(table, || {
        Spi::connect(|client| {
            client
                .select("SELECT epoch_ms, machine_bits FROM pgticket.id_space", None, &[])?
                .map(|row| {
                    Ok(IdSpace {
                        epoch_unix_ms: row.get::<i64>(1)?.unwrap_or_default(),
                        machine_bits: row.get::<i32>(2)?.unwrap_or_default() as u32,
                    })
                })
                .collect::<Result<Vec<_>, pgrx::spi::Error>>()
        })
    })
    .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot read pgticket.id_space: {e}"));
    if let Some(other) = recorded.into_iter().find(|space| *space != server) {
        return Err(TicketError::Snowflake(SnowflakeError::OtherIdSpace {
            location: "this database (pgticket.id_space, carried by its dump)".into(),
            recorded: other,
            configured: server,
        }));
    }
    CHECKED.set(Some(table.oid));
    Ok(())
}
