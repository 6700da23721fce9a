//! Names (queue, domain, block name) as the database stores them.
//!
//! A name is `text` in the database's encoding, which need not be UTF-8
//! (LATIN1, EUC_JP, ...). pgrx's `&str` insists on UTF-8 and panics
//! otherwise, so names are taken and keyed as the database's own bytes and
//! handed back to SQL as `text` unchanged: `next_scoped_id('café', 'd')`
//! in a LATIN1 database is the scope whose row holds exactly those bytes.

use pgrx::callconv::{Arg, ArgAbi};
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::FromDatum;

/// A `text` argument's bytes, in the database's encoding (never NUL inside).
#[derive(Clone, Copy)]
pub struct Name<'a>(pub &'a [u8]);

pgrx::impl_sql_translatable!(Name<'_>, arg_only = "text");

impl FromDatum for Name<'_> {
    unsafe fn from_polymorphic_datum(datum: pg_sys::Datum, is_null: bool, _: pg_sys::Oid) -> Option<Self> {
        if is_null || datum.is_null() {
            return None;
        }
        // Detoasted in the function call's memory context, which outlives
        // the call's use of the bytes. pg_detoast_datum_packed's own test
        // first, here: a call into PostgreSQL costs a sigsetjmp (pgrx's
        // guard), twice per next_scoped_id() for names that are never
        // compressed or external in practice.
        let packed: *mut pg_sys::varlena = datum.cast_mut_ptr();
        let varlena = unsafe {
            if pgrx::varlena::varatt_is_4b_c(packed) || pgrx::varlena::varatt_is_1b_e(packed) {
                pg_sys::pg_detoast_datum_packed(packed)
            } else {
                packed
            }
        };
        Some(Name(unsafe { pgrx::varlena::varlena_to_byte_slice(varlena) }))
    }
}

unsafe impl<'fcx> ArgAbi<'fcx> for Name<'fcx> {
    unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
        let index = arg.index();
        unsafe { arg.unbox_arg_using_from_datum().unwrap_or_else(|| panic!("argument {index} must not be null")) }
    }
}

impl<'a> Name<'a> {
    pub fn bytes(self) -> &'a [u8] {
        self.0
    }

    /// The name as SQL `text`, for SPI arguments (allocated in the current
    /// memory context).
    pub fn to_datum(self) -> DatumWithOid<'a> {
        let text = unsafe { pg_sys::cstring_to_text_with_len(self.0.as_ptr().cast(), self.0.len() as i32) };
        unsafe { DatumWithOid::new(pg_sys::Datum::from(text), pg_sys::TEXTOID) }
    }

    /// For views: readable whatever the encoding (not for keys).
    pub fn display(self) -> String {
        for_message(self.0)
    }

    /// For messages: in double quotes, escaped once (quotes, backslashes,
    /// control characters; non-ASCII bytes too outside UTF-8).
    pub fn quoted(self) -> String {
        quoted(self.0)
    }
}

/// `bytes` as [`Name::quoted`] shows them.
pub fn quoted(bytes: &[u8]) -> String {
    if unsafe { pg_sys::GetDatabaseEncoding() } == pg_sys::pg_enc::PG_UTF8 as i32 {
        format!("{:?}", String::from_utf8_lossy(bytes))
    } else {
        format!("\"{}\"", bytes.escape_ascii())
    }
}

/// How an error names what it is about: `scope ("shop-17", "invoice/2026")`,
/// `ticket scope (...)`, `block "orders"`.
pub fn label(what: &str, a: Name<'_>, b: Option<Name<'_>>) -> String {
    match b {
        Some(b) => format!("{what} ({}, {})", a.quoted(), b.quoted()),
        None => format!("{what} {}", a.quoted()),
    }
}

/// Bytes in the database's encoding, for a message that PostgreSQL sends
/// as that encoding: as they are in a UTF-8 database; elsewhere non-ASCII
/// bytes are escaped (`\xe9`), since a message must be valid in the
/// database's encoding or the client gets 22021 instead of the error.
pub fn for_message(bytes: &[u8]) -> String {
    if unsafe { pg_sys::GetDatabaseEncoding() } == pg_sys::pg_enc::PG_UTF8 as i32 {
        String::from_utf8_lossy(bytes).into_owned()
    } else {
        bytes.escape_ascii().to_string()
    }
}

/// A name handed back to SQL as `text`, its bytes unchanged (in the
/// database's encoding): a view's column that a caller compares with the
/// names it allocates from.
pub struct Text(pub Vec<u8>);

pgrx::impl_sql_translatable!(Text, "text");

impl pgrx::IntoDatum for Text {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        let text = unsafe { pg_sys::cstring_to_text_with_len(self.0.as_ptr().cast(), self.0.len() as i32) };
        Some(pg_sys::Datum::from(text))
    }

    fn type_oid() -> pg_sys::Oid {
        pg_sys::TEXTOID
    }
}

unsafe impl pgrx::callconv::BoxRet for Text {
    unsafe fn box_into<'fcx>(self, fcinfo: &mut pgrx::callconv::FcInfo<'fcx>) -> pgrx::datum::Datum<'fcx> {
        match pgrx::IntoDatum::into_datum(self) {
            Some(datum) => unsafe { fcinfo.return_raw_datum(datum) },
            None => fcinfo.return_null(),
        }
    }
}
