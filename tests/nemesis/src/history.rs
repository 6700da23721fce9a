//! The history: every ID a client of the nemesis received, every fault and
//! every change of the fleet, one JSON object per line (`history.jsonl`),
//! times in ms since the run started. The client processes' IDs are in
//! their own record files (`clients/*.bin`, 16 bytes per ID) beside it:
//! millions of IDs, written by processes the nemesis kills at any moment.

use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

/// How a transaction that took values ended, as its client saw it.
#[derive(Serialize, Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Committed,
    RolledBack,
    /// The connection was lost during COMMIT: it may or may not have.
    Unknown,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// Values of one scoped counter taken in one transaction.
    Counter { t: u64, lineage: String, life: u32, scope: String, values: Vec<i64>, outcome: Outcome },
    /// A range from `reserve_block` (autocommit: received means committed).
    Block { t: u64, lineage: String, life: u32, name: String, first: i64, last: i64 },
    Tickets { t: u64, lineage: String, life: u32, scope: String, values: Vec<i64> },
    Snowflakes { t: u64, source: String, ids: Vec<i64> },
    /// Sharded IDs (`sharded_id`), of any shard.
    Sharded { t: u64, source: String, ids: Vec<i64> },
    /// A counter's mark read at the end of a life (after the faults healed,
    /// or just before DROP EXTENSION).
    Mark { t: u64, lineage: String, life: u32, scope: String, mark: i64 },
    /// The extension of `lineage` was created again: a new life.
    Life { t: u64, lineage: String, life: u32 },
    /// The standby of `lineage` was promoted (its old primary is dead).
    Promoted { t: u64, lineage: String },
    /// `shard` released by `source` at `point` (an ID: its old owner's
    /// last, its next owner's floor).
    Released { t: u64, source: String, shard: u16, point: i64 },
    Fault { t: u64, kind: String, detail: String },
}

pub struct History {
    started: Instant,
    out: Mutex<std::io::BufWriter<std::fs::File>>,
    /// The highest sharded ID received of each shard, for an operator's
    /// handover point after a restore (as read from the tables).
    highest_sharded: Mutex<std::collections::HashMap<u16, i64>>,
    /// The latest timestamp (ms since the epoch) of a snowflake or sharded
    /// ID received from each source, for an operator's vouch after a
    /// restore (as decoded from the tables).
    latest_stamp_ms: Mutex<std::collections::HashMap<String, u64>>,
}

impl History {
    pub fn create(path: &Path) -> History {
        let file = std::fs::File::create(path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
        History {
            started: Instant::now(),
            out: Mutex::new(std::io::BufWriter::new(file)),
            highest_sharded: Mutex::new(Default::default()),
            latest_stamp_ms: Mutex::new(Default::default()),
        }
    }

    /// Milliseconds since the run started.
    pub fn now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    pub fn record(&self, event: Event) {
        let stamps = match &event {
            Event::Sharded { source, ids, .. } => {
                let mut highest = self.highest_sharded.lock().unwrap_or_else(|p| p.into_inner());
                for id in ids.iter().filter_map(|id| ticket_core::sharded::decompose(*id).ok().map(|p| (p.shard, *id))) {
                    let entry = highest.entry(id.0).or_insert(0);
                    *entry = (*entry).max(id.1);
                }
                Some((source, ids.iter().filter_map(|id| ticket_core::sharded::decompose(*id).ok()).map(|p| p.millis).max()))
            }
            Event::Snowflakes { source, ids, .. } => {
                Some((source, ids.iter().filter_map(|id| ticket_core::snowflake::Layout::DEFAULT.decompose(*id).ok()).map(|p| p.millis).max()))
            }
            _ => None,
        };
        if let Some((source, Some(ms))) = stamps {
            let mut latest = self.latest_stamp_ms.lock().unwrap_or_else(|p| p.into_inner());
            let entry = latest.entry(source.clone()).or_insert(0);
            *entry = (*entry).max(ms);
        }
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        serde_json::to_writer(&mut *out, &event).expect("write the history");
        out.write_all(b"\n").expect("write the history");
    }

    pub fn fault(&self, kind: &str, detail: impl Into<String>) {
        let detail = detail.into();
        eprintln!("nemesis: {:>7.1}s {kind} {detail}", self.now() as f64 / 1000.0);
        self.record(Event::Fault { t: self.now(), kind: kind.into(), detail });
    }

    /// The highest sharded ID received of `shard` (0 if none).
    pub fn highest_sharded(&self, shard: u16) -> i64 {
        self.highest_sharded.lock().unwrap_or_else(|p| p.into_inner()).get(&shard).copied().unwrap_or(0)
    }

    /// The latest stamp (ms since the epoch) of a snowflake or sharded ID
    /// received from `source` (0 if none).
    pub fn latest_stamp_ms(&self, source: &str) -> u64 {
        self.latest_stamp_ms.lock().unwrap_or_else(|p| p.into_inner()).get(source).copied().unwrap_or(0)
    }

    pub fn flush(&self) {
        self.out.lock().unwrap_or_else(|p| p.into_inner()).flush().expect("flush the history");
    }
}

/// The events of a history; a last line cut short (a run that died while
/// writing it) is dropped, any other bad line is an error.
pub fn read(path: &Path) -> Vec<Event> {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let lines: Vec<String> = std::io::BufReader::new(file).lines().map(|line| line.expect("read the history")).filter(|l| !l.is_empty()).collect();
    let last = lines.len().saturating_sub(1);
    lines
        .iter()
        .enumerate()
        .filter_map(|(i, line)| match serde_json::from_str(line) {
            Ok(event) => Some(event),
            Err(_) if i == last => None,
            Err(e) => panic!("history line {line:?}: {e}"),
        })
        .collect()
}

/// The IDs in a client's record file: (id, lease token) pairs; a record
/// cut short by a kill is dropped.
pub fn read_records(path: &Path) -> Vec<(i64, i64)> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    bytes
        .chunks_exact(16)
        .map(|r| (i64::from_le_bytes(r[..8].try_into().unwrap()), i64::from_le_bytes(r[8..].try_into().unwrap())))
        .collect()
}
