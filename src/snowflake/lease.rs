//! A server that leases its own machine id (`pg_ticket.machine_id = -1`,
//! SPEC §10): a background worker holds a lease from `pg_ticket.registry`
//! with the same protocol code as the application client
//! (`ticket_client::keeper`), and `snowflake_id()` stamps with the leased id
//! only while the lease is valid by the worker's conservative reckoning.
//!
//! The worker starts when the server starts accepting writes — at startup,
//! after crash recovery, and at promotion — and its shared memory starts
//! empty, so a server never carries a lease across a start: a restarted
//! server, a promoted standby, a restored base backup and a copied data
//! directory all lease anew, and a live lease is never used twice.
//!
//! Locking rule: the lease is published in shared memory under a sequence
//! counter (a seqlock): the worker, its only writer, makes the counter odd,
//! writes, and makes it even; a backend reads until it sees the same even
//! counter before and after. Nobody waits on anyone. A backend checks the
//! lease, stamps, and checks again: an ID stamped while the lease changed or
//! ran out is discarded, so every ID is stamped inside a lease's reckoned
//! life with that lease's id. Before publishing a new lease the worker
//! raises the generator's floor to its `not_before_ms`.

use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgAtomic};
use std::cell::{Cell, RefCell};
use std::sync::atomic::{fence, AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;
use ticket_client::clock::{boot_ms, CheckedWall, ClockReading};
use ticket_client::keeper::{LeaseHolder, LeaseKeeper, Published};
use ticket_core::leases::{Reckoning, StampRefusal};
use ticket_core::snowflake::SnowflakeError;

use super::SystemClock;
use crate::backend_local::BackendLocal;
use crate::errors::TicketError;
use crate::settings;

#[derive(Default)]
pub struct LeaseSlot {
    /// Odd while the worker writes.
    seq: AtomicU64,
    /// The id of the current lease, or of the last one (none yet while
    /// `token` is 0: tokens start at 1).
    machine_id: AtomicI64,
    held: AtomicBool,
    token: AtomicI64,
    /// The holder's reckoning (`ticket_core::leases::Reckoning`): boot-clock
    /// ms the request was sent and its ttl, the clocks at the reply, the
    /// last stamp allowed, and the drift allowed between the clocks.
    sent_at_boot_ms: AtomicI64,
    ttl_ms: AtomicI64,
    replied_boot_ms: AtomicI64,
    replied_wall_ms: AtomicI64,
    stamp_cap_ms: AtomicI64,
    drift_allowed_ms: AtomicI64,
    /// The registry's expiry as last heard (Unix ms), for the status view.
    expires_at_unix_ms: AtomicI64,
    /// This server's clock minus the registry's while they disagree by
    /// more than half the margin (never 0 then); 0 while they agree.
    clock_skew_ms: AtomicI64,
    space_differs: AtomicBool,
}

unsafe impl PGRXSharedMemory for LeaseSlot {}

static SLOT: PgAtomic<LeaseSlot> = unsafe { PgAtomic::new(c"pg_ticket_machine_lease") };

pub fn init_shared_memory() {
    pg_shmem_init!(SLOT);
}

/// What a backend reads of the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    /// The id of the lease held now.
    pub machine_id: Option<u16>,
    last_machine_id: Option<u16>,
    pub token: i64,
    pub reckoning: Reckoning,
    pub expires_at_unix_ms: i64,
    skewed: Option<i64>,
    space_differs: bool,
    /// The slot's sequence counter when read: the same while the worker
    /// has written nothing since.
    seq: u64,
}

/// The lease as `snapshot` reads it, this backend's last reading reused
/// while the worker has written nothing since (its counter unchanged: a
/// write moves it before it touches anything): one load instead of a dozen
/// for every stamp.
fn current() -> Snapshot {
    static LAST: BackendLocal<Option<Snapshot>> = BackendLocal::new(None);
    let seq = SLOT.get().seq.load(Ordering::Acquire);
    if let Some(last) = LAST.get().filter(|last| last.seq == seq) {
        return last;
    }
    let now = snapshot();
    LAST.set(Some(now));
    now
}

pub fn snapshot() -> Snapshot {
    let s = SLOT.get();
    loop {
        let before = s.seq.load(Ordering::Acquire);
        if before % 2 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let id = u16::try_from(s.machine_id.load(Ordering::Relaxed)).ok().filter(|_| s.token.load(Ordering::Relaxed) != 0);
        let snap = Snapshot {
            machine_id: id.filter(|_| s.held.load(Ordering::Relaxed)),
            last_machine_id: id,
            token: s.token.load(Ordering::Relaxed),
            reckoning: Reckoning {
                sent_at_ms: s.sent_at_boot_ms.load(Ordering::Relaxed),
                ttl_ms: s.ttl_ms.load(Ordering::Relaxed),
                replied_boot_ms: s.replied_boot_ms.load(Ordering::Relaxed),
                replied_wall_ms: s.replied_wall_ms.load(Ordering::Relaxed),
                stamp_cap_ms: s.stamp_cap_ms.load(Ordering::Relaxed),
                drift_allowed_ms: s.drift_allowed_ms.load(Ordering::Relaxed),
            },
            expires_at_unix_ms: s.expires_at_unix_ms.load(Ordering::Relaxed),
            skewed: Some(s.clock_skew_ms.load(Ordering::Relaxed)).filter(|&skew| skew != 0),
            space_differs: s.space_differs.load(Ordering::Relaxed),
            seq: before,
        };
        fence(Ordering::Acquire);
        if s.seq.load(Ordering::Relaxed) == before {
            return snap;
        }
    }
}

/// Has the worker written nothing since `snapshot` was read? (Every write
/// moves the counter, which only grows.)
fn unchanged_since(snapshot: &Snapshot) -> bool {
    // After the stamp's compare-and-swap, both sequentially consistent: see
    // `WorkerHolder::withdraw`.
    SLOT.get().seq.load(Ordering::SeqCst) == snapshot.seq
}

fn write(f: impl FnOnce(&LeaseSlot)) {
    let s = SLOT.get();
    s.seq.fetch_add(1, Ordering::AcqRel);
    fence(Ordering::Release);
    f(s);
    s.seq.fetch_add(1, Ordering::Release);
}

impl Snapshot {
    /// The id held, if this server may stamp with it at all (the clocks
    /// aside).
    fn holding(&self) -> Result<u16, TicketError> {
        let refuse = |why: String| Err(TicketError::NoMachineLease(why));
        let Some(id) = self.machine_id else {
            return refuse(match self.last_machine_id {
                None => "no machine-id lease is held yet (pg_ticket.machine_id = -1)".into(),
                Some(last) => format!("the lease of machine id {last} ended (not renewed in time, or refused); waiting for a new one"),
            });
        };
        if self.space_differs {
            return refuse(format!(
                "the registry's ID space differs from this server's pg_ticket.epoch and pg_ticket.machine_bits ({}; machine id {id} leased, unused)",
                super::id_space()
            ));
        }
        if let Some(skew) = self.skewed {
            return refuse(format!("this server's clock differs from the registry's by {skew} ms, more than half pg_ticket.lease_margin"));
        }
        Ok(id)
    }

    /// A reading of the clocks checked for a stamp with machine id `id`
    /// (`ClockReading::checked`), with this backend's last boot reading.
    fn checked_reading(&self, id: u16) -> Result<ClockReading, TicketError> {
        let reading = ClockReading::checked(&self.reckoning, LAST_BOOT_MS.get()).map_err(|refusal| Self::refused(id, refusal))?;
        LAST_BOOT_MS.set(Some(reading.boot_after_ms));
        Ok(reading)
    }

    fn refused(id: u16, refusal: StampRefusal) -> TicketError {
        TicketError::NoMachineLease(match refusal {
            StampRefusal::MayHaveEnded => format!("the lease of machine id {id} may have ended (no renewal from the registry in time)"),
            StampRefusal::ClockStepped { drift_ms } => format!(
                "this server's wall clock moved {drift_ms} ms against its boot clock since the registry's last reply, more than half pg_ticket.lease_margin; waiting for the next renewal"
            ),
        })
    }
}

/// This backend's last boot-clock reading for a stamp.
static LAST_BOOT_MS: BackendLocal<Option<i64>> = BackendLocal::new(None);

/// Stamp with the leased id: `issue(clock, machine_id, stamp cap)` runs
/// between two reads of the lease, and its ID is discarded if the lease
/// changed or ended meanwhile (the worker withdraws before it reads the
/// last stamp to report; unless the lease's counter did not move, the lease
/// is read again). The stamp is one wall-clock reading between two
/// boot-clock readings (the first may be this backend's last one:
/// `ClockReading::checked`), checked against the lease before it enters the
/// generator's state (a stepped clock's stamp would hold later IDs back),
/// or, after a wait inside the generator, a later reading checked after.
/// A renewal meanwhile never moves the lease's end earlier (SPEC §8 rule
/// 9), so the first read's reckoning holds for the whole call. The
/// generator itself refuses a timestamp past the cap (the sequence can run
/// ahead of the clock), so the stamp is not checked against it again here.
///
/// The checked reading is taken before the generator reads its state, so
/// another backend's issue can overtake it; overtaken by more than the
/// generator's backward wait (a preemption), it looks like the clock went
/// back: read once more before calling it so.
pub fn next_id(
    issue: impl Fn(&CheckedWall<'_, SystemClock>, u16, i64) -> Result<i64, SnowflakeError>,
) -> Result<i64, TicketError> {
    let before = current();
    let id = before.holding()?;
    let mut attempts = 0;
    let issued = loop {
        attempts += 1;
        let first = before.checked_reading(id)?;
        // Later readings (after a wait) are checked before they are stamped
        // (#46 item 11: 0.4.0 checked them after, and a clock stepped
        // forward during a wait entered the generator, holding every
        // snowflake back for the step's length).
        let clock = CheckedWall::starting_with(&SystemClock, first, before.reckoning);
        let issued = issue(&clock, id, before.reckoning.stamp_cap_ms);
        if let Some(refusal) = clock.refusal() {
            return Err(Snapshot::refused(id, refusal));
        }
        match issued {
            Err(SnowflakeError::ClockBehind { .. }) if attempts == 1 => continue,
            other => break other?,
        }
    };
    if unchanged_since(&before) {
        return Ok(issued);
    }
    let after = snapshot();
    if after.token != before.token || after.machine_id != before.machine_id {
        return Err(TicketError::NoMachineLease("the machine-id lease changed while stamping; call again".into()));
    }
    after.holding()?;
    Ok(issued)
}

pub fn register_worker() {
    BackgroundWorkerBuilder::new("pg_ticket machine-id lease")
        .set_type("pg_ticket machine-id lease")
        .set_library("pg_ticket")
        .set_function("pg_ticket_lease_worker_main")
        // Attached to no database (as the logical replication launcher
        // is): it shows in pg_stat_activity, and pg_terminate_backend ends it.
        .enable_spi_access()
        // Only a server that accepts writes needs (and may hold) a lease: a
        // standby gets its worker at promotion.
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(Some(Duration::from_secs(1)))
        .load();
}

struct WorkerHolder {
    current: RefCell<Option<Published>>,
    stop: Cell<bool>,
    last_report: RefCell<String>,
}

impl LeaseHolder for WorkerHolder {
    fn dsn(&self) -> String {
        settings::registry()
    }

    fn publish(&self, lease: Published) {
        let g = lease.grant;
        let new_lease = self.current.borrow().is_none_or(|p| p.grant.lease != g.lease);
        let space_differs = g.space() != super::id_space();
        if new_lease {
            super::raise_floor(g.not_before_ms);
            log!(
                "pg_ticket: leased machine id {} (lease {}) until {} (registry clock), stamping above {} ms",
                g.machine_id,
                g.lease,
                g.expires_at_ms,
                g.not_before_ms
            );
            if space_differs {
                warning!("pg_ticket: the registry leases in {}, this server stamps in {}; snowflake_id() refuses", g.space(), super::id_space());
            }
        }
        write(|s| {
            s.machine_id.store(i64::from(g.machine_id), Ordering::Relaxed);
            s.held.store(true, Ordering::Relaxed);
            s.token.store(g.lease, Ordering::Relaxed);
            let r = lease.reckoning;
            s.sent_at_boot_ms.store(r.sent_at_ms, Ordering::Relaxed);
            s.ttl_ms.store(r.ttl_ms, Ordering::Relaxed);
            s.replied_boot_ms.store(r.replied_boot_ms, Ordering::Relaxed);
            s.replied_wall_ms.store(r.replied_wall_ms, Ordering::Relaxed);
            s.stamp_cap_ms.store(r.stamp_cap_ms, Ordering::Relaxed);
            s.drift_allowed_ms.store(r.drift_allowed_ms, Ordering::Relaxed);
            s.expires_at_unix_ms.store(g.expires_at_ms, Ordering::Relaxed);
            s.clock_skew_ms.store(lease.skew.map_or(0, |(skew, _)| skew), Ordering::Relaxed);
            s.space_differs.store(space_differs, Ordering::Relaxed);
        });
        *self.current.borrow_mut() = Some(lease);
        self.last_report.borrow_mut().clear();
    }

    fn withdraw(&self) {
        if let Some(p) = self.current.borrow_mut().take() {
            log!("pg_ticket: the lease of machine id {} (lease {}) is over", p.grant.machine_id, p.grant.lease);
        }
        write(|s| {
            s.held.store(false, Ordering::Relaxed);
            s.ttl_ms.store(0, Ordering::Relaxed);
            s.stamp_cap_ms.store(i64::MIN, Ordering::Relaxed);
        });
        // Pairs with a stamp's sequentially consistent compare-and-swap
        // and its read of the counter (`unchanged_since`): whichever comes
        // first in their single order, either the keeper's next read of
        // the generator's last stamp sees the stamp (the swap came before
        // this fence), or the backend's read sees this write (the fence
        // came before that read) and the backend drops its ID. Acquire and
        // release alone allow both to miss (a store then a load of another
        // location, on each side).
        fence(Ordering::SeqCst);
    }

    fn report(&self, error: &str) {
        // Once per distinct error, not once per retry.
        if *self.last_report.borrow() != error {
            warning!("pg_ticket: the machine-id registry (pg_ticket.registry): {error}");
            *self.last_report.borrow_mut() = error.to_string();
        }
    }

    fn current(&self) -> Option<Published> {
        *self.current.borrow()
    }

    /// Only a stamp this server issued: the generator's state also holds
    /// the lease's floor (`not_before_ms`), which a report must not give as
    /// a stamp (#31 item 6: it made the registry refuse every renewal).
    fn last_stamp_ms(&self) -> Option<i64> {
        let floor = self.current().map_or(i64::MIN, |p| p.grant.not_before_ms);
        super::last_stamp_unix_ms().filter(|stamp| *stamp > floor)
    }

    fn pause_until(&self, until_boot_ms: i64) -> bool {
        let left = until_boot_ms - boot_ms();
        if left > 0 && !self.stop.get() && !BackgroundWorker::wait_latch(Some(Duration::from_millis(left as u64))) {
            self.stop.set(true);
        }
        if BackgroundWorker::sighup_received() {
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        self.stop.get()
    }

    /// `pg_ticket.machine_lease_ttl` as reloaded: used from the next call.
    fn ttl_ms(&self) -> Option<i64> {
        Some(settings::machine_lease_ttl_ms())
    }

    /// A session to its own server (a self-registry) would hold up a smart
    /// shutdown; one connection per renewal costs nothing that matters.
    fn keep_connection(&self) -> bool {
        false
    }

    fn stopping(&self) -> bool {
        if BackgroundWorker::sigterm_received() {
            self.stop.set(true);
        }
        self.stop.get()
    }
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn pg_ticket_lease_worker_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    BackgroundWorker::connect_worker_to_spi(None, None);
    // The registry is reached through libpq, loaded into this process only:
    // the system's, else this server's own (ticket_client::connect).
    let own_libpq = unsafe { std::ffi::CStr::from_ptr((&raw const pg_sys::pkglib_path).cast()) }.to_string_lossy().into_owned();
    let _ = ticket_client::connect::load_libpq(&[std::path::Path::new(&own_libpq).join("libpq.so.5")]);
    let holder = WorkerHolder { current: RefCell::new(None), stop: Cell::new(false), last_report: RefCell::new(String::new()) };
    let (system, port, timeline) = unsafe { (pg_sys::GetSystemIdentifier(), pg_sys::PostPortNumber, pg_sys::GetWALInsertionTimeLine()) };
    let name = format!("postgres system {system} port {port} timeline {timeline}");
    LeaseKeeper::new(name, settings::machine_lease_ttl_ms(), 1_000).run(&holder);
    // Stopped by SIGTERM and its lease released. At shutdown the postmaster
    // restarts nothing; otherwise (pg_terminate_backend) exit code 1 has it
    // restarted, as SPEC §8 rule 10 asks: exit code 0 would unregister it.
    unsafe { pg_sys::proc_exit(1) };
}
