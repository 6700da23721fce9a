#!/usr/bin/env bash
# What a full millisecond costs (#36 item 4): snowflake_id() at full speed
# in one backend, with 10 machine bits (4 096 IDs a millisecond: the
# generator is busy the whole millisecond) and with 16 (64 IDs a
# millisecond, made in a few µs: the rest of each millisecond is a wait).
# Reports the rate against the layout's cap and the backend's CPU time per
# ID and per second of wall time, read from /proc/self/stat inside the
# backend (utime + stime, in clock ticks) around one statement. Prints a
# Markdown section; `scripts/bench.sh` appends it to its report. Needs the
# release build installed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=/tmp/pgt-bench-cpu
port=55461
bindir=$("${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}" --bindir)
export PGHOST=$dir PGPORT=$port PGUSER=postgres PGDATABASE=postgres
psql() { "$bindir/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }
trap '"$root/scripts/cluster.sh" stop "$dir" 2>/dev/null || true' EXIT
hz=$(getconf CLK_TCK)

echo "### A full millisecond: CPU per ID by machine bits (\`scripts/bench-cpu.sh\`)"
echo
echo "| machine bits | IDs a ms (cap/s) | IDs | wall s | IDs/s | of the cap | backend CPU s | CPU µs per ID | CPU per wall second |"
echo "|---|---|---|---|---|---|---|---|---|"
for bits in 10 16; do
    per_ms=$((1 << (22 - bits)))
    ids=$((per_ms * 4000)) # about 4 s at the cap
    "$root/scripts/cluster.sh" start "$dir" "$port" "pg_ticket.machine_bits = $bits" >/dev/null
    psql -c "CREATE EXTENSION pg_ticket"
    psql -c "SELECT snowflake_id()" >/dev/null
    # One backend: CPU ticks and wall time around the statement, then both.
    read -r ticks wall_ms < <(psql -At -F ' ' <<SQL
CREATE TEMP TABLE t AS SELECT pg_read_file('/proc/self/stat') AS stat0, clock_timestamp() AS t0;
SELECT count(x) FROM (SELECT snowflake_id() AS x, generate_series(1, $ids)) s \\g /dev/null
WITH s AS (SELECT stat0, t0, pg_read_file('/proc/self/stat') AS stat1, clock_timestamp() AS t1 FROM t),
f AS (SELECT regexp_split_to_array(split_part(stat0, ') ', 2), ' ') AS a0,
             regexp_split_to_array(split_part(stat1, ') ', 2), ' ') AS a1, t0, t1 FROM s)
SELECT (a1[12]::bigint + a1[13]::bigint) - (a0[12]::bigint + a0[13]::bigint),
       round(extract(epoch FROM t1 - t0) * 1000) FROM f;
SQL
)
    awk -v bits="$bits" -v per_ms="$per_ms" -v ids="$ids" -v ticks="$ticks" -v hz="$hz" -v wall_ms="$wall_ms" 'BEGIN {
        cap = per_ms * 1000; wall = wall_ms / 1000; cpu = ticks / hz; rate = ids / wall
        printf "| %d | %d (%d) | %d | %.2f | %.0f | %.1f%% | %.2f | %.3f | %.2f |\n",
            bits, per_ms, cap, ids, wall, rate, 100 * rate / cap, cpu, 1e6 * cpu / ids, cpu / wall }'
    "$root/scripts/cluster.sh" stop "$dir" >/dev/null
done
echo
echo "(CPU from the backend's /proc/self/stat, $hz ticks a second. At 16 bits the generator fills each millisecond in a few µs; the CPU per wall second is what its wait for the next millisecond costs.)"
