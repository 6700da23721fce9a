//! The leased client's IDs as a table's primary key under insert load
//! (`make bench-inserts`, #49): CLIENTS threads, each with its own
//! connection, insert ROWS rows into `k_client` in transactions of 10, every
//! ID made in this process by one `LeasedGenerator` (no round trip per ID)
//! and sent as a parameter, as an application does. Prints the rows and
//! the seconds the inserts took: from when every thread is connected and
//! the lease is held, so the process's start and the lease are not
//! counted (helper-13: pgbench's kinds pay neither).
//!
//!     insert_leased DSN ROWS CLIENTS

use std::sync::Arc;
use std::time::{Duration, Instant};
use ticket_client::{GeneratorConfig, LeasedGenerator};

const PER_TXN: usize = 10;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(dsn), Some(rows), Some(clients)) = (args.next(), args.next(), args.next()) else {
        return Err("usage: insert_leased DSN ROWS CLIENTS".into());
    };
    let (rows, clients): (usize, usize) = (rows.parse()?, clients.parse()?);
    let generator = Arc::new(LeasedGenerator::start(GeneratorConfig::new(dsn.clone(), format!("bench-inserts-{}", std::process::id())))?);
    generator.wait_for_lease(Duration::from_secs(90))?;
    let per_client = rows / clients / PER_TXN;
    let ready = Arc::new(std::sync::Barrier::new(clients + 1));
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let (dsn, generator, ready) = (dsn.clone(), generator.clone(), ready.clone());
            std::thread::spawn(move || -> Result<(), String> {
                let prepared = postgres::Client::connect(&dsn, postgres::NoTls).and_then(|mut db| {
                    let insert = db.prepare("INSERT INTO k_client (id, payload) SELECT * FROM unnest($1::bigint[], $2::text[])")?;
                    Ok((db, insert))
                });
                ready.wait();
                let (mut db, insert) = prepared.map_err(|e| e.to_string())?;
                // A 100-character payload per row, as the pgbench kinds'
                // (xorshift: no dependency).
                let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ (c as u64 + 1);
                let mut payload = || {
                    (0..4)
                        .map(|_| {
                            state ^= state << 13;
                            state ^= state >> 7;
                            state ^= state << 17;
                            format!("{state:025x}")
                        })
                        .collect::<String>()
                };
                for _ in 0..per_client {
                    let ids = (0..PER_TXN).map(|_| generator.next_id()).collect::<Result<Vec<i64>, _>>().map_err(|e| e.to_string())?;
                    let payloads: Vec<String> = (0..PER_TXN).map(|_| payload()).collect();
                    db.execute(&insert, &[&ids, &payloads]).map_err(|e| e.to_string())?;
                }
                Ok(())
            })
        })
        .collect();
    ready.wait();
    let started = Instant::now();
    for t in threads {
        t.join().map_err(|_| "a client thread panicked")??;
    }
    let secs = started.elapsed().as_secs_f64();
    println!("{} rows in {secs:.3} s", per_client * clients * PER_TXN);
    Ok(())
}
