//! A mark that was lost (SPEC §17.1). The snowflake mark is a file beside
//! the catalog: `pg_upgrade` does not copy it, and a data directory can be
//! restored or copied without it. A server without its mark cannot know
//! how far ahead its old self stamped (a clock that ran ahead), so a start
//! that cannot prove it follows its own latest state is never "treated as
//! new":
//!
//! - `pg_upgrade` starts the new data directory's server in binary-upgrade
//!   mode and loads pg_ticket there (preloaded, or `LOAD` to check that
//!   the library is installed): if that directory has no mark then, the
//!   library leaves `UPGRADE_MARKER` in it. Until a mark is there
//!   (the old file copied in, or written by a vouch), the server makes no
//!   snowflake or sharded ID in any database — a new database's first use
//!   included, whose mark would otherwise stand for the whole server.
//! - Any other server with no mark refuses in a database whose ID space was
//!   recorded before this transaction (IDs were made for it), and serves
//!   the first use of a database (a new server's first snowflakes).
//! - A start from a base backup or a point-in-time recovery (`backup_label`
//!   or `recovery.signal`, no `standby.signal`: `wal::mark_a_restored_start`)
//!   has a mark, but maybe an old one: the server it stands in for may
//!   have stamped past it since (a clock that ran ahead), so it holds every
//!   snowflake and sharded ID (`RESTORE_MARKER`) until vouched for, as it
//!   holds its accepted shards.
//!
//! `pgticket.raise_snowflake_mark(after)` is the administrator's word: the
//! mark is written past `after` (server-wide), the marker removed.
//!
//! Two atomic loads once the server has a mark and is not held; until then
//! a file test per call (the hold: one per server start). Touches: the mark
//! (through `wal::WalMarkStore`, under the generator's writer flag), the
//! marker files, `pgticket.id_space` (read), `RESTORE_HOLD` (shared memory:
//! an atomic, no lock).

use pgrx::prelude::*;
use std::path::Path;
use ticket_core::snowflake as layout;

use super::{space, wal, SystemClock, GENERATOR};
use crate::errors::{MarkLost, OrRaise, TicketError};
use crate::settings;

/// Left in a data directory that `pg_upgrade` started without a mark.
const UPGRADE_MARKER: &str = "pg_ticket_snowflake.upgraded";

/// Left in a data directory started from a base backup or a point-in-time
/// recovery: its mark may be older than what its old self stamped.
const RESTORE_MARKER: &str = "pg_ticket_snowflake.held";

/// Whether `RESTORE_MARKER` stands, as this server's processes last saw
/// it: `UNKNOWN` after a (re)start of shared memory (the file is tested
/// once), then `HELD` or `CLEAR`; a vouch sets `CLEAR`.
#[derive(Default)]
pub struct RestoreHold(std::sync::atomic::AtomicU8);
const UNKNOWN: u8 = 0;
const HELD: u8 = 1;
const CLEAR: u8 = 2;

// An atomic only.
unsafe impl pgrx::PGRXSharedMemory for RestoreHold {}

static RESTORE_HOLD: pgrx::PgAtomic<RestoreHold> = unsafe { pgrx::PgAtomic::new(c"pg_ticket_snowflake_restore_hold") };

pub fn init_shared_memory() {
    pgrx::pg_shmem_init!(RESTORE_HOLD);
}

/// At preload, in the postmaster, for a start that may be an old copy in a
/// server's place (`start`): snowflakes and sharded IDs are held until
/// vouched for.
pub fn hold_after_a_restored_start() -> Result<(), String> {
    if Path::new(RESTORE_MARKER).exists() {
        return Ok(());
    }
    let text = "started from a base backup or a point-in-time recovery: no snowflakes or sharded IDs until vouched for (pgticket.raise_snowflake_mark)\n";
    layout::write_atomically(Path::new(RESTORE_MARKER), text)
}

fn held_after_a_restore() -> bool {
    use std::sync::atomic::Ordering;
    let state = &RESTORE_HOLD.get().0;
    match state.load(Ordering::Acquire) {
        CLEAR => false,
        HELD => true,
        _ => {
            let held = Path::new(RESTORE_MARKER).exists();
            // A vouch meanwhile set CLEAR after removing the file: kept.
            let _ = state.compare_exchange(UNKNOWN, if held { HELD } else { CLEAR }, Ordering::AcqRel, Ordering::Acquire);
            state.load(Ordering::Acquire) == HELD
        }
    }
}

/// The furthest ahead of this server's clock an administrator may vouch:
/// a time past it is a mistake (`infinity`, a year typed wrong) that would
/// stop every snowflake until then.
const MAX_VOUCH_AHEAD_MS: i64 = 24 * 3600 * 1000;

/// The markers of a hold on the snowflakes (a lost mark, a restored start).
pub const HOLD_MARKERS: [&str; 2] = [UPGRADE_MARKER, RESTORE_MARKER];

/// At a start of pg_upgrade's new cluster (`start`), its own mark set
/// aside: no snowflake until the old server's mark is copied in or
/// vouched for.
pub fn mark_an_upgrade_start() -> Result<(), String> {
    if Path::new(UPGRADE_MARKER).exists() {
        return Ok(());
    }
    let text = "pg_upgrade started this data directory: no snowflakes until the old server's pg_ticket_snowflake.mark is copied over or vouched for (pgticket.raise_snowflake_mark)\n";
    layout::write_atomically(Path::new(UPGRADE_MARKER), text).map_err(|e| format!("a pg_upgrade start, and {e}"))
}

/// Refuses to stamp where this server lost its mark, or may have.
pub fn check() -> Result<(), TicketError> {
    if held_after_a_restore() {
        return Err(TicketError::MarkNotCarried { cause: MarkLost::Restored });
    }
    let generator = &GENERATOR.get().0;
    if layout::has_mark(generator) {
        return Ok(());
    }
    layout::load_mark(generator, &SystemClock, &wal::WalMarkStore, settings::epoch_unix_ms())?;
    if layout::has_mark(generator) {
        return Ok(());
    }
    if Path::new(UPGRADE_MARKER).exists() {
        return Err(TicketError::MarkNotCarried { cause: MarkLost::Upgraded });
    }
    if !space::recorded_in_this_transaction() && space::recorded()?.is_some() {
        return Err(TicketError::MarkNotCarried { cause: MarkLost::Missing });
    }
    Ok(())
}

/// Whether a mark may be written for a database's first use of its space
/// by a server that has none (a registry's first grant records its space
/// in one): not where an upgrade lost the mark.
pub fn first_mark_allowed() -> bool {
    !Path::new(UPGRADE_MARKER).exists() && !held_after_a_restore() && space::recorded_in_this_transaction()
}

/// Admin (SPEC §17.1): the word for a lost snowflake mark. Every
/// snowflake and sharded ID this server makes from now on, in every
/// database, is after `after` (and after now), here and after a
/// restart. For a server whose mark file was not carried over
/// (`pg_upgrade`, a data directory restored without it): give a time
/// past every ID the old server made in any database — its old mark
/// file's time, or the latest decoded `max(id)` of all its tables,
/// plus any error of its clock; `now()` if it never made one. At most
/// a day ahead of this server's clock. Returns the mark written. It
/// only raises.
#[pg_extern(volatile, parallel_unsafe, schema = "pgticket")]
fn raise_snowflake_mark(after: Option<TimestampWithTimeZone>) -> TimestampWithTimeZone {
    crate::errors::postgres_errors_as_raised(|| {
        if !settings::preloaded() {
            TicketError::NotPreloaded("pgticket.raise_snowflake_mark").raise();
        }
        crate::xact::check_writable().or_raise();
        let after = crate::args::required("after", after);
        let now_unix_ms = crate::clock::now_unix_ms();
        if !after.is_finite() {
            TicketError::InfiniteTime.raise();
        }
        let after_unix_ms = crate::clock::unix_ms_of_timestamptz(after);
        if after_unix_ms > now_unix_ms.saturating_add(MAX_VOUCH_AHEAD_MS) {
            TicketError::InvalidArgument(format!(
                "after is more than a day ahead of this server's clock ({}): a mark that far ahead stops every snowflake until then; give the time past the old server's last ID",
                ticket_core::epoch::format_unix_ms(now_unix_ms)
            ))
            .raise();
        }
        let epoch = settings::epoch_unix_ms();
        let after_ms = (after_unix_ms.max(now_unix_ms) - epoch).max(0) as u64;
        let mark_ms = layout::raise_mark(&GENERATOR.get().0, &SystemClock, &wal::WalMarkStore, epoch, after_ms).or_raise();
        // The mark stands now: the markers of a lost one go.
        for marker in [UPGRADE_MARKER, RESTORE_MARKER] {
            if let Err(e) = std::fs::remove_file(marker) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    TicketError::Snowflake(layout::SnowflakeError::MarkStore(format!("the snowflake mark is raised, but {marker} cannot be removed: {e}"))).raise();
                }
            }
        }
        RESTORE_HOLD.get().0.store(CLEAR, std::sync::atomic::Ordering::Release);
        // A restored start's shard holds are applied now, not at the first
        // shard call: nothing of the restore stays pending (pg_upgrade
        // refuses an old server while its marker stands).
        super::shards::load_book().or_raise();
        let mark_unix_ms = epoch + mark_ms as i64;
        pgrx::log!("pg_ticket: raise_snowflake_mark() raised the snowflake mark to {mark_unix_ms} Unix ms");
        crate::clock::timestamptz_or_error(mark_unix_ms)
    })
}

extension_sql!(
    r#"
COMMENT ON FUNCTION pgticket.raise_snowflake_mark(timestamptz) IS
    'Admin: vouch for a lost snowflake mark (pg_upgrade, a restore without pg_ticket_snowflake.mark): this server makes snowflakes and sharded IDs only after the time given';
REVOKE EXECUTE ON FUNCTION pgticket.raise_snowflake_mark(timestamptz) FROM PUBLIC;
"#,
    name = "raise_snowflake_mark_privileges",
    requires = [raise_snowflake_mark]
);
