//! SQL clients: per lineage, threads drawing from every allocator as fast
//! as the fleet lets them, each ID recorded as received (counter values
//! with how their transaction ended). A lost connection is reconnected
//! (to whichever server is the lineage's primary now); a refusal is
//! recorded by nobody and retried.

use crate::history::{Event, History, Outcome};
use postgres::{Client, NoTls};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

pub const COUNTER_SCOPES: usize = 6;
pub const TICKET_SCOPES: usize = 4;
/// Logical shards 0..SHARDS: p2 owns them, but shard 3 moves between p2
/// and the registry's server (`faults::World::shard_handover`).
pub const SHARDS: i32 = 4;

pub struct Lineage {
    pub name: &'static str,
    pub dsn: String,
    /// Which life of the extension the lineage is in (DROP/CREATE EXTENSION).
    pub life: AtomicU32,
    /// Held (read) by every counter, block and ticket operation; the
    /// nemesis sets `pause` and takes it (write) to change the extension or
    /// the database between operations.
    pub gate: RwLock<()>,
    pub pause: AtomicBool,
    /// IDs received, for the report.
    pub received: AtomicU64,
    /// What its clients draw.
    pub kinds: &'static [Kind],
}

#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Counter,
    Block,
    Ticket,
    Snowflake,
    Sharded,
}

/// A primary's clients: every allocator.
impl Kind {
    /// Its values are rows of the database (they go where a restore takes it).
    fn is_transactional(self) -> bool {
        matches!(self, Kind::Counter | Kind::Block | Kind::Ticket)
    }
}

pub const EVERY_KIND: &[Kind] = &[Kind::Counter, Kind::Counter, Kind::Block, Kind::Ticket, Kind::Snowflake, Kind::Sharded];
/// The registry's server: its own snowflakes (machine 999, or the id a
/// reconfiguration gave it) and the shard it may be handed.
pub const REGISTRY_KINDS: &[Kind] = &[Kind::Snowflake, Kind::Sharded];

pub fn spawn(lineages: &[Arc<Lineage>], history: &Arc<History>, stop: &Arc<AtomicBool>, seed: u64) -> Vec<JoinHandle<()>> {
    let mut threads = Vec::new();
    for (l, lineage) in lineages.iter().enumerate() {
        for (k, kind) in lineage.kinds.iter().enumerate() {
            let (lineage, history, stop, kind) = (lineage.clone(), history.clone(), stop.clone(), *kind);
            let rng = StdRng::seed_from_u64(seed ^ ((l as u64) << 32 | k as u64));
            threads.push(std::thread::spawn(move || run(&lineage, &history, &stop, kind, rng)));
        }
    }
    threads
}

/// A client connection and whether the server sent a WARNING since
/// `warned` was last taken. PostgreSQL answers a commit whose wait for the
/// synchronous standby was cancelled (`pg_cancel_backend`, which the
/// nemesis does) with a WARNING and success, the commit local only: such
/// an outcome is unknown, as PostgreSQL says ("might not have been
/// replicated"), not a commit.
struct Conn {
    client: Client,
    warning: Arc<AtomicBool>,
}

impl Conn {
    fn warned(&self) -> bool {
        self.warning.swap(false, Ordering::SeqCst)
    }
}

fn connect(dsn: &str) -> Option<Conn> {
    let mut config: postgres::Config = format!("{dsn} application_name=nemesis options='-c statement_timeout=20000'").parse().ok()?;
    let warning = Arc::new(AtomicBool::new(false));
    let flag = warning.clone();
    config.notice_callback(move |notice| {
        if notice.parsed_severity() == Some(postgres::error::Severity::Warning) && *notice.code() == postgres::error::SqlState::WARNING {
            flag.store(true, Ordering::SeqCst);
        }
    });
    Some(Conn { client: config.connect(NoTls).ok()?, warning })
}

fn run(lineage: &Lineage, history: &History, stop: &AtomicBool, kind: Kind, mut rng: StdRng) {
    let mut conn: Option<Conn> = None;
    while !stop.load(Ordering::SeqCst) {
        if conn.as_ref().is_none_or(|c| c.client.is_closed()) {
            conn = connect(&lineage.dsn);
            if conn.is_none() {
                std::thread::sleep(Duration::from_millis(rng.gen_range(50..250)));
                continue;
            }
        }
        let c = conn.as_mut().unwrap();
        // Snowflakes and sharded IDs are not paused: their applications meet
        // a changed server (a base backup started in its place) as soon as
        // it answers, and what it must refuse then is the extension's to
        // refuse (SPEC §17.1). Counter, block and ticket rows go back with
        // the database they are in, so those clients wait for the
        // operator's steps.
        let paused_kind = kind.is_transactional();
        while paused_kind && lineage.pause.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let gate = paused_kind.then(|| lineage.gate.read().unwrap_or_else(|p| p.into_inner()));
        let life = lineage.life.load(Ordering::SeqCst);
        let result = match kind {
            Kind::Counter => counter(c, lineage, life, history, &mut rng),
            Kind::Block => block(c, lineage, life, history, &mut rng),
            Kind::Ticket => tickets(c, lineage, life, history, &mut rng),
            Kind::Snowflake => snowflakes(c, lineage, history, &mut rng),
            Kind::Sharded => sharded(c, lineage, history, &mut rng),
        };
        drop(gate);
        if result.is_err() {
            // A refusal (no lease yet, clock behind, a standby away): retry
            // soon; a lost connection is made again above.
            std::thread::sleep(Duration::from_millis(rng.gen_range(10..60)));
        }
    }
}

fn counter(c: &mut Conn, lineage: &Lineage, life: u32, history: &History, rng: &mut StdRng) -> Result<(), postgres::Error> {
    let scope = format!("d{}", rng.gen_range(0..COUNTER_SCOPES));
    let mut values = Vec::new();
    c.warned();
    c.client.batch_execute("BEGIN")?;
    for _ in 0..rng.gen_range(1..=3) {
        match c.client.query_one("SELECT next_scoped_id('cq', $1)", &[&scope]) {
            Ok(row) => values.push(row.get::<_, i64>(0)),
            Err(e) => {
                let _ = c.client.batch_execute("ROLLBACK");
                return Err(e);
            }
        }
    }
    let outcome = if rng.gen_bool(0.7) {
        match c.client.batch_execute("COMMIT") {
            Ok(()) if c.warned() => Outcome::Unknown,
            Ok(()) => Outcome::Committed,
            // An error from the server before the commit (pg_ticket's
            // pre-commit, a serialization failure): nothing committed. A
            // lost connection or a terminated backend (57P01 after a
            // cancelled standby wait: committed locally): who knows.
            Err(e) => match e.code().map(|s| s.code().to_string()) {
                Some(code) if !c.client.is_closed() && !code.starts_with("57") && !code.starts_with("08") => Outcome::RolledBack,
                _ => Outcome::Unknown,
            },
        }
    } else {
        let _ = c.client.batch_execute("ROLLBACK");
        Outcome::RolledBack
    };
    lineage.received.fetch_add(values.len() as u64, Ordering::Relaxed);
    history.record(Event::Counter { t: history.now(), lineage: lineage.name.into(), life, scope, values, outcome });
    Ok(())
}

fn block(c: &mut Conn, lineage: &Lineage, life: u32, history: &History, rng: &mut StdRng) -> Result<(), postgres::Error> {
    let size: i64 = rng.gen_range(1..=50);
    c.warned();
    let row = c.client.query_one("SELECT first_id, last_id FROM reserve_block('b', $1)", &[&size])?;
    lineage.received.fetch_add(size as u64, Ordering::Relaxed);
    if c.warned() {
        // Committed locally only, perhaps: not a block anyone may use.
        history.record(Event::Fault { t: history.now(), kind: "warned_commit".into(), detail: format!("block {}-{} of {}", row.get::<_, i64>(0), row.get::<_, i64>(1), lineage.name) });
        return Ok(());
    }
    history.record(Event::Block { t: history.now(), lineage: lineage.name.into(), life, name: "b".into(), first: row.get(0), last: row.get(1) });
    Ok(())
}

fn tickets(c: &mut Conn, lineage: &Lineage, life: u32, history: &History, rng: &mut StdRng) -> Result<(), postgres::Error> {
    let scope = format!("t{}", rng.gen_range(0..TICKET_SCOPES));
    let n: i32 = rng.gen_range(1..=20);
    let rows = c.client.query("SELECT next_ticket('tq', $1) FROM generate_series(1, $2)", &[&scope, &n])?;
    let values: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    lineage.received.fetch_add(values.len() as u64, Ordering::Relaxed);
    history.record(Event::Tickets { t: history.now(), lineage: lineage.name.into(), life, scope, values });
    Ok(())
}

fn snowflakes(c: &mut Conn, lineage: &Lineage, history: &History, rng: &mut StdRng) -> Result<(), postgres::Error> {
    let n: i32 = rng.gen_range(1..=40);
    let rows = c.client.query("SELECT snowflake_id() FROM generate_series(1, $1)", &[&n])?;
    let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    lineage.received.fetch_add(ids.len() as u64, Ordering::Relaxed);
    history.record(Event::Snowflakes { t: history.now(), source: lineage.name.into(), ids });
    Ok(())
}

fn sharded(c: &mut Conn, lineage: &Lineage, history: &History, rng: &mut StdRng) -> Result<(), postgres::Error> {
    let shard: i32 = rng.gen_range(0..SHARDS);
    let n: i32 = rng.gen_range(1..=40);
    let rows = c.client.query("SELECT sharded_id($1) FROM generate_series(1, $2)", &[&shard, &n])?;
    let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    lineage.received.fetch_add(ids.len() as u64, Ordering::Relaxed);
    history.record(Event::Sharded { t: history.now(), source: lineage.name.into(), ids });
    Ok(())
}

/// The marks of every counter scope of `lineage`'s current life.
pub fn record_marks(lineage: &Lineage, history: &History) -> Result<(), postgres::Error> {
    let mut c = Client::connect(&lineage.dsn, NoTls)?;
    let life = lineage.life.load(Ordering::SeqCst);
    for d in 0..COUNTER_SCOPES {
        let scope = format!("d{d}");
        let mark: i64 = c.query_one("SELECT current_scoped_id('cq', $1)", &[&scope])?.get(0);
        history.record(Event::Mark { t: history.now(), lineage: lineage.name.into(), life, scope, mark });
    }
    Ok(())
}
