#!/usr/bin/env bash
# The docs tier: every ```sql block of README.md and docs/*.md, run as
# written, in order, one fresh database per page, on a temporary preloaded
# instance of the PostgreSQL of $PG_CONFIG (make install first); the output
# is compared with tests/docs/expected/<page>.out (pg_regress), so an
# example that stops working, or starts answering otherwise, fails.
# DOCS_UPDATE=1 copies the results over the expected files (review the diff).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
bindir=$("$PG_CONFIG" --bindir)
pg_regress=$(dirname "$("$PG_CONFIG" --pgxs)")/../test/regress/pg_regress
pages=(README.md docs/reference.md docs/leases.md docs/operations.md)

work=$(mktemp -d /tmp/pgt-docs.XXXX)
mkdir -p "$work/sql" "$work/expected"
tests=()
for page in "${pages[@]}"; do
    name=$(basename "$page" .md | tr '[:upper:]' '[:lower:]')
    [ "$page" = README.md ] && name=readme
    {
        echo "-- The \`\`\`sql blocks of $page, in order (scripts/docs-test.sh)."
        echo "CREATE DATABASE docs_$name;"
        echo "\\c docs_$name"
        echo "SET TimeZone = 'UTC'; SET DateStyle = 'ISO';"
        blocks=$(awk '/^```sql[[:space:]]*$/ { inside = 1; next } /^```/ { inside = 0 } inside' "$root/$page")
        # A page that does not create the extension itself assumes it.
        grep -q 'CREATE EXTENSION pg_ticket' <<<"$blocks" || echo "CREATE EXTENSION pg_ticket;"
        printf '%s\n' "$blocks"
    } >"$work/sql/docs_$name.sql"
    tests+=("docs_$name")
    if [ -f "$root/tests/docs/expected/docs_$name.out" ]; then
        cp "$root/tests/docs/expected/docs_$name.out" "$work/expected/"
    else
        : >"$work/expected/docs_$name.out" # a new page: DOCS_UPDATE=1 writes it
    fi
done
printf "shared_preload_libraries = 'pg_ticket'\npg_ticket.machine_id = 7\npg_ticket.shards = '0-63'\n" >"$work/preload.conf"
if [ "$(id -u)" = 0 ]; then chown -R postgres: "$work"; fi
as_owner() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
status=0
as_owner "$pg_regress" --bindir="$bindir" --inputdir="$work" --outputdir="$work" \
    --temp-instance="$work/tmp_check" --temp-config="$work/preload.conf" --port=55498 \
    --dbname=regression "${tests[@]}" || status=$?
if [ "${DOCS_UPDATE:-}" = 1 ]; then
    mkdir -p "$root/tests/docs/expected"
    cp "$work"/results/*.out "$root/tests/docs/expected/"
    status=0
elif [ $status != 0 ] && [ -f "$work/regression.diffs" ]; then
    cat "$work/regression.diffs"
fi
rm -rf "$work"
exit $status
