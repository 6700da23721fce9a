//! The faults (SPEC §14) and their schedule. The schedule — which fault,
//! when, on what, for how long — is drawn from the seed alone before the
//! run, so a seed replays the same faults (the clients' timing around them
//! differs from run to run). Each fault heals itself before the next one
//! starts (a stopped process continued, a clock set back, a server started
//! again), except those that change the fleet for good: a promotion, a
//! restored registry, a new life of the extension, a reloaded setting.

use crate::clients::Clients;
use crate::fleet::{create_extension, Fleet, Pair, Server, REGISTRY_DB, WORK_DB};
use crate::history::History;
use crate::proxy::Proxy;
use crate::workload::Lineage;
use pg_ticket_integration::{owned_dir, pg_tool};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Registry,
    P1,
    Standby,
    P2,
}

#[derive(Clone, Debug)]
pub enum Fault {
    /// SIGKILL of the postmaster and every process of the server (a
    /// machine's crash), then a start.
    KillServer(Target),
    /// SIGKILL of the postmaster only (its children notice and exit).
    KillPostmaster(Target),
    ImmediateRestart(Target),
    /// SIGKILL of one client backend (the server restarts them all).
    KillBackend(Target),
    /// SIGKILL of pg_ticket's ticket or lease worker.
    KillWorker(Target),
    KillClient(usize),
    StopServer(Target, u64),
    StopClient(usize, u64),
    /// Wall clock set off by `seconds` for `ms`, then back.
    ClockStep(Option<Target>, i64, u64),
    ProxyDelay(u64, u64),
    ProxyDrop(u64),
    ProxyCut,
    /// The synchronous standby stopped for `ms`; its waiters cancelled,
    /// then terminated.
    StandbyAway(u64),
    /// The primary killed, the standby promoted, a new standby made.
    Failover,
    /// The standby stops, the primary's waiters are cancelled and
    /// terminated, the primary dies, the standby comes back and is promoted.
    StandbyAwayThenFailover,
    RegistryBackup,
    RegistryRestoreBackup,
    RegistryDump,
    RegistryRestoreDump,
    /// DROP and CREATE EXTENSION on p2 (a new life of its marks).
    RecreateExtension,
    Reload(Target, &'static str, &'static str),
}

impl Fault {
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::KillServer(_) => "kill_server",
            Fault::KillPostmaster(_) => "kill_postmaster",
            Fault::ImmediateRestart(_) => "immediate_restart",
            Fault::KillBackend(_) => "kill_backend",
            Fault::KillWorker(_) => "kill_worker",
            Fault::KillClient(_) => "kill_client",
            Fault::StopServer(..) => "sigstop_server",
            Fault::StopClient(..) => "sigstop_client",
            Fault::ClockStep(..) => "clock_step",
            Fault::ProxyDelay(..) => "proxy_delay",
            Fault::ProxyDrop(_) => "proxy_drop",
            Fault::ProxyCut => "proxy_cut",
            Fault::StandbyAway(_) => "standby_away",
            Fault::Failover => "failover",
            Fault::StandbyAwayThenFailover => "standby_away_then_failover",
            Fault::RegistryBackup => "registry_backup",
            Fault::RegistryRestoreBackup => "registry_restore_backup",
            Fault::RegistryDump => "registry_dump",
            Fault::RegistryRestoreDump => "registry_restore_dump",
            Fault::RecreateExtension => "recreate_extension",
            Fault::Reload(..) => "reload",
        }
    }
}

pub const KINDS: [&str; 21] = [
    "kill_server",
    "kill_postmaster",
    "immediate_restart",
    "kill_backend",
    "kill_worker",
    "kill_client",
    "sigstop_server",
    "sigstop_client",
    "clock_step",
    "proxy_delay",
    "proxy_drop",
    "proxy_cut",
    "standby_away",
    "failover",
    "standby_away_then_failover",
    "registry_backup",
    "registry_restore_backup",
    "registry_dump",
    "registry_restore_dump",
    "recreate_extension",
    "reload",
];

fn any_target(rng: &mut StdRng) -> Target {
    [Target::Registry, Target::P1, Target::Standby, Target::P2][rng.gen_range(0..4)]
}

/// A fault of kind `KINDS[kind]`, its target and times drawn.
fn draw(kind: usize, rng: &mut StdRng) -> Fault {
    let clients = crate::clients::GENERATORS + 1;
    match KINDS[kind] {
        "kill_server" => Fault::KillServer(any_target(rng)),
        "kill_postmaster" => Fault::KillPostmaster(any_target(rng)),
        "immediate_restart" => Fault::ImmediateRestart(any_target(rng)),
        "kill_backend" => Fault::KillBackend([Target::Registry, Target::P1, Target::P2][rng.gen_range(0..3)]),
        "kill_worker" => Fault::KillWorker([Target::P1, Target::P2][rng.gen_range(0..2)]),
        "kill_client" => Fault::KillClient(rng.gen_range(0..clients)),
        "sigstop_server" => Fault::StopServer(any_target(rng), rng.gen_range(500..5000)),
        "sigstop_client" => Fault::StopClient(rng.gen_range(0..clients), rng.gen_range(500..6000)),
        "clock_step" => {
            let target = [None, Some(Target::Registry), Some(Target::P1), Some(Target::P2)][rng.gen_range(0..4)];
            let seconds = [-60, -10, -3, -1, 1, 3, 10, 60][rng.gen_range(0..8)];
            Fault::ClockStep(target, seconds, rng.gen_range(1000..6000))
        }
        "proxy_delay" => Fault::ProxyDelay(rng.gen_range(100..1500), rng.gen_range(1000..5000)),
        "proxy_drop" => Fault::ProxyDrop(rng.gen_range(1000..6000)),
        "proxy_cut" => Fault::ProxyCut,
        "standby_away" => Fault::StandbyAway(rng.gen_range(1500..5000)),
        "failover" => Fault::Failover,
        "standby_away_then_failover" => Fault::StandbyAwayThenFailover,
        "registry_backup" => Fault::RegistryBackup,
        "registry_restore_backup" => Fault::RegistryRestoreBackup,
        "registry_dump" => Fault::RegistryDump,
        "registry_restore_dump" => Fault::RegistryRestoreDump,
        "recreate_extension" => Fault::RecreateExtension,
        "reload" => match rng.gen_range(0..3) {
            0 => Fault::Reload(Target::Registry, "pg_ticket.lease_margin", ["1s", "2s"][rng.gen_range(0..2)]),
            1 => Fault::Reload(Target::Registry, "pg_ticket.lease_max_ttl", ["5s", "10s"][rng.gen_range(0..2)]),
            _ => Fault::Reload(Target::P1, "pg_ticket.machine_lease_ttl", ["2s", "3s", "5s"][rng.gen_range(0..3)]),
        },
        other => unreachable!("{other} is in KINDS but not drawn"),
    }
}

/// Kinds that cost seconds of the fleet's time (a base backup, a
/// promotion, a restore): once per round; the quick ones up to three times.
const SLOW: [&str; 8] = [
    "failover",
    "standby_away_then_failover",
    "registry_backup",
    "registry_restore_backup",
    "registry_dump",
    "registry_restore_dump",
    "recreate_extension",
    "standby_away",
];

/// (start, fault) for a run of `seconds`, one every 1–4 s after a 5 s
/// start: rounds in which every kind fires once, in an order of the
/// seed's, with as many more quick ones mixed in.
pub fn schedule(seed: u64, seconds: u64) -> Vec<(u64, Fault)> {
    use rand::seq::SliceRandom;
    let mut rng = StdRng::seed_from_u64(seed);
    let quick: Vec<usize> = (0..KINDS.len()).filter(|k| !SLOW.contains(&KINDS[*k])).collect();
    let mut at = 5_000;
    let mut faults = Vec::new();
    while at < seconds * 1000 {
        let mut round: Vec<usize> = (0..KINDS.len()).collect();
        round.extend(quick.choose_multiple(&mut rng, quick.len()).copied());
        round.shuffle(&mut rng);
        for kind in round {
            if at >= seconds * 1000 {
                break;
            }
            faults.push((at, draw(kind, &mut rng)));
            at += rng.gen_range(1000..4000);
        }
    }
    faults
}

pub struct World<'a> {
    pub fleet: &'a Fleet,
    pub clients: &'a Clients,
    pub proxy: &'a Proxy,
    pub history: &'a History,
    pub p2: &'a Arc<Lineage>,
    pub rng: StdRng,
}

fn sleep_ms(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

impl World<'_> {
    /// Run `f` on the server `target` names now.
    fn on<R>(&self, target: Target, f: impl FnOnce(&Server) -> R) -> Option<R> {
        match target {
            Target::Registry => Some(f(&self.fleet.registry)),
            Target::P2 => Some(f(&self.fleet.p2)),
            Target::P1 => Some(f(&self.fleet.p1.lock().unwrap().primary)),
            Target::Standby => self.fleet.p1.lock().unwrap().standby.as_ref().map(f),
        }
    }

    fn restart(&self, server: &Server) {
        if let Err(e) = server.up() {
            self.history.fault("error", e);
        }
    }

    pub fn apply(&mut self, fault: &Fault) {
        let (h, kind) = (self.history, fault.kind());
        match fault {
            Fault::KillServer(target) => {
                self.on(*target, |s| {
                    let n = s.signal_all(libc::SIGKILL);
                    h.fault(kind, format!("{} ({n} processes)", s.name));
                    sleep_ms(300);
                    self.restart(s);
                });
            }
            Fault::KillPostmaster(target) => {
                self.on(*target, |s| {
                    if let Some(pm) = s.postmaster() {
                        unsafe { libc::kill(pm, libc::SIGKILL) };
                        h.fault(kind, format!("{} (pid {pm})", s.name));
                        sleep_ms(500);
                        self.restart(s);
                    }
                });
            }
            Fault::ImmediateRestart(target) => {
                self.on(*target, |s| {
                    h.fault(kind, s.name.clone());
                    s.stop("immediate");
                    self.restart(s);
                });
            }
            Fault::KillBackend(target) | Fault::KillWorker(target) => {
                let which = if matches!(fault, Fault::KillBackend(_)) { "backend_type = 'client backend'" } else { "backend_type LIKE 'pg_ticket%'" };
                let pick = self.rng.gen_range(0..1000);
                self.on(*target, |s| {
                    let pids = backends(s, which);
                    if !pids.is_empty() {
                        let pid = pids[pick % pids.len()];
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                        h.fault(kind, format!("{} pid {pid}", s.name));
                    }
                });
            }
            Fault::KillClient(i) => {
                if let Some((pid, name)) = self.clients.pick(*i) {
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    h.fault(kind, name);
                }
            }
            Fault::StopServer(target, ms) => {
                self.on(*target, |s| {
                    let n = s.signal_all(libc::SIGSTOP);
                    h.fault(kind, format!("{} ({n} processes) for {ms} ms", s.name));
                    sleep_ms(*ms);
                    s.signal_all(libc::SIGCONT);
                });
            }
            Fault::StopClient(i, ms) => {
                if let Some((pid, name)) = self.clients.pick(*i) {
                    unsafe { libc::kill(pid, libc::SIGSTOP) };
                    h.fault(kind, format!("{name} for {ms} ms"));
                    sleep_ms(*ms);
                    unsafe { libc::kill(pid, libc::SIGCONT) };
                }
            }
            Fault::ClockStep(target, seconds, ms) => {
                let offset = format!("{seconds:+}s");
                let file = match target {
                    None => self.clients.clock.clone(),
                    Some(t) => self.on(*t, |s| s.clock.clone()).unwrap(),
                };
                h.fault(kind, format!("{} {offset} for {ms} ms", file.display()));
                crate::fleet::set_clock(&file, &offset);
                sleep_ms(*ms);
                crate::fleet::set_clock(&file, "+0");
            }
            Fault::ProxyDelay(delay, ms) => {
                h.fault(kind, format!("{delay} ms for {ms} ms"));
                self.proxy.delay(*delay);
                sleep_ms(*ms);
                self.proxy.pass();
            }
            Fault::ProxyDrop(ms) => {
                h.fault(kind, format!("for {ms} ms"));
                self.proxy.drop_all();
                sleep_ms(*ms);
                self.proxy.pass();
                self.proxy.cut(); // what was swallowed leaves those connections useless
            }
            Fault::ProxyCut => {
                let n = self.proxy.cut();
                h.fault(kind, format!("{n} connections"));
            }
            Fault::StandbyAway(ms) => self.standby_away(*ms),
            Fault::Failover => self.failover(false),
            Fault::StandbyAwayThenFailover => self.failover(true),
            Fault::RegistryBackup => self.registry_backup(),
            Fault::RegistryRestoreBackup => self.registry_restore_backup(),
            Fault::RegistryDump => self.registry_dump(),
            Fault::RegistryRestoreDump => self.registry_restore_dump(),
            Fault::RecreateExtension => self.recreate_extension(),
            Fault::Reload(target, setting, value) => {
                let db = if *target == Target::Registry { REGISTRY_DB } else { WORK_DB };
                let done = self.on(*target, |s| s.alter_system(db, setting, value));
                h.fault(kind, format!("{target:?} {setting} = {value}: {}", outcome(done)));
            }
        }
    }

    /// Cancel, then terminate, the primary's sessions waiting for the
    /// standby (and every other active session of the nemesis's clients).
    fn cancel_and_terminate_waiters(&self, primary: &Server) {
        let Ok(mut c) = primary.connect(WORK_DB) else { return };
        let cancelled = c
            .query("SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND pid <> pg_backend_pid()", &[])
            .map(|r| r.len())
            .unwrap_or(0);
        sleep_ms(500);
        let terminated = c
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                  WHERE (wait_event = 'SyncRep' OR (application_name = 'nemesis' AND state = 'active')) AND pid <> pg_backend_pid()",
                &[],
            )
            .map(|r| r.len())
            .unwrap_or(0);
        self.history.fault("waiters", format!("{}: {cancelled} cancelled, {terminated} terminated", primary.name));
    }

    fn standby_away(&self, ms: u64) {
        let pair = self.fleet.p1.lock().unwrap();
        let Some(standby) = &pair.standby else { return };
        self.history.fault("standby_away", format!("{} for {ms} ms", standby.name));
        standby.stop("immediate");
        sleep_ms(ms / 2);
        self.cancel_and_terminate_waiters(&pair.primary);
        sleep_ms(ms / 2);
        self.restart(standby);
    }

    fn failover(&self, standby_away_first: bool) {
        let mut pair = self.fleet.p1.lock().unwrap();
        let Some(standby) = pair.standby.take() else { return };
        let kind = if standby_away_first { "standby_away_then_failover" } else { "failover" };
        self.history.fault(kind, format!("{} dies, {} is promoted", pair.primary.name, standby.name));
        if standby_away_first {
            standby.stop("immediate");
            sleep_ms(1500);
            self.cancel_and_terminate_waiters(&pair.primary);
            sleep_ms(500);
        }
        pair.primary.signal_all(libc::SIGKILL);
        if standby_away_first {
            self.restart(&standby);
        }
        // The standby may still be replaying; promote waits for it.
        if let Err(e) = standby.wait_ready(false) {
            self.history.fault("error", e);
        }
        // A standby that died meanwhile (a crash, a kill) is started again
        // and promoted then; the harness goes on either way.
        let promote = |s: &Server| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pg_tool("pg_ctl", &["promote", "-w", "-t", "120", "-D", s.data().to_str().unwrap()]))).is_ok()
        };
        if !promote(&standby) {
            self.history.fault("error", format!("promote {}: it was not running; started again", standby.name));
            self.restart(&standby);
            if standby.wait_ready(false).is_err() || !promote(&standby) {
                self.history.fault("error", format!("promote {}: failed again", standby.name));
            }
        }
        if let Err(e) = standby.wait_ready(true) {
            self.history.fault("error", e);
        }
        self.history.record(crate::history::Event::Promoted { t: self.history.now(), lineage: "p1".into() });
        let old = std::mem::replace(&mut pair.primary, standby);
        drop(old);
        self.fleet.rebuild_standby(&mut pair);
        self.history.fault("standby_rebuilt", pair.standby.as_ref().unwrap().name.clone());
    }

    fn backup_dir(&self) -> std::path::PathBuf {
        self.fleet.work.join("registry-backup")
    }

    fn registry_backup(&self) {
        let dir = self.backup_dir();
        owned_dir(&dir);
        let r = &self.fleet.registry;
        let out = std::process::Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(pg_ticket_integration::pg_bindir().join("pg_basebackup"))
            .args(["-D", dir.join("data").to_str().unwrap(), "-X", "stream", "-c", "fast", "-h", r.dir.to_str().unwrap(), "-p", &r.port.to_string(), "-U", "postgres"])
            .output();
        let ok = out.as_ref().is_ok_and(|o| o.status.success());
        self.history.fault("registry_backup", if ok { "taken".to_string() } else { format!("failed: {out:?}") });
    }

    fn registry_restore_backup(&self) {
        let dir = self.backup_dir().join("data");
        if !dir.exists() {
            return self.registry_backup();
        }
        let r = &self.fleet.registry;
        self.history.fault("registry_restore_backup", "the registry's data directory replaced by its base backup");
        r.signal_all(libc::SIGKILL);
        sleep_ms(300);
        let _ = std::fs::remove_dir_all(r.data());
        let ok = std::process::Command::new("cp").arg("-a").arg(&dir).arg(r.data()).status().is_ok_and(|s| s.success());
        assert!(ok, "copy the registry's backup");
        self.restart(r);
    }

    fn dump_file(&self) -> std::path::PathBuf {
        self.fleet.work.join("registry.dump")
    }

    fn registry_dump(&self) {
        let r = &self.fleet.registry;
        let file = self.dump_file();
        let out = std::process::Command::new(pg_ticket_integration::pg_bindir().join("pg_dump"))
            .args(["-Fc", "-f", file.to_str().unwrap(), "-h", r.dir.to_str().unwrap(), "-p", &r.port.to_string(), "-U", "postgres", REGISTRY_DB])
            .output();
        let ok = out.as_ref().is_ok_and(|o| o.status.success());
        self.history.fault("registry_dump", if ok { "taken".to_string() } else { format!("failed: {out:?}") });
    }

    fn registry_restore_dump(&self) {
        let file = self.dump_file();
        if !file.exists() {
            return self.registry_dump();
        }
        let r = &self.fleet.registry;
        self.history.fault("registry_restore_dump", "the registry database dropped and restored from its dump");
        let restored = r.connect("postgres").and_then(|mut c| {
            c.batch_execute(&format!("DROP DATABASE IF EXISTS {REGISTRY_DB} WITH (FORCE)"))?;
            c.batch_execute(&format!("CREATE DATABASE {REGISTRY_DB}"))
        });
        if let Err(e) = restored {
            return self.history.fault("error", format!("restore the registry: {e}"));
        }
        let out = std::process::Command::new(pg_ticket_integration::pg_bindir().join("pg_restore"))
            .args(["-d", REGISTRY_DB, "-h", r.dir.to_str().unwrap(), "-p", &r.port.to_string(), "-U", "postgres", file.to_str().unwrap()])
            .output();
        if !out.as_ref().is_ok_and(|o| o.status.success()) {
            self.history.fault("error", format!("pg_restore: {out:?}"));
        }
    }

    fn recreate_extension(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        self.p2.pause.store(true, Ordering::SeqCst);
        let gate = loop {
            if let Ok(g) = self.p2.gate.try_write() {
                break Some(g);
            }
            if Instant::now() > deadline {
                break None;
            }
            sleep_ms(10);
        };
        if gate.is_some() {
            self.recreate_p2();
        } else {
            self.history.fault("error", "recreate_extension: p2's clients did not pause within 30 s");
        }
        drop(gate);
        self.p2.pause.store(false, Ordering::SeqCst);
    }

    /// With p2's clients paused: its marks, then DROP and CREATE.
    fn recreate_p2(&self) {
        if let Err(e) = crate::workload::record_marks(self.p2, self.history) {
            return self.history.fault("error", format!("recreate_extension: read the marks: {e}"));
        }
        let server = &self.fleet.p2;
        if let Err(e) = server.connect(WORK_DB).and_then(|mut c| c.batch_execute("DROP EXTENSION pg_ticket CASCADE")) {
            return self.history.fault("error", format!("recreate_extension: DROP EXTENSION: {e}"));
        }
        // The old marks are gone: whatever comes next is a new life.
        let life = self.p2.life.fetch_add(1, Ordering::SeqCst) + 1;
        self.history.record(crate::history::Event::Life { t: self.history.now(), lineage: "p2".into(), life });
        let mut created = create_extension(server, WORK_DB);
        for _ in 0..20 {
            if created.is_ok() {
                break;
            }
            sleep_ms(500);
            created = create_extension(server, WORK_DB);
        }
        self.history.fault("recreate_extension", format!("p2, life {life}: {}", outcome_of(created)));
    }

    /// Everything back: processes continued, clocks right, the proxy
    /// passing, every server up, a standby for p1.
    pub fn heal(&mut self) {
        self.proxy.pass();
        crate::fleet::set_clock(&self.clients.clock, "+0");
        self.fleet.all_servers(&mut |s| {
            s.signal_all(libc::SIGCONT);
            s.set_clock("+0");
            if !s.running() {
                let _ = s.up();
            }
        });
        let mut pair: std::sync::MutexGuard<'_, Pair> = self.fleet.p1.lock().unwrap();
        if pair.standby.is_none() {
            self.fleet.rebuild_standby(&mut pair);
        }
    }
}

fn outcome<E: std::fmt::Display>(done: Option<Result<(), E>>) -> String {
    match done {
        Some(Ok(())) => "done".into(),
        Some(Err(e)) => format!("failed: {e}"),
        None => "no such server".into(),
    }
}

fn outcome_of<E: std::fmt::Display>(done: Result<(), E>) -> String {
    outcome(Some(done))
}

/// pids of the server's backends matching `filter` (not ours).
fn backends(server: &Server, filter: &str) -> Vec<i32> {
    let Ok(mut c) = server.connect("postgres") else { return vec![] };
    c.query(&format!("SELECT pid FROM pg_stat_activity WHERE {filter} AND pid <> pg_backend_pid() ORDER BY pid"), &[])
        .map(|rows| rows.iter().map(|r| r.get::<_, i32>(0)).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_its_schedule_and_ten_minutes_draw_every_kind() {
        let kinds = |seed| schedule(seed, 600).iter().map(|(at, f)| format!("{at} {f:?}")).collect::<Vec<_>>();
        assert_eq!(kinds(7), kinds(7));
        assert_ne!(kinds(7), kinds(8));
        for seed in 0..20 {
            let drawn: std::collections::HashSet<&str> = schedule(seed, 600).iter().map(|(_, f)| f.kind()).collect();
            for kind in KINDS {
                assert!(drawn.contains(kind), "seed {seed} never draws {kind}");
            }
            assert_eq!(drawn.len(), KINDS.len());
        }
    }
}
