"""pg_ticket's SQL allocators from Django (``pip install pg-ticket[django]``).

Plain SQL on Django's own connection, calling the extension's functions in
its own schema (looked up once per connection; the database needs
``CREATE EXTENSION pg_ticket``).

``next_scoped_id`` is gap-free as django-sequences is: call it inside the
transaction that saves the row using the number (``transaction.atomic()``,
or a transaction of your own with autocommit off), so the number commits or
rolls back with the row. ``reserve_block`` is the opposite: a block is used
only after its reservation committed, so it commits in a transaction of its
own and refuses to run inside one (which includes ``ATOMIC_REQUESTS`` views
and ``TestCase`` tests: use ``non_atomic_requests`` and
``TransactionTestCase``).
"""

from typing import Tuple

from django.db import connections, transaction

from ._schema import extension_schema, forget


def _call(connection, sql, params):
    """The row of `sql` ({schema} the extension's), on `connection`."""
    connection.ensure_connection()
    dbapi_connection = connection.connection

    def fetch_one(lookup):
        with connection.cursor() as cursor:
            cursor.execute(lookup)
            row = cursor.fetchone()
        return row[0] if row else None

    # The driver reads "%" in a statement with parameters as a placeholder.
    schema = extension_schema(dbapi_connection, fetch_one).replace("%", "%%")
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql.format(schema=schema), params)
            return cursor.fetchone()
    except Exception:
        forget(dbapi_connection)
        raise


def _in_a_transaction(connection):
    return connection.in_atomic_block or not connection.get_autocommit()


def _atomic_elsewhere(using):
    """The aliases other than ``using`` with a transaction.atomic() open."""
    return [alias for alias in connections if alias != using and connections[alias].in_atomic_block]


def next_scoped_id(queue: str, domain: str, using: str = "default") -> int:
    """The next value of the scope (queue, domain): 1, 2, 3, ... with no gap.

    Raises TransactionManagementError in autocommit mode outside
    ``transaction.atomic()``: the number would commit at once, and a row
    that then fails to save would leave a gap.
    """
    connection = connections[using]
    if not _in_a_transaction(connection):
        elsewhere = _atomic_elsewhere(using)
        where = (
            f" (the transaction.atomic() open is on {', '.join(repr(a) for a in elsewhere)}: pass using={elsewhere[0]!r})"
            if elsewhere
            else ""
        )
        raise transaction.TransactionManagementError(
            f"pg_ticket.django.next_scoped_id(using={using!r}) must run inside transaction.atomic(using={using!r}): "
            f"its number is gap-free only if it commits with the row that uses it{where}"
        )
    return _call(connection, "SELECT {schema}.next_scoped_id(%s, %s)", [queue, domain])[0]


def reserve_block(name: str, size: int, using: str = "default") -> Tuple[int, int]:
    """(first_id, last_id): ``size`` IDs of the block counter ``name``, committed.

    Raises TransactionManagementError inside a transaction (``atomic()``, or
    autocommit turned off): a reservation rolled back with the caller's
    transaction would hand the same IDs out again, to whoever reserves next.
    """
    connection = connections[using]
    if _in_a_transaction(connection):
        raise transaction.TransactionManagementError(
            "pg_ticket.django.reserve_block must run in autocommit mode, outside transaction.atomic(): "
            "a block may be used only after its reservation committed"
        )
    with transaction.atomic(using=using):
        first_id, last_id = _call(connection, "SELECT first_id, last_id FROM {schema}.reserve_block(%s, %s)", [name, size])
    return first_id, last_id


def next_ticket(queue: str, domain: str, using: str = "default") -> int:
    """The next ticket of (queue, domain): unique and increasing on this
    server, never reused, not transactional (a rolled-back caller leaves a
    gap): any mode, inside ``atomic()`` or not."""
    return _call(connections[using], "SELECT {schema}.next_ticket(%s, %s)", [queue, domain])[0]
