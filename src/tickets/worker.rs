//! The ticket workers: one background worker per database (a worker can
//! connect to one database only), started by the first backend of that
//! database that needs a segment, and again by any backend that finds it
//! gone (they are not restarted by the postmaster: a crash restart empties
//! the cache anyway).
//!
//! A worker that has had nothing to do for `IDLE_EXIT` exits (a backend
//! starts it again when needed), so that `DROP DATABASE` is not blocked for
//! long by a connection the user did not open.
//!
//! A worker reserves segments in `pgticket.tickets` in its own transactions,
//! with `synchronous_commit = on` whatever the server's default: the commit
//! is flushed (and, with synchronous replication, on the standby) before
//! any value of the segment is handed out. A commit whose standby wait was
//! cancelled or terminated (PostgreSQL then commits locally with a
//! WARNING) installs nothing (SPEC §13.2). Then it installs the segment in
//! the slot — only if the slot still has the generation it read — and wakes
//! the waiters. It touches the slots only under their spinlocks and the
//! worker registry only under the directory lock (see `shmem`).
//!
//! Its statements run as the owner of `pgticket.tickets`, restricted (SPEC
//! §13.4), never as the bootstrap superuser it connects as. One scope never
//! holds up another (§13.5): rows are locked with SKIP LOCKED (a locked
//! scope is tried again at the next pass while a backend waits for it), and
//! `lock_timeout` (10 ms) bounds the one wait left, an uncommitted insert of the
//! same scope.

use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, SignalWakeFlags};
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::shmem::{self, monotonic_ms, Directory, Failure, KEY_MAX};
use super::split;
use crate::backend_local::BackendLocal;
use crate::errors::TicketError;
use crate::names::Name;
use crate::state_tables::{self, as_owner_of};
use crate::{settings, xact};
use ticket_core::tickets::{next_step, Segment, Series, TicketsError};

/// A worker asked for but not running after this long is taken for dead.
const START_GRACE_MS: u64 = 10_000;
/// An idle worker exits after this long.
const IDLE_EXIT: Duration = Duration::from_secs(10);
/// Segments that last less than this double the step; more than the slow
/// bound halve it.
const FAST_MS: u64 = 1_000;
const SLOW_MS: u64 = 30_000;

/// The longest a worker's statement waits for a lock: an insert of a
/// scope that another transaction inserted and has not committed (only
/// `pgticket.advance_ticket` inserts besides the worker). Short, because every
/// scope of the database waits behind it; the scope is then tried again
/// while someone waits for it.
const LOCK_TIMEOUT: &std::ffi::CStr = c"10ms";

/// Slot `slot` of database `db` asks for a segment: queue it for the
/// worker of `db`, make sure that runs, and wake it. `Ok(false)`: the
/// database waits in line for a worker, and nothing is queued (the slot
/// asks again).
pub fn request(db: u32, slot: usize) -> Result<bool, TicketError> {
    for w in &shmem::header().workers {
        if w.db.load(Ordering::Acquire) != db {
            continue;
        }
        w.push(slot);
        let latch = w.latch.load(Ordering::Acquire);
        if w.pid.load(Ordering::Acquire) != 0 && !latch.is_null() {
            unsafe { pg_sys::SetLatch(latch) };
            return Ok(true);
        }
        if monotonic_ms().saturating_sub(w.started_at_ms.load(Ordering::Acquire)) < START_GRACE_MS {
            return Ok(true); // starting; it serves what is queued when it is up
        }
    }
    start(db, slot)
}

/// A waiting database not asked for again within this long no longer waits.
const WAITING_FORGOTTEN_MS: u64 = 1_000;
/// A worker serves at least this long before it retires for a waiting
/// database: the bound on the wait is about this times the databases
/// ahead, divided among the workers.
pub const TENURE_MS: u64 = 500;

/// Which waiting database is first for a free worker slot (the longest
/// waiting, still asked for), if any; entries no longer asked for go.
fn waiting_order(now: u64) -> Option<u32> {
    let waiting = &shmem::header().waiting;
    let mut first: Option<(u64, u32)> = None;
    for w in waiting {
        let d = w.db.load(Ordering::Acquire);
        if d == 0 {
            continue;
        }
        if now.saturating_sub(w.asked_ms.load(Ordering::Acquire)) > WAITING_FORGOTTEN_MS {
            w.db.store(0, Ordering::Release);
            continue;
        }
        let since = w.since_ms.load(Ordering::Acquire);
        if first.is_none_or(|(s, _)| since < s) {
            first = Some((since, d));
        }
    }
    first.map(|(_, d)| d)
}

/// `db` waits for a worker: its entry refreshed, or made (the line full:
/// refused, never a wait without a bound).
fn wait_in_line(db: u32, now: u64) -> Result<(), TicketError> {
    let waiting = &shmem::header().waiting;
    if let Some(w) = waiting.iter().find(|w| w.db.load(Ordering::Acquire) == db) {
        w.asked_ms.store(now, Ordering::Release);
        return Ok(());
    }
    let Some(w) = waiting.iter().find(|w| w.db.load(Ordering::Acquire) == 0) else {
        return Err(TicketError::TicketsUnavailable(format!(
            "{} databases wait for a ticket worker already (pg_ticket.max_ticket_workers serve {} at once)",
            shmem::WAITING_MAX,
            settings::max_ticket_workers()
        )));
    };
    w.since_ms.store(now, Ordering::Release);
    w.asked_ms.store(now, Ordering::Release);
    w.db.store(db, Ordering::Release);
    // Wake the workers: the longest-serving one retires for it.
    for w in &shmem::header().workers {
        let latch = w.latch.load(Ordering::Acquire);
        if w.pid.load(Ordering::Acquire) != 0 && !latch.is_null() {
            unsafe { pg_sys::SetLatch(latch) };
        }
    }
    Ok(())
}

/// Is `db` waiting for a worker slot (for a backend's message)?
pub fn waits_in_line(db: u32) -> bool {
    shmem::header().waiting.iter().any(|w| w.db.load(Ordering::Acquire) == db)
}

fn leave_the_line(db: u32) {
    for w in &shmem::header().waiting {
        if w.db.load(Ordering::Acquire) == db {
            w.db.store(0, Ordering::Release);
        }
    }
}

/// Should the worker `me` retire now for a database that waits for a
/// worker slot: one waits, `me` has served at least `TENURE_MS`, and no
/// other worker has served longer.
fn retire_for_a_waiting_database(me: &shmem::WorkerSlot) -> bool {
    let now = monotonic_ms();
    let mine = me.started_at_ms.load(Ordering::Acquire);
    if now.saturating_sub(mine) < TENURE_MS {
        return false;
    }
    let someone_waits = shmem::header().waiting.iter().any(|w| {
        w.db.load(Ordering::Acquire) != 0 && now.saturating_sub(w.asked_ms.load(Ordering::Acquire)) <= WAITING_FORGOTTEN_MS
    });
    // The longest-serving: started first, or at the same ms and first in
    // the registry (two never retire for one waiting database).
    let workers = &shmem::header().workers;
    let my_index = workers.iter().position(|w| std::ptr::eq(w, me)).unwrap_or(0);
    someone_waits
        && workers.iter().enumerate().all(|(i, w)| {
            let theirs = w.started_at_ms.load(Ordering::Acquire);
            i == my_index
                || w.db.load(Ordering::Acquire) == 0
                || w.pid.load(Ordering::Acquire) == 0
                || theirs > mine
                || (theirs == mine && i > my_index)
        })
}

/// Start the worker of `db` for the request of `slot` (put in its queue:
/// a new worker serves its queue, it does not scan the cache; other slots
/// that asked before it started ask again while they wait). With every
/// worker slot taken, `db` waits in line (SPEC §13.11: 0.3.0 refused it
/// for as long as the other databases stayed busy): the longest-serving
/// worker retires for the database that waited longest.
fn start(db: u32, slot: usize) -> Result<bool, TicketError> {
    let _dir = Directory::lock(true);
    let workers = &shmem::header().workers;
    // Another backend may have started it, or a dead one be registered.
    let mut free = None;
    for w in workers {
        let registered = w.db.load(Ordering::Acquire);
        if registered == db {
            let alive = w.pid.load(Ordering::Acquire) != 0;
            if alive || monotonic_ms().saturating_sub(w.started_at_ms.load(Ordering::Acquire)) < START_GRACE_MS {
                return Ok(true);
            }
            w.db.store(0, Ordering::Release);
            free.get_or_insert(w);
        } else if registered == 0 {
            free.get_or_insert(w);
        }
    }
    let cap = settings::max_ticket_workers();
    let running = workers.iter().filter(|w| w.db.load(Ordering::Acquire) != 0).count();
    let now = monotonic_ms();
    let first_in_line = waiting_order(now);
    let Some(w) = free.filter(|_| running < cap && first_in_line.is_none_or(|first| first == db)) else {
        wait_in_line(db, now)?;
        return Ok(false); // its backends ask again while they wait
    };
    leave_the_line(db);
    w.pid.store(0, Ordering::Release);
    w.latch.store(std::ptr::null_mut(), Ordering::Release);
    // What the entry's queue holds is still asked for (an entry of another
    // database's: the worker skips those).
    w.push(slot);
    w.started_at_ms.store(monotonic_ms(), Ordering::Release);
    w.db.store(db, Ordering::Release);
    let launched = BackgroundWorkerBuilder::new(&format!("pg_ticket tickets for database {db}"))
        .set_type("pg_ticket tickets")
        .set_library("pg_ticket")
        .set_function("ticket_worker_main")
        .set_argument(Some(pg_sys::Datum::from(db)))
        .enable_spi_access()
        .set_restart_time(None)
        .load_dynamic();
    if launched.is_err() {
        w.db.store(0, Ordering::Release);
        return Err(TicketError::TicketsUnavailable(
            "cannot start the ticket worker of this database: no background worker slot is free; raise max_worker_processes".into(),
        ));
    }
    Ok(true)
}

/// Frees this worker's registry entry when it exits, however it exits
/// (under the directory lock, as every registry change; an exit while
/// holding it already keeps it).
#[pg_guard]
unsafe extern "C-unwind" fn release(_code: i32, db: pg_sys::Datum) {
    let db = db.value() as u32;
    let me = unsafe { pg_sys::MyProcPid };
    let _dir = Directory::lock_unless_held();
    for w in &shmem::header().workers {
        if w.db.load(Ordering::Acquire) == db && w.pid.load(Ordering::Acquire) == me {
            w.committing_since_ms.store(0, Ordering::Release);
            w.latch.store(std::ptr::null_mut(), Ordering::Release);
            w.pid.store(0, Ordering::Release);
            w.db.store(0, Ordering::Release);
        }
    }
}

extern "C-unwind" {
    /// PostgreSQL's own SIGTERM handler (pgrx's `pg_sys::die` is a Rust
    /// wrapper, not a signal handler).
    #[link_name = "die"]
    fn postgres_die(signal: std::ffi::c_int);
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn ticket_worker_main(arg: pg_sys::Datum) {
    let db = arg.value() as u32;
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP);
    // SIGTERM as a backend takes it (PostgreSQL's `die`): it also ends a
    // commit waiting for a synchronous standby that is gone, which a flag
    // checked between passes never reaches — a fast shutdown would wait
    // for it forever. The loop below exits through CHECK_FOR_INTERRUPTS.
    unsafe {
        #[cfg(not(feature = "pg18"))]
        pg_sys::pqsignal(libc::SIGTERM, Some(postgres_die));
        #[cfg(feature = "pg18")]
        pg_sys::pqsignal_be(libc::SIGTERM, Some(postgres_die));
    }
    let claimed = {
        let _dir = Directory::lock(true);
        let me = unsafe { pg_sys::MyProcPid };
        shmem::header().workers.iter().find(|w| w.db.load(Ordering::Acquire) == db && w.pid.load(Ordering::Acquire) == 0).inspect(|w| {
            w.latch.store(unsafe { pg_sys::MyLatch }, Ordering::Release);
            w.pid.store(me, Ordering::Release);
        })
    };
    let Some(me) = claimed else {
        return; // another worker serves this database
    };
    THIS_WORKER.set(Some(me));
    unsafe { pg_sys::on_shmem_exit(Some(release), pg_sys::Datum::from(db)) };
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(pg_sys::Oid::from(db)), None);
    for (name, value) in [(c"synchronous_commit", c"on"), (c"lock_timeout", LOCK_TIMEOUT)] {
        unsafe {
            pg_sys::SetConfigOption(name.as_ptr(), value.as_ptr(), pg_sys::GucContext::PGC_SUSET, pg_sys::GucSource::PGC_S_OVERRIDE);
        }
    }
    let mut last_work = std::time::Instant::now();
    loop {
        if retire_for_a_waiting_database(me) {
            // Its slot goes to the database that waited longest; this
            // database's backends ask again, and wait in line.
            unsafe { release(0, pg_sys::Datum::from(db)) };
            break;
        }
        if serve(db, me) {
            last_work = std::time::Instant::now();
        } else if last_work.elapsed() > IDLE_EXIT {
            // Leave the registry first, so a request from now on starts a
            // new worker; then serve what was asked just before.
            unsafe { release(0, pg_sys::Datum::from(db)) };
            serve(db, me);
            break;
        }
        if !BackgroundWorker::wait_latch(Some(Duration::from_millis(1000))) {
            break;
        }
        pgrx::check_for_interrupts!();
        if BackgroundWorker::sighup_received() {
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
    }
}

/// This worker's registry entry (in shared memory), once it claimed it.
static THIS_WORKER: BackendLocal<Option<&'static shmem::WorkerSlot>> = BackendLocal::new(None);

/// How long the worker of `db` has been waiting for its commit (for the
/// synchronous standbys), if it is and has been for a while.
pub fn commit_wait_ms(db: u32) -> Option<u64> {
    shmem::header().workers.iter().find(|w| w.db.load(Ordering::Acquire) == db).and_then(|w| {
        let since = w.committing_since_ms.load(Ordering::Acquire);
        let waited = monotonic_ms().saturating_sub(since);
        (since != 0 && waited >= 100).then_some(waited)
    })
}

/// A slot's request, copied out under its spinlock.
struct Wanted {
    slot: usize,
    generation: u64,
    table: u32,
    key_len: usize,
    key: [u8; KEY_MAX],
    step: i64,
    reserved_to: i64,
    /// Found locked at an earlier pass.
    busy: bool,
    /// The role a new row would count against.
    creator: crate::quota::Asker,
    /// The slot's ask count when the request was read.
    asks: u64,
}

/// What one scope's reservation came to.
#[derive(Clone, Copy)]
enum Reserved {
    Segment(Segment),
    Refused(Failure),
    /// Its row is locked by another transaction: tried again next pass.
    Busy,
}

/// One pass: reserve a segment for every slot of this database that asked
/// (those in the worker's queue, or every slot once the queue overflowed);
/// false if none asked.
fn serve(db: u32, me: &shmem::WorkerSlot) -> bool {
    let series = settings::ticket_series();
    let (min, max) = settings::ticket_step_bounds();
    let slots = shmem::slots();
    let (queued, overflow) = me.drain();
    let asked: Box<dyn Iterator<Item = usize>> = if overflow { Box::new(0..slots.len()) } else { Box::new(queued.into_iter()) };
    let mut wanted = Vec::new();
    for i in asked {
        let slot = &slots[i];
        let mut request =
            Wanted { slot: i, generation: 0, table: 0, key_len: 0, key: [0; KEY_MAX], step: 0, reserved_to: 0, busy: false, creator: crate::quota::Asker { role: pg_sys::Oid::INVALID, cap: 0, pending: 0 }, asks: 0 };
        {
            let mut g = slot.lock();
            if !(g.in_use && g.db == db && g.requested && g.failure.is_none()) {
                continue;
            }
            // A scope with nothing installed here that nobody waits for any
            // more (its callers were cancelled, #46 item 10: 0.4.0 made
            // thousands of scopes for calls under statement_timeout = 2ms,
            // and another role's refills queued behind them). A prefetch
            // of a scope in use has something installed.
            if g.reserved_to == 0 && g.waiters == 0 {
                g.requested = false;
                continue;
            }
            request.generation = slot.generation.load(Ordering::Acquire);
            request.table = g.table;
            request.key_len = g.key_len as usize;
            request.key = g.key;
            request.step = g.step;
            request.reserved_to = g.reserved_to;
            request.busy = g.busy;
            request.creator = crate::quota::Asker { role: pg_sys::Oid::from(g.creator), cap: g.creator_cap, pending: g.creator_pending };
            request.asks = g.asks;
        }
        wanted.push(request);
    }
    if wanted.is_empty() {
        return false;
    }
    // Scopes found locked before are tried alone, after the others are
    // installed and their waiters woken: a locked scope delays only itself.
    // They are tried for BUSY_PASS at most a pass; the rest stay asked for.
    let (busy, together): (Vec<Wanted>, Vec<Wanted>) = wanted.into_iter().partition(|w| w.busy);
    // Refills of scopes in use first, in a transaction of their own; then
    // at most FIRST_USES_PER_PASS new scopes, taken in turns by the role
    // that asked (#46 item 10: one role's flood of new names delayed every
    // other role's refills by its pass). The rest stay asked for, next pass.
    let (refills, first_uses): (Vec<Wanted>, Vec<Wanted>) = together.into_iter().partition(|w| w.reserved_to > 0);
    install(&refills, reserve_together(&refills, series), (min, max));
    // The turns start at another role each pass, so no role's first uses
    // wait behind the same others pass after pass.
    let pass = PASSES.get();
    PASSES.set(pass.wrapping_add(1));
    let (first_uses, later) = ticket_core::tickets::take_in_turns(first_uses, |w| w.creator.role.to_u32(), FIRST_USES_PER_PASS, pass);
    install(&first_uses, reserve_together(&first_uses, series), (min, max));
    if !later.is_empty() {
        for request in &later {
            me.push(request.slot);
        }
        unsafe { pg_sys::SetLatch(pg_sys::MyLatch) };
    }
    let started = std::time::Instant::now();
    for request in &busy {
        if started.elapsed() > BUSY_PASS {
            break;
        }
        install(std::slice::from_ref(request), vec![reserve_alone(request, series)], (min, max));
    }
    true
}

/// New scopes a pass makes at most (in one transaction).
const FIRST_USES_PER_PASS: usize = 128;
/// This worker's passes so far.
static PASSES: BackendLocal<usize> = BackendLocal::new(0);

/// How long one pass spends on scopes found locked before.
const BUSY_PASS: Duration = Duration::from_millis(50);

/// Put each reservation in its slot (if the slot still holds the scope it
/// was asked for) and wake the waiters.
fn install(requests: &[Wanted], results: Vec<Reserved>, (min, max): (i64, i64)) {
    let now = crate::clock::now_unix_ms();
    let mut held_back = None;
    for (request, reserved) in requests.iter().zip(results) {
        if let (Reserved::Segment(segment), true) = (reserved, settings::test_reorder_ticket_installs()) {
            // Test builds: install this segment after the next pass's, as a
            // second worker of the database can (#31 item 9).
            if let Some(earlier) = HELD_BACK.replace(None) {
                held_back = Some(earlier);
            } else {
                HELD_BACK.set(Some((request.slot, request.generation, request.asks, segment)));
                continue;
            }
        }
        install_one(request.slot, request.generation, request.asks, reserved, now, (min, max));
    }
    if let Some((slot, generation, asks, segment)) = held_back {
        install_one(slot, generation, asks, Reserved::Segment(segment), now, (min, max));
    }
    unsafe { pg_sys::ConditionVariableBroadcast(shmem::cv()) };
}

/// Test builds (`pg_ticket.test_reorder_ticket_installs`): a segment
/// held back to be installed after the next one.
static HELD_BACK: BackendLocal<Option<(usize, u64, u64, Segment)>> = BackendLocal::new(None);

/// One reservation into slot `index`, if it still holds the scope asked
/// for (at `generation`).
fn install_one(index: usize, generation: u64, asks: u64, reserved: Reserved, now: i64, (min, max): (i64, i64)) {
    {
        let slot = &shmem::slots()[index];
        let mut g = slot.lock();
        if slot.generation.load(Ordering::Acquire) != generation {
            return; // evicted or advanced meanwhile: the segment is a gap
        }
        // Answered either way; a busy scope is asked again by a backend
        // still waiting for it (so one nobody waits for does not keep the
        // worker busy).
        // An ask made while this one was reserved stays asked (it is in the
        // worker's queue again).
        if g.asks == asks {
            g.requested = false;
        }
        g.busy = matches!(reserved, Reserved::Busy);
        match reserved {
            // Tickets in real-time order whatever the number of workers: a
            // segment reserved before one installed here is a gap.
            Reserved::Segment(segment) if !segment.installs_after(g.reserved_to) => {}
            Reserved::Segment(segment) => {
                g.cache.add(segment);
                g.reserved_to = g.reserved_to.max(segment.last);
                if g.installed_at_ms != 0 {
                    g.step = next_step(g.step, (now - g.installed_at_ms).max(0) as u64, min, max, FAST_MS, SLOW_MS);
                }
                g.installed_at_ms = now;
                g.refills += 1;
            }
            Reserved::Refused(failure) => g.failure = Some(failure),
            Reserved::Busy => {}
        }
    }
}

fn key_args<'a>(queue: Name<'a>, domain: Name<'a>) -> Vec<DatumWithOid<'a>> {
    vec![queue.to_datum(), domain.to_datum()]
}

/// The scope's row as (mark, series it was created in).
fn row_of(row: pgrx::spi::SpiTupleTable<'_>) -> Result<Option<(i64, Series)>, pgrx::spi::Error> {
    if row.is_empty() {
        return Ok(None);
    }
    let (mark, offset, increment) = row.first().get_three::<i64, i32, i32>()?;
    Ok(Some((mark.unwrap_or(0), Series { offset: i64::from(offset.unwrap_or(1)), increment: i64::from(increment.unwrap_or(1)) })))
}

/// Lock the scope's row (creating it in this server's series, counted
/// against `creator` if given) and read (mark, offset, increment); None if
/// another transaction holds it locked; Err when `creator` has no room for
/// a new scope (`crate::quota`).
fn lock_row(
    client: &mut pgrx::spi::SpiClient<'_>,
    queue: Name<'_>,
    domain: Name<'_>,
    series: Series,
    skip_locked: bool,
    creator: Option<crate::quota::Asker>,
) -> Result<Result<Option<(i64, Series)>, TicketError>, pgrx::spi::Error> {
    const COLUMNS: &str = "mark, ticket_offset, ticket_increment";
    let skip = if skip_locked { " SKIP LOCKED" } else { "" };
    let select = format!(
        "SELECT {COLUMNS} FROM pgticket.tickets \
         WHERE queue OPERATOR(pg_catalog.=) $1 AND domain OPERATOR(pg_catalog.=) $2 FOR UPDATE{skip}"
    );
    if let Some(found) = row_of(client.update(&select, Some(1), &key_args(queue, domain))?)? {
        return Ok(Ok(Some(found)));
    }
    // Not there, or locked by another transaction. A committed row that is
    // locked must not meet an INSERT ... ON CONFLICT, which waits for a
    // transaction that updated it: only a scope nobody committed is
    // inserted (waiting, bounded by lock_timeout, only for another
    // transaction's uncommitted insert of it).
    if skip_locked {
        let exists = format!(
            "SELECT 1 FROM pgticket.tickets WHERE queue OPERATOR(pg_catalog.=) $1 AND domain OPERATOR(pg_catalog.=) $2"
        );
        if !client.update(&exists, Some(1), &key_args(queue, domain))?.is_empty() {
            return Ok(Ok(None));
        }
    }
    let rows = match creator.map(crate::quota::check_room_for) {
        Some(Err(e)) => return Ok(Err(e)),
        Some(Ok(rows)) => rows,
        None => 0,
    };
    let mut args = key_args(queue, domain);
    args.push((series.offset as i32).into());
    args.push((series.increment as i32).into());
    let inserted = client.update(
        &format!(
            "INSERT INTO pgticket.tickets (queue, domain, mark, ticket_offset, ticket_increment) VALUES ($1, $2, 0, $3, $4) \
             ON CONFLICT DO NOTHING RETURNING {COLUMNS}"
        ),
        None,
        &args,
    )?;
    match row_of(inserted)? {
        Some(found) => {
            if let Some(asker) = creator {
                crate::quota::count_now(asker, rows);
            }
            Ok(Ok(Some(found)))
        }
        None if skip_locked => Ok(Ok(None)),
        None => Ok(Ok(row_of(client.update(&select, Some(1), &key_args(queue, domain))?)?)),
    }
}

fn set_mark(client: &mut pgrx::spi::SpiClient<'_>, queue: Name<'_>, domain: Name<'_>, mark: i64) -> Result<(), pgrx::spi::Error> {
    let mut args = key_args(queue, domain);
    args.push(mark.into());
    client.update(
        "UPDATE pgticket.tickets SET mark = $3 WHERE queue OPERATOR(pg_catalog.=) $1 AND domain OPERATOR(pg_catalog.=) $2",
        None,
        &args,
    )?;
    Ok(())
}

/// The next segment of one scope, inside the caller's transaction: above
/// the row's mark and above everything the slot had before (a row deleted
/// or emptied behind the worker's back never leads to a value again).
fn reserve_in(client: &mut pgrx::spi::SpiClient<'_>, request: &Wanted, series: Series) -> Result<Reserved, pgrx::spi::Error> {
    let (queue, domain) = split(&request.key[..request.key_len]);
    let (mark, created) = match lock_row(client, queue, domain, series, true, Some(request.creator))? {
        Ok(Some(row)) => row,
        Ok(None) => return Ok(Reserved::Busy),
        Err(TicketError::TooManyScopes { created, cap, .. }) => {
            return Ok(Reserved::Refused(Failure::TooManyScopes { role: request.creator.role.to_u32(), created, cap }))
        }
        Err(e) => e.raise(),
    };
    if let Err(TicketsError::OtherSeries { .. }) = series.check_same(created) {
        return Ok(Reserved::Refused(Failure::OtherSeries { offset: created.offset, increment: created.increment }));
    }
    let above = mark.max(request.reserved_to);
    match series.segment_after(above, request.step) {
        Ok(segment) => {
            set_mark(client, queue, domain, segment.last)?;
            Ok(Reserved::Segment(segment))
        }
        Err(_) => Ok(Reserved::Refused(Failure::Overflow { mark: above })),
    }
}

/// Why a worker transaction gave nothing.
#[derive(Clone, Copy)]
enum NotDone {
    /// Rolled back (a warning in the log says why).
    Failed,
    /// Rolled back after `lock_timeout`: another transaction inserted the
    /// scope and has not committed.
    LockTimeout,
}

/// Runs `f` in a transaction of its own, as the owner of the tickets table,
/// and commits it (with `synchronous_commit = on`: flushed, and waited for
/// by the synchronous standbys if any). Returns what `f` returned and
/// whether the standbys confirmed the commit (`xact::commit_confirmed_by_standbys`;
/// a transaction that wrote nothing is committed without that wait, so
/// only one that reserved something may be judged by it).
fn in_transaction<T>(f: impl FnOnce(&mut pgrx::spi::SpiClient<'_>, u32) -> Result<T, pgrx::spi::Error>) -> Result<(T, bool), NotDone> {
    unsafe {
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    let outcome = PgTryBuilder::new(std::panic::AssertUnwindSafe(|| {
        let tickets = state_tables::tickets();
        as_owner_of(tickets, || Spi::connect_mut(|client| f(client, tickets.oid.to_u32()))).map_err(|e| {
            warning!("pg_ticket: reserving tickets failed: {e}");
            NotDone::Failed
        })
    }))
    .catch_others(|e| {
        let (CaughtError::PostgresError(report) | CaughtError::ErrorReport(report) | CaughtError::RustPanic { ereport: report, .. }) = &e;
        if report.sql_error_code() == PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE {
            return Err(NotDone::LockTimeout);
        }
        warning!("pg_ticket: reserving tickets failed: {}", report.message());
        Err(NotDone::Failed)
    })
    .execute();
    unsafe {
        if outcome.is_ok() {
            pg_sys::PopActiveSnapshot();
            let committing = THIS_WORKER.get();
            if let Some(me) = committing {
                me.committing_since_ms.store(monotonic_ms().max(1), Ordering::Release);
            }
            pg_sys::CommitTransactionCommand();
            if let Some(me) = committing {
                me.committing_since_ms.store(0, Ordering::Release);
            }
        } else {
            pg_sys::AbortCurrentTransaction();
        }
    }
    Ok((outcome?, xact::commit_confirmed_by_standbys()))
}

/// Segments of a commit the standbys did not confirm are handed out never.
fn unless_unconfirmed(reserved: Reserved, confirmed: bool) -> Reserved {
    match reserved {
        Reserved::Segment(_) if !confirmed => Reserved::Refused(Failure::NotReplicated),
        other => other,
    }
}

/// The next segment of one scope, in a transaction of its own; a slot of a
/// tickets table that is no more (the extension dropped and created again)
/// is served nothing: its backends look up the new table's scope.
fn reserve_one(client: &mut pgrx::spi::SpiClient<'_>, table: u32, request: &Wanted, series: Series) -> Result<Reserved, pgrx::spi::Error> {
    if request.table != table {
        return Ok(Reserved::Refused(Failure::Unavailable));
    }
    reserve_in(client, request, series)
}

fn reserve_alone(request: &Wanted, series: Series) -> Reserved {
    let outcome = in_transaction(|client, table| reserve_one(client, table, request, series));
    match outcome {
        Ok((reserved, confirmed)) => unless_unconfirmed(reserved, confirmed),
        Err(NotDone::LockTimeout) => Reserved::Busy,
        Err(NotDone::Failed) => Reserved::Refused(Failure::Unavailable),
    }
}

/// Reserve the next segment of every requested scope in one transaction —
/// one commit flush for the lot, so a burst of first uses does not queue
/// behind one flush each. If that transaction fails, each scope is tried
/// in a transaction of its own, so one bad scope fails only itself.
fn reserve_together(requests: &[Wanted], series: Series) -> Vec<Reserved> {
    if requests.is_empty() {
        return Vec::new();
    }
    let shared = in_transaction(|client, table| {
        requests.iter().map(|request| reserve_one(client, table, request, series)).collect::<Result<Vec<_>, _>>()
    });
    match shared {
        Ok((results, confirmed)) => results.into_iter().map(|r| unless_unconfirmed(r, confirmed)).collect(),
        Err(_) => requests.iter().map(|request| reserve_alone(request, series)).collect(),
    }
}

/// How `advance_in_table` moves a scope's mark.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// To the value given, never back (`pgticket.advance_ticket`).
    Advance,
    /// Above a value given explicitly, which must be above the mark (the
    /// mark itself was handed out).
    Claim,
    /// To at least the value given: where the mark is above it already,
    /// nothing (`pgticket.raise_ticket_floor`, a conversion).
    AtLeast,
}

/// A scope's mark moved in the caller's transaction, the row locked,
/// never back, never below `floor` either, what the cache has reserved of
/// the scope (a row deleted behind our back says less). Returns the mark.
pub fn advance_in_table(queue: Name<'_>, domain: Name<'_>, to: i64, floor: i64, how: Move) -> Result<i64, TicketError> {
    let series = settings::ticket_series();
    // An administrator's call is counted against no one; a number given to
    // a trigger makes the scope for the role that gave it (SPEC §20, #46
    // item 2: 0.4.0 made 5 002 scopes of one INSERT past a cap of 2).
    let creator = (how == Move::Claim).then(crate::quota::this_session);
    as_owner_of(state_tables::tickets(), || Spi::connect_mut(|client| -> Result<Result<i64, TicketError>, pgrx::spi::Error> {
        let found = match lock_row(client, queue, domain, series, false, creator)? {
            Err(refused) => return Ok(Err(refused.about(crate::names::label("ticket scope", queue, Some(domain))))),
            Ok(found) => found,
        };
        let Some((mark, _)) = found else {
            return Ok(Err(TicketError::TicketsUnavailable(format!(
                "the row of ({}, {}) in pgticket.tickets could not be created (a trigger on the table?)",
                queue.quoted(),
                domain.quoted()
            ))));
        };
        let mark = mark.max(floor);
        match how {
            Move::Claim if to <= mark => {
                return Ok(Err(ticket_core::counter::CounterError::AtOrBelowMark { what: "ticket scope", value: to, mark }.into()));
            }
            Move::Advance if to < mark => {
                return Ok(Err(ticket_core::counter::CounterError::MarkBackwards { what: "ticket scope", current: mark, requested: to }.into()));
            }
            Move::AtLeast if to <= mark => return Ok(Ok(mark)),
            _ => {}
        }
        set_mark(client, queue, domain, to)?;
        Ok(Ok(to))
    }))
    .unwrap_or_else(|e| pgrx::error!("pg_ticket: {e}"))
}
