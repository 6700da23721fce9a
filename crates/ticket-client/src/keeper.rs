//! The holder's side of the lease protocol (SPEC §8–§9), once, for every
//! holder: the client's generator and the server's own lease worker
//! (`pg_ticket.machine_id = -1`) both run a `LeaseKeeper` and differ only
//! in where they publish the lease (`LeaseHolder`).
//!
//! The keeper leases, renews every third of the ttl from the send time of
//! the last successful call (`ticket_core::leases::Reckoning`), retries a
//! failed renewal until the reckoning runs out and then leases anew, drops
//! the lease at once on a refusal, measures the clock skew at each reply,
//! and releases with the last stamp when asked to stop. It never holds the
//! holder's lock across a call to the registry.

use postgres::Client;
use std::time::Duration;

use crate::clock::{boot_ms, wall_ms};
use crate::registry::{self, Grant};
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
    /// The lease is over (refused, or its reckoning ran out).
    fn withdraw(&self);
    /// A call to the registry failed (shown by the holder's errors).
    fn report(&self, error: &str);
    fn current(&self) -> Option<Published>;
    /// The last timestamp (Unix ms) stamped under the current lease.
    fn last_stamp_ms(&self) -> Option<i64>;
    /// Sleep until the boot-clock time, or until told to stop; true: stop.
    fn pause_until(&self, boot_ms: i64) -> bool;
    fn stopping(&self) -> bool;
    /// A new ttl for the next call (a reloaded setting); None: keep it.
    fn ttl_ms(&self) -> Option<i64> {
        None
    }
}

pub struct LeaseKeeper {
    pub holder_name: String,
    pub ttl_ms: i64,
    pub retry_ms: i64,
    conn: Option<Client>,
}

impl LeaseKeeper {
    pub fn new(holder_name: String, ttl_ms: i64, retry_ms: i64) -> Self {
        LeaseKeeper { holder_name, ttl_ms, retry_ms, conn: None }
    }

    fn connect(&mut self, holder: &impl LeaseHolder) -> Result<&mut Client, postgres::Error> {
        // A registry that does not answer costs at most a third of the ttl
        // per call, during which the lease simply runs out.
        let bound = Duration::from_millis((self.ttl_ms as u64 / 3).max(1_000));
        crate::connect::reuse_or_connect(&mut self.conn, &holder.dsn(), bound)
    }

    fn failed(&mut self, holder: &impl LeaseHolder, e: &postgres::Error) {
        if !registry::is_refusal(e) {
            self.conn = None;
        }
        holder.report(&e.as_db_error().map(|d| d.message().to_string()).unwrap_or_else(|| e.to_string()));
    }

    fn skew(grant: &Grant, registry_now_ms: i64, sent_wall_ms: i64) -> Option<(i64, i64)> {
        let local = (sent_wall_ms + wall_ms()) / 2;
        (!clocks_agree(local, registry_now_ms, grant.margin_ms)).then_some((local - registry_now_ms, grant.margin_ms / 2))
    }

    /// Runs until the holder says stop, then releases.
    pub fn run(&mut self, holder: &impl LeaseHolder) {
        loop {
            if let Some(ttl_ms) = holder.ttl_ms() {
                self.ttl_ms = ttl_ms;
            }
            if holder.stopping() {
                if let Some(p) = holder.current() {
                    let last = holder.last_stamp_ms();
                    if let Ok(conn) = self.connect(holder) {
                        let _ = registry::release(conn, &p.grant, last);
                    }
                    holder.withdraw();
                }
                return;
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
                        holder.withdraw();
                    }
                    self.lease(holder);
                }
            }
        }
    }

    fn lease(&mut self, holder: &impl LeaseHolder) {
        let (sent, sent_wall) = (boot_ms(), wall_ms());
        let (name, ttl_ms) = (self.holder_name.clone(), self.ttl_ms);
        match self.connect(holder).and_then(|conn| registry::lease(conn, &name, ttl_ms)) {
            Ok(grant) => holder.publish(Published {
                grant,
                reckoning: Reckoning { sent_at_ms: sent, ttl_ms },
                skew: Self::skew(&grant, grant.expires_at_ms - ttl_ms, sent_wall),
            }),
            Err(e) => {
                self.failed(holder, &e);
                holder.pause_until(boot_ms() + self.retry_ms);
            }
        }
    }

    fn renew(&mut self, holder: &impl LeaseHolder, current: Published) {
        let (sent, sent_wall, ttl_ms) = (boot_ms(), wall_ms(), self.ttl_ms);
        let last = holder.last_stamp_ms();
        match self.connect(holder).and_then(|conn| registry::renew(conn, &current.grant, ttl_ms, last)) {
            Ok(expires_at_ms) => {
                let grant = Grant { expires_at_ms, ..current.grant };
                holder.publish(Published {
                    grant,
                    reckoning: Reckoning { sent_at_ms: sent, ttl_ms },
                    skew: Self::skew(&grant, expires_at_ms - ttl_ms, sent_wall),
                });
            }
            Err(e) if registry::is_refusal(&e) => {
                // Expired, superseded, revoked: this lease is over for good.
                holder.withdraw();
                self.failed(holder, &e);
            }
            Err(e) => {
                self.failed(holder, &e);
                holder.pause_until(boot_ms() + self.retry_ms);
            }
        }
    }
}
