//! Rights per scope (SPEC §16): with `pg_ticket.scope_rights = on`, a role
//! allocates from a scope (scoped counters and tickets), or a block name,
//! only where a grant in `pgticket.rights` covers it — as sequences have
//! USAGE. Off (the default), every role allocates everywhere, as in 0.2.0.
//!
//! A grant to a role covers its members that inherit its privileges (as
//! PostgreSQL's GRANT does: `pg_has_role(..., 'USAGE')`). Superusers and
//! the owners of the state tables need none. With the setting on and no
//! grant (or a database whose extension is not updated to 0.3.0 yet, which
//! has no grants table), every other role is refused: off is the only
//! setting that lets everyone in.
//!
//! The check runs at every allocation, so it must cost next to nothing: a
//! role's grants are read once per backend (a heap scan with the latest
//! snapshot, indexed in memory: exact names by hash) and every scope decided
//! once, in a bounded memo. Both are dropped at any relcache invalidation
//! of the grants table, which its statement trigger sends at every change
//! (`rights_changed`; a table without that trigger is refused, see
//! `state_tables`), and at any change of a role or membership: another
//! session's `pgticket.grant_scope()`, `pgticket.revoke_scope()`, `REVOKE group FROM role` or
//! `ALTER ROLE ... NOSUPERUSER` counts from its commit, at this session's
//! next transaction (or its next lock); a restore or a DROP/CREATE
//! EXTENSION is a new table, found through `state_tables`' generation.
//!
//! Touches: `pgticket.rights` (read only); backend memory.

use pgrx::prelude::*;
use std::collections::HashMap;
use std::ffi::CStr;

use crate::backend_local::{BackendLocal, BackendRefCell};
use crate::errors::TicketError;
use crate::names::Name;
use crate::{settings, state_tables};
use ticket_core::fast_map::{same_key, FastMap};
use ticket_core::rights::{GrantIndex, RightKind, ScopeGrant};

/// Scopes decided before the memo is started over, for all roles together
/// (a role that walks through millions of scopes, or a pooler switching
/// through many roles, must not grow the backend without bound: the memo
/// is Rust heap, outside PostgreSQL's memory accounting).
const MAX_DECIDED: usize = 10_000;
/// Roles whose grants are kept at once; one more evicts one of them (a
/// pooler's `SET ROLE` per tenant must not start every role over).
const MAX_ROLES: usize = 1_024;

struct RoleRights {
    /// Superuser or an owner of the state tables.
    bypass: bool,
    grants: GrantIndex,
    decided: FastMap<Vec<u8>, bool>,
}

#[derive(Default)]
struct Cache {
    /// The state tables' generation and the role changes the grants were
    /// read at.
    generation: u64,
    role_changes: u64,
    roles: HashMap<pg_sys::Oid, RoleRights>,
    decided: usize,
    key: Vec<u8>,
    /// A caller usually asks for the same scope again: this answers it
    /// without hashing, or even copying the names (the hashes of the maps
    /// above cost more than the rest of a call).
    last: Option<LastDecision>,
}

/// The last decision: its role, kind and names, and the answer.
struct LastDecision {
    role: pg_sys::Oid,
    kind: RightKind,
    queue: Vec<u8>,
    domain: Vec<u8>,
    answer: bool,
}

impl LastDecision {
    fn answers(&self, role: pg_sys::Oid, kind: RightKind, queue: &[u8], domain: &[u8]) -> Option<bool> {
        (self.role == role && self.kind == kind && same_key(&self.queue, queue) && same_key(&self.domain, domain))
            .then_some(self.answer)
    }

    /// Remembers a decision, reusing the names' buffers.
    fn remember(last: &mut Option<LastDecision>, role: pg_sys::Oid, kind: RightKind, queue: &[u8], domain: &[u8], answer: bool) {
        let l = last.get_or_insert_with(|| LastDecision { role, kind, queue: Vec::new(), domain: Vec::new(), answer });
        l.role = role;
        l.kind = kind;
        l.queue.clear();
        l.queue.extend_from_slice(queue);
        l.domain.clear();
        l.domain.extend_from_slice(domain);
        l.answer = answer;
    }
}

/// The memo key of `(kind, queue, domain)`, written into `key`.
fn write_key(key: &mut Vec<u8>, kind: RightKind, queue: &[u8], domain: &[u8]) {
    key.clear();
    key.push(kind as u8);
    key.extend_from_slice(queue);
    key.push(0);
    key.extend_from_slice(domain);
}

static CACHE: BackendRefCell<Cache> = BackendRefCell::new();

/// Moves at every change of a role or a membership (`ALTER ROLE ...
/// SUPERUSER`, `NOINHERIT`, `GRANT`/`REVOKE` of a role) or of a database
/// (its owner is `pg_database_owner`'s one member), in this session or
/// any other: who inherits whose grants, and who needs none, may have
/// changed. The callbacks only count: they may not touch the catalogs.
static ROLE_CHANGES: BackendLocal<u64> = BackendLocal::new(0);
static CALLBACKS_REGISTERED: BackendLocal<bool> = BackendLocal::new(false);

unsafe extern "C-unwind" fn on_role_change(_arg: pg_sys::Datum, _cache: std::ffi::c_int, _hash: u32) {
    ROLE_CHANGES.set(ROLE_CHANGES.get() + 1);
}

/// May the current user allocate from `(kind, queue, domain)` (a block's
/// domain is empty)? `label` names it in the refusal (42501).
pub fn check(kind: RightKind, queue: Name<'_>, domain: Name<'_>, label: impl FnOnce() -> String) -> Result<(), TicketError> {
    if !settings::scope_rights() {
        return Ok(());
    }
    let role = crate::xact::current_user();
    if allowed(role, kind, queue.bytes(), domain.bytes()) {
        return Ok(());
    }
    Err(TicketError::NoScopeRight { scope: label(), role: crate::quota::role_name(role) })
}

/// May the current user encode and decode with public key `name`? Always
/// asked (a key is a secret); superusers and the state tables' owners may.
pub fn check_key(name: Name<'_>) -> Result<(), TicketError> {
    let role = crate::xact::current_user();
    if allowed(role, RightKind::PublicKey, name.bytes(), b"") {
        return Ok(());
    }
    Err(TicketError::NoKeyRight { name: name.display(), role: crate::quota::role_name(role) })
}

/// Everything a decision depends on besides the scope: the user, the
/// roles and memberships (`ROLE_CHANGES`) and the grants (the state
/// tables' generation; None while none are cached). A scope permitted
/// after an `Asker` was read is permitted again to an equal one. Read it
/// before asking: a change that arrives while the grants are read moves
/// what is read after, not what was read before.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Asker {
    role: pg_sys::Oid,
    role_changes: u64,
    grants_at: Option<u64>,
}

/// The [`Asker`] now; None while `pg_ticket.scope_rights` is off, when no
/// decision is made (a yes then says nothing about a later one with the
/// setting on).
#[inline]
pub fn asker() -> Option<Asker> {
    settings::scope_rights().then(|| Asker {
        role: crate::xact::current_user(),
        role_changes: ROLE_CHANGES.get(),
        grants_at: state_tables::cached_generation(),
    })
}

/// The decision for `role`, from the memo or its grants.
fn allowed(role: pg_sys::Oid, kind: RightKind, queue: &[u8], domain: &[u8]) -> bool {
    let generation = state_tables::generation();
    let role_changes = ROLE_CHANGES.get();
    let (known, remembered) = CACHE.with(|c| {
        if c.generation != generation || c.role_changes != role_changes {
            c.roles.clear();
            c.decided = 0;
            c.generation = generation;
            c.role_changes = role_changes;
            c.last = None;
        }
        if let Some(answer) = c.last.as_ref().and_then(|last| last.answers(role, kind, queue, domain)) {
            return (true, Some(answer));
        }
        let known = c.roles.contains_key(&role);
        if !known && c.roles.len() >= MAX_ROLES {
            let evicted = *c.roles.keys().next().expect("full");
            let decided = c.roles.remove(&evicted).map_or(0, |r| r.decided.len());
            c.decided -= decided;
        }
        (known, None)
    });
    if let Some(answer) = remembered {
        return answer;
    }
    if !known {
        // Before anything is kept: from here on every change of a role or
        // membership moves ROLE_CHANGES, which empties what was kept.
        if !CALLBACKS_REGISTERED.replace(true) {
            unsafe {
                pg_sys::CacheRegisterSyscacheCallback(pg_sys::SysCacheIdentifier::AUTHOID as i32, Some(on_role_change), pg_sys::Datum::from(0));
                pg_sys::CacheRegisterSyscacheCallback(pg_sys::SysCacheIdentifier::AUTHMEMROLEMEM as i32, Some(on_role_change), pg_sys::Datum::from(0));
                pg_sys::CacheRegisterSyscacheCallback(pg_sys::SysCacheIdentifier::DATABASEOID as i32, Some(on_role_change), pg_sys::Datum::from(0));
            }
        }
        // Read outside the borrow: an invalidation may arrive meanwhile.
        let rights = read(role);
        // One that arrived while reading: this read may predate it, so it
        // is not kept (the next call reads again).
        if state_tables::generation() != generation || ROLE_CHANGES.get() != role_changes {
            return rights.bypass || rights.grants.covers(kind, queue, domain);
        }
        CACHE.with(|c| c.roles.insert(role, rights));
    }
    CACHE.with(|c| {
        let Cache { roles, key, decided, last, .. } = c;
        let Some(rights) = roles.get_mut(&role) else { return false };
        write_key(key, kind, queue, domain);
        let answer = if rights.bypass {
            true
        } else if let Some(&answer) = rights.decided.get(key.as_slice()) {
            answer
        } else {
            let answer = rights.grants.covers(kind, queue, domain);
            if *decided >= MAX_DECIDED {
                roles.values_mut().for_each(|r| r.decided.clear());
                *decided = 0;
            }
            let rights = roles.get_mut(&role).expect("just found");
            rights.decided.insert(key.clone(), answer);
            *decided += 1;
            answer
        };
        LastDecision::remember(last, role, kind, queue, domain, answer);
        answer
    })
}

/// `role`'s grants (its own and those of the roles whose privileges it
/// inherits), or that it needs none.
fn read(role: pg_sys::Oid) -> RoleRights {
    let tables = state_tables::lookup();
    let bypass = unsafe { pg_sys::superuser_arg(role) } || tables.is_some_and(|t| t.owners().contains(&role));
    let grants = match tables.and_then(|t| t.rights).filter(|_| !bypass) {
        Some(table) => {
            state_tables::check_change_trigger(table, "rights");
            read_grants(table.oid, role)
        }
        None => Vec::new(),
    };
    RoleRights { bypass, grants: GrantIndex::new(grants), decided: FastMap::default() }
}

/// The rows of `pgticket.rights` that `role` inherits, read from the heap
/// as committed now (a self snapshot) — not with the statement's or the
/// transaction's snapshot, which may predate a revoke whose invalidation is
/// being answered now (the grant would be read back and kept), and not with
/// an MVCC one, which under SERIALIZABLE would take a predicate lock and
/// make allocations fail (40001) at a grant's change. A change committed
/// during the scan may be half seen: its invalidation then drops this read
/// at the next transaction. No SPI, so no caller's setting or the table
/// owner's rules take part.
fn read_grants(table: pg_sys::Oid, role: pg_sys::Oid) -> Vec<ScopeGrant> {
    const ROLE: i32 = 1;
    const KIND: i32 = 2;
    const QUEUE: i32 = 3;
    const DOMAIN: i32 = 4;
    let mut grants = Vec::new();
    state_tables::for_each_committed_row(table, |tuple, desc| unsafe {
        let text = |column: i32| -> Option<Vec<u8>> {
            let mut is_null = false;
            let datum = pg_sys::heap_getattr(tuple, column, desc, &mut is_null);
            (!is_null).then(|| {
                let c = pg_sys::text_to_cstring(datum.cast_mut_ptr());
                let bytes = CStr::from_ptr(c).to_bytes().to_vec();
                pg_sys::pfree(c.cast());
                bytes
            })
        };
        let mut is_null = false;
        let grantee = pg_sys::heap_getattr(tuple, ROLE, desc, &mut is_null);
        if is_null || !pg_sys::has_privs_of_role(role, pg_sys::Oid::from(grantee.value() as u32)) {
            return;
        }
        let kind = text(KIND).and_then(|k| RightKind::from_sql_name(std::str::from_utf8(&k).ok()?));
        if let (Some(kind), Some(queue), Some(domain)) = (kind, text(QUEUE), text(DOMAIN)) {
            grants.push(ScopeGrant { kind, queue, domain });
        }
    });
    grants
}

/// May the current user allocate from this scope (`kind` 'scoped_id' or
/// 'ticket': `queue`, `domain`) or block name (`kind` 'block': `queue` is
/// the name, `domain` NULL)? True for everyone while
/// `pg_ticket.scope_rights` is off. `pgticket.marks` shows only these rows.
#[pg_extern(stable, parallel_restricted, schema = "pgticket")]
fn may_allocate(kind: Option<&str>, queue: Option<Name<'_>>, domain: Option<Name<'_>>) -> bool {
    crate::errors::postgres_errors_as_raised(|| {
        let kind = crate::args::required("kind", kind);
        // Names outside the limits are refused as the allocators refuse
        // them, and never reach the memo of decisions.
        let queue = crate::args::name_arg("queue", queue);
        let right = match kind {
            "scoped_id" | "ticket" => RightKind::Scope,
            "block" => RightKind::Block,
            other => TicketError::InvalidArgument(format!("kind is 'scoped_id', 'ticket' or 'block', not {other:?}")).raise(),
        };
        let domain = match (right, domain) {
            (RightKind::Scope, domain) => crate::args::name_arg("domain", domain),
            (RightKind::Block, None) => Name(b""),
            // A block name has no domain: one given is a mistake (the
            // answer would not be about it).
            (RightKind::PublicKey, _) => unreachable!("not a kind of may_allocate"),
            (RightKind::Block, Some(_)) => TicketError::InvalidArgument(
                "kind 'block' asks about a block name, given as queue: domain must be NULL".into(),
            )
            .raise(),
        };
        check(right, queue, domain, String::new).is_ok()
    })
}

/// Any change of the grants reaches every backend at its next transaction
/// (a relcache invalidation of the table drops their caches).
#[pg_trigger(sql = false)]
fn rights_changed<'a>(trigger: &'a pgrx::PgTrigger<'a>) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, pgrx::PgTriggerError> {
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(trigger.relation()?.oid()) };
    Ok(None)
}

extension_sql!(
    r#"
-- 0.3.0: rights per scope (SPEC s.16), used while pg_ticket.scope_rights is
-- on. A pattern's trailing * is a prefix ('*' alone: every name); a scope
-- grant covers the queue's counters and tickets, a block grant block names
-- (domain '*'). Grants name roles as regrole, so a dump carries them by
-- name (a restore needs the roles, as GRANT does).
CREATE TABLE pgticket.rights (
    role regrole NOT NULL,
    kind text NOT NULL CHECK (kind IN ('scope', 'block')),
    queue text COLLATE "C" NOT NULL,
    domain text COLLATE "C" NOT NULL DEFAULT '*',
    PRIMARY KEY (role, kind, queue, domain)
);
COMMENT ON TABLE pgticket.rights IS
    'Which roles may allocate from which scopes and block names while pg_ticket.scope_rights is on (pgticket.grant_scope, pgticket.grant_block)';
CREATE FUNCTION pgticket.rights_changed() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'rights_changed_wrapper';
CREATE TRIGGER changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON pgticket.rights
    FOR EACH STATEMENT EXECUTE FUNCTION pgticket.rights_changed();
ALTER TABLE pgticket.rights ENABLE ALWAYS TRIGGER changed;
-- 0.4.0: a loaded grant that is there already is skipped (a dump restored
-- into the database it came from, SPEC s.17.3).
CREATE TRIGGER keeps_present BEFORE INSERT ON pgticket.rights
    FOR EACH ROW EXECUTE FUNCTION pgticket.merge_loaded_row();
ALTER TABLE pgticket.rights ENABLE ALWAYS TRIGGER keeps_present;
-- A dropped role's grants stay (they show its OID) but are not dumped: in
-- another cluster that OID may be another role's.
SELECT pg_catalog.pg_extension_config_dump('pgticket.rights',
    'WHERE EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.oid OPERATOR(pg_catalog.=) role::pg_catalog.oid)');
REVOKE ALL ON pgticket.rights FROM PUBLIC;
REVOKE ALL ON FUNCTION pgticket.rights_changed() FROM PUBLIC;
CREATE VIEW pgticket.scope_grants AS
    SELECT role, kind,
           CASE WHEN kind OPERATOR(pg_catalog.=) 'scope' THEN queue END AS queue,
           CASE WHEN kind OPERATOR(pg_catalog.=) 'scope' THEN domain END AS domain,
           CASE WHEN kind OPERATOR(pg_catalog.=) 'block' THEN queue END AS block_name
      FROM pgticket.rights;
COMMENT ON VIEW pgticket.scope_grants IS
    'The grants of scopes (queue, domain) and block names to roles; a trailing * is a prefix';
REVOKE ALL ON pgticket.scope_grants FROM PUBLIC;
CREATE FUNCTION pgticket.change_right(grant_it boolean, role regrole, kind text, queue text, domain text)
RETURNS boolean VOLATILE LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    what text := CASE kind WHEN 'scope' THEN 'queue' ELSE 'name' END;
    changed integer;
BEGIN
    IF role IS NULL OR queue IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', CASE WHEN role IS NULL THEN 'role' ELSE what END
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles r WHERE r.oid = role) THEN
        RAISE EXCEPTION 'role with OID % does not exist', role::oid USING ERRCODE = 'undefined_object';
    END IF;
    domain := coalesce(domain, '*');
    IF queue = '' OR domain = '' THEN
        RAISE EXCEPTION '% must not be empty', CASE WHEN queue = '' THEN what ELSE 'domain' END
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A name is at most 255 bytes; a pattern adds its star.
    IF octet_length(queue) - (right(queue, 1) = '*')::integer > 255 THEN
        RAISE EXCEPTION '% is longer than 255 bytes', what USING ERRCODE = 'invalid_parameter_value';
    ELSIF octet_length(domain) - (right(domain, 1) = '*')::integer > 255 THEN
        RAISE EXCEPTION 'domain is longer than 255 bytes' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Rows of roles dropped since go (a new role could get their OID).
    DELETE FROM pgticket.rights r WHERE NOT EXISTS (SELECT FROM pg_roles x WHERE x.oid = r.role::oid);
    IF grant_it THEN
        INSERT INTO pgticket.rights AS r (role, kind, queue, domain) VALUES (role, kind, queue, domain) ON CONFLICT DO NOTHING;
    ELSE
        DELETE FROM pgticket.rights r
         WHERE r.role = change_right.role AND r.kind = change_right.kind AND r.queue = change_right.queue AND r.domain = change_right.domain;
    END IF;
    GET DIAGNOSTICS changed = ROW_COUNT;
    RETURN changed > 0;
END $$;
REVOKE ALL ON FUNCTION pgticket.change_right(boolean, regrole, text, text, text) FROM PUBLIC;
CREATE FUNCTION pgticket.grant_scope(role regrole, queue text, domain text DEFAULT NULL) RETURNS boolean
VOLATILE SECURITY DEFINER LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$ SELECT pgticket.change_right(true, role, 'scope', queue, domain) $$;
CREATE FUNCTION pgticket.revoke_scope(role regrole, queue text, domain text DEFAULT NULL) RETURNS boolean
VOLATILE SECURITY DEFINER LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$ SELECT pgticket.change_right(false, role, 'scope', queue, domain) $$;
CREATE FUNCTION pgticket.grant_block(role regrole, name text) RETURNS boolean
VOLATILE SECURITY DEFINER LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$ SELECT pgticket.change_right(true, role, 'block', name, NULL) $$;
CREATE FUNCTION pgticket.revoke_block(role regrole, name text) RETURNS boolean
VOLATILE SECURITY DEFINER LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$ SELECT pgticket.change_right(false, role, 'block', name, NULL) $$;
COMMENT ON FUNCTION pgticket.grant_scope(regrole, text, text) IS
    'Lets role allocate from (queue, domain) while pg_ticket.scope_rights is on (NULL domain: every domain; a trailing * is a prefix); true if new';
COMMENT ON FUNCTION pgticket.revoke_scope(regrole, text, text) IS
    'Removes the grant pgticket.grant_scope(role, queue, domain) made; true if there was one';
COMMENT ON FUNCTION pgticket.grant_block(regrole, text) IS
    'Lets role reserve blocks of name while pg_ticket.scope_rights is on (a trailing * is a prefix); true if new';
COMMENT ON FUNCTION pgticket.revoke_block(regrole, text) IS
    'Removes the grant pgticket.grant_block(role, name) made; true if there was one';
REVOKE EXECUTE ON FUNCTION pgticket.grant_scope(regrole, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgticket.revoke_scope(regrole, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgticket.grant_block(regrole, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgticket.revoke_block(regrole, text) FROM PUBLIC;
-- A role sees the marks of the scopes and block names it may use (0.5.0:
-- rows of a function, pgticket.marks_rows(), which filters them before a
-- caller's condition sees any; a security-barrier view let a caller's
-- leakproof condition into the tables' index scans, and EXPLAIN ANALYZE
-- counted the rows it removed). Names in "C", as the tables keep them.
CREATE OR REPLACE VIEW pgticket.marks AS
    SELECT m.kind, m.queue COLLATE "C" AS queue, m.domain COLLATE "C" AS domain,
           m.block_name COLLATE "C" AS block_name, m.mark, m.remaining, m.max_mark
      FROM pgticket.marks_rows() m;
"#,
    name = "rights",
    requires = [may_allocate, "schema", "ticket_views", marks_rows]
);
