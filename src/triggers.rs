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

/// What the trigger does with a value given for the id column (SPEC
/// §18.4): like `GENERATED ALWAYS` (refuse) or `BY DEFAULT`, made safe
/// (advance: the series goes on above it; a value at or below its mark is
/// refused, as it may have been handed out). 0.3.0 left it alone, and the
/// series later handed the same number out again.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum OnExplicit {
    Refuse,
    Advance,
}

impl OnExplicit {
    pub fn parse(text: &str) -> Option<OnExplicit> {
        match text {
            "refuse" => Some(OnExplicit::Refuse),
            "advance" => Some(OnExplicit::Advance),
            _ => None,
        }
    }

    fn argument(self) -> &'static str {
        match self {
            OnExplicit::Refuse => "on_explicit=refuse",
            OnExplicit::Advance => "on_explicit=advance",
        }
    }
}

struct Arguments {
    id_column: CString,
    queue_column: CString,
    domain: Domain,
    on_explicit: OnExplicit,
    /// A trigger of 0.4.0's form (its last argument `on_explicit=...`):
    /// the scope taken from a column is one per value the column's type
    /// compares equal (17, 17.0 and 17.00 one series). A trigger made
    /// before keeps 0.3.0's text, so its series go on where they are.
    equality: bool,
}

const USAGE: &str = "(id_column, queue_column, domain[, 'on_explicit=refuse|advance']) or (id_column, queue_column, 'column', domain_column[, 'on_explicit=refuse|advance'])";

fn arguments(trigger: &pg_sys::Trigger, function: &str) -> Arguments {
    let mut args: Vec<CString> = (0..trigger.tgnargs as usize)
        .map(|i| unsafe { CStr::from_ptr(*trigger.tgargs.add(i)) }.to_owned())
        .collect();
    let bad = || -> ! { TicketError::TriggerMisuse(format!("the trigger's arguments are {function}{USAGE}")).raise() };
    let mode = match args.last().and_then(|last| last.to_str().ok()?.strip_prefix("on_explicit=").map(str::to_owned)) {
        Some(mode) => {
            args.pop();
            Some(OnExplicit::parse(&mode).unwrap_or_else(|| bad()))
        }
        None => None,
    };
    let (on_explicit, equality) = (mode.unwrap_or(OnExplicit::Refuse), mode.is_some());
    match args.as_slice() {
        [id, queue, domain] => {
            Arguments { id_column: id.clone(), queue_column: queue.clone(), domain: Domain::Literal(domain.clone()), on_explicit, equality }
        }
        [id, queue, form, column] if form.as_bytes() == b"column" => {
            Arguments { id_column: id.clone(), queue_column: queue.clone(), domain: Domain::Column(column.clone()), on_explicit, equality }
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

/// Can a scope column of this (base) type be read as one text per value the
/// type compares equal (SPEC §18.4)? The types whose output is canonical
/// (under `CANONICAL_SETTINGS`), those `column_text` normalises, and enums.
/// Not citext (equal in any case), interval ('1 day' = '24 hours'), jsonb,
/// arrays or ranges of those: refused.
fn scope_type_supported(base: pg_sys::Oid) -> bool {
    PLAIN_OUTPUT.contains(&base)
        || [pg_sys::FLOAT4OID, pg_sys::FLOAT8OID, pg_sys::DATEOID, pg_sys::TIMESTAMPOID, pg_sys::TIMESTAMPTZOID, pg_sys::TIMEOID].contains(&base)
        || unsafe { pg_sys::get_typtype(base) } == pg_sys::TYPTYPE_ENUM as c_char
}

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
/// (allocated in the trigger's memory context), or 22004 if NULL. With
/// `equality`, one text per value the column's type compares equal (SPEC
/// §18.4): numeric without insignificant zeros (17, 17.0, 17.00), -0 as 0,
/// char(n) without its padding (char(8) and char(10) one series).
fn column_text<'a>(values: &[pg_sys::Datum], nulls: &[bool], tupdesc: pg_sys::TupleDesc, n: i32, what: &'static str, equality: bool) -> Name<'a> {
    let i = n as usize - 1;
    if nulls[i] {
        TicketError::NullArgument(what).raise();
    }
    let typid = unsafe { pg_sys::SPI_gettypeid(tupdesc, n) };
    let base = unsafe { pg_sys::getBaseType(typid) };
    if equality && !scope_type_supported(base) {
        TicketError::TriggerMisuse(format!(
            "{what} is of a type whose values that compare equal may print differently (citext, interval, jsonb, an array, a range...): it would number one scope as two series; use a column of text, an integer, numeric, a float, boolean, uuid, a date or time, or an enum"
        ))
        .raise();
    }
    if equality {
        match base {
            pg_sys::NUMERICOID => {
                let text = unsafe { pg_sys::numeric_normalize(pg_sys::pg_detoast_datum(values[i].cast_mut_ptr()).cast()) };
                return Name(unsafe { CStr::from_ptr(text) }.to_bytes());
            }
            pg_sys::FLOAT8OID | pg_sys::FLOAT4OID => {
                let zero = if base == pg_sys::FLOAT8OID {
                    f64::from_bits(values[i].value() as u64) == 0.0
                } else {
                    f32::from_bits(values[i].value() as u32) == 0.0
                };
                if zero {
                    return Name(b"0");
                }
            }
            _ => {}
        }
    }
    let (mut output, mut varlena) = (pg_sys::Oid::INVALID, false);
    unsafe { pg_sys::getTypeOutputInfo(typid, &mut output, &mut varlena) };
    let plain = PLAIN_OUTPUT.contains(&base);
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
    let bytes = unsafe { CStr::from_ptr(text) }.to_bytes();
    if equality && base == pg_sys::BPCHAROID {
        // Trailing spaces of char(n) are not significant to its equality.
        let end = bytes.iter().rposition(|&b| b != b' ').map_or(0, |p| p + 1);
        return Name(&bytes[..end]);
    }
    Name(bytes)
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

/// What a numbering trigger does with its scope: take the next value, or
/// claim one given explicitly (`OnExplicit::Advance`).
trait Allocator {
    fn next(&self, queue: Name<'_>, domain: Name<'_>) -> i64;
    fn claim(&self, queue: Name<'_>, domain: Name<'_>, value: i64);
    /// The admin function a claim stands for (in `pgticket`), and what the
    /// scope is called.
    fn advance(&self) -> (&'static str, &'static str);
}

/// A claim moves a series forward as the admin function does: refused
/// (42501) unless the current user may execute that function (SPEC §20,
/// #46 item 2; 0.4.0 let any role's trigger on its own table move any
/// other role's series, to 2^63-1 for good). Looked up among the
/// extension's own functions by name, so a database whose objects are
/// not yet updated (the functions outside `pgticket`) is served too.
fn require_advance_right(allocator: &dyn Allocator, function: &'static str, queue: Name<'_>, domain: Name<'_>) {
    let (admin, what) = allocator.advance();
    let allowed = Spi::get_one_with_args::<bool>(
        "SELECT pg_catalog.bool_or(pg_catalog.has_function_privilege(p.oid, 'EXECUTE')) \
           FROM pg_catalog.pg_proc p \
           JOIN pg_catalog.pg_depend d ON d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass \
                AND d.objid OPERATOR(pg_catalog.=) p.oid AND d.deptype OPERATOR(pg_catalog.=) 'e' \
           JOIN pg_catalog.pg_extension e ON e.oid OPERATOR(pg_catalog.=) d.refobjid AND e.extname OPERATOR(pg_catalog.=) 'pg_ticket' \
          WHERE p.proname OPERATOR(pg_catalog.=) $1 AND p.pronargs OPERATOR(pg_catalog.=) 3::pg_catalog.int2",
        &[admin.trim_start_matches("pgticket.").into()],
    )
    .unwrap_or_else(|e| pgrx::error!("pg_ticket: {function}(): cannot look up {admin}(): {e}"))
    .unwrap_or(false);
    if !allowed {
        TicketError::NoAdvanceRight {
            scope: crate::names::label(what, queue, Some(domain)),
            role: crate::quota::role_name(crate::xact::current_user()),
            function,
            admin,
        }
        .raise();
    }
}

struct ScopedIds;

impl Allocator for ScopedIds {
    fn advance(&self) -> (&'static str, &'static str) {
        ("pgticket.advance_scoped_id", "scope")
    }

    fn next(&self, queue: Name<'_>, domain: Name<'_>) -> i64 {
        counters::take(Kind::Scope, queue, domain, 1).or_raise()
    }

    fn claim(&self, queue: Name<'_>, domain: Name<'_>, value: i64) {
        counters::claim(Kind::Scope, queue, domain, value).or_raise();
    }
}

struct Tickets;

impl Allocator for Tickets {
    fn advance(&self) -> (&'static str, &'static str) {
        ("pgticket.advance_ticket", "ticket scope")
    }

    fn next(&self, queue: Name<'_>, domain: Name<'_>) -> i64 {
        crate::tickets::next(queue, domain)
    }

    fn claim(&self, queue: Name<'_>, domain: Name<'_>, value: i64) {
        crate::tickets::claim(queue, domain, value).or_raise();
    }
}

#[pg_trigger]
fn assign_scoped_id<'a>(trigger: &'a PgTrigger<'a>) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, PgTriggerError> {
    assign(trigger, "assign_scoped_id", &ScopedIds)
}

#[pg_trigger]
fn assign_ticket<'a>(trigger: &'a PgTrigger<'a>) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, PgTriggerError> {
    assign(trigger, "assign_ticket", &Tickets)
}

/// The id column's value as a number of the series (a canonical decimal
/// string for text), for a value given explicitly; 22023 if it is none.
fn given_number(value: pg_sys::Datum, id_type: IdType, column: &CStr, table: &str) -> i64 {
    let number = match id_type {
        IdType::BigInt => Some(value.value() as i64),
        IdType::Integer => Some(i64::from(value.value() as i32)),
        IdType::SmallInt => Some(i64::from(value.value() as i16)),
        IdType::Numeric => {
            let text = unsafe { CStr::from_ptr(pg_sys::numeric_normalize(pg_sys::pg_detoast_datum(value.cast_mut_ptr()).cast())) };
            text.to_str().ok().and_then(|t| t.parse::<i64>().ok())
        }
        IdType::Text => {
            let text = unsafe { CStr::from_ptr(pg_sys::text_to_cstring(value.cast_mut_ptr())) };
            text.to_str().ok().and_then(|t| ticket_core::counter::parse_resource_id(t))
        }
    };
    number.filter(|n| *n > 0).unwrap_or_else(|| {
        TicketError::InvalidArgument(format!(
            "the value given for column {:?} of table {table:?} is not a number of its series (a whole number from 1)",
            for_message(column.to_bytes())
        ))
        .raise()
    })
}

/// The row with its id column set by the allocator if NULL; a value given
/// for it refused, or claimed (`OnExplicit`).
fn assign<'a>(
    trigger: &'a PgTrigger<'a>,
    function: &'static str,
    allocator: &dyn Allocator,
) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, PgTriggerError> {
    postgres_errors_as_raised(|| {
        let data = trigger.trigger_data();
        let event = data.tg_event;
        let row_before = event & pg_sys::TRIGGER_EVENT_ROW != 0 && event & pg_sys::TRIGGER_EVENT_TIMINGMASK == pg_sys::TRIGGER_EVENT_BEFORE;
        let op = event & pg_sys::TRIGGER_EVENT_OPMASK;
        if !row_before || !(op == pg_sys::TRIGGER_EVENT_INSERT || op == pg_sys::TRIGGER_EVENT_UPDATE) {
            TicketError::TriggerMisuse(format!("{function}() must run BEFORE INSERT OR UPDATE ... FOR EACH ROW")).raise();
        }
        let args = arguments(trigger.trigger(), function);
        // A trigger of 0.4.0's form that does not fire on UPDATE lets an
        // UPDATE set a number the series hands out later (SPEC §18.4):
        // refused at its first row. 0.3.0's form is not: a database not yet
        // updated runs its `BEFORE INSERT` triggers on this library, and the
        // update makes them `OR UPDATE`.
        if args.equality && (trigger.trigger().tgtype as u32) & pg_sys::TRIGGER_TYPE_UPDATE == 0 {
            TicketError::TriggerMisuse(format!(
                "{function}() must run BEFORE INSERT OR UPDATE ... FOR EACH ROW: an UPDATE that sets the number would go unchecked (number_rows() makes the trigger so)"
            ))
            .raise();
        }
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
        refuse_a_column_it_cannot_number(tupdesc, id_n, &args.id_column, &table);

        let natts = unsafe { (*tupdesc).natts } as usize;
        let mut values = vec![pg_sys::Datum::from(0); natts];
        let mut nulls = vec![false; natts];
        unsafe { pg_sys::heap_deform_tuple(tuple, tupdesc, values.as_mut_ptr(), nulls.as_mut_ptr()) };
        let as_it_is = || Ok(Some(unsafe { PgHeapTuple::from_heap_tuple(PgTupleDesc::from_pg_unchecked(tupdesc), tuple) }));
        let given = !nulls[id_n as usize - 1];
        let queue = column_text(&values, &nulls, tupdesc, queue_n, "the queue column", args.equality);
        let domain = match (&args.domain, domain_n) {
            (_, Some(n)) => column_text(&values, &nulls, tupdesc, n, "the domain column", args.equality),
            (Domain::Literal(text), None) => Name(text.as_bytes()),
            (Domain::Column(_), None) => unreachable!("a domain column has an attribute number"),
        };
        check_name("queue", queue.bytes()).or_raise();
        check_name("domain", domain.bytes()).or_raise();
        let number_kept = given && op == pg_sys::TRIGGER_EVENT_UPDATE && unchanged(data.tg_trigtuple, tuple, tupdesc, id_n, id_type);
        if number_kept {
            // Its number in the scope it had: an UPDATE that moves the row
            // to another scope with it gives that scope a number.
            let mut old_values = vec![pg_sys::Datum::from(0); natts];
            let mut old_nulls = vec![false; natts];
            unsafe { pg_sys::heap_deform_tuple(data.tg_trigtuple, tupdesc, old_values.as_mut_ptr(), old_nulls.as_mut_ptr()) };
            let same_scope = |n: i32, now: Name<'_>| {
                let i = n as usize - 1;
                !old_nulls[i] && column_text(&old_values, &old_nulls, tupdesc, n, "", args.equality).bytes() == now.bytes()
            };
            if same_scope(queue_n, queue) && domain_n.is_none_or(|n| same_scope(n, domain)) {
                return as_it_is();
            }
        }
        if given {
            match args.on_explicit {
                // The row keeps its number but moves to another scope.
                OnExplicit::Refuse if number_kept => {
                    TicketError::MovedNumber { column: for_message(args.id_column.to_bytes()), table, function }.raise()
                }
                OnExplicit::Refuse => TicketError::ExplicitNumber { column: for_message(args.id_column.to_bytes()), table, function }.raise(),
                OnExplicit::Advance => {
                    let number = given_number(values[id_n as usize - 1], id_type, &args.id_column, &table);
                    require_advance_right(allocator, function, queue, domain);
                    allocator.claim(queue, domain, number);
                    return as_it_is();
                }
            }
        }
        let allocated = allocator.next(queue, domain);
        let id = coerce_to_column(allocated, id_type.datum(allocated, &args.id_column, &table), tupdesc, id_n, &args.id_column, &table);

        let (column, is_null) = (id_n, false);
        let modified = unsafe { pg_sys::heap_modify_tuple_by_cols(tuple, tupdesc, 1, &column as *const i32 as *mut i32, &id as *const _ as *mut _, &is_null as *const bool as *mut bool) };
        Ok(Some(unsafe { PgHeapTuple::from_heap_tuple(PgTupleDesc::from_pg_unchecked(tupdesc), modified) }))
    })
}

/// Is the id column's value of the new row the old row's (an UPDATE that
/// leaves the number alone)?
fn unchanged(old: pg_sys::HeapTuple, new: pg_sys::HeapTuple, tupdesc: pg_sys::TupleDesc, n: i32, id_type: IdType) -> bool {
    let (mut old_null, mut new_null) = (false, false);
    let a = unsafe { pg_sys::heap_getattr(old, n, tupdesc, &mut old_null) };
    let b = unsafe { pg_sys::heap_getattr(new, n, tupdesc, &mut new_null) };
    if old_null || new_null {
        return old_null == new_null;
    }
    let text = |d: pg_sys::Datum| -> Vec<u8> {
        match id_type {
            IdType::Numeric => unsafe { CStr::from_ptr(pg_sys::numeric_normalize(pg_sys::pg_detoast_datum(d.cast_mut_ptr()).cast())) }.to_bytes().to_vec(),
            _ => unsafe { CStr::from_ptr(pg_sys::text_to_cstring(d.cast_mut_ptr())) }.to_bytes().to_vec(),
        }
    };
    match id_type {
        IdType::BigInt => a.value() as i64 == b.value() as i64,
        IdType::Integer => a.value() as i32 == b.value() as i32,
        IdType::SmallInt => a.value() as i16 == b.value() as i16,
        IdType::Numeric | IdType::Text => text(a) == text(b),
    }
}

/// A generated id column (a BEFORE trigger sees it NULL, and the generated
/// value replaces the number: a hole in the series) is refused at its
/// first row (SPEC §18.4); `number_rows()` refuses it, and a domain with a
/// DEFAULT or NOT NULL, when it makes the trigger.
fn refuse_a_column_it_cannot_number(tupdesc: pg_sys::TupleDesc, n: i32, column: &CStr, table: &str) {
    let attrs = unsafe { PgTupleDesc::from_pg_unchecked(tupdesc) };
    let attr = attrs.get(n as usize - 1).expect("the id column's attribute");
    if attr.attgenerated != 0 {
        TicketError::TriggerMisuse(format!(
            "column {:?} of table {table:?} is generated: its value replaces any number the trigger sets",
            for_message(column.to_bytes())
        ))
        .raise();
    }
}

/// A `name` argument's text (the datum points at its NameData).
fn name_arg(datum: Option<pg_sys::Datum>) -> Option<String> {
    datum.map(|d| unsafe { CStr::from_ptr(d.cast_mut_ptr::<c_char>()) }.to_string_lossy().into_owned())
}

/// What `number_rows()` checks of a column, from the catalog.
struct ColumnFacts {
    exists: bool,
    generated: bool,
    identity_or_default: bool,
    /// The column's type, each domain over it resolved: a domain on the way
    /// with a DEFAULT or NOT NULL (`(domain name, what)`).
    domain_default_or_not_null: Option<(String, &'static str)>,
    base_type: pg_sys::Oid,
    type_name: String,
    nondeterministic_collation: bool,
}

fn column_facts(client: &pgrx::spi::SpiClient<'_>, relation: pg_sys::Oid, column: &str) -> ColumnFacts {
    let row = client
        .select(
            "SELECT a.attgenerated OPERATOR(pg_catalog.<>) '', a.attidentity OPERATOR(pg_catalog.<>) '' OR a.atthasdef, a.atttypid,
                    pg_catalog.format_type(a.atttypid, a.atttypmod),
                    a.attcollation OPERATOR(pg_catalog.<>) 0::pg_catalog.oid AND NOT coalesce((SELECT c.collisdeterministic FROM pg_catalog.pg_collation c WHERE c.oid OPERATOR(pg_catalog.=) a.attcollation), true)
               FROM pg_catalog.pg_attribute a
              WHERE a.attrelid OPERATOR(pg_catalog.=) $1 AND a.attname OPERATOR(pg_catalog.=) $2::pg_catalog.name AND a.attnum OPERATOR(pg_catalog.>) 0::pg_catalog.int2 AND NOT a.attisdropped",
            None,
            &[relation.into(), column.into()],
        )
        .unwrap_or_else(|e| pgrx::error!("pg_ticket: number_rows(): {e}"));
    let Some(row) = row.into_iter().next() else {
        return ColumnFacts {
            exists: false,
            generated: false,
            identity_or_default: false,
            domain_default_or_not_null: None,
            base_type: pg_sys::InvalidOid,
            type_name: String::new(),
            nondeterministic_collation: false,
        };
    };
    let get_bool = |i: usize| row.get::<bool>(i).ok().flatten().unwrap_or(false);
    let typid: pg_sys::Oid = row.get(3).ok().flatten().unwrap_or_default();
    let mut facts = ColumnFacts {
        exists: true,
        generated: get_bool(1),
        identity_or_default: get_bool(2),
        domain_default_or_not_null: None,
        base_type: unsafe { pg_sys::getBaseType(typid) },
        type_name: row.get::<String>(4).ok().flatten().unwrap_or_default(),
        nondeterministic_collation: get_bool(5),
    };
    // Walk the domains from the column's type down to its base type.
    let mut t = typid;
    loop {
        let domain = client
            .select(
                "SELECT t.typtype OPERATOR(pg_catalog.=) 'd', t.typbasetype, t.typdefaultbin IS NOT NULL, t.typnotnull, pg_catalog.format_type(t.oid, NULL)
                   FROM pg_catalog.pg_type t WHERE t.oid OPERATOR(pg_catalog.=) $1",
                None,
                &[t.into()],
            )
            .unwrap_or_else(|e| pgrx::error!("pg_ticket: number_rows(): {e}"));
        let Some(d) = domain.into_iter().next() else { break };
        if !d.get::<bool>(1).ok().flatten().unwrap_or(false) {
            break;
        }
        let name = d.get::<String>(5).ok().flatten().unwrap_or_default();
        if d.get::<bool>(3).ok().flatten().unwrap_or(false) {
            facts.domain_default_or_not_null.get_or_insert((name.clone(), "a DEFAULT"));
        }
        if d.get::<bool>(4).ok().flatten().unwrap_or(false) {
            facts.domain_default_or_not_null.get_or_insert((name, "NOT NULL"));
        }
        t = d.get::<pg_sys::Oid>(2).ok().flatten().unwrap_or_default();
    }
    facts
}

/// `number_rows()`: a BEFORE INSERT OR UPDATE trigger numbering `relation`'s
/// `id_column` per scope, its arguments checked now (the trigger itself
/// checks them only at its first row), in C so that a refusal carries no
/// PL/pgSQL context. Its name sorts after the table's other triggers
/// (`zz_number_<column>`, or `trigger_name`): a row-skipping BEFORE
/// trigger that runs before it takes no number for a row it skips.
/// A V1 C function of its own (sql/schema.sql declares it): its `name`
/// and `regclass` arguments have no pgrx type.
#[no_mangle]
pub extern "C" fn pg_finfo_number_rows() -> &'static pg_sys::Pg_finfo_record {
    const V1_API: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1_API
}

#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn number_rows(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    let arg = |n: usize| unsafe { (!pgrx::fcinfo::pg_arg_is_null(fcinfo, n)).then(|| pgrx::fcinfo::pg_getarg_datum_raw(fcinfo, n)) };
    let text_arg = |n: usize| arg(n).map(|d| unsafe { CStr::from_ptr(pg_sys::text_to_cstring(d.cast_mut_ptr())) }.to_string_lossy().into_owned());
    let relation = arg(0).map(|d| pg_sys::Oid::from(d.value() as u32));
    let (id_column, queue_column, domain_column, trigger_name) = (arg(1), arg(2), arg(4), arg(7));
    let (domain, kind, on_explicit) = (text_arg(3), text_arg(5), text_arg(6));
    let (domain, kind, on_explicit) = (domain.as_deref(), kind.as_deref(), on_explicit.as_deref());
    postgres_errors_as_raised(|| {
        let (id_column, queue_column, domain_column, trigger_name) =
            (name_arg(id_column), name_arg(queue_column), name_arg(domain_column), name_arg(trigger_name));
        let (Some(relation), Some(id_column), Some(queue_column), Some(kind), Some(on_explicit)) =
            (relation, id_column, queue_column, kind, on_explicit)
        else {
            TicketError::NullArgument("number_rows: relation, id_column, queue_column, kind and on_explicit").raise()
        };
        let function = match kind {
            "scoped_id" => "assign_scoped_id",
            "ticket" => "assign_ticket",
            other => TicketError::InvalidArgument(format!("number_rows: kind is 'scoped_id' or 'ticket', not {other:?}")).raise(),
        };
        let mode = OnExplicit::parse(on_explicit).unwrap_or_else(|| {
            TicketError::InvalidArgument(format!("number_rows: on_explicit is 'refuse' or 'advance', not {on_explicit:?}")).raise()
        });
        if domain.is_none() == domain_column.is_none() {
            TicketError::InvalidArgument("number_rows: give either domain (the same for every row) or domain_column".into()).raise();
        }
        if let Some(domain) = domain {
            check_name("domain", domain.as_bytes()).or_raise();
        }
        let (create, name) = Spi::connect(|client| {
            let table: String = client
                .select("SELECT $1::pg_catalog.regclass::pg_catalog.text", None, &[relation.into()])
                .ok()
                .and_then(|rows| rows.first().get_one::<String>().ok().flatten())
                .unwrap_or_default();
            let columns: Vec<&String> = [Some(&id_column), Some(&queue_column), domain_column.as_ref()].into_iter().flatten().collect();
            for column in &columns {
                let facts = column_facts(&client, relation, column);
                if !facts.exists {
                    TicketError::NoSuchColumn { column: (*column).clone(), table: table.clone() }.raise();
                }
                if facts.generated {
                    TicketError::InvalidArgument(format!(
                        "column {column:?} of table {table} is generated: the trigger can neither read it nor set it"
                    ))
                    .raise();
                }
                if *column != &id_column && facts.nondeterministic_collation {
                    TicketError::InvalidArgument(format!(
                        "column {column:?} of table {table} has a nondeterministic collation: values it compares equal print differently, and would number two series"
                    ))
                    .raise();
                }
                if *column != &id_column && !scope_type_supported(facts.base_type) {
                    TicketError::InvalidArgument(format!(
                        "column {column:?} of table {table} is of type {}, whose values that compare equal may print differently (and number two series): name the scope by a column of text, an integer, numeric, a float, boolean, uuid, a date or time, or an enum (a generated column casting this one, e.g. lower(...) for citext)",
                        facts.type_name
                    ))
                    .raise();
                }
            }
            let children: i64 = client
                .select("SELECT pg_catalog.count(*) FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) i.inhparent WHERE i.inhparent OPERATOR(pg_catalog.=) $1 AND c.relkind OPERATOR(pg_catalog.=) 'r'", None, &[relation.into()])
                .ok()
                .and_then(|rows| rows.first().get_one::<i64>().ok().flatten())
                .unwrap_or(0);
            if children > 0 {
                TicketError::InvalidArgument(format!(
                    "table {table} has inheritance children, which its triggers do not reach (rows inserted there would be neither numbered nor checked): make a partitioned table, or number each table with number_rows()"
                ))
                .raise();
            }
            if Some(&id_column) == Some(&queue_column) || Some(&id_column) == domain_column.as_ref() {
                TicketError::InvalidArgument(format!(
                    "number_rows: the id column {id_column:?} cannot also name the scope (it is NULL when the trigger runs)"
                ))
                .raise();
            }
            let id = column_facts(&client, relation, &id_column);
            if id.identity_or_default {
                TicketError::InvalidArgument(format!(
                    "column {id_column:?} of table {table} has an identity or a default: the trigger numbers only rows inserted without a value (ALTER TABLE ... ALTER COLUMN ... DROP DEFAULT, or DROP IDENTITY, first)"
                ))
                .raise();
            }
            if let Some((domain_type, what)) = &id.domain_default_or_not_null {
                TicketError::InvalidArgument(format!(
                    "column {id_column:?} of table {table} is of domain {domain_type}, which has {what}: {}",
                    if *what == "NOT NULL" { "a row inserted without a number fails before the trigger runs" } else { "every row inserted without a number gets the default, and the trigger numbers nothing" }
                ))
                .raise();
            }
            if ![pg_sys::INT8OID, pg_sys::INT4OID, pg_sys::INT2OID, pg_sys::NUMERICOID, pg_sys::TEXTOID, pg_sys::VARCHAROID].contains(&id.base_type) {
                TicketError::WrongColumnType { column: id_column.clone(), table: table.clone(), type_name: id.type_name.clone() }.raise();
            }
            let own_schema: String = client
                .select(
                    "SELECT n.nspname::pg_catalog.text FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
                      WHERE e.extname OPERATOR(pg_catalog.=) 'pg_ticket'",
                    None,
                    &[],
                )
                .ok()
                .and_then(|rows| rows.first().get_one::<String>().ok().flatten())
                .unwrap_or_else(|| "public".into());
            let name = trigger_name.unwrap_or_else(|| truncate_name(&format!("zz_number_{id_column}")));
            let mut args = vec![quote_literal(&id_column), quote_literal(&queue_column)];
            match (domain, &domain_column) {
                (Some(domain), _) => args.push(quote_literal(domain)),
                (None, Some(column)) => {
                    args.push(quote_literal("column"));
                    args.push(quote_literal(column));
                }
                (None, None) => unreachable!("checked above"),
            }
            args.push(quote_literal(mode.argument()));
            // Every UPDATE, not only one naming the number or the scope: a
            // trigger of the user's that runs before this one may set them
            // in an UPDATE of another column (#32 review).
            let create = format!(
                "CREATE TRIGGER {} BEFORE INSERT OR UPDATE ON {} FOR EACH ROW EXECUTE FUNCTION {}.{}({})",
                quote_ident(&name),
                table,
                quote_ident(&own_schema),
                function,
                args.join(", ")
            );
            (create, name)
        });
        Spi::run(&create).unwrap_or_else(|e| pgrx::error!("pg_ticket: number_rows(): {e}"));
        {
            let mut data = pg_sys::NameData { data: [0; pg_sys::NAMEDATALEN as usize] };
            for (i, b) in name.bytes().take(pg_sys::NAMEDATALEN as usize - 1).enumerate() {
                data.data[i] = b as c_char;
            }
            let boxed = unsafe { pg_sys::palloc(std::mem::size_of::<pg_sys::NameData>()) as *mut pg_sys::NameData };
            unsafe { boxed.write(data) };
            pg_sys::Datum::from(boxed)
        }
    })
}

/// A name cut to PostgreSQL's 63 bytes (on a character boundary).
fn truncate_name(name: &str) -> String {
    let mut end = name.len().min(pg_sys::NAMEDATALEN as usize - 1);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_string()
}

fn quote_ident(text: &str) -> String {
    let c = CString::new(text).unwrap_or_default();
    unsafe { CStr::from_ptr(pg_sys::quote_identifier(c.as_ptr())) }.to_string_lossy().into_owned()
}

fn quote_literal(text: &str) -> String {
    let c = CString::new(text).unwrap_or_default();
    unsafe { CStr::from_ptr(pg_sys::quote_literal_cstr(c.as_ptr())) }.to_string_lossy().into_owned()
}
