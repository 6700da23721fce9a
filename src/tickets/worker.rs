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
//! any value of the segment is handed out. Then it installs the segment in
//! the slot — only if the slot still has the generation it read — and wakes
//! the waiters. It touches the slots only under their spinlocks and the
//! worker registry only under the directory lock (see `shmem`).

use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, SignalWakeFlags};
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::shmem::{self, Directory, Failure};
use super::split;
use crate::errors::TicketError;
use crate::names::Name;
use crate::settings;
use ticket_core::tickets::{next_step, Segment, Series, TicketsError};

/// A worker asked for but not running after this long is taken for dead.
const START_GRACE_MS: u64 = 10_000;
/// An idle worker exits after this long.
const IDLE_EXIT: Duration = Duration::from_secs(10);
/// Segments that last less than this double the step; more than the slow
/// bound halve it.
const FAST_MS: u64 = 1_000;
const SLOW_MS: u64 = 30_000;

fn now_ms() -> u64 {
    crate::snowflake::now_unix_ms().max(0) as u64
}

/// Make sure the worker of `db` runs, and wake it.
pub fn wake(db: u32) -> Result<(), TicketError> {
    for w in &shmem::header().workers {
        if w.db.load(Ordering::Acquire) != db {
            continue;
        }
        let latch = w.latch.load(Ordering::Acquire);
        if w.pid.load(Ordering::Acquire) != 0 && !latch.is_null() {
            unsafe { pg_sys::SetLatch(latch) };
            return Ok(());
        }
        if now_ms().saturating_sub(w.started_at_ms.load(Ordering::Acquire)) < START_GRACE_MS {
            return Ok(()); // starting; it serves what is requested when it is up
        }
    }
    start(db)
}

fn start(db: u32) -> Result<(), TicketError> {
    let _dir = Directory::lock(true);
    let workers = &shmem::header().workers;
    // Another backend may have started it, or a dead one be registered.
    let mut free = None;
    for w in workers {
        let registered = w.db.load(Ordering::Acquire);
        if registered == db {
            let alive = w.pid.load(Ordering::Acquire) != 0;
            if alive || now_ms().saturating_sub(w.started_at_ms.load(Ordering::Acquire)) < START_GRACE_MS {
                return Ok(());
            }
            w.db.store(0, Ordering::Release);
            free.get_or_insert(w);
        } else if registered == 0 {
            free.get_or_insert(w);
        }
    }
    let Some(w) = free else {
        return Err(TicketError::TicketsUnavailable(format!(
            "ticket workers serve at most {} databases at once, and that many are running",
            shmem::MAX_WORKERS
        )));
    };
    w.pid.store(0, Ordering::Release);
    w.latch.store(std::ptr::null_mut(), Ordering::Release);
    w.started_at_ms.store(now_ms(), Ordering::Release);
    w.db.store(db, Ordering::Release);
    let launched = BackgroundWorkerBuilder::new(&format!("pg_ticket tickets for database {db}"))
        .set_type("pg_ticket tickets")
        .set_library("pg_ticket")
        .set_function("ticket_worker_main")
        .set_argument(Some(pg_sys::Datum::from(db)))
        .enable_spi_access()
        .set_restart_time(None)
        .load_dynamic();
    if let Err(e) = launched {
        w.db.store(0, Ordering::Release);
        return Err(TicketError::TicketsUnavailable(format!(
            "cannot start the ticket worker of this database ({e:?}); raise max_worker_processes"
        )));
    }
    Ok(())
}

/// Frees this worker's registry entry when it exits, however it exits.
#[pg_guard]
unsafe extern "C-unwind" fn release(_code: i32, db: pg_sys::Datum) {
    let db = db.value() as u32;
    let me = unsafe { pg_sys::MyProcPid };
    for w in &shmem::header().workers {
        if w.db.load(Ordering::Acquire) == db && w.pid.load(Ordering::Acquire) == me {
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
        shmem::header().workers.iter().find(|w| w.db.load(Ordering::Acquire) == db && w.pid.load(Ordering::Acquire) == 0).map(|w| {
            w.latch.store(unsafe { pg_sys::MyLatch }, Ordering::Release);
            w.pid.store(me, Ordering::Release);
        })
    };
    if claimed.is_none() {
        return; // another worker serves this database
    }
    unsafe { pg_sys::on_shmem_exit(Some(release), pg_sys::Datum::from(db)) };
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(pg_sys::Oid::from(db)), None);
    unsafe {
        pg_sys::SetConfigOption(
            c"synchronous_commit".as_ptr(),
            c"on".as_ptr(),
            pg_sys::GucContext::PGC_SUSET,
            pg_sys::GucSource::PGC_S_OVERRIDE,
        );
    }
    let mut last_work = std::time::Instant::now();
    loop {
        if serve(db) {
            last_work = std::time::Instant::now();
        } else if last_work.elapsed() > IDLE_EXIT {
            // Leave the registry first, so a request from now on starts a
            // new worker; then serve what was asked just before.
            unsafe { release(0, pg_sys::Datum::from(db)) };
            serve(db);
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

/// One pass: reserve a segment for every slot of this database that asked;
/// false if none asked.
fn serve(db: u32) -> bool {
    let series = settings::ticket_series();
    let (min, max) = settings::ticket_step_bounds();
    let wanted: Vec<(usize, u64, Vec<u8>, i64)> = shmem::slots()
        .iter()
        .enumerate()
        .filter_map(|(i, slot)| {
            let g = slot.lock();
            (g.in_use && g.db == db && g.requested && g.failure.is_none())
                .then(|| (i, slot.generation.load(Ordering::Acquire), g.key().to_vec(), g.step))
        })
        .collect();
    if wanted.is_empty() {
        return false;
    }
    let requests: Vec<(Name<'_>, Name<'_>, i64)> = wanted
        .iter()
        .map(|(_, _, key, step)| {
            let (queue, domain) = split(key);
            (queue, domain, *step)
        })
        .collect();
    let results = reserve_all(&requests, series);
    for ((i, generation, _, _), reserved) in wanted.iter().zip(results) {
        let (i, generation) = (*i, *generation);
        let slot = &shmem::slots()[i];
        let mut g = slot.lock();
        if slot.generation.load(Ordering::Acquire) != generation {
            continue; // evicted or advanced meanwhile: the segment is a gap
        }
        match reserved {
            Ok(segment) => {
                g.cache.add(segment);
                let now = now_ms() as i64;
                if g.installed_at_ms != 0 {
                    g.step = next_step(g.step, (now - g.installed_at_ms).max(0) as u64, min, max, FAST_MS, SLOW_MS);
                }
                g.installed_at_ms = now;
                g.refills += 1;
            }
            Err(failure) => g.failure = Some(failure),
        }
        g.requested = false;
    }
    unsafe { pg_sys::ConditionVariableBroadcast(shmem::cv()) };
    true
}

fn key_args<'a>(queue: Name<'a>, domain: Name<'a>) -> Vec<DatumWithOid<'a>> {
    vec![queue.to_datum(), domain.to_datum()]
}

/// Lock the scope's row (creating it in this server's series) and read
/// (mark, offset, increment).
fn lock_row(client: &mut pgrx::spi::SpiClient<'_>, queue: Name<'_>, domain: Name<'_>, series: Series) -> Result<(i64, Series), pgrx::spi::Error> {
    let mut args = key_args(queue, domain);
    args.push((series.offset as i32).into());
    args.push((series.increment as i32).into());
    client.update(
        "INSERT INTO pgticket.tickets (queue, domain, mark, ticket_offset, ticket_increment) VALUES ($1, $2, 0, $3, $4) \
         ON CONFLICT DO NOTHING",
        None,
        &args,
    )?;
    let row = client
        .update(
            "SELECT mark, ticket_offset, ticket_increment FROM pgticket.tickets \
             WHERE queue OPERATOR(pg_catalog.=) $1 AND domain OPERATOR(pg_catalog.=) $2 FOR UPDATE",
            Some(1),
            &key_args(queue, domain),
        )?
        .first()
        .get_three::<i64, i32, i32>()?;
    let (mark, offset, increment) = (row.0.unwrap_or(0), row.1.unwrap_or(1), row.2.unwrap_or(1));
    Ok((mark, Series { offset: i64::from(offset), increment: i64::from(increment) }))
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

/// The next segment of one scope, inside the caller's transaction.
fn reserve_in(
    client: &mut pgrx::spi::SpiClient<'_>,
    queue: Name<'_>,
    domain: Name<'_>,
    size: i64,
    series: Series,
) -> Result<Result<Segment, Failure>, pgrx::spi::Error> {
    let (mark, created) = lock_row(client, queue, domain, series)?;
    if let Err(TicketsError::OtherSeries { .. }) = series.check_same(created) {
        return Ok(Err(Failure::OtherSeries { offset: created.offset, increment: created.increment }));
    }
    match series.segment_after(mark, size) {
        Ok(segment) => {
            set_mark(client, queue, domain, segment.last)?;
            Ok(Ok(segment))
        }
        Err(_) => Ok(Err(Failure::Overflow { mark })),
    }
}

/// Runs `f` in a transaction of its own, committed (and, with
/// `synchronous_commit = on`, flushed) when it succeeds; rolled back with a
/// warning in the log, and None, when it fails.
fn in_transaction<T>(f: impl FnOnce(&mut pgrx::spi::SpiClient<'_>) -> Result<T, pgrx::spi::Error>) -> Option<T> {
    unsafe {
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    let outcome = PgTryBuilder::new(std::panic::AssertUnwindSafe(|| {
        Spi::connect_mut(f).map_err(|e| warning!("pg_ticket: reserving tickets failed: {e}")).ok()
    }))
    .catch_others(|e| {
        let (CaughtError::PostgresError(report) | CaughtError::ErrorReport(report) | CaughtError::RustPanic { ereport: report, .. }) = &e;
        warning!("pg_ticket: reserving tickets failed: {}", report.message());
        None
    })
    .execute();
    unsafe {
        if outcome.is_some() {
            pg_sys::PopActiveSnapshot();
            pg_sys::CommitTransactionCommand();
        } else {
            pg_sys::AbortCurrentTransaction();
        }
    }
    outcome
}

/// Reserve the next segment of every requested scope in one transaction —
/// one commit flush for the lot, so a burst of first uses does not queue
/// behind one flush each. If that transaction fails, each scope is tried
/// in a transaction of its own, so one bad scope fails only itself.
fn reserve_all(requests: &[(Name<'_>, Name<'_>, i64)], series: Series) -> Vec<Result<Segment, Failure>> {
    let all = |client: &mut pgrx::spi::SpiClient<'_>| {
        requests.iter().map(|&(queue, domain, size)| reserve_in(client, queue, domain, size, series)).collect()
    };
    if let Some(results) = in_transaction(all) {
        return results;
    }
    requests
        .iter()
        .map(|&(queue, domain, size)| {
            in_transaction(|client| reserve_in(client, queue, domain, size, series)).unwrap_or(Err(Failure::Unavailable))
        })
        .collect()
}

/// `advance_ticket` in the caller's transaction: the row locked and moved
/// forward, never back.
pub fn advance_in_table(queue: Name<'_>, domain: Name<'_>, to: i64) -> Result<(), TicketError> {
    let series = settings::ticket_series();
    crate::counters::as_table_owner(|| Spi::connect_mut(|client| -> Result<Result<(), TicketError>, pgrx::spi::Error> {
        let (mark, _) = lock_row(client, queue, domain, series)?;
        if to < mark {
            return Ok(Err(ticket_core::counter::CounterError::MarkBackwards { what: "ticket scope", current: mark, requested: to }.into()));
        }
        set_mark(client, queue, domain, to)?;
        Ok(Ok(()))
    }))
    .unwrap_or_else(|e| pgrx::error!("pg_ticket: {e}"))
}
