//! Parsing the `pg_ticket.epoch` setting: a UTC date or date and time;
//! times and durations as messages write them (SPEC §18.2: never raw
//! milliseconds).
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

/// Year, month, day of a day count since 1970-01-01 (Hinnant's
/// civil-from-days).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// Unix ms as a UTC timestamp for messages: `2026-01-01 00:00:00 UTC`, with
/// `.123` when there are milliseconds.
pub fn format_unix_ms(unix_ms: i64) -> String {
    let (days, ms_of_day) = (unix_ms.div_euclid(86_400_000), unix_ms.rem_euclid(86_400_000));
    let (year, month, day) = civil_from_days(days);
    let (h, m, s, ms) = (ms_of_day / 3_600_000, ms_of_day / 60_000 % 60, ms_of_day / 1000 % 60, ms_of_day % 1000);
    let fraction = if ms == 0 { String::new() } else { format!(".{ms:03}") };
    format!("{year:04}-{month:02}-{day:02} {h:02}:{m:02}:{s:02}{fraction} UTC")
}

/// A duration for messages, as a person reads it: `250 ms`, `1.5 s`,
/// `55 s`, `10 min 10 s`, `2 h 5 min`, `2 d 3 h` (rounded down to its two
/// largest units).
pub fn format_duration_ms(ms: i64) -> String {
    let sign = if ms < 0 { "-" } else { "" };
    let ms = ms.unsigned_abs();
    let text = match ms {
        0..=999 => format!("{ms} ms"),
        1_000..=9_999 => format!("{} s", trim_zeros(format!("{}.{:02}", ms / 1000, ms % 1000 / 10))),
        10_000..=59_999 => format!("{} s", trim_zeros(format!("{}.{}", ms / 1000, ms % 1000 / 100))),
        60_000..=3_599_999 => two_units(ms / 1000, 60, "min", "s"),
        3_600_000..=86_399_999 => two_units(ms / 60_000, 60, "h", "min"),
        _ => two_units(ms / 3_600_000, 24, "d", "h"),
    };
    format!("{sign}{text}")
}

/// "1.50" as "1.5", "2.00" as "2".
fn trim_zeros(number: String) -> String {
    number.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn two_units(small: u64, per_large: u64, large_unit: &str, small_unit: &str) -> String {
    match small % per_large {
        0 => format!("{} {large_unit}", small / per_large),
        rest => format!("{} {large_unit} {rest} {small_unit}", small / per_large),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_in_messages_read_as_utc_timestamps() {
        assert_eq!(format_unix_ms(1_767_225_600_000), "2026-01-01 00:00:00 UTC");
        assert_eq!(format_unix_ms(1_767_225_600_123 + 86_399_000), "2026-01-01 23:59:59.123 UTC");
        assert_eq!(format_unix_ms(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(format_unix_ms(-1), "1969-12-31 23:59:59.999 UTC");
        for text in ["2026-01-01", "2024-02-29 12:34:56", "1970-01-01"] {
            let ms = parse_epoch_ms(text).unwrap();
            assert!(format_unix_ms(ms).starts_with(text.split(' ').next().unwrap()), "{text}");
        }
    }

    #[test]
    fn durations_in_messages_read_as_a_person_says_them() {
        let cases = [
            (0, "0 ms"),
            (250, "250 ms"),
            (1_000, "1 s"),
            (1_500, "1.5 s"),
            (1_010, "1.01 s"),
            (10_050, "10 s"),
            (55_000, "55 s"),
            (59_999, "59.9 s"),
            (60_000, "1 min"),
            (610_000, "10 min 10 s"),
            (3_600_000, "1 h"),
            (7_500_000, "2 h 5 min"),
            (86_400_000, "1 d"),
            (183_600_000, "2 d 3 h"),
            (-1_500, "-1.5 s"),
        ];
        for (ms, text) in cases {
            assert_eq!(format_duration_ms(ms), text, "{ms} ms");
        }
    }

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
