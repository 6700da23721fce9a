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
use ticket_core::snowflake::{IdSpace, Layout, SnowflakeError};

use crate::backend_local::BackendLocal;
use crate::errors::{OrRaise, TicketError};
use crate::{settings, state_tables};

/// The state-table generation at which this database's space was found
/// to be this server's.
static CHECKED: BackendLocal<Option<u64>> = BackendLocal::new(None);
/// The transaction (or subtransaction) that recorded this database's
/// space in this backend, if one did.
static RECORDED_BY: BackendLocal<pg_sys::TransactionId> = BackendLocal::new(pg_sys::InvalidTransactionId);
/// The space `for_reading` found, at a state-table generation.
static READ_IN: BackendLocal<Option<(u64, Option<IdSpace>)>> = BackendLocal::new(None);

/// Whether this database's space was recorded by the current transaction
/// (its first use is under way here): what the server stamps then is the
/// first of the space, not one that a mark should have covered.
pub fn recorded_in_this_transaction() -> bool {
    let xid = RECORDED_BY.get();
    xid != pg_sys::InvalidTransactionId && unsafe { pg_sys::TransactionIdIsCurrentTransactionId(xid) }
}

/// This server's snowflake ID space: its epoch (Unix ms) and machine bits
/// (also without preloading: those its configuration names).
#[pg_extern(stable, parallel_safe, schema = "pgticket")]
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
-- 0.4.0: a loaded row that is there already is skipped (a dump restored
-- into the database it came from, SPEC s.17.3).
CREATE TRIGGER keeps_present BEFORE INSERT ON pgticket.id_space
    FOR EACH ROW EXECUTE FUNCTION pgticket.merge_loaded_row();
ALTER TABLE pgticket.id_space ENABLE ALWAYS TRIGGER keeps_present;
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
                // As committed now: this statement's snapshot may predate
                // another first use's commit (REPEATABLE READ).
                spaces = committed_spaces(table.oid);
            }
            if spaces.is_empty() {
                // The first use records the space, with no lock held
                // across the caller's transaction (SPEC §13.11: a first
                // use left open or prepared stalled every other one): it
                // inserts its row, then looks at every row, in progress
                // too. Two first uses of different spaces (a registry
                // loading on demand, its configuration reloaded between
                // them) cannot both miss each other: the later insert
                // sees the earlier, and refuses. Of one space (a preloaded
                // server's, fixed at its start) both stand: two rows that
                // say the same. The key's time is the clock's, so two
                // inserts rarely meet on it; two of one space in the same
                // microsecond (32 first grants of a new registry at once
                // did, once in several runs: 23505 for one of them) say
                // the same thing, and the later one adds nothing.
                client.update(
                    "INSERT INTO pgticket.id_space (epoch_ms, machine_bits, recorded_at) VALUES ($1, $2, pg_catalog.clock_timestamp()) \
                     ON CONFLICT DO NOTHING",
                    None,
                    &[mine.epoch_unix_ms.into(), (mine.machine_bits as i32).into()],
                )?;
                // Leases not yet free, before the rows are looked at: a
                // lease another first use committed is seen with its row.
                let live = client
                    .select(
                        "SELECT EXISTS (SELECT FROM pgticket.machine_id_leases \
                          WHERE expires_at OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs => \
                                COALESCE(margin_ms, 600000) OPERATOR(pg_catalog./) 1000.0) \
                                OPERATOR(pg_catalog.>) pg_catalog.now())",
                        None,
                        &[],
                    )?
                    .first()
                    .get_one::<bool>()?
                    .unwrap_or(false);
                let rows = rows_in_progress_too(table.oid);
                if let Some((other, _)) = rows.iter().find(|(s, _)| *s != mine) {
                    return Ok(Err(TicketError::Snowflake(SnowflakeError::OtherIdSpace {
                        location: "another transaction's first use of this database (pgticket.id_space, not yet committed)".into(),
                        recorded: *other,
                        configured: mine,
                    })));
                }
                // Leases with no row but this one: the table was emptied
                // under them, and their holders stamp in a space no longer
                // known.
                if live && rows.len() <= 1 {
                    return Ok(Err(TicketError::BadConfiguration(
                        "pgticket.id_space is empty while leases of this registry are not yet free: it was emptied under them; restore its row (the space those holders stamp in), or wait until their ids are free".into(),
                    )));
                }
                // A row of a prepared transaction is an earlier first use
                // (it outlived a restart): this one is not the database's
                // first (`history`: a server that lost its mark refuses).
                let prepared = prepared_transactions(client)?;
                if rows.iter().any(|(_, xmin)| prepared.contains(xmin)) {
                    return Ok(Ok(vec![mine]));
                }
                RECORDED_BY.set(unsafe { pg_sys::GetCurrentTransactionIdIfAny() });
                spaces.push(mine);
            }
            Ok::<_, pgrx::spi::Error>(Ok(spaces))
        })
    })
    .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot read pgticket.id_space: {e}"))?;
    match spaces[..] {
        [one] => Ok(Some(one)),
        _ => {
            let (recorded, configured) = match spaces.iter().find(|s| **s != mine) {
                Some(other) => (*other, mine),
                None => (spaces[0], spaces[1]),
            };
            Err(recorded_here(recorded, configured))
        }
    }
}

/// This database records `recorded`, and this server is set for `configured`.
fn recorded_here(recorded: IdSpace, configured: IdSpace) -> TicketError {
    TicketError::Snowflake(SnowflakeError::OtherIdSpace { location: "this database (pgticket.id_space, carried by its dump)".into(), recorded, configured })
}

/// The space to read this database's snowflakes in (`snowflake_decode`,
/// `snowflake_min_id`, `snowflake_max_id`; SPEC §18.1): the one recorded
/// with it — a database restored from a server of another space holds that
/// space's IDs, and decoding them with this server's bits would misread
/// them (machine 5 read as 20) — or, with none recorded, this server's
/// (None: not preloaded, no space known). Records nothing; two recorded
/// spaces are refused. Read once per state-table generation.
pub fn for_reading() -> Result<Option<IdSpace>, TicketError> {
    let generation = state_tables::generation();
    if let Some((at, space)) = READ_IN.get() {
        if at == generation {
            return Ok(space);
        }
    }
    let recorded = match state_tables::lookup().and_then(|t| t.id_space) {
        Some(table) => committed_spaces(table.oid),
        None => Vec::new(),
    };
    let space = match recorded[..] {
        [] => settings::preloaded().then(super::id_space),
        [one] => Some(one),
        [first, second, ..] => {
            return Err(TicketError::StateTableUnfit(format!(
                "this database records two snowflake ID spaces (pgticket.id_space: {first}; {second}): its IDs cannot be read in one; keep only the row of the space its IDs were made in"
            )))
        }
    };
    READ_IN.set(Some((generation, space)));
    Ok(space)
}

/// The spaces in `pgticket.id_space` as committed now (a self snapshot: it
/// sees what committed after this statement's snapshot was taken).
fn committed_spaces(table: pg_sys::Oid) -> Vec<IdSpace> {
    let mut spaces = Vec::new();
    state_tables::for_each_committed_row(table, |tuple, desc| {
        if let Some(space) = space_of(tuple, desc).filter(|s| !spaces.contains(s)) {
            spaces.push(space);
        }
    });
    spaces
}

/// The space of each row of `pgticket.id_space` committed now or being
/// inserted by a transaction in progress (a dirty snapshot), one per row,
/// with the transaction that inserted it.
fn rows_in_progress_too(table: pg_sys::Oid) -> Vec<(IdSpace, pg_sys::TransactionId)> {
    let mut rows = Vec::new();
    state_tables::for_each_row_seen(table, pg_sys::SnapshotType::SNAPSHOT_DIRTY, |tuple, desc| {
        if let Some(space) = space_of(tuple, desc) {
            rows.push((space, unsafe { pg_sys::submodules::htup::HeapTupleHeaderGetXmin((*tuple).t_data) }));
        }
    });
    rows
}

/// The transactions prepared in this database now.
fn prepared_transactions(client: &pgrx::spi::SpiClient<'_>) -> Result<Vec<pg_sys::TransactionId>, pgrx::spi::Error> {
    client
        .select(
            "SELECT transaction::pg_catalog.text::pg_catalog.int8 FROM pg_catalog.pg_prepared_xacts WHERE database OPERATOR(pg_catalog.=) pg_catalog.current_database()",
            None,
            &[],
        )?
        .map(|row| row.get::<i64>(1).map(|x| pg_sys::TransactionId::from(x.unwrap_or_default() as u32)))
        .collect()
}

/// A row's space (None for NULLs).
fn space_of(tuple: *mut pg_sys::HeapTupleData, desc: pg_sys::TupleDesc) -> Option<IdSpace> {
    const EPOCH_MS: i32 = 1;
    const MACHINE_BITS: i32 = 2;
    let (mut epoch_null, mut bits_null) = (false, false);
    let epoch = unsafe { pg_sys::heap_getattr(tuple, EPOCH_MS, desc, &mut epoch_null) };
    let bits = unsafe { pg_sys::heap_getattr(tuple, MACHINE_BITS, desc, &mut bits_null) };
    (!epoch_null && !bits_null).then(|| IdSpace { epoch_unix_ms: epoch.value() as i64, machine_bits: bits.value() as i32 as u32 })
}

/// The space a registry leases ids in: its database's recorded space
/// (recorded now if none is), which the server must be set for, preloaded
/// or not. Not the settings alone: a restart with another epoch or
/// layout, or a session SET on an unloaded server's placeholder, would
/// lease ids into another space; nor the recorded space alone (#46 item 9:
/// 0.4.0's registry loading on demand went on granting in its old space
/// after its configuration moved to another, where a preloaded one
/// refuses).
pub fn registry_space() -> Result<(i64, Layout), TicketError> {
    if settings::preloaded() {
        check_database()?;
    }
    let mine = configured()?;
    let space = match recorded()? {
        Some(space) if space != mine => return Err(recorded_here(space, mine)),
        Some(space) => space,
        None => mine,
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
            return Err(recorded_here(recorded, server));
        }
    }
    CHECKED.set(Some(generation));
    Ok(())
}

/// Run once by the update to 0.5.0 (#46 item 7): a database whose
/// extension was created at 0.2.0 recorded no space, and 0.3.0's update
/// recorded one only where leases existed, so a dump of a database that
/// made snowflakes under 0.2.0 was served at once by a server with the
/// same machine id. Where no space is recorded and this server has a mark
/// (it made snowflakes, perhaps for this database), the mark's space is
/// recorded now: a restore of the database is then held like any other.
/// Conservative: a database of that server that never made one is held
/// too, until vouched for. True if it recorded one.
#[pg_extern(sql = false)]
fn record_space_of_the_mark() -> bool {
    crate::errors::postgres_errors_as_raised(|| {
        let Some(table) = state_tables::lookup().and_then(|t| t.id_space) else { return false };
        if !committed_spaces(table.oid).is_empty() {
            return false;
        }
        // No mark, nothing to record: the settings are not even read (a
        // server that never preloaded may have any in its configuration).
        if !std::path::Path::new(super::MARK_FILE).exists() {
            return false;
        }
        let mine = configured().or_raise();
        let store = ticket_core::snowflake::FileMarkStore { path: std::path::Path::new(super::MARK_FILE), space: mine };
        let Some(space) = store.recorded_space().map_err(TicketError::from).or_raise() else { return false };
        state_tables::as_owner_of(table, || {
            Spi::connect_mut(|client| {
                client.update(
                    "INSERT INTO pgticket.id_space (epoch_ms, machine_bits, recorded_at) VALUES ($1, $2, pg_catalog.clock_timestamp()) ON CONFLICT DO NOTHING",
                    None,
                    &[space.epoch_unix_ms.into(), (space.machine_bits as i32).into()],
                )
                .map(|_| ())
            })
        })
        .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot record the ID space: {e}"));
        true
    })
}
