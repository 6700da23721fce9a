//! Durations in configuration as people write them: `"60s"`, `"500ms"`,
//! `"10 min"`, `"1h"`, `"1d"` (the units of PostgreSQL's settings), or a
//! bare number of milliseconds.

use serde::{Deserialize, Deserializer};
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

/// For `#[serde(with = "crate::duration")]`: a string as above, or an
/// integer of milliseconds.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Text(String),
        Millis(u64),
    }
    match Raw::deserialize(d)? {
        Raw::Text(text) => parse(&text).map_err(serde::de::Error::custom),
        Raw::Millis(ms) => Ok(Duration::from_millis(ms)),
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
    }
}
