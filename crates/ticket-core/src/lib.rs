//! The parts of pg_ticket that need no PostgreSQL: they are unit-tested with
//! `cargo test -p ticket-core` and a fake clock.

pub mod counter;
pub mod fast_map;
pub mod group;
pub mod directory;
pub mod epoch;
pub mod leases;
pub mod ledger;
pub mod local_marks;
pub mod public_id;
pub mod rights;
pub mod sharded;
pub mod snowflake;
pub mod tickets;
