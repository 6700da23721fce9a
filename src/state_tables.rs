//! Which relations are the extension's state tables now, who owns each, and
//! running statements as that owner.
//!
//! Found through the extension's own catalog entries (`pg_depend` members
//! of `pg_ticket`), not by name as the caller, so a caller without USAGE on
//! the extension's schema still allocates. Cached per backend, because the
//! relation ids are part of every backend-local key and an owner is needed
//! on every first allocation from a scope. A relcache invalidation of any of
//! the tables — sent by `ALTER TABLE ... OWNER`, `REASSIGN OWNED`, `DROP
//! EXTENSION`, `ALTER EXTENSION ... UPDATE`, in this session or any other —
//! drops the cache, so a long-lived session (a pool's connection) sees such
//! a change at its next call, with no catalog query per ID. The callback
//! only clears a cell: it may not touch the catalogs.
//!
//! Each table is read and written as its own owner (an owner may be given
//! one table and not another), restricted (`SECURITY_RESTRICTED_OPERATION`),
//! so a trigger the owner put on its table runs with the owner's rights and
//! nobody else's — in a background worker too.

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::backend_local::BackendLocal;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Table {
    pub oid: pg_sys::Oid,
    pub owner: pg_sys::Oid,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Tables {
    pub scoped_counters: Table,
    pub blocks: Table,
    /// None on 0.1.0's objects (before `ALTER EXTENSION pg_ticket UPDATE`).
    pub tickets: Option<Table>,
    pub machine_id_leases: Option<Table>,
    /// The snowflake ID space recorded with this database (0.3.0).
    pub id_space: Option<Table>,
    /// The scopes each role created (0.3.0).
    pub scope_quota: Option<Table>,
    /// The grants of scopes and block names to roles (0.3.0).
    pub rights: Option<Table>,
    /// The nodes of a group of primaries this database knows (0.5.0).
    pub nodes: Option<Table>,
    /// The keys of public IDs (0.5.0).
    pub public_keys: Option<Table>,
    /// The tables have the `max_mark` column of 0.2.0. Without it they are
    /// 0.1.0's, not yet updated, and every limit is 2^63-1: the library
    /// serves both.
    pub has_limits: bool,
    /// The mark tables have 0.5.0's `home` column (a group's rule).
    pub has_home: bool,
}

/// How many of our own statements on the state tables run now (as an
/// owner, `as_owner_of`): a row trigger tells our writes from a load's.
static OWN_STATEMENTS: BackendLocal<u32> = BackendLocal::new(0);
static CACHE: BackendLocal<Option<Tables>> = BackendLocal::new(None);
/// `CACHE` holds tables: `generation()` asks this instead of copying
/// them out (it runs in every `snowflake_id()`).
static CACHED: BackendLocal<bool> = BackendLocal::new(false);
/// Relcache invalidations that arrived while `lookup()`'s own query ran
/// (the cache was empty, so they could not be matched to our tables).
static MISSED_WHILE_LOOKING: BackendLocal<Option<u32>> = BackendLocal::new(None);
static CALLBACK_REGISTERED: BackendLocal<bool> = BackendLocal::new(false);
/// Counts the cache's invalidations: what was checked against the
/// tables at one generation is checked again at the next.
static GENERATION: BackendLocal<u64> = BackendLocal::new(0);

/// The tables' generation: it moves at every invalidation of any of them
/// (in this session or any other), and whenever the cache was empty.
pub fn generation() -> u64 {
    if !CACHED.get() {
        lookup();
    }
    GENERATION.get()
}

/// The generation of the tables cached now, None if none are: while it
/// stays, every lookup answers with the same tables.
#[inline]
pub fn cached_generation() -> Option<u64> {
    CACHED.get().then(|| GENERATION.get())
}

impl Tables {
    /// The owners of the tables that hold marks.
    pub fn owners(&self) -> Vec<pg_sys::Oid> {
        [Some(self.scoped_counters), Some(self.blocks), self.tickets].into_iter().flatten().map(|t| t.owner).collect()
    }
}

/// The tables as they are now; an error if the extension's tables are gone.
pub fn current() -> Tables {
    lookup().unwrap_or_else(|| {
        crate::errors::TicketError::StateTableUnfit(
            "pg_ticket: the extension's state tables are missing; run CREATE EXTENSION pg_ticket".into(),
        )
        .raise()
    })
}

/// The tickets table as it is now.
pub fn tickets() -> Table {
    current().tickets.unwrap_or_else(|| pgrx::error!("pg_ticket: pgticket.tickets is missing; run ALTER EXTENSION pg_ticket UPDATE"))
}

/// The lease registry's table as it is now.
pub fn machine_id_leases() -> Table {
    current()
        .machine_id_leases
        .unwrap_or_else(|| pgrx::error!("pg_ticket: pgticket.machine_id_leases is missing; run ALTER EXTENSION pg_ticket UPDATE"))
}

/// The tables as they are now, None if they do not exist (the extension was
/// dropped, in this transaction perhaps).
pub fn lookup() -> Option<Tables> {
    if let Some(tables) = CACHE.get() {
        return Some(tables);
    }
    if !CALLBACK_REGISTERED.replace(true) {
        unsafe { pg_sys::CacheRegisterRelcacheCallback(Some(on_relcache_invalidation), pg_sys::Datum::from(0)) };
    }
    MISSED_WHILE_LOOKING.set(Some(0));
    // Read-only, so it also runs on a hot standby; the catalogs are readable
    // by every role; names and operators qualified, so no search_path can
    // redirect it.
    let found = Spi::connect(|client| {
        let rows = client.select(
            "SELECT c.relname::pg_catalog.text, c.oid, c.relowner, EXISTS (SELECT FROM pg_catalog.pg_attribute a \
                      WHERE a.attrelid OPERATOR(pg_catalog.=) c.oid AND a.attname OPERATOR(pg_catalog.=) 'max_mark' \
                        AND NOT a.attisdropped), \
                    c.relpersistence::pg_catalog.text, c.relnamespace::pg_catalog.regnamespace::pg_catalog.text, \
                    (SELECT pg_catalog.string_agg(t.tgname::pg_catalog.text, ', ') FROM pg_catalog.pg_trigger t \
                      WHERE t.tgrelid OPERATOR(pg_catalog.=) c.oid \
                        AND ((t.tgenabled OPERATOR(pg_catalog.<>) 'A' \
                              AND t.tgname OPERATOR(pg_catalog.=) ANY ('{never_emptied,never_truncated,forward_only,changed,keeps_higher,keeps_present}')) \
                          OR (t.tgenabled OPERATOR(pg_catalog.<>) 'R' AND t.tgname OPERATOR(pg_catalog.=) 'by_replication'))), \
                    EXISTS (SELECT FROM pg_catalog.pg_attribute a \
                      WHERE a.attrelid OPERATOR(pg_catalog.=) c.oid AND a.attname OPERATOR(pg_catalog.=) 'home' \
                        AND NOT a.attisdropped) \
               FROM pg_catalog.pg_extension e \
               JOIN pg_catalog.pg_depend d ON d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass \
                    AND d.refobjid OPERATOR(pg_catalog.=) e.oid AND d.deptype OPERATOR(pg_catalog.=) 'e' \
                    AND d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass \
               JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) d.objid AND c.relkind OPERATOR(pg_catalog.=) 'r' \
             WHERE e.extname OPERATOR(pg_catalog.=) 'pg_ticket'",
            None,
            &[],
        )?;
        let (mut scoped_counters, mut blocks, mut tickets, mut machine_id_leases, mut id_space, mut scope_quota, mut rights, mut has_limits) =
            (None, None, None, None, None, None, None, false);
        let (mut nodes, mut public_keys, mut has_home) = (None, None, false);
        for row in rows {
            let name: String = row.get(1)?.unwrap_or_default();
            let table = Table { oid: row.get(2)?.expect("oid"), owner: row.get(3)?.expect("relowner") };
            let persistence: String = row.get(5)?.unwrap_or_default();
            let schema: String = row.get(6)?.unwrap_or_default();
            let not_always: Option<String> = row.get(7)?;
            refuse_unfit(&name, &persistence, &schema, not_always.as_deref());

            match name.as_str() {
                "scoped_counters" => {
                    scoped_counters = Some(table);
                    has_limits = row.get::<bool>(4)?.unwrap_or(false);
                    has_home = row.get::<bool>(8)?.unwrap_or(false);
                }
                "nodes" => nodes = Some(table),
                "public_keys" => public_keys = Some(table),
                "blocks" => blocks = Some(table),
                "tickets" => tickets = Some(table),
                "machine_id_leases" => machine_id_leases = Some(table),
                "id_space" => id_space = Some(table),
                "scope_quota" => scope_quota = Some(table),
                "rights" => rights = Some(table),
                _ => {}
            }
        }
        Ok::<_, pgrx::spi::Error>(match (scoped_counters, blocks) {
            (Some(scoped_counters), Some(blocks)) => {
                Some(Tables { scoped_counters, blocks, tickets, machine_id_leases, id_space, scope_quota, rights, nodes, public_keys, has_limits, has_home })
            }
            _ => None,
        })
    })
    .unwrap_or_else(|e| {
        MISSED_WHILE_LOOKING.set(None);
        pgrx::error!("pg_ticket: cannot look up the state tables: {e}")
    });
    // An invalidation that arrived during the query may be of one of these
    // tables (a row of id_space or machine_id_leases changed by another
    // session's commit): what is checked against them now may predate it,
    // so nothing is cached and the next call looks again (#35 review).
    let missed = MISSED_WHILE_LOOKING.replace(None).unwrap_or(0) > 0;
    let kept = if missed { None } else { found };
    CACHE.set(kept);
    CACHED.set(kept.is_some());
    GENERATION.set(GENERATION.get() + 1);
    found
}

/// A state table that cannot keep its promise is refused, not used (SPEC
/// §13.10): an unlogged one loses its marks in a crash (counting from 1
/// again), and the statements name the schema `pgticket`.
fn refuse_unfit(table: &str, persistence: &str, schema: &str, not_always: Option<&str>) {
    use crate::errors::TicketError;
    if let Some(triggers) = not_always {
        // pg_restore --disable-triggers enables them again as ORIGIN: a
        // session with session_replication_role = replica would skip them.
        TicketError::StateTableUnfit(format!(
            "pg_ticket: the state table {schema}.{table}'s guard trigger {triggers} is not enabled ALWAYS (by_replication: REPLICA) \
             (pg_restore --disable-triggers re-enables triggers for origin sessions only); \
             run ALTER TABLE {schema}.{table} ENABLE ALWAYS TRIGGER <name> for each (by_replication: ENABLE REPLICA TRIGGER)"
        ))
        .raise();
    }
    if persistence != "p" {
        TicketError::StateTableUnfit(format!(
            "pg_ticket: the state table {schema}.{table} is not a permanent table (a crash would lose its marks); \
             run ALTER TABLE {schema}.{table} SET LOGGED"
        ))
        .raise();
    }
    if schema != "pgticket" {
        TicketError::StateTableUnfit(format!(
            "pg_ticket: its state tables are in schema {schema}, not pgticket; run ALTER SCHEMA {schema} RENAME TO pgticket"
        ))
        .raise();
    }
}

/// A table whose statement trigger tells every session of its changes
/// (`changed`: AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE, FOR EACH
/// STATEMENT, enabled ALWAYS) must have it before its cached copies are
/// trusted: without it a revoke, or another ID space, would never reach the
/// sessions that cached the table. Checked by the users of the cache, when
/// they read the table (once per invalidation), so a table nobody uses
/// blocks nothing.
pub fn check_change_trigger(table: Table, name: &str) {
    // Statement level (no ROW bit), AFTER (no BEFORE bit), the four events.
    const ALL_EVENTS_AFTER_STATEMENT: u32 = pg_sys::TRIGGER_TYPE_INSERT | pg_sys::TRIGGER_TYPE_DELETE | pg_sys::TRIGGER_TYPE_UPDATE | pg_sys::TRIGGER_TYPE_TRUNCATE;
    check_trigger(table, name, ALL_EVENTS_AFTER_STATEMENT, "AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE", "STATEMENT");
}

/// The same for a table whose `changed` trigger tells the sessions of some
/// rows only (AFTER INSERT OR UPDATE, FOR EACH ROW, enabled ALWAYS): the
/// function decides which rows matter.
/// A catalog of before 0.4.0 (the library installed, ALTER EXTENSION
/// UPDATE not yet run) has no such function: it is served as 0.3.0 was.
pub fn check_row_change_trigger(table: Table, name: &str) {
    let function = format!("pgticket.{name}_changed()");
    let before_update = Spi::get_one_with_args::<bool>("SELECT pg_catalog.to_regprocedure($1) IS NULL", &[function.as_str().into()])
        .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot look up {function}: {e}"))
        .unwrap_or(true);
    if before_update {
        return;
    }
    const INSERT_UPDATE_AFTER_ROW: u32 = pg_sys::TRIGGER_TYPE_ROW | pg_sys::TRIGGER_TYPE_INSERT | pg_sys::TRIGGER_TYPE_UPDATE;
    check_trigger(table, name, INSERT_UPDATE_AFTER_ROW, "AFTER INSERT OR UPDATE", "ROW");
}

fn check_trigger(table: Table, name: &str, tgtype: u32, events: &str, level: &str) {
    let fit = Spi::get_one_with_args::<bool>(
        "SELECT EXISTS (SELECT FROM pg_catalog.pg_trigger t WHERE t.tgrelid OPERATOR(pg_catalog.=) $1 \
                 AND t.tgname OPERATOR(pg_catalog.=) 'changed' AND t.tgtype OPERATOR(pg_catalog.=) $2 \
                 AND t.tgenabled OPERATOR(pg_catalog.=) 'A' AND t.tgfoid OPERATOR(pg_catalog.=) $3::pg_catalog.regprocedure)",
        &[table.oid.into(), (tgtype as i16).into(), format!("pgticket.{name}_changed()").as_str().into()],
    )
    .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot look up the trigger of pgticket.{name}: {e}"))
    .unwrap_or(false);
    if !fit {
        crate::errors::TicketError::StateTableUnfit(format!(
            "pg_ticket: the state table pgticket.{name} lacks its trigger \"changed\" as created (other sessions would not see its changes); \
             run DROP TRIGGER IF EXISTS changed ON pgticket.{name}; CREATE TRIGGER changed {events} ON pgticket.{name} \
             FOR EACH {level} EXECUTE FUNCTION pgticket.{name}_changed(); ALTER TABLE pgticket.{name} ENABLE ALWAYS TRIGGER changed"
        ))
        .raise()
    }
}

unsafe extern "C-unwind" fn on_relcache_invalidation(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    // InvalidOid: every relation (a cache reset).
    if let Some(n) = MISSED_WHILE_LOOKING.get() {
        MISSED_WHILE_LOOKING.set(Some(n + 1));
    }
    if let Some(t) = CACHE.get() {
        let ours = [Some(t.scoped_counters), Some(t.blocks), t.tickets, t.machine_id_leases, t.id_space, t.scope_quota, t.rights, t.nodes, t.public_keys];
        // A table found missing may come back (renamed back, re-added to
        // the extension) under an OID we do not know: any change looks again.
        let incomplete = ours.iter().any(Option::is_none);
        if incomplete || relid == pg_sys::InvalidOid || ours.iter().flatten().any(|table| table.oid == relid) {
            CACHE.set(None);
            CACHED.set(false);
            GENERATION.set(GENERATION.get() + 1);
        }
    }
}

/// Each row of the state table `table` as committed now (a self snapshot:
/// also what committed after this statement's or this transaction's
/// snapshot was taken, and no SERIALIZABLE predicate lock), with its tuple
/// descriptor. No SPI, so no caller's setting or the owner's rules take
/// part. Interrupts are checked between rows.
pub fn for_each_committed_row(table: pg_sys::Oid, row: impl FnMut(*mut pg_sys::HeapTupleData, pg_sys::TupleDesc)) {
    for_each_row_seen(table, pg_sys::SnapshotType::SNAPSHOT_SELF, row)
}

/// Each row of `table` as a snapshot of type `seen_by` sees it (SELF: as
/// committed now; DIRTY: also rows of transactions in progress).
pub fn for_each_row_seen(table: pg_sys::Oid, seen_by: pg_sys::SnapshotType::Type, mut row: impl FnMut(*mut pg_sys::HeapTupleData, pg_sys::TupleDesc)) {
    unsafe {
        let rel = pg_sys::table_open(table, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let mut committed_now = pg_sys::SnapshotData { snapshot_type: seen_by, ..Default::default() };
        let scan = pg_sys::systable_beginscan(rel, pg_sys::InvalidOid, false, &mut committed_now, 0, std::ptr::null_mut());
        loop {
            pgrx::check_for_interrupts!();
            let tuple = pg_sys::systable_getnext(scan);
            if tuple.is_null() {
                break;
            }
            row(tuple, (*rel).rd_att);
        }
        pg_sys::systable_endscan(scan);
        pg_sys::table_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
    }
}

/// True while pg_ticket's own statements on the state tables run (in this
/// backend): what they write is not a load from outside.
pub fn in_own_statement() -> bool {
    OWN_STATEMENTS.get() > 0
}

/// Runs `f` as the owner of `table`, restricted, for table access on behalf
/// of a caller without rights on it (or of a background worker).
pub fn as_owner_of<R>(table: Table, f: impl FnOnce() -> R) -> R {
    let _as_owner = AsUser::switch_to(table.owner);
    f()
}

/// Switches the current user for the statements, and back on drop (an
/// ERROR's transaction abort also restores it). Like PostgreSQL's own
/// restricted operations (VACUUM, ANALYZE, index builds), it also undoes
/// every setting changed meanwhile: otherwise the owner's trigger could
/// leave a `search_path` (or any setting) behind in the caller's session,
/// and whatever the caller runs next would run under it.
///
/// The one path for every statement run with another role's rights (SPEC
/// §20.1): `search_path` is `pg_catalog, pg_temp` while it lasts, as
/// PostgreSQL 17's `RestrictSearchPath()` pins it for maintenance
/// commands. A name the statements leave unqualified (a type in a cast,
/// a function) would otherwise resolve through the caller's path — in
/// `pg_temp` first for types and relations, or in a schema the caller
/// owns — and what it names would run with the owner's rights. The
/// statements qualify their names as well; this holds for any they miss.
struct AsUser {
    saved_user: pg_sys::Oid,
    saved_context: i32,
    guc_nest_level: i32,
}

impl AsUser {
    fn switch_to(user: pg_sys::Oid) -> Self {
        let mut saved_user = pg_sys::Oid::INVALID;
        let mut saved_context = 0;
        let guc_nest_level = unsafe { pg_sys::NewGUCNestLevel() };
        unsafe {
            pg_sys::GetUserIdAndSecContext(&mut saved_user, &mut saved_context);
            pg_sys::SetUserIdAndSecContext(
                user,
                saved_context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32 | pg_sys::SECURITY_RESTRICTED_OPERATION as i32,
            );
            // Saved at this nest level, so the drop's AtEOXact_GUC (or
            // the transaction's abort) puts the caller's path back.
            pg_sys::set_config_option(
                c"search_path".as_ptr(),
                c"pg_catalog, pg_temp".as_ptr(),
                pg_sys::GucContext::PGC_USERSET,
                pg_sys::GucSource::PGC_S_SESSION,
                pg_sys::GucAction::GUC_ACTION_SAVE,
                true,
                0,
                false,
            );
        }
        OWN_STATEMENTS.set(OWN_STATEMENTS.get() + 1);
        AsUser { saved_user, saved_context, guc_nest_level }
    }
}

impl Drop for AsUser {
    fn drop(&mut self) {
        // During an ERROR's unwinding the transaction's abort pops the GUC
        // stack itself; popping it here too would be out of order.
        unsafe {
            if !std::thread::panicking() {
                pg_sys::AtEOXact_GUC(false, self.guc_nest_level);
            }
            pg_sys::SetUserIdAndSecContext(self.saved_user, self.saved_context);
        }
        OWN_STATEMENTS.set(OWN_STATEMENTS.get() - 1);
    }
}
