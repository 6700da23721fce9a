//! What an allocation asks of the current transaction: may it write, and
//! how its commit is made.

use pgrx::pg_sys;

use crate::errors::TicketError;

/// Allocations write (or, for snowflakes, must not run on a standby that
/// shares the primary's machine id), so read-only transactions and hot
/// standbys refuse them, as they refuse nextval().
#[inline]
pub fn check_writable() -> Result<(), TicketError> {
    // During recovery every transaction is read-only, so one flag covers both.
    if unsafe { pg_sys::XactReadOnly } {
        return Err(TicketError::ReadOnly { standby: unsafe { pg_sys::RecoveryInProgress() } });
    }
    Ok(())
}

/// Lifts a `SET TRANSACTION READ ONLY` given after values were taken, for
/// the commit-time write of their marks, and puts it back on drop.
/// PostgreSQL itself commits such a transaction with everything it wrote
/// before the flag; the marks are part of that, only written late.
pub struct WritableForCommit {
    was_read_only: bool,
}

impl WritableForCommit {
    pub fn new() -> Self {
        // Never on a standby: nothing can have been taken there.
        let was_read_only = unsafe { pg_sys::XactReadOnly && !pg_sys::RecoveryInProgress() };
        if was_read_only {
            unsafe { pg_sys::XactReadOnly = false };
        }
        WritableForCommit { was_read_only }
    }
}

impl Drop for WritableForCommit {
    fn drop(&mut self) {
        if self.was_read_only {
            unsafe { pg_sys::XactReadOnly = true };
        }
    }
}

/// Commit this transaction as `synchronous_commit = on` would, whatever the
/// session's setting: flushed to local WAL, and to a synchronous standby
/// when one is configured. A higher setting (remote_apply) is left alone.
/// Set LOCAL, so it ends with the transaction.
pub fn make_commit_durable() {
    if unsafe { pg_sys::synchronous_commit } >= pg_sys::SyncCommitLevel::SYNCHRONOUS_COMMIT_REMOTE_FLUSH as i32 {
        return;
    }
    unsafe {
        pg_sys::set_config_option(
            c"synchronous_commit".as_ptr(),
            c"on".as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_LOCAL,
            true,
            pg_sys::PGERROR as i32,
            false,
        );
    }
}
