//! Durations in configuration as people write them: `"60s"`, `"500ms"`,
//! `"10 min"`, `"1h"`, `"1d"` (the units of PostgreSQL's settings), or a
//! bare number of milliseconds.

use serde::Deserializer;
use std::time::Duration;

/// Parses `text` as a duration.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = (&text[..split], text[split..].trim());
    let n: u64 = number.parse().map_err(|_| format!("{text:?} is not a duration (such as \"60s\", \"500ms\", \"10 min\")"))?;
    let ms = match unit {
        "" | "ms" => 1,
        "s" => 1_000,
        "min" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        other => return Err(format!("{other:?} is not a unit of time (ms, s, min, h, d)")),
    };
    n.checked_mul(ms).map(Duration::from_millis).ok_or_else(|| format!("{text:?} is too long"))
}

/// For `#[serde(with = "crate::duration")]`: a string as above, or a
/// whole number of milliseconds.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    d.deserialize_any(Human)
}

struct Human;

impl serde::de::Visitor<'_> for Human {
    type Value = Duration;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a duration such as \"60s\", \"500ms\", \"10 min\", or a whole number of milliseconds")
    }
    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Duration, E> {
        parse(text).map_err(E::custom)
    }
    fn visit_u64<E: serde::de::Error>(self, ms: u64) -> Result<Duration, E> {
        Ok(Duration::from_millis(ms))
    }
    fn visit_i64<E: serde::de::Error>(self, ms: i64) -> Result<Duration, E> {
        u64::try_from(ms).map(Duration::from_millis).map_err(|_| E::custom(format!("{ms} ms: a duration cannot be negative")))
    }
    fn visit_f64<E: serde::de::Error>(self, ms: f64) -> Result<Duration, E> {
        Err(E::custom(format!("{ms}: a number is whole milliseconds; write a string for other units (\"1500ms\", \"2s\")")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_written() {
        assert_eq!(parse("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("10 min"), Ok(Duration::from_secs(600)));
        assert_eq!(parse("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse("250"), Ok(Duration::from_millis(250)));
        assert!(parse("ten s").is_err());
        assert!(parse("5 fortnights").unwrap_err().contains("unit of time"));
        assert!(parse("-5s").is_err());
    }

    #[derive(Debug, serde::Deserialize)]
    struct Wrapped {
        #[serde(with = "super")]
        d: Duration,
    }

    #[test]
    fn numbers_are_whole_milliseconds() {
        let read = |json: &str| serde_json::from_str::<Wrapped>(json).map(|w| w.d).map_err(|e| e.to_string());
        assert_eq!(read(r#"{"d": 250}"#), Ok(Duration::from_millis(250)));
        assert_eq!(read(r#"{"d": "1 min"}"#), Ok(Duration::from_secs(60)));
        assert!(read(r#"{"d": -5}"#).unwrap_err().contains("cannot be negative"));
        assert!(read(r#"{"d": 1.5}"#).unwrap_err().contains("whole milliseconds"));
        assert!(read(r#"{"d": true}"#).unwrap_err().contains("a duration such as"));
    }
}
