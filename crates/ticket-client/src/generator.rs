//! A snowflake generator on a leased machine id (SPEC §9).
//!
//! Locking rule: one mutex guards the lease and the generator state. An ID
//! is issued under it without I/O (it may pause up to 10 ms for a clock
//! step back, or 1 ms for a full millisecond, as the server's generator
//! does). The background thread takes it only to read or swap the lease,
//! never across a call to the registry, so a slow or dead registry never
//! blocks an ID call; it only lets the lease run out.
//!
//! The safety argument: a lease is reckoned to end at (boot-clock time the
//! request was *sent*) + ttl, which is no later than the registry's end
//! for it. An ID's stamp is read before the reckoning is checked a second
//! time, so a stamp is never taken after the reckoned end. The wall clock
//! agrees with the registry's within half the margin (else nothing is
//! issued), and the next holder of the id stamps only above the lease's
//! end plus the margin: no two holders stamp the same millisecond.

use postgres::{Client, NoTls};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::clock::{boot_ms, wall_ms, WallClock};
use crate::registry::{self, Grant};
use crate::ClientError;
use ticket_core::leases::{check_ttl, clocks_agree, Reckoning};
use ticket_core::snowflake::{self, MarkStore, SharedState, SnowflakeError};

#[derive(Debug, Clone)]
pub struct GeneratorConfig {
    /// libpq-style connection string of the registry database.
    pub dsn: String,
    /// Shown in `pgticket.machine_leases` (host and process, say).
    pub holder: String,
    /// 1 s .. 1 day (and at most the registry's `pg_ticket.lease_max_ttl`).
    pub ttl: Duration,
    /// Pause between failed calls to the registry.
    pub retry_interval: Duration,
}

impl GeneratorConfig {
    pub fn new(dsn: impl Into<String>, holder: impl Into<String>) -> Self {
        GeneratorConfig { dsn: dsn.into(), holder: holder.into(), ttl: Duration::from_secs(60), retry_interval: Duration::from_millis(500) }
    }
}

struct Held {
    grant: Grant,
    reckoning: Reckoning,
    /// Some((skew, allowed)) while this host's clock disagrees with the registry's.
    skew: Option<(i64, i64)>,
    ids: SharedState,
    last_stamp_ms: Option<i64>,
}

#[derive(Default)]
struct State {
    lease: Option<Held>,
    stop: bool,
    last_error: Option<String>,
}

struct Shared {
    config: GeneratorConfig,
    ttl_ms: i64,
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding it cannot leave the state half-written in a
        // way that issues a duplicate: every check is redone per call.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The generator: cheap to share between threads (`&self` everywhere).
pub struct LeasedGenerator {
    shared: Arc<Shared>,
    renewer: Option<JoinHandle<()>>,
}

/// The leased generator needs no durable mark: the lease's `not_before_ms`
/// and its end bound every stamp.
struct NoMark;

impl MarkStore for NoMark {
    fn load(&self) -> Result<Option<i64>, SnowflakeError> {
        Ok(None)
    }
    fn save(&self, _: i64) -> Result<(), String> {
        Ok(())
    }
    fn location(&self) -> String {
        "the lease".into()
    }
}

impl LeasedGenerator {
    /// Starts the background thread, which leases at once; IDs are refused
    /// (`NoLease`) until a lease is held — see [`wait_for_lease`](Self::wait_for_lease).
    pub fn start(config: GeneratorConfig) -> Result<Self, ClientError> {
        let ttl_ms = i64::try_from(config.ttl.as_millis()).unwrap_or(i64::MAX);
        check_ttl(ttl_ms).map_err(|e| ClientError::NoLease { last_error: Some(e.to_string()) })?;
        let shared = Arc::new(Shared { config, ttl_ms, state: Mutex::new(State::default()), changed: Condvar::new() });
        let thread_shared = Arc::clone(&shared);
        let renewer = std::thread::Builder::new()
            .name("ticket-lease".into())
            .spawn(move || Renewer { shared: thread_shared, conn: None }.run())
            .expect("spawn the lease thread");
        Ok(LeasedGenerator { shared, renewer: Some(renewer) })
    }

    /// Block until a lease is held, at most `timeout`.
    pub fn wait_for_lease(&self, timeout: Duration) -> Result<Grant, ClientError> {
        let deadline = boot_ms() + timeout.as_millis() as i64;
        let mut st = self.shared.lock();
        loop {
            if let Some(held) = &st.lease {
                return Ok(held.grant);
            }
            let left = deadline - boot_ms();
            if left <= 0 {
                return Err(ClientError::NoLease { last_error: st.last_error.clone() });
            }
            st = self.shared.changed.wait_timeout(st, Duration::from_millis(left as u64)).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// The next ID, or an error — never an ID the lease may not cover.
    pub fn next_id(&self) -> Result<i64, ClientError> {
        self.next_id_with_lease().map(|(id, _)| id)
    }

    /// The next ID and the fencing token of the lease it was issued under.
    pub fn next_id_with_lease(&self) -> Result<(i64, i64), ClientError> {
        let mut st = self.shared.lock();
        let last_error = st.last_error.clone();
        let Some(held) = st.lease.as_mut() else { return Err(ClientError::NoLease { last_error }) };
        if let Some((skew_ms, allowed_ms)) = held.skew {
            return Err(ClientError::ClockSkew { skew_ms, allowed_ms });
        }
        let machine_id = held.grant.machine_id;
        if !held.reckoning.may_issue(boot_ms()) {
            return Err(ClientError::LeaseMayHaveEnded { machine_id });
        }
        let id = snowflake::next_id(&held.ids, &WallClock, &NoMark, held.grant.epoch_ms, machine_id)?;
        // The stamp was read before this check: a process paused in between
        // (SIGSTOP, a long preemption) finds its lease may be over and
        // drops the ID it made.
        if !held.reckoning.may_issue(boot_ms()) {
            return Err(ClientError::LeaseMayHaveEnded { machine_id });
        }
        held.last_stamp_ms = Some(held.grant.epoch_ms + (held.ids.last_state() >> snowflake::SEQUENCE_BITS) as i64);
        Ok((id, held.grant.lease))
    }

    /// The lease held now, if any.
    pub fn lease(&self) -> Option<Grant> {
        self.shared.lock().lease.as_ref().map(|h| h.grant)
    }
}

/// Stops renewing and releases the lease with the last stamp.
impl Drop for LeasedGenerator {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
        if let Some(t) = self.renewer.take() {
            let _ = t.join();
        }
    }
}

enum Next {
    Lease,
    Renew(Grant, Option<i64>),
    WaitUntil(i64),
    Stop(Option<(Grant, Option<i64>)>),
}

struct Renewer {
    shared: Arc<Shared>,
    conn: Option<Client>,
}

impl Renewer {
    fn connect(&mut self) -> Result<&mut Client, postgres::Error> {
        if self.conn.as_ref().is_none_or(|c| c.is_closed()) {
            let mut config: postgres::Config = self.shared.config.dsn.parse()?;
            // Bounded waits: a registry that does not answer costs at most
            // about a ttl, during which the lease simply runs out.
            let bound = Duration::from_millis((self.shared.ttl_ms as u64 / 3).max(1_000));
            if config.get_connect_timeout().is_none() {
                config.connect_timeout(bound);
            }
            config.tcp_user_timeout(bound);
            self.conn = Some(config.connect(NoTls)?);
        }
        Ok(self.conn.as_mut().expect("connected"))
    }

    /// Remember a failure; a failed connection is dropped (it is
    /// reconnected at the next call).
    fn failed(&mut self, e: &postgres::Error) {
        if !registry::is_refusal(e) {
            self.conn = None;
        }
        self.shared.lock().last_error = Some(e.as_db_error().map(|d| d.message().to_string()).unwrap_or_else(|| e.to_string()));
    }

    fn next(&self) -> Next {
        let st = self.shared.lock();
        let now = boot_ms();
        match &st.lease {
            _ if st.stop => Next::Stop(st.lease.as_ref().map(|h| (h.grant, h.last_stamp_ms))),
            None => Next::Lease,
            // Past the reckoned end: lease anew (the old one is left to expire).
            Some(h) if !h.reckoning.may_issue(now) => Next::Lease,
            Some(h) if now >= h.reckoning.renew_at_ms() => Next::Renew(h.grant, h.last_stamp_ms),
            Some(h) => Next::WaitUntil(h.reckoning.renew_at_ms()),
        }
    }

    fn pause(&self, until_boot_ms: i64) {
        let st = self.shared.lock();
        let left = until_boot_ms - boot_ms();
        if left > 0 && !st.stop {
            drop(self.shared.changed.wait_timeout(st, Duration::from_millis(left as u64)));
        }
    }

    fn retry_pause(&self) {
        self.pause(boot_ms() + self.shared.config.retry_interval.as_millis() as i64);
    }

    fn run(mut self) {
        loop {
            match self.next() {
                Next::Stop(held) => {
                    if let Some((grant, last)) = held {
                        if let Ok(conn) = self.connect() {
                            let _ = registry::release(conn, &grant, last);
                        }
                    }
                    return;
                }
                Next::WaitUntil(t) => self.pause(t),
                Next::Lease => self.lease(),
                Next::Renew(grant, last) => self.renew(grant, last),
            }
        }
    }

    fn skew(grant: &Grant, registry_now_ms: i64, sent_wall_ms: i64) -> Option<(i64, i64)> {
        let local = (sent_wall_ms + wall_ms()) / 2;
        (!clocks_agree(local, registry_now_ms, grant.margin_ms)).then_some((local - registry_now_ms, grant.margin_ms / 2))
    }

    fn lease(&mut self) {
        let ttl_ms = self.shared.ttl_ms;
        let holder = self.shared.config.holder.clone();
        let sent = boot_ms();
        let sent_wall = wall_ms();
        let result = self.connect().and_then(|conn| registry::lease(conn, &holder, ttl_ms));
        match result {
            Ok(grant) => {
                let skew = Self::skew(&grant, grant.expires_at_ms - ttl_ms, sent_wall);
                let mut st = self.shared.lock();
                st.lease = Some(Held {
                    grant,
                    reckoning: Reckoning { sent_at_ms: sent, ttl_ms },
                    skew,
                    ids: SharedState::starting_after(grant.not_before_ms, grant.epoch_ms),
                    last_stamp_ms: None,
                });
                st.last_error = None;
                drop(st);
                self.shared.changed.notify_all();
            }
            Err(e) => {
                self.failed(&e);
                self.retry_pause();
            }
        }
    }

    fn renew(&mut self, grant: Grant, last_stamp_ms: Option<i64>) {
        let ttl_ms = self.shared.ttl_ms;
        let sent = boot_ms();
        let sent_wall = wall_ms();
        let result = self.connect().and_then(|conn| registry::renew(conn, &grant, ttl_ms, last_stamp_ms));
        let mut st = self.shared.lock();
        let current = st.lease.as_mut().filter(|h| h.grant.lease == grant.lease);
        match (result, current) {
            (Ok(expires_at_ms), Some(held)) => {
                held.reckoning = Reckoning { sent_at_ms: sent, ttl_ms };
                held.skew = Self::skew(&grant, expires_at_ms - ttl_ms, sent_wall);
                held.grant.expires_at_ms = expires_at_ms;
                st.last_error = None;
            }
            (Ok(_), None) => {}
            (Err(e), _) if registry::is_refusal(&e) => {
                // Expired, superseded, revoked: this lease is over for good.
                st.lease = None;
                drop(st);
                self.failed(&e);
            }
            (Err(e), _) => {
                drop(st);
                self.failed(&e);
                self.retry_pause();
            }
        }
    }
}
