"""pg_ticket.sqlalchemy on a real server: numbers commit or roll back with
the session's transaction; blocks are committed before they are returned."""

import threading

import pytest

sqlalchemy = pytest.importorskip("sqlalchemy")
from sqlalchemy import BigInteger, String, UniqueConstraint, create_engine  # noqa: E402
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column  # noqa: E402

import pg_ticket  # noqa: E402
from pg_ticket.sqlalchemy import next_scoped_id, reserve_block  # noqa: E402


class Base(DeclarativeBase):
    pass


class Invoice(Base):
    __tablename__ = "sa_invoices"
    __table_args__ = (UniqueConstraint("shop", "number"),)
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    shop: Mapped[str] = mapped_column(String(40))
    number: Mapped[int] = mapped_column(BigInteger)


@pytest.fixture(scope="module")
def engine(registry):
    registry.fresh_db("py_sqlalchemy")
    engine = create_engine(f"postgresql+psycopg://postgres@/py_sqlalchemy?host={registry.dir}&port={registry.port}", pool_size=8)
    Base.metadata.create_all(engine)
    yield engine
    engine.dispose()


def test_numbers_follow_the_sessions_transactions(engine):
    def invoices(seed):
        for i in range(60):
            with Session(engine) as session:
                number = next_scoped_id(session, "shop-sa", "invoice/2026")
                session.add(Invoice(shop="sa", number=number))
                if (seed + i) % 4 == 0:
                    session.rollback()
                else:
                    session.commit()

    threads = [threading.Thread(target=invoices, args=(seed,)) for seed in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with Session(engine) as session:
        numbers = sorted(n for (n,) in session.query(Invoice.number).filter(Invoice.shop == "sa"))
    assert len(numbers) == 6 * 60 - sum(1 for seed in range(6) for i in range(60) if (seed + i) % 4 == 0)
    assert numbers == list(range(1, len(numbers) + 1)), "a gap or a number twice"


def test_blocks_are_committed_in_a_transaction_of_their_own(engine):
    assert reserve_block(engine, "sa-blocks", 100) == (1, 100)
    with Session(engine) as session:
        with pytest.raises(TypeError):
            reserve_block(session, "sa-blocks", 100)
        session.rollback()
    # Committed: a rollback elsewhere does not hand the block out again.
    assert reserve_block(engine, "sa-blocks", 100) == (101, 200)


def test_numbers_are_refused_where_they_would_commit_alone(engine):
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        with pytest.raises(pg_ticket.Error):
            next_scoped_id(connection, "shop-sa-ac", "invoice/2026")


def test_the_helpers_call_the_extension_in_its_own_schema(registry, odd_schema_db):
    """The extension in a schema off the search_path whose name text() would
    misread, and decoys where a misread name or the search_path would lead:
    the helpers find pg_ticket's functions, by schema."""
    engine = create_engine(f"postgresql+psycopg://postgres@/{odd_schema_db}?host={registry.dir}&port={registry.port}")
    try:
        with Session(engine) as session:
            assert [next_scoped_id(session, "q-sa", "d") for _ in range(3)] == [1, 2, 3]
            session.commit()
        assert reserve_block(engine, "b-sa", 5) == (1, 5)
    finally:
        engine.dispose()


def test_an_extension_created_again_elsewhere_is_found_on_the_next_call(registry):
    registry.fresh_db("py_moved")
    engine = create_engine(f"postgresql+psycopg://postgres@/py_moved?host={registry.dir}&port={registry.port}", pool_size=1, max_overflow=0)
    try:
        with Session(engine) as session:
            assert next_scoped_id(session, "q", "d") == 1
            session.commit()
        with registry.connect(dbname="py_moved") as db:
            db.execute("DROP EXTENSION pg_ticket")
            db.execute("CREATE SCHEMA elsewhere")
            db.execute("CREATE EXTENSION pg_ticket SCHEMA elsewhere")
        with Session(engine) as session:  # the same connection: its schema was public
            with pytest.raises(sqlalchemy.exc.DBAPIError):
                next_scoped_id(session, "q", "d")
        with Session(engine) as session:
            assert next_scoped_id(session, "q", "d") == 1
            session.commit()
    finally:
        engine.dispose()


def test_the_async_helpers_follow_the_async_sessions_transactions(engine, registry):
    """#48 item 7: AsyncSession (psycopg's async mode): numbers commit or
    roll back with the session's transaction, blocks commit at once."""
    pytest.importorskip("greenlet")
    import asyncio

    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    from pg_ticket.sqlalchemy import next_scoped_id_async, reserve_block_async

    async def run():
        engine = create_async_engine(f"postgresql+psycopg://postgres@/py_sqlalchemy?host={registry.dir}&port={registry.port}")
        async with engine.begin() as connection:
            await connection.run_sync(Base.metadata.create_all)
        kept = []
        for i in range(20):
            async with AsyncSession(engine) as session:
                number = await next_scoped_id_async(session, "shop-async", "invoice/2026")
                session.add(Invoice(shop="async", number=number))
                if i % 3 == 0:
                    await session.rollback()
                else:
                    await session.commit()
                    kept.append(number)
        first, last = await reserve_block_async(engine, "async-blocks", 10)
        with pytest.raises(TypeError):
            await reserve_block_async(AsyncSession(engine), "async-blocks", 10)
        await engine.dispose()
        return kept, (first, last)

    kept, block = asyncio.run(run())
    assert kept == list(range(1, len(kept) + 1)), "gap-free across rolled-back async transactions"
    assert block == (1, 10)


def test_next_ticket_beside_next_scoped_id(engine):
    """#48 item 6: tickets from a session or a connection, increasing."""
    from pg_ticket.sqlalchemy import next_ticket

    with Session(engine) as session:
        first = next_ticket(session, "sa-tickets", "jobs")
    with engine.connect() as connection:
        second = next_ticket(connection, "sa-tickets", "jobs")
    assert second > first
