//! Parsing the `pg_ticket.epoch` setting: a UTC date or date and time.
//!
//! Kept free of PostgreSQL so the setting can be checked once at server start
//! (in `_PG_init`), before any shared state exists, without a catalog lookup.

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
#[error("invalid epoch {0:?}: expected 'YYYY-MM-DD' or 'YYYY-MM-DD HH:MM:SS' (UTC)")]
pub struct EpochError(pub String);

/// Milliseconds since 1970-01-01 00:00:00 UTC for `YYYY-MM-DD[ HH:MM:SS][Z|+00|+00:00]`.
pub fn parse_epoch_ms(text: &str) -> Result<i64, EpochError> {
    let bad = || EpochError(text.to_string());
    let trimmed = text.trim();
    let trimmed = ["+00:00", "+00", "Z", " UTC"]
        .iter()
        .find_map(|suffix| trimmed.strip_suffix(suffix))
        .unwrap_or(trimmed);
    let (date, time) = match trimmed.split_once([' ', 'T']) {
        Some((d, t)) => (d, Some(t)),
        None => (trimmed, None),
    };
    let nums = |s: &str, sep: char, n: usize| -> Option<Vec<i64>> {
        let parts: Vec<&str> = s.split(sep).collect();
        if parts.len() != n || parts.iter().any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit())) {
            return None;
        }
        parts.iter().map(|p| p.parse().ok()).collect()
    };
    let d = nums(date, '-', 3).ok_or_else(bad)?;
    let (year, month, day) = (d[0], d[1], d[2]);
    if !(1970..=9999).contains(&year) || !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return Err(bad());
    }
    let (h, m, s) = match time {
        None => (0, 0, 0),
        Some(t) => {
            let t = nums(t, ':', 3).ok_or_else(bad)?;
            if t[0] > 23 || t[1] > 59 || t[2] > 59 {
                return Err(bad());
            }
            (t[0], t[1], t[2])
        }
    };
    let days = days_from_civil(year, month, day);
    Ok(((days * 24 + h) * 60 + m) * 60_000 + s * 1000)
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 (Howard Hinnant's civil-from-days inverse).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_epoch_is_2026_01_01() {
        // date -u -d 2026-01-01 +%s → 1767225600
        assert_eq!(parse_epoch_ms("2026-01-01"), Ok(1_767_225_600_000));
        assert_eq!(parse_epoch_ms("2026-01-01 00:00:00+00"), Ok(1_767_225_600_000));
    }

    #[test]
    fn known_instants() {
        assert_eq!(parse_epoch_ms("1970-01-01"), Ok(0));
        // Twitter's snowflake epoch: 2010-11-04 01:42:54.657 UTC = 1288834974657 ms.
        assert_eq!(parse_epoch_ms("2010-11-04 01:42:54"), Ok(1_288_834_974_000));
        assert_eq!(parse_epoch_ms("2024-02-29T12:00:00Z"), Ok(1_709_208_000_000));
    }

    #[test]
    fn rejects_malformed_dates() {
        for bad in ["", "2026", "2026-13-01", "2026-02-29", "2026-01-01 24:00:00", "1969-12-31", "x026-01-01", "2026-1-1 1:2"] {
            assert!(parse_epoch_ms(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
