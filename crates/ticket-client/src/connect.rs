//! Connections to the registry (and the block pool's database) through
//! libpq itself, as dblink and postgres_fdw connect: connection strings and
//! URIs as libpq users write them (quoted values, several hosts),
//! `service=`, the `PG*` environment, `passfile=` and `~/.pgpass` with
//! libpq's permission check, and TLS (`sslmode` up to `verify-full`,
//! `sslrootcert`, client certificates).
//!
//! Every wait is bounded (SPEC §8 rule 10): connecting, and each statement
//! with its reply, get at most `bound` each, and give way within 100 ms to
//! a caller that stops. The socket is non-blocking and only this module
//! waits on it (`poll`), so libpq itself never blocks. A call past its
//! bound fails and its connection is closed: the statement's outcome is
//! unknown, and callers treat it as a lost reply.
//!
//! Each call pins `search_path` to `pg_catalog, pg_temp` for its own
//! transaction and calls pg_ticket's functions qualified with the schema
//! the extension lives in, so nothing a role put on its own `search_path`
//! is called instead; nothing it sets outlives the call (a pooler in
//! transaction mode hands the server connection to other clients).
//!
//! A reply that carries a plain WARNING (SQLSTATE 01000) is a lost reply
//! too: PostgreSQL reports a synchronous-standby wait cancelled by an
//! administrator (`pg_cancel_backend`) only as such a WARNING ("the
//! transaction has already committed locally, but might not have been
//! replicated") and then answers as if the commit succeeded; a failover
//! then loses it, and a lease or block used on its strength would be
//! granted again. Its text may be translated, so the SQLSTATE decides;
//! pg_ticket's calls raise no other WARNING of that code. Warnings with a
//! code of their own (a setting refused when a backend loads the library,
//! 22023) are not about the commit: counting them made every call on such
//! a server a lost reply, and a keeper leased id after id. The session
//! pins `client_min_messages = warning`, as a role, database or `options=`
//! setting of `error` would hide the WARNING (for the call's transaction,
//! its commit included).
//!
//! libpq is loaded when the first connection is made (`dlopen`, with its
//! symbols kept local), not linked: inside a PostgreSQL server a linked
//! libpq would enter every process of it, and the walreceiver of a server
//! whose own libpq is another version would call ours (a PostgreSQL 18
//! standby with Debian's libpq 15 could not replicate: "invalid connection
//! option sslnegotiation"). Only the process that connects (the lease
//! worker, an application) loads it. Building needs no libpq.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

type PGconn = c_void;
type PGresult = c_void;
type NoticeReceiver = unsafe extern "C" fn(*mut c_void, *const PGresult);

// libpq's enums (libpq-fe.h), stable across releases.
const CONNECTION_OK: c_int = 0;
const CONNECTION_BAD: c_int = 1;
const PGRES_POLLING_FAILED: c_int = 0;
const PGRES_POLLING_READING: c_int = 1;
const PGRES_POLLING_OK: c_int = 3;
const PGRES_COMMAND_OK: c_int = 1;
const PGRES_TUPLES_OK: c_int = 2;

macro_rules! libpq_functions {
    ($($name:ident: fn($($arg:ty),*) -> $ret:ty;)*) => {
        /// The libpq functions used here, from the loaded library.
        #[allow(non_snake_case)]
        struct Libpq {
            $($name: unsafe extern "C" fn($($arg),*) -> $ret,)*
            _library: libloading::Library,
        }

        impl Libpq {
            /// SAFETY: `library` is a libpq (the signatures are libpq-fe.h's).
            unsafe fn from(library: libloading::Library) -> Result<Libpq, libloading::Error> {
                unsafe {
                    Ok(Libpq {
                        $($name: *library.get(concat!(stringify!($name), "\0").as_bytes())?,)*
                        _library: library,
                    })
                }
            }
        }
    };
}

libpq_functions! {
    PQconnectStartParams: fn(*const *const c_char, *const *const c_char, c_int) -> *mut PGconn;
    PQconnectPoll: fn(*mut PGconn) -> c_int;
    PQstatus: fn(*const PGconn) -> c_int;
    PQerrorMessage: fn(*const PGconn) -> *const c_char;
    PQsocket: fn(*const PGconn) -> c_int;
    PQsetnonblocking: fn(*mut PGconn, c_int) -> c_int;
    PQsendQuery: fn(*mut PGconn, *const c_char) -> c_int;
    PQflush: fn(*mut PGconn) -> c_int;
    PQconsumeInput: fn(*mut PGconn) -> c_int;
    PQisBusy: fn(*mut PGconn) -> c_int;
    PQgetResult: fn(*mut PGconn) -> *mut PGresult;
    PQresultStatus: fn(*const PGresult) -> c_int;
    PQntuples: fn(*const PGresult) -> c_int;
    PQnfields: fn(*const PGresult) -> c_int;
    PQgetisnull: fn(*const PGresult, c_int, c_int) -> c_int;
    PQgetvalue: fn(*const PGresult, c_int, c_int) -> *const c_char;
    PQresultErrorField: fn(*const PGresult, c_int) -> *const c_char;
    PQclear: fn(*mut PGresult) -> ();
    PQfinish: fn(*mut PGconn) -> ();
    PQsetNoticeReceiver: fn(*mut PGconn, Option<NoticeReceiver>, *mut c_void) -> *mut c_void;
}

static LIBPQ: OnceLock<Result<Libpq, String>> = OnceLock::new();

/// Loads libpq once per process: the one the dynamic loader finds
/// (`libpq.so.5`, the system's, as `psql` uses), else the first of
/// `fallbacks` (a server passes its own). Later calls return the outcome of
/// the first.
pub fn load_libpq(fallbacks: &[std::path::PathBuf]) -> Result<(), String> {
    let loaded = LIBPQ.get_or_init(|| {
        let mut errors = Vec::new();
        let names = std::iter::once(std::ffi::OsString::from("libpq.so.5")).chain(fallbacks.iter().map(|p| p.clone().into_os_string()));
        for name in names {
            let flags = libc::RTLD_NOW | libc::RTLD_LOCAL;
            // SAFETY: loading libpq runs no code of ours; its symbols stay
            // local to it (RTLD_LOCAL).
            match unsafe { libloading::os::unix::Library::open(Some(&name), flags) } {
                Ok(library) => return unsafe { Libpq::from(library.into()) }.map_err(|e| format!("{name:?} is not a libpq: {e}")),
                Err(e) => errors.push(e.to_string()),
            }
        }
        Err(format!("cannot load libpq (install libpq5): {}", errors.join("; ")))
    });
    loaded.as_ref().map(|_| ()).map_err(Clone::clone)
}

/// libpq, loaded before any connection exists.
fn pq() -> &'static Libpq {
    match LIBPQ.get() {
        Some(Ok(libpq)) => libpq,
        _ => unreachable!("libpq is loaded before the first connection"),
    }
}

/// Why a call to the database did not answer as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The server raised an error: the statement did not take effect.
    #[error("{message}")]
    Database { sqlstate: String, message: String },
    /// Connecting failed, or the connection broke during a call (which
    /// may or may not have taken effect).
    #[error("{0}")]
    Connection(String),
    #[error("no answer within {0:?}; the connection was closed")]
    TimedOut(Duration),
    #[error("stopped while waiting for the database")]
    Stopped,
    /// An answer this client cannot read (no row, a NULL, not a number).
    #[error("unexpected answer from the database: {0}")]
    Unexpected(String),
}

impl CallError {
    /// The SQLSTATE of an error the server raised (None: no answer, or the
    /// connection failed, when the call may or may not have happened).
    pub fn code(&self) -> Option<&str> {
        match self {
            CallError::Database { sqlstate, .. } => Some(sqlstate),
            _ => None,
        }
    }

    pub fn message(&self) -> String {
        self.to_string()
    }
}

/// A statement parameter, sent as text (libpq's text format).
#[derive(Debug, Clone, Copy)]
pub enum Param<'a> {
    Text(&'a str),
    Int(i64),
    Null,
}

impl<'a> From<&'a str> for Param<'a> {
    fn from(s: &'a str) -> Self {
        Param::Text(s)
    }
}

impl<'a> From<&'a String> for Param<'a> {
    fn from(s: &'a String) -> Self {
        Param::Text(s)
    }
}

impl From<i64> for Param<'_> {
    fn from(n: i64) -> Self {
        Param::Int(n)
    }
}

impl From<i32> for Param<'_> {
    fn from(n: i32) -> Self {
        Param::Int(n.into())
    }
}

impl From<Option<i64>> for Param<'_> {
    fn from(n: Option<i64>) -> Self {
        n.map_or(Param::Null, Param::Int)
    }
}

/// One row of an answer, as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row(Vec<Option<String>>);

impl Row {
    pub fn text(&self, column: usize) -> Result<&str, CallError> {
        match self.0.get(column) {
            Some(Some(v)) => Ok(v),
            Some(None) => Err(CallError::Unexpected(format!("column {column} is NULL"))),
            None => Err(CallError::Unexpected(format!("no column {column}"))),
        }
    }

    pub fn int(&self, column: usize) -> Result<i64, CallError> {
        let text = self.text(column)?;
        text.parse().map_err(|_| CallError::Unexpected(format!("column {column} is not an integer: {text:?}")))
    }
}

const PG_DIAG_SQLSTATE: c_int = b'C' as c_int;
const PG_DIAG_MESSAGE_PRIMARY: c_int = b'M' as c_int;
const PG_DIAG_SEVERITY_NONLOCALIZED: c_int = b'V' as c_int;
/// The longest a wait goes without checking whether the caller stops.
const SLICE: Duration = Duration::from_millis(100);

/// One libpq connection. Used by one thread at a time (libpq connections
/// are not shared between threads, but may move between them).
pub struct Conn {
    raw: *mut PGconn,
    /// The connection string it was made from.
    dsn: String,
    bound: Duration,
    /// `quote_ident` of the schema pg_ticket's functions live in.
    schema: Option<String>,
    registry_schema: Option<String>,
    /// The first WARNING of the call in flight (libpq's notice receiver
    /// writes it, during this connection's own libpq calls).
    warning: Box<Mutex<Option<String>>>,
}

/// libpq's notice receiver: keeps the first plain WARNING (01000) of a call.
unsafe extern "C" fn keep_warning(arg: *mut c_void, result: *const PGresult) {
    // SAFETY: `arg` is the connection's `warning`, which outlives the
    // connection; `result` is a notice, valid during this call.
    let slot = unsafe { &*(arg as *const Mutex<Option<String>>) };
    let field = |code| error_field(result, code);
    if field(PG_DIAG_SEVERITY_NONLOCALIZED).as_deref() == Some("WARNING") && field(PG_DIAG_SQLSTATE).as_deref() == Some("01000") {
        let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(field(PG_DIAG_MESSAGE_PRIMARY).unwrap_or_default());
        }
    }
}

// SAFETY: a PGconn may be used from any thread, one at a time; `Conn` is
// not `Sync`, and every use goes through `&mut self` or `&self` of its owner.
unsafe impl Send for Conn {}

impl Drop for Conn {
    fn drop(&mut self) {
        self.close();
    }
}

fn error_message(raw: *const PGconn) -> String {
    if raw.is_null() {
        return "out of memory".into();
    }
    // SAFETY: a valid connection; the message lives as long as it does.
    let text = unsafe { CStr::from_ptr((pq().PQerrorMessage)(raw)) };
    text.to_string_lossy().trim_end().to_string()
}

fn c_string(what: &str, s: &str) -> Result<CString, CallError> {
    CString::new(s).map_err(|_| CallError::Unexpected(format!("{what} contains a NUL byte")))
}

impl Conn {
    /// Connects with `dsn` (a connection string or URI, as for `psql`).
    /// Unless the string says otherwise, `connect_timeout` and
    /// `tcp_user_timeout` follow `bound`.
    pub fn connect(dsn: &str, bound: Duration, stop: &dyn Fn() -> bool) -> Result<Conn, CallError> {
        load_libpq(&[]).map_err(CallError::Connection)?;
        let deadline = Instant::now() + bound;
        // Parameters before `dbname` are defaults: the expanded string
        // overrides them (libpq's PQconnectdbParams rule).
        let pairs = [
            ("connect_timeout", bound.as_secs().max(2).to_string()),
            ("tcp_user_timeout", bound.as_millis().to_string()),
            ("dbname", dsn.to_string()),
            // After the string, so it overrides one there: the parameters
            // are written into the statement as literals (`with_literals`),
            // escaped for UTF-8 (Rust's strings); in a client encoding whose
            // multibyte characters hold the byte of a backslash or a quote
            // (SJIS, BIG5, GBK, GB18030, UHC) the escape could be read as
            // part of a character and a literal end early.
            ("client_encoding", "UTF8".to_string()),
        ];
        let keys: Vec<CString> = pairs.iter().map(|(k, _)| c_string("a keyword", k)).collect::<Result<_, _>>()?;
        let values: Vec<CString> = pairs.iter().map(|(_, v)| c_string("the connection string", v)).collect::<Result<_, _>>()?;
        let mut key_ptrs: Vec<*const c_char> = keys.iter().map(|k| k.as_ptr()).collect();
        let mut value_ptrs: Vec<*const c_char> = values.iter().map(|v| v.as_ptr()).collect();
        key_ptrs.push(std::ptr::null());
        value_ptrs.push(std::ptr::null());
        // SAFETY: NULL-terminated arrays of C strings that outlive the call.
        let raw = unsafe { (pq().PQconnectStartParams)(key_ptrs.as_ptr(), value_ptrs.as_ptr(), 1) };
        let conn = Conn { raw, dsn: dsn.to_string(), bound, schema: None, registry_schema: None, warning: Box::default() };
        if raw.is_null() || unsafe { (pq().PQstatus)(raw) } == CONNECTION_BAD {
            return Err(CallError::Connection(error_message(raw)));
        }
        let slot: *const Mutex<Option<String>> = &*conn.warning;
        // SAFETY: a connection; the slot lives as long as `conn`, which
        // finishes the connection before dropping it.
        unsafe { (pq().PQsetNoticeReceiver)(raw, Some(keep_warning), slot as *mut c_void) };
        // As libpq's documentation says: first wait as if it asked to write.
        let mut want_write = true;
        loop {
            conn.wait_ready(want_write, deadline, stop)?;
            // SAFETY: a connection being established.
            match unsafe { (pq().PQconnectPoll)(conn.raw) } {
                PGRES_POLLING_OK => break,
                PGRES_POLLING_FAILED => return Err(CallError::Connection(error_message(conn.raw))),
                PGRES_POLLING_READING => want_write = false,
                _ => want_write = true,
            }
        }
        // SAFETY: an established connection.
        if unsafe { (pq().PQsetnonblocking)(conn.raw, 1) } != 0 {
            return Err(CallError::Connection(error_message(conn.raw)));
        }
        Ok(conn)
    }

    pub fn is_closed(&self) -> bool {
        // SAFETY: a valid connection, or null.
        self.raw.is_null() || unsafe { (pq().PQstatus)(self.raw) } != CONNECTION_OK
    }

    fn close(&mut self) {
        if !self.raw.is_null() {
            // SAFETY: finished once; the pointer is forgotten after.
            unsafe { (pq().PQfinish)(self.raw) };
            self.raw = std::ptr::null_mut();
        }
    }

    /// Waits, in slices of at most 100 ms, until the socket can be read
    /// (or written, with `write`), the deadline passes, or `stop` says so.
    fn wait_ready(&self, write: bool, deadline: Instant, stop: &dyn Fn() -> bool) -> Result<(), CallError> {
        self.wait(write, deadline, stop).map(|_| ())
    }

    /// As `wait_ready`; true if the socket can be read.
    fn wait(&self, write: bool, deadline: Instant, stop: &dyn Fn() -> bool) -> Result<bool, CallError> {
        loop {
            // SAFETY: a valid connection (the socket may change while connecting).
            let fd = unsafe { (pq().PQsocket)(self.raw) };
            if fd < 0 {
                return Err(CallError::Connection(error_message(self.raw)));
            }
            if stop() {
                return Err(CallError::Stopped);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(CallError::TimedOut(self.bound));
            }
            let events = if write { libc::POLLIN | libc::POLLOUT } else { libc::POLLIN };
            let mut pfd = libc::pollfd { fd, events, revents: 0 };
            let ms = left.min(SLICE).as_millis().max(1) as c_int;
            // SAFETY: one pollfd.
            let n = unsafe { libc::poll(&mut pfd, 1, ms) };
            if n > 0 {
                return Ok(pfd.revents & !libc::POLLOUT != 0);
            }
            if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return Err(CallError::Connection(format!("poll: {}", std::io::Error::last_os_error())));
            }
        }
    }

    /// Runs one statement and returns its first row; the statement must
    /// return one.
    pub fn query_one(&mut self, sql: &str, params: &[Param<'_>], stop: &dyn Fn() -> bool) -> Result<Row, CallError> {
        if self.is_closed() {
            return Err(CallError::Connection("the connection is closed".into()));
        }
        let outcome = self.run(sql, params, stop);
        match &outcome {
            // No answer, or a broken connection: this one is done.
            Err(e) if e.code().is_none() => self.close(),
            // The extension may have moved (dropped, created in another
            // schema): look it up again.
            Err(_) => self.schema = None,
            Ok(_) => {}
        }
        outcome?.ok_or_else(|| CallError::Unexpected(format!("no row from {sql:?}")))
    }

    fn run(&mut self, sql: &str, params: &[Param<'_>], stop: &dyn Fn() -> bool) -> Result<Option<Row>, CallError> {
        let deadline = Instant::now() + self.bound;
        *self.warning.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let sql = c_string("the statement", &self.with_settings(sql, params)?)?;
        // SAFETY: the statement outlives the call.
        let sent = unsafe { (pq().PQsendQuery)(self.raw, sql.as_ptr()) };
        if sent == 0 {
            return Err(CallError::Connection(error_message(self.raw)));
        }
        // SAFETY (the rest): a connection with a statement in flight.
        loop {
            match unsafe { (pq().PQflush)(self.raw) } {
                0 => break,
                1 => {
                    if self.wait(true, deadline, stop)? && unsafe { (pq().PQconsumeInput)(self.raw) } == 0 {
                        return Err(CallError::Connection(error_message(self.raw)));
                    }
                }
                _ => return Err(CallError::Connection(error_message(self.raw))),
            }
        }
        // The first answer is the settings' own row.
        let (mut row, mut error, mut answers) = (None, None, 0);
        loop {
            while unsafe { (pq().PQisBusy)(self.raw) } != 0 {
                self.wait_ready(false, deadline, stop)?;
                if unsafe { (pq().PQconsumeInput)(self.raw) } == 0 {
                    return Err(CallError::Connection(error_message(self.raw)));
                }
            }
            let result = unsafe { (pq().PQgetResult)(self.raw) };
            if result.is_null() {
                break;
            }
            answers += 1;
            match unsafe { (pq().PQresultStatus)(result) } {
                PGRES_TUPLES_OK if answers == 1 => {}
                PGRES_TUPLES_OK if row.is_none() && unsafe { (pq().PQntuples)(result) } > 0 => {
                    row = Some(first_row(result));
                }
                PGRES_TUPLES_OK | PGRES_COMMAND_OK => {}
                _ => error = error.or_else(|| Some(result_error(result, self.raw))),
            }
            unsafe { (pq().PQclear)(result) };
        }
        if let Some(e) = error {
            return Err(e);
        }
        match self.warning.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(warning) => Err(CallError::Connection(format!("the server warned \"{warning}\": the outcome is taken as unknown"))),
            None => Ok(row),
        }
    }

    /// `sql` with its parameters written in as literals, after the
    /// session's settings for this call, set for its transaction only: one
    /// simple query, one implicit transaction (#48 item 1: settings kept by
    /// the session outlive the call, and behind a pooler in transaction mode
    /// they reached every other client of the server connection — a
    /// `search_path` of `pg_catalog, pg_temp`, a statement timeout that
    /// cancelled the application's own query). The server bounds the call
    /// too: a statement the client gave up on (no answer within `bound`) is
    /// not left to commit later — a lock wait ends at the bound, anything
    /// else at twice it, and a session whose client is gone ends within a
    /// second. Twice: a reply the server sends after cancelling a
    /// synchronous-standby wait (a WARNING, the commit local only) arrives
    /// after the client stopped listening, never as a success it believes.
    fn with_settings(&self, sql: &str, params: &[Param<'_>]) -> Result<String, CallError> {
        let bound_ms = self.bound.as_millis();
        let mut text = format!(
            "SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true), \
                    pg_catalog.set_config('lock_timeout', '{bound_ms}', true), \
                    pg_catalog.set_config('statement_timeout', '{}', true), \
                    pg_catalog.set_config('client_connection_check_interval', '1000', true), \
                    pg_catalog.set_config('client_min_messages', 'warning', true); ",
            bound_ms * 2
        );
        text.push_str(&with_literals(sql, params)?);
        Ok(text)
    }

    /// The schema pg_ticket's everyday functions live in on this connection
    /// (`quote_ident`ed), looked up once.
    pub fn extension_schema(&mut self, stop: &dyn Fn() -> bool) -> Result<String, CallError> {
        self.schema_of("pg_catalog.quote_ident(n.nspname)", false, stop)
    }

    /// The schema pg_ticket's registry functions live in on this
    /// connection, looked up once: `pgticket` from 0.4.0 on, the schema the
    /// extension was created in before (a registry not yet updated).
    pub fn registry_schema(&mut self, stop: &dyn Fn() -> bool) -> Result<String, CallError> {
        self.schema_of(
            "CASE WHEN pg_catalog.to_regprocedure('pgticket.lease_machine_id(text, interval)') IS NOT NULL THEN 'pgticket' \
                  ELSE pg_catalog.quote_ident(n.nspname) END",
            true,
            stop,
        )
    }

    fn schema_of(&mut self, column: &str, registry: bool, stop: &dyn Fn() -> bool) -> Result<String, CallError> {
        let cached = if registry { &self.registry_schema } else { &self.schema };
        if let Some(schema) = cached {
            return Ok(schema.clone());
        }
        let row = self.query_one(
            &format!(
                "SELECT {column} FROM pg_catalog.pg_extension e \
                   JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace \
                  WHERE e.extname OPERATOR(pg_catalog.=) 'pg_ticket'"
            ),
            &[],
            stop,
        );
        let schema = match row {
            Ok(row) => row.text(0)?.to_string(),
            Err(CallError::Unexpected(_)) => {
                return Err(CallError::Database {
                    sqlstate: "55000".into(),
                    message: "pg_ticket is not installed in this database (CREATE EXTENSION pg_ticket)".into(),
                })
            }
            Err(e) => return Err(e),
        };
        if registry {
            self.registry_schema = Some(schema.clone());
        } else {
            self.schema = Some(schema.clone());
        }
        Ok(schema)
    }
}

/// `sql` with `$n` replaced by parameter n as a literal: text as an
/// escape string (`E'...'`, whatever `standard_conforming_strings` says),
/// numbers in parentheses, NULL. The statements are this crate's own, with
/// the extension's schema written in as a quoted identifier: a `$` inside a
/// quoted identifier or a string literal is left alone (a schema named
/// `a$1` is a name, not a placeholder); a `$n` past the parameters is an
/// error.
fn with_literals(sql: &str, params: &[Param<'_>]) -> Result<String, CallError> {
    let mut out = String::with_capacity(sql.len() + 32);
    let mut chars = sql.chars().peekable();
    // The quote character of the identifier or literal being copied; a
    // doubled quote inside one closes and reopens it, which copies the same.
    let mut quoted: Option<char> = None;
    while let Some(c) = chars.next() {
        match quoted {
            Some(q) => {
                if c == q {
                    quoted = None;
                }
                out.push(c);
                continue;
            }
            None if c == '"' || c == '\'' => {
                quoted = Some(c);
                out.push(c);
                continue;
            }
            None if c != '$' || !chars.peek().is_some_and(char::is_ascii_digit) => {
                out.push(c);
                continue;
            }
            None => {}
        }
        let mut n = 0usize;
        while let Some(d) = chars.next_if(char::is_ascii_digit) {
            n = n.saturating_mul(10).saturating_add(d.to_digit(10).unwrap_or(0) as usize);
        }
        match n.checked_sub(1).and_then(|i| params.get(i)) {
            Some(Param::Text(t)) => {
                out.push_str("E'");
                for ch in t.chars() {
                    match ch {
                        '\\' => out.push_str("\\\\"),
                        '\'' => out.push_str("''"),
                        ch => out.push(ch),
                    }
                }
                out.push('\'');
            }
            Some(Param::Int(v)) => out.push_str(&format!("({v})")),
            Some(Param::Null) => out.push_str("NULL"),
            None => return Err(CallError::Unexpected(format!("${n} has no parameter in {sql:?}"))),
        }
    }
    if quoted.is_some() {
        return Err(CallError::Unexpected(format!("an unclosed quote in {sql:?}")));
    }
    Ok(out)
}

/// Row 0 of a result, as text.
fn first_row(result: *const PGresult) -> Row {
    // SAFETY: a TUPLES_OK result with at least one row.
    let columns = unsafe { (pq().PQnfields)(result) };
    Row(
        (0..columns)
            .map(|c| unsafe {
                ((pq().PQgetisnull)(result, 0, c) == 0).then(|| CStr::from_ptr((pq().PQgetvalue)(result, 0, c)).to_string_lossy().into_owned())
            })
            .collect(),
    )
}

/// The error a failed result carries. One without an SQLSTATE is libpq's
/// own (the connection broke): the call's outcome is unknown.
/// A field of an error or notice result, if it has one.
fn error_field(result: *const PGresult, code: c_int) -> Option<String> {
    // SAFETY: a result; the field is NULL or lives as long as it.
    let p = unsafe { (pq().PQresultErrorField)(result, code) };
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

fn result_error(result: *const PGresult, raw: *const PGconn) -> CallError {
    let field = |code| error_field(result, code);
    match (field(PG_DIAG_SQLSTATE), field(PG_DIAG_MESSAGE_PRIMARY)) {
        (Some(sqlstate), Some(message)) => CallError::Database { sqlstate, message },
        _ => CallError::Connection(error_message(raw)),
    }
}

/// The connection in `slot`, made anew if there is none, it closed, or it
/// was made from another connection string.
pub fn reuse_or_connect<'a>(slot: &'a mut Option<Conn>, dsn: &str, bound: Duration, stop: &dyn Fn() -> bool) -> Result<&'a mut Conn, CallError> {
    if slot.as_ref().is_none_or(|c| c.is_closed() || c.dsn != dsn) {
        *slot = None;
        *slot = Some(Conn::connect(dsn, bound, stop)?);
    }
    Ok(slot.as_mut().expect("connected"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A server that accepts connections and never says a word.
    fn silent_server() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let held: Vec<_> = listener.incoming().collect();
            drop(held);
        });
        port
    }

    #[test]
    fn a_server_that_never_answers_costs_the_bound_and_a_stop_is_heeded() {
        let dsn = format!("host=127.0.0.1 port={} user=x dbname=x", silent_server());
        let bound = Duration::from_millis(500);
        let started = Instant::now();
        let err = Conn::connect(&dsn, bound, &|| false).err().expect("no connection");
        assert_eq!(err, CallError::TimedOut(bound));
        assert!(started.elapsed() < Duration::from_secs(3), "the bound holds: {:?}", started.elapsed());

        let started = Instant::now();
        let stop = || started.elapsed() > Duration::from_millis(200);
        let err = Conn::connect(&dsn, Duration::from_secs(60), &stop).err().expect("no connection");
        assert_eq!(err, CallError::Stopped);
        assert!(started.elapsed() < Duration::from_secs(3), "a stop is heeded: {:?}", started.elapsed());
    }

    #[test]
    fn parameters_are_written_in_as_literals_that_cannot_end_early() {
        let mut params: Vec<Param> = vec![Param::Text("it's \\'; DROP"), Param::Int(-5), Param::Null];
        params.extend(["a", "b", "c", "d", "e", "f", "ten"].map(Param::Text));
        let sql = with_literals("SELECT f($1, $2::bigint, $3, $10, $1)", &params).unwrap();
        assert_eq!(sql, "SELECT f(E'it''s \\\\''; DROP', (-5)::bigint, NULL, E'ten', E'it''s \\\\''; DROP')");
        assert!(with_literals("SELECT $11", &params).is_err(), "a placeholder past the parameters");
        assert_eq!(with_literals("SELECT 'no $ placeholder', 1", &[]).unwrap(), "SELECT 'no $ placeholder', 1");
    }

    /// helper-9 (#48): the extension's schema is written into the statement
    /// (quote_ident'ed) before the parameters; a schema named `a$1` had
    /// the block's name put inside the identifier, and a name with a `"`
    /// then ended it.
    #[test]
    fn a_dollar_in_a_quoted_schema_or_literal_is_no_placeholder() {
        let params = [Param::Text("x\"y"), Param::Int(7)];
        assert_eq!(
            with_literals("SELECT \"a$1\"\"$2\".f($1, $2), '$1''$2'", &params).unwrap(),
            "SELECT \"a$1\"\"$2\".f(E'x\"y', (7)), '$1''$2'"
        );
        assert!(with_literals("SELECT \"a$1", &params).is_err(), "an unclosed identifier");
        assert!(with_literals("SELECT $99999999999999999999999", &params).is_err(), "no overflow, no parameter");
    }

    #[test]
    fn connection_strings_are_read_by_libpq() {
        let refused = |dsn: &str| match Conn::connect(dsn, Duration::from_secs(2), &|| false) {
            Err(CallError::Connection(message)) => message,
            Err(other) => panic!("{dsn}: {other:?}"),
            Ok(_) => panic!("{dsn}: connected"),
        };
        let m = refused("host=/tmp no_such_option=1");
        assert!(m.contains("invalid connection option \"no_such_option\""), "{m}");
        // A quoted value with spaces is one value (0.2.0 split it).
        let m = refused("host='/no such directory' port=1");
        assert!(m.contains("/no such directory"), "{m}");
        let m = refused("postgresql://localhost:1/db?sslmode=bogus");
        assert!(m.contains("sslmode"), "{m}");
        let m = refused("service=pg_ticket_no_such_service");
        assert!(m.contains("pg_ticket_no_such_service"), "{m}");
    }
}
