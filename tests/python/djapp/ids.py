"""Snowflake IDs made in this process, no round trip per ID
(docs/python.md): one leased generator per process, made at its first use,
so in a pre-forking server (gunicorn, uWSGI) in each worker after the fork,
and closed at the process's exit, which releases its machine id."""

import atexit
import os
import socket
import threading

import pg_ticket
from django.conf import settings

_lock = threading.Lock()
_generator = None


def _start_afresh():
    # A fork copies the parent's generator (it raises Forked here) and the
    # lock as it was, held if another thread had it: the child has its own.
    global _lock, _generator
    _lock = threading.Lock()
    _generator = None


os.register_at_fork(after_in_child=_start_afresh)


def next_id():
    global _generator
    generator = _generator
    if generator is None:
        # Made outside the lock (the first lease may wait for the registry);
        # a thread that lost the race gives its lease back.
        made = pg_ticket.LeasedGenerator(
            settings.PG_TICKET_REGISTRY, holder=f"{socket.gethostname()}-{os.getpid()}", wait=90.0
        )
        with _lock:
            if _generator is None:
                _generator, made = made, None
            generator = _generator
        if made is not None:
            made.close()
    return generator.next_id()


@atexit.register
def _close():
    if _generator is not None:
        _generator.close()
