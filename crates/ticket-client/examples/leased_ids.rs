//! Snowflake IDs in an application process, on a machine id leased from
//! the demo cluster's registry (`make run` first):
//!
//!     cargo run -p ticket-client --example leased_ids
//!     cargo run -p ticket-client --example leased_ids -- "host=/tmp/pgt-demo port=55432 user=postgres"
//!
//! Shows the lease, a few IDs decoded, the lease in `pgticket.machine_ids`,
//! and the release on drop. Run in `make test` against a registry as the
//! role docs/leases.md sets up (tests/integration/tests/client_examples.rs).

use std::time::Duration;
use ticket_client::{GeneratorConfig, LeasedGenerator};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dsn = std::env::args().nth(1).unwrap_or_else(|| "host=/tmp/pgt-demo port=55432 user=postgres dbname=postgres".into());
    run(&dsn)
}

pub fn run(dsn: &str) -> Result<(), Box<dyn std::error::Error>> {
    let mut config = GeneratorConfig::new(dsn, format!("example-{}", std::process::id()));
    config.ttl = Duration::from_secs(30);
    let generator = LeasedGenerator::start(config)?;
    // A registry just created or restarted grants nothing for a while (55 s
    // by default: docs/leases.md); the generator retries until then.
    let grant = generator.wait_for_lease(Duration::from_secs(90))?;
    println!(
        "leased machine id {} (lease {}), stamping above {} ms, in {}",
        grant.machine_id,
        grant.lease,
        grant.not_before_ms,
        grant.space()
    );
    for _ in 0..5 {
        let id = generator.next_id()?;
        let parts = grant.layout.decompose(id)?;
        println!("{id}  = ms {} since the epoch, machine {}, sequence {}", parts.millis, parts.machine_id, parts.sequence);
    }
    let started = std::time::Instant::now();
    let mut n = 0u64;
    while started.elapsed() < Duration::from_secs(1) {
        generator.next_id()?;
        n += 1;
    }
    println!("{n} IDs in one second from this process");

    let mut db = postgres::Client::connect(dsn, postgres::NoTls)?;
    for row in db.query("SELECT machine_id, holder, lease, state FROM pgticket.machine_ids WHERE machine_id = $1", &[&i32::from(grant.machine_id)])? {
        // The token is shown to the registry's owner only (NULL otherwise).
        let token = row.get::<_, Option<i64>>(2).map_or("hidden".to_string(), |t| t.to_string());
        println!("registry: id {} held by {} (lease {token}): {}", row.get::<_, i32>(0), row.get::<_, String>(1), row.get::<_, String>(3));
    }
    drop(generator); // releases the lease, reporting the last stamp
    let state: String = db.query_one("SELECT state FROM pgticket.machine_ids WHERE machine_id = $1", &[&i32::from(grant.machine_id)])?.get(0);
    println!("after drop: {state}");
    Ok(())
}
