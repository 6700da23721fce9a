"""pg_ticket's SQL allocators from SQLAlchemy 2 (``pip install pg-ticket[sqlalchemy]``).

Plain SQL; the database needs the extension (``CREATE EXTENSION
pg_ticket``) in a schema on its ``search_path``.

``next_scoped_id`` runs in the session's (or connection's) transaction: the
number is gap-free when it commits with the row that uses it.
``reserve_block`` takes the Engine and commits the reservation in a
transaction of its own before it returns: a block is used only after its
reservation committed.
"""

from typing import Tuple, Union

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session


def next_scoped_id(session: Union[Session, Connection], queue: str, domain: str) -> int:
    """The next value of the scope (queue, domain), in the caller's transaction."""
    return session.execute(text("SELECT next_scoped_id(:queue, :domain)"), {"queue": queue, "domain": domain}).scalar_one()


def reserve_block(engine: Engine, name: str, size: int) -> Tuple[int, int]:
    """(first_id, last_id): ``size`` IDs of the block counter ``name``, committed."""
    if not isinstance(engine, Engine):
        raise TypeError(
            "pg_ticket.sqlalchemy.reserve_block takes the Engine: it commits the reservation "
            "in a transaction of its own (a block is used only after its reservation committed)"
        )
    with engine.begin() as connection:
        row = connection.execute(text("SELECT first_id, last_id FROM reserve_block(:name, :size)"), {"name": name, "size": size}).one()
    return row.first_id, row.last_id
