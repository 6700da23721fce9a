//! Machine-id leases (SPEC §8, §9), free of PostgreSQL: the rules the
//! registry applies and the conservative reckoning a holder keeps, shared
//! by the extension and `crates/ticket-client` once they exist.
//!
//! The rule: an id is held by one lease at a time; a holder that cannot
//! renew before its lease ends stops issuing; the registry never hands the
//! id to another holder until the old lease has fully ended plus a margin,
//! and tells the new holder the earliest timestamp it may stamp
//! (`not_before_ms`).

use crate::snowflake::{IdSpace, Layout};
use thiserror::Error;

/// Shortest and longest lease a registry grants.
pub const MIN_TTL_MS: i64 = 1_000;
pub const MAX_TTL_MS: i64 = 86_400_000;
/// The smallest margin between one holder's end and the next holder's start.
pub const MIN_MARGIN_MS: i64 = 1_000;

#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum LeaseError {
    #[error("a lease lasts from 1 second to 1 day, not {}", crate::epoch::format_duration_ms(*.ttl_ms))]
    BadTtl { ttl_ms: i64 },
    #[error("a lease lasts at most pg_ticket.lease_max_ttl ({}) on this registry, not {}", crate::epoch::format_duration_ms(*.max_ttl_ms), crate::epoch::format_duration_ms(*.ttl_ms))]
    TtlOverMax { ttl_ms: i64, max_ttl_ms: i64 },
    #[error("machine id {machine_id} was never leased by this registry")]
    NeverLeased { machine_id: u16 },
    /// The token is not the id's current lease, or the secret is not its
    /// secret: one answer for both, naming nothing of the current lease.
    #[error("lease {lease} of machine id {machine_id} is not held with that secret (superseded, or another holder's); stop issuing and lease anew")]
    NotHeld { machine_id: u16, lease: i64 },
    #[error("lease {lease} of machine id {machine_id} was granted without a secret (before pg_ticket 0.3.0); it runs to its end and is not renewed: lease anew")]
    NoSecret { machine_id: u16, lease: i64 },
    #[error("a secret is 32 hexadecimal digits, as pgticket.lease_machine_id returned it")]
    BadSecret,
    #[error("last_issued_ms {last_issued_ms} ({}) is past {}, the latest a holder of lease {lease} can have stamped (this call for a live lease, else the lease's end, plus pg_ticket.lease_margin)", crate::epoch::format_unix_ms(*.last_issued_ms), crate::epoch::format_unix_ms(*.limit_ms))]
    LastIssuedTooLate { lease: i64, last_issued_ms: i64, limit_ms: i64 },
    #[error("lease {lease} of machine id {machine_id} expired {} ago; stop issuing and lease anew", crate::epoch::format_duration_ms(*.ago_ms))]
    Expired { machine_id: u16, lease: i64, ago_ms: i64 },
    #[error("lease {lease} of machine id {machine_id} was released; lease anew")]
    Released { machine_id: u16, lease: i64 },
    #[error("lease {lease} of machine id {machine_id} was revoked; stop issuing and lease anew")]
    Revoked { machine_id: u16, lease: i64 },
    /// SPEC §17.4: the registry's server stamps this id itself (its fixed
    /// `pg_ticket.machine_id`, changed since the grant): two stampers.
    #[error("lease {lease} of machine id {machine_id} is not renewed: this registry's server now stamps machine id {machine_id} itself (pg_ticket.machine_id); stop issuing and lease anew")]
    OwnId { machine_id: u16, lease: i64 },
    /// SPEC §17.4, on the stamping side: the server's own fixed id is
    /// leased out by its registry (no token named: the caller may be any role).
    #[error("this server stamps machine id {machine_id} (pg_ticket.machine_id), which this database's lease registry has leased out until {}: snowflake_id() is refused until then (renewals of that lease are refused, so its holder stops)", crate::epoch::format_unix_ms(*.free_from_ms))]
    OwnIdLeasedOut { machine_id: u16, free_from_ms: i64 },
    /// The same, from the server's lease ledger (`ledger`): a registry in
    /// any database of this server, or of the primary it followed, leased
    /// the id out (#46 item 6).
    #[error("this server stamps machine id {machine_id} (pg_ticket.machine_id), which a lease registry of this server (in any of its databases) or of the primary it followed as a standby leased out until {}: snowflake_id() is refused until then", crate::epoch::format_unix_ms(*.until_ms))]
    OwnIdInLedger { machine_id: u16, until_ms: i64 },
    /// The id is among those such a registry may lease: after a start or a
    /// promotion, a grant of it lost in flight may be live (#46 item 6 b).
    #[error("this server stamps machine id {machine_id} (pg_ticket.machine_id), which is among the ids a lease registry of this server or of the primary it followed may lease (pg_ticket.lease_ids): after a start or a promotion, snowflake_id() is refused until {} (the longest pg_ticket.lease_max_ttl plus pg_ticket.lease_margin), when no lease of it granted before can be live", crate::epoch::format_unix_ms(*.until_ms))]
    OwnIdLeasable { machine_id: u16, until_ms: i64 },
    #[error("this registry started (a restart, a restore, a promotion, a copy, or CREATE EXTENSION) and may have forgotten leases an earlier life of it granted: it grants again from {} (in {}: the longest pg_ticket.lease_max_ttl it allowed plus pg_ticket.lease_margin, after it started serving); renewals go on", crate::epoch::format_unix_ms(*.from_ms), crate::epoch::format_duration_ms(*.wait_ms))]
    HoldOff { from_ms: i64, wait_ms: i64 },
    #[error("no machine id is free: {held} held, {cooling} within pg_ticket.lease_margin of their end{}", match .next_free_in_ms { Some(ms) => format!("; the next frees in {}", crate::epoch::format_duration_ms(*ms)), None => String::new() })]
    NoneFree { held: usize, cooling: usize, next_free_in_ms: Option<i64> },
    #[error("{text:?} is not a list of machine ids: write ranges like '0-99, 200, 300-310' within 0..{max}")]
    BadIdList { text: String, max: u16 },
}

pub fn check_ttl(ttl_ms: i64) -> Result<i64, LeaseError> {
    if (MIN_TTL_MS..=MAX_TTL_MS).contains(&ttl_ms) {
        Ok(ttl_ms)
    } else {
        Err(LeaseError::BadTtl { ttl_ms })
    }
}

/// The ids a registry may lease (`pg_ticket.lease_ids`), e.g. "0-99, 200":
/// sorted, without duplicates, within the machine ids of `layout`.
pub fn parse_id_list(text: &str, layout: Layout) -> Result<Vec<u16>, LeaseError> {
    parse_ranges(text, layout.max_machine_id())
        .filter(|ids| !ids.is_empty())
        .ok_or_else(|| LeaseError::BadIdList { text: text.to_string(), max: layout.max_machine_id() })
}

/// A list of numbers and ranges within `0..=max` ("0-99, 200"), sorted
/// and without duplicates (empty for an empty text); None if it does not
/// parse.
pub fn parse_ranges(text: &str, max: u16) -> Option<Vec<u16>> {
    let mut ids = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (from, to) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let from: u16 = from.parse().ok()?;
        let to: u16 = to.parse().ok()?;
        if from > to || to > max {
            return None;
        }
        ids.extend(from..=to);
    }
    ids.sort_unstable();
    ids.dedup();
    Some(ids)
}

/// A granted lease: what the registry answers, and what a holder keeps
/// (times in Unix ms, the registry's clock). Its `Debug` hides the secret.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub machine_id: u16,
    /// The fencing token: strictly increasing over every grant.
    pub lease: i64,
    pub not_before_ms: i64,
    pub expires_at_ms: i64,
    /// The ID space's epoch (the registry's `pg_ticket.epoch`).
    pub epoch_ms: i64,
    /// The ID space's layout (the registry's `pg_ticket.machine_bits`):
    /// the holder stamps the id in it.
    pub layout: Layout,
    /// The registry's `pg_ticket.lease_margin` (the clock skew allowance).
    pub margin_ms: i64,
    /// Whoever has it holds the lease: renew and release need it.
    pub secret: u128,
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field("machine_id", &self.machine_id)
            .field("lease", &self.lease)
            .field("not_before_ms", &self.not_before_ms)
            .field("expires_at_ms", &self.expires_at_ms)
            .field("epoch_ms", &self.epoch_ms)
            .field("machine_bits", &self.layout.machine_bits())
            .field("margin_ms", &self.margin_ms)
            .field("secret", &"…")
            .finish()
    }
}

impl Grant {
    /// The ID space the holder stamps into.
    pub fn space(&self) -> IdSpace {
        IdSpace::new(self.epoch_ms, self.layout)
    }
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
    /// The margin the lease was granted (or last renewed) under: a margin
    /// lowered since does not shorten its holder's skew allowance. None for
    /// leases granted before 0.3.0.
    pub margin_ms: Option<i64>,
}

impl LastLease {
    /// When the holder may last have stamped an ID: its lease's real end.
    pub fn end_ms(&self) -> i64 {
        match self.ended_at_ms {
            Some(ended) if !self.revoked => ended.min(self.expires_at_ms),
            _ => self.expires_at_ms,
        }
    }

    /// The larger of the lease's own margin and the registry's now.
    fn margin_ms(&self, margin_ms: i64) -> i64 {
        self.margin_ms.map_or(margin_ms, |own| own.max(margin_ms))
    }

    /// The id may be leased again from this time on.
    pub fn free_from_ms(&self, margin_ms: i64) -> i64 {
        self.end_ms() + self.margin_ms(margin_ms)
    }

    /// The earliest timestamp a new holder may stamp is after this: every
    /// earlier holder's reported stamps, and the end of their leases plus
    /// the margin (the skew allowance). A report is believed only up to
    /// that end plus the margin: no holder stamps later, and a report past
    /// it (0.3.0 took one at a renewal, then a release ended the lease)
    /// would hold the id's next holder off by as much (#31 item 6).
    pub fn not_before_ms(&self, margin_ms: i64) -> i64 {
        let free_from_ms = self.free_from_ms(margin_ms);
        self.not_before_ms.max(self.last_issued_ms.unwrap_or(i64::MIN).min(free_from_ms)).max(free_from_ms)
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
    serving_since_ms.saturating_add(max_ttl_ms).saturating_add(margin_ms)
}

/// A grant's `not_before_ms`: after every stamp an earlier holder of the id
/// may have made — the holders the registry knows (`last`; none for an id
/// never leased here) and any it may have forgotten. A registry that held
/// off (SPEC §8 rule 7) knows when those could stamp until: a forgotten
/// lease was granted or renewed before it started serving, for at most the
/// longest ttl, and its holder stamps up to its end plus the margin (half
/// for its cap, half for its clock's skew) — exactly where the hold-off
/// ended (`grants_resume_at`, recorded as the identity row's `grants_from`).
/// The hold-off alone is one margin short: the new holder's clock may run
/// up to half a margin behind the registry's, so it could stamp below the
/// hold-off's end.
pub fn grant_not_before_ms(last: Option<&LastLease>, margin_ms: i64, forgotten_stamps_until_ms: i64) -> i64 {
    last.map_or(0, |l| l.not_before_ms(margin_ms)).max(forgotten_stamps_until_ms)
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

/// How the secret a caller gave compares with the lease's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretCheck {
    Matches,
    Differs,
    /// Granted before 0.3.0, without a secret.
    NoneOnRecord,
}

/// Is the caller the holder of `lease`: the id's current lease, with its
/// secret? The same answer for a wrong token and a wrong secret, and
/// nothing about the current lease (SPEC §8 rule 9).
fn check_holder(current: Option<&CurrentLease>, machine_id: u16, lease: i64, secret: SecretCheck) -> Result<&CurrentLease, LeaseError> {
    let current = current.ok_or(LeaseError::NeverLeased { machine_id })?;
    match secret {
        _ if current.lease != lease => Err(LeaseError::NotHeld { machine_id, lease }),
        SecretCheck::Differs => Err(LeaseError::NotHeld { machine_id, lease }),
        SecretCheck::NoneOnRecord => Err(LeaseError::NoSecret { machine_id, lease }),
        SecretCheck::Matches => Ok(current),
    }
}

/// May the holder of `lease` renew it at `now_ms`? Only the id's current
/// lease, with its secret, not ended, not expired. A registry that started
/// anew (restored, promoted, copied) renews the leases it knows: their
/// holders are the only ones with the secret, and the id was not granted to
/// anyone else before they ended (SPEC §8 rule 7).
/// `own_machine_id`: the id the registry's server stamps itself, if any: a
/// lease of it is never renewed (a server restarted with its fixed id set
/// to an id it had leased out would stamp beside the holder, SPEC §17.4).
pub fn check_renewal(
    current: Option<&CurrentLease>,
    machine_id: u16,
    lease: i64,
    secret: SecretCheck,
    now_ms: i64,
    own_machine_id: Option<u16>,
) -> Result<(), LeaseError> {
    let current = check_holder(current, machine_id, lease, secret)?;
    if own_machine_id == Some(machine_id) {
        return Err(LeaseError::OwnId { machine_id, lease });
    }
    if current.revoked {
        return Err(LeaseError::Revoked { machine_id, lease });
    }
    if current.ended_at_ms.is_some() {
        return Err(LeaseError::Released { machine_id, lease });
    }
    if current.expires_at_ms <= now_ms {
        return Err(LeaseError::Expired { machine_id, lease, ago_ms: now_ms - current.expires_at_ms });
    }
    Ok(())
}

/// May the holder of `lease` release it? Its own lease with its secret, in
/// any state (a second release, or one after expiry, only records the last
/// stamp).
pub fn check_release(current: Option<&CurrentLease>, machine_id: u16, lease: i64, secret: SecretCheck) -> Result<(), LeaseError> {
    check_holder(current, machine_id, lease, secret).map(|_| ())
}

/// A renewal runs `ttl_ms` from now, but never ends a lease earlier than it
/// already ran: a holder whose reply was lost still reckons on the longer
/// one (SPEC §8 rule 9).
pub fn renewed_expiry_ms(current_expires_ms: i64, now_ms: i64, ttl_ms: i64) -> i64 {
    current_expires_ms.max(now_ms.saturating_add(ttl_ms))
}

/// A reported stamp is believed only up to the lease's end plus the margin:
/// no holder stamps later (SPEC §8 rule 10), and a later one would hold the
/// id's next holders off without end. A renewal passes the time of the
/// call as the end: a holder reports stamps it issued, not ones ahead of
/// its clock (which runs at most half the margin ahead of the registry's).
pub fn check_last_issued(lease: i64, last_issued_ms: Option<i64>, end_ms: i64, margin_ms: i64) -> Result<(), LeaseError> {
    match last_issued_ms {
        Some(last_issued_ms) if last_issued_ms > end_ms.saturating_add(margin_ms) => {
            Err(LeaseError::LastIssuedTooLate { lease, last_issued_ms, limit_ms: end_ms.saturating_add(margin_ms) })
        }
        _ => Ok(()),
    }
}

/// A lease's secret as the registry hands it out: 128 random bits as 32
/// lowercase hexadecimal digits.
pub fn secret_text(secret: u128) -> String {
    format!("{secret:032x}")
}

pub fn parse_secret(text: &str) -> Result<u128, LeaseError> {
    if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(LeaseError::BadSecret);
    }
    u128::from_str_radix(text, 16).map_err(|_| LeaseError::BadSecret)
}

/// A holder's conservative reckoning of its lease (SPEC §8 rule 10, §9),
/// from one reply of the registry:
/// - on a clock that keeps counting while the host is suspended
///   (CLOCK_BOOTTIME), from the moment the request was *sent*: a slow
///   reply, a paused process or a suspended host can only make it stop
///   early, never late;
/// - no stamp past the lease's end plus half the margin on the registry's
///   clock (through the skew measured at the reply), so the next holder,
///   who stamps only above the end plus the whole margin, never meets it;
/// - the wall clock may not step against the boot clock by more than half
///   the margin since the reply (a clock set forward, a VM paused while its
///   boot clock stood still): the skew measured then no longer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reckoning {
    /// Boot-clock ms when the (granting or renewing) request was sent.
    pub sent_at_ms: i64,
    pub ttl_ms: i64,
    /// Boot and wall clock when the reply arrived.
    pub replied_boot_ms: i64,
    pub replied_wall_ms: i64,
    /// The last stamp allowed, on this holder's wall clock.
    pub stamp_cap_ms: i64,
    /// Half the registry's margin.
    pub drift_allowed_ms: i64,
}

/// Why a holder may not stamp now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StampRefusal {
    /// The lease may be over by the holder's reckoning (or its stamps
    /// would pass its end).
    MayHaveEnded,
    /// The wall clock moved this much against the boot clock since the
    /// last reply.
    ClockStepped { drift_ms: i64 },
}

impl Reckoning {
    /// From a reply: `grant` as renewed, `skew_ms` this holder's wall clock
    /// minus the registry's as measured at the reply.
    pub fn from_reply(sent_at_ms: i64, ttl_ms: i64, replied_boot_ms: i64, replied_wall_ms: i64, grant: &Grant, skew_ms: i64) -> Self {
        Reckoning {
            sent_at_ms,
            ttl_ms,
            replied_boot_ms,
            replied_wall_ms,
            stamp_cap_ms: grant.expires_at_ms.saturating_add(grant.margin_ms / 2).saturating_add(skew_ms),
            drift_allowed_ms: grant.margin_ms / 2,
        }
    }

    /// May an ID be issued at boot-clock time `now_ms`?
    pub fn may_issue(&self, now_ms: i64) -> bool {
        now_ms < self.sent_at_ms + self.ttl_ms
    }

    /// May an ID be stamped now (`boot_ms`, `wall_ms` read together)?
    pub fn check(&self, boot_ms: i64, wall_ms: i64) -> Result<(), StampRefusal> {
        if !self.may_issue(boot_ms) || wall_ms > self.stamp_cap_ms {
            return Err(StampRefusal::MayHaveEnded);
        }
        let drift_ms = (wall_ms - self.replied_wall_ms) - (boot_ms - self.replied_boot_ms);
        if drift_ms.abs() > self.drift_allowed_ms {
            return Err(StampRefusal::ClockStepped { drift_ms });
        }
        Ok(())
    }

    /// [`check`](Self::check) for a wall-clock reading taken between two
    /// boot-clock readings: the end is checked against the later one and
    /// the drift against both, so a pause between the reads (SIGSTOP, a
    /// preemption) can hide neither a passed end nor a clock step.
    pub fn check_between(&self, boot_before_ms: i64, wall_ms: i64, boot_after_ms: i64) -> Result<(), StampRefusal> {
        self.check(boot_after_ms, wall_ms)?;
        let drift_ms = (wall_ms - self.replied_wall_ms) - (boot_before_ms - self.replied_boot_ms);
        if drift_ms.abs() > self.drift_allowed_ms {
            return Err(StampRefusal::ClockStepped { drift_ms });
        }
        Ok(())
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
        let l = Layout::DEFAULT;
        assert_eq!(parse_id_list("0-3, 7,5 , 2", l), Ok(vec![0, 1, 2, 3, 5, 7]));
        assert_eq!(parse_id_list("1023", l).unwrap(), vec![1023]);
        assert_eq!(parse_id_list("0-1023", l).unwrap().len(), 1024);
        for bad in ["", "1024", "5-3", "a-b", "-1", "0-1024"] {
            assert!(parse_id_list(bad, l).is_err(), "{bad:?}");
        }
        let twelve = Layout::new(12).unwrap();
        assert_eq!(parse_id_list("0-4095", twelve).unwrap().len(), 4096);
        assert_eq!(parse_id_list("4096", twelve), Err(LeaseError::BadIdList { text: "4096".into(), max: 4095 }));
        assert!(LeaseError::BadIdList { text: "4096".into(), max: 4095 }.to_string().contains("within 0..4095"));
    }

    fn lease(expires: i64, ended: Option<i64>, revoked: bool, last_issued: Option<i64>) -> LastLease {
        LastLease { expires_at_ms: expires, ended_at_ms: ended, revoked, last_issued_ms: last_issued, not_before_ms: 0, margin_ms: None }
    }

    #[test]
    fn a_lease_keeps_the_margin_it_was_granted_under() {
        let l = LastLease { margin_ms: Some(30_000), ..lease(100_000, None, false, None) };
        assert_eq!(l.free_from_ms(MARGIN), 130_000, "a margin lowered since does not shorten it");
        assert_eq!(l.not_before_ms(MARGIN), 130_000);
        assert_eq!(l.free_from_ms(60_000), 160_000, "a margin raised since counts");
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
        // A report past the end plus the margin is no stamp a holder made
        // (its clock runs at most half the margin ahead, and it stamps at
        // most half the margin past its reckoned end): capped (0.4.0;
        // 0.3.0 believed it, #31 item 6).
        let ahead = lease(100_000, Some(40_000), false, Some(55_000));
        assert_eq!(ahead.not_before_ms(MARGIN), 50_000);
    }

    #[test]
    fn a_revoked_lease_counts_as_running_to_its_own_expiry() {
        let l = lease(100_000, Some(40_000), true, None);
        assert_eq!(l.free_from_ms(MARGIN), 110_000, "its holder only learns at its next renewal");
    }

    #[test]
    fn a_grant_after_a_hold_off_starts_above_every_forgotten_holders_stamps() {
        // Serving since 1 000 000 with a longest ttl of 300 s: a forgotten
        // lease may run to 1 300 000 and be stamped to 1 300 000 + margin.
        let forgotten_until = grants_resume_at(1_000_000, 300_000, MARGIN);
        assert_eq!(forgotten_until, 1_310_000);
        assert_eq!(grant_not_before_ms(None, MARGIN, forgotten_until), 1_310_000, "an id never leased here too");
        let known = lease(2_000_000, None, false, None);
        assert_eq!(grant_not_before_ms(Some(&known), MARGIN, forgotten_until), 2_010_000, "a known later holder counts");
        assert_eq!(grant_not_before_ms(None, MARGIN, 0), 0, "a registry that never held off");
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
    fn only_the_current_live_lease_renews_and_only_with_its_secret() {
        use SecretCheck::*;
        let cur = CurrentLease { machine_id: 5, lease: 42, leased_at_ms: 1_000, expires_at_ms: 61_000, ended_at_ms: None, revoked: false };
        assert_eq!(check_renewal(Some(&cur), 5, 42, Matches, 60_999, None), Ok(()));
        assert_eq!(check_renewal(Some(&cur), 5, 42, Matches, 61_000, None), Err(LeaseError::Expired { machine_id: 5, lease: 42, ago_ms: 0 }));
        let not_held = Err(LeaseError::NotHeld { machine_id: 5, lease: 41 });
        assert_eq!(check_renewal(Some(&cur), 5, 41, Matches, 2_000, None), not_held);
        assert_eq!(check_renewal(Some(&cur), 5, 41, Differs, 2_000, None), not_held);
        assert_eq!(check_renewal(Some(&cur), 5, 42, Differs, 2_000, None), Err(LeaseError::NotHeld { machine_id: 5, lease: 42 }), "a wrong secret reads as a wrong token");
        assert_eq!(check_renewal(Some(&cur), 5, 42, NoneOnRecord, 2_000, None), Err(LeaseError::NoSecret { machine_id: 5, lease: 42 }));
        assert_eq!(check_renewal(None, 5, 42, Matches, 2_000, None), Err(LeaseError::NeverLeased { machine_id: 5 }));
        assert_eq!(check_renewal(Some(&cur), 5, 42, Matches, 2_000, Some(5)), Err(LeaseError::OwnId { machine_id: 5, lease: 42 }), "the server stamps 5 itself");
        assert_eq!(check_renewal(Some(&cur), 5, 42, Differs, 2_000, Some(5)), Err(LeaseError::NotHeld { machine_id: 5, lease: 42 }), "only its holder learns why");
        assert_eq!(check_renewal(Some(&cur), 5, 42, Matches, 2_000, Some(6)), Ok(()));
        let released = CurrentLease { ended_at_ms: Some(2_000), ..cur };
        assert_eq!(check_renewal(Some(&released), 5, 42, Matches, 3_000, None), Err(LeaseError::Released { machine_id: 5, lease: 42 }));
        let revoked = CurrentLease { revoked: true, ended_at_ms: Some(2_000), ..cur };
        assert_eq!(check_renewal(Some(&revoked), 5, 42, Matches, 3_000, None), Err(LeaseError::Revoked { machine_id: 5, lease: 42 }));
        assert_eq!(check_release(Some(&released), 5, 42, Matches), Ok(()), "a second release is harmless");
        assert_eq!(check_release(Some(&cur), 5, 7, Matches), Err(LeaseError::NotHeld { machine_id: 5, lease: 7 }));
        assert_eq!(check_release(Some(&cur), 5, 42, Differs), Err(LeaseError::NotHeld { machine_id: 5, lease: 42 }));
        for e in [LeaseError::NotHeld { machine_id: 5, lease: 7 }, LeaseError::NoSecret { machine_id: 5, lease: 7 }] {
            assert!(!e.to_string().contains("42"), "an error never names the current token: {e}");
        }
    }

    #[test]
    fn a_renewal_never_moves_the_expiry_earlier() {
        assert_eq!(renewed_expiry_ms(100_000, 50_000, 60_000), 110_000);
        assert_eq!(renewed_expiry_ms(100_000, 50_000, 1_000), 100_000, "a shorter ttl keeps the longer lease");
    }

    #[test]
    fn a_report_past_the_lease_end_plus_the_margin_never_holds_the_next_holder_off() {
        // 0.3.0: renewed with a report at the new expiry plus the margin,
        // then released at once: the next holder's floor lay a ttl ahead.
        let poisoned = LastLease {
            expires_at_ms: 160_000,
            ended_at_ms: Some(100_000),
            revoked: false,
            last_issued_ms: Some(170_000),
            not_before_ms: 0,
            margin_ms: Some(MARGIN),
        };
        assert_eq!(poisoned.not_before_ms(MARGIN), 100_000 + MARGIN);
        assert_eq!(grant_not_before_ms(Some(&poisoned), MARGIN, 0), 100_000 + MARGIN);
        // A report within the end plus the margin still counts.
        let honest = LastLease { last_issued_ms: Some(100_000 + MARGIN / 2), ..poisoned };
        assert_eq!(honest.not_before_ms(MARGIN), 100_000 + MARGIN);
        let earlier = LastLease { not_before_ms: 150_000, ..poisoned };
        assert_eq!(earlier.not_before_ms(MARGIN), 150_000, "earlier holders' floors carry forward");
    }

    #[test]
    fn a_reported_stamp_past_the_end_plus_the_margin_is_refused() {
        assert_eq!(check_last_issued(7, None, 100_000, MARGIN), Ok(()));
        assert_eq!(check_last_issued(7, Some(110_000), 100_000, MARGIN), Ok(()));
        assert_eq!(
            check_last_issued(7, Some(i64::MAX), 100_000, MARGIN),
            Err(LeaseError::LastIssuedTooLate { lease: 7, last_issued_ms: i64::MAX, limit_ms: 110_000 })
        );
    }

    #[test]
    fn secrets_are_32_hex_digits() {
        let s = 0x0123_4567_89ab_cdef_0011_2233_4455_6677_u128;
        assert_eq!(secret_text(s), "0123456789abcdef0011223344556677");
        assert_eq!(parse_secret(&secret_text(s)), Ok(s));
        assert_eq!(parse_secret("0123456789ABCDEF0011223344556677"), Ok(s));
        for bad in ["", "12", "0123456789abcdef001122334455667g", "+123456789abcdef0011223344556677", "0123456789abcdef00112233445566778"] {
            assert_eq!(parse_secret(bad), Err(LeaseError::BadSecret), "{bad:?}");
        }
    }

    fn grant(expires_at_ms: i64) -> Grant {
        Grant { machine_id: 1, lease: 1, not_before_ms: 0, expires_at_ms, epoch_ms: 0, layout: Layout::DEFAULT, margin_ms: MARGIN, secret: 1 }
    }

    #[test]
    fn a_holder_stops_at_sent_time_plus_ttl_on_the_boot_clock() {
        // Sent at boot 1 000, replied at boot 1 100 / wall 500 100.
        let r = Reckoning::from_reply(1_000, 60_000, 1_100, 500_100, &grant(560_000), 0);
        assert_eq!(r.check(60_999, 500_100 + 59_899), Ok(()));
        assert!(!r.may_issue(61_000));
        assert_eq!(r.check(61_000, 500_100 + 59_900), Err(StampRefusal::MayHaveEnded), "the lease may be over: stop, even if the reply came late");
        assert_eq!(r.renew_at_ms(), 21_000);
    }

    #[test]
    fn a_holder_never_stamps_past_the_end_plus_half_the_margin() {
        let r = Reckoning::from_reply(1_000, 60_000, 1_100, 500_100, &grant(520_000), 0);
        assert_eq!(r.stamp_cap_ms, 525_000);
        // This holder's clock runs 2 s ahead of the registry's: its cap too.
        let ahead = Reckoning::from_reply(1_000, 60_000, 1_100, 500_100, &grant(520_000), 2_000);
        assert_eq!(ahead.stamp_cap_ms, 527_000);
    }

    #[test]
    fn a_wall_clock_step_against_the_boot_clock_stops_stamping() {
        let r = Reckoning::from_reply(1_000, 60_000, 1_100, 500_100, &grant(560_000), 0);
        assert_eq!(r.check(11_100, 510_100), Ok(()), "both clocks moved 10 s");
        assert_eq!(r.check(11_100, 515_100), Ok(()), "5 s apart: within half the margin");
        assert_eq!(r.check(11_100, 515_101), Err(StampRefusal::ClockStepped { drift_ms: 5_001 }), "stepped forward");
        assert_eq!(r.check(11_100, 504_000), Err(StampRefusal::ClockStepped { drift_ms: -6_100 }), "stepped back");
        // A VM paused while its boot clock stood still: the wall clock moved an hour, the boot clock not.
        assert_eq!(r.check(2_100, 500_100 + 3_600_000), Err(StampRefusal::MayHaveEnded), "past the cap");
    }

    #[test]
    fn a_pause_between_the_clock_reads_hides_no_step_and_no_end() {
        let r = Reckoning::from_reply(10_000, 60_000, 10_100, 500_100, &grant(560_000), 0);
        assert_eq!(r.check_between(11_000, 501_000, 11_000), Ok(()));
        // Stepped +10 s, then paused 10 s between the wall and the second
        // boot reading: the later boot reading alone would see no drift.
        assert_eq!(r.check(21_000, 511_000), Ok(()), "the step hidden from a check of the later reading");
        assert_eq!(r.check_between(11_000, 511_000, 21_000), Err(StampRefusal::ClockStepped { drift_ms: 10_000 }));
        // Paused past the reckoned end between the reads.
        assert_eq!(r.check_between(69_000, 559_000, 70_000), Err(StampRefusal::MayHaveEnded));
    }

    #[test]
    fn an_earlier_first_boot_reading_is_never_less_strict() {
        // ClockReading::checked stands in a caller's earlier boot reading for
        // the first one of the sandwich: whatever passes with it must pass
        // with the fresh one (the true drift lies between the two ends).
        let r = Reckoning::from_reply(10_000, 60_000, 10_100, 500_100, &grant(560_000), 0);
        let mut passed_with_earlier = 0;
        for boot_after in (10_100..75_000).step_by(1_300) {
            for wall in (480_000..580_000).step_by(1_700) {
                for fresh_before in (boot_after - 9_000..=boot_after).step_by(900) {
                    let fresh = r.check_between(fresh_before, wall, boot_after);
                    for earlier in (fresh_before - 12_000..=fresh_before).step_by(1_100) {
                        if r.check_between(earlier, wall, boot_after).is_ok() {
                            passed_with_earlier += 1;
                            assert_eq!(fresh, Ok(()), "earlier {earlier}, fresh {fresh_before}, wall {wall}, after {boot_after}");
                        }
                    }
                }
            }
        }
        assert!(passed_with_earlier > 1_000, "the grid must reach readings that pass: {passed_with_earlier}");
        // An old reading refuses (idle longer than the drift allowed) where a
        // fresh one would not: the caller reads again in full.
        assert_eq!(r.check_between(17_990, 508_000, 18_000), Ok(()));
        assert!(matches!(r.check_between(1_000, 508_000, 18_000), Err(StampRefusal::ClockStepped { .. })));
    }

    #[test]
    fn clocks_must_agree_within_half_the_margin() {
        assert!(clocks_agree(100_000, 105_000, MARGIN));
        assert!(clocks_agree(100_000, 95_000, MARGIN));
        assert!(!clocks_agree(100_000, 105_001, MARGIN));
    }
}
