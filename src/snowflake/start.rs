//! What a start is (SPEC §20.4), from PostgreSQL's own evidence, decided in
//! one place at preload (in the postmaster, or in a backend that `LOAD`s
//! the library during `pg_upgrade`); the data directory is the working
//! directory. What each kind of start may serve follows from it (§17.1):
//!
//! - `pg_upgrade`'s new cluster (`IsBinaryUpgrade`, and pg_upgrade's
//!   `pg_upgrade_output.d` in this data directory, made there from
//!   PostgreSQL 15 on): it never inherits a mark or a shard book it cannot
//!   prove. A mark or book this new cluster made itself before the upgrade
//!   (a snowflake made and its database dropped) is set aside, and the
//!   upgrade marker written whatever was there: until the old server's
//!   files are copied in or an administrator vouches, no snowflake or
//!   sharded ID (0.4.0 wrote the marker only where no mark existed, and a
//!   new cluster that had made one snowflake stamped below the old server).
//! - `pg_upgrade`'s old cluster (`IsBinaryUpgrade` without that directory):
//!   a hold it carries (a restored start not yet vouched for, accepted
//!   shards held, a mark lost in an earlier upgrade) lives in marker files
//!   that an upgrade's copy steps can omit, so the upgrade is refused
//!   loudly until the hold is resolved (0.4.0's documented copy loop
//!   carried the mark and the book but not the markers, and the upgraded
//!   server stamped freely).
//! - A base backup or a point-in-time recovery started in a server's place
//!   (`backup_label` or `recovery.signal`, no `standby.signal`): held
//!   (`history`, `wal`).
//! - Anything else (a clean or crash restart, a standby): nothing to do.
//!
//! Touches: the marker files and, at an upgrade's new cluster, the mark and
//! book files (renamed aside). No shared memory: it runs before there is any.

use std::path::Path;

use super::{history, wal, MARK_FILE, SHARD_BOOK_FILE};

/// pg_upgrade's own directory in the new cluster's data directory (15+).
const PG_UPGRADE_OUTPUT: &str = "pg_upgrade_output.d";
/// What a file of the new cluster's own is renamed to at its upgrade.
const SET_ASIDE: &str = ".before-pg_upgrade";

#[derive(Debug, PartialEq, Eq)]
pub enum Start {
    /// pg_upgrade's new cluster, started in binary-upgrade mode.
    UpgradeTarget,
    /// pg_upgrade's old cluster, started in binary-upgrade mode to be read.
    UpgradeSource,
    /// A base backup or a point-in-time recovery, not a standby.
    Restored,
    /// A clean or crash restart, a standby.
    Ordinary,
}

/// The kind of this start.
pub fn classify() -> Start {
    let exists = |name: &str| Path::new(name).exists();
    if unsafe { pgrx::pg_sys::IsBinaryUpgrade } {
        return if exists(PG_UPGRADE_OUTPUT) { Start::UpgradeTarget } else { Start::UpgradeSource };
    }
    if (exists("backup_label") || exists("recovery.signal")) && !exists("standby.signal") {
        return Start::Restored;
    }
    Start::Ordinary
}

/// At preload (or a binary-upgrade `LOAD`): what this start must do before
/// anything is served. An error stops the start.
pub fn at_start() {
    let outcome = match classify() {
        Start::UpgradeTarget => set_aside_own_state().and_then(|()| history::mark_an_upgrade_start()),
        Start::UpgradeSource => refuse_an_upgrade_that_would_drop_a_hold(),
        Start::Restored => wal::hold_a_restored_start().and_then(|()| history::hold_after_a_restored_start()),
        Start::Ordinary => Ok(()),
    };
    if let Err(e) = outcome {
        pgrx::error!("pg_ticket: {e}");
    }
}

/// The new cluster's own mark and book (made before the upgrade) are not
/// the old server's: renamed aside, so a mark found later is one copied in.
fn set_aside_own_state() -> Result<(), String> {
    for file in [MARK_FILE, SHARD_BOOK_FILE] {
        if Path::new(file).exists() {
            let aside = format!("{file}{SET_ASIDE}");
            std::fs::rename(file, &aside).map_err(|e| format!("pg_upgrade's new cluster has its own {file}, which cannot be set aside as {aside}: {e}"))?;
            pgrx::log!("pg_ticket: pg_upgrade's new cluster had its own {file} (made before the upgrade): set aside as {aside}; the old server's is copied in after the upgrade");
        }
    }
    std::fs::File::open(".").and_then(|d| d.sync_all()).map_err(|e| format!("cannot flush the data directory: {e}"))
}

/// The old cluster's holds are markers an upgrade's copy may omit: the
/// upgrade waits until they are resolved.
fn refuse_an_upgrade_that_would_drop_a_hold() -> Result<(), String> {
    let held: Vec<&str> = history::HOLD_MARKERS.iter().chain([wal::HOLD_MARKER].iter()).copied().filter(|m| Path::new(m).exists()).collect();
    if held.is_empty() {
        return Ok(());
    }
    Err(format!(
        "pg_upgrade's old cluster is held ({}: a start from a base backup or a point-in-time recovery, or a mark lost in an earlier upgrade, not yet vouched for): \
         start it normally, vouch with pgticket.raise_snowflake_mark() and accept its shards again with pgticket.accept_shard() (docs/operations.md), then run pg_upgrade",
        held.join(", ")
    ))
}
