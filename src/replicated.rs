//! Rows of pg_ticket's state tables that arrive by logical replication, in
//! a group of primaries that replicate to each other (SPEC §19.1, §19.2):
//! an apply worker, a subscription's initial copy, pglogical's sync. All of
//! them write with `session_replication_role = replica`, so the trigger
//! `by_replication` (BEFORE INSERT, UPDATE or DELETE, FOR EACH ROW, enabled
//! REPLICA: it fires for them only, never for a node's own writes) sees
//! every such row, before the tables' other triggers (BEFORE triggers fire
//! in name order). A load run by hand in replica mode is treated alike.
//!
//! Each state table is one of two kinds:
//! - **Of the group**: `scoped_counters` and `blocks`. A series is one
//!   series on every node (the same invoice numbers must not come from two
//!   nodes), so its mark travels: a replicated row merges, the higher mark
//!   kept — an INSERT of a scope already here raises the mark (the
//!   `keeps_higher` trigger after this one), an UPDATE never lowers it (a
//!   publisher's next write-back of 51 after the initial copy kept this
//!   node's 80 set 0.4.0's counter back to 51), a DELETE is not applied
//!   (marks are never removed). `tickets` too: each node hands out its own
//!   residue class (`ticket_offset` of `ticket_increment`, Flickr's two
//!   ticket servers) above the group's highest mark, its row keeping this
//!   node's series (another node's row, of another offset, made 0.4.0
//!   refuse the scope here); a node that takes an offset another node
//!   used, or a node's replacement, starts above everything reserved in it
//!   (review of #47: per-node marks handed a swapped class's tickets out
//!   again).
//! - **Of the node**: `rights` (roles are a cluster's own and do not
//!   replicate: a grant naming a role another node lacks stopped its
//!   apply, and in binary mode named another role by its OID; grant on
//!   each node), `id_space` (the space this node stamped in:
//!   another node's row was read as this node's lost mark, and every
//!   snowflake refused), `machine_id_leases` and `lease_registry` (a
//!   registry's leases are its own fleet's), `scope_quota` (what each role
//!   created on this node). Nothing of another node's rows is applied.
//! - `nodes` (the group's members, `group`): every node's row is applied
//!   but a row naming this node (only this node writes its own).
//!
//! A series' home (SPEC §19.3) moves only by a later handover: an UPDATE
//! with no more `home_moves` than the row here keeps the home here (a
//! former home's write arriving after the handover does not take it back).
//!
//! Touches: the row in hand only (no table access, no lock); merging into
//! a row already here is `loads`'.

use pgrx::pg_sys;
use pgrx::{FromDatum, PgTupleDesc};
use pgrx::prelude::*;
use std::ffi::CStr;

#[pg_trigger(sql = false)]
fn by_replication<'a>(trigger: &'a pgrx::PgTrigger<'a>) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, pgrx::PgTriggerError> {
    let data = trigger.trigger_data();
    let table = unsafe { CStr::from_ptr((*(*data.tg_relation).rd_rel).relname.data.as_ptr()) };
    let event = data.tg_event & pg_sys::TRIGGER_EVENT_OPMASK;
    // Enabled REPLICA, it fires in replica mode only; should it be enabled
    // otherwise (state_tables refuses the tables then), a node's own writes
    // pass untouched.
    if unsafe { pg_sys::SessionReplicationRole } != pg_sys::SESSION_REPLICATION_ROLE_REPLICA as i32 {
        return Ok(if event == pg_sys::TRIGGER_EVENT_DELETE { trigger.old() } else { trigger.new() });
    }
    // Our own statements (the merge below) pass.
    if crate::state_tables::in_own_statement() {
        return Ok(if event == pg_sys::TRIGGER_EVENT_DELETE { trigger.old() } else { trigger.new() });
    }
    let tupdesc = unsafe { (*data.tg_relation).rd_att };
    let column = |name: &CStr| unsafe { pg_sys::SPI_fnumber(tupdesc, name.as_ptr()) };
    let value = |tuple: pg_sys::HeapTuple, n: i32| {
        let mut null = true;
        let datum = if n > 0 { unsafe { pg_sys::heap_getattr(tuple, n, tupdesc, &mut null) } } else { pg_sys::Datum::from(0) };
        (!null).then(|| datum.value() as i64)
    };
    if table.to_bytes() == b"nodes" {
        // The group's nodes: every node's row but this node's own, which
        // only this node writes (a row naming it from elsewhere is a copy
        // of this node, not news of it).
        let row = if event == pg_sys::TRIGGER_EVENT_INSERT { data.tg_trigtuple } else { data.tg_newtuple };
        let mine = event != pg_sys::TRIGGER_EVENT_DELETE && value(row, column(c"node")) == Some(crate::group::node_id());
        if mine {
            // This node's identity under another name: a copy of this node.
            let name_n = column(c"name");
            let mut null = true;
            let datum = unsafe { pg_sys::heap_getattr(row, name_n, tupdesc, &mut null) };
            if let Some(name) = unsafe { String::from_datum(datum, null) }.filter(|n| *n != crate::group::node_name()) {
                crate::group::record_clash(&name);
            }
        }
        return Ok(if event == pg_sys::TRIGGER_EVENT_DELETE || mine { None } else { trigger.new() });
    }
    let tickets = table.to_bytes() == b"tickets";
    let of_the_group = tickets || matches!(table.to_bytes(), b"scoped_counters" | b"blocks");
    if !of_the_group || event == pg_sys::TRIGGER_EVENT_DELETE {
        return Ok(None);
    }
    let (offset_n, increment_n) = (column(c"ticket_offset"), column(c"ticket_increment"));
    let series = crate::settings::ticket_series();
    let mark_n_of = |desc: pg_sys::TupleDesc| unsafe { pg_sys::SPI_fnumber(desc, c"mark".as_ptr()) };
    // Names as the database's bytes (any encoding), as `loads` reads them.
    let text = |tuple: pg_sys::HeapTuple, name: &CStr| {
        let n = column(name);
        let mut null = true;
        let datum = if n > 0 { unsafe { pg_sys::heap_getattr(tuple, n, tupdesc, &mut null) } } else { pg_sys::Datum::from(0) };
        unsafe { crate::names::Name::from_datum(datum, null) }
    };
    let in_my_series = |tuple: pg_sys::HeapTuple, offset: i64, increment: i64| {
        let columns = [offset_n, increment_n];
        let values = [pg_sys::Datum::from(offset as i32), pg_sys::Datum::from(increment as i32)];
        let nulls = [false, false];
        unsafe { pg_sys::heap_modify_tuple_by_cols(tuple, tupdesc, 2, columns.as_ptr() as *mut i32, values.as_ptr() as *mut _, nulls.as_ptr() as *mut bool) }
    };
    if event == pg_sys::TRIGGER_EVENT_INSERT {
        if !tickets {
            return Ok(trigger.new());
        }
        // Another node's ticket scope is served here in this node's own
        // residue class, above the group's mark. Every node may create a
        // ticket scope, at the same moment too: merged by one upsert (which
        // waits for a row being inserted here, where a check and then the
        // apply's insert failed on the key), and the apply's row dropped.
        let (Some(mark), Some(queue), Some(domain)) = (value(data.tg_trigtuple, mark_n_of(tupdesc)), text(data.tg_trigtuple, c"queue"), text(data.tg_trigtuple, c"domain")) else {
            return Ok(trigger.new());
        };
        let table = crate::state_tables::tickets();
        crate::state_tables::as_owner_of(table, || {
            Spi::connect_mut(|client| {
                client.update(
                    "INSERT INTO pgticket.tickets (queue, domain, mark, ticket_offset, ticket_increment) VALUES ($1, $2, $3, $4, $5) \
                     ON CONFLICT (queue, domain) DO UPDATE SET mark = GREATEST(pgticket.tickets.mark, EXCLUDED.mark)",
                    None,
                    &[queue.to_datum(), domain.to_datum(), mark.into(), (series.offset as i32).into(), (series.increment as i32).into()],
                )
                .map(|_| ())
            })
        })
        .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot merge a replicated ticket scope: {e}"));
        return Ok(None);
    }
    // An UPDATE: the higher of the two marks, within a limit that holds
    // it; the home moves only by a later handover (more moves), never by
    // an older write of a former home arriving late.
    let (old, new) = (data.tg_trigtuple, data.tg_newtuple);
    let (mark_n, max_n, home_n, moves_n) = (column(c"mark"), column(c"max_mark"), column(c"home"), column(c"home_moves"));
    if tickets {
        // The higher mark, this node's own series kept.
        let (Some(old_mark), Some(new_mark)) = (value(old, mark_n), value(new, mark_n)) else { return Ok(trigger.new()) };
        let (Some(offset), Some(increment)) = (value(old, offset_n), value(old, increment_n)) else { return Ok(trigger.new()) };
        let row = in_my_series(new, offset as i32 as i64, increment as i32 as i64);
        let columns = [mark_n];
        let values = [pg_sys::Datum::from(old_mark.max(new_mark))];
        let nulls = [false];
        let merged = unsafe { pg_sys::heap_modify_tuple_by_cols(row, tupdesc, 1, columns.as_ptr() as *mut i32, values.as_ptr() as *mut _, nulls.as_ptr() as *mut bool) };
        return Ok(Some(unsafe { PgHeapTuple::from_heap_tuple(PgTupleDesc::from_pg_unchecked(tupdesc), merged) }));
    }
    let (Some(old_mark), Some(new_mark), Some(new_max)) = (value(old, mark_n), value(new, mark_n), value(new, max_n)) else {
        // A NULL is the apply's to fail on (NOT NULL).
        return Ok(trigger.new());
    };
    let mark = old_mark.max(new_mark);
    let (old_home, old_moves) = (value(old, home_n), value(old, moves_n).unwrap_or(0));
    let new_moves = value(new, moves_n).unwrap_or(0);
    let keep_old_home = home_n > 0 && old_home.is_some() && new_moves <= old_moves;
    if mark == new_mark && !keep_old_home {
        return Ok(trigger.new());
    }
    let mut columns = vec![mark_n, max_n];
    let mut values = vec![pg_sys::Datum::from(mark), pg_sys::Datum::from(new_max.max(mark))];
    if keep_old_home {
        columns.extend([home_n, moves_n]);
        values.extend([pg_sys::Datum::from(old_home.unwrap_or_default()), pg_sys::Datum::from(old_moves)]);
    }
    let nulls = vec![false; columns.len()];
    let merged = unsafe {
        pg_sys::heap_modify_tuple_by_cols(
            new,
            tupdesc,
            columns.len() as i32,
            columns.as_ptr() as *mut i32,
            values.as_ptr() as *mut _,
            nulls.as_ptr() as *mut bool,
        )
    };
    Ok(Some(unsafe { PgHeapTuple::from_heap_tuple(PgTupleDesc::from_pg_unchecked(tupdesc), merged) }))
}

extension_sql!(
    r#"
-- 0.5.0 (SPEC s.19): rows that arrive by logical replication (apply
-- workers and initial copies run in replica mode) merge into a node's
-- state: the marks of the group's series never go back, and no row of
-- another node's own state is applied (src/replicated.rs says which).
CREATE FUNCTION pgticket.by_replication() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'by_replication_wrapper';
REVOKE ALL ON FUNCTION pgticket.by_replication() FROM PUBLIC;
COMMENT ON FUNCTION pgticket.by_replication() IS
    'Trigger: a row replicated from another primary keeps the higher mark of a series, and leaves this node''s own state alone';
CREATE TRIGGER by_replication BEFORE INSERT OR UPDATE OR DELETE ON pgticket.scoped_counters
    FOR EACH ROW EXECUTE FUNCTION pgticket.by_replication();
CREATE TRIGGER by_replication BEFORE INSERT OR UPDATE OR DELETE ON pgticket.blocks
    FOR EACH ROW EXECUTE FUNCTION pgticket.by_replication();
CREATE TRIGGER by_replication BEFORE INSERT OR UPDATE OR DELETE ON pgticket.tickets
    FOR EACH ROW EXECUTE FUNCTION pgticket.by_replication();
CREATE TRIGGER by_replication BEFORE INSERT OR UPDATE OR DELETE ON pgticket.id_space
    FOR EACH ROW EXECUTE FUNCTION pgticket.by_replication();
CREATE TRIGGER by_replication BEFORE INSERT OR UPDATE OR DELETE ON pgticket.machine_id_leases
    FOR EACH ROW EXECUTE FUNCTION pgticket.by_replication();
CREATE TRIGGER by_replication BEFORE INSERT OR UPDATE OR DELETE ON pgticket.lease_registry
    FOR EACH ROW EXECUTE FUNCTION pgticket.by_replication();
CREATE TRIGGER by_replication BEFORE INSERT OR UPDATE OR DELETE ON pgticket.scope_quota
    FOR EACH ROW EXECUTE FUNCTION pgticket.by_replication();
CREATE TRIGGER by_replication BEFORE INSERT OR UPDATE OR DELETE ON pgticket.rights
    FOR EACH ROW EXECUTE FUNCTION pgticket.by_replication();
ALTER TABLE pgticket.scoped_counters ENABLE REPLICA TRIGGER by_replication;
ALTER TABLE pgticket.blocks ENABLE REPLICA TRIGGER by_replication;
ALTER TABLE pgticket.tickets ENABLE REPLICA TRIGGER by_replication;
ALTER TABLE pgticket.id_space ENABLE REPLICA TRIGGER by_replication;
ALTER TABLE pgticket.machine_id_leases ENABLE REPLICA TRIGGER by_replication;
ALTER TABLE pgticket.lease_registry ENABLE REPLICA TRIGGER by_replication;
ALTER TABLE pgticket.scope_quota ENABLE REPLICA TRIGGER by_replication;
ALTER TABLE pgticket.rights ENABLE REPLICA TRIGGER by_replication;
"#,
    name = "by_replication",
    requires = ["id_space", "rights", "schema"]
);
