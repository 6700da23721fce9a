//! What a start is (SPEC §20.4), from PostgreSQL's own evidence, decided in
//! one place at preload (in the postmaster, or in a backend that `LOAD`s
//! the library during `pg_upgrade`); the data directory is the working
//! directory. What each kind of start may serve follows from it (§17.1):
//!
//! - `pg_upgrade`'s new cluster (`IsBinaryUpgrade`, started with `fsync`
//!   and `full_page_writes` off, which pg_upgrade sets for the new cluster
//!   alone, and pg_upgrade's `pg_upgrade_output.d` in this data directory,
//!   made there from PostgreSQL 15 on; the directory alone is no proof: a
//!   run with `--retain` leaves it behind in what may later be an old
//!   cluster): it never inherits a mark or a shard book it cannot
//!   prove. A mark or book this new cluster made itself before the upgrade
//!   (a snowflake made and its database dropped) is set aside, and the
//!   upgrade marker written whatever was there: until the old server's
//!   files are copied in or an administrator vouches, no snowflake or
//!   sharded ID (0.4.0 wrote the marker only where no mark existed, and a
//!   new cluster that had made one snowflake stamped below the old server).
//! - `pg_upgrade`'s old cluster (any other binary-upgrade start): a hold
//!   it carries (a restored start not yet vouched for, accepted shards
//!   held, a mark lost in an earlier upgrade) lives in marker files that an
//!   upgrade's copy steps can omit, so the upgrade is refused loudly until
//!   the hold is resolved (0.4.0's documented copy loop carried the mark
//!   and the book but not the markers, and the upgraded server stamped
//!   freely). And it is marked as read by pg_upgrade: started again as a
//!   server (copy mode leaves it usable), it cannot prove that its
//!   upgraded copy did not move on (a shard handed away, snowflakes past
//!   its mark), so that start is held as a restored one is (#46 review).
//!   `pg_upgrade --check` of a stopped old server marks it too.
//! - A base backup or a point-in-time recovery started in a server's place
//!   (`backup_label` or `recovery.signal`; `standby.signal` with a recovery
//!   target is a point-in-time recovery too), or a server pg_upgrade read:
//!   held (`history`, `wal`).
//! - A base backup whose first start went by without pg_ticket preloaded
//!   (a configuration outside the data directory, as on Debian; #46 item
//!   8): its `backup_label` was renamed `backup_label.old` unseen. Every
//!   preloaded start records the backup it began from (the label's start
//!   location and time) in `pg_ticket_backups.seen`, which a base backup
//!   copies with the rest; a later start that finds a `backup_label.old`
//!   of a backup not recorded there is held as a restored start. A
//!   standby's first start is preloaded (it replays pg_ticket's WAL), so a
//!   promoted standby's label is recorded; one first started without us
//!   (its replay stops at pg_ticket's first record) follows its primary
//!   all the same and is not held. The hold passes on: a base backup of
//!   such a copy (its `backup_label.old` unseen beside a `backup_label`)
//!   is held, a standby too, and pg_upgrade of such a copy is refused. A
//!   data directory with no such file never had a preloaded 0.5.0 start
//!   (a server of 0.4.0, a backup of one): its label is taken as seen, as
//!   0.4.0 took it.
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
/// Left in pg_upgrade's old cluster: its next start as a server is held.
const READ_BY_PG_UPGRADE: &str = "pg_ticket_read_by_pg_upgrade";

/// The backups this data directory's preloaded starts began from.
const BACKUPS_SEEN: &str = "pg_ticket_backups.seen";

/// A backup label's identity: its start location and time (the same for
/// `backup_label` and, once recovery ended, `backup_label.old`).
fn label_of(file: &str) -> Result<Option<String>, String> {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {file}: {e}")),
    };
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("START WAL LOCATION:") || l.starts_with("START TIME:")).collect();
    Ok(Some(lines.join(" / ")))
}

/// The labels recorded, or None where the file never was.
fn backups_seen() -> Result<Option<Vec<String>>, String> {
    match std::fs::read_to_string(BACKUPS_SEEN) {
        Ok(text) => Ok(Some(text.lines().skip(1).filter(|l| !l.is_empty()).map(str::to_string).collect())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {BACKUPS_SEEN}: {e}")),
    }
}

/// Records the label this start began from (and makes the file, so that a
/// base backup of this server carries it).
fn record_backup_seen(seen: &Option<Vec<String>>, label: Option<String>) -> Result<(), String> {
    let mut labels = seen.clone().unwrap_or_default();
    match label {
        Some(label) if !labels.contains(&label) => labels.push(label),
        _ if seen.is_some() => return Ok(()),
        _ => {}
    }
    let text = format!("backups this data directory's preloaded starts began from (pg_ticket)\n{}\n", labels.join("\n"));
    ticket_core::snowflake::write_atomically(Path::new(BACKUPS_SEEN), &text)
}

/// The recovery target settings: any set makes a recovery a point-in-time
/// one, in standby mode too.
const RECOVERY_TARGETS: [&std::ffi::CStr; 5] =
    [c"recovery_target", c"recovery_target_lsn", c"recovery_target_name", c"recovery_target_time", c"recovery_target_xid"];

fn recovery_target_set() -> bool {
    RECOVERY_TARGETS.iter().any(|name| {
        let value = unsafe { pgrx::pg_sys::GetConfigOption(name.as_ptr(), true, false) };
        !value.is_null() && unsafe { *value } != 0
    })
}

#[derive(Debug, PartialEq, Eq)]
enum Start {
    /// pg_upgrade's new cluster, started in binary-upgrade mode.
    UpgradeTarget,
    /// pg_upgrade's old cluster, started in binary-upgrade mode to be read.
    UpgradeSource,
    /// A base backup or a point-in-time recovery, not a standby; or a
    /// server pg_upgrade read; or a base backup first started unseen.
    Restored,
    /// A clean or crash restart, a standby.
    Ordinary,
}

/// The kind of this start, and the backup label it began from (to record).
fn classify(seen: &Option<Vec<String>>) -> Result<(Start, Option<String>), String> {
    let exists = |name: &str| Path::new(name).exists();
    // A `backup_label.old` of a backup this data directory's preloaded
    // starts never saw: a copy whose first start went by without us.
    let old_label = label_of("backup_label.old")?;
    let old_label_unseen = matches!((&old_label, seen), (Some(label), Some(seen)) if !seen.contains(label));
    if unsafe { pgrx::pg_sys::IsBinaryUpgrade } {
        let durability_off = unsafe { !pgrx::pg_sys::enableFsync && !pgrx::pg_sys::fullPageWrites };
        if durability_off && exists(PG_UPGRADE_OUTPUT) {
            return Ok((Start::UpgradeTarget, None));
        }
        if old_label_unseen {
            // Its hold is no marker yet: the upgraded copy would carry none
            // (#46 review of item 8).
            return Err("pg_upgrade's old cluster began from a base backup whose first start went by without pg_ticket preloaded, and is not vouched for: \
                        start it normally with pg_ticket preloaded, vouch with pgticket.raise_snowflake_mark() and accept its shards again with pgticket.accept_shard() (docs/operations.md), then run pg_upgrade"
                .into());
        }
        return Ok((Start::UpgradeSource, None));
    }
    let standby_following = exists("standby.signal") && !recovery_target_set();
    let recovering_to_a_point = exists("recovery.signal") || (exists("standby.signal") && recovery_target_set());
    let copy = (exists("backup_label") && !exists("standby.signal")) || recovering_to_a_point;
    if let Some(label) = label_of("backup_label")? {
        // A copy of a copy started unseen carries that one's label as
        // `backup_label.old` (and its list): it inherits the hold, standby
        // or not (#46 review of item 8: a standby of such a copy, promoted,
        // issued at once).
        let start = if copy || exists(READ_BY_PG_UPGRADE) || old_label_unseen { Start::Restored } else { Start::Ordinary };
        return Ok((start, Some(label)));
    }
    // A standby first started without pg_ticket (its replay stopped at
    // pg_ticket's first record, after PostgreSQL had renamed the label)
    // follows its primary all the same: not held (#46 review of item 8).
    let started_unseen = old_label_unseen && !standby_following;
    if copy || exists(READ_BY_PG_UPGRADE) || started_unseen {
        return Ok((Start::Restored, old_label));
    }
    Ok((Start::Ordinary, old_label))
}

/// At preload (or a binary-upgrade `LOAD`): what this start must do before
/// anything is served. An error stops the start.
pub fn at_start() {
    if let Err(e) = classify_and_act() {
        pgrx::error!("pg_ticket: {e}");
    }
}

fn classify_and_act() -> Result<(), String> {
    let seen = backups_seen()?;
    let (start, label) = classify(&seen)?;
    let outcome = match start {
        Start::UpgradeTarget => set_aside_own_state().and_then(|()| history::mark_an_upgrade_start()),
        Start::UpgradeSource => refuse_an_upgrade_that_would_drop_a_hold().and_then(|()| mark_as_read_by_pg_upgrade()),
        Start::Restored => wal::hold_a_restored_start().and_then(|()| history::hold_after_a_restored_start()).and_then(|()| forget_the_upgrade_read()),
        Start::Ordinary => Ok(()),
    };
    outcome?;
    // After the hold is in place: a start that fails before it records
    // nothing, and is held again at the next.
    if !unsafe { pgrx::pg_sys::IsBinaryUpgrade } {
        record_backup_seen(&seen, label)?;
    }
    Ok(())
}

/// The new cluster's own mark and book (made before the upgrade) are not
/// the old server's: renamed aside, so a mark found later is one copied in.
fn set_aside_own_state() -> Result<(), String> {
    for file in [MARK_FILE, SHARD_BOOK_FILE] {
        if Path::new(file).exists() {
            let aside = format!("{file}{SET_ASIDE}");
            std::fs::rename(file, &aside).map_err(|e| format!("pg_upgrade's new cluster has its own {file}, which cannot be set aside as {aside}: {e}"))?;
            pgrx::log!(
                "pg_ticket: pg_upgrade's new cluster had its own {file} (made before the upgrade, not the old server's): set aside as {aside}, not to be copied back; copy the old server's {file} in after the upgrade"
            );
        }
    }
    super::flush_data_directory()
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

/// pg_upgrade's old cluster: its next start as a server is held.
fn mark_as_read_by_pg_upgrade() -> Result<(), String> {
    if Path::new(READ_BY_PG_UPGRADE).exists() {
        return Ok(());
    }
    let text = "pg_upgrade read this data directory: started again as a server, it holds its snowflakes and shards until vouched for\n";
    ticket_core::snowflake::write_atomically(Path::new(READ_BY_PG_UPGRADE), text).map_err(|e| format!("pg_upgrade's old cluster, and {e}"))
}

/// Once a start of a server pg_upgrade read holds (the hold markers are
/// written), the note that it was read goes.
fn forget_the_upgrade_read() -> Result<(), String> {
    match std::fs::remove_file(READ_BY_PG_UPGRADE) {
        Ok(()) => {
            pgrx::log!("pg_ticket: pg_upgrade read this data directory before: its snowflakes and shards are held until vouched for (pgticket.raise_snowflake_mark)");
            super::flush_data_directory()
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot remove {READ_BY_PG_UPGRADE}: {e}")),
    }
}
