"""pg_ticket for Python: IDs that never collide, from PostgreSQL.

- ``LeasedGenerator``: snowflake IDs made in this process, on a machine id
  leased from a pg_ticket registry (the Rust client's protocol, clocks and
  checks: one implementation).
- ``BlockPool``: IDs from blocks taken with ``reserve_block``.
- ``decode``: an ID's time, machine id and sequence.
- ``PublicKey``: an ID's public form under a key (docs/public-ids.md),
  encoded and decoded as the server's ``pgticket.public_id`` does.
- ``pg_ticket.django`` and ``pg_ticket.sqlalchemy``: the SQL allocators
  (``next_scoped_id``, ``reserve_block``) from those frameworks.

See docs/python.md of the pg_ticket repository.
"""

from datetime import datetime, timezone
from typing import Tuple, Union

from ._native import (
    BlockPool,
    BlocksExhausted,
    ClockError,
    Closed,
    Error,
    Forked,
    InvalidConfig,
    LeasedGenerator,
    LeaseLost,
    NoLease,
    PublicKey,
    decode_ms,
)

__all__ = [
    "LeasedGenerator",
    "BlockPool",
    "decode",
    "PublicKey",
    "Error",
    "InvalidConfig",
    "NoLease",
    "LeaseLost",
    "ClockError",
    "BlocksExhausted",
    "Closed",
    "Forked",
]

__version__ = "0.5.0"


def decode(id: int, machine_bits: int = 10, epoch: Union[str, int] = "2026-01-01") -> Tuple[datetime, int, int]:
    """(time as an aware UTC datetime, machine id, sequence) of a snowflake ID.

    ``machine_bits`` and ``epoch`` are the registry's (or server's)
    ``pg_ticket.machine_bits`` and ``pg_ticket.epoch``, the epoch in the
    setting's syntax or as Unix ms; a generator has them as
    ``.machine_bits`` and ``.epoch_ms``.
    Raises ValueError for a negative ID or a layout or epoch that is none.
    """
    if isinstance(epoch, int) and not isinstance(epoch, bool):
        # Unix ms (a generator's .epoch_ms): the parts from the Unix epoch.
        unix_ms, machine_id, sequence = decode_ms(id, machine_bits, "1970-01-01")
        unix_ms += epoch
    else:
        unix_ms, machine_id, sequence = decode_ms(id, machine_bits, epoch)
    seconds, ms = divmod(unix_ms, 1000)
    at = datetime.fromtimestamp(seconds, tz=timezone.utc).replace(microsecond=ms * 1000)
    return at, machine_id, sequence
