//! Client processes (`ticket-worker` of `tests/integration`): leased
//! snowflake generators that lease from the registry through the proxy,
//! and a block pool on lineage p1. Each run of a process writes its own
//! record file; a supervisor starts the next run of a slot when one ends
//! (it ran its count, it was killed, it gave up). They run under
//! libfaketime with one clock file for all, so clocks step under them too.
//! A process that records nothing for `STALL` (past any fault's pause and
//! a registry's hold-off) is killed and counted: the client hung (0.2.0's
//! client had unbounded calls), and a hung holder proves nothing.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const STALL: Duration = Duration::from_secs(30);

pub const GENERATORS: usize = 3;

struct Slot {
    name: String,
    args: Vec<String>,
    run: u32,
    child: Option<Child>,
    /// The record file's size and when it last grew.
    progress: (u64, Instant),
}

pub struct Clients {
    bin: PathBuf,
    dir: PathBuf,
    pub clock: PathBuf,
    slots: Mutex<Vec<Slot>>,
    stop: AtomicBool,
    /// Processes killed for recording nothing for `STALL`.
    pub stalled: AtomicU64,
}

fn faketime_lib() -> String {
    let out = Command::new("sh").args(["-c", "dpkg -L libfaketime | grep '/libfaketime.so.1$' | head -1"]).output().expect("dpkg");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

impl Clients {
    pub fn start(bin: &Path, work: &Path, registry_dsn: &str, p1_dsn: &str) -> Arc<Clients> {
        let dir = work.join("clients");
        std::fs::create_dir_all(&dir).unwrap();
        let clock = work.join("clock-clients");
        crate::fleet::set_clock(&clock, "+0");
        let mut slots: Vec<Slot> = (0..GENERATORS)
            .map(|i| Slot {
                name: format!("gen-{i}"),
                args: vec!["gen".into(), registry_dsn.into(), format!("nemesis-gen-{i}"), "3000".into(), "OUT".into(), "20000".into()],
                run: 0,
                child: None,
                progress: (0, Instant::now()),
            })
            .collect();
        slots.push(Slot { name: "pool-0".into(), args: vec!["blocks".into(), p1_dsn.into(), "pool".into(), "200".into(), "OUT".into(), "5000".into()], run: 0, child: None, progress: (0, Instant::now()) });
        let clients = Arc::new(Clients {
            bin: bin.to_path_buf(),
            dir,
            clock,
            slots: Mutex::new(slots),
            stop: AtomicBool::new(false),
            stalled: AtomicU64::new(0),
        });
        let supervisor = clients.clone();
        std::thread::spawn(move || supervisor.supervise());
        clients
    }

    fn supervise(&self) {
        let lib = faketime_lib();
        while !self.stop.load(Ordering::SeqCst) {
            {
                let mut slots = self.slots.lock().unwrap();
                for slot in slots.iter_mut() {
                    let ended = match &mut slot.child {
                        None => true,
                        Some(child) => child.try_wait().map(|s| s.is_some()).unwrap_or(true),
                    };
                    if !ended {
                        let size = std::fs::metadata(self.dir.join(format!("{}-{}.bin", slot.name, slot.run))).map_or(0, |m| m.len());
                        if size != slot.progress.0 {
                            slot.progress = (size, Instant::now());
                        } else if slot.progress.1.elapsed() > STALL {
                            if let Some(child) = &mut slot.child {
                                unsafe { libc::kill(child.id() as i32, libc::SIGCONT) };
                                let _ = child.kill();
                                let _ = child.wait();
                            }
                            self.stalled.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    if ended && !self.stop.load(Ordering::SeqCst) {
                        slot.run += 1;
                        slot.progress = (0, Instant::now());
                        let out = self.dir.join(format!("{}-{}.bin", slot.name, slot.run));
                        let args: Vec<String> = slot.args.iter().map(|a| if a == "OUT" { out.display().to_string() } else { a.clone() }).collect();
                        let log = std::fs::File::create(self.dir.join(format!("{}-{}.log", slot.name, slot.run))).unwrap();
                        let child = Command::new(&self.bin)
                            .args(&args)
                            .env("LD_PRELOAD", &lib)
                            .env("FAKETIME_TIMESTAMP_FILE", &self.clock)
                            .env("FAKETIME_NO_CACHE", "1")
                            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                            .stdout(log.try_clone().unwrap())
                            .stderr(log)
                            .stdin(Stdio::null())
                            .spawn()
                            .unwrap_or_else(|e| panic!("start {}: {e}", self.bin.display()));
                        slot.child = Some(child);
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A running client's pid and name, chosen by `pick` (an index).
    pub fn pick(&self, pick: usize) -> Option<(i32, String)> {
        let slots = self.slots.lock().unwrap();
        let slot = &slots[pick % slots.len()];
        slot.child.as_ref().map(|c| (c.id() as i32, format!("{}-{}", slot.name, slot.run)))
    }

    pub fn kill_all(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let mut slots = self.slots.lock().unwrap();
        for slot in slots.iter_mut() {
            if let Some(mut child) = slot.child.take() {
                unsafe { libc::kill(child.id() as i32, libc::SIGCONT) };
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }

    /// Every record file, by kind: (generators, pools).
    pub fn record_files(work: &Path) -> (Vec<PathBuf>, Vec<PathBuf>) {
        let mut files: Vec<PathBuf> = std::fs::read_dir(work.join("clients"))
            .map(|d| d.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "bin")).collect())
            .unwrap_or_default();
        files.sort();
        let name = |p: &PathBuf| p.file_name().unwrap().to_string_lossy().into_owned();
        let (generators, pools) = files.into_iter().partition(|p| name(p).starts_with("gen-"));
        (generators, pools)
    }
}
