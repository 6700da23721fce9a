//! Machine-id leases (SPEC §8, §9), free of PostgreSQL: the rules the
//! registry applies and the conservative reckoning a holder keeps, shared
//! by the extension and `crates/ticket-client` once they exist.
//!
//! The rule: an id is held by one lease at a time; a holder that cannot
//! renew before its lease ends stops issuing; the registry never hands the
//! id to another holder until the old lease has fully ended plus a margin,
//! and tells the new holder the earliest timestamp it may stamp
//! (`not_before_ms`).

use thiserror::Error;

/// Shortest and longest lease a registry grants.
pub const MIN_TTL_MS: i64 = 1_000;
pub const MAX_TTL_MS: i64 = 86_400_000;
/// The smallest margin between one holder's end and the next holder's start.
pub const MIN_MARGIN_MS: i64 = 1_000;

#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum LeaseError {
    #[error("a lease lasts from 1 second to 1 day, not {ttl_ms} ms")]
    BadTtl { ttl_ms: i64 },
    #[error("a lease lasts at most pg_ticket.lease_max_ttl ({max_ttl_ms} ms) on this registry, not {ttl_ms} ms")]
    TtlOverMax { ttl_ms: i64, max_ttl_ms: i64 },
    #[error("machine id {machine_id} was never leased by this registry")]
    NeverLeased { machine_id: u16 },
    #[error("lease {lease} of machine id {machine_id} is no longer its current lease (lease {current} is); stop issuing and lease anew")]
    Superseded { machine_id: u16, lease: i64, current: i64 },
    #[error("lease {lease} of machine id {machine_id} expired {ago_ms} ms ago; stop issuing and lease anew")]
    Expired { machine_id: u16, lease: i64, ago_ms: i64 },
    #[error("lease {lease} of machine id {machine_id} was released; lease anew")]
    Released { machine_id: u16, lease: i64 },
    #[error("lease {lease} of machine id {machine_id} was revoked; stop issuing and lease anew")]
    Revoked { machine_id: u16, lease: i64 },
    #[error("lease {lease} of machine id {machine_id} was granted before this registry was restored or promoted; stop issuing and lease anew")]
    Forgotten { machine_id: u16, lease: i64 },
    #[error("this registry was restored or promoted and may have forgotten leases: it grants again in {wait_ms} ms (pg_ticket.lease_max_ttl plus pg_ticket.lease_margin after it started serving)")]
    HoldOff { wait_ms: i64 },
    #[error("no machine id is free: {held} held, {cooling} within pg_ticket.lease_margin of their end{}", match .next_free_in_ms { Some(ms) => format!("; the next frees in {ms} ms"), None => String::new() })]
    NoneFree { held: usize, cooling: usize, next_free_in_ms: Option<i64> },
    #[error("{0:?} is not a list of machine ids: write ranges like '0-99, 200, 300-310' within 0..1023")]
    BadIdList(String),
}

pub fn check_ttl(ttl_ms: i64) -> Result<i64, LeaseError> {
    if (MIN_TTL_MS..=MAX_TTL_MS).contains(&ttl_ms) {
        Ok(ttl_ms)
    } else {
        Err(LeaseError::BadTtl { ttl_ms })
    }
}

/// The ids a registry may lease (`pg_ticket.lease_ids`), e.g. "0-99, 200":
/// sorted, without duplicates, within 0..=1023.
pub fn parse_id_list(text: &str) -> Result<Vec<u16>, LeaseError> {
    let bad = || LeaseError::BadIdList(text.to_string());
    let mut ids = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (from, to) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let from: u16 = from.parse().map_err(|_| bad())?;
        let to: u16 = to.parse().map_err(|_| bad())?;
        if from > to || to > crate::snowflake::MAX_MACHINE_ID {
            return Err(bad());
        }
        ids.extend(from..=to);
    }
    if ids.is_empty() {
        return Err(bad());
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

/// A granted lease: what the registry answers, and what a holder keeps
/// (times in Unix ms, the registry's clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub machine_id: u16,
    /// The fencing token: strictly increasing over every grant.
    pub lease: i64,
    pub not_before_ms: i64,
    pub expires_at_ms: i64,
    /// The ID space's epoch (the registry's `pg_ticket.epoch`).
    pub epoch_ms: i64,
    /// The registry's `pg_ticket.lease_margin` (the clock skew allowance).
    pub margin_ms: i64,
}

/// What the registry remembers of an id's last lease (times in Unix ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastLease {
    pub expires_at_ms: i64,
    /// When it was released or revoked early (None: it runs to its expiry).
    pub ended_at_ms: Option<i64>,
    /// A revoked lease counts as running to its own expiry: its holder
    /// learns of the revocation only at its next renewal.
    pub revoked: bool,
    /// The last timestamp its holder reported having stamped.
    pub last_issued_ms: Option<i64>,
    /// What earlier leases of the id already required (carried forward).
    pub not_before_ms: i64,
}

impl LastLease {
    /// When the holder may last have stamped an ID: its lease's real end.
    pub fn end_ms(&self) -> i64 {
        match self.ended_at_ms {
            Some(ended) if !self.revoked => ended.min(self.expires_at_ms),
            _ => self.expires_at_ms,
        }
    }

    /// The id may be leased again from this time on.
    pub fn free_from_ms(&self, margin_ms: i64) -> i64 {
        self.end_ms() + margin_ms
    }

    /// The earliest timestamp a new holder may stamp is after this: every
    /// earlier holder's reported stamps, and the end of their leases plus
    /// the margin (the skew allowance).
    pub fn not_before_ms(&self, margin_ms: i64) -> i64 {
        self.not_before_ms.max(self.last_issued_ms.unwrap_or(i64::MIN)).max(self.end_ms() + margin_ms)
    }
}

/// Which ids may be granted at `now_ms`, and why the others may not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Availability {
    /// Grantable ids in the order to try them: never leased first, then the
    /// one free the longest (a row another grant has locked is skipped and
    /// the next tried).
    pub free: Vec<u16>,
    /// Ids under a lease that has not ended.
    pub held: usize,
    /// Ids whose lease ended less than the margin ago.
    pub cooling: usize,
    /// When the first held or cooling id frees up (None: nothing will).
    pub next_free_ms: Option<i64>,
}

/// Among `allowed`, never `own_id` (the registry's own snowflake machine
/// id). `last(id)` is the id's last lease, None if never leased.
pub fn availability(
    allowed: &[u16],
    own_id: Option<u16>,
    last: impl Fn(u16) -> Option<LastLease>,
    now_ms: i64,
    margin_ms: i64,
) -> Availability {
    let mut free = Vec::new();
    let (mut held, mut cooling, mut next_free_ms) = (0, 0, None::<i64>);
    for id in allowed.iter().copied().filter(|id| Some(*id) != own_id) {
        match last(id) {
            None => free.push((i64::MIN, id)),
            Some(lease) => {
                let free_from = lease.free_from_ms(margin_ms);
                if free_from <= now_ms {
                    free.push((free_from, id));
                } else {
                    if lease.end_ms() > now_ms {
                        held += 1;
                    } else {
                        cooling += 1;
                    }
                    next_free_ms = Some(next_free_ms.map_or(free_from, |t| t.min(free_from)));
                }
            }
        }
    }
    free.sort_unstable();
    Availability { free: free.into_iter().map(|(_, id)| id).collect(), held, cooling, next_free_ms }
}

/// May a lease be granted (or renewed) for `ttl_ms` under a registry whose
/// longest is `max_ttl_ms` (`pg_ticket.lease_max_ttl`)?
pub fn check_ttl_within(ttl_ms: i64, max_ttl_ms: i64) -> Result<i64, LeaseError> {
    check_ttl(ttl_ms)?;
    if ttl_ms > max_ttl_ms {
        return Err(LeaseError::TtlOverMax { ttl_ms, max_ttl_ms });
    }
    Ok(ttl_ms)
}

/// A registry that may have forgotten leases (restored from a dump,
/// promoted from a replica that had not replayed every grant) grants from
/// this time on: every lease it may have forgotten was granted before it
/// started serving, for at most the longest ttl it allows, and its holder
/// may have stamped until its end plus the margin (SPEC §8 rule 7).
pub fn grants_resume_at(serving_since_ms: i64, max_ttl_ms: i64, margin_ms: i64) -> i64 {
    serving_since_ms + max_ttl_ms + margin_ms
}

/// An id's current lease as the registry has it, for renewals and releases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CurrentLease {
    pub machine_id: u16,
    pub lease: i64,
    pub leased_at_ms: i64,
    pub expires_at_ms: i64,
    pub ended_at_ms: Option<i64>,
    pub revoked: bool,
}

/// May the holder of `lease` renew it at `now_ms`? Only the id's current
/// lease, not ended, not expired, and granted since the registry started
/// serving (`serving_since_ms`: a restored or promoted registry may have
/// granted the id again after the lease it remembers).
pub fn check_renewal(
    current: Option<&CurrentLease>,
    machine_id: u16,
    lease: i64,
    now_ms: i64,
    serving_since_ms: i64,
) -> Result<(), LeaseError> {
    let current = current.ok_or(LeaseError::NeverLeased { machine_id })?;
    if current.lease != lease {
        return Err(LeaseError::Superseded { machine_id, lease, current: current.lease });
    }
    if current.revoked {
        return Err(LeaseError::Revoked { machine_id, lease });
    }
    if current.ended_at_ms.is_some() {
        return Err(LeaseError::Released { machine_id, lease });
    }
    if current.leased_at_ms < serving_since_ms {
        return Err(LeaseError::Forgotten { machine_id, lease });
    }
    if current.expires_at_ms <= now_ms {
        return Err(LeaseError::Expired { machine_id, lease, ago_ms: now_ms - current.expires_at_ms });
    }
    Ok(())
}

/// May the holder of `lease` release it? Its own lease, in any state (a
/// second release, or one after expiry, only records the last stamp).
pub fn check_release(current: Option<&CurrentLease>, machine_id: u16, lease: i64) -> Result<(), LeaseError> {
    let current = current.ok_or(LeaseError::NeverLeased { machine_id })?;
    if current.lease != lease {
        return Err(LeaseError::Superseded { machine_id, lease, current: current.lease });
    }
    Ok(())
}

/// A holder's conservative reckoning of its lease, on a clock that keeps
/// counting while the host is suspended (CLOCK_BOOTTIME), from the moment
/// the request was *sent*: a slow reply, a paused process or a suspended
/// host can only make it stop early, never late.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reckoning {
    /// Boot-clock ms when the (granting or renewing) request was sent.
    pub sent_at_ms: i64,
    pub ttl_ms: i64,
}

impl Reckoning {
    /// May an ID be issued at boot-clock time `now_ms`?
    pub fn may_issue(&self, now_ms: i64) -> bool {
        now_ms < self.sent_at_ms + self.ttl_ms
    }

    /// When to renew: every third of the ttl.
    pub fn renew_at_ms(&self) -> i64 {
        self.sent_at_ms + self.ttl_ms / 3
    }
}

/// The holder's wall clock may stamp IDs only while it agrees with the
/// registry's to within half the margin (measured at each lease and
/// renewal): the margin is the skew allowance of `not_before_ms`.
pub fn clocks_agree(local_wall_ms: i64, registry_wall_ms: i64, margin_ms: i64) -> bool {
    (local_wall_ms - registry_wall_ms).abs() <= margin_ms / 2
}

#[cfg(test)]
mod tests {
    use super::*;

    const MARGIN: i64 = 10_000;

    #[test]
    fn ttls_are_bounded() {
        assert_eq!(check_ttl(60_000), Ok(60_000));
        assert_eq!(check_ttl(1_000), Ok(1_000));
        assert_eq!(check_ttl(86_400_000), Ok(86_400_000));
        assert_eq!(check_ttl(999), Err(LeaseError::BadTtl { ttl_ms: 999 }));
        assert_eq!(check_ttl(86_400_001), Err(LeaseError::BadTtl { ttl_ms: 86_400_001 }));
    }

    #[test]
    fn id_lists_are_ranges_within_the_machine_bits() {
        assert_eq!(parse_id_list("0-3, 7,5 , 2"), Ok(vec![0, 1, 2, 3, 5, 7]));
        assert_eq!(parse_id_list("1023").unwrap(), vec![1023]);
        assert_eq!(parse_id_list("0-1023").unwrap().len(), 1024);
        for bad in ["", "1024", "5-3", "a-b", "-1", "0-1024"] {
            assert!(parse_id_list(bad).is_err(), "{bad:?}");
        }
    }

    fn lease(expires: i64, ended: Option<i64>, revoked: bool, last_issued: Option<i64>) -> LastLease {
        LastLease { expires_at_ms: expires, ended_at_ms: ended, revoked, last_issued_ms: last_issued, not_before_ms: 0 }
    }

    #[test]
    fn an_expired_lease_frees_its_id_only_after_the_margin() {
        let l = lease(100_000, None, false, None);
        assert_eq!(l.free_from_ms(MARGIN), 110_000);
        assert_eq!(l.not_before_ms(MARGIN), 110_000, "the old holder may have stamped up to its expiry (plus skew)");
    }

    #[test]
    fn a_released_lease_ends_at_the_release_and_its_reported_stamp_counts() {
        let l = lease(100_000, Some(40_000), false, Some(39_500));
        assert_eq!(l.free_from_ms(MARGIN), 50_000);
        assert_eq!(l.not_before_ms(MARGIN), 50_000);
        // A holder whose clock ran ahead reported a stamp past the margin.
        let ahead = lease(100_000, Some(40_000), false, Some(55_000));
        assert_eq!(ahead.not_before_ms(MARGIN), 55_000);
    }

    #[test]
    fn a_revoked_lease_counts_as_running_to_its_own_expiry() {
        let l = lease(100_000, Some(40_000), true, None);
        assert_eq!(l.free_from_ms(MARGIN), 110_000, "its holder only learns at its next renewal");
    }

    #[test]
    fn not_before_carries_forward_over_every_earlier_holder() {
        let mut l = lease(100_000, Some(40_000), false, None);
        l.not_before_ms = 70_000; // an earlier holder reported stamps up to here
        assert_eq!(l.not_before_ms(MARGIN), 70_000);
    }

    #[test]
    fn the_registry_never_grants_its_own_id_and_prefers_never_used_then_longest_free() {
        let leases = |id: u16| match id {
            0 => Some(lease(10_000, None, false, None)),  // free since 20 000
            1 => Some(lease(30_000, None, false, None)),  // free since 40 000
            2 => Some(lease(95_000, None, false, None)),  // within its margin at 100 000
            4 => Some(lease(200_000, None, false, None)), // held until 200 000
            _ => None,
        };
        let free = |allowed: &[u16], own, now| availability(allowed, own, leases, now, MARGIN).free;
        assert_eq!(free(&[1, 0, 2], None, 100_000), vec![0, 1], "free the longest first");
        assert_eq!(free(&[0, 1, 2, 3], None, 100_000), vec![3, 0, 1], "never used first");
        assert_eq!(free(&[0, 1, 2, 3], Some(3), 100_000), vec![0, 1], "never its own id");
        assert_eq!(free(&[2], None, 105_000), vec![2], "free once the margin passed");
        let none = availability(&[2, 4], None, leases, 100_000, MARGIN);
        assert_eq!(
            none,
            Availability { free: vec![], held: 1, cooling: 1, next_free_ms: Some(105_000) },
            "one held, one within its margin; the first frees at 105 000"
        );
    }

    #[test]
    fn a_registry_caps_the_ttl_and_holds_off_for_the_longest_after_a_restore() {
        assert_eq!(check_ttl_within(60_000, 600_000), Ok(60_000));
        assert_eq!(check_ttl_within(600_001, 600_000), Err(LeaseError::TtlOverMax { ttl_ms: 600_001, max_ttl_ms: 600_000 }));
        assert_eq!(check_ttl_within(500, 600_000), Err(LeaseError::BadTtl { ttl_ms: 500 }));
        assert_eq!(grants_resume_at(1_000_000, 600_000, MARGIN), 1_610_000);
    }

    #[test]
    fn only_the_current_live_lease_renews() {
        let cur = CurrentLease { machine_id: 5, lease: 42, leased_at_ms: 1_000, expires_at_ms: 61_000, ended_at_ms: None, revoked: false };
        assert_eq!(check_renewal(Some(&cur), 5, 42, 60_999, 0), Ok(()));
        assert_eq!(check_renewal(Some(&cur), 5, 42, 61_000, 0), Err(LeaseError::Expired { machine_id: 5, lease: 42, ago_ms: 0 }));
        assert_eq!(check_renewal(Some(&cur), 5, 41, 2_000, 0), Err(LeaseError::Superseded { machine_id: 5, lease: 41, current: 42 }));
        assert_eq!(check_renewal(None, 5, 42, 2_000, 0), Err(LeaseError::NeverLeased { machine_id: 5 }));
        let released = CurrentLease { ended_at_ms: Some(2_000), ..cur };
        assert_eq!(check_renewal(Some(&released), 5, 42, 3_000, 0), Err(LeaseError::Released { machine_id: 5, lease: 42 }));
        let revoked = CurrentLease { revoked: true, ended_at_ms: Some(2_000), ..cur };
        assert_eq!(check_renewal(Some(&revoked), 5, 42, 3_000, 0), Err(LeaseError::Revoked { machine_id: 5, lease: 42 }));
        assert_eq!(check_renewal(Some(&cur), 5, 42, 3_000, 1_500), Err(LeaseError::Forgotten { machine_id: 5, lease: 42 }));
        assert_eq!(check_release(Some(&released), 5, 42), Ok(()), "a second release is harmless");
        assert_eq!(check_release(Some(&cur), 5, 7), Err(LeaseError::Superseded { machine_id: 5, lease: 7, current: 42 }));
    }

    #[test]
    fn a_holder_stops_at_sent_time_plus_ttl_on_the_boot_clock() {
        let r = Reckoning { sent_at_ms: 1_000, ttl_ms: 60_000 };
        assert!(r.may_issue(60_999));
        assert!(!r.may_issue(61_000), "the lease may be over: stop, even if the reply came late");
        assert_eq!(r.renew_at_ms(), 21_000);
    }

    #[test]
    fn clocks_must_agree_within_half_the_margin() {
        assert!(clocks_agree(100_000, 105_000, MARGIN));
        assert!(clocks_agree(100_000, 95_000, MARGIN));
        assert!(!clocks_agree(100_000, 105_001, MARGIN));
    }
}
