//! A block pool (Leaf-segment on the client, SPEC §9): IDs handed out from
//! a block taken with `reserve_block`, the next block fetched by a
//! background thread once the current one is half used, so a database
//! outage is ridden out until both run out.
//!
//! Locking rule: one mutex guards the two blocks; taking an ID holds it for
//! an increment. The fetcher thread holds it only to hand a block over or
//! drop blocks, never across a database call. A caller that finds both
//! blocks spent waits on a condition variable, at most `wait_timeout`.
//!
//! Lost replies: if the connection fails during `reserve_block` (or no
//! answer comes within the bound), the block may have been reserved and
//! committed without the reply arriving. The pool never guesses which range
//! that was: it reserves anew, and the lost range stays a gap.
//!
//! Restores: at every reconnect, and every `check_interval` while idle, it
//! compares the blocks it holds with `current_block_mark`: a block ending
//! above the mark is one the database no longer has (restored from an older
//! backup) and is dropped. What it cannot see: a restore after which other
//! clients reserved past its block before it checked (docs/leases.md).
//!
//! Every database call is bounded (`connect::Conn`) and gives way to a
//! stop, so `close` and drop return within about 100 ms.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::connect::{reuse_or_connect, CallError, Conn};
use crate::ClientError;

/// What a `BlockPool` needs. Deserializes from configuration files
/// (serde), durations in human form (`wait_timeout = "5s"`).
#[derive(Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// libpq connection string or URI of the database.
    pub dsn: String,
    /// The block counter's name (`reserve_block(name, size)`).
    pub name: String,
    pub block_size: i64,
    /// How long `next_id` waits for a block when both are spent (at most a
    /// day, as every interval here; `retry_interval` and `check_interval`
    /// more than 0).
    #[serde(default = "defaults::wait_timeout", with = "crate::duration")]
    pub wait_timeout: Duration,
    /// Pause between failed calls to the database.
    #[serde(default = "defaults::retry_interval", with = "crate::duration")]
    pub retry_interval: Duration,
    /// How often an idle pool checks its blocks against the mark.
    #[serde(default = "defaults::check_interval", with = "crate::duration")]
    pub check_interval: Duration,
    /// The longest a call to the database may take: 1 s .. 1 day.
    #[serde(default = "defaults::call_timeout", with = "crate::duration")]
    pub call_timeout: Duration,
}

mod defaults {
    use std::time::Duration;
    pub fn wait_timeout() -> Duration {
        Duration::from_secs(5)
    }
    pub fn retry_interval() -> Duration {
        Duration::from_millis(200)
    }
    pub fn check_interval() -> Duration {
        Duration::from_secs(1)
    }
    pub fn call_timeout() -> Duration {
        Duration::from_secs(10)
    }
}

impl std::fmt::Debug for PoolConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolConfig")
            .field("dsn", &crate::dsn::redacted(&self.dsn))
            .field("name", &self.name)
            .field("block_size", &self.block_size)
            .field("wait_timeout", &self.wait_timeout)
            .field("retry_interval", &self.retry_interval)
            .field("check_interval", &self.check_interval)
            .field("call_timeout", &self.call_timeout)
            .finish()
    }
}

impl PoolConfig {
    /// Every value one the pool can work with?
    fn check(&self) -> Result<(), ClientError> {
        let invalid = |what: &str, why: String| Err(ClientError::InvalidConfig(format!("{what}: {why}")));
        ticket_core::counter::check_client_name("name", &self.name).map_err(|e| ClientError::InvalidConfig(e.to_string()))?;
        ticket_core::counter::check_block_size(self.block_size).map_err(|e| ClientError::InvalidConfig(format!("block_size: {e}")))?;
        const DAY: Duration = Duration::from_secs(86_400);
        for (what, d) in [("wait_timeout", self.wait_timeout), ("retry_interval", self.retry_interval), ("check_interval", self.check_interval)] {
            if d > DAY || (d.is_zero() && what != "wait_timeout") {
                return invalid(what, format!("{d:?} is not within {} .. 1 day", if what == "wait_timeout" { "0" } else { "1 ms" }));
            }
        }
        if self.call_timeout < Duration::from_secs(1) || self.call_timeout > DAY {
            return invalid("call_timeout", format!("{:?} is not within 1 s .. 1 day", self.call_timeout));
        }
        Ok(())
    }

    pub fn new(dsn: impl Into<String>, name: impl Into<String>, block_size: i64) -> Self {
        PoolConfig {
            dsn: dsn.into(),
            name: name.into(),
            block_size,
            wait_timeout: defaults::wait_timeout(),
            retry_interval: defaults::retry_interval(),
            check_interval: defaults::check_interval(),
            call_timeout: defaults::call_timeout(),
        }
    }
}

/// What the pool has done, for monitoring and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[derive(serde::Serialize)]
pub struct PoolStats {
    pub blocks_reserved: u64,
    /// Reservations whose reply was lost (the range is a gap).
    pub lost_replies: u64,
    /// Blocks dropped after a reconnect because they end above the mark.
    pub blocks_discarded: u64,
    pub ids_handed_out: u64,
}

#[derive(Debug, Clone, Copy)]
struct Block {
    next: i64,
    last: i64,
}

impl Block {
    fn left(&self) -> i64 {
        self.last - self.next + 1
    }
}

#[derive(Default)]
struct State {
    current: Option<Block>,
    ahead: Option<Block>,
    stop: bool,
    last_error: Option<String>,
    /// The server's last answer was a refusal that will not change by
    /// itself (a name or size it does not take, no right): `next_id` says
    /// so at once instead of waiting (helper-11, #48). The fetcher asks
    /// again every second, for a grant made meanwhile.
    refused: bool,
    stats: PoolStats,
}

impl State {
    fn wants_block(&self, size: i64) -> bool {
        self.ahead.is_none() && self.current.is_none_or(|b| b.left() * 2 <= size)
    }
}

struct Shared {
    config: PoolConfig,
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub struct BlockPool {
    shared: Arc<Shared>,
    fetcher: Option<JoinHandle<()>>,
}

impl BlockPool {
    pub fn start(config: PoolConfig) -> Result<Self, ClientError> {
        config.check()?;
        let shared = Arc::new(Shared { config, state: Mutex::new(State::default()), changed: Condvar::new() });
        let thread_shared = Arc::clone(&shared);
        let fetcher = std::thread::Builder::new()
            .name("ticket-blocks".into())
            .spawn(move || Fetcher { shared: thread_shared, conn: None, reconnected: false, in_flight: false }.run())
            .expect("spawn the block thread");
        Ok(BlockPool { shared, fetcher: Some(fetcher) })
    }

    pub fn next_id(&self) -> Result<i64, ClientError> {
        let size = self.shared.config.block_size;
        let started = Instant::now();
        let mut st = self.shared.lock();
        loop {
            if st.current.is_none_or(|b| b.left() == 0) {
                st.current = st.ahead.take();
            }
            if let Some(block) = st.current.as_mut().filter(|b| b.left() > 0) {
                let id = block.next;
                block.next += 1;
                st.stats.ids_handed_out += 1;
                if st.wants_block(size) {
                    self.shared.changed.notify_all();
                }
                return Ok(id);
            }
            self.shared.changed.notify_all();
            let waited = started.elapsed();
            if waited >= self.shared.config.wait_timeout || st.refused {
                return Err(ClientError::BlocksExhausted {
                    name: self.shared.config.name.clone(),
                    waited_ms: waited.as_millis() as u64,
                    last_error: st.last_error.clone(),
                });
            }
            st = self.shared.changed.wait_timeout(st, self.shared.config.wait_timeout - waited).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    pub fn stats(&self) -> PoolStats {
        self.shared.lock().stats
    }

    /// The ranges held and not yet handed out (first, last).
    pub fn unused(&self) -> Vec<(i64, i64)> {
        let st = self.shared.lock();
        [st.current, st.ahead].into_iter().flatten().filter(|b| b.left() > 0).map(|b| (b.next, b.last)).collect()
    }
}

impl BlockPool {
    fn stop_fetcher(&mut self) {
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
        if let Some(t) = self.fetcher.take() {
            let _ = t.join();
        }
    }

    /// Stop (after a reservation under way has finished) and say what is
    /// left: the stats and the ranges reserved but never handed out (an
    /// application may log them; they are gaps).
    pub fn close(mut self) -> (PoolStats, Vec<(i64, i64)>) {
        self.stop_fetcher();
        (self.stats(), self.unused())
    }
}

impl Drop for BlockPool {
    fn drop(&mut self) {
        self.stop_fetcher();
    }
}

/// A server's answer to `reserve_block` that asking again will not change:
/// the name or size refused (22023, 2200H: the name is spent), a character
/// its encoding cannot hold (22P05, 22021), no right (42501), pg_ticket
/// missing (42883, 3F000).
fn refused_for_good(e: &CallError) -> bool {
    matches!(e.code(), Some("22023" | "2200H" | "22P05" | "22021" | "42501" | "42883" | "3F000"))
}

struct Fetcher {
    shared: Arc<Shared>,
    conn: Option<Conn>,
    /// A connection was lost since the blocks were last checked.
    reconnected: bool,
    /// A reservation was sent and its reply not read yet.
    in_flight: bool,
}

impl Fetcher {

    fn run(mut self) {
        let size = self.shared.config.block_size;
        loop {
            let wants_block = {
                let mut st = self.shared.lock();
                if !st.stop && !st.wants_block(size) {
                    st = self.shared.changed.wait_timeout(st, self.shared.config.check_interval).unwrap_or_else(|p| p.into_inner()).0;
                }
                if st.stop {
                    return;
                }
                st.wants_block(size)
            };
            let outcome = if wants_block { self.fetch() } else { self.check_blocks() };
            if let Err(e) = outcome {
                let connection_failed = e.code().is_none();
                // The reservation may have committed: its range is a gap.
                let lost_reply = std::mem::take(&mut self.in_flight) && connection_failed;
                if connection_failed {
                    self.conn = None;
                    self.reconnected = true;
                }
                let mut st = self.shared.lock();
                st.last_error = Some(e.message());
                st.refused = refused_for_good(&e);
                if lost_reply {
                    st.stats.lost_replies += 1;
                }
                let pause = if st.refused { self.shared.config.retry_interval.max(Duration::from_secs(1)) } else { self.shared.config.retry_interval };
                self.shared.changed.notify_all();
                if !st.stop {
                    drop(self.shared.changed.wait_timeout(st, pause));
                }
            }
        }
    }

    fn connection(&mut self) -> Result<&mut Conn, CallError> {
        if self.conn.as_ref().is_some_and(|c| c.is_closed()) {
            // Closed under us (the server restarted, the session was
            // terminated): the database may have changed since.
            self.reconnected = true;
        }
        let shared = Arc::clone(&self.shared);
        reuse_or_connect(&mut self.conn, &self.shared.config.dsn, self.shared.config.call_timeout, &move || shared.lock().stop)
    }

    /// Drop every block the database no longer has (one ending above its
    /// mark: restored from an older backup).
    fn check_blocks(&mut self) -> Result<(), CallError> {
        let name = self.shared.config.name.clone();
        let shared = Arc::clone(&self.shared);
        let stop = move || shared.lock().stop;
        let conn = self.connection()?;
        let schema = conn.extension_schema(&stop)?;
        let mark = conn.query_one(&format!("SELECT {schema}.current_block_mark($1)"), &[(&name).into()], &stop)?.int(0)?;
        let mut guard = self.shared.lock();
        let st = &mut *guard;
        for slot in [&mut st.current, &mut st.ahead] {
            if slot.is_some_and(|b| b.last > mark) {
                *slot = None;
                st.stats.blocks_discarded += 1;
            }
        }
        self.reconnected = false;
        Ok(())
    }

    fn fetch(&mut self) -> Result<(), CallError> {
        let name = self.shared.config.name.clone();
        let size = self.shared.config.block_size;
        self.connection()?;
        if self.reconnected {
            self.check_blocks()?;
        }
        let shared = Arc::clone(&self.shared);
        let stop = move || shared.lock().stop;
        let schema = self.connection()?.extension_schema(&stop)?;
        self.in_flight = true;
        let row = self.connection()?.query_one(&format!("SELECT first_id, last_id FROM {schema}.reserve_block($1, $2)"), &[(&name).into(), size.into()], &stop)?;
        self.in_flight = false;
        let block = Block { next: row.int(0)?, last: row.int(1)? };
        let mut st = self.shared.lock();
        st.stats.blocks_reserved += 1;
        st.last_error = None;
        st.refused = false;
        if st.current.is_none_or(|b| b.left() == 0) {
            st.current = Some(block);
        } else {
            st.ahead = Some(block);
        }
        drop(st);
        self.shared.changed.notify_all();
        Ok(())
    }
}
