#!/usr/bin/env bash
# Cost per ID from 10 000 to 10 000 000 IDs in one statement (#36 item 5),
# for every allocator against nextval(): the time of one statement of N
# calls (median of 3, a fresh scope each run for the gap-free ones), in
# ns per ID, and the 10M cost over the 100k cost (flat: about 1; the
# summary holds it to 1.2, scripts/bench-publish.py). Prints a
# Markdown section; `scripts/bench.sh` appends it to its report. Needs the
# release build installed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/bench-common.sh
source "$root/scripts/bench-common.sh"
dir=/tmp/pgt-bench-lin
port=55462
bindir=$("${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}" --bindir)
export PGHOST=$dir PGPORT=$port PGUSER=postgres PGDATABASE=postgres
psql() { "$bindir/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }
trap '"$root/scripts/cluster.sh" stop "$dir" 2>/dev/null || true' EXIT
"$root/scripts/cluster.sh" start "$dir" "$port" "shared_buffers = '256MB'" "max_wal_size = '4GB'" "pg_ticket.shards = '1'" >/dev/null
psql >/dev/null <<'SQL'
CREATE EXTENSION pg_ticket;
CREATE SEQUENCE lin_seq;
SELECT pgticket.accept_shard(1, 0);
SQL
psql -c "$BENCH_MS_SQL" >/dev/null
run=0
ns_per_id() { # call N
    local samples=""
    for _ in 1 2 3; do
        run=$((run + 1))
        local call=${1//%RUN%/$run}
        samples+="$(psql -At -c "SELECT bench_ms(\$q\$SELECT count(x) FROM (SELECT $call AS x, generate_series(1, $2)) s\$q\$)")"$'\n'
    done
    printf '%s' "$samples" | median | awk -v n="$2" '{printf "%.0f", $1 * 1e6 / n}'
}

echo "### Cost per ID from 10k to 10M IDs in one statement (\`scripts/bench-linearity.sh\`)"
echo
echo "| allocator | 10k, ns/ID | 100k | 1M | 10M | 10M / 100k |"
echo "|---|---|---|---|---|---|"
while IFS='|' read -r name call; do
    row=() 
    for n in 10000 100000 1000000 10000000; do
        row+=("$(ns_per_id "$call" "$n")")
        echo "  $name $n: ${row[-1]} ns/ID" >&2
    done
    echo "| $name | ${row[0]} | ${row[1]} | ${row[2]} | ${row[3]} | $(awk -v a="${row[3]}" -v b="${row[1]}" 'BEGIN {printf "%.2f", a / b}') |"
done <<'CALLS'
nextval()|nextval('lin_seq')
next_scoped_id()|next_scoped_id('lin', 'run-%RUN%')
next_ticket()|next_ticket('lin', 'run-%RUN%')
snowflake_id()|snowflake_id()
sharded_id()|sharded_id(1)
CALLS
echo
echo "(One statement, one transaction per run. snowflake_id() and sharded_id() are capped by their layouts at 4 096 and 1 024 IDs a millisecond: 244 and 977 ns per ID. reserve_block() is next_scoped_id()'s allocator under another name; it is not run here because a set-returning call beside the target-list generate_series would run once, not once a row.)"
