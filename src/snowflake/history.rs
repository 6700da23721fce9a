//! Whose IDs the mark stands for (SPEC §17.1). The snowflake mark is a
//! file beside the catalog: `pg_upgrade` does not copy it, a restore of a
//! dump into another server does not bring it, and the new server's clock
//! says nothing about how far ahead the old one stamped. A start that
//! cannot prove it follows its own latest state must not be "treated as
//! new", so before this server stamps a snowflake or a sharded ID for a
//! database it checks that its mark covers the IDs made for that database:
//!
//! 1. the server has a mark (loaded at start or written since), or the
//!    database's ID space was recorded by this very transaction (its first
//!    use), or the database records no space (0.2.0's objects);
//! 2. every server that recorded the database's space
//!    (`pgticket.id_space.system_identifier`, a PostgreSQL system
//!    identifier) is one the mark file names (`systems=`, ticket-core's
//!    `FileMarkStore`): this server itself, a server whose file was carried
//!    over (the old server of a `pg_upgrade`), or one an administrator
//!    vouched for with `pgticket.raise_snowflake_mark()`.
//!
//! Otherwise the call is refused (55000, naming the file and the call).
//! Rule 2 also holds where a new database's first use wrote a mark after
//! an upgrade: the upgraded databases still name the old server.
//!
//! Checked once per backend and state-table generation (a change of
//! `pgticket.id_space` invalidates it everywhere); what it reads only
//! grows (a mark appears, the servers named are added to), so a pass stays
//! true. Touches: the mark file (read without the writer flag: a write
//! renames a whole new file in; written only through `wal::WalMarkStore`
//! under the flag) and `pgticket.id_space` (read as its owner).

use pgrx::prelude::*;
use std::cell::{Cell, RefCell};
use ticket_core::snowflake as layout;

use super::{space, wal, SystemClock, GENERATOR};
use crate::errors::{OrRaise, TicketError};
use crate::{settings, state_tables};

thread_local! {
    /// The state-table generation at which this database's IDs were found
    /// covered by the mark.
    static CHECKED: Cell<Option<u64>> = const { Cell::new(None) };
    /// Servers an administrator vouches for in the call under way: the
    /// mark written by it names them.
    static VOUCHED: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Refuses a database whose IDs this server's mark does not cover.
pub fn check() -> Result<(), TicketError> {
    let generation = state_tables::generation();
    if CHECKED.get() == Some(generation) {
        return Ok(());
    }
    let generator = &GENERATOR.get().0;
    layout::load_mark(generator, &SystemClock, &wal::WalMarkStore, settings::epoch_unix_ms())?;
    let named = named_systems();
    let unknown: Vec<u64> = space::recorded_systems().into_iter().filter(|s| !named.contains(s)).collect();
    if !unknown.is_empty() {
        return Err(TicketError::MarkNotOf { systems: unknown });
    }
    if !layout::has_mark(generator) && !space::recorded_in_this_transaction() && space::recorded()?.is_some() {
        return Err(TicketError::MarkNotCarried);
    }
    CHECKED.set(Some(generation));
    Ok(())
}

/// The servers the mark stands for: those its file names, and this one.
fn named_systems() -> Vec<u64> {
    let mut named = wal::file().systems().unwrap_or_default();
    named.push(space::this_system());
    named
}

/// What a mark written now names: what the file named, the servers vouched
/// for by the call under way, and this server (the latest last).
pub fn systems_to_name() -> Vec<u64> {
    let mut named = wal::file().systems().unwrap_or_default();
    VOUCHED.with_borrow(|vouched| named.extend_from_slice(vouched));
    named.push(space::this_system());
    named
}

/// The servers vouched for, named by marks written while it lives (and by
/// no later one, whatever ends the call).
struct Vouching;

impl Vouching {
    fn for_servers(systems: Vec<u64>) -> Vouching {
        VOUCHED.set(systems);
        Vouching
    }
}

impl Drop for Vouching {
    fn drop(&mut self) {
        VOUCHED.set(Vec::new());
    }
}

/// Administration in the extension's own schema (SPEC §18.3).
#[pg_schema]
mod pgticket {
    use super::*;

    /// Admin (SPEC §17.1): the word for a lost snowflake mark. Every
    /// snowflake and sharded ID this server makes from now on is after
    /// `after` (and after now), here and after a restart, and the mark
    /// covers the servers that made this database's IDs (a database whose
    /// IDs other servers made is vouched for in that database). For a
    /// server whose mark file was not carried over (`pg_upgrade`, a data
    /// directory or a dump restored into a new server): give a time past
    /// every ID any server of this machine id made — the old mark file's
    /// time, or the decoded `max(id)` of the tables; `now()` for a new
    /// machine id. Returns the mark written. It only raises.
    #[pg_extern(volatile, parallel_unsafe)]
    fn raise_snowflake_mark(after: Option<TimestampWithTimeZone>) -> TimestampWithTimeZone {
        crate::errors::postgres_errors_as_raised(|| {
            if !settings::preloaded() {
                TicketError::NotPreloaded("raise_snowflake_mark").raise();
            }
            crate::xact::check_writable().or_raise();
            let after = crate::api::required("after", after);
            space::check_database().or_raise();
            let epoch = settings::epoch_unix_ms();
            let after_ms = (super::super::unix_ms_of_timestamptz(after).max(super::super::now_unix_ms()) - epoch).max(0) as u64;
            let mark_ms = {
                let _vouching = Vouching::for_servers(space::recorded_systems());
                layout::raise_mark(&GENERATOR.get().0, &SystemClock, &wal::WalMarkStore, epoch, after_ms).or_raise()
            };
            CHECKED.set(None);
            let mark_unix_ms = epoch + mark_ms as i64;
            pgrx::log!("pg_ticket: raise_snowflake_mark() raised the snowflake mark to {mark_unix_ms} Unix ms for this database's servers");
            super::super::timestamptz_or_error(mark_unix_ms)
        })
    }
}

extension_sql!(
    r#"
COMMENT ON FUNCTION pgticket.raise_snowflake_mark(timestamptz) IS
    'Admin: vouch for a lost snowflake mark (pg_upgrade, a restore without pg_ticket_snowflake.mark): snowflakes and sharded IDs are made only after the time given, and this database''s IDs are covered';
REVOKE EXECUTE ON FUNCTION pgticket.raise_snowflake_mark(timestamptz) FROM PUBLIC;
"#,
    name = "raise_snowflake_mark_privileges",
    requires = [pgticket::raise_snowflake_mark]
);
