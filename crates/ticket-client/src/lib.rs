//! pg_ticket for application processes that make IDs themselves (SPEC §9).
//!
//! - [`LeasedGenerator`]: snowflake IDs stamped with a machine id leased
//!   from a pg_ticket registry (`lease_machine_id`), with the layout and
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

pub mod clock;
pub mod connect;
mod generator;
pub mod keeper;
mod pool;
mod registry;

pub use generator::{GeneratorConfig, LeasedGenerator};
pub use pool::{BlockPool, PoolConfig, PoolStats};
pub use registry::Grant;

/// Everything the client refuses with. No variant ever comes with an ID.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no machine-id lease is held (waiting for the registry{})", last_error_suffix(.last_error))]
    NoLease { last_error: Option<String> },
    #[error("the lease of machine id {machine_id} may have ended by this process's reckoning (no renewal within its ttl); no ID is issued until it is renewed or a new lease is held")]
    LeaseMayHaveEnded { machine_id: u16 },
    #[error("this host's clock differs from the registry's by {skew_ms} ms, more than half pg_ticket.lease_margin ({allowed_ms} ms); no ID is issued until they agree")]
    ClockSkew { skew_ms: i64, allowed_ms: i64 },
    #[error("this host's wall clock moved {drift_ms} ms against its boot clock since the registry's last reply, more than half pg_ticket.lease_margin ({allowed_ms} ms); no ID is issued until it agrees again")]
    ClockStepped { drift_ms: i64, allowed_ms: i64 },
    #[error("the registry's epoch is now {now_ms} (Unix ms), not {first_ms} as at this generator's first lease: IDs of the two could collide; no ID is issued")]
    EpochChanged { first_ms: i64, now_ms: i64 },
    #[error(transparent)]
    Snowflake(#[from] ticket_core::snowflake::SnowflakeError),
    #[error("no block is available for {name:?} (both blocks spent and no new one fetched in {waited_ms} ms{})", last_error_suffix(.last_error))]
    BlocksExhausted { name: String, waited_ms: u64, last_error: Option<String> },
}

fn last_error_suffix(e: &Option<String>) -> String {
    e.as_ref().map(|e| format!("; last error: {e}")).unwrap_or_default()
}
