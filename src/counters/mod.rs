//! Scoped counters (`next_scoped_id`) and blocks (`reserve_block`): gap-free,
//! transactional high-water marks in `pgticket.scoped_counters` and
//! `pgticket.blocks`.
//!
//! - `allocator`: the transaction's held marks (served without SQL after the
//!   first allocation from a scope), savepoint undo, and the transaction
//!   callbacks that write the marks back, durably, at commit.
//! - `store`: the SPI statements; the only code that reads or writes the two
//!   tables, always as their owner.
//! Which relations the tables are and who owns each: `crate::state_tables`.
//!
//! This module touches nothing but those two tables and backend-local state.

mod allocator;
mod store;

pub use allocator::{advance, claim, current, limit, retire, take, take_again, Kind};
pub use store::merge_loaded;
