"""pg_ticket.LeasedGenerator against a real registry: the Rust client's
protocol through Python."""

import signal
import subprocess
import sys
import threading
import time
from array import array
from datetime import datetime, timedelta, timezone

import pytest

import pg_ticket
from conftest import wait_until


def state_of(registry, machine_id):
    rows = registry.query("SELECT state, holder, last_issued_ms FROM pgticket.machine_ids WHERE machine_id = %s", (machine_id,))
    return rows[0] if rows else None


def test_a_generator_leases_issues_and_releases_on_close(registry):
    g = pg_ticket.LeasedGenerator(registry.dsn, "py-basic", ttl=3.0)
    machine_id = g.machine_id
    assert machine_id is not None and g.lease is not None
    assert state_of(registry, machine_id)[:2] == ("held", "py-basic")
    ids = [g.next_id() for _ in range(20_000)] + g.next_ids(20_000)
    assert ids == sorted(ids) and len(set(ids)) == len(ids) == 40_000
    # Read back in the registry's space, as the server reads it.
    at, mid, seq = pg_ticket.decode(ids[-1], g.machine_bits, "2026-01-01")
    assert mid == machine_id
    assert abs(datetime.now(timezone.utc) - at) < timedelta(seconds=5)
    server = registry.query("SELECT created_at, machine_id, sequence FROM snowflake_decode(%s)", (ids[-1],))[0]
    assert (server[0], server[1], server[2]) == (at, mid, seq)
    last_stamp_ms = (ids[-1] >> 22) + g.epoch_ms
    g.close()
    state, _, last_issued_ms = state_of(registry, machine_id)
    assert state == "released"
    assert last_issued_ms >= last_stamp_ms, "the release reports the last stamp"
    with pytest.raises(pg_ticket.Closed):
        g.next_id()
    g.close()  # twice is nothing


def test_a_with_block_releases_its_lease(registry):
    with pg_ticket.LeasedGenerator(registry.dsn, "py-with", ttl=3.0) as g:
        g.next_id()
        machine_id = g.machine_id
    assert state_of(registry, machine_id)[0] == "released"
    with pytest.raises(pg_ticket.Error):
        g.next_ids(1)


def test_bad_settings_are_refused_before_anything_starts():
    with pytest.raises(pg_ticket.InvalidConfig):
        pg_ticket.LeasedGenerator("host=/nowhere", "x", ttl=0.5)
    with pytest.raises(pg_ticket.InvalidConfig):
        pg_ticket.LeasedGenerator("host=/nowhere", "x", wait=-1)
    for holder in ["", "a\0b", "h" * 256]:
        with pytest.raises(pg_ticket.InvalidConfig, match="holder"):
            pg_ticket.LeasedGenerator("host=/nowhere", holder)
    started = time.monotonic()
    with pytest.raises(pg_ticket.NoLease) as e:
        pg_ticket.LeasedGenerator("host=/nowhere port=1 connect_timeout=1", "x", wait=0.3)
    assert time.monotonic() - started < 5
    assert isinstance(e.value, pg_ticket.Error)
    with pytest.raises(ValueError):
        pg_ticket.decode(-1)
    with pytest.raises(ValueError):
        pg_ticket.decode(1, machine_bits=40)
    with pytest.raises(ValueError):
        pg_ticket.decode(1, epoch="yesterday")


def test_decode_reads_the_layout():
    epoch = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert pg_ticket.decode(0) == (epoch, 0, 0)
    assert pg_ticket.decode((5 << 22) | (3 << 12) | 7) == (epoch + timedelta(milliseconds=5), 3, 7)
    assert pg_ticket.decode((5 << 22) | (3 << 6) | 7, machine_bits=16) == (epoch + timedelta(milliseconds=5), 3, 7)
    assert pg_ticket.decode(1 << 22, epoch="2020-01-01") == (datetime(2020, 1, 1, 0, 0, 0, 1000, tzinfo=timezone.utc), 0, 0)


class Drawing:
    """IDs drawn in a thread until stopped, with when each failure began."""

    def __init__(self, generator):
        self.generator = generator
        self.ids = []
        self.errors = []
        self.last_ok = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            try:
                self.ids.extend(self.generator.next_ids(100))
                self.last_ok = time.monotonic()
            except pg_ticket.Error as e:
                self.errors.append((time.monotonic(), type(e).__name__))
                time.sleep(0.005)

    def finish(self):
        self.stop.set()
        self.thread.join()
        assert len(set(self.ids)) == len(self.ids), "an ID twice"
        return self.ids


def test_a_generator_goes_on_across_a_registry_restart(own_registry):
    g = pg_ticket.LeasedGenerator(own_registry.dsn, "py-restart", ttl=3.0)
    drawing = Drawing(g)
    wait_until("IDs", lambda: len(drawing.ids) > 10_000)
    own_registry.stop("fast")
    time.sleep(1.0)
    own_registry.up()
    before = len(drawing.ids)
    restarted = time.monotonic()
    wait_until("IDs after the restart", lambda: len(drawing.ids) > before + 10_000 and drawing.last_ok > restarted + 1)
    ids = drawing.finish()
    g.close()
    assert ids == sorted(ids)


def test_a_generator_stops_when_its_lease_may_have_ended_and_leases_again(own_registry):
    """The registry frozen (SIGSTOP) past the ttl: no renewal, so the
    generator must stop issuing within its ttl, by its own clock."""
    g = pg_ticket.LeasedGenerator(own_registry.dsn, "py-frozen", ttl=2.0)
    first_lease = g.lease
    drawing = Drawing(g)
    wait_until("IDs", lambda: len(drawing.ids) > 10_000)
    frozen_at = time.monotonic()
    own_registry.signal_all(signal.SIGSTOP)
    try:
        wait_until("a refusal", lambda: any(t > frozen_at for t, _ in drawing.errors), seconds=10)
        time.sleep(1.5)
        kept_issuing = drawing.last_ok - frozen_at
        refusals = {name for t, name in drawing.errors if t > frozen_at}
        count_while_frozen = len(drawing.ids)
        time.sleep(0.5)
        assert len(drawing.ids) == count_while_frozen, "issued after refusing"
    finally:
        own_registry.signal_all(signal.SIGCONT)
    print(f"kept issuing {kept_issuing:.3f} s after the freeze; refusals {refusals}")
    # The lease is reckoned from the last renewal's request, sent before the
    # freeze: no stamp 2 s after it. The slack is the time between a stamp
    # and the return of the call that made it (this thread waits for the GIL).
    assert kept_issuing < 2.0 + 0.3, f"issued {kept_issuing:.2f} s after the registry froze: past the 2 s ttl"
    assert refusals <= {"LeaseLost", "NoLease"}, refusals
    wait_until("a new lease", lambda: g.lease not in (None, first_lease) and drawing.last_ok > time.monotonic() - 0.5, seconds=30)
    ids = drawing.finish()
    g.close()
    assert ids == sorted(ids)


WORKER = """
import sys
from array import array
import pg_ticket
dsn, holder, count, out = sys.argv[1:]
with pg_ticket.LeasedGenerator(dsn, holder, ttl=3.0, wait=30.0) as g:
    ids = array("q")
    count = int(count)
    while len(ids) < count:
        ids.extend(g.next_ids(min(1000, count - len(ids))))
with open(out, "wb") as f:
    ids.tofile(f)
"""


def test_four_processes_make_a_million_ids_with_none_twice(registry, tmp_path):
    outs = [tmp_path / f"ids-{i}" for i in range(4)]
    procs = [
        subprocess.Popen([sys.executable, "-c", WORKER, registry.dsn, f"py-fleet-{i}", "250000", str(out)]) for i, out in enumerate(outs)
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0
    ids = array("q")
    for out in outs:
        ids.frombytes(out.read_bytes())
    assert len(ids) == 1_000_000
    assert len(set(ids)) == 1_000_000
    machines = {(i >> 12) & 1023 for i in ids}
    assert len(machines) >= 4, "each process on a machine id of its own"


FORKED = """
import os, sys
import pg_ticket
dsn = sys.argv[1]
g = pg_ticket.LeasedGenerator(dsn, "py-fork", ttl=3.0)
pool = pg_ticket.BlockPool(dsn, "py-fork", 10)
parent_ids = g.next_ids(10)
parent_machine_id = g.machine_id
pool.next_id()
pid = os.fork()
if pid == 0:
    # The child's copies would issue the parent's IDs again: refused.
    for call in (g.next_id, lambda: g.next_ids(1), pool.next_id):
        try:
            call()
            os._exit(3)
        except pg_ticket.Forked:
            pass
    g.close()  # nothing to release here: the lease is the parent's
    mine = pg_ticket.LeasedGenerator(dsn, "py-fork-child", ttl=3.0)
    assert mine.machine_id != parent_machine_id
    mine.close()
    sys.exit(0)  # a normal exit: the inherited objects are dropped without their threads
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
assert g.next_id() > parent_ids[-1]
pool.next_id()
g.close()
pool.close()
print("ok")
"""


def test_an_inherited_generator_or_pool_refuses_in_a_forked_child(registry):
    done = subprocess.run([sys.executable, "-c", FORKED, registry.dsn], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


CLOSE_DURING_A_CALL = """
import sys, threading, time
import pg_ticket
g = pg_ticket.LeasedGenerator(sys.argv[1], "py-close-race", ttl=3.0)
outcome = []
def draw():
    try:
        g.next_ids(50_000_000)
        outcome.append("finished")
    except pg_ticket.Closed:
        outcome.append("closed")
t = threading.Thread(target=draw)
t.start()
time.sleep(0.2)
ticks = []
ticker = threading.Thread(target=lambda: [ticks.append(time.sleep(0.01)) for _ in range(50)])
ticker.start()
g.close()
t.join()
ticker.join()
assert outcome == ["closed"], outcome
assert len(ticks) == 50
print("ok")
"""


def test_close_waits_for_a_call_under_way_without_stopping_other_threads(registry):
    """close() while another thread is in next_ids: the call ends (its
    current slice made, the rest refused as Closed), close() returns, and
    other threads run meanwhile; in a process of its own, so that the two
    waiting for each other (0.4.0's first cut: close() waited for the lock
    holding the GIL, the caller for the GIL holding the lock) fails the
    test instead of hanging it."""
    done = subprocess.run([sys.executable, "-c", CLOSE_DURING_A_CALL, registry.dsn], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


FORK_DURING_A_CALL = """
import os, sys, threading, time
import pg_ticket
pool = pg_ticket.BlockPool("host=/nowhere port=1", "x", 10, wait=3.0)
def waiting():
    try:
        pool.next_id()
    except pg_ticket.BlocksExhausted:
        pass
t = threading.Thread(target=waiting)
t.start()
time.sleep(0.3)  # the thread is inside next_id, holding the pool's lock
pid = os.fork()
if pid == 0:
    try:
        pool.next_id()
        os._exit(3)
    except pg_ticket.Forked:
        pass
    pool.close()  # must not wait for a lock held by a thread the child does not have
    sys.exit(0)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
t.join()
pool.close()
print("ok")
"""


def test_a_fork_while_another_thread_is_inside_a_call_hangs_nothing():
    done = subprocess.run([sys.executable, "-c", FORK_DURING_A_CALL], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_decode_takes_the_epoch_as_a_generator_gives_it(registry):
    """#48 item 2: docs/python.md decoded with ``generator.epoch_ms`` (an int),
    which raised TypeError; the setting's text gives the same parts."""
    with pg_ticket.LeasedGenerator(registry.dsn, holder="decode-epoch", wait=60.0) as generator:
        flake = generator.next_id()
        by_ms = pg_ticket.decode(flake, generator.machine_bits, generator.epoch_ms)
        by_text = pg_ticket.decode(flake, generator.machine_bits, "2026-01-01")
        assert by_ms == by_text
        assert by_ms[1] == generator.machine_id
