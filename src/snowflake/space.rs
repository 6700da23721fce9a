//! The snowflake ID space recorded with a database's state (SPEC §13.10):
//! the epoch and layout of the snowflakes made for it — by this server's
//! `snowflake_id()`, or by the holders this registry leases ids to —
//! recorded at the first use and carried by a dump. A server set for
//! another space refuses to stamp or lease in that database: its IDs would
//! be those of another time (a later epoch reissues the IDs of an earlier
//! one). The mark file records the server's own space (`wal.rs`, checked
//! at start).
//!
//! Recorded when first needed, not at CREATE EXTENSION: a database that
//! never made a snowflake holds no space, whatever the server was set to
//! then. Checked once per backend and state-table generation (any change
//! of `pgticket.id_space` invalidates it in every backend), so
//! `snowflake_id()` reads no table in steady state. Touches:
//! `pgticket.id_space`, as its owner.

use pgrx::prelude::*;
use std::cell::Cell;
use ticket_core::snowflake::{IdSpace, Layout, SnowflakeError};

use crate::errors::{OrRaise, TicketError};
use crate::{settings, state_tables};

thread_local! {
    /// The state-table generation at which this database's space was found
    /// to be this server's.
    static CHECKED: Cell<Option<u64>> = const { Cell::new(None) };
}

/// This server's snowflake ID space: its epoch (Unix ms) and machine bits
/// (also without preloading: those its configuration names).
#[pg_extern(stable, parallel_safe)]
fn snowflake_id_space() -> TableIterator<'static, (name!(epoch_ms, i64), name!(machine_bits, i32))> {
    let space = configured().or_raise();
    TableIterator::once((space.epoch_unix_ms, space.machine_bits as i32))
}

/// The space this server is set for.
fn configured() -> Result<IdSpace, TicketError> {
    let epoch_unix_ms = settings::registry_epoch_unix_ms().map_err(TicketError::BadConfiguration)?;
    let layout = settings::registry_layout().map_err(TicketError::BadConfiguration)?;
    Ok(IdSpace::new(epoch_unix_ms, layout))
}

/// Any change of the recorded space reaches every backend at its next
/// statement (a relcache invalidation of the table: `CHECKED` is dropped).
#[pg_trigger(sql = false)]
fn id_space_changed<'a>(trigger: &'a pgrx::PgTrigger<'a>) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, pgrx::PgTriggerError> {
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(trigger.relation()?.oid()) };
    Ok(None)
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
    'The snowflake ID space (epoch, machine bits) of the IDs made for this database, recorded at the first use; a server set for another refuses snowflake_id() and leases here';
CREATE FUNCTION pgticket.id_space_changed() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'id_space_changed_wrapper';
CREATE TRIGGER changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON pgticket.id_space
    FOR EACH STATEMENT EXECUTE FUNCTION pgticket.id_space_changed();
ALTER TABLE pgticket.id_space ENABLE ALWAYS TRIGGER changed;
SELECT pg_catalog.pg_extension_config_dump('pgticket.id_space', '');
REVOKE ALL ON pgticket.id_space FROM PUBLIC;
REVOKE ALL ON FUNCTION pgticket.id_space_changed() FROM PUBLIC;
"#,
    name = "id_space",
    requires = [snowflake_id_space, "schema"]
);

/// The space recorded with this database (None for 0.2.0's objects, before
/// ALTER EXTENSION pg_ticket UPDATE): recorded now, as this server is set,
/// if none is; an error if the database holds IDs of two.
pub fn recorded() -> Result<Option<IdSpace>, TicketError> {
    let Some(table) = state_tables::lookup().and_then(|t| t.id_space) else {
        return Ok(None);
    };
    state_tables::check_change_trigger(table, "id_space");
    let mine = configured()?;
    let spaces = state_tables::as_owner_of(table, || {
        Spi::connect_mut(|client| {
            let mut spaces = client
                .select("SELECT DISTINCT epoch_ms, machine_bits FROM pgticket.id_space", None, &[])?
                .map(|row| {
                    Ok(IdSpace {
                        epoch_unix_ms: row.get::<i64>(1)?.unwrap_or_default(),
                        machine_bits: row.get::<i32>(2)?.unwrap_or_default() as u32,
                    })
                })
                .collect::<Result<Vec<_>, pgrx::spi::Error>>()?;
            if spaces.is_empty() {
                client.update(
                    "INSERT INTO pgticket.id_space (epoch_ms, machine_bits) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                    None,
                    &[mine.epoch_unix_ms.into(), (mine.machine_bits as i32).into()],
                )?;
                spaces.push(mine);
            }
            Ok::<_, pgrx::spi::Error>(spaces)
        })
    })
    .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot read pgticket.id_space: {e}"));
    match spaces[..] {
        [one] => Ok(Some(one)),
        _ => {
            let (recorded, configured) = match spaces.iter().find(|s| **s != mine) {
                Some(other) => (*other, mine),
                None => (spaces[0], spaces[1]),
            };
            Err(TicketError::Snowflake(SnowflakeError::OtherIdSpace { location: "this database (pgticket.id_space, carried by its dump)".into(), recorded, configured }))
        }
    }
}

/// The space a registry leases ids in: its database's recorded space
/// (recorded now if none is), which a preloaded server must share. Not the
/// settings alone: a restart with another epoch or layout, or a session SET
/// on an unloaded server's placeholder, would lease ids into another space.
pub fn registry_space() -> Result<(i64, Layout), TicketError> {
    if settings::preloaded() {
        check_database()?;
    }
    let space = match recorded()? {
        Some(space) => space,
        None => configured()?,
    };
    let layout = space.layout().ok_or_else(|| {
        TicketError::BadConfiguration(format!(
            "this database's recorded ID space (pgticket.id_space) has {} machine bits, which no layout has",
            space.machine_bits
        ))
    })?;
    Ok((space.epoch_unix_ms, layout))
}

/// Refuses (55000) a database whose recorded ID space is not this server's.
pub fn check_database() -> Result<(), TicketError> {
    let generation = state_tables::generation();
    if CHECKED.get() == Some(generation) {
        return Ok(());
    }
    let server = super::id_space();
    if let Some(recorded) = recorded()? {
        if recorded != server {
            return Err(TicketError::Snowflake(SnowflakeError::OtherIdSpace {
                location: "this database (pgticket.id_space, carried by its dump)".into(),
                recorded,
                configured: server,
            }));
        }
    }
    CHECKED.set(Some(generation));
    Ok(())
}
