"""pg_ticket.BlockPool against a real server."""

import threading
import time

import pytest

import pg_ticket


def test_a_pool_hands_out_its_blocks_once_and_says_what_it_left(registry):
    with pg_ticket.BlockPool(registry.dsn, "py-pool", 100) as pool:
        ids = [pool.next_id() for _ in range(1_050)]
        assert len(set(ids)) == len(ids)
        # From whole blocks reserved on the server: every ID at or below its mark.
        mark = registry.query("SELECT last_id FROM reserve_block('py-pool', 1)")[0][0] - 1
        assert max(ids) <= mark
        left = pool.close()
    assert sum(last - first + 1 for first, last in left) >= 1, "the rest of the current block"
    handed = set(ids)
    assert all(i not in handed for first, last in left for i in range(first, last + 1))
    with pytest.raises(pg_ticket.Closed):
        pool.next_id()


def test_pools_in_threads_share_no_id(registry):
    pools = [pg_ticket.BlockPool(registry.dsn, "py-threads", 50) for _ in range(4)]
    drawn = [[] for _ in pools]

    def draw(pool, out):
        for _ in range(5_000):
            out.append(pool.next_id())

    threads = [threading.Thread(target=draw, args=(p, out)) for p, out in zip(pools, drawn)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in pools:
        p.close()
    every = [i for out in drawn for i in out]
    assert len(every) == 20_000 and len(set(every)) == 20_000


def test_a_name_the_server_refuses_for_good_ends_the_wait_at_once(registry):
    """helper-11 (#48): 128 two-byte characters pass the client's check (a
    LATIN1 server would take them) but are 256 bytes here: next_id said so
    only after its whole wait, every call."""
    with pg_ticket.BlockPool(registry.dsn, "\u00e9" * 128, 10, wait=30.0) as pool:
        for _ in range(2):
            started = time.monotonic()
            with pytest.raises(pg_ticket.BlocksExhausted, match="255 bytes"):
                pool.next_id()
            assert time.monotonic() - started < 5


def test_a_pool_without_a_server_gives_up_after_its_wait():
    with pytest.raises(pg_ticket.InvalidConfig):
        pg_ticket.BlockPool("host=/nowhere", "x", 0)
    for name in ["", "a\0b", "n" * 256]:
        with pytest.raises(pg_ticket.InvalidConfig, match="name"):
            pg_ticket.BlockPool("host=/nowhere", name, 10)
    with pg_ticket.BlockPool("host=/nowhere port=1", "x", 10, wait=0.3) as pool:
        started = time.monotonic()
        with pytest.raises(pg_ticket.BlocksExhausted):
            pool.next_id()
        assert time.monotonic() - started < 3
