//! Every error pg_ticket raises, with the SQLSTATE SPEC §4 gives it.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};
use ticket_core::counter::CounterError;
use ticket_core::snowflake::SnowflakeError;

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
    #[error("snowflake_id() needs pg_ticket in shared_preload_libraries")]
    NotPreloaded,
    #[error("cannot move {what} back from {current} to {requested}: marks only move forward")]
    MarkBackwards { what: &'static str, current: i64, requested: i64 },
    #[error("cannot allocate IDs after this transaction's marks were written at commit")]
    AllocationAfterFlush,
}

impl TicketError {
    pub fn sqlstate(&self) -> PgSqlErrorCode {
        use PgSqlErrorCode::*;
        match self {
            TicketError::NullArgument(_) => ERRCODE_NULL_VALUE_NOT_ALLOWED,
            TicketError::Counter(CounterError::Overflow { .. }) => ERRCODE_SEQUENCE_GENERATOR_LIMIT_EXCEEDED,
            TicketError::Counter(_) | TicketError::MarkBackwards { .. } => ERRCODE_INVALID_PARAMETER_VALUE,
            TicketError::Snowflake(SnowflakeError::NegativeId(_) | SnowflakeError::MachineOutOfRange(_)) => {
                ERRCODE_INVALID_PARAMETER_VALUE
            }
            TicketError::Snowflake(SnowflakeError::MarkStore(_)) => ERRCODE_IO_ERROR,
            TicketError::Snowflake(_) | TicketError::NotPreloaded | TicketError::AllocationAfterFlush => {
                ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE
            }
            TicketError::ReadOnly { .. } => ERRCODE_READ_ONLY_SQL_TRANSACTION,
        }
    }

    fn hint(&self) -> Option<&'static str> {
        match self {
            TicketError::NotPreloaded => Some(
                "Add this line to postgresql.conf and restart the server: shared_preload_libraries = 'pg_ticket'",
            ),
            TicketError::ReadOnly { standby: true } => Some("This server is a hot standby; allocate on the primary."),
            TicketError::Snowflake(SnowflakeError::ClockBehind { .. }) => {
                Some("Fix the system clock (NTP); pg_ticket never reuses a timestamp it has issued.")
            }
            _ => None,
        }
    }

    /// Raise as a PostgreSQL ERROR; never returns.
    pub fn raise(self) -> ! {
        let mut report = ErrorReport::new(self.sqlstate(), self.to_string(), "pg_ticket");
        if let Some(hint) = self.hint() {
            report = report.set_hint(hint);
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
