"""pg_ticket's SQL allocators from SQLAlchemy 2 (``pip install pg-ticket[sqlalchemy]``).

Plain SQL, calling the extension's functions in its own schema (looked up
once per connection; the database needs ``CREATE EXTENSION pg_ticket``).

``next_scoped_id`` runs in the session's (or connection's) transaction: the
number is gap-free when it commits with the row that uses it (refused on an
AUTOCOMMIT connection, where it would commit at once). ``reserve_block``
takes the Engine and commits the reservation in a transaction of its own
before it returns: a block is used only after its reservation committed.

With asyncio (``AsyncSession``, ``AsyncConnection``, ``AsyncEngine``; the
``psycopg`` driver's async mode): ``next_scoped_id_async`` and
``reserve_block_async``, the same calls run through SQLAlchemy's
``run_sync`` on the async connection (``pip install sqlalchemy[asyncio]``).
"""

from typing import Tuple, Union

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from ._native import Error
from ._schema import extension_schema, forget


def _call(connection: Connection, sql: str, params: dict):
    """The result of `sql` ({schema} the extension's), on `connection`."""
    dbapi_connection = connection.connection.dbapi_connection
    schema = extension_schema(dbapi_connection, lambda lookup: connection.execute(text(lookup)).scalar())
    # text() reads ":name" as a bind parameter, even inside quotes.
    statement = text(sql.format(schema=schema.replace(":", "\\:")))
    try:
        return connection.execute(statement, params)
    except Exception:
        forget(dbapi_connection)
        raise


def next_scoped_id(session: Union[Session, Connection], queue: str, domain: str) -> int:
    """The next value of the scope (queue, domain), in the caller's transaction."""
    connection = session.connection() if isinstance(session, Session) else session
    if getattr(connection.connection.dbapi_connection, "autocommit", False):
        raise Error(
            "pg_ticket.sqlalchemy.next_scoped_id on an AUTOCOMMIT connection: "
            "its number is gap-free only if it commits with the row that uses it"
        )
    return _call(connection, "SELECT {schema}.next_scoped_id(:queue, :domain)", {"queue": queue, "domain": domain}).scalar_one()


def next_ticket(session: Union[Session, Connection], queue: str, domain: str) -> int:
    """The next ticket of (queue, domain): unique and increasing on this
    server, never reused, not transactional (any connection)."""
    connection = session.connection() if isinstance(session, Session) else session
    return _call(connection, "SELECT {schema}.next_ticket(:queue, :domain)", {"queue": queue, "domain": domain}).scalar_one()


def reserve_block(engine: Engine, name: str, size: int) -> Tuple[int, int]:
    """(first_id, last_id): ``size`` IDs of the block counter ``name``, committed."""
    if not isinstance(engine, Engine):
        raise TypeError(
            "pg_ticket.sqlalchemy.reserve_block takes the Engine: it commits the reservation "
            "in a transaction of its own (a block is used only after its reservation committed)"
        )
    with engine.begin() as connection:
        row = _call(connection, "SELECT first_id, last_id FROM {schema}.reserve_block(:name, :size)", {"name": name, "size": size}).one()
    return row.first_id, row.last_id


async def next_scoped_id_async(session, queue: str, domain: str) -> int:
    """``next_scoped_id`` for an ``AsyncSession`` or ``AsyncConnection``."""
    from sqlalchemy.ext.asyncio import AsyncSession

    connection = await session.connection() if isinstance(session, AsyncSession) else session
    return await connection.run_sync(next_scoped_id, queue, domain)


async def next_ticket_async(session, queue: str, domain: str) -> int:
    """``next_ticket`` for an ``AsyncSession`` or ``AsyncConnection``."""
    from sqlalchemy.ext.asyncio import AsyncSession

    connection = await session.connection() if isinstance(session, AsyncSession) else session
    return await connection.run_sync(next_ticket, queue, domain)


async def reserve_block_async(engine, name: str, size: int) -> Tuple[int, int]:
    """``reserve_block`` for an ``AsyncEngine``: committed before it returns."""
    from sqlalchemy.ext.asyncio import AsyncEngine

    if not isinstance(engine, AsyncEngine):
        raise TypeError(
            "pg_ticket.sqlalchemy.reserve_block_async takes the AsyncEngine: it commits the reservation "
            "in a transaction of its own (a block is used only after its reservation committed)"
        )
    async with engine.begin() as connection:
        row = (
            await connection.run_sync(
                lambda sync: _call(sync, "SELECT first_id, last_id FROM {schema}.reserve_block(:name, :size)", {"name": name, "size": size}).one()
            )
        )
    return row.first_id, row.last_id
