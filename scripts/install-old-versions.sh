#!/usr/bin/env bash
# Installs the install scripts of earlier releases next to the current one,
# so `CREATE EXTENSION pg_ticket VERSION '0.1.0'` works (the upgrade test
# starts there). Usage: install-old-versions.sh PG_CONFIG
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
extdir="$("${1:?pg_config}" --sharedir)/extension"
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
for script in "$root"/sql/pg_ticket--*.generated.sql; do
    name=$(basename "$script" .generated.sql)
    $SUDO install -m 644 "$script" "$extdir/$name.sql"
done
