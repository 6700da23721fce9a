//! `pg_ticket._native`: the Python face of `crates/ticket-client`, so
//! Python applications run the one implementation of the lease protocol,
//! its clock checks and the block pool's rules (the package around it,
//! `python/pg_ticket`, adds `decode`'s datetime and the Django and
//! SQLAlchemy helpers, which are plain SQL).
//!
//! What it owns: the conversion of arguments and errors, and the GIL. Every
//! call into an allocator — and so every wait (for a lease, for a block,
//! for the next millisecond, for the lease thread to release) — runs with
//! the GIL released, so other Python threads go on; the constructor's wait
//! and `next_ids` are cut into slices between which Ctrl-C (a pending
//! signal) is honoured.
//!
//! Locking: each object holds its Rust allocator behind a `RwLock` only so
//! that `close()` can take it away while other threads use it; the
//! allocators lock inside themselves (`&self` everywhere). No lock is ever
//! waited for with the GIL held: a thread holding the GIL while it waits for
//! a lock that a thread waiting for the GIL holds would stop both (and with
//! them the interpreter).
//!
//! `fork()`: a child gets a copy of a generator's state (the same machine
//! id, the same last stamp) and of a pool's blocks, but not their threads.
//! Both copies issuing would hand out the same IDs twice, so an object made
//! before a fork refuses in the child (`Forked`) and is dropped there
//! without touching its threads (joining one that does not exist in the
//! child would hang; releasing the lease is the parent's).

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;
use std::time::{Duration, Instant};
use ticket_client::{ClientError, GeneratorConfig, PoolConfig};

create_exception!(pg_ticket, Error, PyException, "Base class of everything pg_ticket raises. No error ever comes with an ID.");
create_exception!(pg_ticket, InvalidConfig, Error, "A setting outside what the protocol allows (a ttl, a block size); nothing was started.");
create_exception!(pg_ticket, NoLease, Error, "No machine-id lease is held (not yet, or not since the last one ended): no ID is issued.");
create_exception!(
    pg_ticket,
    LeaseLost,
    Error,
    "The lease may have ended by this process's own reckoning (no renewal in time): no ID is issued until it is renewed or a new lease is held."
);
create_exception!(
    pg_ticket,
    ClockError,
    Error,
    "This host's clock disagrees with the registry's, or stepped against its boot clock, by more than half pg_ticket.lease_margin: no ID is issued until they agree."
);
create_exception!(pg_ticket, BlocksExhausted, Error, "No block was available within the pool's wait (both blocks spent, no new one fetched).");
create_exception!(pg_ticket, Closed, Error, "The generator or pool was closed.");
create_exception!(
    pg_ticket,
    Forked,
    Error,
    "This generator or pool was made before this process was forked: it serves its parent only (make a new one in the child)."
);

/// How many times this process's ancestors and it were forked since the
/// module was loaded (counted in the child, by `pthread_atfork`).
static FORKS: AtomicU64 = AtomicU64::new(0);

extern "C" fn count_a_fork_in_the_child() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// The process an object was made in.
#[derive(Clone, Copy)]
struct MadeIn(u64);

impl MadeIn {
    fn now() -> Self {
        MadeIn(FORKS.load(Ordering::Relaxed))
    }

    fn forked_since(self) -> bool {
        FORKS.load(Ordering::Relaxed) != self.0
    }

    fn check(self, what: &str) -> PyResult<()> {
        if self.forked_since() {
            return Err(Forked::new_err(format!("this {what} was made before this process was forked: it serves its parent only; make a new one in the child")));
        }
        Ok(())
    }
}

/// The allocator of an object, or nothing once closed; in a forked child
/// it is forgotten, never dropped (see the module comment).
struct Held<T: Send + Sync + 'static> {
    inner: RwLock<Option<T>>,
    made_in: MadeIn,
    what: &'static str,
}

impl<T: Send + Sync + 'static> Held<T> {
    fn new(value: T, what: &'static str) -> Self {
        Held { inner: RwLock::new(Some(value)), made_in: MadeIn::now(), what }
    }

    /// `f` of the allocator, run with the GIL released, if the object is
    /// open and was not inherited through a fork.
    fn call<R: Send>(&self, py: Python<'_>, f: impl FnOnce(&T) -> Result<R, ClientError> + Send) -> PyResult<R> {
        self.made_in.check(self.what)?;
        match py.detach(|| self.inner.read().unwrap_or_else(|p| p.into_inner()).as_ref().map(f)) {
            Some(done) => done.map_err(to_py),
            None => Err(Closed::new_err(format!("the {} was closed", self.what))),
        }
    }

    /// The allocator, taken out (once) after every call under way ended;
    /// nothing in a forked child, whose copy is the parent's (and whose lock
    /// may be held by a thread the child does not have).
    fn take(&self, py: Python<'_>) -> Option<T> {
        if self.made_in.forked_since() {
            return None;
        }
        py.detach(|| self.inner.write().unwrap_or_else(|p| p.into_inner()).take())
    }
}

/// An object freed without `close()`: in a forked child its allocator is
/// forgotten (see the module comment); otherwise it is closed in a thread of
/// its own, since closing waits (for the release of the lease, for a
/// reservation under way) and whoever frees the object holds the GIL. At
/// the interpreter's exit that thread may not finish: the lease then ends
/// at its ttl, unreleased (`close()` or `with` release it at once).
impl<T: Send + Sync + 'static> Drop for Held<T> {
    fn drop(&mut self) {
        let left = self.inner.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if self.made_in.forked_since() {
            std::mem::forget(left);
        } else if let Some(open) = left {
            let slot = std::sync::Arc::new(std::sync::Mutex::new(Some(open)));
            let theirs = std::sync::Arc::clone(&slot);
            let closing = std::thread::Builder::new().name("ticket-close".into()).spawn(move || drop(theirs.lock().unwrap_or_else(|p| p.into_inner()).take()));
            if closing.is_err() {
                // No thread to close it in: leave it (the lease ends at its
                // ttl) rather than wait here holding the GIL.
                std::mem::forget(slot.lock().unwrap_or_else(|p| p.into_inner()).take());
            }
        }
    }
}

fn to_py(e: ClientError) -> PyErr {
    let message = e.to_string();
    match e {
        ClientError::InvalidConfig(_) => InvalidConfig::new_err(message),
        ClientError::NoLease { .. } => NoLease::new_err(message),
        ClientError::LeaseMayHaveEnded { .. } => LeaseLost::new_err(message),
        ClientError::ClockSkew { .. }
        | ClientError::ClockStepped { .. }
        | ClientError::Snowflake(ticket_core::snowflake::SnowflakeError::ClockBehind { .. }) => ClockError::new_err(message),
        ClientError::BlocksExhausted { .. } => BlocksExhausted::new_err(message),
        _ => Error::new_err(message),
    }
}

/// Seconds from Python as a duration, refusing what is not one.
fn seconds(what: &str, value: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| InvalidConfig::new_err(format!("{what}: {value} is not a number of seconds ≥ 0")))
}

/// The longest the GIL stays released in one slice of a long wait.
const WAIT_SLICE: Duration = Duration::from_millis(100);

/// Runs `attempt(slice)` with the GIL released, in slices of at most
/// `WAIT_SLICE` until `total` has passed, checking for signals (Ctrl-C)
/// between them; `attempt` returns `None` to be called again.
fn wait_in_slices<T: Send>(py: Python<'_>, total: Duration, attempt: impl Fn(Duration) -> Option<T> + Sync) -> PyResult<Option<T>> {
    let started = Instant::now();
    loop {
        let left = total.saturating_sub(started.elapsed());
        if let Some(done) = py.detach(|| attempt(left.min(WAIT_SLICE))) {
            return Ok(Some(done));
        }
        if started.elapsed() >= total {
            return Ok(None);
        }
        py.check_signals()?;
    }
}

/// LeasedGenerator(dsn, holder, ttl=30.0, wait=10.0)
///
/// Snowflake IDs made in this process, stamped with a machine id leased
/// from a pg_ticket registry (`dsn`: a libpq connection string or URI).
/// Waits up to `wait` seconds for the first lease (raising NoLease; at once
/// Error where the registry refuses for good: a missing GRANT), then
/// renews it in a thread of its own every third of `ttl`. `next_id()`
/// never touches the network and refuses (LeaseLost, ClockError) rather
/// than issue an ID its lease may not cover. `close()` (or leaving a
/// `with` block) releases the lease, reporting the last stamp.
#[pyclass(module = "pg_ticket._native", frozen)]
struct LeasedGenerator(Held<ticket_client::LeasedGenerator>);

#[pymethods]
impl LeasedGenerator {
    #[new]
    #[pyo3(signature = (dsn, holder, ttl = 30.0, wait = 10.0))]
    fn new(py: Python<'_>, dsn: String, holder: String, ttl: f64, wait: f64) -> PyResult<Self> {
        let mut config = GeneratorConfig::new(dsn, holder);
        config.ttl = seconds("ttl", ttl)?;
        // The client's own default pause between failed calls, kept within
        // half the ttl (its rule) for short ttls.
        config.retry_interval = config.retry_interval.min(config.ttl / 2);
        let wait = seconds("wait", wait)?;
        let generator = py.detach(|| ticket_client::LeasedGenerator::start(config)).map_err(to_py)?;
        let held = wait_in_slices(py, wait, |slice| match generator.wait_for_lease(slice) {
            Ok(_) => Some(Ok(())),
            Err(ClientError::NoLease { .. }) => None,
            Err(other) => Some(Err(other)),
        });
        let failed = match held {
            Ok(Some(Ok(()))) => return Ok(LeasedGenerator(Held::new(generator, "generator"))),
            Ok(Some(Err(e))) => to_py(e),
            // Timed out: the error says why (the registry's last refusal).
            Ok(None) => to_py(py.detach(|| generator.wait_for_lease(Duration::ZERO).err()).unwrap_or(ClientError::NoLease { last_error: None })),
            Err(interrupted) => interrupted,
        };
        // Its thread stops and releases whatever it leased meanwhile.
        py.detach(|| drop(generator));
        Err(failed)
    }

    /// The next ID.
    fn next_id(&self, py: Python<'_>) -> PyResult<i64> {
        self.0.call(py, |generator| generator.next_id())
    }

    /// The next `n` IDs (increasing), made with the GIL released, taken
    /// back between slices of `IDS_PER_SLICE` to check for signals.
    fn next_ids(&self, py: Python<'_>, n: usize) -> PyResult<Vec<i64>> {
        let mut ids = Vec::with_capacity(n.min(IDS_PER_SLICE));
        while ids.len() < n {
            let slice = (n - ids.len()).min(IDS_PER_SLICE);
            ids.extend(self.0.call(py, |generator| (0..slice).map(|_| generator.next_id()).collect::<Result<Vec<i64>, _>>())?);
            if ids.len() < n {
                py.check_signals()?;
            }
        }
        Ok(ids)
    }

    /// The machine id leased now (None between leases).
    #[getter]
    fn machine_id(&self, py: Python<'_>) -> PyResult<Option<u16>> {
        self.grant(py, |grant| grant.machine_id)
    }

    /// The fencing token of the lease held now (None between leases).
    #[getter]
    fn lease(&self, py: Python<'_>) -> PyResult<Option<i64>> {
        self.grant(py, |grant| grant.lease)
    }

    /// The registry's pg_ticket.machine_bits: decode(id, machine_bits=...).
    #[getter]
    fn machine_bits(&self, py: Python<'_>) -> PyResult<Option<u32>> {
        self.grant(py, |grant| grant.layout.machine_bits())
    }

    /// The registry's pg_ticket.epoch in Unix ms.
    #[getter]
    fn epoch_ms(&self, py: Python<'_>) -> PyResult<Option<i64>> {
        self.grant(py, |grant| grant.epoch_ms)
    }

    /// Stops renewing and releases the lease, reporting the last stamp to
    /// the registry (so the id is free again after the margin). Idempotent.
    fn close(&self, py: Python<'_>) {
        let taken = self.0.take(py);
        py.detach(|| drop(taken));
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
    }
}

impl LeasedGenerator {
    fn grant<R: Send>(&self, py: Python<'_>, part: impl Fn(&ticket_client::Grant) -> R + Send) -> PyResult<Option<R>> {
        self.0.call(py, |generator| Ok(generator.lease().as_ref().map(part)))
    }
}

/// IDs `next_ids` makes between two checks for signals (about 1 ms at the
/// layout's cap).
const IDS_PER_SLICE: usize = 4096;

/// BlockPool(dsn, name, block_size, wait=5.0)
///
/// IDs from blocks taken with `reserve_block(name, block_size)`, the next
/// block fetched in a thread of its own before the current one runs out.
/// A block is handed out only after its reservation committed durably.
/// `next_id()` waits up to `wait` seconds for a block (BlocksExhausted).
/// `close()` returns the ranges reserved and never handed out (gaps).
#[pyclass(module = "pg_ticket._native", frozen)]
struct BlockPool(Held<ticket_client::BlockPool>);

#[pymethods]
impl BlockPool {
    #[new]
    #[pyo3(signature = (dsn, name, block_size, wait = 5.0))]
    fn new(py: Python<'_>, dsn: String, name: String, block_size: i64, wait: f64) -> PyResult<Self> {
        let mut config = PoolConfig::new(dsn, name, block_size);
        config.wait_timeout = seconds("wait", wait)?;
        let pool = py.detach(|| ticket_client::BlockPool::start(config)).map_err(to_py)?;
        Ok(BlockPool(Held::new(pool, "pool")))
    }

    /// The next ID of the pool's blocks.
    fn next_id(&self, py: Python<'_>) -> PyResult<i64> {
        self.0.call(py, |pool| pool.next_id())
    }

    /// Stops fetching (after a reservation under way) and returns the
    /// ranges (first, last) reserved and never handed out. Idempotent.
    fn close(&self, py: Python<'_>) -> Vec<(i64, i64)> {
        let taken = self.0.take(py);
        py.detach(|| taken.map(|pool| pool.close().1).unwrap_or_default())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
    }
}

/// A version of a public-ID key (docs/public-ids.md): the server's
/// `pgticket.public_id` / `pgticket.private_id` without a round trip.
#[pyclass(frozen, module = "pg_ticket")]
struct PublicKey {
    key: ticket_core::public_id::PublicKey,
}

#[pymethods]
impl PublicKey {
    #[new]
    #[pyo3(signature = (key, version = 1))]
    fn new(key: &[u8], version: i64) -> PyResult<Self> {
        let key = ticket_core::public_id::PublicKey::new(version, key).map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
        Ok(PublicKey { key })
    }

    /// The public form of `id` (a 64-bit signed integer).
    fn encode(&self, id: i64) -> String {
        self.key.encode(id)
    }

    /// The ID of `form`; ValueError for a mistyped form or another key's.
    fn decode(&self, form: &str) -> PyResult<i64> {
        let shown: String = form.chars().take(40).collect();
        self.key.decode(form).map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("invalid public ID {shown:?}: {e}")))
    }
}

/// (timestamp in Unix ms, machine id, sequence) of a snowflake ID in the
/// layout of `machine_bits` and the epoch `epoch` (pg_ticket.epoch's
/// syntax), read exactly as the server's snowflake_decode reads it.
#[pyfunction]
fn decode_ms(id: i64, machine_bits: i64, epoch: &str) -> PyResult<(i64, u16, u16)> {
    let layout = ticket_core::snowflake::Layout::new(machine_bits).map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
    let epoch_ms = ticket_core::epoch::parse_epoch_ms(epoch).map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("epoch: {e}")))?;
    let parts = layout.decompose(id).map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
    Ok((epoch_ms + parts.millis as i64, parts.machine_id, parts.sequence))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    // Registered once per process image; a child inherits the handler.
    static AT_FORK: std::sync::Once = std::sync::Once::new();
    AT_FORK.call_once(|| unsafe {
        libc::pthread_atfork(None, None, Some(count_a_fork_in_the_child));
    });
    m.add_class::<LeasedGenerator>()?;
    m.add_class::<BlockPool>()?;
    m.add_class::<PublicKey>()?;
    m.add_function(wrap_pyfunction!(decode_ms, m)?)?;
    m.add("Error", py.get_type::<Error>())?;
    m.add("InvalidConfig", py.get_type::<InvalidConfig>())?;
    m.add("NoLease", py.get_type::<NoLease>())?;
    m.add("LeaseLost", py.get_type::<LeaseLost>())?;
    m.add("ClockError", py.get_type::<ClockError>())?;
    m.add("BlocksExhausted", py.get_type::<BlocksExhausted>())?;
    m.add("Closed", py.get_type::<Closed>())?;
    m.add("Forked", py.get_type::<Forked>())?;
    Ok(())
}
