//! Which relations are the state tables now, and who owns them.
//!
//! Cached per backend, because the owner is needed on every first allocation
//! from a scope and the relation ids on every allocation (they are part of
//! the backend-local key). A relcache invalidation of either table — sent by
//! `ALTER TABLE ... OWNER`, `REASSIGN OWNED`, `DROP EXTENSION`, `ALTER
//! EXTENSION ... UPDATE`, in this session or any other — drops the cache, so a long-lived session (a pool's
//! connection) sees such a change at its next call, with no catalog query
//! per ID. The callback only clears a cell: it may not touch the catalogs.

use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::Cell;

use super::allocator::Kind;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Tables {
    pub scoped_counters: pg_sys::Oid,
    pub blocks: pg_sys::Oid,
    pub owner: pg_sys::Oid,
    /// The tables have the `max_mark` column of 0.2.0. Without it they are
    /// 0.1.0's, not yet updated (`ALTER EXTENSION pg_ticket UPDATE`), and
    /// every limit is 2^63-1: the library serves both.
    pub has_limits: bool,
}

impl Tables {
    pub fn of(&self, kind: Kind) -> pg_sys::Oid {
        match kind {
            Kind::Scope => self.scoped_counters,
            Kind::Block => self.blocks,
        }
    }
}

thread_local! {
    static CACHE: Cell<Option<Tables>> = const { Cell::new(None) };
    static CALLBACK_REGISTERED: Cell<bool> = const { Cell::new(false) };
}

/// The tables as they are now; an error if the extension's tables are gone.
pub fn current() -> Tables {
    lookup().unwrap_or_else(|| pgrx::error!("pg_ticket: the extension's state tables are missing; run CREATE EXTENSION pg_ticket"))
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
    // Read-only, so it also runs on a hot standby; names and operators
    // qualified, so no search_path can redirect it.
    let found = Spi::connect(|client| {
        let row = client
            .select(
                "SELECT s.oid, b.oid, s.relowner, EXISTS (SELECT FROM pg_catalog.pg_attribute a \
                          WHERE a.attrelid OPERATOR(pg_catalog.=) s.oid AND a.attname OPERATOR(pg_catalog.=) 'max_mark' \
                            AND NOT a.attisdropped) \
                   FROM pg_catalog.pg_class s, pg_catalog.pg_class b \
                 WHERE s.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('pgticket.scoped_counters') \
                   AND b.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('pgticket.blocks')",
                None,
                &[],
            )?
            .first();
        if row.is_empty() {
            return Ok::<_, pgrx::spi::Error>(None);
        }
        Ok(Some(Tables {
            scoped_counters: row.get::<pg_sys::Oid>(1)?.expect("oid"),
            blocks: row.get::<pg_sys::Oid>(2)?.expect("oid"),
            owner: row.get::<pg_sys::Oid>(3)?.expect("relowner"),
            has_limits: row.get::<bool>(4)?.expect("exists"),
        }))
    })
    .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot look up the state tables: {e}"));
    CACHE.set(found);
    found
}

unsafe extern "C-unwind" fn on_relcache_invalidation(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    // InvalidOid: every relation (a cache reset).
    if let Some(t) = CACHE.get() {
        if relid == pg_sys::InvalidOid || relid == t.scoped_counters || relid == t.blocks {
            CACHE.set(None);
        }
    }
}
