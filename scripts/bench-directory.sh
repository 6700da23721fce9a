#!/usr/bin/env bash
# The ticket cache's directory by cache size (issue #24 item 1): what a new
# scope costs, and a scope already cached, with pg_ticket.ticket_cache_scopes
# at 1 024, 100 000 and 1 000 000 slots (0.2.0 scanned every slot under one
# lock: 1 ms, 63-85 ms and 570-620 ms a new scope). Prints a Markdown
# section; `scripts/bench.sh` appends it to its report. Needs the release
# build installed.
#
#   new scope:    1 000 scopes never seen, one statement (each waits for
#                 the worker's reservation, a synchronous commit)
#   cached scope: the same 1 000 again (a lookup and an atomic take each)
#   full cache:   (1 024 slots only) 2 000 more new scopes, each evicting
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=/tmp/pgt-bench-dir
port=55460
bindir=$("${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}" --bindir)
export PGHOST=$dir PGPORT=$port PGUSER=postgres PGDATABASE=postgres
psql() { "$bindir/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }
trap '"$root/scripts/cluster.sh" stop "$dir" 2>/dev/null || true' EXIT

# ms of one statement, as the server measures it.
statement_ms() {
    psql -At -c "DO \$\$ DECLARE t0 timestamptz := clock_timestamp(); BEGIN PERFORM $1; RAISE NOTICE '%', extract(epoch FROM clock_timestamp() - t0) * 1000; END \$\$" 2>&1 |
        sed -n 's/^NOTICE: *//p'
}
per() { awk -v ms="$1" -v n="$2" 'BEGIN { printf "%.3f", ms / n }'; }

rows=()
for slots in 1024 100000 1000000; do
    "$root/scripts/cluster.sh" start "$dir" "$port" "pg_ticket.ticket_cache_scopes = $slots" "shared_buffers = '128MB'" >/dev/null
    psql -c "CREATE EXTENSION pg_ticket"
    psql -c "SELECT next_ticket('warm', 'up')" >/dev/null
    new=$(statement_ms "count(next_ticket('dir', 'new-' || n)) FROM generate_series(1, 1000) n")
    cached=$(statement_ms "count(next_ticket('dir', 'new-' || n)) FROM generate_series(1, 1000) n")
    full="—"
    if [ "$slots" = 1024 ]; then
        full=$(per "$(statement_ms "count(next_ticket('dir', 'more-' || n)) FROM generate_series(1, 2000) n")" 2000)
    fi
    rss=$(psql -At -c "SELECT pg_size_pretty(sum(allocated_size)) FROM pg_shmem_allocations WHERE name = 'pg_ticket ticket cache'")
    rows+=("| $slots | $rss | $(per "$new" 1000) | $(per "$cached" 1000) | $full |")
    "$root/scripts/cluster.sh" stop "$dir" >/dev/null
done

echo "### The ticket cache's directory by size (\`scripts/bench-directory.sh\`)"
echo
echo "| ticket_cache_scopes | shared memory | new scope, ms | cached scope, ms | new scope, cache full, ms |"
echo "|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
echo "(A new scope waits for the worker's reservation, a synchronous commit: most of its cost is that flush. 0.2.0 spent 1 ms, 63-85 ms and 570-620 ms a new scope at these sizes in the scan alone.)"
