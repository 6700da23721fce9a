//! Arithmetic and input limits shared by scoped counters and blocks.
//!
//! A mark is the highest value handed out so far (0: never used). Taking `n`
//! values from mark `m` yields `m+1 ..= m+n` and the new mark `m+n`. Every
//! scope and block name also has a limit, the highest value it may hand out
//! (2^63-1 unless an admin set a lower one, e.g. for an `integer` column).

use thiserror::Error;

/// Names (queue, domain, block name) are stored as text keys; this bound keeps
/// the index entries small and mirrors PostgreSQL's own identifier habits.
pub const MAX_NAME_BYTES: usize = 255;

/// A block larger than this is taken as a caller's mistake rather than a need:
/// 2^40 (about 1.1 * 10^12) IDs would last a worker handing out a million a
/// second for twelve days.
pub const MAX_BLOCK_SIZE: i64 = 1 << 40;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum CounterError {
    #[error("{what} must not be empty")]
    EmptyName { what: &'static str },
    #[error("{what} is {len} bytes long; the limit is {MAX_NAME_BYTES} bytes")]
    NameTooLong { what: &'static str, len: usize },
    #[error("{what} contains a NUL character, which PostgreSQL's text cannot hold")]
    NulInName { what: &'static str },
    #[error("{what} is {chars} characters long; no server takes more than {MAX_NAME_BYTES} (the limit is {MAX_NAME_BYTES} bytes in its encoding)")]
    NameTooManyCharacters { what: &'static str, chars: usize },
    #[error("block size must be at least 1, got {0}")]
    SizeNotPositive(i64),
    #[error("block size {0} is larger than the limit of {MAX_BLOCK_SIZE}")]
    SizeTooLarge(i64),
    /// Above the server's own ceiling (`pg_ticket.max_block_size`): one
    /// call may not exhaust a block name for everyone.
    #[error("block size {size} is larger than pg_ticket.max_block_size ({limit})")]
    SizeOverCeiling { size: i64, limit: i64 },
    #[error("{what} would pass its limit {limit} (current mark {mark}, asked for {n} more)")]
    Overflow { what: &'static str, mark: i64, n: i64, limit: i64 },
    #[error("a mark cannot be negative, got {0}")]
    NegativeMark(i64),
    #[error("cannot move {what} back from {current} to {requested}: marks only move forward")]
    MarkBackwards { what: &'static str, current: i64, requested: i64 },
    #[error("cannot move {what} to {requested}: its limit is {limit}")]
    PastLimit { what: &'static str, requested: i64, limit: i64 },
    #[error("cannot limit {what} to {requested}: it has already handed out values up to {mark}")]
    LimitBelowMark { what: &'static str, requested: i64, mark: i64 },
    /// An explicit value at or below the mark (SPEC §18.4): it may have
    /// been handed out already.
    #[error("{value} is not above the mark {mark} of {what}: it may have been handed out already")]
    AtOrBelowMark { what: &'static str, value: i64, mark: i64 },
}

/// The largest limit, and the one every scope starts with.
pub const NO_LIMIT: i64 = i64::MAX;

/// A scope's mark and limit as one transaction sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    pub mark: i64,
    pub limit: i64,
}

/// What an allocation or an admin call does to a mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Take `n` (≥ 1) values.
    Take(i64),
    /// Move the mark to this value, never back and never past the limit.
    AdvanceTo(i64),
    /// Set the limit, never below the mark.
    LimitTo(i64),
    /// Close the counter: its limit becomes its mark, which it keeps (so
    /// its name can never count from 1 again).
    Retire,
    /// A value given explicitly becomes the mark (SPEC §18.4, a numbering
    /// trigger's `on_explicit => 'advance'`): only one above the mark, which
    /// nobody can have been handed out, and within the limit.
    Claim(i64),
}

impl Change {
    pub fn apply(self, what: &'static str, current: Mark) -> Result<Mark, CounterError> {
        let Mark { mark, limit } = current;
        match self {
            Change::Take(n) => Ok(Mark { mark: take(what, mark, n, limit)?, limit }),
            Change::AdvanceTo(to) if to < mark => Err(CounterError::MarkBackwards { what, current: mark, requested: to }),
            Change::AdvanceTo(to) if to > limit => Err(CounterError::PastLimit { what, requested: to, limit }),
            Change::AdvanceTo(to) => Ok(Mark { mark: to, limit }),
            Change::LimitTo(max) if max < mark => Err(CounterError::LimitBelowMark { what, requested: max, mark }),
            Change::LimitTo(max) => Ok(Mark { mark, limit: max }),
            Change::Retire => Ok(Mark { mark, limit: mark }),
            Change::Claim(value) if value <= mark => Err(CounterError::AtOrBelowMark { what, value, mark }),
            Change::Claim(value) if value > limit => Err(CounterError::PastLimit { what, requested: value, limit }),
            Change::Claim(value) => Ok(Mark { mark: value, limit }),
        }
    }

    /// What the statement that locks the row takes in the same write.
    pub fn taken_by_lock(self) -> i64 {
        match self {
            Change::Take(n) => n,
            Change::AdvanceTo(_) | Change::LimitTo(_) | Change::Retire | Change::Claim(_) => 0,
        }
    }
}

/// `name` is the database's bytes (any server encoding).
pub fn check_name(what: &'static str, name: &[u8]) -> Result<(), CounterError> {
    if name.is_empty() {
        return Err(CounterError::EmptyName { what });
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(CounterError::NameTooLong { what, len: name.len() });
    }
    Ok(())
}

/// A client's check of a name before it waits on a server for it (a block
/// pool's name, a lease holder's): what every server refuses, whatever its
/// encoding. Empty, a NUL, or more characters than the limit has bytes
/// (each character is at least one byte in any server encoding); a name
/// within that is the server's to judge in its own encoding's bytes.
pub fn check_client_name(what: &'static str, name: &str) -> Result<(), CounterError> {
    if name.is_empty() {
        return Err(CounterError::EmptyName { what });
    }
    if name.contains('\0') {
        return Err(CounterError::NulInName { what });
    }
    let chars = name.chars().count();
    if chars > MAX_NAME_BYTES {
        return Err(CounterError::NameTooManyCharacters { what, chars });
    }
    Ok(())
}

pub fn check_block_size(size: i64) -> Result<(), CounterError> {
    if size <= 0 {
        return Err(CounterError::SizeNotPositive(size));
    }
    if size > MAX_BLOCK_SIZE {
        return Err(CounterError::SizeTooLarge(size));
    }
    Ok(())
}

/// The new mark after taking `n` (≥ 1) values from `mark`; never wraps, never
/// passes `limit`.
#[inline]
pub fn take(what: &'static str, mark: i64, n: i64, limit: i64) -> Result<i64, CounterError> {
    after_taking(mark, n, limit).ok_or(CounterError::Overflow { what, mark, n, limit })
}

/// [`take`] without the refusal: None where it refuses.
#[inline]
pub fn after_taking(mark: i64, n: i64, limit: i64) -> Option<i64> {
    mark.checked_add(n).filter(|m| *m <= limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_moves_the_mark_by_n() {
        assert_eq!(take("counter", 0, 1, NO_LIMIT), Ok(1));
        assert_eq!(take("block", 3, 3, NO_LIMIT), Ok(6));
    }

    #[test]
    fn take_refuses_to_pass_the_maximum_or_the_limit() {
        assert_eq!(take("counter", i64::MAX - 1, 1, NO_LIMIT), Ok(i64::MAX));
        assert_eq!(
            take("counter", i64::MAX, 1, NO_LIMIT),
            Err(CounterError::Overflow { what: "counter", mark: i64::MAX, n: 1, limit: NO_LIMIT })
        );
        assert!(take("block", i64::MAX - 5, 6, NO_LIMIT).is_err());
        let int4 = i64::from(i32::MAX);
        assert_eq!(take("counter", int4 - 1, 1, int4), Ok(int4));
        assert_eq!(take("counter", int4, 1, int4), Err(CounterError::Overflow { what: "counter", mark: int4, n: 1, limit: int4 }));
        assert!(take("block", int4 - 2, 3, int4).is_err(), "a block may not straddle the limit");
    }

    #[test]
    fn changes_keep_marks_forward_and_within_the_limit() {
        let at = |mark, limit| Mark { mark, limit };
        assert_eq!(Change::Claim(6).apply("c", at(5, 100)), Ok(at(6, 100)));
        assert_eq!(Change::Claim(50).apply("c", at(5, 100)), Ok(at(50, 100)), "a gap the caller chose");
        assert!(matches!(Change::Claim(5).apply("c", at(5, 100)), Err(CounterError::AtOrBelowMark { .. })), "the mark was handed out");
        assert!(matches!(Change::Claim(1).apply("c", at(5, 100)), Err(CounterError::AtOrBelowMark { .. })));
        assert!(matches!(Change::Claim(101).apply("c", at(5, 100)), Err(CounterError::PastLimit { .. })));
        assert_eq!(Change::AdvanceTo(10).apply("c", at(5, 100)), Ok(at(10, 100)));
        assert_eq!(Change::AdvanceTo(5).apply("c", at(5, 100)), Ok(at(5, 100)), "standing still is allowed");
        assert!(matches!(Change::AdvanceTo(4).apply("c", at(5, 100)), Err(CounterError::MarkBackwards { .. })));
        assert!(matches!(Change::AdvanceTo(101).apply("c", at(5, 100)), Err(CounterError::PastLimit { .. })));
        assert_eq!(Change::LimitTo(5).apply("c", at(5, 100)), Ok(at(5, 5)), "a limit at the mark: nothing more");
        assert_eq!(Change::LimitTo(NO_LIMIT).apply("c", at(5, 100)), Ok(at(5, NO_LIMIT)), "a limit can be raised");
        assert!(matches!(Change::LimitTo(4).apply("c", at(5, 100)), Err(CounterError::LimitBelowMark { .. })));
        assert_eq!(Change::Take(2).apply("c", at(5, 7)), Ok(at(7, 7)));
        assert!(matches!(Change::Take(1).apply("c", at(7, 7)), Err(CounterError::Overflow { .. })));
        assert_eq!((Change::Take(3).taken_by_lock(), Change::LimitTo(9).taken_by_lock()), (3, 0));
    }

    #[test]
    fn names_must_be_non_empty_and_short() {
        assert!(check_name("queue", b"q").is_ok());
        assert!(check_name("queue", "x".repeat(255).as_bytes()).is_ok());
        assert_eq!(check_name("queue", b""), Err(CounterError::EmptyName { what: "queue" }));
        // A client's check: what every server refuses, before any wait.
        assert_eq!(check_client_name("name", ""), Err(CounterError::EmptyName { what: "name" }));
        assert_eq!(check_client_name("holder", "a\0b"), Err(CounterError::NulInName { what: "holder" }));
        assert_eq!(check_client_name("name", &"x".repeat(256)), Err(CounterError::NameTooManyCharacters { what: "name", chars: 256 }));
        assert_eq!(check_client_name("name", &"x".repeat(255)), Ok(()));
        // 255 characters of two bytes each: a LATIN1 server holds them in 255.
        assert_eq!(check_client_name("name", &"\u{e9}".repeat(255)), Ok(()));
        assert_eq!(
            check_name("domain", "é".repeat(128).as_bytes()),
            Err(CounterError::NameTooLong { what: "domain", len: 256 })
        );
    }

    #[test]
    fn block_sizes_are_bounded() {
        assert!(check_block_size(1).is_ok());
        assert!(check_block_size(MAX_BLOCK_SIZE).is_ok());
        assert_eq!(check_block_size(0), Err(CounterError::SizeNotPositive(0)));
        assert_eq!(check_block_size(-5), Err(CounterError::SizeNotPositive(-5)));
        assert_eq!(
            check_block_size(MAX_BLOCK_SIZE + 1),
            Err(CounterError::SizeTooLarge(MAX_BLOCK_SIZE + 1))
        );
    }
}

/// A string resource ID's number (SPEC §15): the canonical decimal string
/// of 1 .. 2^63-1 — digits only, no sign, no leading zero — else None.
pub fn parse_resource_id(text: &str) -> Option<i64> {
    let canonical = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) && !text.starts_with('0');
    canonical.then(|| text.parse::<i64>().ok()).flatten()
}

#[cfg(test)]
mod resource_id_tests {
    use super::parse_resource_id;

    #[test]
    fn only_canonical_decimal_strings_are_numbers() {
        assert_eq!(parse_resource_id("42"), Some(42));
        assert_eq!(parse_resource_id("9223372036854775807"), Some(i64::MAX));
        for bad in ["", "0", "042", "+42", "-1", " 42", "4 2", "9223372036854775808", "demo-queue/42"] {
            assert_eq!(parse_resource_id(bad), None, "{bad:?}");
        }
    }
}
