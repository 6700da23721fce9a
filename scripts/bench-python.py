"""`make bench`: the Python package's leased generator in one thread, on the
registry given (a libpq connection string): IDs in one second through
next_id() and through next_ids(1000), the median of three runs each.
Run with the Python of the venv the wheel is installed in."""

import statistics
import sys
import time

import pg_ticket


def rate(draw, per_call):
    started = time.perf_counter()
    made = 0
    while time.perf_counter() - started < 1.0:
        draw()
        made += per_call
    return made / (time.perf_counter() - started)


def main():
    dsn = sys.argv[1]
    with pg_ticket.LeasedGenerator(dsn, "bench-python", ttl=30.0, wait=90.0) as generator:
        one = statistics.median(rate(generator.next_id, 1) for _ in range(3))
        batch = statistics.median(rate(lambda: generator.next_ids(1000), 1000) for _ in range(3))
    print(f"next_id {one:.0f}")
    print(f"next_ids {batch:.0f}")


if __name__ == "__main__":
    main()
