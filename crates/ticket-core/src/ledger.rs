//! The lease ledger: what a server's registries (any database of it) have
//! leased out, kept per server beside the snowflake mark and carried in
//! its WAL, so that the server's own fixed machine id is checked against
//! every registry of the server and of its timeline, in every database
//! (SPEC §17.4, #46 item 6), and a promoted registry holds off for the
//! longest ttl its primary allowed (item 6 c).
//!
//! One line per fact, the same text in the file and in the WAL record
//! that carries it (a standby replays the record into its own file):
//!
//! - `lease <id> <free_from_ms>`: a holder of `id` may stamp until
//!   `free_from_ms` (its lease's end plus the margin, written ahead by
//!   the lease's ttl, so that a holder renewing every third of it writes
//!   one line per ttl). Never lowered.
//! - `registry <max_ttl_ms> <margin_ms> <ids>`: a registry of this server
//!   (or of its primary, replayed) may grant leases of `ids` up to
//!   `max_ttl_ms`, ended `margin_ms` before the next; the ttl and margin
//!   are the longest ever recorded, the ids every one ever recorded (and
//!   every id of a `lease` line).
//!
//! A server stamping fixed id `own` refuses while a `lease` of it is
//! live, and, after a promotion, for the longest ttl plus
//! margin when `own` is among the registry's ids: a grant of it lost in
//! flight (an asynchronous standby promoted) is over by then, and no
//! renewal extends it (a registry never renews its server's own id).

use crate::leases::parse_ranges;
use std::collections::BTreeMap;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    /// Per id, until when a holder may stamp with it (Unix ms).
    pub free_from_ms: BTreeMap<u16, i64>,
    pub max_ttl_ms: i64,
    pub margin_ms: i64,
    /// Every id a registry of this timeline could lease or leased (sorted).
    pub leasable: Vec<u16>,
}

/// A fact to record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Line {
    Lease { id: u16, free_from_ms: i64 },
    Registry { max_ttl_ms: i64, margin_ms: i64, ids: Vec<u16> },
}

impl Line {
    pub fn text(&self) -> String {
        match self {
            Line::Lease { id, free_from_ms } => format!("lease {id} {free_from_ms}"),
            Line::Registry { max_ttl_ms, margin_ms, ids } => format!("registry {max_ttl_ms} {margin_ms} {}", format_ranges(ids)),
        }
    }

    pub fn parse(text: &str) -> Result<Line, String> {
        let bad = || format!("not a lease ledger line: {text:?}");
        let mut words = text.split(' ');
        let line = match words.next() {
            Some("lease") => Line::Lease {
                id: words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?,
                free_from_ms: words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?,
            },
            // A ttl or margin beyond what a setting can be is no registry's
            // (review: a hand-edited one held every grant off for ever).
            Some("registry") => Line::Registry {
                max_ttl_ms: words.next().and_then(|w| w.parse().ok()).filter(|v| (0..=crate::leases::MAX_TTL_MS).contains(v)).ok_or_else(bad)?,
                margin_ms: words.next().and_then(|w| w.parse().ok()).filter(|v| (0..=crate::leases::MAX_TTL_MS).contains(v)).ok_or_else(bad)?,
                ids: parse_ranges(words.next().unwrap_or(""), u16::MAX).ok_or_else(bad)?,
            },
            _ => return Err(bad()),
        };
        if words.next().is_some() {
            return Err(bad());
        }
        Ok(line)
    }
}

impl Ledger {
    pub fn parse(text: &str) -> Result<Ledger, String> {
        let mut ledger = Ledger::default();
        for line in text.lines().filter(|l| !l.is_empty()) {
            ledger.apply(&Line::parse(line)?);
        }
        Ok(ledger)
    }

    /// The lines that parse, and the ones that do not: each line is a fact
    /// of its own, so a damaged line loses that fact only (a standby's
    /// replay keeps the rest and says which it dropped).
    pub fn parse_lenient(text: &str) -> (Ledger, Vec<String>) {
        let mut ledger = Ledger::default();
        let mut damaged = Vec::new();
        for line in text.lines().filter(|l| !l.is_empty()) {
            match Line::parse(line) {
                Ok(fact) => {
                    ledger.apply(&fact);
                }
                Err(_) => damaged.push(line.to_string()),
            }
        }
        (ledger, damaged)
    }

    pub fn text(&self) -> String {
        let mut out = Line::Registry { max_ttl_ms: self.max_ttl_ms, margin_ms: self.margin_ms, ids: self.leasable.clone() }.text();
        out.push('\n');
        for (&id, &free_from_ms) in &self.free_from_ms {
            out.push_str(&Line::Lease { id, free_from_ms }.text());
            out.push('\n');
        }
        out
    }

    /// Takes a fact in; true if the ledger changed. A lease's end and the
    /// longest ttl and margin never go back (a replayed record older than
    /// the file changes nothing).
    pub fn apply(&mut self, line: &Line) -> bool {
        let before = self.clone();
        match line {
            Line::Lease { id, free_from_ms } => {
                let entry = self.free_from_ms.entry(*id).or_insert(i64::MIN);
                *entry = (*entry).max(*free_from_ms);
                self.take_leasable(&[*id]);
            }
            Line::Registry { max_ttl_ms, margin_ms, ids } => {
                self.max_ttl_ms = self.max_ttl_ms.max(*max_ttl_ms);
                self.margin_ms = self.margin_ms.max(*margin_ms);
                self.take_leasable(ids);
            }
        }
        *self != before
    }

    /// Ids only join the leasable ones, never leave (review of #46: a
    /// renewal under a narrower `lease_ids` rewrote the list, and a promoted
    /// standby's own id, leased in flight before, stamped at once): an id
    /// that was leasable once, or leased, may have a grant or renewal lost
    /// in flight at a promotion.
    fn take_leasable(&mut self, ids: &[u16]) {
        if ids.iter().all(|id| self.leasable.binary_search(id).is_ok()) {
            return;
        }
        self.leasable.extend_from_slice(ids);
        self.leasable.sort_unstable();
        self.leasable.dedup();
    }

    /// The line to record before a lease of `id` that a holder may use
    /// until `free_from_ms`, if the ledger does not cover it yet: written
    /// `ahead_ms` further (the lease's ttl), so the renewals of the next
    /// ttl write nothing; the server's own id, should it become this one,
    /// waits for that much longer.
    pub fn lease_to_record(&self, id: u16, free_from_ms: i64, ahead_ms: i64) -> Option<Line> {
        let recorded = self.free_from_ms.get(&id).copied().unwrap_or(i64::MIN);
        (recorded < free_from_ms).then(|| Line::Lease { id, free_from_ms: free_from_ms.saturating_add(ahead_ms) })
    }

    /// The line to record before granting with these settings, if the
    /// ledger does not say as much yet.
    pub fn registry_to_record(&self, max_ttl_ms: i64, margin_ms: i64, ids: &[u16]) -> Option<Line> {
        (self.max_ttl_ms < max_ttl_ms || self.margin_ms < margin_ms || !ids.iter().all(|id| self.leasable.binary_search(id).is_ok()))
            .then(|| Line::Registry { max_ttl_ms, margin_ms, ids: ids.to_vec() })
    }

    /// Until when (Unix ms) a server stamping fixed id `own` must not,
    /// having started or been promoted at `began_ms`; None if it may.
    pub fn own_id_refused_until(&self, own: u16, began_ms: i64, now_ms: i64) -> Option<OwnIdRefusal> {
        let leased = self.free_from_ms.get(&own).copied().filter(|t| *t > now_ms);
        let in_flight = self
            .leasable
            .binary_search(&own)
            .is_ok()
            .then(|| began_ms.saturating_add(self.max_ttl_ms).saturating_add(self.margin_ms))
            .filter(|t| *t > now_ms);
        match (leased, in_flight) {
            (Some(until_ms), _) => Some(OwnIdRefusal::Leased { until_ms: until_ms.max(in_flight.unwrap_or(i64::MIN)) }),
            (None, Some(until_ms)) => Some(OwnIdRefusal::Leasable { until_ms }),
            (None, None) => None,
        }
    }
}

/// Why a server's own fixed id is refused, and until when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnIdRefusal {
    /// A lease of it is recorded.
    Leased { until_ms: i64 },
    /// It is among the ids a registry of this server or of its primary may
    /// lease: a grant lost in flight may be live.
    Leasable { until_ms: i64 },
}

/// "0-99,200" for a sorted list of ids.
pub fn format_ranges(ids: &[u16]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let start = ids[i];
        let mut end = start;
        while i + 1 < ids.len() && ids[i + 1] == end + 1 {
            i += 1;
            end = ids[i];
        }
        parts.push(if start == end { start.to_string() } else { format!("{start}-{end}") });
        i += 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_the_file_read_back_as_written() {
        let mut ledger = Ledger::default();
        assert!(ledger.apply(&Line::Registry { max_ttl_ms: 30_000, margin_ms: 10_000, ids: vec![0, 1, 2, 5, 7, 8] }));
        assert!(ledger.apply(&Line::Lease { id: 5, free_from_ms: 1_000 }));
        assert_eq!(ledger.text(), "registry 30000 10000 0-2,5,7-8\nlease 5 1000\n");
        assert_eq!(Ledger::parse(&ledger.text()).unwrap(), ledger);
        for bad in ["lease 5", "lease x 1", "registry 1 2 3-1", "lease 1 2 3", "mark 1"] {
            assert!(Line::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_lease_end_the_longest_ttl_and_the_leasable_ids_never_go_back() {
        let mut ledger = Ledger::default();
        ledger.apply(&Line::Lease { id: 3, free_from_ms: 5_000 });
        assert!(!ledger.apply(&Line::Lease { id: 3, free_from_ms: 4_000 }), "an older record replayed");
        assert_eq!(ledger.free_from_ms[&3], 5_000);
        ledger.apply(&Line::Registry { max_ttl_ms: 30_000, margin_ms: 10_000, ids: vec![1, 2, 5] });
        ledger.apply(&Line::Registry { max_ttl_ms: 2_000, margin_ms: 1_000, ids: vec![1] });
        assert_eq!((ledger.max_ttl_ms, ledger.margin_ms, ledger.leasable.clone()), (30_000, 10_000, vec![1, 2, 3, 5]), "ids only join");
        assert_eq!(ledger.registry_to_record(30_000, 10_000, &[1, 2]), None, "a narrower list says nothing new");
        for bad in ["registry 86400001 0 1", "registry 1 -1 1", "registry 9223372036854775807 1 1"] {
            assert!(Line::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_lease_is_recorded_ahead_and_only_when_the_ledger_falls_short() {
        let mut ledger = Ledger::default();
        let line = ledger.lease_to_record(4, 10_000, 3_000).unwrap();
        assert_eq!(line, Line::Lease { id: 4, free_from_ms: 13_000 });
        ledger.apply(&line);
        assert_eq!(ledger.lease_to_record(4, 13_000, 3_000), None, "renewals within the ahead write nothing");
        assert!(ledger.lease_to_record(4, 13_001, 3_000).is_some());
        assert!(ledger.registry_to_record(30_000, 10_000, &[1]).is_some());
        ledger.apply(&ledger.registry_to_record(30_000, 10_000, &[1]).unwrap());
        assert_eq!(ledger.registry_to_record(30_000, 10_000, &[1]), None);
        assert_eq!(ledger.registry_to_record(20_000, 5_000, &[1]), None, "lower settings are covered");
        assert!(ledger.registry_to_record(30_000, 10_000, &[1, 2]).is_some(), "other ids");
    }

    #[test]
    fn an_own_id_is_refused_while_leased_and_after_a_start_while_leasable() {
        let mut ledger = Ledger::default();
        ledger.apply(&Line::Registry { max_ttl_ms: 30_000, margin_ms: 10_000, ids: vec![1, 2] });
        ledger.apply(&Line::Lease { id: 7, free_from_ms: 100_000 });
        // Leased (whether or not still leasable): until the lease's end.
        assert_eq!(ledger.own_id_refused_until(7, 0, 50_000), Some(OwnIdRefusal::Leased { until_ms: 100_000 }));
        assert_eq!(ledger.own_id_refused_until(7, 0, 100_000), None);
        // Leasable: the longest ttl plus the margin after the start.
        assert_eq!(ledger.own_id_refused_until(2, 1_000, 1_000), Some(OwnIdRefusal::Leasable { until_ms: 41_000 }));
        assert_eq!(ledger.own_id_refused_until(2, 1_000, 41_000), None);
        // Both: the later.
        ledger.apply(&Line::Lease { id: 2, free_from_ms: 20_000 });
        assert_eq!(ledger.own_id_refused_until(2, 1_000, 10_000), Some(OwnIdRefusal::Leased { until_ms: 41_000 }));
        // Neither.
        assert_eq!(ledger.own_id_refused_until(9, 1_000, 1_000), None);
    }

    #[test]
    fn a_damaged_line_loses_its_own_fact_only() {
        let (ledger, damaged) = Ledger::parse_lenient("registry 30000 10000 1-3\nlease 2 5\u{0}00\nlease 3 9000\n\ngarbage\n");
        assert_eq!(damaged, vec!["lease 2 5\u{0}00".to_string(), "garbage".to_string()]);
        assert_eq!(ledger.free_from_ms.get(&3), Some(&9_000));
        assert_eq!(ledger.free_from_ms.get(&2), None);
        assert_eq!((ledger.max_ttl_ms, ledger.leasable.clone()), (30_000, vec![1, 2, 3]));
        assert!(Ledger::parse("lease 3 9000\ngarbage").is_err(), "the strict reader refuses");
        assert_eq!(Ledger::parse_lenient(&ledger.text()), (ledger, vec![]));
    }

    #[test]
    fn ranges_are_written_compactly() {
        assert_eq!(format_ranges(&[]), "");
        assert_eq!(format_ranges(&[0]), "0");
        assert_eq!(format_ranges(&[0, 1, 2, 4, 6, 7]), "0-2,4,6-7");
        assert_eq!(parse_ranges(&format_ranges(&[0, 1, 2, 4, 6, 7]), u16::MAX).unwrap(), vec![0, 1, 2, 4, 6, 7]);
    }
}
