//! An application process for the client tests: draws IDs with
//! `ticket-client` and appends them to a file, so that a test can kill it
//! at any moment and still check every ID it wrote.
//!
//!   ticket-worker gen DSN HOLDER TTL_MS OUT COUNT
//!       leased snowflakes; records of (id, lease token), 16 bytes each;
//!       after COUNT IDs the generator is dropped (released) and it exits.
//!   ticket-worker blocks DSN NAME SIZE OUT COUNT
//!       a block pool; records of (id, 0); at the end prints
//!       `handed H lost L discarded D unused FIRST-LAST ...`.

use std::io::Write;
use std::time::Duration;
use ticket_client::{BlockPool, GeneratorConfig, LeasedGenerator, PoolConfig};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize| args.get(i).unwrap_or_else(|| panic!("missing argument {i}; see the module comment")).as_str();
    let mut out = std::io::BufWriter::new(std::fs::OpenOptions::new().create(true).append(true).open(arg(5)).expect("output file"));
    let count: u64 = arg(6).parse().expect("COUNT");
    let record = |out: &mut std::io::BufWriter<std::fs::File>, id: i64, token: i64| {
        out.write_all(&id.to_le_bytes()).unwrap();
        out.write_all(&token.to_le_bytes()).unwrap();
    };
    match arg(1) {
        "gen" => {
            let mut config = GeneratorConfig::new(arg(2), arg(3));
            config.ttl = Duration::from_millis(arg(4).parse().expect("TTL_MS"));
            config.retry_interval = Duration::from_millis(100);
            let generator = LeasedGenerator::start(config).expect("start");
            let mut issued = 0;
            while issued < count {
                // Bursts of 100, flushed together: a kill loses at most a
                // burst that nobody else can have.
                for _ in 0..100 {
                    match generator.next_id_with_lease() {
                        Ok((id, token)) => {
                            record(&mut out, id, token);
                            issued += 1;
                        }
                        Err(_) => {
                            std::thread::sleep(Duration::from_millis(2));
                            break;
                        }
                    }
                }
                out.flush().unwrap();
                std::thread::sleep(Duration::from_millis(10));
            }
            drop(generator);
        }
        "blocks" => {
            let pool = BlockPool::start(PoolConfig::new(arg(2), arg(3), arg(4).parse().expect("SIZE"))).expect("start");
            for i in 0..count {
                record(&mut out, pool.next_id().expect("an ID"), 0);
                if i % 100 == 99 {
                    out.flush().unwrap();
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            out.flush().unwrap();
            let (stats, unused) = pool.close();
            let unused: Vec<String> = unused.iter().map(|(a, b)| format!("{a}-{b}")).collect();
            println!("handed {} lost {} discarded {} unused {}", stats.ids_handed_out, stats.lost_replies, stats.blocks_discarded, unused.join(" "));
        }
        other => panic!("unknown mode {other}"),
    }
}
