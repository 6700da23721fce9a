//! Every `pg_ticket.*` setting, and what `_PG_init` does in which order.
//!
//! The snowflake settings are `postmaster`-context: one generator per server
//! must not change its machine id or epoch while running. PostgreSQL forbids
//! defining such a setting on a lazy load (`CREATE EXTENSION` without
//! preloading is FATAL otherwise), so they exist only when preloaded. The
//! per-session settings exist either way.
//!
//! A value in postgresql.conf that the setting's own checks reject is, at
//! preload, only a WARNING to PostgreSQL, which then runs with the default:
//! a mistyped machine id would silently become machine 0, another server's
//! id. So the raw values are read and validated here first, and a bad one
//! stops the server with a message.

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use ticket_core::epoch::parse_epoch_ms;
use ticket_core::sharded::parse_shard_list;
use ticket_core::leases::parse_id_list;
use ticket_core::snowflake::Layout;
use ticket_core::tickets::Series;

const DEFAULT_EPOCH_UNIX_MS: i64 = 1_767_225_600_000;

static MACHINE_ID: GucSetting<i32> = GucSetting::<i32>::new(0);
static MACHINE_BITS: GucSetting<i32> = GucSetting::<i32>::new(Layout::DEFAULT.machine_bits() as i32);
static EPOCH: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c"2026-01-01"));
static DURABLE_COMMIT: GucSetting<bool> = GucSetting::<bool>::new(true);
static MAX_TRANSACTION_ENTRIES: GucSetting<i32> = GucSetting::<i32>::new(100_000);
static MAX_BLOCK_SIZE: GucSetting<i32> = GucSetting::<i32>::new(1_000_000_000);
static SCOPE_RIGHTS: GucSetting<bool> = GucSetting::<bool>::new(false);
static SHARDS: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c""));
static MAX_SCOPES_PER_ROLE: GucSetting<i32> = GucSetting::<i32>::new(1_000_000);
/// The most ticket workers a server can have: the slots of shared memory.
pub const MOST_TICKET_WORKERS: usize = 32;
static MAX_TICKET_WORKERS: GucSetting<i32> = GucSetting::<i32>::new(4);
static TICKET_CACHE_SCOPES: GucSetting<i32> = GucSetting::<i32>::new(1024);
static TICKET_STEP_MIN: GucSetting<i32> = GucSetting::<i32>::new(100);
static TICKET_STEP_MAX: GucSetting<i32> = GucSetting::<i32>::new(10_000);
static TICKET_WAIT_TIMEOUT: GucSetting<i32> = GucSetting::<i32>::new(5_000);
static TICKET_INCREMENT: GucSetting<i32> = GucSetting::<i32>::new(1);
static TICKET_OFFSET: GucSetting<i32> = GucSetting::<i32>::new(1);
static LEASE_MARGIN: GucSetting<i32> = GucSetting::<i32>::new(10_000);
static LEASE_MAX_TTL: GucSetting<i32> = GucSetting::<i32>::new(45_000);
static LEASE_IDS: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c"0-1023"));
static REGISTRY: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
static MACHINE_LEASE_TTL: GucSetting<i32> = GucSetting::<i32>::new(30_000);
static NODE_NAME: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c""));
static CREATES_SCOPES: GucSetting<bool> = GucSetting::<bool>::new(true);
/// Test builds only (TESTING.md): fault points.
static TEST_REORDER_TICKET_INSTALLS: GucSetting<bool> = GucSetting::<bool>::new(false);

/// Set once in `_PG_init`; read on every `snowflake_id()` call, so kept as
/// plain atomics rather than re-reading and re-parsing the settings.
static PRELOADED: AtomicBool = AtomicBool::new(false);
/// `pg_ticket.lease_ids` in the configuration did not parse when this
/// backend loaded the library (until a reload assigns a good one).
static LEASE_IDS_REFUSED: AtomicBool = AtomicBool::new(false);
/// `pg_ticket.machine_id` was left at its default (0).
static MACHINE_ID_DEFAULT: AtomicBool = AtomicBool::new(false);
static EPOCH_UNIX_MS: AtomicI64 = AtomicI64::new(DEFAULT_EPOCH_UNIX_MS);
static MACHINE: AtomicI64 = AtomicI64::new(0);
static TICKET_SERIES: AtomicI64 = AtomicI64::new(1 << 32 | 1);
/// Largest ticket increment (and offset).
const TICKET_SERIES_MAX: i64 = 1_000_000;

/// What start-up (`_PG_init`) needs of the settings when preloading.
pub struct Preloaded {
    pub ticket_cache_scopes: usize,
    pub self_leasing: bool,
}

/// Defines every setting (those of the server's start only while
/// preloading), checked as PostgreSQL will parse them; None when not
/// preloading.
pub fn init() -> Option<Preloaded> {
    refuse_a_parallel_workers_load();
    refuse_overridden_placeholders();
    refuse_bad_configured_values();
    GucRegistry::define_bool_guc(
        c"pg_ticket.durable_commit",
        c"Commit transactions that took scoped IDs or blocks as synchronous_commit = on would.",
        c"Values from next_scoped_id() and reserve_block() may leave the database before a crash; with this off, a transaction committed with synchronous_commit = off can lose them and hand them out again.",
        &DURABLE_COMMIT,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_ticket.max_transaction_entries",
        c"Most scopes and savepoint entries one transaction may hold in backend memory.",
        c"Past it an allocation fails with 54000; bounds memory that PostgreSQL does not account for (about 150 bytes an entry). Superusers only: raising it lets one session take that much memory.",
        &MAX_TRANSACTION_ENTRIES,
        10,
        i32::MAX,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_ticket.max_block_size",
        c"Most IDs one reserve_block() call may reserve.",
        c"A ceiling set by a superuser, so that one role cannot exhaust a block name for everyone in a few calls.",
        &MAX_BLOCK_SIZE,
        1,
        i32::MAX,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"pg_ticket.scope_rights",
        c"Roles allocate only from the scopes and block names a grant covers (pgticket.grant_scope, pgticket.grant_block).",
        c"Off: every role allocates from every scope, as in 0.2.0. Superusers and the state tables' owners need no grant. Superusers only: a role must not switch its own check off.",
        &SCOPE_RIGHTS,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_ticket.max_scopes_per_role",
        c"Most scopes, ticket scopes and block names one role may create (each is a permanent row); 0: no cap.",
        c"Superusers and the state tables' owners are not capped. Counted per role in pgticket.scope_quota.",
        &MAX_SCOPES_PER_ROLE,
        0,
        i32::MAX,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_ticket.ticket_wait_timeout",
        c"How long next_ticket() waits for a segment (first use of a scope, a burst) before failing with 55000.",
        c"",
        &TICKET_WAIT_TIMEOUT,
        10,
        3_600_000,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    // A group of primaries (SPEC §19.3, reload): need not preload.
    GucRegistry::define_string_guc(
        c"pg_ticket.node_name",
        c"This server's name in a group of primaries replicating to each other (empty: cluster_name, else its system identifier).",
        c"Other nodes name it in their refusals (a scope's home, the node that creates new scopes).",
        &NODE_NAME,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"pg_ticket.creates_scopes",
        c"Whether new gap-free scopes and block names are created on this server; in a group of primaries, on exactly one node.",
        c"Off: a new scope or block name is refused here (55000); the ones that exist go on at their home.",
        &CREATES_SCOPES,
        GucContext::Sighup,
        GucFlags::default(),
    );
    // The registry's settings (reload): a registry need not preload.
    GucRegistry::define_int_guc(
        c"pg_ticket.lease_margin",
        c"How long after a machine-id lease ends its id stays unleased; also the clock skew allowed between holders.",
        c"A holder whose wall clock differs from the registry's by more than half of it refuses to issue.",
        &LEASE_MARGIN,
        ticket_core::leases::MIN_MARGIN_MS as i32,
        ticket_core::leases::MAX_TTL_MS as i32,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"pg_ticket.lease_max_ttl",
        c"The longest machine-id lease this registry grants.",
        c"A registry restored from a dump or promoted grants nothing until this plus pg_ticket.lease_margin has passed.",
        &LEASE_MAX_TTL,
        ticket_core::leases::MIN_TTL_MS as i32,
        ticket_core::leases::MAX_TTL_MS as i32,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    // Read before it is defined: a bad value in postgresql.conf would
    // otherwise be a WARNING and the default, 0-1023.
    let lease_ids_configured = raw_setting(c"pg_ticket.lease_ids");
    // A bad layout stops a preloading server, named; a registry that loads
    // the library on demand refuses its leases instead (registry_space).
    let registry_layout = registry_layout().unwrap_or_else(|e| {
        if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
            pgrx::error!("{e}");
        }
        Layout::WIDEST
    });
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"pg_ticket.lease_ids",
            c"The machine ids this registry may lease, e.g. '0-99, 200'.",
            c"The server's own pg_ticket.machine_id is never leased.",
            &LEASE_IDS,
            GucContext::Sighup,
            GucFlags::default(),
            Some(check_lease_ids),
            Some(assign_lease_ids),
            None,
        );
    }
    if let Some(Err(e)) = lease_ids_configured.as_deref().map(|text| parse_id_list(text, registry_layout)) {
        if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
            pgrx::error!("pg_ticket.lease_ids: {e}");
        }
        // Loaded by a registry's backend: it grants nothing until fixed.
        LEASE_IDS_REFUSED.store(true, Ordering::Relaxed);
    }
    if !unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        return None;
    }

    // This server's layout: the configured one, checked above.
    let layout = registry_layout;
    let machine_id = match raw_setting(c"pg_ticket.machine_id") {
        None => {
            // Not an error (an update must not stop a running server), but
            // two servers of one keyspace both on 0 would share IDs.
            MACHINE_ID_DEFAULT.store(true, Ordering::Relaxed);
            pgrx::warning!(
                "pg_ticket.machine_id is not set: snowflake_id() stamps machine id 0; every server issuing snowflakes into one keyspace needs its own (set 0-1023, or up to the last id of pg_ticket.machine_bits, or -1 to lease one from pg_ticket.registry)"
            );
            MachineId::Fixed(0)
        }
        Some(text) => parse_machine_id(&text, layout).unwrap_or_else(|e| pgrx::error!("pg_ticket.machine_id: {e}")),
    };
    if machine_id == MachineId::Leased && raw_setting(c"pg_ticket.registry").is_none_or(|r| r.trim().is_empty()) {
        pgrx::error!("pg_ticket.machine_id: -1 (lease one) needs pg_ticket.registry, a connection string to the registry database");
    }
    // Checked before they are defined: PostgreSQL would only warn and run
    // with the default. Parsed as PostgreSQL parses them, so the value
    // checked is the value SHOW reports and the code uses.
    let ticket_increment = raw_int(c"pg_ticket.ticket_increment", 1, 1, TICKET_SERIES_MAX);
    let ticket_offset = raw_int(c"pg_ticket.ticket_offset", 1, 1, TICKET_SERIES_MAX);
    // The series is checked as a pair: offset within 1..=increment.
    if let Err(e) = Series::new(ticket_offset, ticket_increment) {
        pgrx::error!("pg_ticket.ticket_offset / pg_ticket.ticket_increment: {e}");
    }
    let ticket_cache_scopes = raw_int(c"pg_ticket.ticket_cache_scopes", 1024, 16, 1_000_000);
    if let Some(Err(e)) = raw_setting(c"pg_ticket.shards").as_deref().map(parse_shard_list) {
        pgrx::error!("{e}");
    }
    let epoch_ms = match raw_setting(c"pg_ticket.epoch") {
        None => DEFAULT_EPOCH_UNIX_MS,
        // During preload an ERROR stops the server with this message, which
        // is what a wrong epoch deserves: IDs from it would be wrong forever.
        Some(text) => parse_epoch_ms(&text).unwrap_or_else(|e| pgrx::error!("pg_ticket.epoch: {e}")),
    };

    // Before the machine id, whose check hook reads it (the value checked
    // above, parsed the same way).
    GucRegistry::define_int_guc(
        c"pg_ticket.machine_bits",
        c"Bits of a snowflake ID for the machine id (10-16); the rest of the 22 below the timestamp is the sequence.",
        c"Fixed once IDs are stamped: a server whose mark or database records another value refuses to start or stamp. More bits give more machine ids (for fleets that churn through leases) and fewer IDs per machine per millisecond.",
        &MACHINE_BITS,
        Layout::MIN_MACHINE_BITS as i32,
        Layout::MAX_MACHINE_BITS as i32,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    unsafe {
        GucRegistry::define_int_guc_with_hooks(
            c"pg_ticket.machine_id",
            c"Machine id (0-1023, or up to the last of pg_ticket.machine_bits) stamped into every snowflake_id() of this server; -1: lease one from pg_ticket.registry at every start.",
            c"Servers issuing snowflake IDs into one keyspace must each have a different machine id.",
            &MACHINE_ID,
            -1,
            i32::from(Layout::WIDEST.max_machine_id()),
            GucContext::Postmaster,
            GucFlags::default(),
            Some(check_machine_id_setting),
            None,
            None,
        );
    }
    GucRegistry::define_int_guc(
        c"pg_ticket.ticket_cache_scopes",
        c"Ticket scopes cached in shared memory; beyond it the least recently used is evicted (its cached rest is a gap).",
        c"",
        &TICKET_CACHE_SCOPES,
        16,
        1_000_000,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_ticket.ticket_increment",
        c"This server hands out only tickets equal to pg_ticket.ticket_offset modulo this (Flickr's odd/even servers: 2).",
        c"",
        &TICKET_INCREMENT,
        1,
        TICKET_SERIES_MAX as i32,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_ticket.ticket_offset",
        c"The first ticket of every scope on this server, 1..pg_ticket.ticket_increment.",
        c"",
        &TICKET_OFFSET,
        1,
        TICKET_SERIES_MAX as i32,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_ticket.max_ticket_workers",
        c"Most databases served by a ticket worker at once (each is a background worker slot).",
        c"Keep max_worker_processes at least max_parallel_workers plus this plus what other extensions use.",
        &MAX_TICKET_WORKERS,
        1,
        MOST_TICKET_WORKERS as i32,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_ticket.ticket_step_min",
        c"Fewest tickets a segment reserves.",
        c"",
        &TICKET_STEP_MIN,
        1,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_ticket.ticket_step_max",
        c"Most tickets a segment reserves: with two segments cached per scope, a crash loses at most twice this per cached scope.",
        c"",
        &TICKET_STEP_MAX,
        1,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::default(),
    );
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"pg_ticket.registry",
            c"Connection string of the registry this server leases its machine id from (with pg_ticket.machine_id = -1).",
            c"Superusers only: it may hold credentials; prefer passfile=... to a password.",
            &REGISTRY,
            GucContext::Sighup,
            GucFlags::SUPERUSER_ONLY,
            Some(check_registry),
            None,
            None,
        );
    }
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"pg_ticket.shards",
            c"The logical shards this server owns for sharded_id(), e.g. '0-63, 128' (empty: none).",
            c"A shard moves to another server with pgticket.release_shard() here and pgticket.accept_shard() there.",
            &SHARDS,
            GucContext::Sighup,
            GucFlags::default(),
            Some(check_shards),
            Some(assign_shards),
            None,
        );
    }
    GucRegistry::define_int_guc(
        c"pg_ticket.machine_lease_ttl",
        c"How long this server's own machine-id lease lasts; it is renewed every third of it.",
        c"With the registry unreachable for this long, snowflake_id() refuses until it is back.",
        &MACHINE_LEASE_TTL,
        ticket_core::leases::MIN_TTL_MS as i32,
        ticket_core::leases::MAX_TTL_MS as i32,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    // A fault point of test builds: the ticket worker installs each
    // segment after the next one, as a second worker of its database can
    // (tests/integration/tests/roles.rs). Not in release builds.
    #[cfg(debug_assertions)]
    GucRegistry::define_bool_guc(
        c"pg_ticket.test_reorder_ticket_installs",
        c"Test builds only: the ticket worker installs each segment after the next one.",
        c"",
        &TEST_REORDER_TICKET_INSTALLS,
        GucContext::Sighup,
        GucFlags::default(),
    );
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"pg_ticket.epoch",
            c"UTC date (and time) from which snowflake_id() counts milliseconds.",
            c"Format 'YYYY-MM-DD' or 'YYYY-MM-DD HH:MM:SS', UTC. Changing it on a server that issued IDs can reissue them.",
            &EPOCH,
            GucContext::Postmaster,
            GucFlags::default(),
            Some(check_epoch),
            None,
            None,
        );
        pg_sys::MarkGUCPrefixReserved(c"pg_ticket".as_ptr());
    }

    EPOCH_UNIX_MS.store(epoch_ms, Ordering::Relaxed);
    // The values SHOW reports (equal to those checked above).
    let series = Series::new(i64::from(TICKET_OFFSET.get()), i64::from(TICKET_INCREMENT.get()))
        .unwrap_or_else(|e| pgrx::error!("pg_ticket.ticket_offset / pg_ticket.ticket_increment: {e}"));
    TICKET_SERIES.store(series.increment << 32 | series.offset, Ordering::Relaxed);
    MACHINE.store(
        match machine_id {
            MachineId::Fixed(id) => i64::from(id),
            MachineId::Leased => -1,
        },
        Ordering::Relaxed,
    );
    PRELOADED.store(true, Ordering::Relaxed);
    Some(Preloaded { ticket_cache_scopes: ticket_cache_scopes as usize, self_leasing: machine_id == MachineId::Leased })
}

/// The value postgresql.conf (or ALTER SYSTEM, or the command line) gave a
/// setting before it was defined, if any: the placeholder's reset value,
/// not a session's `SET` of it (at preload the two are one; loaded on
/// demand, a role's `SET pg_ticket.lease_ids` must not decide whether the
/// configured list is good: #31 review).
fn raw_setting(name: &CStr) -> Option<String> {
    let value = unsafe { pg_sys::GetConfigOption(name.as_ptr(), true, false) };
    if value.is_null() {
        return None;
    }
    let reset = unsafe { pg_sys::GetConfigOptionResetString(name.as_ptr()) };
    (!reset.is_null()).then(|| unsafe { CStr::from_ptr(reset) }.to_string_lossy().into_owned())
}

/// A value of the configuration that PostgreSQL would replace by the
/// built-in default when the setting is defined (with only a WARNING):
/// SPEC §13.6 wants it to stop the server. Loaded on demand, where nothing
/// can stop the server, the session runs no pg_ticket code instead (a
/// typo in `scope_rights` would otherwise switch rights off). Checked as
/// PostgreSQL parses them.
fn refuse_bad_configured_values() {
    enum Kind {
        Bool,
        Int { min: i64, max: i64, unit_ms: bool },
    }
    use Kind::*;
    let checked: [(&CStr, Kind); 9] = [
        (c"pg_ticket.durable_commit", Bool),
        (c"pg_ticket.creates_scopes", Bool),
        (c"pg_ticket.scope_rights", Bool),
        (c"pg_ticket.max_transaction_entries", Int { min: 10, max: i64::from(i32::MAX), unit_ms: false }),
        (c"pg_ticket.max_block_size", Int { min: 1, max: i64::from(i32::MAX), unit_ms: false }),
        (c"pg_ticket.max_scopes_per_role", Int { min: 0, max: i64::from(i32::MAX), unit_ms: false }),
        (c"pg_ticket.ticket_wait_timeout", Int { min: 10, max: 3_600_000, unit_ms: true }),
        (
            c"pg_ticket.lease_margin",
            Int { min: ticket_core::leases::MIN_MARGIN_MS, max: ticket_core::leases::MAX_TTL_MS, unit_ms: true },
        ),
        (c"pg_ticket.lease_max_ttl", Int { min: ticket_core::leases::MIN_TTL_MS, max: ticket_core::leases::MAX_TTL_MS, unit_ms: true }),
    ];
    for (name, kind) in checked {
        let Some(text) = raw_setting(name) else { continue };
        let problem = match kind {
            Bool => {
                let c_text = CString::new(text.as_str()).unwrap_or_default();
                let mut value = false;
                (!unsafe { pg_sys::parse_bool(c_text.as_ptr(), &mut value) }).then(|| format!("{text:?} is not a boolean"))
            }
            Int { min, max, unit_ms } => match parse_int_with_unit(&text, unit_ms) {
                None => Some(format!("{text:?} is not a whole number{}", if unit_ms { " (of milliseconds, or with a unit: '10s')" } else { "" })),
                Some(v) if !(min..=max).contains(&v) => Some(format!("{v} is outside {min}..{max}")),
                Some(_) => None,
            },
        };
        if let Some(problem) = problem {
            let name = name.to_string_lossy();
            if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
                pgrx::error!("{name}: {problem}");
            }
            pgrx::pg_sys::panic::ErrorReport::new(PgSqlErrorCode::ERRCODE_CONFIG_FILE_ERROR, format!("{name}: {problem}"), "pg_ticket")
                .set_detail("PostgreSQL would run with the built-in default instead, so pg_ticket does not run until the configuration is fixed.")
                .set_hint("Fix the value in postgresql.conf (or ALTER SYSTEM) and reload.")
                .report(pgrx::PgLogLevel::ERROR);
        }
    }
}

/// PostgreSQL's integer parser for settings, with units of time when
/// `unit_ms` (the value in milliseconds).
fn parse_int_with_unit(text: &str, unit_ms: bool) -> Option<i64> {
    let c_text = CString::new(text).ok()?;
    let mut value: i32 = 0;
    let mut hint: *const c_char = std::ptr::null();
    let flags = if unit_ms { pg_sys::GUC_UNIT_MS as i32 } else { 0 };
    unsafe { pg_sys::parse_int(c_text.as_ptr(), &mut value, flags, &mut hint) }.then_some(i64::from(value))
}

/// A whole-number setting's raw value as PostgreSQL will parse it (any
/// base `strtol` takes: '010' is 8), or `default`; a value that is not a
/// whole number or is outside `min..=max` stops the server naming it.
fn raw_int(name: &CStr, default: i64, min: i64, max: i64) -> i64 {
    let Some(text) = raw_setting(name) else { return default };
    let value = parse_int_as_postgres(&text).unwrap_or_else(|| {
        pgrx::error!("{}: {text:?} is not a whole number within {min}..{max}", name.to_string_lossy())
    });
    if !(min..=max).contains(&value) {
        pgrx::error!("{}: {value} is outside {min}..{max}", name.to_string_lossy());
    }
    value
}

/// PostgreSQL's own integer parser for settings (no unit).
fn parse_int_as_postgres(text: &str) -> Option<i64> {
    parse_int_with_unit(text, false)
}

/// Where this server's snowflake machine id comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MachineId {
    Fixed(u16),
    /// `-1`: leased from `pg_ticket.registry` by the lease worker.
    Leased,
}

fn parse_machine_id(text: &str, layout: Layout) -> Result<MachineId, String> {
    let number = parse_int_as_postgres(text).ok_or_else(|| format!("{text:?} is not a whole number"))?;
    if number == -1 {
        return Ok(MachineId::Leased);
    }
    layout.check_machine_id(number).map(MachineId::Fixed).map_err(|e| format!("{e} (or -1 to lease one)"))
}

/// A string setting's check hook around `parse`: a bad value is refused
/// when it is set (`SET`, `ALTER SYSTEM`: 22023; a reload: a log message),
/// with the parser's words as the detail.
unsafe fn check_string(newval: *mut *mut c_char, null_ok: bool, parse: impl Fn(&str) -> Result<(), String>) -> bool {
    let value = unsafe { *newval };
    if value.is_null() && null_ok {
        return true;
    }
    let text = if value.is_null() { String::new() } else { unsafe { CStr::from_ptr(value) }.to_string_lossy().into_owned() };
    match parse(&text) {
        Ok(()) => true,
        Err(e) => refuse_with_detail(e),
    }
}

/// A check hook's refusal, with `why` as the error's detail.
fn refuse_with_detail(why: String) -> bool {
    let detail = CString::new(why).unwrap_or_default();
    unsafe { pg_sys::GUC_check_errdetail_string = pg_sys::pstrdup(detail.as_ptr()) };
    false
}

/// A machine id beyond this server's layout is refused when set (ALTER
/// SYSTEM: 22023), not at the next start. Against the layout running: to
/// use more machine bits, set pg_ticket.machine_bits and restart first, or
/// set both in postgresql.conf.
#[pg_guard]
unsafe extern "C-unwind" fn check_machine_id_setting(newval: *mut i32, _extra: *mut *mut c_void, _source: pg_sys::GucSource::Type) -> bool {
    let value = i64::from(unsafe { *newval });
    match layout().check_machine_id(value) {
        Err(e) if value != -1 => refuse_with_detail(format!("{e} (pg_ticket.machine_bits = {}), or -1 to lease one", layout().machine_bits())),
        _ => true,
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn check_shards(newval: *mut *mut c_char, _extra: *mut *mut c_void, _source: pg_sys::GucSource::Type) -> bool {
    unsafe { check_string(newval, true, |text| parse_shard_list(text).map(|_| ()).map_err(|e| e.to_string())) }
}

/// The shards of `pg_ticket.shards` as this process has it, one bit each:
/// set by the assign hook, so a call reads a bit, not the text. Atomics
/// only to be a plain static (relaxed: a plain load); each process has its
/// own copy, a backend the postmaster's from its fork, as a thread-local
/// would be.
static OWNED_SHARDS: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];

/// Runs at every set of the value (start, reload, SET is not allowed):
/// already checked, so it parses.
#[pg_guard]
unsafe extern "C-unwind" fn assign_shards(newval: *const c_char, _extra: *mut c_void) {
    let text = if newval.is_null() { String::new() } else { unsafe { CStr::from_ptr(newval) }.to_string_lossy().into_owned() };
    let mut bits = [0u64; 64];
    for shard in parse_shard_list(&text).unwrap_or_default() {
        bits[usize::from(shard / 64)] |= 1 << (shard % 64);
    }
    for (owned, bits) in OWNED_SHARDS.iter().zip(bits) {
        owned.store(bits, Ordering::Relaxed);
    }
}

/// Does this server own `shard` (`pg_ticket.shards`, as reloaded)?
pub fn owns_shard(shard: u16) -> bool {
    OWNED_SHARDS[usize::from(shard / 64)].load(Ordering::Relaxed) & (1 << (shard % 64)) != 0
}

/// A bad epoch is refused when set, not at the next restart.
#[pg_guard]
unsafe extern "C-unwind" fn check_epoch(newval: *mut *mut c_char, _extra: *mut *mut c_void, _source: pg_sys::GucSource::Type) -> bool {
    unsafe { check_string(newval, true, |text| parse_epoch_ms(text).map(|_| ()).map_err(|e| e.to_string())) }
}

/// A self-leasing server's registry may not be emptied by a reload: libpq
/// would connect to its defaults (perhaps this very server) instead.
#[pg_guard]
unsafe extern "C-unwind" fn check_registry(newval: *mut *mut c_char, _extra: *mut *mut c_void, _source: pg_sys::GucSource::Type) -> bool {
    unsafe {
        // NULL (the line removed, RESET) is empty too.
        check_string(newval, false, |text| {
            if MACHINE.load(Ordering::Relaxed) == -1 && text.trim().is_empty() {
                Err("pg_ticket.machine_id = -1 leases its machine id from this registry; it cannot be empty".into())
            } else {
                Ok(())
            }
        })
    }
}

/// A value accepted (at a reload) replaces one refused at load.
#[pg_guard]
unsafe extern "C-unwind" fn assign_lease_ids(_newval: *const c_char, _extra: *mut c_void) {
    LEASE_IDS_REFUSED.store(false, Ordering::Relaxed);
}

#[pg_guard]
unsafe extern "C-unwind" fn check_lease_ids(newval: *mut *mut c_char, _extra: *mut *mut c_void, _source: pg_sys::GucSource::Type) -> bool {
    unsafe { check_string(newval, false, |text| parse_id_list(text, registry_layout().unwrap_or(Layout::WIDEST)).map(|_| ()).map_err(|e| e.to_string())) }
}

pub fn lease_margin_ms() -> i64 {
    i64::from(LEASE_MARGIN.get())
}

pub fn lease_max_ttl_ms() -> i64 {
    i64::from(LEASE_MAX_TTL.get())
}

/// The ids this registry may lease (checked when set); refused while the
/// configuration file's value is one PostgreSQL replaced by the default.
pub fn lease_ids() -> Result<Vec<u16>, crate::errors::TicketError> {
    if LEASE_IDS_REFUSED.load(Ordering::Relaxed) {
        return Err(crate::errors::TicketError::BadConfiguration(
            "pg_ticket.lease_ids in the configuration is not a list of machine ids (the server log says why); this registry grants nothing until it is fixed and reloaded".into(),
        ));
    }
    let text = LEASE_IDS.get().map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
    let layout = registry_layout().map_err(crate::errors::TicketError::BadConfiguration)?;
    Ok(parse_id_list(&text, layout).unwrap_or_else(|e| pgrx::error!("pg_ticket.lease_ids: {e}")))
}

/// The ID space's epoch for a registry: this server's snowflake epoch, or,
/// without preloading, the configured one as written.
pub fn registry_epoch_unix_ms() -> Result<i64, String> {
    if preloaded() {
        return Ok(epoch_unix_ms());
    }
    match configured(c"pg_ticket.epoch")?.filter(|text| !text.is_empty()) {
        None => Ok(DEFAULT_EPOCH_UNIX_MS),
        Some(text) => parse_epoch_ms(&text).map_err(|e| format!("pg_ticket.epoch: {e}")),
    }
}

/// The layout for a registry: this server's, or, without preloading (and
/// while preloading, before it is defined), the configured one.
pub fn registry_layout() -> Result<Layout, String> {
    if preloaded() {
        return Ok(layout());
    }
    match configured(c"pg_ticket.machine_bits")? {
        None => Ok(Layout::DEFAULT),
        Some(text) => parse_int_as_postgres(&text)
            .ok_or_else(|| format!("{text:?} is not a whole number"))
            .and_then(|bits| Layout::new(bits).map_err(|e| e.to_string()))
            .map_err(|e| format!("pg_ticket.machine_bits: {e}")),
    }
}

/// The value the server's configuration (its files, ALTER SYSTEM, its
/// command line) gives a setting this backend has not defined: the
/// placeholder's reset value, when it came from there. Not a session SET
/// (any role can set a placeholder), and not a connection's options, ALTER
/// ROLE or ALTER DATABASE, which become the reset value too: those are
/// refused, since a registry's first lease records the space for good.
fn configured(name: &CStr) -> Result<Option<String>, String> {
    if raw_setting(name).is_none() {
        return Ok(None);
    }
    use pg_sys::GucSource::*;
    let set_by = match reset_source(name) {
        Some(PGC_S_GLOBAL) => Some("ALTER ROLE ALL ... SET"),
        Some(PGC_S_DATABASE) => Some("ALTER DATABASE ... SET"),
        Some(PGC_S_USER) => Some("ALTER ROLE ... SET"),
        Some(PGC_S_DATABASE_USER) => Some("ALTER ROLE ... IN DATABASE ... SET"),
        Some(source) if source > PGC_S_ARGV => Some("the connection's options (PGOPTIONS, options=-c)"),
        _ => None,
    };
    if let Some(set_by) = set_by {
        return Err(format!(
            "{} is set by {set_by}, not by the server's configuration: a registry leases only in the ID space its postgresql.conf names; remove that setting",
            name.to_string_lossy()
        ));
    }
    let reset = unsafe { pg_sys::GetConfigOptionResetString(name.as_ptr()) };
    Ok((!reset.is_null()).then(|| unsafe { CStr::from_ptr(reset) }.to_string_lossy().into_owned()))
}

/// Where the reset value of the setting `name` came from (None: no such
/// setting).
fn reset_source(name: &CStr) -> Option<pg_sys::GucSource::Type> {
    find_setting(name).map(|v| unsafe { (*v).reset_source })
}

/// The setting (or placeholder) `name`, if this backend has one.
fn find_setting(name: &CStr) -> Option<*mut pg_sys::config_generic> {
    unsafe {
        #[cfg(feature = "pg15")]
        let found = {
            let variables = pg_sys::get_guc_variables();
            (0..pg_sys::GetNumConfigOptions().max(0) as usize)
                .map(|i| *variables.add(i))
                .find(|v| !v.is_null() && CStr::from_ptr((**v).name).to_bytes().eq_ignore_ascii_case(name.to_bytes()))
        };
        #[cfg(not(feature = "pg15"))]
        let found = Some(pg_sys::find_option(name.as_ptr(), false, true, pgrx::PgLogLevel::ERROR as i32)).filter(|v| !v.is_null());
        found
    }
}

/// A parallel worker that loads the library itself (its leader had not: a
/// PL/pgSQL function's first call of pg_ticket inside a parallel query)
/// cannot define the settings with their values — PostgreSQL refuses any
/// set during a parallel operation — and would run on the built-in
/// defaults (`scope_rights` off). Refused; a leader that loaded it first
/// passes it to its workers before their settings (#31 review).
fn refuse_a_parallel_workers_load() {
    // While a worker restores its leader's state it loads the libraries
    // the leader had, before the settings: that load is fine.
    if unsafe { pg_sys::ParallelWorkerNumber >= 0 && !pg_sys::InitializingParallelWorker } {
        pgrx::pg_sys::panic::ErrorReport::new(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "pg_ticket is loaded first by a parallel worker, where its settings cannot take their configured values",
            "pg_ticket",
        )
        .set_hint("Call a pg_ticket function in the session before the parallel query (any: SELECT pgticket.snowflake_id_space()), mark the calling function PARALLEL RESTRICTED, or preload pg_ticket (shared_preload_libraries).")
        .report(pgrx::PgLogLevel::ERROR);
    }
}

/// Whether PostgreSQL will refuse a placeholder's value set in `set_in` by
/// `set_by` once the setting is defined in `context` (set_config_option's
/// rule): a reload-only setting takes nothing from a session; a
/// superuser-only one nothing from an ordinary role's session without
/// `GRANT SET ON PARAMETER`.
fn refused_when_defined(name: &CStr, context: pg_sys::GucContext::Type, set_in: pg_sys::GucContext::Type, set_by: pg_sys::Oid) -> bool {
    use pg_sys::GucContext::*;
    match context {
        PGC_SUSET => {
            (set_in == PGC_USERSET || set_in == PGC_BACKEND)
                && !(unsafe { pg_sys::IsTransactionState() }
                    && unsafe { pg_sys::pg_parameter_aclcheck(name.as_ptr(), set_by, pg_sys::ACL_SET as pg_sys::AclMode) }
                        == pg_sys::AclResult::ACLCHECK_OK)
        }
        _ => set_in > context,
    }
}

/// The settings a role must not be able to weaken, defined when the library
/// loads on demand too, with the context each is defined in.
const GUARDED_ON_DEMAND: [(&CStr, pg_sys::GucContext::Type); 7] = [
    (c"pg_ticket.scope_rights", pg_sys::GucContext::PGC_SUSET),
    (c"pg_ticket.max_scopes_per_role", pg_sys::GucContext::PGC_SUSET),
    (c"pg_ticket.max_block_size", pg_sys::GucContext::PGC_SUSET),
    (c"pg_ticket.max_transaction_entries", pg_sys::GucContext::PGC_SUSET),
    (c"pg_ticket.lease_ids", pg_sys::GucContext::PGC_SIGHUP),
    (c"pg_ticket.lease_max_ttl", pg_sys::GucContext::PGC_SIGHUP),
    (c"pg_ticket.lease_margin", pg_sys::GucContext::PGC_SIGHUP),
];

/// SPEC §13.6: a setting a role may not set keeps the server's value,
/// whatever a connection passes. Where the library loads on demand (not
/// preloaded), its settings are placeholders until then, and a
/// placeholder takes any role's value — a connection's options
/// (`PGOPTIONS='-c pg_ticket.scope_rights=off'`), or `ALTER ROLE ... SET
/// ... USER SET`. When the setting is then defined, PostgreSQL refuses
/// that value (a WARNING) and leaves the built-in default, not the
/// configuration's: `scope_rights` off, `max_scopes_per_role` a million.
/// So such a load is refused here, before anything is defined (every later
/// call in the session fails the same way): the role's session runs no
/// pg_ticket code rather than the defaults. A value the server's
/// configuration gave (files, ALTER SYSTEM, the command line), or one a
/// superuser set, is applied as PostgreSQL applies it. Preloaded, the
/// settings exist before any connection, and PostgreSQL refuses such an
/// option itself.
fn refuse_overridden_placeholders() {
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        return;
    }
    for (name, context) in GUARDED_ON_DEMAND {
        let Some(setting) = find_setting(name) else { continue };
        let (source, set_in, set_by) = unsafe { ((*setting).reset_source, (*setting).reset_scontext, (*setting).reset_srole) };
        // Above the command line: ALTER DATABASE / ROLE, the connection.
        if source > pg_sys::GucSource::PGC_S_ARGV && refused_when_defined(name, context, set_in, set_by) {
            let message = format!(
                "{} is set for this session where PostgreSQL will not take it (the connection's options, or ALTER ROLE / ALTER DATABASE ... SET, by a role that may not set it, or of a setting only the configuration file sets), before pg_ticket was loaded",
                name.to_string_lossy()
            );
            pgrx::pg_sys::panic::ErrorReport::new(PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE, message, "pg_ticket")
                .set_detail("PostgreSQL would replace the server's configured value with the built-in default, so pg_ticket does not run in this session.")
                .set_hint("Connect without that option (PGOPTIONS, options=-c), or have it removed (ALTER ROLE / DATABASE ... RESET). With pg_ticket in shared_preload_libraries such an option is refused at connection.")
                .report(pgrx::PgLogLevel::ERROR);
        }
    }
}

/// The machine id this server stamps into snowflake_id(), if it can issue any.
pub fn own_snowflake_machine_id() -> Option<u16> {
    match machine_id() {
        MachineId::Fixed(id) if preloaded() => Some(id),
        _ => None,
    }
}

pub fn preloaded() -> bool {
    PRELOADED.load(Ordering::Relaxed)
}

pub fn epoch_unix_ms() -> i64 {
    EPOCH_UNIX_MS.load(Ordering::Relaxed)
}

/// This server's snowflake layout (`pg_ticket.machine_bits`; the default
/// where it is not defined, without preloading).
pub fn layout() -> Layout {
    Layout::new(i64::from(MACHINE_BITS.get())).unwrap_or_default()
}

/// Where the machine id comes from, for `pgticket.status`.
pub fn machine_id_source() -> &'static str {
    match machine_id() {
        MachineId::Leased => "leased",
        MachineId::Fixed(_) if MACHINE_ID_DEFAULT.load(Ordering::Relaxed) => "default",
        MachineId::Fixed(_) => "configured",
    }
}

pub fn machine_id() -> MachineId {
    match MACHINE.load(Ordering::Relaxed) {
        -1 => MachineId::Leased,
        id => MachineId::Fixed(id as u16),
    }
}

/// The registry's connection string (may change on reload).
pub fn registry() -> String {
    REGISTRY.get().map(|c| c.to_string_lossy().into_owned()).unwrap_or_default()
}

pub fn machine_lease_ttl_ms() -> i64 {
    i64::from(MACHINE_LEASE_TTL.get())
}

pub fn durable_commit() -> bool {
    DURABLE_COMMIT.get()
}

pub fn max_transaction_entries() -> usize {
    MAX_TRANSACTION_ENTRIES.get() as usize
}

/// This server's ticket series (offset, increment), fixed at start.
pub fn ticket_series() -> Series {
    let packed = TICKET_SERIES.load(Ordering::Relaxed);
    Series { offset: packed & 0xffff_ffff, increment: packed >> 32 }
}

/// Segment size bounds (reloadable). A minimum set above the maximum is
/// capped by it: the maximum is what `SHOW` says bounds a crash's gap.
pub fn ticket_step_bounds() -> (i64, i64) {
    let max = i64::from(TICKET_STEP_MAX.get());
    (i64::from(TICKET_STEP_MIN.get()).min(max), max)
}

pub fn ticket_wait_timeout() -> std::time::Duration {
    std::time::Duration::from_millis(TICKET_WAIT_TIMEOUT.get() as u64)
}

/// `pg_ticket.node_name`, None when empty.
pub fn node_name() -> Option<String> {
    NODE_NAME.get().map(|c| c.to_string_lossy().into_owned()).filter(|n| !n.is_empty())
}

pub fn creates_scopes() -> bool {
    CREATES_SCOPES.get()
}

pub fn scope_rights() -> bool {
    SCOPE_RIGHTS.get()
}

pub fn max_scopes_per_role() -> i64 {
    i64::from(MAX_SCOPES_PER_ROLE.get())
}

pub fn max_block_size() -> i64 {
    i64::from(MAX_BLOCK_SIZE.get())
}

/// A fault point of test builds (false in release builds).
pub fn test_reorder_ticket_installs() -> bool {
    cfg!(debug_assertions) && TEST_REORDER_TICKET_INSTALLS.get()
}

/// At most this many ticket workers at once (reloadable).
pub fn max_ticket_workers() -> usize {
    MAX_TICKET_WORKERS.get() as usize
}
