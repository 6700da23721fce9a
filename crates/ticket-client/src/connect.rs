//! Connection strings as libpq users write them, for the `postgres` crate:
//! `passfile=...` (which the crate does not know) is taken out and the
//! password looked up the way libpq does — in that file, else `$PGPASSFILE`,
//! else `~/.pgpass` — when the string has none. Waits are bounded: a
//! connect timeout and a TCP user timeout of `bound` unless the string
//! sets its own.

use std::time::Duration;

pub fn config(dsn: &str, bound: Duration) -> Result<postgres::Config, postgres::Error> {
    let mut passfile = None;
    let mut rest = Vec::new();
    for part in dsn.split_whitespace() {
        match part.strip_prefix("passfile=") {
            Some(path) => passfile = Some(path.trim_matches('\'').to_string()),
            None => rest.push(part),
        }
    }
    let mut config: postgres::Config = rest.join(" ").parse()?;
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
    config.tcp_user_timeout(bound);
    Ok(config)
}

/// The connection in `slot`, made anew (from `dsn`, waits bounded by
/// `bound`) if there is none or the server closed it.
pub fn reuse_or_connect<'a>(slot: &'a mut Option<postgres::Client>, dsn: &str, bound: Duration) -> Result<&'a mut postgres::Client, postgres::Error> {
    if slot.as_ref().is_none_or(|c| c.is_closed()) {
        *slot = Some(config(dsn, bound)?.connect(postgres::NoTls)?);
    }
    Ok(slot.as_mut().expect("connected"))
}

/// The password of the first matching `host:port:database:user:password`
/// line (`*` matches anything; `\:` and `\\` are escapes).
fn lookup(text: &str, config: &postgres::Config) -> Option<String> {
    let host = match config.get_hosts().first() {
        Some(postgres::config::Host::Tcp(h)) => h.clone(),
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
