"""Where the helpers find pg_ticket's functions: by the extension's own
schema, looked up once per database connection, not through the
search_path — which may not hold that schema, or may hold a same-named
function earlier (the Rust client calls by schema too)."""

import weakref

from ._native import Error

LOOKUP = (
    "SELECT quote_ident(n.nspname) FROM pg_extension e"
    " JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'pg_ticket'"
)

_schemas = weakref.WeakKeyDictionary()


def extension_schema(dbapi_connection, fetch_one):
    """The extension's schema, quoted for SQL (the caller escapes what its
    driver would read as a parameter in it). `fetch_one(sql)` runs the
    lookup on that connection and returns the first column of its row, or
    None. The extension cannot be moved (it is not relocatable), but it can
    be dropped and created in another schema: a call that fails forgets the
    connection's entry (`forget`), so the next call looks again."""
    try:
        return _schemas[dbapi_connection]
    except (KeyError, TypeError):
        pass
    schema = fetch_one(LOOKUP)
    if schema is None:
        raise Error("pg_ticket is not installed in this database (CREATE EXTENSION pg_ticket)")
    try:
        _schemas[dbapi_connection] = schema
    except TypeError:  # a connection object that takes no weak reference: look up each time
        pass
    return schema


def forget(dbapi_connection):
    """After a failed call: look the schema up again next time."""
    try:
        _schemas.pop(dbapi_connection, None)
    except TypeError:
        pass
