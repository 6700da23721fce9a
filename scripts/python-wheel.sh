#!/usr/bin/env bash
# The pg-ticket wheel (crates/ticket-py), release build, into target/wheels/
# (one abi3 wheel for CPython 3.9 and later), by the maturin of the Python
# tools' venv (scripts/setup.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rm -f "$root"/target/wheels/pg_ticket-*.whl
/opt/pgt-py/bin/maturin build --quiet --release -m "$root/crates/ticket-py/Cargo.toml" -o "$root/target/wheels"
