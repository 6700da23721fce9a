//! The nemesis (SPEC §14, issue #19): a fleet on loopback, clients drawing
//! IDs from every allocator, faults injected from a seeded schedule, and a
//! checker that proves the promise from what the clients received.
//!
//!   nemesis run [--seed N] [--seconds S] [--work DIR] [--client-bin PATH] [--fleet N]
//!   nemesis check [--work DIR]        check a run's history again
//!
//! `make soak MINUTES=N` runs it (scripts/soak.sh); the same seed replays
//! the same faults. Exit status 1 if the checker found a violation.

mod check;
mod clients;
mod dialect;
mod faults;
mod fleet;
mod history;
mod proxy;
mod workload;

use history::History;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

struct Args {
    command: String,
    seed: u64,
    seconds: u64,
    work: PathBuf,
    client_bin: PathBuf,
    fleet: u16,
}

fn args() -> Args {
    let mut argv = std::env::args().skip(1);
    let command = argv.next().unwrap_or_else(|| "run".into());
    let here = std::env::current_exe().expect("current exe");
    let mut args = Args {
        command,
        seed: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 % 1_000_000_000,
        seconds: 600,
        work: PathBuf::new(),
        client_bin: here.with_file_name("ticket-worker"),
        fleet: 0,
    };
    while let Some(flag) = argv.next() {
        let value = argv.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--seed" => args.seed = value.parse().expect("--seed N"),
            "--seconds" => args.seconds = value.parse().expect("--seconds S"),
            "--work" => args.work = PathBuf::from(value),
            "--client-bin" => args.client_bin = PathBuf::from(value),
            "--fleet" => args.fleet = value.parse().expect("--fleet N"),
            other => panic!("unknown flag {other}; see the module comment"),
        }
    }
    fleet::choose_fleet(args.fleet);
    if args.work.as_os_str().is_empty() {
        // The fleet's own (/tmp/pgt-nem-work for fleet 0): another fleet's
        // history is not this one's to remove.
        args.work = fleet::server_dir("work");
    }
    args
}

fn main() {
    let args = args();
    let status = match args.command.as_str() {
        "run" => run(&args),
        "check" => report(&args.work, None),
        other => panic!("unknown command {other}: run or check"),
    };
    std::process::exit(status);
}

fn run(args: &Args) -> i32 {
    println!("nemesis: seed {} for {} s (replay: make soak SEED={} MINUTES={})", args.seed, args.seconds, args.seed, args.seconds.div_ceil(60));
    assert!(args.client_bin.exists(), "no client program at {} (cargo build -p pg_ticket_integration --bin ticket-worker)", args.client_bin.display());
    let _ = std::fs::remove_dir_all(&args.work);
    std::fs::create_dir_all(&args.work).unwrap();
    let history = Arc::new(History::create(&args.work.join("history.jsonl")));
    std::fs::write(args.work.join("seed"), format!("{}\n{}\n", args.seed, args.seconds)).unwrap();

    // The proxy is bound before the fleet exists (the primary's
    // configuration names it) and points at the registry's first socket.
    let registry_socket = fleet::server_dir("r").join(format!(".s.PGSQL.{}", fleet::port(fleet::REGISTRY_PORT)));
    let proxy = proxy::Proxy::start(registry_socket);
    let registry_dsn = format!("host=127.0.0.1 port={} user=postgres dbname={} connect_timeout=5", proxy.port, fleet::REGISTRY_DB);
    let fleet = fleet::Fleet::start(&args.work, |_| registry_dsn.clone());
    let lineage = |name, dsn, kinds| {
        Arc::new(workload::Lineage { name, dsn, life: AtomicU32::new(0), gate: RwLock::new(()), pause: AtomicBool::new(false), received: AtomicU64::new(0), kinds })
    };
    let p1_dsn = fleet.p1.lock().unwrap().dsn(fleet::WORK_DB);
    let p1 = lineage("p1", p1_dsn.clone(), workload::EVERY_KIND);
    let p2 = lineage("p2", fleet.p2.dsn(fleet::WORK_DB), workload::EVERY_KIND);
    let r = lineage("r", fleet.registry.lock().unwrap().dsn(fleet::REGISTRY_DB), workload::REGISTRY_KINDS);
    let clients = clients::Clients::start(&args.client_bin, &args.work, &registry_dsn, &p1_dsn);
    let stop = Arc::new(AtomicBool::new(false));
    let threads = workload::spawn(&[p1.clone(), p2.clone(), r.clone()], &history, &stop, args.seed);

    let schedule = faults::schedule(args.seed, args.seconds);
    let mut world = faults::World {
        fleet: &fleet,
        clients: &clients,
        proxy: &proxy,
        history: &history,
        p2: &p2,
        shard_3: faults::Handover::default(),
        rng: rand::SeedableRng::seed_from_u64(args.seed.wrapping_mul(31)),
    };
    // A backup of p2 from the start, so that a restore can come early.
    world.p2_backup();
    let started = Instant::now();
    for (at, fault) in &schedule {
        let due = Duration::from_millis(*at);
        if due > started.elapsed() {
            std::thread::sleep(due - started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(args.seconds) {
            break;
        }
        world.apply(fault);
    }
    let left = Duration::from_secs(args.seconds).saturating_sub(started.elapsed());
    std::thread::sleep(left);

    // Heal, let the clients see the healed fleet for a moment, stop them.
    history.fault("heal", "every process continued, clocks right, the proxy passing, every server up");
    world.heal();
    let ready = [fleet.registry.lock().unwrap().primary.wait_ready(true), fleet.p2.wait_ready(true)];
    for e in ready.into_iter().filter_map(Result::err) {
        history.fault("error", e);
    }
    std::thread::sleep(Duration::from_secs(5));
    stop.store(true, Ordering::SeqCst);
    clients.kill_all();
    let stalled = clients.stalled.load(Ordering::SeqCst);
    history.fault("client_stalled", format!("{stalled} client process(es) killed after recording nothing for 30 s"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while threads.iter().any(|t| !t.is_finished()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    for lineage in [&p1, &p2] {
        if let Err(e) = workload::record_marks(lineage, &history) {
            history.fault("error", format!("read {}'s marks: {}", lineage.name, faults::why(&e)));
        }
    }
    history.flush();
    println!(
        "nemesis: IDs received by SQL clients: p1 {}, p2 {}, the registry's server {}",
        p1.received.load(Ordering::Relaxed),
        p2.received.load(Ordering::Relaxed),
        r.received.load(Ordering::Relaxed)
    );
    let status = report(&args.work, Some(args.seed));
    if status == 0 {
        fleet.stop_all();
    } else {
        println!("nemesis: the fleet is left running for a look; its directories are {}", fleet::server_dir("*").display());
    }
    status
}

/// Check the history in `work`; print what was done and found.
fn report(work: &Path, seed: Option<u64>) -> i32 {
    let events = history::read(&work.join("history.jsonl"));
    let (generator_files, pool_files) = clients::Clients::record_files(work);
    let read = |files: &[PathBuf]| -> Vec<check::ClientIds> {
        files
            .iter()
            .map(|f| check::ClientIds {
                source: f.file_stem().unwrap().to_string_lossy().into_owned(),
                ids: history::read_records(f).into_iter().map(|(id, _)| id).collect(),
            })
            .collect()
    };
    let (generators, pools) = (read(&generator_files), read(&pool_files));

    let mut faults: BTreeMap<&str, usize> = faults::KINDS.iter().map(|k| (*k, 0)).collect();
    let mut errors = Vec::new();
    let mut received: BTreeMap<&str, usize> = BTreeMap::new();
    for e in &events {
        match e {
            history::Event::Fault { kind, detail, .. } if kind == "error" => errors.push(detail.clone()),
            history::Event::Fault { kind, detail, .. } if kind == "client_stalled" => println!("nemesis: {detail}"),
            history::Event::Fault { kind, .. } if kind == "warned_commit" => *received.entry("blocks answered with a WARNING (not used)").or_default() += 1,
            history::Event::Fault { kind, .. } => {
                if let Some(n) = faults.get_mut(kind.as_str()) {
                    *n += 1;
                }
            }
            history::Event::Counter { values, outcome, .. } => {
                *received.entry(if *outcome == history::Outcome::Committed { "counter values committed" } else { "counter values not committed" }).or_default() += values.len()
            }
            history::Event::Block { .. } => *received.entry("blocks").or_default() += 1,
            history::Event::Tickets { values, .. } => *received.entry("tickets").or_default() += values.len(),
            history::Event::Snowflakes { ids, .. } => *received.entry("server snowflakes").or_default() += ids.len(),
            history::Event::Sharded { ids, .. } => *received.entry("sharded IDs").or_default() += ids.len(),
            _ => {}
        }
    }
    *received.entry("leased snowflakes (client processes)").or_default() += generators.iter().map(|g| g.ids.len()).sum::<usize>();
    *received.entry("block pool IDs (client processes)").or_default() += pools.iter().map(|p| p.ids.len()).sum::<usize>();
    println!("nemesis: faults: {}", faults.iter().map(|(k, n)| format!("{k} {n}")).collect::<Vec<_>>().join(", "));
    println!("nemesis: received: {}", received.iter().map(|(k, n)| format!("{k} {n}")).collect::<Vec<_>>().join(", "));
    for e in &errors {
        println!("nemesis: harness error: {e}");
    }

    let series: HashMap<String, (i64, i64)> = fleet::SERIES.iter().map(|(l, s)| (l.to_string(), *s)).collect();
    let violations = check::check(&events, &generators, &pools, &series);
    if violations.is_empty() {
        println!("nemesis: no violation");
        return 0;
    }
    println!("nemesis: {} violation(s){}", violations.len(), seed.map(|s| format!(" with seed {s}")).unwrap_or_default());
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for v in &violations {
        *kinds.entry(v.kind).or_default() += 1;
    }
    println!("nemesis: by kind: {}", kinds.iter().map(|(k, n)| format!("{k} {n}")).collect::<Vec<_>>().join(", "));
    // The first three of each kind, with the faults around them.
    let mut shown: BTreeMap<&str, usize> = BTreeMap::new();
    for v in &violations {
        let n = shown.entry(v.kind).or_default();
        *n += 1;
        if *n > 3 {
            continue;
        }
        println!("  VIOLATION ({}): {}", v.kind, v.what);
        let (from, to) = (v.times.iter().min().map_or(0, |t| t.saturating_sub(15_000)), v.times.iter().max().map_or(u64::MAX, |t| t + 2_000));
        for e in &events {
            if let history::Event::Fault { t, kind, detail } = e {
                if (from..=to).contains(t) {
                    println!("      fault at {:.3} s: {kind} {detail}", *t as f64 / 1000.0);
                }
            }
        }
    }
    1
}
