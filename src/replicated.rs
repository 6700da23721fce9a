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
//! with fewer `home_moves` than the row here keeps the home here (a former
//! home's write arriving after the handover does not take it back), and
//! two take-overs of one count settle on the higher node id everywhere
//! (`ticket_core::group::keeps_home_here`).
//!
//! Touches: the row in hand, and for a replicated ticket scope its row in
//! `pgticket.tickets` (one upsert, as the table's owner); merging a
//! replicated scope or block name into a row already here is `loads`'.

use pgrx::pg_sys;
use pgrx::{FromDatum, PgTupleDesc};
use pgrx::prelude::*;
use std::ffi::CStr;

#[pg_trigger(sql = false)]
fn by_replication<'a>(trigger: &'a pgrx::PgTrigger<'a>) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, pgrx::PgTriggerError> {
    let data = trigger.trigger_data();
    let table = unsafe { CStr::from_ptr((*(*data.tg_relation).rd_rel).relname.data.as_ptr()) }.to_bytes();
    let event = data.tg_event & pg_sys::TRIGGER_EVENT_OPMASK;
    let unchanged = || Ok(if event == pg_sys::TRIGGER_EVENT_DELETE { trigger.old() } else { trigger.new() });
    // Enabled REPLICA, it fires in replica mode only; should it be enabled
    // otherwise (state_tables refuses the tables then), a node's own writes
    // pass untouched, as do our own statements (the tickets' merge below).
    if unsafe { pg_sys::SessionReplicationRole } != pg_sys::SESSION_REPLICATION_ROLE_REPLICA as i32
        || crate::state_tables::in_own_statement()
    {
        return unchanged();
    }
    let tupdesc = unsafe { (*data.tg_relation).rd_att };
    // A column's value in `tuple`, None if NULL or no such column.
    let attr = |tuple: pg_sys::HeapTuple, name: &CStr| {
        let n = unsafe { pg_sys::SPI_fnumber(tupdesc, name.as_ptr()) };
        let mut null = true;
        let datum = if n > 0 { unsafe { pg_sys::heap_getattr(tuple, n, tupdesc, &mut null) } } else { pg_sys::Datum::from(0) };
        (!null).then_some(datum)
    };
    let int = |tuple, name| attr(tuple, name).map(|d| d.value() as i64);
    // `tuple` with these columns set.
    let with = |tuple: pg_sys::HeapTuple, changes: &[(&CStr, pg_sys::Datum)]| {
        let columns: Vec<i32> = changes.iter().map(|(name, _)| unsafe { pg_sys::SPI_fnumber(tupdesc, name.as_ptr()) }).collect();
        let values: Vec<pg_sys::Datum> = changes.iter().map(|(_, value)| *value).collect();
        let nulls = vec![false; changes.len()];
        let tuple = unsafe {
            pg_sys::heap_modify_tuple_by_cols(tuple, tupdesc, changes.len() as i32, columns.as_ptr() as *mut i32, values.as_ptr() as *mut _, nulls.as_ptr() as *mut bool)
        };
        Ok(Some(unsafe { PgHeapTuple::from_heap_tuple(PgTupleDesc::from_pg_unchecked(tupdesc), tuple) }))
    };
    if table == b"nodes" {
        // The group's nodes: every node's row but this node's own, which
        // only this node writes (a row naming it from elsewhere is a copy
        // of this node, not news of it).
        if event == pg_sys::TRIGGER_EVENT_DELETE {
            return Ok(None);
        }
        let row = if event == pg_sys::TRIGGER_EVENT_INSERT { data.tg_trigtuple } else { data.tg_newtuple };
        let node = int(row, c"node");
        if node != Some(crate::group::node_id()) {
            // A node announces itself anew by an INSERT (join_group(): so a
            // node added since, which has no row to update, hears of it);
            // here, where its row is, the new one replaces it (review of
            // #47: the apply stopped on insert_exists).
            if let (true, Some(node)) = (event == pg_sys::TRIGGER_EVENT_INSERT, node) {
                crate::group::forget_node(node);
            }
            return Ok(trigger.new());
        }
        // This node's identity under another name: a copy of this node.
        let name = attr(row, c"name").and_then(|d| unsafe { String::from_datum(d, false) });
        if let Some(name) = name.filter(|n| *n != crate::group::node_name()) {
            crate::group::record_clash(&name);
        }
        return Ok(None);
    }
    let tickets = table == b"tickets";
    if !(tickets || table == b"scoped_counters" || table == b"blocks") || event == pg_sys::TRIGGER_EVENT_DELETE {
        return Ok(None);
    }
    if event == pg_sys::TRIGGER_EVENT_INSERT {
        if !tickets {
            return Ok(trigger.new());
        }
        // Another node's ticket scope is served here in this node's own
        // residue class, above the group's mark. Every node may create a
        // ticket scope, at the same moment too: merged by one upsert (which
        // waits for a row being inserted here, where a check and then the
        // apply's insert failed on the key), and the apply's row dropped.
        // Names as the database's bytes (any encoding), as `loads` reads them.
        let new = data.tg_trigtuple;
        let name = |column| attr(new, column).and_then(|d| unsafe { crate::names::Name::from_datum(d, false) });
        let (Some(mark), Some(queue), Some(domain)) = (int(new, c"mark"), name(c"queue"), name(c"domain")) else {
            return Ok(trigger.new());
        };
        let series = crate::settings::ticket_series();
        crate::state_tables::as_owner_of(crate::state_tables::tickets(), || {
            Spi::connect_mut(|client| {
                client
                    .update(
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
    // An UPDATE: the higher of the two marks.
    let (old, new) = (data.tg_trigtuple, data.tg_newtuple);
    let (Some(old_mark), Some(new_mark)) = (int(old, c"mark"), int(new, c"mark")) else {
        // A NULL is the apply's to fail on (NOT NULL).
        return Ok(trigger.new());
    };
    let mark = old_mark.max(new_mark);
    if tickets {
        // This node's own series kept.
        let (Some(offset), Some(increment)) = (attr(old, c"ticket_offset"), attr(old, c"ticket_increment")) else { return Ok(trigger.new()) };
        return with(new, &[(c"mark", pg_sys::Datum::from(mark)), (c"ticket_offset", offset), (c"ticket_increment", increment)]);
    }
    // Within a limit that holds it; the home moves only by a later handover
    // (more moves), never by an older write of a former home arriving late.
    let Some(new_max) = int(new, c"max_mark") else { return Ok(trigger.new()) };
    let (old_home, old_moves) = (attr(old, c"home"), attr(old, c"home_moves"));
    let moves = |home_moves: Option<pg_sys::Datum>| home_moves.map_or(0, |d| d.value() as i64);
    let keep_old_home = ticket_core::group::keeps_home_here(
        old_home.map(|h| (h.value() as i64, moves(old_moves))),
        (attr(new, c"home").map(|h| h.value() as i64), moves(attr(new, c"home_moves"))),
    );
    if mark == new_mark && !keep_old_home {
        return Ok(trigger.new());
    }
    let mut changes = vec![(c"mark", pg_sys::Datum::from(mark)), (c"max_mark", pg_sys::Datum::from(new_max.max(mark)))];
    if let (true, Some(home), Some(home_moves)) = (keep_old_home, old_home, old_moves) {
        changes.extend([(c"home", home), (c"home_moves", home_moves)]);
    }
    with(new, &changes)
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
