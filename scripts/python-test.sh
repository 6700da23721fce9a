#!/usr/bin/env bash
# `make test-python`: the Python package (crates/ticket-py) built as a wheel
# by maturin, installed into the Python tools' venv (scripts/setup.sh), and
# tests/python run with pytest against servers of the PostgreSQL of
# $PG_CONFIG (the extension installed: `make test-python` does that first).
# The examples test also installs the wheel alone into a fresh venv.
# Extra arguments go to pytest (-k NAME, -x).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=/opt/pgt-py
"$root/scripts/python-wheel.sh"
wheel=$(ls "$root"/target/wheels/pg_ticket-0.5.0-*.whl)
"$venv/bin/pip" install -q --force-reinstall --no-deps "$wheel"
cd "$root/tests/python"
PG_TICKET_WHEEL=$wheel "$venv/bin/pytest" -q -p no:cacheprovider "$@"
