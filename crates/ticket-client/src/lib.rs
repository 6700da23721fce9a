//! pg_ticket for application processes that make IDs themselves (SPEC §9).
//!
//! - [`LeasedGenerator`]: snowflake IDs stamped with a machine id leased
//!   from a pg_ticket registry (`pgticket.lease_machine_id`), with the layout and
//!   clock rules of the server's `snowflake_id()` (both are
//!   `ticket_core::snowflake`). It stops issuing, with an error, as soon as
//!   its own conservative reckoning says the lease may have ended.
//! - [`BlockPool`]: IDs from blocks taken with `reserve_block`, the next
//!   block fetched in the background (Leaf-segment on the client).
//!
//! Each keeps one connection of its own in a background thread; the
//! calls that hand out IDs never touch the network.
//!
//! - `clock`: the clocks (wall for stamps, boot for the lease reckoning).
//! - `registry`: the lease protocol's SQL calls; `keeper`: the holder's
//!   side of the protocol, shared with the server's own lease worker.
//! - `connect`: connections through libpq, every wait bounded.
//! - `generator`, `pool`: the two allocators.

// Shared with the pg_ticket server's own lease worker, which runs the same
// protocol code; not part of this crate's API.
#[doc(hidden)]
pub mod clock;
#[doc(hidden)]
pub mod connect;
mod dsn;
mod duration;
mod generator;
#[doc(hidden)]
pub mod keeper;
mod pool;
mod registry;

// The README's and docs/leases.md's Rust snippets, compiled as doctests
// (SPEC §18.1): a snippet that stops compiling fails `cargo test`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeSnippets;
#[cfg(doctest)]
#[doc = include_str!("../../../docs/leases.md")]
struct LeasesDocSnippets;

pub use generator::{GeneratorConfig, LeasedGenerator};
pub use pool::{BlockPool, PoolConfig, PoolStats};
pub use registry::Grant;
/// Reading IDs back: the layout is the server's `snowflake_id()`'s, the
/// registry's `pg_ticket.machine_bits` (a lease's [`Grant::layout`];
/// `Layout::DEFAULT` unless set otherwise).
pub use ticket_core::snowflake::{IdSpace, Layout, Parts, SnowflakeError};
/// The shard of a key as `shard_of(key, shard_count)` computes it in SQL
/// (FNV-1a 64 of the key's bytes, modulo the count), and the parts of a
/// sharded ID: an application finds a row's shard without asking.
pub use ticket_core::sharded::{decompose as decompose_sharded, shard_of, ShardedParts};
/// Public IDs (docs/public-ids.md): the server's `pgticket.public_id` and
/// `pgticket.private_id` without a round trip, given a key version's 32
/// bytes (`pgticket.public_keys`). The same vectors hold in SQL, Rust and
/// Python.
pub mod public_id {
    pub use ticket_core::public_id::{PublicIdError, PublicKey, FORM_LEN, KEY_LEN};
}

/// Everything the client refuses with. No variant ever comes with an ID.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// A configuration value outside what the protocol allows (a ttl, a
    /// block size): nothing was started.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    #[error("no machine-id lease is held (waiting for the registry{})", last_error_suffix(.last_error))]
    NoLease { last_error: Option<String> },
    /// The registry refuses in a way no retry changes (a missing GRANT, no
    /// pg_ticket there): the wait for a lease ends at once (#48 item 3).
    #[error("the registry refuses to lease: {0}")]
    RegistryRefused(String),
    #[error("the lease of machine id {machine_id} may have ended by this process's reckoning (no renewal within its ttl); no ID is issued until it is renewed or a new lease is held")]
    LeaseMayHaveEnded { machine_id: u16 },
    #[error("this host's clock differs from the registry's by {skew_ms} ms, more than half pg_ticket.lease_margin ({allowed_ms} ms); no ID is issued until they agree")]
    ClockSkew { skew_ms: i64, allowed_ms: i64 },
    #[error("this host's wall clock moved {drift_ms} ms against its boot clock since the registry's last reply, more than half pg_ticket.lease_margin ({allowed_ms} ms); no ID is issued until it agrees again")]
    ClockStepped { drift_ms: i64, allowed_ms: i64 },
    #[error("the registry leases in {now} now, not in {first} as at this generator's first lease: IDs of the two could collide; no ID is issued")]
    SpaceChanged { first: IdSpace, now: IdSpace },
    #[error(transparent)]
    Snowflake(#[from] ticket_core::snowflake::SnowflakeError),
    #[error("no block is available for {name:?} (both blocks spent and no new one fetched in {waited_ms} ms{})", last_error_suffix(.last_error))]
    BlocksExhausted { name: String, waited_ms: u64, last_error: Option<String> },
}

fn last_error_suffix(e: &Option<String>) -> String {
    e.as_ref().map(|e| format!("; last error: {e}")).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configurations_read_from_files_and_stats_write_for_metrics() {
        let g: GeneratorConfig = serde_json::from_str(r#"{"dsn": "host=db1 dbname=ids", "holder": "web-7", "ttl": "30s"}"#).unwrap();
        assert_eq!((g.ttl, g.retry_interval), (std::time::Duration::from_secs(30), std::time::Duration::from_millis(500)));
        let p: PoolConfig = serde_json::from_str(r#"{"dsn": "host=db1", "name": "orders", "block_size": 1000, "call_timeout": "2 min"}"#).unwrap();
        assert_eq!((p.block_size, p.call_timeout, p.wait_timeout), (1000, std::time::Duration::from_secs(120), std::time::Duration::from_secs(5)));
        let bad = serde_json::from_str::<GeneratorConfig>(r#"{"dsn": "x", "holder": "y", "ttl": "soon"}"#).unwrap_err();
        assert!(bad.to_string().contains("not a duration"), "{bad}");
        let stats = serde_json::to_value(PoolStats { blocks_reserved: 2, ..PoolStats::default() }).unwrap();
        assert_eq!(stats["blocks_reserved"], 2);
    }

    /// The vectors of `ticket_core::public_id`, SQL's and Python's.
    #[test]
    fn public_ids_match_the_shared_vectors() {
        let key: Vec<u8> = (0u8..32).collect();
        let k = crate::public_id::PublicKey::new(1, &key).unwrap();
        for (id, form) in [(0i64, "01AHN4TC7RHJWK0"), (42, "0F8R8BWDRQ5F6SB"), (i64::MAX, "0N1K0PTREZBAR34"), (i64::MIN, "05JNEXGYWDHWZ83")] {
            assert_eq!(k.encode(id), form);
            assert_eq!(k.decode(&form.to_lowercase()), Ok(id));
        }
        assert!(k.decode("01AHN4TC7RHJWK1").is_err(), "a changed check character");
    }

    #[test]
    fn a_bad_configuration_is_an_error_of_its_own() {
        let mut config = GeneratorConfig::new("host=/nowhere", "x");
        config.ttl = std::time::Duration::from_millis(10);
        assert!(matches!(LeasedGenerator::start(config), Err(ClientError::InvalidConfig(_))));
        assert!(matches!(BlockPool::start(PoolConfig::new("host=/nowhere", "x", 0)), Err(ClientError::InvalidConfig(_))));
        let mut config = GeneratorConfig::new("host=/nowhere", "x");
        config.retry_interval = std::time::Duration::from_secs(16); // more than half of the default 30 s
        assert!(matches!(LeasedGenerator::start(config), Err(ClientError::InvalidConfig(m)) if m.contains("retry_interval")));
        // A name every server refuses, refused before any wait (helper-9,
        // #48: a holder with a NUL waited its whole wait for NoLease; a
        // pool's empty or over-long name failed only at next_id).
        for name in ["", "a\0b", &"n".repeat(256)] {
            assert!(matches!(BlockPool::start(PoolConfig::new("host=/nowhere", name, 10)), Err(ClientError::InvalidConfig(m)) if m.contains("name")), "{name:?}");
            assert!(matches!(LeasedGenerator::start(GeneratorConfig::new("host=/nowhere", name)), Err(ClientError::InvalidConfig(m)) if m.contains("holder")), "{name:?}");
        }
        for bad in [r#""call_timeout": "0""#, r#""call_timeout": "2d""#, r#""retry_interval": 0"#, r#""check_interval": "0s""#] {
            let config: PoolConfig = serde_json::from_str(&format!(r#"{{"dsn": "host=/nowhere", "name": "x", "block_size": 10, {bad}}}"#)).unwrap();
            assert!(matches!(BlockPool::start(config), Err(ClientError::InvalidConfig(_))), "{bad}");
        }
    }

    #[test]
    fn configurations_refuse_unknown_keys_and_hide_passwords() {
        let typo = serde_json::from_str::<PoolConfig>(r#"{"dsn": "x", "name": "n", "block_size": 10, "wait_timout": "1s"}"#).unwrap_err();
        assert!(typo.to_string().contains("unknown field `wait_timout`"), "{typo}");
        let shown = format!("{:?}", GeneratorConfig::new("host=db1 password=s3cret", "web-7"));
        assert!(shown.contains("password=***") && !shown.contains("s3cret"), "{shown}");
        let shown = format!("{:?}", PoolConfig::new("postgresql://app:s3cret@db1/ids", "orders", 100));
        assert!(shown.contains("app:***@db1") && !shown.contains("s3cret"), "{shown}");
    }
}
