"""Servers for the Python tier: throwaway clusters made by scripts/cluster.sh
(the PostgreSQL of $PG_CONFIG, 15 by default), pg_ticket preloaded, the
extension created and a new registry's hold-off ended (it is new to its
fleet)."""

import os
import signal
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "scripts" / "cluster.sh"


class Server:
    def __init__(self, name, port, conf):
        self.dir = Path(f"/tmp/pgt-py-{name}")
        self.port = port
        subprocess.run([str(CLUSTER), "start", str(self.dir), str(port), *conf], check=True, stdout=subprocess.DEVNULL)
        with self.connect() as db:
            db.execute("CREATE EXTENSION pg_ticket")
            db.execute("SELECT pgticket.end_lease_hold_off()")

    @property
    def dsn(self):
        return f"host={self.dir} port={self.port} user=postgres dbname=postgres"

    def connect(self, **kwargs):
        return psycopg.connect(self.dsn, autocommit=True, **kwargs)

    def execute(self, sql, params=()):
        with self.connect() as db:
            db.execute(sql, params)

    def fresh_db(self, name, schema=None):
        """A new database `name` (dropped first if it exists) with the
        extension, in `schema` (created) if given."""
        self.execute(f"DROP DATABASE IF EXISTS {name}")
        self.execute(f"CREATE DATABASE {name}")
        with self.connect(dbname=name) as db:
            if schema is None:
                db.execute("CREATE EXTENSION pg_ticket")
            else:
                db.execute(f'CREATE SCHEMA "{schema}"')
                db.execute(f'CREATE EXTENSION pg_ticket SCHEMA "{schema}"')

    def query(self, sql, params=()):
        with self.connect() as db:
            return db.execute(sql, params).fetchall()

    def stop(self, mode="fast"):
        subprocess.run([str(CLUSTER), "stop", str(self.dir), mode], check=True, stdout=subprocess.DEVNULL)

    def up(self):
        subprocess.run([str(CLUSTER), "up", str(self.dir)], check=True, stdout=subprocess.DEVNULL)

    def processes(self):
        """The postmaster and every child of it."""
        postmaster = int((self.dir / "data" / "postmaster.pid").read_text().split()[0])
        children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True).stdout.split()
        return [postmaster, *map(int, children)]

    def signal_all(self, sig):
        for pid in self.processes():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


@pytest.fixture(scope="session")
def registry():
    """A registry with a 1 s margin and ttls of at most 3 s: leases end,
    and ids come free, within seconds."""
    server = Server("registry", 55700, ["pg_ticket.lease_margin = '1s'", "pg_ticket.lease_max_ttl = '3s'"])
    yield server
    server.stop("immediate")


@pytest.fixture()
def own_registry(request):
    """A registry of the test's own, for tests that stop or freeze it."""
    server = Server("own", 55701, ["pg_ticket.lease_margin = '1s'", "pg_ticket.lease_max_ttl = '3s'"])
    yield server
    server.signal_all(signal.SIGCONT)
    server.stop("immediate")


# A schema name its drivers would misread if pasted into SQL as it is: "%"
# is psycopg's placeholder, ":x" SQLAlchemy's bind parameter.
ODD_SCHEMA = "ids%%:x"


@pytest.fixture(scope="session")
def odd_schema_db(registry):
    """Database py_schema: the extension in ODD_SCHEMA, off the search_path,
    and decoys of both functions where a misread name or the search_path
    would lead (public, and the name with "%%" read as "%")."""
    registry.fresh_db("py_schema", schema=ODD_SCHEMA)
    with registry.connect(dbname="py_schema") as db:
        for schema in ["public", ODD_SCHEMA.replace("%%", "%")]:
            db.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            db.execute(f'CREATE FUNCTION "{schema}".next_scoped_id(text, text) RETURNS bigint LANGUAGE sql AS $$SELECT 42::bigint$$')
            db.execute(
                f'CREATE FUNCTION "{schema}".reserve_block(text, bigint) RETURNS TABLE(first_id bigint, last_id bigint)'
                " LANGUAGE sql AS $$SELECT 42::bigint, 42::bigint$$"
            )
    return "py_schema"


def wait_until(what, condition, seconds=20.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.05)
