"""pg_ticket's SQL allocators from Django (``pip install pg-ticket[django]``).

Plain SQL on Django's own connection; the database needs the extension
(``CREATE EXTENSION pg_ticket``) in a schema on its ``search_path``.

``next_scoped_id`` is gap-free as django-sequences is: call it inside the
``transaction.atomic()`` that saves the row using the number, so the number
commits or rolls back with the row. ``reserve_block`` is the opposite: a
block is used only after its reservation committed, so it runs in a
transaction of its own and refuses to run inside one.
"""

from typing import Tuple

from django.db import connections, transaction


def next_scoped_id(queue: str, domain: str, using: str = "default") -> int:
    """The next value of the scope (queue, domain): 1, 2, 3, ... with no gap.

    Raises TransactionManagementError outside ``transaction.atomic()``: in
    autocommit the number would commit at once, and a row that then fails
    to save would leave a gap.
    """
    connection = connections[using]
    if not connection.in_atomic_block:
        raise transaction.TransactionManagementError(
            "pg_ticket.django.next_scoped_id must run inside transaction.atomic(): "
            "its number is gap-free only if it commits with the row that uses it"
        )
    with connection.cursor() as cursor:
        cursor.execute("SELECT next_scoped_id(%s, %s)", [queue, domain])
        return cursor.fetchone()[0]


def reserve_block(name: str, size: int, using: str = "default") -> Tuple[int, int]:
    """(first_id, last_id): ``size`` IDs of the block counter ``name``, committed.

    Raises TransactionManagementError inside ``transaction.atomic()``: a
    reservation rolled back with the caller's transaction would hand the
    same IDs out again, to whoever reserves next.
    """
    connection = connections[using]
    if connection.in_atomic_block:
        raise transaction.TransactionManagementError(
            "pg_ticket.django.reserve_block must run outside transaction.atomic(): "
            "a block may be used only after its reservation committed"
        )
    with transaction.atomic(using=using):
        with connection.cursor() as cursor:
            cursor.execute("SELECT first_id, last_id FROM reserve_block(%s, %s)", [name, size])
            first_id, last_id = cursor.fetchone()
    return first_id, last_id
