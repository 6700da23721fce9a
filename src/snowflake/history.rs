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
//!
//! `pgticket.raise_snowflake_mark(after)` is the administrator's word: the
//! mark is written past `after` (server-wide), the marker removed.
//!
//! One atomic load once the server has a mark; until then a file test per
//! call. Touches: the mark (through `wal::WalMarkStore`, under the
//! generator's writer flag), the marker file, `pgticket.id_space` (read).

use pgrx::prelude::*;
use std::path::Path;
use ticket_core::snowflake as layout;

use super::{space, wal, SystemClock, GENERATOR, MARK_FILE};
use crate::errors::{OrRaise, TicketError};
use crate::settings;

/// Left in a data directory that `pg_upgrade` started without a mark.
const UPGRADE_MARKER: &str = "pg_ticket_snowflake.upgraded";

/// The furthest ahead of this server's clock an administrator may vouch:
/// a time past it is a mistake (`infinity`, a year typed wrong) that would
/// stop every snowflake until then.
const MAX_VOUCH_AHEAD_MS: i64 = 24 * 3600 * 1000;

/// At a binary-upgrade start (`pg_upgrade`), in the postmaster or a
/// backend: the data directory is the working directory.
pub fn mark_an_upgrade_start() {
    if !Path::new(MARK_FILE).exists() && !Path::new(UPGRADE_MARKER).exists() {
        let text = "pg_upgrade started this data directory without pg_ticket_snowflake.mark: no snowflakes until it is copied over or vouched for (pgticket.raise_snowflake_mark)\n";
        if let Err(e) = layout::write_atomically(Path::new(UPGRADE_MARKER), text) {
            pgrx::error!("pg_ticket: a pg_upgrade start without a snowflake mark, and {e}");
        }
    }
}

/// Refuses to stamp where this server lost its mark.
pub fn check() -> Result<(), TicketError> {
    let generator = &GENERATOR.get().0;
    if layout::has_mark(generator) {
        return Ok(());
    }
    layout::load_mark(generator, &SystemClock, &wal::WalMarkStore, settings::epoch_unix_ms())?;
    if layout::has_mark(generator) {
        return Ok(());
    }
    if Path::new(UPGRADE_MARKER).exists() {
        return Err(TicketError::MarkNotCarried { upgraded: true });
    }
    if !space::recorded_in_this_transaction() && space::recorded()?.is_some() {
        return Err(TicketError::MarkNotCarried { upgraded: false });
    }
    Ok(())
}

/// Whether a mark may be written for a database's first use of its space
/// by a server that has none (a registry's first grant records its space
/// in one): not where an upgrade lost the mark.
pub fn first_mark_allowed() -> bool {
    !Path::new(UPGRADE_MARKER).exists() && space::recorded_in_this_transaction()
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
        let after = crate::api::required("after", after);
        let now_unix_ms = super::now_unix_ms();
        if !after.is_finite() {
            TicketError::InfiniteTime.raise();
        }
        let after_unix_ms = super::unix_ms_of_timestamptz(after);
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
        // The mark stands now: the marker of a lost one goes.
        if let Err(e) = std::fs::remove_file(UPGRADE_MARKER) {
            if e.kind() != std::io::ErrorKind::NotFound {
                pgrx::warning!("pg_ticket: cannot remove {UPGRADE_MARKER}: {e} (the mark is written; the marker is ignored while it stands)");
            }
        }
        let mark_unix_ms = epoch + mark_ms as i64;
        pgrx::log!("pg_ticket: raise_snowflake_mark() raised the snowflake mark to {mark_unix_ms} Unix ms");
        super::timestamptz_or_error(mark_unix_ms)
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
