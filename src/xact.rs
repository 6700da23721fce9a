//! What an allocation asks of the current transaction: may it write, and
//! how its commit is made; who runs it.

use pgrx::pg_sys;

use crate::errors::TicketError;

/// Allocations write (or, for snowflakes, must not run on a standby that
/// shares the primary's machine id), so read-only transactions and hot
/// standbys refuse them, as they refuse nextval().
#[inline]
pub fn check_writable() -> Result<(), TicketError> {
    if read_only() {
        return Err(TicketError::ReadOnly { standby: unsafe { pg_sys::RecoveryInProgress() } });
    }
    Ok(())
}

/// During recovery every transaction is read-only, so one flag covers both.
#[inline]
pub fn read_only() -> bool {
    unsafe { pg_sys::XactReadOnly }
}

/// The current subtransaction's id. Called once per allocation: pgrx
/// guards every call into PostgreSQL with a sigsetjmp in case it raises an
/// ERROR, a cost of its own on a path of a few hundred nanoseconds, and
/// this function only reads a field (xact.c's GetCurrentSubTransactionId:
/// `return CurrentTransactionState->subTransactionId;`), so it is called
/// unguarded.
#[inline]
pub fn current_subtransaction() -> pg_sys::SubTransactionId {
    extern "C" {
        fn GetCurrentSubTransactionId() -> pg_sys::SubTransactionId;
    }
    unsafe { GetCurrentSubTransactionId() }
}

/// The current user. Called at every allocation while rights are on, so
/// unguarded for the same reason as `current_subtransaction`: miscinit.c's
/// GetUserId only returns a variable (`return CurrentUserId;`).
#[inline]
pub fn current_user() -> pg_sys::Oid {
    extern "C" {
        fn GetUserId() -> pg_sys::Oid;
    }
    unsafe { GetUserId() }
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

/// Did the synchronous standbys confirm this backend's last commit? True
/// when there are none to wait for. PostgreSQL's commit waits for them, but
/// a cancelled or terminated wait (pg_cancel_backend, pg_terminate_backend)
/// ends with a WARNING and the commit stands locally only (SPEC §13.2):
/// whoever hands out what that commit reserved must check this first.
/// Decided as `SyncRepWaitForLSN` decides whether to wait (the shared
/// "standbys defined" state, or this backend's setting before the
/// checkpointer has published it), and read as it reads the flush position
/// the walsenders released waiters up to (`synchronous_commit = on`).
pub fn commit_confirmed_by_standbys() -> bool {
    standbys_confirmed(unsafe { pg_sys::XactLastCommitEnd })
}

/// `SyncRepLock` (`lwlocknames.h`: the same slot in 15, 16 and 18).
fn sync_rep_lock() -> *mut pg_sys::LWLock {
    const SYNC_REP_LOCK: usize = 32;
    unsafe { &raw mut (*pg_sys::MainLWLockArray.add(SYNC_REP_LOCK)).lock }
}

/// Have the synchronous standbys (if any are to be waited for) flushed WAL
/// up to `lsn`? Read under `SyncRepLock`, as the waiters' queue is: when
/// `synchronous_standby_names` is emptied, the checkpointer releases every
/// waiter and then marks the standbys undefined in one hold of that lock,
/// so a released waiter reading without it could still see them defined
/// and its commit unconfirmed.
fn standbys_confirmed(lsn: pg_sys::XLogRecPtr) -> bool {
    unsafe {
        let ctl = pg_sys::WalSndCtl;
        // As SyncRepRequested(): without WAL senders nothing waits (the
        // callers' level is at least remote_flush by now).
        if ctl.is_null() || pg_sys::max_wal_senders == 0 {
            return true;
        }
        pg_sys::LWLockAcquire(sync_rep_lock(), pg_sys::LWLockMode::LW_SHARED);
        let confirmed = flushed_to(ctl, lsn);
        pg_sys::LWLockRelease(sync_rep_lock());
        confirmed
    }
}

/// `standbys_confirmed` with `SyncRepLock` held.
unsafe fn flushed_to(ctl: *mut pg_sys::WalSndCtlData, lsn: pg_sys::XLogRecPtr) -> bool {
    unsafe {
        let defined = {
            #[cfg(feature = "pg16")]
            {
                std::ptr::read_volatile(&raw const (*ctl).sync_standbys_defined)
            }
            #[cfg(not(feature = "pg16"))]
            {
                // SYNC_STANDBY_INIT / SYNC_STANDBY_DEFINED (walsender_private.h)
                let status = std::ptr::read_volatile(&raw const (*ctl).sync_standbys_status);
                if status & 1 != 0 {
                    status & 2 != 0
                } else {
                    let names = pg_sys::SyncRepStandbyNames;
                    !names.is_null() && *names != 0
                }
            }
        };
        if !defined {
            return true;
        }
        let confirmed = std::ptr::read_volatile(&raw const (*ctl).lsn[pg_sys::SYNC_REP_WAIT_FLUSH as usize]);
        lsn <= confirmed
    }
}

extern "C-unwind" {
    /// The setting's assign hook, which derives the wait mode from it
    /// (syncrep.c; declared in guc_hooks.h from 16 on, which the
    /// bindings of every version do not include).
    fn assign_synchronous_commit(newval: std::ffi::c_int, extra: *mut std::ffi::c_void);
}

/// Wait, as a commit would with `synchronous_commit = on`, until the
/// synchronous standbys (if any) have flushed WAL up to `lsn`, whatever
/// this session's `synchronous_commit` says (the snowflake mark is the
/// server's, not the session's). Interrupts are held as PostgreSQL holds
/// them around this wait; a cancel or terminate ends it early with a
/// WARNING, and then this returns false: the caller refuses (SPEC §13.2).
pub fn wait_for_synchronous_standbys(lsn: pg_sys::XLogRecPtr) -> bool {
    unsafe {
        // The level and the wait mode its assign hook derives, for this
        // wait only (no GUC stack entry: nothing can fail in between).
        let saved = pg_sys::synchronous_commit;
        let on = pg_sys::SyncCommitLevel::SYNCHRONOUS_COMMIT_REMOTE_FLUSH as i32;
        let raise = saved < on;
        if raise {
            pg_sys::synchronous_commit = on;
            assign_synchronous_commit(on, std::ptr::null_mut());
        }
        pg_sys::InterruptHoldoffCount += 1;
        pg_sys::SyncRepWaitForLSN(lsn, false);
        pg_sys::InterruptHoldoffCount -= 1;
        if raise {
            pg_sys::synchronous_commit = saved;
            assign_synchronous_commit(saved, std::ptr::null_mut());
        }
        standbys_confirmed(lsn)
    }
}
