//! The holder's side of the lease protocol (SPEC §8–§9), once, for every
//! holder: the client's generator and the server's own lease worker
//! (`pg_ticket.machine_id = -1`) both run a `LeaseKeeper` and differ only
//! in where they publish the lease (`LeaseHolder`).
//!
//! The keeper leases, renews every third of the ttl from the send time of
//! the last successful call (`ticket_core::leases::Reckoning`), retries a
//! failed renewal until the reckoning runs out and then leases anew, drops
//! the lease at once when the registry says it is over, measures the clock
//! skew at each reply, and on stop withdraws the lease from the stamping
//! path first, then reads the last stamp, then releases (SPEC §8 rule 10).
//! It never holds the holder's lock across a call to the registry, and
//! every call is bounded (`connect::Conn`) and gives way to a stop.

use std::time::{Duration, Instant};

use crate::clock::boot_ms;
use crate::connect::{reuse_or_connect, CallError, Conn};
use crate::registry::{self, Clocks, Grant};
use ticket_core::leases::{clocks_agree, Reckoning};

/// A lease as the keeper publishes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    pub grant: Grant,
    pub reckoning: Reckoning,
    /// Some((local minus registry, allowed)) while the clocks disagree.
    pub skew: Option<(i64, i64)>,
}

/// Where a keeper publishes its lease, and how it waits.
pub trait LeaseHolder {
    /// The registry's connection string (read at every connect).
    fn dsn(&self) -> String;
    /// A new lease, or a renewal of the current one (same token).
    fn publish(&self, lease: Published);
    /// The lease is over (refused, or its reckoning ran out): once this
    /// returns, nothing is stamped with it.
    fn withdraw(&self);
    /// A call to the registry failed (shown by the holder's errors).
    fn report(&self, error: &str);
    /// A refusal no retry changes (`registry::permanent_refusal`), or None
    /// once a call succeeds: a caller waiting for a lease stops waiting.
    fn refused(&self, _why: Option<String>) {}
    fn current(&self) -> Option<Published>;
    /// The last timestamp (Unix ms) stamped under the current lease (or,
    /// after `withdraw`, under the lease just withdrawn).
    fn last_stamp_ms(&self) -> Option<i64>;
    /// Sleep until the boot-clock time, or until told to stop; true: stop.
    fn pause_until(&self, boot_ms: i64) -> bool;
    fn stopping(&self) -> bool;
    /// A new ttl for the next call (a reloaded setting); None: keep it.
    fn ttl_ms(&self) -> Option<i64> {
        None
    }
    /// Keep the connection open between calls? The server's own worker
    /// closes it: an open session to its own server would hold up a smart
    /// shutdown, which waits for every client session to end.
    fn keep_connection(&self) -> bool {
        true
    }
}

/// The longest a release on stop may take, whatever the ttl.
const STOP_RELEASE_BOUND: Duration = Duration::from_secs(5);

pub struct LeaseKeeper {
    pub holder_name: String,
    pub ttl_ms: i64,
    pub retry_ms: i64,
    /// The registry's longest ttl, once it refused a longer one.
    ttl_cap_ms: Option<i64>,
    conn: Option<Conn>,
    /// The registry the current lease was granted by (its connection
    /// string): a lease is renewed and released only there.
    leased_from: Option<String>,
}

impl LeaseKeeper {
    pub fn new(holder_name: String, ttl_ms: i64, retry_ms: i64) -> Self {
        LeaseKeeper { holder_name, ttl_ms, retry_ms, ttl_cap_ms: None, conn: None, leased_from: None }
    }

    /// A registry that does not answer costs at most a third of the ttl per
    /// call (connecting and every statement of it together), during which
    /// the lease simply runs out.
    fn bound(&self) -> Duration {
        Duration::from_millis((self.ttl_ms as u64 / 3).max(1_000))
    }

    fn ttl_now(&self) -> i64 {
        self.ttl_cap_ms.map_or(self.ttl_ms, |cap| self.ttl_ms.min(cap))
    }

    /// One call to the registry at `dsn`, all of it within `bound`, giving
    /// way to a stop unless `until_stop` is false.
    fn call_at<T>(
        &mut self,
        holder: &impl LeaseHolder,
        dsn: &str,
        until_stop: bool,
        bound: Duration,
        f: impl FnOnce(&mut Conn, &dyn Fn() -> bool) -> Result<T, CallError>,
    ) -> Result<T, CallError> {
        if dsn.trim().is_empty() {
            let e = CallError::Connection("no registry is set (the connection string is empty)".into());
            holder.report(&e.message());
            return Err(e);
        }
        let deadline = Instant::now() + bound;
        let stopping = || until_stop && holder.stopping();
        let stop = || stopping() || Instant::now() >= deadline;
        let outcome = reuse_or_connect(&mut self.conn, dsn, bound, &stop)
            .and_then(|conn| f(conn, &stop))
            .map_err(|e| if e == CallError::Stopped && !stopping() { CallError::TimedOut(bound) } else { e });
        if outcome.as_ref().is_err_and(|e| e.code().is_none()) || !holder.keep_connection() {
            // No answer, or the connection failed: start over.
            self.conn = None;
        }
        if let Err(e) = &outcome {
            holder.report(&e.message());
        }
        outcome
    }

    fn call<T>(&mut self, holder: &impl LeaseHolder, f: impl FnOnce(&mut Conn, &dyn Fn() -> bool) -> Result<T, CallError>) -> Result<T, CallError> {
        let dsn = self.leased_from.clone().unwrap_or_else(|| holder.dsn());
        let bound = self.bound();
        self.call_at(holder, &dsn, true, bound, f)
    }

    /// The lease as of a reply: reckoned from the boot-clock time the call
    /// began (the conservative end), the skew from the clocks around its
    /// statement.
    fn published(grant: Grant, sent_boot_ms: i64, ttl_ms: i64, clocks: Clocks) -> Published {
        let (replied_boot_ms, replied_wall_ms) = (boot_ms(), crate::clock::wall_ms());
        let skew_ms = clocks.local_ms - clocks.registry_ms;
        Published {
            grant,
            reckoning: Reckoning::from_reply(sent_boot_ms, ttl_ms, replied_boot_ms, replied_wall_ms, &grant, skew_ms),
            skew: (!clocks_agree(clocks.local_ms, clocks.registry_ms, grant.margin_ms)).then_some((skew_ms, grant.margin_ms / 2)),
        }
    }

    /// The registry refused the ttl as longer than it allows: ask it for
    /// its longest and use that from now on (not a loop of refusals).
    fn cap_ttl(&mut self, holder: &impl LeaseHolder) {
        if let Ok(max_ttl_ms) = self.call(holder, registry::max_ttl_ms) {
            self.ttl_cap_ms = Some(max_ttl_ms.max(ticket_core::leases::MIN_TTL_MS));
        }
    }

    /// Runs until the holder says stop, then releases.
    pub fn run(&mut self, holder: &impl LeaseHolder) {
        loop {
            if let Some(ttl_ms) = holder.ttl_ms() {
                self.ttl_ms = ttl_ms;
            }
            if holder.stopping() {
                self.stop(holder);
                return;
            }
            if self.leased_from.as_ref().is_some_and(|from| *from != holder.dsn()) {
                // The registry setting changed: end the lease where it was
                // granted, then lease at the new registry. Nothing is
                // stamped in between.
                self.stop(holder);
            }
            let now = boot_ms();
            match holder.current() {
                Some(p) if p.reckoning.may_issue(now) => {
                    if now < p.reckoning.renew_at_ms() {
                        holder.pause_until(p.reckoning.renew_at_ms());
                    } else {
                        self.renew(holder, p);
                    }
                }
                // None, or past the reckoned end: lease anew (the old one
                // is left to expire at the registry).
                held => {
                    if held.is_some() {
                        self.lease_over(holder);
                    }
                    self.lease(holder);
                }
            }
        }
    }

    /// Withdraw, then read the last stamp, then release: a stamp made after
    /// the release would be one the next holder does not know of.
    fn stop(&mut self, holder: &impl LeaseHolder) {
        let from = self.leased_from.take();
        self.ttl_cap_ms = None;
        let Some(p) = holder.current() else { return };
        holder.withdraw();
        let last = holder.last_stamp_ms();
        // Not cut short by the stop itself, but short whatever the ttl: the
        // lease is withdrawn already, and the release only spares the next
        // holder of the id the wait for its expiry.
        let dsn = from.unwrap_or_else(|| holder.dsn());
        let bound = self.bound().min(STOP_RELEASE_BOUND);
        let _ = self.call_at(holder, &dsn, false, bound, |conn, stop| registry::release(conn, &p.grant, last, stop));
    }

    /// The registry said the lease is over, or its reckoning ran out: it is
    /// left to expire there.
    fn lease_over(&mut self, holder: &impl LeaseHolder) {
        holder.withdraw();
        self.leased_from = None;
        // The next lease asks for the full ttl again: a raised
        // lease_max_ttl is taken up.
        self.ttl_cap_ms = None;
    }

    fn lease(&mut self, holder: &impl LeaseHolder) {
        let sent = boot_ms();
        let (name, ttl_ms, dsn, bound) = (self.holder_name.clone(), self.ttl_now(), holder.dsn(), self.bound());
        match self.call_at(holder, &dsn, true, bound, |conn, stop| registry::lease(conn, &name, ttl_ms, stop)) {
            Ok((grant, clocks)) => {
                self.leased_from = Some(dsn);
                holder.refused(None);
                holder.publish(Self::published(grant, sent, ttl_ms, clocks))
            }
            Err(e) => {
                if registry::ttl_refused(&e) {
                    self.cap_ttl(holder);
                }
                // Retried all the same (a GRANT may come), but a caller
                // waiting for the lease is told at once.
                if let Some(why) = registry::permanent_refusal(&e) {
                    holder.refused(Some(why));
                }
                holder.pause_until(boot_ms().saturating_add(self.retry_ms));
            }
        }
    }

    fn renew(&mut self, holder: &impl LeaseHolder, current: Published) {
        let (sent, ttl_ms) = (boot_ms(), self.ttl_now());
        let last = holder.last_stamp_ms();
        match self.call(holder, |conn, stop| registry::renew(conn, &current.grant, ttl_ms, last, stop)) {
            // The registry never shortens a lease; the holder reckons on the
            // ttl it asked for, from the send time.
            Ok((expires_at_ms, clocks)) => holder.publish(Self::published(Grant { expires_at_ms, ..current.grant }, sent, ttl_ms, clocks)),
            Err(e) if registry::lease_is_over(&e) => self.lease_over(holder),
            Err(e) => {
                if registry::ttl_refused(&e) {
                    self.cap_ttl(holder);
                }
                holder.pause_until(boot_ms().saturating_add(self.retry_ms));
            }
        }
    }
}
