#!/usr/bin/env bash
# The pg-ticket wheel (crates/ticket-py), release build, into target/wheels/
# (one abi3 wheel for CPython 3.9 and later). Needs Rust (cargo) and
# python3 with venv only, not the server toolchain of `make setup` (#48
# item 5): maturin comes from the Python tier's venv where `make setup`
# made one, else from a venv of its own under target/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
MATURIN_VERSION=1.16.0
maturin=${MATURIN:-/opt/pgt-py/bin/maturin}
if [ ! -x "$maturin" ]; then
    venv="$root/target/py-wheel-venv"
    if [ ! -x "$venv/bin/maturin" ]; then
        echo "python-wheel: installing maturin $MATURIN_VERSION into $venv"
        python3 -m venv "$venv"
        "$venv/bin/pip" install -q "maturin==$MATURIN_VERSION"
    fi
    maturin="$venv/bin/maturin"
fi
rm -f "$root"/target/wheels/pg_ticket-*.whl
"$maturin" build --quiet --release -m "$root/crates/ticket-py/Cargo.toml" -o "$root/target/wheels"
