//! Tickets (`next_ticket`): unique, never reused, per-scope numbers from
//! shared memory, with gaps allowed (SPEC §7) — Flickr's ticket table and
//! Leaf-segment inside the server.
//!
//! - `shmem`: the cache of scopes in shared memory (its module comment has
//!   the locking rule) and the registry of workers.
//! - `worker`: one background worker per database, started on demand, that
//!   reserves segments in `pgticket.tickets` in its own durable commits.
//! - this file: the SQL functions and a backend's path to a ticket: find
//!   the scope's slot, take a value under the slot's spinlock, and wait for
//!   the worker only when nothing is cached.
//!
//! What to hand out is decided in `ticket_core::tickets` (series, segments,
//! double buffer, step). Touches `pgticket.tickets` only through the worker
//! and `pgticket.advance_ticket`.

mod shmem;
mod worker;


use pgrx::pg_sys;
use pgrx::prelude::*;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::args::{required, scope_args};
use crate::backend_local::{BackendLocal, BackendRefCell};
use crate::errors::{postgres_errors_as_raised, OrRaise, TicketError};
use crate::names::Name;
use crate::{settings, state_tables, xact};
use shmem::{Directory, Failure, ScopeId};
use ticket_core::fast_map::same_key;
use ticket_core::rights::RightKind;
use ticket_core::tickets::Take;


pub fn init_shared_memory(nslots: usize) {
    shmem::init(nslots);
}

/// The hook that empties a dropped database's cached scopes.
pub fn install_hooks() {
    unsafe {
        PREV_OBJECT_ACCESS = pg_sys::object_access_hook;
        pg_sys::object_access_hook = Some(on_object_access);
    }
}

static mut PREV_OBJECT_ACCESS: pg_sys::object_access_hook_type = None;

/// A dropped database takes its cached scopes with it (SPEC §13.1): a
/// database created later with the same OID from a template holding the
/// same tickets table (same relation id) must not meet them. Purged when
/// the drop is carried out; a drop that fails after this leaves a gap only.
#[pg_guard]
unsafe extern "C-unwind" fn on_object_access(
    access: pg_sys::ObjectAccessType::Type,
    class_id: pg_sys::Oid,
    object_id: pg_sys::Oid,
    sub_id: std::ffi::c_int,
    arg: *mut std::ffi::c_void,
) {
    unsafe {
        if let Some(prev) = PREV_OBJECT_ACCESS {
            prev(access, class_id, object_id, sub_id, arg);
        }
    }
    if access == pg_sys::ObjectAccessType::OAT_DROP && class_id == pg_sys::DatabaseRelationId {
        let db = object_id.to_u32();
        shmem::empty_database(db);
    }
}

/// Scope key as the slots store it: queue, NUL, domain (database bytes).
fn encode(buf: &mut Vec<u8>, queue: Name<'_>, domain: Name<'_>) {
    buf.clear();
    buf.extend_from_slice(queue.bytes());
    buf.push(0);
    buf.extend_from_slice(domain.bytes());
}

fn split(key: &[u8]) -> (Name<'_>, Name<'_>) {
    let nul = key.iter().position(|&b| b == 0).expect("a ticket key has a separator");
    (Name(&key[..nul]), Name(&key[nul + 1..]))
}

fn hash_of(db: u32, table: u32, key: &[u8]) -> u64 {
    // Keyed with the cache's secret, the same in every process of this
    // server's life: names cannot be chosen to collide (SPEC §13.11).
    let [k0, k1] = shmem::header().hash_key;
    let mut h = siphasher::sip::SipHasher13::new_with_keys(k0, k1);
    db.hash(&mut h);
    table.hash(&mut h);
    key.hash(&mut h);
    h.finish()
}

/// The scope `key` of this database's current tickets table.
fn scope_id(key: &[u8]) -> ScopeId<'_> {
    let db = my_database();
    let table = state_tables::tickets().oid.to_u32();
    ScopeId { db, table, hash: hash_of(db, table, key), key }
}

/// Bound on the backend-local map of (slot, generation): a backend that
/// touches more scopes just looks them up again.
const LOCAL_MAX: usize = 10_000;

/// A scope this backend found: its slot and the slot's generation then.
struct Known {
    db: u32,
    table: u32,
    key: Box<[u8]>,
    slot: usize,
    generation: u64,
}

static KEY_BUF: BackendRefCell<Vec<u8>> = BackendRefCell::new();
/// By the scope's hash; a collision just makes the other scope look itself
/// up again. No allocation on a hit.
static KNOWN: BackendRefCell<HashMap<u64, Known>> = BackendRefCell::new();
/// Scopes moved by `pgticket.advance_ticket` in this backend, with the
/// (sub)transactions that hold their row locked until they end.
static ADVANCED: BackendRefCell<HashMap<u64, Vec<pg_sys::TransactionId>>> = BackendRefCell::new();

fn my_database() -> u32 {
    unsafe { pg_sys::MyDatabaseId }.to_u32()
}

/// The slot of a scope and its generation: the backend's memory of it, or
/// the directory's, or a slot given to it now (the least recently used one
/// if none is free: its cached rest becomes a gap).
fn locate(scope: &ScopeId<'_>, before_placing: impl FnOnce()) -> (usize, u64) {
    let known = KNOWN.with(|k| {
        k.get(&scope.hash)
            .filter(|known| known.db == scope.db && known.table == scope.table && same_key(&known.key, scope.key))
            .map(|known| (known.slot, known.generation))
    });
    if let Some(found) = known {
        return found;
    }
    let found = find(scope, false).unwrap_or_else(|| {
        before_placing();
        find(scope, true).expect("an exclusive find always places the scope")
    });
    KNOWN.with(|k| {
        if k.len() >= LOCAL_MAX {
            k.clear();
        }
        k.insert(
            scope.hash,
            Known { db: scope.db, table: scope.table, key: Box::from(scope.key), slot: found.0, generation: found.1 },
        );
    });
    found
}

/// A role at `pg_ticket.max_scopes_per_role` asking for a ticket scope
/// that has no row would be refused by the worker (53400): refused here,
/// before the scope takes a cache slot (#31 item 4: 0.3.0 placed each such
/// name first, and a role past its cap evicted the other roles' cached
/// scopes with names it could never make). One read of the role's count,
/// and for a role at its cap one of the tickets table, only when a scope
/// is placed.
fn refuse_a_new_scope_past_the_cap(queue: Name<'_>, domain: Name<'_>) {
    let role = crate::quota::creator();
    let Err(refusal) = crate::quota::check_room(role) else { return };
    let exists = state_tables::as_owner_of(state_tables::tickets(), || {
        Spi::connect(|client| {
            client
                .select(
                    "SELECT 1 FROM pgticket.tickets WHERE queue OPERATOR(pg_catalog.=) $1 AND domain OPERATOR(pg_catalog.=) $2",
                    Some(1),
                    &[queue.to_datum(), domain.to_datum()],
                )
                .map(|rows| !rows.is_empty())
        })
    })
    .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot read pgticket.tickets: {e}"));
    if !exists {
        refusal.about(crate::names::label("ticket scope", queue, Some(domain))).raise();
    }
}

fn forget(hash: u64) {
    KNOWN.with(|k| k.remove(&hash));
}

/// Look the scope up in the directory; with `place`, under the exclusive
/// lock, give it a slot if it has none. O(1) either way (SPEC §13.11).
fn find(scope: &ScopeId<'_>, place: bool) -> Option<(usize, u64)> {
    let first_step = settings::ticket_step_bounds().0;
    let mut dir = Directory::lock(place);
    if let Some(i) = dir.lookup(scope) {
        return Some((i, shmem::slots()[i].generation.load(Ordering::Acquire)));
    }
    place.then(|| dir.place(scope, first_step))
}

fn raise(failure: Failure, queue: Name<'_>, domain: Name<'_>) -> ! {
    let series = settings::ticket_series();
    let scope = || crate::names::label("ticket scope", queue, Some(domain));
    match failure {
        Failure::OtherSeries { offset, increment } => TicketError::Tickets(ticket_core::tickets::TicketsError::OtherSeries {
            created_offset: offset,
            created_increment: increment,
            offset: series.offset,
            increment: series.increment,
        })
        .about(scope())
        .raise(),
        Failure::Overflow { mark } => {
            TicketError::Tickets(ticket_core::tickets::TicketsError::Overflow { mark, size: 1 }).about(scope()).raise()
        }
        Failure::TooManyScopes { role, created, cap } => {
            TicketError::TooManyScopes { role: crate::quota::role_name(pg_sys::Oid::from(role)), created, cap }
                .about(scope())
                .raise()
        }
        Failure::Unavailable => TicketError::TicketsUnavailable(format!(
            "the ticket worker could not reserve tickets for ({}, {}); see the server log",
            queue.quoted(),
            domain.quoted()
        ))
        .raise(),
        Failure::NotReplicated => TicketError::TicketsUnavailable(format!(
            "the synchronous standbys did not confirm the reservation of tickets for ({}, {}) (the wait was cancelled): none of it is handed out",
            queue.quoted(),
            domain.quoted()
        ))
        .raise(),
    }
}

/// Refused (42501) unless the current user may use the ticket scope.
fn check_right(queue: Name<'_>, domain: Name<'_>) {
    crate::rights::check(RightKind::Scope, queue, domain, || crate::names::label("ticket scope", queue, Some(domain))).or_raise();
}

/// The next ticket of (queue, domain), names already checked.
pub fn next(queue: Name<'_>, domain: Name<'_>) -> i64 {
    if !settings::preloaded() {
        TicketError::NotPreloaded("next_ticket").raise();
    }
    xact::check_writable().or_raise();
    check_right(queue, domain);
    crate::group::check_allocator(ticket_core::group::Use::Tickets).or_raise();
    KEY_BUF.with(|key| {
        encode(key, queue, domain);
        take(key, queue, domain)
    })
}

fn take(key: &[u8], queue: Name<'_>, domain: Name<'_>) -> i64 {
    let series = settings::ticket_series();
    let scope = scope_id(key);
    let mut deadline = None;
    loop {
        let (i, generation) = locate(&scope, || refuse_a_new_scope_past_the_cap(queue, domain));
        let slot = &shmem::slots()[i];
        let mut g = slot.lock();
        if slot.generation.load(Ordering::Acquire) != generation || !g.matches(&scope) {
            drop(g);
            forget(scope.hash);
            continue;
        }
        // What is cached is handed out first (SPEC §13.5): a failure to
        // fetch more is reported only when nothing is left.
        match g.cache.take(series) {
            Take::Value { value, fetch_ahead } => {
                g.last_used_ms = shmem::coarse_ms();
                g.referenced = true;
                let ask = fetch_ahead && !g.requested && g.failure.is_none();
                g.requested |= ask;
                g.asks += u64::from(ask);
                drop(g);
                if ask && !matches!(worker::request(scope.db, i), Ok(true)) {
                    // The value is taken: no error now. The next call asks
                    // again (also when the database waits in line for a
                    // worker: nothing was queued), and reports an error if
                    // nothing is left by then.
                    let mut g = slot.lock();
                    if slot.generation.load(Ordering::Acquire) == generation {
                        g.requested = false;
                    }
                }
                return value;
            }
            Take::Empty => {
                if let Some(Failure::TooManyScopes { role, .. }) = g.failure {
                    if role != crate::quota::creator().to_u32() {
                        // Another role's refusal: this one asks for itself.
                        g.failure = None;
                    }
                }
                if let Some(failure) = g.failure {
                    // A series or overflow refusal stands until the slot is
                    // emptied (pgticket.advance_ticket, eviction, restart); a failed
                    // reservation is reported once and tried again by the
                    // next call.
                    if matches!(failure, Failure::Unavailable | Failure::NotReplicated | Failure::TooManyScopes { .. }) {
                        g.failure = None;
                    }
                    drop(g);
                    raise(failure, queue, domain);
                }
                drop(g);
                refuse_if_advanced_here(scope.hash, queue, domain);
                let mut g = slot.lock();
                if slot.generation.load(Ordering::Acquire) != generation {
                    continue; // given to another scope meanwhile: look again
                }
                g.requested = true;
                g.asks += 1;
                g.waits += 1;
                g.waiters += 1;
                // A new row would be this role's: checked and counted for it.
                g.set_creator();
                drop(g);
                // Until this call returns or is cancelled (an ERROR unwinds
                // through it): the worker serves a first use only while
                // someone waits for it.
                let _waiting = Waiting::counted(i, generation);
                crate::refusals::count_ticket_wait();
                let _queued = worker::request(scope.db, i).or_raise();
                let deadline = *deadline.get_or_insert_with(|| Instant::now() + settings::ticket_wait_timeout());
                wait_for_segment(i, generation, scope.db, deadline, queue, domain);
            }
        }
    }
}

/// A backend waiting for a slot's segment, counted in `SlotData::waiters`
/// while it lives (a slot given to another scope since has its own count).
/// Undone by its drop (a return, or an ERROR unwinding), or, when the
/// backend exits while waiting (FATAL: `pg_terminate_backend`, a lost
/// client, `transaction_timeout`, where nothing unwinds), by the exit
/// callback: a count left behind would make the worker serve a first use
/// nobody waits for (#46 review of item 10).
struct Waiting;

/// The slot and generation this backend waits on now (for the guard's
/// drop and the exit callback alike).
static WAITING_ON: BackendLocal<Option<(usize, u64)>> = BackendLocal::new(None);
static WAIT_EXIT_CALLBACK: BackendLocal<bool> = BackendLocal::new(false);

impl Waiting {
    /// Counted already (under the slot's lock, with the ask).
    fn counted(slot: usize, generation: u64) -> Waiting {
        if !WAIT_EXIT_CALLBACK.replace(true) {
            unsafe { pg_sys::before_shmem_exit(Some(stop_waiting_on_exit), pg_sys::Datum::from(0)) };
        }
        WAITING_ON.set(Some((slot, generation)));
        Waiting
    }
}

/// Uncounts the wait under way, if any.
fn stop_waiting() {
    let Some((slot, generation)) = WAITING_ON.replace(None) else { return };
    let slot_ref = &shmem::slots()[slot];
    let mut g = slot_ref.lock();
    if slot_ref.generation.load(Ordering::Acquire) == generation {
        g.waiters = g.waiters.saturating_sub(1);
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        stop_waiting();
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn stop_waiting_on_exit(_code: i32, _arg: pg_sys::Datum) {
    stop_waiting();
}

/// Is `xid` this transaction or one of its live subtransactions?
fn is_current(xid: pg_sys::TransactionId) -> bool {
    unsafe { pg_sys::TransactionIdIsCurrentTransactionId(xid) }
}

/// Remember that this (sub)transaction holds the scope's row locked.
fn remember_advanced(hash: u64) {
    let xid = unsafe { pg_sys::GetCurrentTransactionId() };
    ADVANCED.with(|a| {
        if a.len() >= LOCAL_MAX {
            // Only entries of transactions still running matter.
            a.retain(|_, xids| {
                xids.retain(|x| is_current(*x));
                !xids.is_empty()
            });
        }
        let xids = a.entry(hash).or_default();
        xids.retain(|x| is_current(*x));
        xids.push(xid);
    });
}

/// The worker cannot reserve a scope whose row this transaction holds
/// locked since `pgticket.advance_ticket`: waiting for it would wait on ourselves.
fn refuse_if_advanced_here(hash: u64, queue: Name<'_>, domain: Name<'_>) {
    let here = ADVANCED.with(|a| a.get(&hash).is_some_and(|xids| xids.iter().any(|xid| is_current(*xid))));
    if here {
        TicketError::TicketsUnavailable(format!(
            "this transaction moved the ticket scope ({}, {}) forward (pgticket.advance_ticket, pgticket.raise_ticket_floor, pgticket.convert_sequence, or a number given to a trigger made with on_explicit => 'advance'), which holds it until the commit; take tickets of it after the commit",
            queue.quoted(),
            domain.quoted()
        ))
        .raise();
    }
}

/// Sleep on the condition variable until the slot has something cached, a
/// failure, or another scope — or the deadline passes (55000). Wakes the
/// worker again every 100 ms, which also restarts a worker that died.
fn wait_for_segment(i: usize, generation: u64, db: u32, deadline: Instant, queue: Name<'_>, domain: Name<'_>) {
    let series = settings::ticket_series();
    let slot = &shmem::slots()[i];
    let cv = shmem::cv();
    unsafe { pg_sys::ConditionVariablePrepareToSleep(cv) };
    loop {
        let busy = {
            let mut g = slot.lock();
            if slot.generation.load(Ordering::Acquire) != generation || g.failure.is_some() || g.cache.cached(series) > 0 {
                break;
            }
            // A scope whose row was locked is asked for again while we wait.
            g.requested = true;
            g.asks += 1;
            g.busy
        };
        let now = Instant::now();
        if now >= deadline {
            unsafe { pg_sys::ConditionVariableCancelSleep() };
            let why = if busy {
                "its row in pgticket.tickets is locked by another transaction (one that moved the scope forward and has not ended: pgticket.advance_ticket, pgticket.raise_ticket_floor, pgticket.convert_sequence, or a number given to a trigger made with on_explicit => 'advance'; pg_locks and pg_prepared_xacts show it)".to_string()
            } else if let Some(waited_ms) = worker::commit_wait_ms(db) {
                format!(
                    "the ticket worker of this database has been waiting {} for its commit to be confirmed by the synchronous standbys (synchronous_standby_names): a standby is gone or slow",
                    ticket_core::epoch::format_duration_ms(waited_ms as i64)
                )
            } else if worker::waits_in_line(db) {
                format!(
                    "this database waits for a ticket worker: pg_ticket.max_ticket_workers ({}) serve other databases, and one retires for it at most every {}",
                    settings::max_ticket_workers(),
                    ticket_core::epoch::format_duration_ms(worker::TENURE_MS as i64)
                )
            } else {
                "the ticket worker of this database is not keeping up or not running".to_string()
            };
            TicketError::TicketsUnavailable(format!(
                "no tickets for ({}, {}) arrived within pg_ticket.ticket_wait_timeout ({}): {why}",
                queue.quoted(),
                domain.quoted(),
                ticket_core::epoch::format_duration_ms(settings::ticket_wait_timeout().as_millis() as i64)
            ))
            .raise();
        }
        let wait_ms = (deadline - now).as_millis().min(100) as i64;
        unsafe { pg_sys::ConditionVariableTimedSleep(cv, wait_ms, pg_sys::PG_WAIT_EXTENSION) };
        let _queued = worker::request(db, i).or_raise();
    }
    unsafe { pg_sys::ConditionVariableCancelSleep() };
}

/// The next ticket of `(queue, domain)`: unique and increasing on this
/// server, never reused, not transactional, never waiting on another
/// transaction.
#[pg_extern(volatile, parallel_unsafe)]
fn next_ticket(queue: Option<Name<'_>>, domain: Option<Name<'_>>) -> i64 {
    postgres_errors_as_raised(|| {
        let (queue, domain) = scope_args(queue, domain);
        next(queue, domain)
    })
}

/// Admin: move a ticket scope's mark forward to `mark` (never back) and drop
/// its cached segments, so every later ticket is above `mark`.
#[pg_extern(volatile, parallel_unsafe, schema = "pgticket")]
fn advance_ticket(queue: Option<Name<'_>>, domain: Option<Name<'_>>, mark: Option<i64>) -> i64 {
    postgres_errors_as_raised(|| {
        let (queue, domain) = scope_args(queue, domain);
        let mark = required("mark", mark);
        if !settings::preloaded() {
            TicketError::NotPreloaded("pgticket.advance_ticket").raise();
        }
        move_forward(queue, domain, mark, worker::Move::Advance).or_raise();
        mark
    })
}

/// Admin: every later ticket of the scope above `floor` (its mark moved
/// there if below, its cached segments dropped either way: tickets cached
/// below `floor` are not handed out); returns the mark. What a conversion
/// from a sequence needs (review of #47: a column reverted to its sequence
/// and converted again got the tickets cached before the revert, which the
/// sequence had handed out meanwhile).
#[pg_extern(volatile, parallel_unsafe, schema = "pgticket")]
fn raise_ticket_floor(queue: Option<Name<'_>>, domain: Option<Name<'_>>, floor: Option<i64>) -> i64 {
    postgres_errors_as_raised(|| {
        let (queue, domain) = scope_args(queue, domain);
        let floor = required("floor", floor);
        if !settings::preloaded() {
            TicketError::NotPreloaded("pgticket.raise_ticket_floor").raise();
        }
        if floor < 0 {
            TicketError::from(ticket_core::counter::CounterError::NegativeMark(floor)).raise();
        }
        move_forward(queue, domain, floor, worker::Move::AtLeast).or_raise()
    })
}

/// A ticket given explicitly (a numbering trigger's `on_explicit =>
/// 'advance'`, SPEC §18.4): every ticket of the scope from now on is above
/// it; refused (23505) if it is not above every ticket reserved so far
/// (it may have been handed out).
pub fn claim(queue: Name<'_>, domain: Name<'_>, value: i64) -> Result<(), TicketError> {
    if !settings::preloaded() {
        return Err(TicketError::NotPreloaded("assign_ticket"));
    }
    move_forward(queue, domain, value, worker::Move::Claim).map(|_| ())
}

/// The scope's mark moved to `to` (with `claim`, only if above every
/// ticket reserved): in the caller's transaction, its cached tickets
/// dropped, as `pgticket.advance_ticket` does.
fn move_forward(queue: Name<'_>, domain: Name<'_>, to: i64, how: worker::Move) -> Result<i64, TicketError> {
    xact::check_writable()?;
    check_right(queue, domain);
    let mut key = Vec::new();
    encode(&mut key, queue, domain);
    let scope = scope_id(&key);
    // Never below what the cache reserved, even if the row says less.
    let reserved = shmem::slots().iter().fold(0, |most, slot| {
        let g = slot.lock();
        if g.matches(&scope) { most.max(g.reserved_to) } else { most }
    });
    let mark = worker::advance_in_table(queue, domain, to, reserved, how)?;
    remember_advanced(scope.hash);
    // Dropped now, before the commit: a segment reserved meanwhile waits
    // for this row lock and lands above the new mark.
    shmem::empty_slots(|g| g.matches(&scope));
    Ok(mark)
}

/// SPEC §17.3: a row of `(queue, domain)` loaded from outside (a restore
/// into a used database) meets the row here: the mark becomes the highest
/// of the two and of what the cache reserved, and the cached values are
/// dropped as `pgticket.advance_ticket` drops them (they are below the loaded mark,
/// which the dump's database may have handed out). False if there is no
/// row (the load inserts it).
pub fn merge_loaded(queue: Name<'_>, domain: Name<'_>, mark: i64) -> bool {
    let mut key = Vec::new();
    encode(&mut key, queue, domain);
    let scope = settings::preloaded().then(|| scope_id(&key));
    let reserved = scope.as_ref().map_or(0, |scope| {
        shmem::slots().iter().fold(0, |most, slot| {
            let g = slot.lock();
            if g.matches(scope) { most.max(g.reserved_to) } else { most }
        })
    });
    let merged = state_tables::as_owner_of(state_tables::tickets(), || {
        Spi::connect_mut(|client| {
            client
                .update(
                    "UPDATE pgticket.tickets SET mark = GREATEST(mark, $3, $4) \
                      WHERE queue OPERATOR(pg_catalog.=) $1 AND domain OPERATOR(pg_catalog.=) $2 RETURNING mark",
                    Some(1),
                    &[queue.to_datum(), domain.to_datum(), mark.into(), reserved.into()],
                )
                .map(|rows| !rows.is_empty())
        })
    })
    .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot merge a loaded row into pgticket.tickets: {e}"));
    if let (true, Some(scope)) = (merged, scope) {
        remember_advanced(scope.hash);
        shmem::empty_slots(|g| g.matches(&scope));
    }
    merged
}

/// The scopes of this database cached in shared memory.
#[pg_extern(name = "ticket_cache_rows", volatile, parallel_safe, schema = "pgticket")]
fn ticket_cache() -> TableIterator<
    'static,
    (
        name!(queue, String),
        name!(domain, String),
        name!(next_value, Option<i64>),
        name!(cached_until, Option<i64>),
        name!(segment_size, i64),
        name!(refills, i64),
        name!(waits, i64),
    ),
> {
    postgres_errors_as_raised(|| {
        if !settings::preloaded() {
            TicketError::NotPreloaded("pgticket.ticket_cache").raise();
        }
        let db = my_database();
        let table = state_tables::tickets().oid.to_u32();
        let mut rows = Vec::new();
        // Slot by slot, each copied out under its spinlock; no directory
        // lock, so reading the view never holds up a backend placing a scope.
        for (i, slot) in shmem::slots().iter().enumerate() {
            if i % 4096 == 0 {
                pgrx::check_for_interrupts!(); // a million slots take a while
            }
            let copy = {
                let g = slot.lock();
                *g
            };
            if copy.in_use && copy.db == db && copy.table == table {
                let (queue, domain) = split(copy.key());
                // A role sees only the scopes it may use (SPEC §16).
                if crate::rights::check(RightKind::Scope, queue, domain, String::new).is_err() {
                    continue;
                }
                let (next, end) = copy.cache.next_and_end().unzip();
                rows.push((queue.display(), domain.display(), next, end, copy.step, copy.refills as i64, copy.waits as i64));
            }
        }
        TableIterator::new(rows)
    })
}

extension_sql!(
    r#"
CREATE VIEW pgticket.ticket_cache AS SELECT * FROM pgticket.ticket_cache_rows();
COMMENT ON VIEW pgticket.ticket_cache IS
    'Ticket scopes of this database cached in shared memory: next value, end of the cached range, segment size, refills, waits';
GRANT SELECT ON pgticket.ticket_cache TO PUBLIC;
REVOKE EXECUTE ON FUNCTION pgticket.advance_ticket(text, text, bigint) FROM PUBLIC;
-- 0.5.0
REVOKE EXECUTE ON FUNCTION pgticket.raise_ticket_floor(text, text, bigint) FROM PUBLIC;
COMMENT ON FUNCTION pgticket.raise_ticket_floor(text, text, bigint) IS
    'Admin: every later ticket of (queue, domain) is above floor (the mark raised if below, the cached ones dropped either way); returns the mark';
"#,
    name = "ticket_views",
    requires = [ticket_cache, advance_ticket, raise_ticket_floor, "schema"]
);
