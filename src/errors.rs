//! Every error pg_ticket raises, with the SQLSTATE SPEC §4 gives it.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};
use pgrx::pg_sys::panic::CaughtError;
use crate::refusals::Refusal;
use ticket_core::counter::CounterError;
use ticket_core::leases::LeaseError;
use ticket_core::local_marks::LimitReached;
use ticket_core::sharded::ShardError;
use ticket_core::snowflake::SnowflakeError;
use ticket_core::tickets::TicketsError;

/// Why a server may not know how far it stamped (SPEC §17.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkLost {
    /// `pg_upgrade` started the data directory without its mark.
    Upgraded,
    /// No mark where the database records snowflakes made for it.
    Missing,
    /// A start from a base backup or a point-in-time recovery.
    Restored,
}

#[derive(Debug, thiserror::Error)]
pub enum TicketError {
    #[error("{0} must not be NULL")]
    NullArgument(&'static str),
    #[error(transparent)]
    Counter(#[from] CounterError),
    #[error(transparent)]
    Snowflake(#[from] SnowflakeError),
    #[error("cannot allocate IDs {}", if *.standby { "on a hot standby" } else { "in a read-only transaction" })]
    ReadOnly { standby: bool },
    #[error("{0}")]
    BadConfiguration(String),
    /// An error about one scope or block, naming it.
    #[error("{scope}: {error}")]
    InScope { scope: String, error: Box<TicketError> },
    #[error("role {role} has created {created} scopes and block names, the most pg_ticket.max_scopes_per_role ({cap}) allows")]
    TooManyScopes { role: String, created: i64, cap: i64 },
    #[error("{0}() needs pg_ticket in shared_preload_libraries")]
    NotPreloaded(&'static str),
    #[error("cannot allocate IDs after this transaction's marks were written at commit")]
    AllocationAfterFlush,
    #[error(transparent)]
    TooManyEntries(#[from] LimitReached),
    #[error("{0}")]
    TriggerMisuse(String),
    /// SPEC §18.4: a value given for a column a trigger numbers.
    #[error("a value was given for column {column:?} of table {table:?}, which {function}() numbers: it could be one the series hands out later")]
    ExplicitNumber { column: String, table: String, function: &'static str },
    /// SPEC §18.4: an UPDATE that moves a numbered row to another scope
    /// with its number.
    #[error("an UPDATE moves a row of table {table:?} to another scope with its number in column {column:?}, which {function}() numbers: that number could be one the new scope hands out later")]
    MovedNumber { column: String, table: String, function: &'static str },
    #[error("snowflake IDs have no infinite time")]
    InfiniteTime,
    #[error(transparent)]
    Tickets(#[from] TicketsError),
    #[error("{0}")]
    TicketsUnavailable(String),
    #[error("column {column:?} of table {table:?} does not exist (named in the trigger's arguments)")]
    NoSuchColumn { column: String, table: String },
    #[error("column {column:?} of table {table:?} is of type {type_name}; the trigger sets bigint, integer, smallint, numeric, text or varchar columns")]
    WrongColumnType { column: String, table: String, type_name: String },
    #[error(transparent)]
    Lease(#[from] ticket_core::leases::LeaseError),
    #[error("snowflake_id() has no valid machine id: {0}")]
    NoMachineLease(String),
    /// SPEC §19.3: a gap-free scope or block name used or created against
    /// the group's rule (its home is another node; it is new and this node
    /// may not create it now), with a hint naming what to do.
    #[error("{what}")]
    NotInGroupRule { what: String, hint: String },
    /// SPEC §20.2: the lease ledger does not parse.
    #[error("the lease ledger pg_ticket_leases.ledger is damaged: {why}")]
    DamagedLedger { why: String },
    /// A grant or renewal whose line in this server's lease ledger the
    /// synchronous standbys did not confirm (#46 item 6).
    #[error("the synchronous standbys did not confirm the lease ledger's line {line:?} (the wait was cancelled or the session is ending): nothing is granted or renewed")]
    LedgerNotConfirmed { line: String },
    #[error("{value} does not fit the {type_name} column {column:?} of table {table:?}")]
    ValueDoesNotFit { value: i64, column: String, table: String, type_name: &'static str },
    #[error("{0}")]
    InvalidArgument(String),
    #[error(transparent)]
    Sharded(ticket_core::sharded::ShardError),
    #[error("permission denied for {scope}: no grant covers it for role {role}")]
    NoScopeRight { scope: String, role: String },
    /// SPEC §20 (#46 item 2): a number given to a trigger made with
    /// `on_explicit => 'advance'` moves the series, as the admin function
    /// does, and takes what it takes.
    #[error("permission denied to move {scope} forward: a number given to {function}() with on_explicit => 'advance' moves the series as {admin}() does, and role {role} may not execute {admin}()")]
    NoAdvanceRight { scope: String, role: String, function: &'static str, admin: &'static str },
    #[error("{}", match .cause {
        MarkLost::Upgraded => "this data directory was made by pg_upgrade, and the snowflake mark (pg_ticket_snowflake.mark) was not carried over: this server cannot know how far its old self stamped, so it makes no snowflake or sharded ID, in any database, until the mark is carried over or vouched for",
        MarkLost::Missing => "this server has no snowflake mark (pg_ticket_snowflake.mark), but this database records that IDs were made in its snowflake ID space (pgticket.id_space: by a server's snowflake_id(), or by the holders of this registry's leases): if this server made snowflakes before, its mark was not carried over (a restored data directory, a file removed), and IDs below the lost one could be made again",
        MarkLost::Restored => "this server started from a base backup or a point-in-time recovery: its snowflake mark may be older than what the server it stands in for stamped since (a clock that ran ahead), so it makes no snowflake or sharded ID, in any database, until that is vouched for",
    })]
    MarkNotCarried { cause: MarkLost },
    #[error("waited {} for another backend's write of the snowflake mark, which has been waiting {} for the synchronous standbys (synchronous_standby_names) to confirm its WAL record", ticket_core::epoch::format_duration_ms(*.waited_ms as i64), ticket_core::epoch::format_duration_ms(*.standby_wait_ms))]
    MarkWaitsForStandby { waited_ms: u64, standby_wait_ms: i64 },
    /// A state table that cannot be used as it is (unlogged, moved).
    #[error("{0}")]
    StateTableUnfit(String),
    /// A public ID that does not read (#50): mistyped, or another key's.
    #[error("invalid public ID {form:?}: {error}")]
    PublicId { form: String, error: ticket_core::public_id::PublicIdError },
    #[error("public key {name:?} does not exist{}", if *.retired { " (every version of it is retired)" } else { "" })]
    NoPublicKey { name: String, retired: bool },
    #[error("permission denied for public key {name:?}: no grant covers it for role {role}")]
    NoKeyRight { name: String, role: String },
}

/// A shard's clock or mark trouble is the snowflake generator's.
impl From<ShardError> for TicketError {
    fn from(e: ShardError) -> Self {
        match e {
            ShardError::Snowflake(e) => TicketError::Snowflake(e),
            other => TicketError::Sharded(other),
        }
    }
}

impl TicketError {
    pub fn sqlstate(&self) -> PgSqlErrorCode {
        use PgSqlErrorCode::*;
        match self {
            TicketError::NullArgument(_) => ERRCODE_NULL_VALUE_NOT_ALLOWED,
            TicketError::Counter(CounterError::Overflow { .. }) => ERRCODE_SEQUENCE_GENERATOR_LIMIT_EXCEEDED,
            TicketError::Counter(CounterError::AtOrBelowMark { .. }) => ERRCODE_UNIQUE_VIOLATION,
            TicketError::Counter(_) | TicketError::InfiniteTime | TicketError::InvalidArgument(_) => ERRCODE_INVALID_PARAMETER_VALUE,
            TicketError::NoScopeRight { .. } | TicketError::NoAdvanceRight { .. } => ERRCODE_INSUFFICIENT_PRIVILEGE,
            TicketError::Sharded(
                ShardError::OutOfRange(_) | ShardError::NegativeId(_) | ShardError::BadList(_),
            ) => ERRCODE_INVALID_PARAMETER_VALUE,
            TicketError::Sharded(ShardError::Book(_)) => ERRCODE_IO_ERROR,
            TicketError::Sharded(_) => ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            TicketError::Snowflake(
                SnowflakeError::NegativeId(_)
                | SnowflakeError::MachineOutOfRange { .. }
                | SnowflakeError::MachineBitsOutOfRange(_)
                | SnowflakeError::TimeOutOfRange { .. },
            ) => {
                ERRCODE_INVALID_PARAMETER_VALUE
            }
            TicketError::Snowflake(
                SnowflakeError::MarkStore(_) | SnowflakeError::DamagedMark { .. } | SnowflakeError::MarkBusy { .. },
            ) => ERRCODE_IO_ERROR,
            TicketError::TooManyEntries(LimitReached::Entries { .. }) => ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            TicketError::TooManyEntries(LimitReached::Memory { .. }) => ERRCODE_OUT_OF_MEMORY,
            TicketError::Tickets(TicketsError::Overflow { .. }) => ERRCODE_SEQUENCE_GENERATOR_LIMIT_EXCEEDED,
            TicketError::Tickets(TicketsError::BadSeries { .. }) => ERRCODE_INVALID_PARAMETER_VALUE,
            TicketError::Tickets(TicketsError::OtherSeries { .. })
            | TicketError::TicketsUnavailable(_)
            | TicketError::StateTableUnfit(_) => ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            TicketError::TriggerMisuse(_) => ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED,
            TicketError::ExplicitNumber { .. } | TicketError::MovedNumber { .. } => ERRCODE_GENERATED_ALWAYS,
            TicketError::NoSuchColumn { .. } => ERRCODE_UNDEFINED_COLUMN,
            TicketError::WrongColumnType { .. } => ERRCODE_DATATYPE_MISMATCH,
            TicketError::ValueDoesNotFit { .. } => ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
            TicketError::Lease(
                LeaseError::BadTtl { .. }
                | LeaseError::TtlOverMax { .. }
                | LeaseError::BadIdList { .. }
                | LeaseError::BadSecret
                | LeaseError::LastIssuedTooLate { .. },
            ) => {
                ERRCODE_INVALID_PARAMETER_VALUE
            }
            TicketError::Lease(LeaseError::NoneFree { .. }) => ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
            TicketError::Lease(_) | TicketError::NoMachineLease(_) => ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            TicketError::Snowflake(_) | TicketError::NotPreloaded(_) | TicketError::AllocationAfterFlush
            | TicketError::MarkNotCarried { .. }
            | TicketError::MarkWaitsForStandby { .. }
            | TicketError::LedgerNotConfirmed { .. }
            | TicketError::DamagedLedger { .. }
            | TicketError::NotInGroupRule { .. } => {
                ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE
            }
            TicketError::ReadOnly { .. } => ERRCODE_READ_ONLY_SQL_TRANSACTION,
            TicketError::BadConfiguration(_) => ERRCODE_CONFIG_FILE_ERROR,
            TicketError::InScope { error, .. } => return error.sqlstate(),
            TicketError::TooManyScopes { .. } => ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
            TicketError::PublicId { .. } => ERRCODE_INVALID_TEXT_REPRESENTATION,
            TicketError::NoPublicKey { .. } => ERRCODE_UNDEFINED_OBJECT,
            TicketError::NoKeyRight { .. } => ERRCODE_INSUFFICIENT_PRIVILEGE,
        }
    }

    fn hint(&self) -> Option<&'static str> {
        match self {
            TicketError::NotPreloaded(_) => Some(
                "Add pg_ticket to shared_preload_libraries in postgresql.conf (to the list, keeping the libraries already there: e.g. 'pg_stat_statements, pg_ticket'; SHOW shared_preload_libraries shows them) and restart the server.",
            ),
            TicketError::ReadOnly { standby: true } => Some("This server is a hot standby; allocate on the primary."),
            TicketError::ReadOnly { standby: false } => Some(
                "Allocate in a read-write transaction (not under SET TRANSACTION READ ONLY or default_transaction_read_only = on).",
            ),
            TicketError::Counter(CounterError::Overflow { .. }) => Some(
                "The series reached its limit (2^63-1, or one set with pgticket.set_scoped_id_limit / pgticket.set_block_limit): an administrator raises the limit, or retires the name and starts another.",
            ),
            TicketError::Counter(CounterError::SizeOverCeiling { .. }) => Some(
                "Reserve a smaller block (several calls), or a superuser raises pg_ticket.max_block_size.",
            ),
            TicketError::Snowflake(SnowflakeError::ClockBehind { .. }) => {
                Some("Fix the system clock (NTP); pg_ticket never reuses a timestamp it has issued. With a leased machine id (pg_ticket.machine_id = -1) the floor may be the lease's not_before_ms (the server log's \"stamping above\"): the id's earlier holders' reported stamps and their leases' end plus pg_ticket.lease_margin.")
            }
            TicketError::Snowflake(SnowflakeError::DamagedMark { .. }) => Some(
                "Stop the server, and replace the file with one line: a Unix time in milliseconds past every snowflake this server issued, then its space as pgticket.snowflake_id_space() reports it, e.g. '1767225700000 epoch_ms=1767225600000 machine_bits=10' (a number alone is read as 0.2.0's 10 machine bits).",
            ),
            TicketError::MarkWaitsForStandby { .. } => Some(
                "A synchronous standby is gone or slow: bring it back, or remove it from synchronous_standby_names and reload. No ID is stamped under a mark the standbys have not confirmed.",
            ),
            TicketError::DamagedLedger { .. } => Some(
                "Each line of pg_ticket_leases.ledger (in the data directory) is a fact of its own: 'lease <machine id> <Unix ms>' or 'registry <ttl ms> <margin ms> <ids>'. Remove the lines that do not parse, or replace them with what they said (a lease's end plus the margin), as the server's owner; until then this server neither stamps its fixed machine id nor grants leases (docs/leases.md, the lease ledger).",
            ),
            TicketError::LedgerNotConfirmed { .. } => Some(
                "A synchronous standby is gone or slow: bring it back, or remove it from synchronous_standby_names and reload. A lease is granted or renewed only once its line in the lease ledger is on the standbys, so that a promoted standby knows it (docs/leases.md, the lease ledger).",
            ),
            TicketError::MarkNotCarried { cause: MarkLost::Restored } => Some(
                "SELECT pgticket.raise_snowflake_mark(<a time past every snowflake and sharded ID the server this copy stands in for made, in any database: the latest decoded max(id) of your tables, plus any error of its clock>); now() if that server's clock never ran ahead. Then pgticket.accept_shard() each shard it owns (docs/operations.md, backup and restore). Other allocators work meanwhile.",
            ),
            TicketError::MarkNotCarried { .. } => Some(
                "Stop the server, copy pg_ticket_snowflake.mark and pg_ticket_shards.book from the old data directory into this one, and start it (docs/operations.md, pg_upgrade). If the file is lost: SELECT pgticket.raise_snowflake_mark(<a time past every snowflake and sharded ID the old server made, in any database>); if it never made any, raise_snowflake_mark(now()). Other allocators work meanwhile.",
            ),
            TicketError::TooManyEntries(LimitReached::Entries { .. }) => {
                Some("Split the transaction; a superuser may raise pg_ticket.max_transaction_entries.")
            }
            TicketError::TooManyEntries(LimitReached::Memory { .. }) => Some("Split the transaction."),
            TicketError::ValueDoesNotFit { .. } => Some("pgticket.set_scoped_id_limit() keeps a series within a column's range."),
            TicketError::MovedNumber { .. } => Some(
                "Set the number column to NULL in the same UPDATE: the row then takes the next number of its new scope. To keep given numbers, make the trigger with number_rows(..., on_explicit => 'advance').",
            ),
            TicketError::NoAdvanceRight { .. } => Some(
                "An administrator grants the role the advance (GRANT EXECUTE ON FUNCTION pgticket.advance_scoped_id(text, text, bigint), or pgticket.advance_ticket(text, text, bigint) for tickets, TO role), or leaves the column out so the trigger numbers the row (docs/reference.md, number_rows).",
            ),
            TicketError::ExplicitNumber { .. } => Some(
                "Leave the column out (or NULL) and the trigger numbers the row. To give numbers yourself (an import), make the trigger with number_rows(..., on_explicit => 'advance'): a given number moves the series above it, and one at or below its mark is refused.",
            ),
            TicketError::TooManyScopes { .. } => Some(
                "Every scope and block name is a permanent row (its mark outlives any use), counted for the role that made it in this database. A superuser may raise pg_ticket.max_scopes_per_role (for a role: ALTER ROLE ... SET); existing scopes go on.",
            ),
            TicketError::NoMachineLease(_) => Some(
                "This server leases its machine id from pg_ticket.registry; pgticket.status shows the lease and the server log the registry's errors. Other allocators work meanwhile.",
            ),
            TicketError::Lease(LeaseError::NoneFree { .. }) => Some(
                "Release ids no longer used (pgticket.release_machine_id, or pgticket.revoke_machine_id as an administrator; pgticket.machine_ids lists them), let dead holders' leases expire, or widen pg_ticket.lease_ids and reload.",
            ),
            TicketError::Lease(LeaseError::HoldOff { .. }) => Some(
                "Wait (ticket-client retries by itself), or, if no earlier life of this registry can have a lease still live (a new registry, or every holder known to be gone), end the wait now as an administrator: SELECT pgticket.end_lease_hold_off(); (docs/leases.md, \"How the registry decides\").",
            ),
            TicketError::Lease(LeaseError::TtlOverMax { .. }) => Some(
                "Ask for a shorter ttl (SHOW pg_ticket.lease_max_ttl), or raise pg_ticket.lease_max_ttl in postgresql.conf and reload (the registry then holds off that long after each start).",
            ),
            TicketError::Lease(
                LeaseError::NotHeld { .. }
                | LeaseError::NoSecret { .. }
                | LeaseError::Expired { .. }
                | LeaseError::Released { .. }
                | LeaseError::Revoked { .. }
                | LeaseError::OwnId { .. },
            ) => Some(
                "Stop issuing with this lease and take a new one: SELECT * FROM pgticket.lease_machine_id(holder, ttl) (ticket-client does both by itself).",
            ),
            TicketError::Lease(LeaseError::BadSecret | LeaseError::NeverLeased { .. }) => Some(
                "Renew and release with the machine_id, lease and secret pgticket.lease_machine_id returned for this lease; a holder that lost them takes a new lease (the old one runs out).",
            ),
            TicketError::Lease(LeaseError::BadTtl { .. }) => {
                Some("Give the ttl as an interval from '1 second' to '1 day', at most pg_ticket.lease_max_ttl (SHOW pg_ticket.lease_max_ttl).")
            }
            TicketError::Lease(LeaseError::LastIssuedTooLate { .. }) => Some(
                "Report the timestamp (Unix ms) of the last ID stamped under this lease: a holder stamps only until the lease's end plus half of pg_ticket.lease_margin. A larger one is a clock that ran ahead: fix the clock.",
            ),
            TicketError::Lease(LeaseError::OwnIdLeasedOut { .. }) => Some(
                "Wait until the time named, or set pg_ticket.machine_id to an id outside pg_ticket.lease_ids and restart the server; pgticket.machine_ids shows the lease.",
            ),
            TicketError::Lease(LeaseError::OwnIdInLedger { .. } | LeaseError::OwnIdLeasable { .. }) => Some(
                "Give every server that stamps a fixed pg_ticket.machine_id, primaries and standbys alike, an id outside the pg_ticket.lease_ids of every registry of its timeline, and restart it; the lease ledger pg_ticket_leases.ledger in the data directory shows what was recorded.",
            ),
            TicketError::Sharded(ShardError::Book(_)) => Some(
                "The shard book pg_ticket_shards.book in the data directory says which shards this server accepted and released. A damaged one: stop the server and restore the file from a backup or the server's WAL (a standby's copy), or remove it and pgticket.accept_shard() each shard again above its last ID.",
            ),
            TicketError::Sharded(ShardError::NotListed(_)) => Some(
                "Add it to pg_ticket.shards and reload, then pgticket.accept_shard() it; a shard another server owned is taken over with pgticket.release_shard() there and pgticket.accept_shard() here.",
            ),
            TicketError::NoScopeRight { .. } => Some(
                "pg_ticket.scope_rights is on: an administrator grants a scope with pgticket.grant_scope(role, queue, domain) and a block name with pgticket.grant_block(role, name); pgticket.scope_grants lists the grants.",
            ),
            TicketError::InScope { error, .. } => error.hint(),
            TicketError::NoKeyRight { .. } => Some(
                "An administrator grants the key with pgticket.grant_public_key(role, name) (a key is a secret: no role may use one it was not granted, whatever pg_ticket.scope_rights says).",
            ),
            TicketError::NoPublicKey { .. } => Some("An administrator makes it with SELECT pgticket.create_public_key(name) (docs/public-ids.md)."),
            _ => None,
        }
    }

    /// The `pgticket.status` counter this refusal adds to, if any.
    fn counted_as(&self) -> Option<Refusal> {
        match self {
            TicketError::InScope { error, .. } => error.counted_as(),
            TicketError::Snowflake(SnowflakeError::ClockBehind { .. }) => Some(Refusal::ClockBehind),
            TicketError::Counter(CounterError::Overflow { .. }) | TicketError::Tickets(TicketsError::Overflow { .. }) => {
                Some(Refusal::Overflow)
            }
            TicketError::ReadOnly { .. } => Some(Refusal::ReadOnly),
            _ => None,
        }
    }

    /// This error, said of `label` (see `names::label`).
    pub fn about(self, label: String) -> TicketError {
        match self {
            already @ TicketError::InScope { .. } => already,
            error => TicketError::InScope { scope: label, error: Box::new(error) },
        }
    }

    /// Raise as a PostgreSQL ERROR; never returns.
    pub fn raise(self) -> ! {
        if let Some(refusal) = self.counted_as() {
            crate::refusals::count_refusal(refusal);
        }
        let mut report = ErrorReport::new(self.sqlstate(), self.to_string(), "pg_ticket");
        if let Some(hint) = self.hint() {
            report = report.set_hint(hint);
        }
        if let TicketError::NotInGroupRule { hint, .. } = &self {
            report = report.set_hint(hint.clone());
        }
        report.report(PgLogLevel::ERROR);
        unreachable!("ERROR does not return")
    }
}

/// Unwrap or raise the error with its SQLSTATE.
pub trait OrRaise<T> {
    fn or_raise(self) -> T;
}

impl<T, E: Into<TicketError>> OrRaise<T> for Result<T, E> {
    #[inline]
    fn or_raise(self) -> T {
        match self {
            Ok(v) => v,
            Err(e) => e.into().raise(),
        }
    }
}

/// Runs `f`, re-raising an ERROR that PostgreSQL raised inside it (a failed
/// SPI statement: lock timeout, serialization failure, cancel) as itself:
/// its SQLSTATE, message, detail and hint. Without this, pgrx re-raises it
/// with a Rust backtrace appended to the DETAIL whenever the server runs
/// with RUST_BACKTRACE set. Rust errors and panics pass through unchanged.
/// Free when nothing is raised (no allocation, unlike PgTryBuilder), so it
/// wraps the hot paths too.
#[inline]
pub fn postgres_errors_as_raised<R>(f: impl FnOnce() -> R) -> R {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => match payload.downcast::<CaughtError>() {
            Ok(caught) => match *caught {
                CaughtError::PostgresError(report) => {
                    let mut plain = ErrorReport::new(report.sql_error_code(), report.message().to_owned(), "pg_ticket");
                    if let Some(detail) = report.detail() {
                        plain = plain.set_detail(detail);
                    }
                    if let Some(hint) = report.hint() {
                        plain = plain.set_hint(hint);
                    }
                    plain.report(report.level());
                    unreachable!("an ERROR does not return")
                }
                other => other.rethrow(),
            },
            Err(payload) => std::panic::resume_unwind(payload),
        },
    }
}
