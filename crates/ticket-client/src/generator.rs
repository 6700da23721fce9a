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
//! for it. An ID's stamp is a wall-clock reading taken between two
//! boot-clock readings the reckoning is checked on (after a wait in the
//! generator, a later reading, checked after it), so a stamp is never taken
//! after the reckoned end, and no stamp passes the registry's end plus half
//! the margin. The wall clock agrees
//! with the registry's within half the margin (measured at each reply, and
//! held to the boot clock between replies: a step is refused), and the
//! next holder of the id stamps only above the lease's end plus the
//! margin: no two holders stamp the same millisecond.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::clock::{boot_ms, CheckedWall, ClockReading, WallClock};
use crate::keeper::{LeaseHolder, LeaseKeeper, Published};
use crate::registry::Grant;
use crate::ClientError;
use ticket_core::leases::{check_ttl, StampRefusal};
use ticket_core::snowflake::{self, IdSpace, MarkStore, SharedState, SnowflakeError};

/// What a `LeasedGenerator` needs. Deserializes from configuration files
/// (serde), durations in human form: `ttl = "60s"`, `"500ms"`, `"10 min"`.
#[derive(Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GeneratorConfig {
    /// libpq connection string or URI of the registry database.
    pub dsn: String,
    /// Shown in `pgticket.machine_ids` (host and process, say).
    pub holder: String,
    /// 1 s .. 1 day (and at most the registry's `pg_ticket.lease_max_ttl`).
    #[serde(default = "default_ttl", with = "crate::duration")]
    pub ttl: Duration,
    /// Pause between failed calls to the registry: more than 0, at most
    /// half the ttl (a renewal that failed gets another try in time).
    #[serde(default = "default_retry", with = "crate::duration")]
    pub retry_interval: Duration,
}

impl std::fmt::Debug for GeneratorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeneratorConfig")
            .field("dsn", &crate::dsn::redacted(&self.dsn))
            .field("holder", &self.holder)
            .field("ttl", &self.ttl)
            .field("retry_interval", &self.retry_interval)
            .finish()
    }
}

fn default_ttl() -> Duration {
    // Within the registry's default cap (pg_ticket.lease_max_ttl, 45 s),
    // as the server's own lease (pg_ticket.machine_lease_ttl): 0.4.0's 60 s
    // was capped by every registry left at its defaults (#48 item 4).
    Duration::from_secs(30)
}

fn default_retry() -> Duration {
    Duration::from_millis(500)
}

impl GeneratorConfig {
    pub fn new(dsn: impl Into<String>, holder: impl Into<String>) -> Self {
        GeneratorConfig { dsn: dsn.into(), holder: holder.into(), ttl: default_ttl(), retry_interval: default_retry() }
    }

    /// The ttl in ms, if every value is one the protocol allows.
    fn check(&self) -> Result<i64, ClientError> {
        let invalid = |what: &str, e: &dyn std::fmt::Display| ClientError::InvalidConfig(format!("{what}: {e}"));
        let ttl_ms = i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX);
        ticket_core::counter::check_client_name("holder", &self.holder).map_err(|e| ClientError::InvalidConfig(e.to_string()))?;
        check_ttl(ttl_ms).map_err(|e| invalid("ttl", &e))?;
        if self.retry_interval.is_zero() || self.retry_interval > self.ttl / 2 {
            return Err(invalid("retry_interval", &format!("{:?} is not more than 0 and at most half the ttl ({:?})", self.retry_interval, self.ttl)));
        }
        Ok(ttl_ms)
    }
}

struct Held {
    /// The lease as the keeper last published it.
    lease: Published,
    ids: SharedState,
    last_stamp_ms: Option<i64>,
    /// The boot clock as last read for a stamp (`ClockReading::checked`).
    last_boot_ms: Option<i64>,
}

#[derive(Default)]
struct State {
    lease: Option<Held>,
    /// The ID space of this generator's first lease: its IDs all share it
    /// (a registry whose epoch or layout changed would have it stamp IDs of
    /// another time, or read as another machine's).
    space: Option<IdSpace>,
    /// The last stamp of the lease withdrawn last (for its release).
    withdrawn_stamp_ms: Option<i64>,
    stop: bool,
    last_error: Option<String>,
    /// The registry's last refusal that no retry changes.
    refused: Option<String>,
}

struct Shared {
    config: GeneratorConfig,
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
        let ttl_ms = config.check()?;
        let shared = Arc::new(Shared { config, state: Mutex::new(State::default()), changed: Condvar::new() });
        let thread_shared = Arc::clone(&shared);
        let renewer = std::thread::Builder::new()
            .name("ticket-lease".into())
            .spawn(move || {
                let retry_ms = i64::try_from(thread_shared.config.retry_interval.as_millis()).unwrap_or(i64::MAX).max(1);
                LeaseKeeper::new(thread_shared.config.holder.clone(), ttl_ms, retry_ms).run(&*thread_shared)
            })
            .expect("spawn the lease thread");
        Ok(LeasedGenerator { shared, renewer: Some(renewer) })
    }

    /// Block until a lease is held, at most `timeout`.
    pub fn wait_for_lease(&self, timeout: Duration) -> Result<Grant, ClientError> {
        let deadline = boot_ms().saturating_add(i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX));
        let mut st = self.shared.lock();
        loop {
            if let Some(held) = &st.lease {
                return Ok(held.lease.grant);
            }
            if let Some(why) = &st.refused {
                return Err(ClientError::RegistryRefused(why.clone()));
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
        let first_space = st.space;
        let Some(held) = st.lease.as_mut() else { return Err(ClientError::NoLease { last_error: st.last_error.clone() }) };
        let Published { grant, reckoning, skew } = held.lease;
        if let Some(first) = first_space.filter(|first| *first != grant.space()) {
            return Err(ClientError::SpaceChanged { first, now: grant.space() });
        }
        if let Some((skew_ms, allowed_ms)) = skew {
            return Err(ClientError::ClockSkew { skew_ms, allowed_ms });
        }
        let machine_id = grant.machine_id;
        let refused = |refusal| match refusal {
            StampRefusal::MayHaveEnded => ClientError::LeaseMayHaveEnded { machine_id },
            StampRefusal::ClockStepped { drift_ms } => ClientError::ClockStepped { drift_ms, allowed_ms: reckoning.drift_allowed_ms },
        };
        // The stamp is a wall-clock reading taken between two boot-clock
        // readings, checked before it enters the generator's state (a
        // stepped clock's stamp would hold later IDs back): the end against
        // the later boot reading, the drift against both, so a pause
        // between the reads hides neither (one paused longer than half the
        // margin is refused as a step).
        let first = ClockReading::checked(&reckoning, held.last_boot_ms).map_err(refused)?;
        held.last_boot_ms = Some(first.boot_after_ms);
        // After a wait (a full millisecond, a clock step back) the stamp is
        // a later reading, checked before it enters the state too: a
        // process paused or a clock stepped meanwhile stamps nothing.
        let clock = CheckedWall::starting_with(&WallClock, first, reckoning);
        // The generator never stamps past the cap (PastLease): it stamps the
        // first reading, or a later one after a wait.
        let id = match snowflake::next_id(&held.ids, &clock, &NoMark, grant.epoch_ms, grant.layout, machine_id, reckoning.stamp_cap_ms) {
            Err(SnowflakeError::PastLease { .. }) => return Err(ClientError::LeaseMayHaveEnded { machine_id }),
            Err(SnowflakeError::ReadingRefused) => return Err(refused(clock.refusal().unwrap_or(StampRefusal::MayHaveEnded))),
            other => other?,
        };
        held.last_stamp_ms = held.ids.last_millis().map(|ms| grant.epoch_ms + ms as i64);
        Ok((id, grant.lease))
    }

    /// The lease held now, if any.
    pub fn lease(&self) -> Option<Grant> {
        self.shared.lock().lease.as_ref().map(|h| h.lease.grant)
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

impl LeaseHolder for Shared {
    fn dsn(&self) -> String {
        self.config.dsn.clone()
    }

    fn publish(&self, lease: Published) {
        let mut st = self.lock();
        st.space.get_or_insert(lease.grant.space());
        match st.lease.as_mut().filter(|h| h.lease.grant.lease == lease.grant.lease) {
            Some(held) => held.lease = lease,
            None => {
                st.lease = Some(Held {
                    ids: SharedState::starting_after(lease.grant.not_before_ms, lease.grant.epoch_ms),
                    lease,
                    last_stamp_ms: None,
                    last_boot_ms: None,
                })
            }
        }
        st.last_error = None;
        drop(st);
        self.changed.notify_all();
    }

    fn withdraw(&self) {
        let mut st = self.lock();
        st.withdrawn_stamp_ms = st.lease.take().and_then(|h| h.last_stamp_ms);
    }

    fn report(&self, error: &str) {
        self.lock().last_error = Some(error.to_string());
    }

    fn refused(&self, why: Option<String>) {
        self.lock().refused = why;
        self.changed.notify_all();
    }

    fn current(&self) -> Option<Published> {
        self.lock().lease.as_ref().map(|h| h.lease)
    }

    fn last_stamp_ms(&self) -> Option<i64> {
        let st = self.lock();
        st.lease.as_ref().map_or(st.withdrawn_stamp_ms, |h| h.last_stamp_ms)
    }

    fn pause_until(&self, until_boot_ms: i64) -> bool {
        let mut st = self.lock();
        let left = until_boot_ms - boot_ms();
        if left > 0 && !st.stop {
            st = self.changed.wait_timeout(st, Duration::from_millis(left as u64)).unwrap_or_else(|p| p.into_inner()).0;
        }
        // Not `self.stopping()`: the lock is held (found by a test that
        // dropped a generator during a failed call's retry pause).
        st.stop
    }

    fn stopping(&self) -> bool {
        self.lock().stop
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::CheckedWall;
    use ticket_core::leases::StampRefusal;
    use ticket_core::snowflake::Clock;

    /// A clock standing at one millisecond whose waits do nothing.
    struct StandingClock(i64);

    impl Clock for StandingClock {
        fn now_unix_ms(&self) -> i64 {
            self.0
        }
        fn pause(&self, _: u64) {}
    }

    /// #46 item 11: a generator that must wait (its millisecond is used up)
    /// stamps a later reading; 0.4.0 checked that reading only after the
    /// stamp, so a wall clock stepped forward during the wait entered the
    /// state (its last stamp 20 s ahead: every stamp refused for 20 s once
    /// the clock came back). A later reading refused by its check leaves
    /// the state as it was and stamps nothing; one that passes is stamped.
    #[test]
    fn a_reading_after_a_wait_is_checked_before_it_is_stamped() {
        use ticket_core::snowflake::{next_id, Layout, SharedState};
        const EPOCH: i64 = 1_767_225_600_000;
        let first_ms = EPOCH + 5_000;
        let layout = Layout::new(10).unwrap();
        let first = ClockReading { boot_before_ms: 100, wall_ms: first_ms, boot_after_ms: 100 };
        // The millisecond of the first reading is used up: the generator waits.
        let state = SharedState::starting_after(first_ms, EPOCH);
        let before = state.last_state();
        let stepped = || Err(StampRefusal::ClockStepped { drift_ms: 20_000 });
        let standing = StandingClock(first_ms);
        let clock = CheckedWall::checking_again_with(&standing, first, stepped);
        let outcome = next_id(&state, &clock, &NoMark, EPOCH, layout, 7, i64::MAX);
        assert_eq!(outcome, Err(SnowflakeError::ReadingRefused));
        assert_eq!(clock.refusal(), Some(StampRefusal::ClockStepped { drift_ms: 20_000 }));
        assert_eq!(state.last_state(), before, "a refused reading leaves the state as it was");

        let later = ClockReading { boot_before_ms: 101, wall_ms: first_ms + 1, boot_after_ms: 101 };
        let clock = CheckedWall::checking_again_with(&standing, first, move || Ok(later));
        let id = next_id(&state, &clock, &NoMark, EPOCH, layout, 7, i64::MAX).unwrap();
        assert_eq!(layout.decompose(id).unwrap().millis as i64, first_ms + 1 - EPOCH, "the checked later reading is stamped");
    }
}
