//! The faults (SPEC §14) and their schedule. The schedule — which fault,
//! when, on what, for how long — is drawn from the seed alone before the
//! run, so a seed replays the same faults (the clients' timing around them
//! differs from run to run). Each fault heals itself before the next one
//! starts (a stopped process continued, a clock set back, a server started
//! again), except those that change the fleet for good: a promotion, a
//! restored registry, a new life of the extension, a reloaded setting.

use crate::clients::Clients;
use crate::dialect;
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
    /// A clean restart (`pg_ctl restart -m fast`): the state files are
    /// read as written, nothing replayed over them.
    FastRestart(Target),
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
    /// The registry's primary killed, its asynchronous standby (a fixed
    /// machine id the primary may have leased out, #46 item 6(b)) promoted,
    /// the proxy pointed at it, a new standby made.
    RegistryFailover,
    /// A failover whose promoted server is killed at once, before the
    /// checkpoint that ends its recovery (`pg_ctl promote` asks for a
    /// spread one), and started again: crash recovery replays what it
    /// wrote since the promotion (#46 item 4).
    FailoverThenCrash,
    RegistryBackup,
    RegistryRestoreBackup,
    RegistryDump,
    RegistryRestoreDump,
    /// DROP and CREATE EXTENSION on p2 (a new life of its marks).
    RecreateExtension,
    Reload(Target, &'static str, &'static str),
    /// Shard 3 handed between p2 and the registry's server as the docs say
    /// (unlisted and released on its owner, listed and accepted at the
    /// release's point on the other).
    ShardHandover,
    /// A base backup of p2, for `P2RestoreBackup`.
    P2Backup,
    /// p2 lost and its latest base backup started in its place (SPEC §17.1),
    /// then the docs' steps for an older backup: the shard listing it
    /// should have now, each shard it owns accepted again, every mark moved
    /// forward past what was handed out since.
    P2RestoreBackup,
    /// The registry restarted with its fixed `pg_ticket.machine_id` set to
    /// an id it has leased out (SPEC §17.4), for `ms`, then back to 999.
    RegistryOwnId(u64),
    /// Writes of a state file (the snowflake mark, the shard book) fail on
    /// a server for `ms`, as on a full disk (SPEC §17.2); for the book, a
    /// handover meanwhile writes it.
    StateWriteFails(Target, &'static str, u64),
}

impl Fault {
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::KillServer(_) => "kill_server",
            Fault::KillPostmaster(_) => "kill_postmaster",
            Fault::ImmediateRestart(_) => "immediate_restart",
            Fault::FastRestart(_) => "fast_restart",
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
            Fault::FailoverThenCrash => "failover_then_crash",
            Fault::RegistryFailover => "registry_failover",
            Fault::RegistryBackup => "registry_backup",
            Fault::RegistryRestoreBackup => "registry_restore_backup",
            Fault::RegistryDump => "registry_dump",
            Fault::RegistryRestoreDump => "registry_restore_dump",
            Fault::RecreateExtension => "recreate_extension",
            Fault::Reload(..) => "reload",
            Fault::ShardHandover => "shard_handover",
            Fault::P2Backup => "p2_backup",
            Fault::P2RestoreBackup => "p2_restore_backup",
            Fault::RegistryOwnId(_) => "registry_own_id",
            Fault::StateWriteFails(..) => "state_write_fails",
        }
    }
}

pub const KINDS: [&str; 29] = [
    "kill_server",
    "kill_postmaster",
    "immediate_restart",
    "fast_restart",
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
    "failover_then_crash",
    "registry_failover",
    "registry_backup",
    "registry_restore_backup",
    "registry_dump",
    "registry_restore_dump",
    "recreate_extension",
    "reload",
    "shard_handover",
    "p2_backup",
    "p2_restore_backup",
    "registry_own_id",
    "state_write_fails",
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
        "fast_restart" => Fault::FastRestart(any_target(rng)),
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
        "failover_then_crash" => Fault::FailoverThenCrash,
        "registry_failover" => Fault::RegistryFailover,
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
        "shard_handover" => Fault::ShardHandover,
        "p2_backup" => Fault::P2Backup,
        "p2_restore_backup" => Fault::P2RestoreBackup,
        "registry_own_id" => Fault::RegistryOwnId(rng.gen_range(2000..6000)),
        "state_write_fails" => Fault::StateWriteFails(
            [Target::P2, Target::Registry][rng.gen_range(0..2)],
            [MARK_FILE, BOOK_FILE][rng.gen_range(0..2)],
            rng.gen_range(1000..3000),
        ),
        other => unreachable!("{other} is in KINDS but not drawn"),
    }
}

/// Kinds that cost seconds of the fleet's time (a base backup, a
/// promotion, a restore): once per round; the quick ones up to three times.
const SLOW: [&str; 13] = [
    "failover",
    "standby_away_then_failover",
    "failover_then_crash",
    "registry_failover",
    "registry_backup",
    "registry_restore_backup",
    "registry_dump",
    "registry_restore_dump",
    "recreate_extension",
    "standby_away",
    "p2_backup",
    "p2_restore_backup",
    "registry_own_id",
];

const MARK_FILE: &str = "pg_ticket_snowflake.mark";
const BOOK_FILE: &str = "pg_ticket_shards.book";

/// Where shard 3 is: on p2 (`on_registry` false) or the registry's server,
/// and the point of a release whose accept on its new owner has not
/// succeeded yet (tried again at the next handover).
#[derive(Default)]
pub struct Handover {
    on_registry: bool,
    pending: Option<i64>,
}

/// The shard list of `target` with or without shard 3.
fn shard_list(target: Target, with_3: bool) -> &'static str {
    match (target, with_3) {
        (Target::Registry, true) => "3",
        (Target::Registry, false) => "",
        (_, true) => "0-3",
        (_, false) => "0-2",
    }
}

fn db_of(target: Target) -> &'static str {
    if target == Target::Registry {
        REGISTRY_DB
    } else {
        WORK_DB
    }
}

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
    pub shard_3: Handover,
    pub rng: StdRng,
}

fn sleep_ms(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

impl World<'_> {
    /// Run `f` on the server `target` names now.
    fn on<R>(&self, target: Target, f: impl FnOnce(&Server) -> R) -> Option<R> {
        match target {
            Target::Registry => Some(f(&self.fleet.registry.lock().unwrap().primary)),
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
            Fault::ImmediateRestart(target) | Fault::FastRestart(target) => {
                let mode = if matches!(fault, Fault::FastRestart(_)) { "fast" } else { "immediate" };
                self.on(*target, |s| {
                    h.fault(kind, s.name.clone());
                    s.stop(mode);
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
            Fault::Failover => self.failover("p1", false, false),
            Fault::StandbyAwayThenFailover => self.failover("p1", true, false),
            Fault::FailoverThenCrash => self.failover("p1", false, true),
            Fault::RegistryFailover => self.failover("r", false, false),
            Fault::RegistryBackup => self.registry_backup(),
            Fault::RegistryRestoreBackup => self.registry_restore_backup(),
            Fault::RegistryDump => self.registry_dump(),
            Fault::RegistryRestoreDump => self.registry_restore_dump(),
            Fault::RecreateExtension => self.recreate_extension(),
            Fault::Reload(target, setting, value) => {
                let db = if *target == Target::Registry { REGISTRY_DB } else { WORK_DB };
                let done = self.on(*target, |s| s.alter_system(db, setting, value).map_err(|e| why(&e)));
                h.fault(kind, format!("{target:?} {setting} = {value}: {}", outcome(done)));
            }
            Fault::ShardHandover => self.shard_handover(),
            Fault::P2Backup => self.p2_backup(),
            Fault::P2RestoreBackup => self.p2_restore_backup(),
            Fault::RegistryOwnId(ms) => self.registry_own_id(*ms),
            Fault::StateWriteFails(target, file, ms) => self.state_write_fails(*target, file, *ms),
        }
    }

    fn shard_3_owner(&self) -> Target {
        if self.shard_3.on_registry {
            Target::Registry
        } else {
            Target::P2
        }
    }

    /// Shard 3 to the other server, as docs/operations.md says; a release
    /// not yet accepted is accepted first.
    fn shard_handover(&mut self) {
        if let Some(point) = self.shard_3.pending {
            return self.accept_shard_3(point);
        }
        let from = self.shard_3_owner();
        let released = self.on(from, |s| {
            s.set_shards(db_of(from), shard_list(from, false))?;
            let point = s
                .connect(db_of(from))
                .and_then(|mut c| c.query_one(&format!("SELECT {}(3)", dialect::name("pgticket.release_shard")), &[]))
                .map(|r| r.get::<_, i64>(0))
                .map_err(|e| format!("{}: release_shard(3): {}", s.name, why(&e)));
            if point.is_err() {
                // Still its owner: listed again.
                let _ = s.set_shards(db_of(from), shard_list(from, true));
            }
            point
        });
        match released {
            Some(Ok(point)) => {
                let source = if from == Target::P2 { "p2" } else { "r" };
                self.history.record(crate::history::Event::Released { t: self.history.now(), source: source.into(), shard: 3, point });
                self.shard_3 = Handover { on_registry: from == Target::P2, pending: Some(point) };
                self.accept_shard_3(point);
            }
            Some(Err(e)) => self.history.fault("shard_handover", format!("not handed over: {e}")),
            None => {}
        }
    }

    /// The released shard 3 accepted by its new owner at `point`.
    fn accept_shard_3(&mut self, point: i64) {
        let to = self.shard_3_owner();
        let accepted = self.on(to, |s| {
            s.set_shards(db_of(to), shard_list(to, true))?;
            s.connect(db_of(to))
                .and_then(|mut c| c.query_one(&format!("SELECT {}(3, $1)", dialect::name("pgticket.accept_shard")), &[&point]))
                .map(|_| ())
                .map_err(|e| format!("{}: accept_shard(3, {point}): {}", s.name, why(&e)))
        });
        match accepted {
            Some(Ok(())) => {
                self.shard_3.pending = None;
                self.history.fault("shard_handover", format!("shard 3 to {to:?} at {point}"));
            }
            Some(Err(e)) => self.history.fault("shard_handover", format!("released at {point}, not yet accepted: {e}")),
            None => {}
        }
    }

    fn p2_backup_dir(&self) -> std::path::PathBuf {
        self.fleet.work.join("p2-backup")
    }

    pub fn p2_backup(&self) {
        let dir = self.p2_backup_dir();
        let _ = std::fs::remove_dir_all(&dir);
        owned_dir(&dir);
        let p2 = &self.fleet.p2;
        let out = std::process::Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(pg_ticket_integration::pg_bindir().join("pg_basebackup"))
            .args(["-D", dir.join("data").to_str().unwrap(), "-X", "stream", "-c", "fast", "-h", p2.dir.to_str().unwrap(), "-p", &p2.port.to_string(), "-U", "postgres"])
            .output();
        let ok = out.as_ref().is_ok_and(|o| o.status.success());
        if !ok {
            let _ = std::fs::remove_dir_all(&dir);
        }
        self.history.fault("p2_backup", if ok { "taken".to_string() } else { format!("failed: {out:?}") });
    }

    /// Runs `f` with p2's clients paused between operations (at most 30 s
    /// to get there).
    fn with_p2_paused(&mut self, what: &str, f: impl FnOnce(&mut Self)) {
        let deadline = Instant::now() + Duration::from_secs(30);
        self.p2.pause.store(true, Ordering::SeqCst);
        let p2 = self.p2.clone();
        let gate = loop {
            if let Ok(g) = p2.gate.try_write() {
                break Some(g);
            }
            if Instant::now() > deadline {
                break None;
            }
            sleep_ms(10);
        };
        if gate.is_some() {
            f(self);
        } else {
            self.history.fault("error", format!("{what}: p2's clients did not pause within 30 s"));
        }
        drop(gate);
        self.p2.pause.store(false, Ordering::SeqCst);
    }

    fn p2_restore_backup(&mut self) {
        if !self.p2_backup_dir().join("data").exists() {
            return self.p2_backup();
        }
        self.with_p2_paused("p2_restore_backup", |w| w.restore_p2());
    }

    /// With p2's clients paused: its marks read, its data directory
    /// replaced by the backup and started, then the operator's steps.
    fn restore_p2(&mut self) {
        let p2 = &self.fleet.p2;
        let marks = match p2_marks(p2) {
            Ok(marks) => marks,
            Err(e) => return self.history.fault("p2_restore_backup", format!("not restored: p2's marks unreadable: {}", why(&e))),
        };
        self.history.fault("p2_restore_backup", "p2 lost; its base backup started in its place");
        p2.signal_all(libc::SIGKILL);
        sleep_ms(300);
        let _ = std::fs::remove_dir_all(p2.data());
        let ok = std::process::Command::new("cp").arg("-a").arg(self.p2_backup_dir().join("data")).arg(p2.data()).status().is_ok_and(|s| s.success());
        assert!(ok, "copy p2's backup");
        self.restart(p2);
        if let Err(e) = p2.wait_ready(true) {
            return self.history.fault("error", format!("p2_restore_backup: {e}"));
        }
        // Applications reconnect as soon as it answers; the operator's steps
        // (docs/operations.md, backup and restore) come a moment later.
        sleep_ms(self.rng.gen_range(500..2500));
        let owns_3 = !self.shard_3.on_registry && self.shard_3.pending.is_none();
        let steps = p2.set_shards(WORK_DB, shard_list(Target::P2, owns_3)).and_then(|()| {
            let mut c = p2.connect(WORK_DB).map_err(|e| why(&e))?;
            vouch(&mut c, self.history.latest_stamp_ms("p2"))?;
            for shard in 0..if owns_3 { 4 } else { 3 } {
                let point = self.history.highest_sharded(shard as u16);
                c.query_one(&format!("SELECT {}($1, $2)", dialect::name("pgticket.accept_shard")), &[&shard, &point]).map_err(|e| format!("accept_shard({shard}, {point}): {}", why(&e)))?;
            }
            marks.advance(&mut c).map_err(|e| format!("advance the marks: {}", why(&e)))
        });
        self.history.fault("p2_restore_backup", format!("the operator's steps: {}", outcome_of(steps)));
    }

    fn registry_own_id(&self, ms: u64) {
        let pair = self.fleet.registry.lock().unwrap();
        let r = &pair.primary;
        let own = pair.slot_of(r).machine_id.expect("a registry slot's fixed id");
        let leased: Option<i32> = r
            .connect(REGISTRY_DB)
            .and_then(|mut c| c.query_opt(&format!("SELECT machine_id FROM {} WHERE state = 'held' ORDER BY expires_at DESC LIMIT 1", dialect::name("pgticket.machine_ids")), &[]))
            .ok()
            .flatten()
            .map(|row| row.get(0));
        let id = leased.unwrap_or(1);
        self.history.fault("registry_own_id", format!("the registry restarted with pg_ticket.machine_id = {id} (leased: {}) for {ms} ms", leased.is_some()));
        let set_machine_id = |id: i32| {
            let conf = r.data().join("postgresql.conf");
            let mut f = std::fs::OpenOptions::new().append(true).open(&conf).unwrap();
            std::io::Write::write_all(&mut f, format!("pg_ticket.machine_id = {id}\n").as_bytes()).unwrap();
            r.stop("fast");
            self.restart(r);
        };
        set_machine_id(id);
        sleep_ms(ms);
        set_machine_id(own);
    }

    fn state_write_fails(&mut self, target: Target, file: &str, ms: u64) {
        let Some(data) = self.on(target, |s| s.data()) else { return };
        let blocker = data.join(std::path::Path::new(file).with_extension("tmp"));
        owned_dir(&blocker);
        self.history.fault("state_write_fails", format!("{target:?}: writes of {file} fail for {ms} ms"));
        if file == BOOK_FILE {
            self.shard_handover();
        }
        sleep_ms(ms);
        let _ = std::fs::remove_dir_all(&blocker);
        self.on(target, |s| {
            if !s.running() {
                self.history.fault("state_write_fails", format!("{} had stopped; started again", s.name));
                self.restart(s);
            }
        });
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

    /// Lineage `lineage`'s (p1's or the registry's, "r") primary dies and
    /// its standby is promoted.
    fn failover(&self, lineage: &str, standby_away_first: bool, crash_after: bool) {
        let registry = lineage == "r";
        let mut pair = if registry { self.fleet.registry.lock().unwrap() } else { self.fleet.p1.lock().unwrap() };
        let Some(standby) = pair.standby.take() else { return };
        let kind = match (registry, standby_away_first, crash_after) {
            (true, ..) => "registry_failover",
            (false, true, _) => "standby_away_then_failover",
            (false, false, true) => "failover_then_crash",
            (false, false, false) => "failover",
        };
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
        if registry {
            // Where the holders' lease connections go now.
            let cut = self.proxy.retarget(standby.socket());
            self.history.fault(kind, format!("the proxy points at {} ({cut} connections cut)", standby.name));
        }
        self.history.record(crate::history::Event::Promoted { t: self.history.now(), lineage: lineage.into() });
        if crash_after {
            // Clients reach it meanwhile; then it dies before its
            // end-of-recovery checkpoint could have finished.
            sleep_ms(300);
            standby.signal_all(libc::SIGKILL);
            self.history.fault(kind, format!("{} killed after its promotion, started again", standby.name));
            self.restart(&standby);
            if let Err(e) = standby.wait_ready(true) {
                self.history.fault("error", e);
            }
        }
        let old = std::mem::replace(&mut pair.primary, standby);
        drop(old);
        pair.rebuild_standby();
        self.history.fault("standby_rebuilt", pair.standby.as_ref().unwrap().name.clone());
    }

    fn backup_dir(&self) -> std::path::PathBuf {
        self.fleet.work.join("registry-backup")
    }

    fn registry_backup(&self) {
        let dir = self.backup_dir();
        owned_dir(&dir);
        let pair = self.fleet.registry.lock().unwrap();
        let r = &pair.primary;
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
        let mut pair = self.fleet.registry.lock().unwrap();
        let r = &pair.primary;
        self.history.fault("registry_restore_backup", "the registry's data directory replaced by its base backup");
        r.signal_all(libc::SIGKILL);
        sleep_ms(300);
        let _ = std::fs::remove_dir_all(r.data());
        let ok = std::process::Command::new("cp").arg("-a").arg(&dir).arg(r.data()).status().is_ok_and(|s| s.success());
        assert!(ok, "copy the registry's backup");
        // The backup may be of the other slot's server (before a failover).
        pair.slot_of(r).configure(r);
        self.restart(r);
        // The operator's steps: a vouch for its snowflakes past the latest
        // it made, the listing it should have, shard 3 accepted again if it
        // owns it.
        let owns_3 = self.shard_3.on_registry && self.shard_3.pending.is_none();
        let latest = self.history.latest_stamp_ms("r");
        let steps = r
            .wait_ready(true)
            .and_then(|()| r.connect(REGISTRY_DB).map_err(|e| why(&e)).and_then(|mut c| vouch(&mut c, latest)))
            .and_then(|()| r.set_shards(REGISTRY_DB, shard_list(Target::Registry, owns_3)))
            .and_then(|()| {
            if !owns_3 {
                return Ok(());
            }
            let point = self.history.highest_sharded(3);
            r.connect(REGISTRY_DB)
                .and_then(|mut c| c.query_one(&format!("SELECT {}(3, $1)", dialect::name("pgticket.accept_shard")), &[&point]))
                .map(|_| ())
                .map_err(|e| format!("accept_shard(3, {point}): {}", why(&e)))
        });
        self.history.fault("registry_restore_backup", format!("the operator's steps: {}", outcome_of(steps)));
        // Its standby is ahead of the restored server: made anew.
        pair.rebuild_standby();
        self.history.fault("standby_rebuilt", pair.standby.as_ref().unwrap().name.clone());
    }

    fn dump_file(&self) -> std::path::PathBuf {
        self.fleet.work.join("registry.dump")
    }

    fn registry_dump(&self) {
        let pair = self.fleet.registry.lock().unwrap();
        let r = &pair.primary;
        let file = self.dump_file();
        let out = std::process::Command::new(pg_ticket_integration::pg_bindir().join("pg_dump"))
            .args(["-Fc", "-f", file.to_str().unwrap(), "-h", r.dir.to_str().unwrap(), "-p", &r.port.to_string(), "-U", "postgres", REGISTRY_DB])
            .output();
        let ok = out.as_ref().is_ok_and(|o| o.status.success());
        if !ok {
            // Not a dump to restore from (a restore would drop the registry
            // database and load nothing).
            let _ = std::fs::remove_file(&file);
        }
        self.history.fault("registry_dump", if ok { "taken".to_string() } else { format!("failed: {out:?}") });
    }

    fn registry_restore_dump(&self) {
        let file = self.dump_file();
        if std::fs::metadata(&file).map_or(true, |m| m.len() == 0) {
            return self.registry_dump();
        }
        let pair = self.fleet.registry.lock().unwrap();
        let r = &pair.primary;
        self.history.fault("registry_restore_dump", "the registry database dropped and restored from its dump");
        let restored = r.connect("postgres").and_then(|mut c| {
            c.batch_execute(&format!("DROP DATABASE IF EXISTS {REGISTRY_DB} WITH (FORCE)"))?;
            c.batch_execute(&format!("CREATE DATABASE {REGISTRY_DB}"))
        });
        if let Err(e) = restored {
            return self.history.fault("error", format!("restore the registry: {}", why(&e)));
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
            return self.history.fault("error", format!("recreate_extension: read the marks: {}", why(&e)));
        }
        let server = &self.fleet.p2;
        if let Err(e) = server.connect(WORK_DB).and_then(|mut c| c.batch_execute("DROP EXTENSION pg_ticket CASCADE")) {
            return self.history.fault("error", format!("recreate_extension: DROP EXTENSION: {e}"));
        }
        // The old marks are gone: whatever comes next is a new life. A
        // backup of the old life is not restored into the new one (its
        // marks would stand above the new life's, a gap the checker counts):
        // it is replaced by one of the new life below.
        let _ = std::fs::remove_dir_all(self.p2_backup_dir());
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
        self.history.fault("recreate_extension", format!("p2, life {life}: {}", outcome_of(created.map_err(|e| why(&e)))));
        // A backup of the new life, for a restore later in the run.
        self.p2_backup();
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
        for pair in [&self.fleet.registry, &self.fleet.p1] {
            let mut pair: std::sync::MutexGuard<'_, Pair> = pair.lock().unwrap();
            if pair.standby.is_none() {
                pair.rebuild_standby();
            }
        }
    }
}

/// p2's marks before a restore: counter scopes, the block name, ticket
/// scopes.
struct Marks {
    counters: Vec<(String, i64)>,
    block: i64,
    tickets: Vec<(String, i64)>,
}

fn p2_marks(p2: &Server) -> Result<Marks, postgres::Error> {
    let mut c = p2.connect(WORK_DB)?;
    let mut counters = Vec::new();
    for d in 0..crate::workload::COUNTER_SCOPES {
        let scope = format!("d{d}");
        let mark: i64 = c.query_one("SELECT current_scoped_id('cq', $1)", &[&scope])?.get(0);
        counters.push((scope, mark));
    }
    let block: i64 = c.query_one("SELECT current_block_mark('b')", &[])?.get(0);
    let tickets = c
        .query("SELECT domain, mark FROM pgticket.marks WHERE kind = 'ticket' AND queue = 'tq'", &[])?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    Ok(Marks { counters, block, tickets })
}

impl Marks {
    /// Every mark of the restored database moved forward to these (never back).
    fn advance(&self, c: &mut postgres::Client) -> Result<(), postgres::Error> {
        for (scope, mark) in &self.counters {
            let now: i64 = c.query_one("SELECT current_scoped_id('cq', $1)", &[scope])?.get(0);
            if *mark > now {
                c.query_one(&format!("SELECT {}('cq', $1, $2)", dialect::name("pgticket.advance_scoped_id")), &[scope, mark])?;
            }
        }
        let now: i64 = c.query_one("SELECT current_block_mark('b')", &[])?.get(0);
        if self.block > now {
            c.query_one(&format!("SELECT {}('b', $1)", dialect::name("pgticket.advance_block")), &[&self.block])?;
        }
        for (scope, mark) in &self.tickets {
            let now: Option<i64> =
                c.query_opt("SELECT mark FROM pgticket.marks WHERE kind = 'ticket' AND queue = 'tq' AND domain = $1", &[scope])?.map(|r| r.get(0));
            if now.is_none_or(|now| *mark > now) {
                c.query_one(&format!("SELECT {}('tq', $1, $2)", dialect::name("pgticket.advance_ticket")), &[scope, mark])?;
            }
        }
        Ok(())
    }
}

/// The operator's word after a base backup started in a server's place:
/// every snowflake and sharded ID it makes is after the latest it made
/// before (`latest_ms` since the default epoch, 2026-01-01), decoded from
/// what was received, plus a second for the clocks.
/// 0.3.0 had no such word: it issued at once.
fn vouch(c: &mut postgres::Client, latest_ms: u64) -> Result<(), String> {
    if dialect::is_0_3() {
        return Ok(());
    }
    const EPOCH_UNIX_MS: i64 = 1_767_225_600_000;
    let after_unix_ms = EPOCH_UNIX_MS + latest_ms as i64 + 1000;
    c.query_one("SELECT pgticket.raise_snowflake_mark(to_timestamp($1::bigint / 1000.0))", &[&after_unix_ms])
        .map(|_| ())
        .map_err(|e| format!("raise_snowflake_mark: {}", why(&e)))
}

/// A client error as the server said it: SQLSTATE and message.
pub fn why(e: &postgres::Error) -> String {
    e.as_db_error().map(|d| format!("{}: {}", d.code().code(), d.message())).unwrap_or_else(|| e.to_string())
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
