"""Snowflake IDs made in this process, no round trip per ID
(docs/python.md): one leased generator per process, made at its first use,
so in a pre-forking server (gunicorn, uWSGI) in each worker after the fork,
and closed at the process's exit, which gives its machine id back at once."""

import atexit
import os
import socket
import threading

import pg_ticket
from django.conf import settings

_lock = threading.Lock()
_generator = None
_made_in = None  # the process that made it


def next_id():
    global _generator, _made_in
    with _lock:
        # One inherited through a fork is the parent's (it raises Forked
        # here): the child leases its own machine id.
        if _generator is None or _made_in != os.getpid():
            _generator = pg_ticket.LeasedGenerator(
                settings.PG_TICKET_REGISTRY, holder=f"{socket.gethostname()}-{os.getpid()}", wait=90.0
            )
            _made_in = os.getpid()
        generator = _generator
    return generator.next_id()


@atexit.register
def _close():
    if _generator is not None and _made_in == os.getpid():
        _generator.close()
