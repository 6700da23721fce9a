#!/usr/bin/env bash
# The docs tier: every ```sql block of README.md and docs/*.md, run as
# written, in order, one fresh database per page, on a temporary preloaded
# instance of the PostgreSQL of $PG_CONFIG (make install first); the output
# is compared with tests/docs/expected/<page>.out (pg_regress), so an
# example that stops working, or starts answering otherwise, fails; and
# every result a comment states (`-- => ...`, scripts/docs-check.py) must
# be what the statement printed, so a comment and its golden file cannot
# agree on a wrong answer.
# DOCS_UPDATE=1 copies the results over the expected files (review the diff).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# The README's source map names the tree as it is.
python3 "$root/scripts/source-map-check.py"
# Imports run one way: the layers src/lib.rs names, no circle.
python3 "$root/scripts/layers-check.py"
# Every link between the docs points to a file and heading that exist.
python3 "$root/scripts/links-check.py"
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
bindir=$("$PG_CONFIG" --bindir)
pg_regress=$(dirname "$("$PG_CONFIG" --pgxs)")/../test/regress/pg_regress
# Every page with a ```sql block (a new page is run as soon as it has one).
pages=(README.md)
for page in "$root"/docs/*.md; do
    grep -q '^[[:space:]]*```sql[[:space:]]*$' "$page" && pages+=("docs/$(basename "$page")")
done

work=$(mktemp -d /tmp/pgt-docs.XXXX)
mkdir -p "$work/sql" "$work/expected"
tests=()
for page in "${pages[@]}"; do
    name=$(basename "$page" .md | tr '[:upper:]-' '[:lower:]_')
    [ "$page" = README.md ] && name=readme
    {
        echo "-- The \`\`\`sql blocks of $page, in order (scripts/docs-test.sh)."
        echo "CREATE DATABASE docs_$name;"
        echo "\\c docs_$name"
        echo "SET TimeZone = 'UTC'; SET DateStyle = 'ISO';"
        blocks=$(awk '/^[[:space:]]*```sql[[:space:]]*$/ { inside = 1; next } /^[[:space:]]*```/ { inside = 0 } inside' "$root/$page")
        # A page that does not create the extension itself assumes it.
        grep -q 'CREATE EXTENSION pg_ticket' <<<"$blocks" || echo "CREATE EXTENSION pg_ticket;"
        # After a statement stating an error, its SQLSTATE (docs-check.py).
        printf '%s\n' "$blocks" | awk '{ print } /-- => ERROR/ { print "\\echo SQLSTATE :SQLSTATE" }'
    } >"$work/sql/docs_$name.sql"
    tests+=("docs_$name")
    if [ -f "$root/tests/docs/expected/docs_$name.out" ]; then
        cp "$root/tests/docs/expected/docs_$name.out" "$work/expected/"
    else
        : >"$work/expected/docs_$name.out" # a new page: DOCS_UPDATE=1 writes it
    fi
done
# The state tables as the catalog has them, for docs-check.py to compare
# with reference.md's table of them.
cat >"$work/sql/docs_catalog.sql" <<'SQL'
-- The state tables' columns (scripts/docs-test.sh; docs-check.py compares
-- them with docs/reference.md, "State tables").
CREATE DATABASE docs_catalog;
\c docs_catalog
CREATE EXTENSION pg_ticket;
SELECT c.relname AS state_table,
       CASE c.relkind WHEN 'S' THEN 'sequence'
            ELSE string_agg(a.attname, ' ' ORDER BY a.attnum) END AS columns
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'pgticket'
  LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND c.relkind = 'r'
 WHERE c.relkind IN ('r', 'S')
 GROUP BY c.relname, c.relkind ORDER BY 1;
SQL
tests+=(docs_catalog)
if [ -f "$root/tests/docs/expected/docs_catalog.out" ]; then
    cp "$root/tests/docs/expected/docs_catalog.out" "$work/expected/"
else
    : >"$work/expected/docs_catalog.out"
fi
printf "shared_preload_libraries = 'pg_ticket'\npg_ticket.machine_id = 7\npg_ticket.shards = '0-63'\n" >"$work/preload.conf"
if [ "$(id -u)" = 0 ]; then chown -R postgres: "$work"; fi
as_owner() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
status=0
as_owner "$pg_regress" --bindir="$bindir" --inputdir="$work" --outputdir="$work" \
    --temp-instance="$work/tmp_check" --temp-config="$work/preload.conf" --port=55498 \
    --dbname=regression "${tests[@]}" || status=$?
# Every result a comment states (`-- => ...`) is what the statement printed.
if ! python3 "$root/scripts/docs-check.py" --catalog "$work/results/docs_catalog.out" "$root/docs/reference.md" "$work"/results/*.out; then
    status=1
fi
if [ "${DOCS_UPDATE:-}" = 1 ]; then
    mkdir -p "$root/tests/docs/expected"
    cp "$work"/results/*.out "$root/tests/docs/expected/"
    status=0
elif [ $status != 0 ] && [ -f "$work/regression.diffs" ]; then
    cat "$work/regression.diffs"
fi
rm -rf "$work"
exit $status
