//! `assign_scoped_id()` and `assign_ticket()`: per-row scopes, which a
//! column `DEFAULT` cannot express (it cannot read other columns).
//!
//! ```sql
//! CREATE TRIGGER number_invoices BEFORE INSERT ON invoice FOR EACH ROW
//!     EXECUTE FUNCTION assign_scoped_id('no', 'shop', 'invoice');              -- domain 'invoice'
//! CREATE TRIGGER number_invoices BEFORE INSERT ON invoice FOR EACH ROW
//!     EXECUTE FUNCTION assign_scoped_id('no', 'shop', 'column', 'fiscal_year'); -- domain from a column
//! ```
//!
//! Sets the id column to `next_scoped_id(<queue column as text>, <domain>)`
//! (or `next_ticket(...)`) when it is NULL and leaves a given value alone.
//! It calls the allocator directly, so `assign_scoped_id` is transactional
//! and gap-free like `next_scoped_id`, and `assign_ticket` never waits on
//! another transaction like `next_ticket`. Columns are resolved by name on
//! every row: a misnamed or mistyped column fails at the first row, with
//! 42703 or 42804 — unless the trigger was made with `number_rows()`
//! (sql/schema.sql), which runs the same checks when it creates it.
//!
//! The scope taken from a column is its value's canonical text (SPEC
//! §13.9): a type whose output depends on session settings (dates, times,
//! floats, bytea, money, intervals, any type not known to be plain) is
//! printed under fixed settings (ISO dates, UTC, shortest exact floats,
//! hex bytea, C money), so two sessions never number one day's invoices
//! from two scopes. The value written respects the column's type modifier
//! and domain, as an INSERT of it would (22003 / 22001 / 23514 at that row).
//!
//! A text or varchar id column gets the value's canonical decimal string
//! (SPEC §15: `42`, never `+42`, `042` or `demo-queue/42`); the domain
//! `pgticket.resource_id` accepts only such strings.

use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::PgTupleDesc;
use std::ffi::{c_char, CStr, CString};

use crate::counters::{self, Kind};
use crate::errors::{postgres_errors_as_raised, OrRaise, TicketError};
use crate::names::{for_message, Name};
use ticket_core::counter::check_name;

/// Where the domain comes from.
enum Domain {
    Literal(CString),
    Column(CString),
}

struct Arguments {
    id_column: CString,
    queue_column: CString,
    domain: Domain,
}

const USAGE: &str = "(id_column, queue_column, domain) or (id_column, queue_column, 'column', domain_column)";

fn arguments(trigger: &pg_sys::Trigger, function: &str) -> Arguments {
    let args: Vec<CString> = (0..trigger.tgnargs as usize)
        .map(|i| unsafe { CStr::from_ptr(*trigger.tgargs.add(i)) }.to_owned())
        .collect();
    let bad = || TicketError::TriggerMisuse(format!("the trigger's arguments are {function}{USAGE}")).raise();
    match args.as_slice() {
        [id, queue, domain] => Arguments { id_column: id.clone(), queue_column: queue.clone(), domain: Domain::Literal(domain.clone()) },
        [id, queue, form, column] if form.as_bytes() == b"column" => {
            Arguments { id_column: id.clone(), queue_column: queue.clone(), domain: Domain::Column(column.clone()) }
        }
        _ => bad(),
    }
}

/// The attribute number of `column` in the table, or 42703.
fn attnum(tupdesc: pg_sys::TupleDesc, column: &CStr, table: &str) -> i32 {
    let n = unsafe { pg_sys::SPI_fnumber(tupdesc, column.as_ptr()) };
    if n <= 0 {
        TicketError::NoSuchColumn { column: for_message(column.to_bytes()), table: table.to_owned() }.raise();
    }
    n
}

/// Types whose text does not depend on any session setting.
const PLAIN_OUTPUT: [pg_sys::Oid; 11] = [
    pg_sys::TEXTOID,
    pg_sys::VARCHAROID,
    pg_sys::BPCHAROID,
    pg_sys::NAMEOID,
    pg_sys::INT2OID,
    pg_sys::INT4OID,
    pg_sys::INT8OID,
    pg_sys::NUMERICOID,
    pg_sys::BOOLOID,
    pg_sys::UUIDOID,
    pg_sys::OIDOID,
];

/// The settings a type's output may depend on, and the values that make
/// it canonical.
const CANONICAL_SETTINGS: [(&CStr, &CStr); 8] = [
    // reg* types print names relative to the path, quoted by this.
    (c"search_path", c"pg_catalog"),
    (c"quote_all_identifiers", c"off"),
    (c"DateStyle", c"ISO, YMD"),
    (c"TimeZone", c"UTC"),
    (c"IntervalStyle", c"postgres"),
    (c"extra_float_digits", c"1"),
    (c"bytea_output", c"hex"),
    (c"lc_monetary", c"C"),
];

/// The value of a column as its canonical text, in the database's encoding
/// (allocated in the trigger's memory context), or 22004 if NULL.
fn column_text<'a>(values: &[pg_sys::Datum], nulls: &[bool], tupdesc: pg_sys::TupleDesc, n: i32, what: &'static str) -> Name<'a> {
    let i = n as usize - 1;
    if nulls[i] {
        TicketError::NullArgument(what).raise();
    }
    let typid = unsafe { pg_sys::SPI_gettypeid(tupdesc, n) };
    let (mut output, mut varlena) = (pg_sys::Oid::INVALID, false);
    unsafe { pg_sys::getTypeOutputInfo(typid, &mut output, &mut varlena) };
    let plain = PLAIN_OUTPUT.contains(&unsafe { pg_sys::getBaseType(typid) });
    let text: *mut c_char = if plain {
        unsafe { pg_sys::OidOutputFunctionCall(output, values[i]) }
    } else {
        // Set for this call only, and put back as they were (an error
        // meanwhile aborts, which puts them back too).
        unsafe {
            let nest = pg_sys::NewGUCNestLevel();
            for (name, value) in CANONICAL_SETTINGS {
                pg_sys::set_config_option(
                    name.as_ptr(),
                    value.as_ptr(),
                    pg_sys::GucContext::PGC_USERSET,
                    pg_sys::GucSource::PGC_S_SESSION,
                    pg_sys::GucAction::GUC_ACTION_SAVE,
                    true,
                    0,
                    false,
                );
            }
            let text = pg_sys::OidOutputFunctionCall(output, values[i]);
            pg_sys::AtEOXact_GUC(false, nest);
            text
        }
    };
    Name(unsafe { CStr::from_ptr(text) }.to_bytes())
}

extern "C-unwind" {
    /// `numeric(numeric, integer)`, the cast that applies a typmod (the
    /// bindings wrap it for calls from Rust, not as a function pointer).
    #[link_name = "numeric"]
    fn numeric_with_typmod(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum;
    /// `int8(numeric)`.
    #[link_name = "numeric_int8"]
    fn numeric_to_int8(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum;
    /// `varchar(varchar, integer, boolean)`, the cast that applies a
    /// length limit (22001 past it, as an INSERT would).
    #[link_name = "varchar"]
    fn varchar_with_typmod(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum;
}

/// `value` (of the id column's base type) made a value of the column: its
/// base type's modifier applied (numeric(p, s): 22003 if it does not fit),
/// then its domain's constraints checked (23514), as an INSERT would.
fn coerce_to_column(allocated: i64, value: pg_sys::Datum, tupdesc: pg_sys::TupleDesc, n: i32, column: &CStr, table: &str) -> pg_sys::Datum {
    unsafe {
        // PgTupleDesc reads the attribute the way each version lays it out.
        let attribute = PgTupleDesc::from_pg_unchecked(tupdesc);
        let attr = attribute.get(n as usize - 1).expect("the id column's attribute");
        let column_type = attr.atttypid;
        let mut typmod = attr.atttypmod;
        let base = pg_sys::getBaseTypeAndTypmod(column_type, &mut typmod);
        let mut value = value;
        if base == pg_sys::NUMERICOID && typmod >= 0 {
            // numeric(numeric, integer): the cast that applies a typmod.
            value = pg_sys::DirectFunctionCall2Coll(
                Some(numeric_with_typmod),
                pg_sys::InvalidOid,
                value,
                pg_sys::Datum::from(typmod),
            );
        }
        if base == pg_sys::VARCHAROID && typmod >= 0 {
            value = pg_sys::DirectFunctionCall3Coll(
                Some(varchar_with_typmod),
                pg_sys::InvalidOid,
                value,
                pg_sys::Datum::from(typmod),
                pg_sys::Datum::from(false),
            );
        }
        if base == pg_sys::NUMERICOID && typmod >= 0 {
            // A negative scale rounds (numeric(3,-1): 11 is 10): two values
            // would become one ID. Written only if it is the value taken.
            let written = pg_sys::DirectFunctionCall1Coll(Some(numeric_to_int8), pg_sys::InvalidOid, value);
            if written.value() as i64 != allocated {
                TicketError::ValueDoesNotFit {
                    value: allocated,
                    column: for_message(column.to_bytes()),
                    table: table.to_owned(),
                    type_name: "numeric of this scale (it would be rounded)",
                }
                .raise();
            }
        }
        if base != column_type {
            let mut extra: *mut std::ffi::c_void = std::ptr::null_mut();
            pg_sys::domain_check(value, false, column_type, &mut extra, pg_sys::CurrentMemoryContext);
        }
        value
    }
}

/// The id column's type, among those a counter can fill.
#[derive(Clone, Copy)]
enum IdType {
    BigInt,
    Integer,
    SmallInt,
    Numeric,
    /// text or varchar: the canonical decimal string.
    Text,
}

impl IdType {
    /// The type of the id column (a domain counts as its base type), or 42804.
    fn of(tupdesc: pg_sys::TupleDesc, n: i32, column: &CStr, table: &str) -> IdType {
        match unsafe { pg_sys::getBaseType(pg_sys::SPI_gettypeid(tupdesc, n)) } {
            pg_sys::INT8OID => IdType::BigInt,
            pg_sys::INT4OID => IdType::Integer,
            pg_sys::INT2OID => IdType::SmallInt,
            pg_sys::NUMERICOID => IdType::Numeric,
            pg_sys::TEXTOID | pg_sys::VARCHAROID => IdType::Text,
            other => TicketError::WrongColumnType {
                column: for_message(column.to_bytes()),
                table: table.to_owned(),
                type_name: for_message(unsafe { CStr::from_ptr(pg_sys::format_type_be(other)) }.to_bytes()),
            }
            .raise(),
        }
    }

    /// `value` as a datum of this type, or 22003 if it does not fit.
    fn datum(self, value: i64, column: &CStr, table: &str) -> pg_sys::Datum {
        let too_big = |type_name: &'static str| -> ! {
            TicketError::ValueDoesNotFit { value, column: for_message(column.to_bytes()), table: table.to_owned(), type_name }
                .raise()
        };
        match self {
            IdType::BigInt => pg_sys::Datum::from(value),
            IdType::Integer => pg_sys::Datum::from(i32::try_from(value).unwrap_or_else(|_| too_big("integer"))),
            IdType::SmallInt => pg_sys::Datum::from(i16::try_from(value).unwrap_or_else(|_| too_big("smallint"))),
            IdType::Numeric => pg_sys::Datum::from(unsafe { pg_sys::int64_to_numeric(value) }),
            IdType::Text => {
                let decimal = value.to_string();
                pg_sys::Datum::from(unsafe { pg_sys::cstring_to_text_with_len(decimal.as_ptr().cast(), decimal.len() as i32) })
            }
        }
    }
}

#[pg_trigger]
fn assign_scoped_id<'a>(trigger: &'a PgTrigger<'a>) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, PgTriggerError> {
    assign(trigger, "assign_scoped_id", |queue, domain| counters::take(Kind::Scope, queue, domain, 1).or_raise())
}

#[pg_trigger]
fn assign_ticket<'a>(trigger: &'a PgTrigger<'a>) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, PgTriggerError> {
    assign(trigger, "assign_ticket", crate::tickets::next)
}

/// The row with its id column set by `allocate(queue, domain)` if NULL.
fn assign<'a>(
    trigger: &'a PgTrigger<'a>,
    function: &'static str,
    allocate: impl FnOnce(Name<'_>, Name<'_>) -> i64,
) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, PgTriggerError> {
    postgres_errors_as_raised(|| {
        let data = trigger.trigger_data();
        let event = data.tg_event;
        let row_before = event & pg_sys::TRIGGER_EVENT_ROW != 0 && event & pg_sys::TRIGGER_EVENT_TIMINGMASK == pg_sys::TRIGGER_EVENT_BEFORE;
        let op = event & pg_sys::TRIGGER_EVENT_OPMASK;
        if !row_before || !(op == pg_sys::TRIGGER_EVENT_INSERT || op == pg_sys::TRIGGER_EVENT_UPDATE) {
            TicketError::TriggerMisuse(format!("{function}() must run BEFORE INSERT (or UPDATE) ... FOR EACH ROW")).raise();
        }
        let args = arguments(trigger.trigger(), function);
        // In the database's encoding, which need not be UTF-8: for messages.
        let table = for_message(unsafe { CStr::from_ptr((*(*data.tg_relation).rd_rel).relname.data.as_ptr()) }.to_bytes());
        let tuple = if op == pg_sys::TRIGGER_EVENT_INSERT { data.tg_trigtuple } else { data.tg_newtuple };
        let tupdesc = unsafe { (*data.tg_relation).rd_att };

        let id_n = attnum(tupdesc, &args.id_column, &table);
        let queue_n = attnum(tupdesc, &args.queue_column, &table);
        let domain_n = match &args.domain {
            Domain::Column(column) => Some(attnum(tupdesc, column, &table)),
            Domain::Literal(_) => None,
        };
        let id_type = IdType::of(tupdesc, id_n, &args.id_column, &table);

        let natts = unsafe { (*tupdesc).natts } as usize;
        let mut values = vec![pg_sys::Datum::from(0); natts];
        let mut nulls = vec![false; natts];
        unsafe { pg_sys::heap_deform_tuple(tuple, tupdesc, values.as_mut_ptr(), nulls.as_mut_ptr()) };
        if !nulls[id_n as usize - 1] {
            // A given value is the caller's.
            return Ok(Some(unsafe { PgHeapTuple::from_heap_tuple(PgTupleDesc::from_pg_unchecked(tupdesc), tuple) }));
        }
        let queue = column_text(&values, &nulls, tupdesc, queue_n, "the queue column");
        let domain = match (&args.domain, domain_n) {
            (_, Some(n)) => column_text(&values, &nulls, tupdesc, n, "the domain column"),
            (Domain::Literal(text), None) => Name(text.as_bytes()),
            (Domain::Column(_), None) => unreachable!("a domain column has an attribute number"),
        };
        check_name("queue", queue.bytes()).or_raise();
        check_name("domain", domain.bytes()).or_raise();
        let allocated = allocate(queue, domain);
        let id = coerce_to_column(allocated, id_type.datum(allocated, &args.id_column, &table), tupdesc, id_n, &args.id_column, &table);

        let (column, is_null) = (id_n, false);
        let modified = unsafe { pg_sys::heap_modify_tuple_by_cols(tuple, tupdesc, 1, &column as *const i32 as *mut i32, &id as *const _ as *mut _, &is_null as *const bool as *mut bool) };
        Ok(Some(unsafe { PgHeapTuple::from_heap_tuple(PgTupleDesc::from_pg_unchecked(tupdesc), modified) }))
    })
}
