//! The checker: the promise, proved from the history alone (SPEC §14).
//!
//! - No snowflake twice in the whole fleet (servers, fixed and leased, and
//!   the client processes' leased generators); no sharded ID twice either
//!   (a shard handed from server to server, an old backup of its previous
//!   owner started in that server's place); no machine id stamped, and no
//!   shard issued, by two sources at once.
//! - No ticket twice per scope within a life of its lineage's extension;
//!   each lineage only its own series (odd / even), so the two never meet;
//!   after a promotion, every ticket of a scope above every one before it.
//! - A scoped counter's committed values: none twice, none above the mark
//!   read at the end of the life, every value 1..mark committed (or of a
//!   transaction whose COMMIT got no answer); after a promotion, every
//!   committed value above every one committed before it.
//! - Blocks of one name never overlap; a block pool's IDs never repeat.

use crate::history::{Event, Outcome};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

#[derive(Debug)]
pub struct Violation {
    /// What was broken ("ticket twice", "block overlap", ...), for the
    /// report's summary.
    pub kind: &'static str,
    pub what: String,
    /// When the entries involved were received (ms), for the faults around.
    pub times: Vec<u64>,
}

/// IDs from a client process's record file.
pub struct ClientIds {
    pub source: String,
    pub ids: Vec<i64>,
}

type Key = (String, u32, String); // lineage, life, scope or name

pub fn check(events: &[Event], generators: &[ClientIds], pools: &[ClientIds], series: &HashMap<String, (i64, i64)>) -> Vec<Violation> {
    let mut found = Vec::new();
    snowflakes(events, generators, &mut found);
    sharded(events, &mut found);
    machine_ids_held_once(events, generators, &mut found);
    shards_held_once(events, &mut found);
    tickets(events, series, &mut found);
    tickets_increase(events, &mut found);
    counters(events, &mut found);
    blocks(events, pools, &mut found);
    found
}

fn promotions(events: &[Event]) -> HashMap<String, Vec<u64>> {
    let mut at: HashMap<String, Vec<u64>> = HashMap::new();
    for e in events {
        if let Event::Promoted { t, lineage } = e {
            at.entry(lineage.clone()).or_default().push(*t);
        }
    }
    at
}

fn snowflakes(events: &[Event], generators: &[ClientIds], found: &mut Vec<Violation>) {
    let mut all: Vec<(i64, &str, Option<u64>)> = Vec::new();
    for e in events {
        if let Event::Snowflakes { t, source, ids } = e {
            all.extend(ids.iter().map(|id| (*id, source.as_str(), Some(*t))));
        }
    }
    for g in generators {
        all.extend(g.ids.iter().map(|id| (*id, g.source.as_str(), None)));
    }
    all.sort_unstable_by_key(|(id, _, _)| *id);
    for pair in all.windows(2) {
        let ((id, a, ta), (_, b, tb)) = (pair[0], pair[1]);
        if pair[0].0 == pair[1].0 {
            found.push(Violation {
                kind: "snowflake twice",
                what: format!("snowflake {id} twice: from {a} (at {}) and from {b} (at {})", at(ta), at(tb)),
                times: [ta, tb].into_iter().flatten().collect(),
            });
        }
    }
}

fn sharded(events: &[Event], found: &mut Vec<Violation>) {
    let mut all: Vec<(i64, &str, u64)> = Vec::new();
    for e in events {
        if let Event::Sharded { t, source, ids } = e {
            all.extend(ids.iter().map(|id| (*id, source.as_str(), *t)));
        }
    }
    all.sort_unstable_by_key(|(id, _, _)| *id);
    for pair in all.windows(2) {
        let ((id, a, ta), (_, b, tb)) = (pair[0], pair[1]);
        if pair[0].0 == pair[1].0 {
            let shard = ticket_core::sharded::decompose(id).map(|p| p.shard).unwrap_or_default();
            found.push(Violation {
                kind: "sharded ID twice",
                what: format!("sharded ID {id} (shard {shard}) twice: from {a} (at {}) and from {b} (at {})", at(Some(ta)), at(Some(tb))),
                times: vec![ta, tb],
            });
        }
    }
}

/// Two holders stamping with one machine id at once: the stamps of each
/// source (a client process's run, a lineage's server), in time order, cut
/// into runs of one machine id with no pause over `PAUSE_MS`; runs of two
/// sources with the same machine id must not share a millisecond (a new
/// holder stamps only above the old one's end plus the margin, SPEC §8).
/// This holds whether or not the two happened to make the same ID. A
/// pause ends a run because a server's history does not say which lease a
/// stamp was made under: a lineage that lost its id and leased it again
/// after another holder had it is two runs, not one spanning the other's.
/// (What this cannot see, a holder that kept its lease without stamping
/// while another stamped, makes no ID twice.)
const PAUSE_MS: u64 = 1000;

fn machine_ids_held_once(events: &[Event], generators: &[ClientIds], found: &mut Vec<Violation>) {
    let mut by_source: BTreeMap<&str, Vec<(u64, u16)>> = BTreeMap::new();
    for e in events {
        if let Event::Snowflakes { source, ids, .. } = e {
            let list = by_source.entry(source.as_str()).or_default();
            list.extend(ids.iter().filter_map(|id| ticket_core::snowflake::Layout::DEFAULT.decompose(*id).ok()).map(|p| (p.millis, p.machine_id)));
        }
    }
    for g in generators {
        let list = by_source.entry(g.source.as_str()).or_default();
        list.extend(g.ids.iter().filter_map(|id| ticket_core::snowflake::Layout::DEFAULT.decompose(*id).ok()).map(|p| (p.millis, p.machine_id)));
    }
    held_once(by_source, "machine id", true, &BTreeMap::new(), found);
}

/// The same for shards (0.4.0): two servers issuing one shard at once. A
/// handover's new owner continues above the release point, which may be
/// in the old owner's last millisecond, so only runs overlapping past a
/// shared millisecond count; and a server's run ends at each release
/// point of its shard, so a shard handed away and back within a second is
/// two runs, not one spanning the other owner's (a shard has no margin).
/// An old backup of a shard's previous owner started in its place and
/// issuing the shard beside its new owner (#30 item 1) is found here
/// whether or not the two made the same ID.
fn shards_held_once(events: &[Event], found: &mut Vec<Violation>) {
    let mut by_source: BTreeMap<&str, Vec<(u64, u16)>> = BTreeMap::new();
    let mut releases: BTreeMap<u16, BTreeSet<u64>> = BTreeMap::new();
    for e in events {
        match e {
            Event::Sharded { source, ids, .. } => {
                let list = by_source.entry(source.as_str()).or_default();
                list.extend(ids.iter().filter_map(|id| ticket_core::sharded::decompose(*id).ok()).map(|p| (p.millis, p.shard)));
            }
            Event::Released { shard, point, .. } => {
                if let Ok(p) = ticket_core::sharded::decompose(*point) {
                    releases.entry(*shard).or_default().insert(p.millis);
                }
            }
            _ => {}
        }
    }
    held_once(by_source, "shard", false, &releases, found);
}

/// Runs of (ms, holder id) per source, cut at a change of id, a pause
/// over `PAUSE_MS` or one of the id's `cuts` (ms); two sources' runs of one
/// id must not overlap (sharing an end millisecond counts only if
/// `shared_ms_counts`).
fn held_once(by_source: BTreeMap<&str, Vec<(u64, u16)>>, what: &str, shared_ms_counts: bool, cuts: &BTreeMap<u16, BTreeSet<u64>>, found: &mut Vec<Violation>) {
    let cut_between = |id: u16, from: u64, to: u64| cuts.get(&id).is_some_and(|c| c.range(from..to).next().is_some());
    // (id, first ms, last ms, source)
    let mut runs: Vec<(u16, u64, u64, &str)> = Vec::new();
    for (source, mut stamps) in by_source {
        stamps.sort_unstable();
        for (ms, id) in stamps {
            match runs.last_mut() {
                Some(run) if run.3 == source && run.0 == id && ms <= run.2 + PAUSE_MS && !cut_between(id, run.2, ms) => run.2 = ms,
                _ => runs.push((id, ms, ms, source)),
            }
        }
    }
    runs.sort_unstable();
    // Each run against the one of its id reaching furthest so far.
    let mut furthest: Option<(u16, u64, u64, &str)> = None;
    for run in runs {
        let (m, b1, b2, sb) = run;
        match furthest {
            Some((n, a1, a2, sa)) if n == m => {
                let overlap = if shared_ms_counts { b1 <= a2 } else { b1 < a2 };
                if overlap && sa != sb {
                    found.push(Violation {
                        kind: if shared_ms_counts { "machine id held twice at once" } else { "shard held twice at once" },
                        what: format!("{what} {m}: {sa} stamped {a1}-{a2} ms and {sb} stamped {b1}-{b2} ms (since the epoch)"),
                        times: vec![],
                    });
                }
                if b2 > a2 {
                    furthest = Some(run);
                }
            }
            _ => furthest = Some(run),
        }
    }
}

/// Tickets of one scope come from one client thread per lineage: within a
/// life each is above the one before (a scope's tickets only increase on a
/// server, and a promoted standby continues above). 0.2.0 served a dropped
/// extension's cached tickets in the new one, then the new table's.
fn tickets_increase(events: &[Event], found: &mut Vec<Violation>) {
    let mut last: HashMap<Key, (i64, u64)> = HashMap::new();
    for e in events {
        if let Event::Tickets { t, lineage, life, scope, values } = e {
            let key = (lineage.clone(), *life, scope.clone());
            for v in values {
                if let Some(&(before, t_before)) = last.get(&key) {
                    if *v <= before {
                        found.push(Violation {
                            kind: "ticket not above the one before",
                            what: format!("ticket of ({lineage}, life {life}, {scope}): {v} (at {}) after {before} (at {})", at(Some(*t)), at(Some(t_before))),
                            times: vec![t_before, *t],
                        });
                    }
                }
                last.insert(key.clone(), (*v, *t));
            }
        }
    }
}

fn at(t: Option<u64>) -> String {
    t.map_or("a time the process did not record".into(), |t| format!("{:.3} s", t as f64 / 1000.0))
}

fn tickets(events: &[Event], series: &HashMap<String, (i64, i64)>, found: &mut Vec<Violation>) {
    let mut by_scope: BTreeMap<Key, Vec<(i64, u64)>> = BTreeMap::new();
    for e in events {
        if let Event::Tickets { t, lineage, life, scope, values } = e {
            let list = by_scope.entry((lineage.clone(), *life, scope.clone())).or_default();
            list.extend(values.iter().map(|v| (*v, *t)));
            if let Some((offset, increment)) = series.get(lineage) {
                for v in values.iter().filter(|v| (*v - offset).rem_euclid(*increment) != 0) {
                    found.push(Violation {
                        kind: "ticket of another series",
                        what: format!("ticket {v} of ({lineage}, {scope}) is not of its series (offset {offset}, increment {increment})"),
                        times: vec![*t],
                    });
                }
            }
        }
    }
    let promoted = promotions(events);
    for ((lineage, life, scope), values) in &by_scope {
        duplicates(values, "ticket twice", &format!("ticket of ({lineage}, life {life}, {scope})"), found);
        for &p in promoted.get(lineage).into_iter().flatten() {
            above_after(values, p, "ticket not above a failover", &format!("ticket of ({lineage}, life {life}, {scope})"), found);
        }
    }
}

fn duplicates(values: &[(i64, u64)], kind: &'static str, what: &str, found: &mut Vec<Violation>) {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    for pair in sorted.windows(2) {
        if pair[0].0 == pair[1].0 {
            found.push(Violation {
                kind,
                what: format!("{what}: {} twice (at {} and {})", pair[0].0, at(Some(pair[0].1)), at(Some(pair[1].1))),
                times: vec![pair[0].1, pair[1].1],
            });
        }
    }
}

/// Everything received after the promotion at `p` above everything before.
fn above_after(values: &[(i64, u64)], p: u64, kind: &'static str, what: &str, found: &mut Vec<Violation>) {
    let before = values.iter().filter(|(_, t)| *t < p).max_by_key(|(v, _)| *v);
    let after = values.iter().filter(|(_, t)| *t > p).min_by_key(|(v, _)| *v);
    if let (Some(&(high, t_high)), Some(&(low, t_low))) = (before, after) {
        if low <= high {
            found.push(Violation {
                kind,
                what: format!("{what}: {low} after the promotion at {} is not above {high} before it", at(Some(p))),
                times: vec![t_high, p, t_low],
            });
        }
    }
}

fn counters(events: &[Event], found: &mut Vec<Violation>) {
    let mut committed: BTreeMap<Key, Vec<(i64, u64)>> = BTreeMap::new();
    let mut unknown: HashMap<Key, HashSet<i64>> = HashMap::new();
    let mut marks: HashMap<Key, (i64, u64)> = HashMap::new();
    for e in events {
        match e {
            Event::Counter { t, lineage, life, scope, values, outcome } => {
                let key = (lineage.clone(), *life, scope.clone());
                match outcome {
                    Outcome::Committed => committed.entry(key).or_default().extend(values.iter().map(|v| (*v, *t))),
                    Outcome::Unknown => unknown.entry(key).or_default().extend(values),
                    Outcome::RolledBack => {}
                }
            }
            Event::Mark { t, lineage, life, scope, mark } => {
                marks.insert((lineage.clone(), *life, scope.clone()), (*mark, *t));
            }
            _ => {}
        }
    }
    let promoted = promotions(events);
    let none = HashSet::new();
    for (key, values) in &committed {
        let (lineage, life, scope) = key;
        let what = format!("scoped counter ({lineage}, life {life}, {scope})");
        duplicates(values, "counter value committed twice", &what, found);
        for &p in promoted.get(lineage).into_iter().flatten() {
            above_after(values, p, "counter not above a failover", &what, found);
        }
        let Some(&(mark, t_mark)) = marks.get(key) else { continue };
        let maybe = unknown.get(key).unwrap_or(&none);
        let kept: HashSet<i64> = values.iter().map(|(v, _)| *v).collect();
        if let Some(&(v, t)) = values.iter().find(|(v, _)| *v > mark || *v < 1) {
            found.push(Violation { kind: "counter value outside 1..mark", what: format!("{what}: committed {v} is outside 1..{mark} (the mark at the end)"), times: vec![t, t_mark] });
        }
        let gaps: Vec<i64> = (1..=mark).filter(|v| !kept.contains(v) && !maybe.contains(v)).collect();
        if !gaps.is_empty() {
            found.push(Violation {
                kind: "counter gap",
                what: format!("{what}: {} value(s) of 1..{mark} never committed (a gap), first {:?}", gaps.len(), &gaps[..gaps.len().min(5)]),
                times: vec![t_mark],
            });
        }
    }
}

fn blocks(events: &[Event], pools: &[ClientIds], found: &mut Vec<Violation>) {
    let mut by_name: BTreeMap<Key, Vec<(i64, i64, u64)>> = BTreeMap::new();
    for e in events {
        if let Event::Block { t, lineage, life, name, first, last } = e {
            by_name.entry((lineage.clone(), *life, name.clone())).or_default().push((*first, *last, *t));
        }
    }
    for ((lineage, life, name), mut ranges) in by_name {
        ranges.sort_unstable();
        for pair in ranges.windows(2) {
            let ((a1, a2, ta), (b1, b2, tb)) = (pair[0], pair[1]);
            if b1 <= a2 {
                found.push(Violation {
                    kind: "blocks overlapping",
                    what: format!("block ({lineage}, life {life}, {name}): {a1}-{a2} (at {}) and {b1}-{b2} (at {}) overlap", at(Some(ta)), at(Some(tb))),
                    times: vec![ta, tb],
                });
            }
        }
    }
    let mut ids: Vec<(i64, &str)> = pools.iter().flat_map(|p| p.ids.iter().map(|id| (*id, p.source.as_str()))).collect();
    ids.sort_unstable();
    for pair in ids.windows(2) {
        if pair[0].0 == pair[1].0 {
            found.push(Violation { kind: "block pool ID twice", what: format!("block pool ID {} twice: from {} and {}", pair[0].0, pair[0].1, pair[1].1), times: vec![] });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter(t: u64, values: &[i64], outcome: Outcome) -> Event {
        Event::Counter { t, lineage: "p1".into(), life: 0, scope: "d".into(), values: values.to_vec(), outcome }
    }
    fn mark(mark: i64) -> Event {
        Event::Mark { t: 99, lineage: "p1".into(), life: 0, scope: "d".into(), mark }
    }
    fn series() -> HashMap<String, (i64, i64)> {
        HashMap::from([("p1".to_string(), (1, 2)), ("p2".to_string(), (2, 2))])
    }
    fn run(events: &[Event]) -> Vec<String> {
        check(events, &[], &[], &series()).into_iter().map(|v| v.what).collect()
    }

    #[test]
    fn a_gap_free_history_passes_and_each_kind_of_break_is_caught() {
        let good = [counter(1, &[1], Outcome::Committed), counter(2, &[2], Outcome::RolledBack), counter(3, &[2, 3], Outcome::Committed), mark(3)];
        assert!(run(&good).is_empty(), "{:?}", run(&good));
        let unknown = [counter(1, &[1], Outcome::Unknown), counter(3, &[2], Outcome::Committed), mark(2)];
        assert!(run(&unknown).is_empty(), "an unanswered COMMIT may have committed");
        let twice = [counter(1, &[1], Outcome::Committed), counter(2, &[1], Outcome::Committed), mark(1)];
        assert!(run(&twice)[0].contains("1 twice"), "{:?}", run(&twice));
        let gap = [counter(1, &[1], Outcome::Committed), counter(2, &[2], Outcome::RolledBack), mark(2)];
        assert!(run(&gap)[0].contains("gap"), "{:?}", run(&gap));
        let above = [counter(1, &[1, 2], Outcome::Committed), mark(1)];
        assert!(run(&above)[0].contains("outside 1..1"), "{:?}", run(&above));
        let promoted = [
            counter(1, &[5], Outcome::Committed),
            Event::Promoted { t: 10, lineage: "p1".into() },
            counter(11, &[4], Outcome::Committed),
        ];
        assert!(run(&promoted).iter().any(|v| v.contains("not above 5")), "{:?}", run(&promoted));
    }

    #[test]
    fn tickets_snowflakes_and_blocks() {
        let tickets = |lineage: &str, life, values: &[i64]| Event::Tickets { t: 1, lineage: lineage.into(), life, scope: "s".into(), values: values.to_vec() };
        assert!(run(&[tickets("p1", 0, &[1, 3]), tickets("p2", 0, &[2, 4]), tickets("p2", 1, &[2])]).is_empty());
        assert!(run(&[tickets("p1", 0, &[1, 3, 3])])[0].contains("3 twice"));
        assert!(run(&[tickets("p2", 0, &[3])])[0].contains("not of its series"));
        let flakes = Event::Snowflakes { t: 5, source: "p2".into(), ids: vec![10, 11] };
        let generator = ClientIds { source: "gen-1-0".into(), ids: vec![12, 11] };
        let v = check(&[flakes], &[generator], &[], &series());
        assert!(v[0].what.contains("snowflake 11 twice"), "{v:?}");
        let sharded = |source: &str, ids: &[i64]| Event::Sharded { t: 3, source: source.into(), ids: ids.to_vec() };
        let shard_3 = |ms: i64, seq: i64| (ms << 22) | (3 << 10) | seq;
        assert!(run(&[sharded("p2", &[shard_3(5, 0), shard_3(5, 1)]), sharded("r", &[shard_3(6, 0)])]).is_empty());
        assert!(run(&[sharded("p2", &[shard_3(5, 0)]), sharded("r", &[shard_3(5, 0)])])[0].contains("(shard 3) twice"));
        let block = |first, last| Event::Block { t: 1, lineage: "p2".into(), life: 0, name: "b".into(), first, last };
        assert!(run(&[block(1, 10), block(11, 20)]).is_empty());
        assert!(run(&[block(1, 10), block(10, 20)])[0].contains("overlap"));
    }

    #[test]
    fn a_machine_id_stamped_by_two_holders_at_once_and_a_ticket_falling_back_are_caught() {
        let id = |ms: i64, machine: i64, seq: i64| (ms << 22) | (machine << 12) | seq;
        let kinds = |events: &[Event], gens: &[ClientIds]| -> Vec<&'static str> { check(events, gens, &[], &series()).into_iter().map(|v| v.kind).collect() };
        // One after the other (the second above the first's end): fine; the
        // same holder again later: fine.
        let a = ClientIds { source: "gen-0-1".into(), ids: vec![id(100, 7, 0), id(200, 7, 0)] };
        let b = ClientIds { source: "gen-1-1".into(), ids: vec![id(201, 7, 0), id(300, 7, 5)] };
        let p1 = Event::Snowflakes { t: 1, source: "p1".into(), ids: vec![id(150, 8, 0), id(400, 7, 0)] };
        assert!(kinds(std::slice::from_ref(&p1), &[a, b]).is_empty());
        // A lineage stamping id 3, pausing while a generator has it, then
        // stamping it again under a new lease: no overlap.
        let again = Event::Snowflakes { t: 2, source: "p1".into(), ids: vec![id(10_000, 3, 0), id(10_500, 3, 0), id(20_000, 3, 0)] };
        let between = ClientIds { source: "gen-0-9".into(), ids: vec![id(12_000, 3, 0), id(15_000, 3, 0)] };
        assert!(kinds(&[again], &[between]).is_empty());
        // Overlapping in time with the same machine id, no ID in common.
        let long = ClientIds { source: "gen-0-2".into(), ids: (0..=8).map(|i| id(1000 + 500 * i, 9, 0)).collect() };
        let short = ClientIds { source: "gen-1-2".into(), ids: vec![id(1100, 9, 1)] };
        let late = ClientIds { source: "gen-2-2".into(), ids: vec![id(3000, 9, 2)] };
        assert_eq!(kinds(&[], &[long, short, late]), ["machine id held twice at once", "machine id held twice at once"]);

        // A shard handed over: the new owner from the release's millisecond
        // on is fine; an old backup of the previous owner issuing it beside
        // the new owner is caught, with no ID in common.
        let sharded = |ms: u64, shard: u16, sequence: u16| ticket_core::sharded::compose(ticket_core::sharded::ShardedParts { millis: ms, shard, sequence });
        let on = |source: &str, ids: Vec<i64>| Event::Sharded { t: 1, source: source.into(), ids };
        let handed = [on("p2", vec![sharded(100, 3, 0), sharded(200, 3, 4)]), on("r", vec![sharded(200, 3, 5), sharded(900, 3, 0)]), on("p2", vec![sharded(150, 1, 0)])];
        assert!(kinds(&handed, &[]).is_empty());
        let beside = [on("r", vec![sharded(1000, 3, 0), sharded(1800, 3, 0)]), on("p2", vec![sharded(1400, 3, 1)])];
        assert_eq!(kinds(&beside, &[]), ["shard held twice at once"]);
        // Handed away and back within a second: two runs of p2, cut at the
        // release points, around r's.
        let released = |source: &str, ms: u64| Event::Released { t: 1, source: source.into(), shard: 3, point: sharded(ms, 3, 9) };
        let round_trip = [
            on("p2", vec![sharded(5000, 3, 0), sharded(5100, 3, 9)]),
            released("p2", 5100),
            on("r", vec![sharded(5100, 3, 10), sharded(5400, 3, 9)]),
            released("r", 5400),
            on("p2", vec![sharded(5400, 3, 10), sharded(5600, 3, 0)]),
        ];
        assert!(kinds(&round_trip, &[]).is_empty());
        assert_eq!(kinds(&round_trip[..1].iter().chain(&round_trip[2..3]).chain(&round_trip[4..]).cloned().collect::<Vec<_>>(), &[]), ["shard held twice at once"], "without the release points, one run of p2 spans r's");

        let tickets = |life, values: &[i64]| Event::Tickets { t: 1, lineage: "p2".into(), life, scope: "s".into(), values: values.to_vec() };
        assert!(kinds(&[tickets(0, &[2, 4]), tickets(0, &[8]), tickets(1, &[2])], &[]).is_empty(), "a new life starts over");
        assert_eq!(kinds(&[tickets(1, &[40, 42]), tickets(1, &[2])], &[]), ["ticket not above the one before"], "an old life's cache, then the new table");
    }
}
