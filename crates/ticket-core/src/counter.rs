//! Arithmetic and input limits shared by scoped counters and blocks.
//!
//! A mark is the highest value handed out so far (0: never used). Taking `n`
//! values from mark `m` yields `m+1 ..= m+n` and the new mark `m+n`.

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
    #[error("block size must be at least 1, got {0}")]
    SizeNotPositive(i64),
    #[error("block size {0} is larger than the limit of {MAX_BLOCK_SIZE}")]
    SizeTooLarge(i64),
    #[error("{what} would pass the maximum value 9223372036854775807 (current mark {mark}, asked for {n} more)")]
    Overflow { what: &'static str, mark: i64, n: i64 },
    #[error("a mark cannot be negative, got {0}")]
    NegativeMark(i64),
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

pub fn check_block_size(size: i64) -> Result<(), CounterError> {
    if size <= 0 {
        return Err(CounterError::SizeNotPositive(size));
    }
    if size > MAX_BLOCK_SIZE {
        return Err(CounterError::SizeTooLarge(size));
    }
    Ok(())
}

/// The new mark after taking `n` (≥ 1) values from `mark`; never wraps.
#[inline]
pub fn take(what: &'static str, mark: i64, n: i64) -> Result<i64, CounterError> {
    mark.checked_add(n).ok_or(CounterError::Overflow { what, mark, n })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_moves_the_mark_by_n() {
        assert_eq!(take("counter", 0, 1), Ok(1));
        assert_eq!(take("block", 3, 3), Ok(6));
    }

    #[test]
    fn take_refuses_to_pass_the_maximum() {
        assert_eq!(take("counter", i64::MAX - 1, 1), Ok(i64::MAX));
        assert_eq!(
            take("counter", i64::MAX, 1),
            Err(CounterError::Overflow { what: "counter", mark: i64::MAX, n: 1 })
        );
        assert!(take("block", i64::MAX - 5, 6).is_err());
    }

    #[test]
    fn names_must_be_non_empty_and_short() {
        assert!(check_name("queue", b"q").is_ok());
        assert!(check_name("queue", "x".repeat(255).as_bytes()).is_ok());
        assert_eq!(check_name("queue", b""), Err(CounterError::EmptyName { what: "queue" }));
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
