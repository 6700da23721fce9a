//! IDs from blocks reserved in the demo cluster (`make run` first), the
//! next block fetched in the background:
//!
//!     cargo run -p ticket-client --example block_pool
//!
//! Run in `make test` as an ordinary role (tests/integration/tests/client_examples.rs).

use std::time::Duration;
use ticket_client::{BlockPool, PoolConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dsn = std::env::args().nth(1).unwrap_or_else(|| "host=/tmp/pgt-demo port=55432 user=postgres dbname=postgres".into());
    run(&dsn)
}

pub fn run(dsn: &str) -> Result<(), Box<dyn std::error::Error>> {
    let mut config = PoolConfig::new(dsn, "example-orders", 1_000);
    config.wait_timeout = Duration::from_secs(5);
    let pool = BlockPool::start(config)?;
    let first: Vec<i64> = (0..5).map(|_| pool.next_id()).collect::<Result<_, _>>()?;
    println!("first IDs: {first:?}");
    for _ in 0..10_000 {
        pool.next_id()?;
    }
    let (stats, unused) = pool.close();
    println!("{} IDs handed out from {} blocks; left unused (a gap): {unused:?}", stats.ids_handed_out, stats.blocks_reserved);
    Ok(())
}
