//! Connection strings in logs: a configuration's `Debug` shows its `dsn`
//! with every password replaced by `***` (a `password=` keyword, quoted or
//! not, a URI's `user:password@` and its `?password=` parameter). What
//! cannot be read as either form is shown as `***` whole: better a useless
//! line in a log than a secret in it.

const HIDDEN: &str = "***";

pub fn redacted(dsn: &str) -> String {
    let trimmed = dsn.trim_start();
    let redacted = if let Some(rest) = trimmed.strip_prefix("postgresql://").or_else(|| trimmed.strip_prefix("postgres://")) {
        let scheme = &trimmed[..trimmed.len() - rest.len()];
        Some(format!("{scheme}{}", redacted_uri(rest)))
    } else {
        redacted_keywords(trimmed)
    };
    redacted.unwrap_or_else(|| HIDDEN.into())
}

fn redacted_uri(rest: &str) -> String {
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rfind('@') {
        Some(at) => match authority[..at].find(':') {
            Some(colon) => format!("{}:{HIDDEN}{}", &authority[..colon], &authority[at..]),
            None => authority.to_string(),
        },
        None => authority.to_string(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let params: Vec<String> = query
                .split('&')
                .map(|param| match param.split_once('=') {
                    Some((key, _)) if key == "password" => format!("{key}={HIDDEN}"),
                    _ => param.to_string(),
                })
                .collect();
            format!("{path}?{}", params.join("&"))
        }
        None => tail.to_string(),
    };
    format!("{authority}{tail}")
}

/// `key = value` pairs as libpq reads them (values in single quotes with
/// backslash escapes, or up to the next space); None if it cannot.
fn redacted_keywords(dsn: &str) -> Option<String> {
    let mut out = Vec::new();
    let mut chars = dsn.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Some(out.join(" "));
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        chars.next_if_eq(&'=')?;
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            value.push('\'');
            loop {
                match chars.next()? {
                    '\\' => {
                        value.push('\\');
                        value.push(chars.next()?);
                    }
                    '\'' => break,
                    c => value.push(c),
                }
            }
            value.push('\'');
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                value.push(c);
                if c == '\\' {
                    value.push(chars.next()?);
                }
            }
        }
        out.push(if key == "password" { format!("{key}={HIDDEN}") } else { format!("{key}={value}") });
    }
}

#[cfg(test)]
mod tests {
    use super::redacted;

    #[test]
    fn passwords_never_reach_a_log() {
        assert_eq!(redacted("host=db1 dbname=ids password=s3cret user=app"), "host=db1 dbname=ids password=*** user=app");
        assert_eq!(redacted("password = 'it''s \\' secret' host=x"), "***"); // '' is not an escape in libpq: unreadable
        assert_eq!(redacted("password = 'a \\' b' host=x"), "password=*** host=x");
        assert_eq!(redacted("postgresql://app:s3cret@db1:5432/ids?sslmode=require"), "postgresql://app:***@db1:5432/ids?sslmode=require");
        assert_eq!(redacted("postgres://db1/ids?password=s3cret&user=app"), "postgres://db1/ids?password=***&user=app");
        assert_eq!(redacted("postgresql://app@db1/ids"), "postgresql://app@db1/ids");
        assert_eq!(redacted("host=db1 password='unterminated"), "***");
        assert_eq!(redacted("no equals sign"), "***");
    }
}
