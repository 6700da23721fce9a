//! Rows loaded into the mark tables from outside pg_ticket's own calls (a
//! `pg_restore` or a `COPY` into a database that already allocated, SPEC
//! §17.3): a row whose scope is already here is not inserted beside it —
//! the mark becomes the higher of the two, and the load goes on. 0.3.0's
//! restore failed on the primary key and kept every lower mark.
//!
//! The trigger `keeps_higher` (BEFORE INSERT, FOR EACH ROW, enabled ALWAYS,
//! so a replica-mode load meets it too) on `pgticket.scoped_counters`,
//! `blocks` and `tickets`, and on the registry's `machine_id_leases`, where
//! the later lease of an id (the higher fencing token) is kept: a loaded
//! one replaces the row only as a renewal or a new lease may (the
//! `forward_only` trigger refuses the load otherwise). pg_ticket's own inserts (the first use of a
//! scope, run as the table's owner) pass untouched: the allocator must see
//! its `ON CONFLICT DO NOTHING`, and they cost one check of a flag.
//! `pg_restore --disable-triggers` skips it: its load then fails on the
//! primary key as before, loudly.
//!
//! On `id_space`, `rights` and `lease_registry` (`keeps_present`) a loaded
//! row that is there already (its primary key) is skipped, the registry's
//! longest ttl and margin kept: a dump restored into the database it came
//! from does not fail on them.
//!
//! Touches: the mark tables through `counters` and `tickets` (which also
//! drops a ticket scope's cached values), the leases through `leases`,
//! and the other three tables here (as each one's owner).

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::FromDatum;
use std::ffi::CStr;

use crate::counters::{self, Kind};
use crate::errors::postgres_errors_as_raised;
use crate::names::Name;
use crate::state_tables;

#[pg_trigger(sql = false)]
fn merge_loaded_row<'a>(trigger: &'a pgrx::PgTrigger<'a>) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, pgrx::PgTriggerError> {
    let row = trigger.new().ok_or(pgrx::PgTriggerError::NotTrigger)?;
    if state_tables::in_own_statement() {
        return Ok(Some(row));
    }
    postgres_errors_as_raised(|| {
        let data = trigger.trigger_data();
        let (tuple, tupdesc) = (data.tg_trigtuple, unsafe { (*data.tg_relation).rd_att });
        let table = unsafe { CStr::from_ptr((*(*data.tg_relation).rd_rel).relname.data.as_ptr()) };
        let column = |name: &CStr| unsafe {
            let n = pg_sys::SPI_fnumber(tupdesc, name.as_ptr());
            let mut null = true;
            let datum = if n > 0 { pg_sys::heap_getattr(tuple, n, tupdesc, &mut null) } else { pg_sys::Datum::from(0) };
            (datum, null)
        };
        let text = |name: &CStr| {
            let (datum, null) = column(name);
            unsafe { Name::from_datum(datum, null) }
        };
        let whole_row = || unsafe { DatumWithOid::new(pg_sys::heap_copy_tuple_as_datum(tuple, tupdesc), (*tupdesc).tdtypeid) };
        let this = state_tables::Table { oid: unsafe { (*data.tg_relation).rd_id }, owner: unsafe { (*(*data.tg_relation).rd_rel).relowner } };
        match table.to_bytes() {
            b"machine_id_leases" => {
                let row = unsafe { pg_sys::heap_copy_tuple_as_datum(tuple, tupdesc) };
                return crate::leases::merge_loaded(row, unsafe { (*tupdesc).tdtypeid }).then_some(());
            }
            // Records that are there already: the same record.
            b"id_space" => return already_there(this, whole_row(), "id_space", &["epoch_ms", "machine_bits", "recorded_at"], None).then_some(()),
            b"rights" => return already_there(this, whole_row(), "rights", &["role", "kind", "queue", "domain"], None).then_some(()),
            // A key version that is there already: the same secret (another
            // one under its name and version is refused by the key), retired
            // if either copy was.
            b"public_keys" => {
                let merge = "retired_at = LEAST(t.retired_at, r.retired_at)";
                return already_there(this, whole_row(), "public_keys", &["name", "version", "key"], Some(merge)).then_some(());
            }
            // The registry's identity: the longest ttl and margin it allowed.
            b"lease_registry" => {
                let keys = ["system_identifier", "timeline", "database_oid", "grants_from"];
                let merge = "max_ttl_ms = GREATEST(t.max_ttl_ms, r.max_ttl_ms), margin_ms = GREATEST(t.margin_ms, r.margin_ms)";
                return already_there(this, whole_row(), "lease_registry", &keys, Some(merge)).then_some(());
            }
            _ => {}
        }
        let (mark, null) = column(c"mark");
        // A row with a NULL is the load's to fail on (NOT NULL).
        let mark = if null { return None } else { mark.value() as i64 };
        let merged = match table.to_bytes() {
            b"scoped_counters" => counters::merge_loaded(Kind::Scope, text(c"queue")?, text(c"domain")?, mark),
            b"blocks" => counters::merge_loaded(Kind::Block, text(c"name")?, Name(b""), mark),
            b"tickets" => crate::tickets::merge_loaded(text(c"queue")?, text(c"domain")?, mark),
            _ => false,
        };
        merged.then_some(())
    })
    .map_or(Ok(Some(row)), |()| Ok(None))
}

/// Whether a row with the loaded row's `keys` is in `pgticket.<name>`
/// already (then, with `merge`, its other columns merged from the loaded
/// one): the load skips it, as `ON CONFLICT DO NOTHING` would.
fn already_there(table: state_tables::Table, loaded: DatumWithOid<'_>, name: &str, keys: &[&str], merge: Option<&str>) -> bool {
    let on = keys.iter().map(|k| format!("t.{k} OPERATOR(pg_catalog.=) r.{k}")).collect::<Vec<_>>().join(" AND ");
    let loaded_row = format!("(SELECT ($1::pgticket.{name}).*) r");
    let sql = match merge {
        Some(set) => format!("UPDATE pgticket.{name} t SET {set} FROM {loaded_row} WHERE {on} RETURNING 1"),
        None => format!("SELECT 1 FROM pgticket.{name} t, {loaded_row} WHERE {on} FOR KEY SHARE OF t"),
    };
    state_tables::as_owner_of(table, || Spi::connect_mut(|client| client.update(sql.as_str(), Some(1), &[loaded]).map(|rows| !rows.is_empty())))
        .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot merge a loaded row into pgticket.{name}: {e}"))
}
