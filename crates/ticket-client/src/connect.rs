//! Connections to the registry (and the block pool's database), every wait
//! bounded (SPEC §8 rule 10): connecting, each statement and its reply
//! each get at most `bound`, and give way within 100 ms to a holder that
//! stops. A call past its bound fails, and its connection is dropped (the
//! statement's outcome is unknown: callers treat it as a lost reply).
//!
//! Connection strings as libpq users write them, for `tokio-postgres`:
//! `passfile=...` (which the crate does not know) is taken out and the
//! password looked up the way libpq does — in that file, else `$PGPASSFILE`,
//! else `~/.pgpass` — when the string has none; a connect timeout and a TCP
//! user timeout of `bound` unless the string sets its own.

use std::future::Future;
use std::time::{Duration, Instant};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Row};

/// Why a call to the database did not answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error(transparent)]
    Database(#[from] tokio_postgres::Error),
    #[error("no answer within {0:?}; the connection was dropped")]
    TimedOut(Duration),
    #[error("stopped while waiting for the database")]
    Stopped,
}

impl CallError {
    /// The SQLSTATE of an error the server raised (None: no answer, or the
    /// connection failed, when the call may or may not have happened).
    pub fn code(&self) -> Option<&tokio_postgres::error::SqlState> {
        match self {
            CallError::Database(e) => e.code(),
            _ => None,
        }
    }

    /// The server's message, or what went wrong.
    pub fn message(&self) -> String {
        match self {
            CallError::Database(e) => e.as_db_error().map(|d| d.message().to_string()).unwrap_or_else(|| e.to_string()),
            other => other.to_string(),
        }
    }
}

/// One connection with its own single-threaded runtime: the calling thread
/// drives it only while it waits for a call.
pub struct Conn {
    runtime: tokio::runtime::Runtime,
    client: Client,
    bound: Duration,
}

/// Run `work` on `runtime` for at most `bound`, checking `stop` every 100 ms.
fn bounded<T>(runtime: &tokio::runtime::Runtime, bound: Duration, stop: &dyn Fn() -> bool, work: impl Future<Output = T>) -> Result<T, CallError> {
    let deadline = Instant::now() + bound;
    runtime.block_on(async {
        let mut work = std::pin::pin!(work);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left.min(Duration::from_millis(100)), &mut work).await {
                Ok(done) => return Ok(done),
                Err(_) if stop() => return Err(CallError::Stopped),
                Err(_) if left.is_zero() || Instant::now() >= deadline => return Err(CallError::TimedOut(bound)),
                Err(_) => {}
            }
        }
    })
}

impl Conn {
    pub fn connect(dsn: &str, bound: Duration, stop: &dyn Fn() -> bool) -> Result<Conn, CallError> {
        let config = config(dsn, bound)?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
        let (client, connection) = bounded(&runtime, bound, stop, config.connect(NoTls))??;
        runtime.spawn(connection);
        Ok(Conn { runtime, client, bound })
    }

    pub fn query_one(&mut self, sql: &str, params: &[&(dyn ToSql + Sync)], stop: &dyn Fn() -> bool) -> Result<Row, CallError> {
        Ok(bounded(&self.runtime, self.bound, stop, self.client.query_one(sql, params))??)
    }

    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }
}

/// The connection in `slot`, made anew if there is none or the server
/// closed it.
pub fn reuse_or_connect<'a>(slot: &'a mut Option<Conn>, dsn: &str, bound: Duration, stop: &dyn Fn() -> bool) -> Result<&'a mut Conn, CallError> {
    if slot.as_ref().is_none_or(|c| c.is_closed()) {
        *slot = Some(Conn::connect(dsn, bound, stop)?);
    }
    Ok(slot.as_mut().expect("connected"))
}

pub fn config(dsn: &str, bound: Duration) -> Result<tokio_postgres::Config, tokio_postgres::Error> {
    let mut passfile = None;
    let mut rest = Vec::new();
    for part in dsn.split_whitespace() {
        match part.strip_prefix("passfile=") {
            Some(path) => passfile = Some(path.trim_matches('\'').to_string()),
            None => rest.push(part),
        }
    }
    let mut config: tokio_postgres::Config = rest.join(" ").parse()?;
    if config.get_password().is_none() {
        let file = passfile
            .or_else(|| std::env::var("PGPASSFILE").ok())
            .or_else(|| std::env::var("HOME").ok().map(|h| format!("{h}/.pgpass")));
        if let Some(password) = file.and_then(|f| std::fs::read_to_string(f).ok()).and_then(|text| lookup(&text, &config)) {
            config.password(password);
        }
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(bound);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(bound);
    }
    Ok(config)
}

/// The password of the first matching `host:port:database:user:password`
/// line (`*` matches anything; `\:` and `\\` are escapes).
fn lookup(text: &str, config: &tokio_postgres::Config) -> Option<String> {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "localhost".to_string(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432).to_string();
    let user = config.get_user().unwrap_or_default().to_string();
    let dbname = config.get_dbname().map(str::to_string).unwrap_or_else(|| user.clone());
    let wanted = [host, port, dbname, user];
    text.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let fields = split_fields(line);
        if fields.len() != 5 {
            return None;
        }
        let matches = fields[..4].iter().zip(&wanted).all(|(f, w)| f == "*" || f == w);
        matches.then(|| fields[4].clone())
    })
}

fn split_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => fields.last_mut().unwrap().extend(chars.next()),
            ':' => fields.push(String::new()),
            c => fields.last_mut().unwrap().push(c),
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_passfile_gives_the_password_of_the_first_matching_line() {
        let dir = std::env::temp_dir().join(format!("ticket-client-pgpass-{}", std::process::id()));
        std::fs::write(&dir, "# comment\nother:5432:*:app:nope\nreg.example:6432:ids:app:s3cr\\:et\n*:*:*:*:fallback\n").unwrap();
        let dsn = format!("host=reg.example port=6432 user=app dbname=ids passfile={}", dir.display());
        let c = config(&dsn, Duration::from_secs(1)).unwrap();
        assert_eq!(c.get_password(), Some(&b"s3cr:et"[..]));
        let c = config(&format!("host=x user=app passfile={}", dir.display()), Duration::from_secs(1)).unwrap();
        assert_eq!(c.get_password(), Some(&b"fallback"[..]));
        let c = config(&format!("host=x user=app password=given passfile={}", dir.display()), Duration::from_secs(1)).unwrap();
        assert_eq!(c.get_password(), Some(&b"given"[..]), "a password in the string wins");
        std::fs::remove_file(dir).unwrap();
    }
}
