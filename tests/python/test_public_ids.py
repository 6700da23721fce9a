"""pg_ticket.PublicKey (#50): the vectors SQL and Rust share
(ticket_core::public_id, tests/integration/tests/public_ids.rs), round
trips over the range's edges, mistyped forms refused."""

import random

import pytest

import pg_ticket

VECTORS = [
    (0, "01AHN4TC7RHJWK0"),
    (1, "0G9P3KZK4JK77JC"),
    (2, "0F7VNYDRHB74GNS"),
    (42, "0F8R8BWDRQ5F6SB"),
    (1000000, "0QK1R1QA2MW62CA"),
    (2**63 - 1, "0N1K0PTREZBAR34"),
    (-1, "011XZ2HEGG8ZSHS"),
    (-(2**63), "05JNEXGYWDHWZ83"),
]


def test_forms_match_the_shared_vectors():
    key = pg_ticket.PublicKey(bytes(range(32)), version=1)
    for id, form in VECTORS:
        assert key.encode(id) == form
        assert key.decode(form.lower()) == id
        assert key.decode(f"{form[:5]}-{form[5:10]}-{form[10:]}") == id


def test_round_trips_and_refusals():
    key = pg_ticket.PublicKey(bytes(random.Random(7).randrange(256) for _ in range(32)), version=3)
    rng = random.Random(11)
    ids = [-(2**63), -(2**63) + 1, -1, 0, 1, 2**63 - 2, 2**63 - 1] + [rng.randrange(-(2**63), 2**63) for _ in range(2000)]
    for id in ids:
        form = key.encode(id)
        assert len(form) == 15 and form[0] == "2", form
        assert key.decode(form) == id
    form = key.encode(123)
    typo = form[:7] + ("X" if form[7] != "X" else "Y") + form[8:]
    with pytest.raises(ValueError, match="invalid public ID"):
        key.decode(typo)
    with pytest.raises(ValueError):
        pg_ticket.PublicKey(b"short")
    with pytest.raises(ValueError):
        pg_ticket.PublicKey(bytes(32), version=0)
    with pytest.raises(OverflowError):
        key.encode(2**63)
