#!/usr/bin/env bash
# Part of `make bench` (#31 items 3 and 4): what one role's flood costs the
# others. A victim draws tickets while an attacker floods; the victim's
# latency (pgbench's per-transaction log) with and without the attacker,
# p50 and p99 in ms, and the waits for a segment (pgticket.ticket_cache).
#   1. One database, 64 cache slots, the victim cycling over 20 ticket
#      scopes: alone; beside a role at its scope cap asking new names (each
#      refused); beside a role with no cap asking new names.
#   2. pg_ticket.max_ticket_workers = 4 databases kept busy (a new scope a
#      second each, as in the review), and a fifth that needs its worker
#      (a new scope at every call).
# Prints Markdown; needs the extension installed (release build for figures).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bindir=$("${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}" --bindir)
seconds=${BENCH_SECONDS:-5}
dir=/tmp/pgt-bench-victims
port=55640
work=$(mktemp -d /tmp/pgt-victims.XXXX)
chmod 777 "$work"
export PGHOST=$dir PGPORT=$port PGUSER=postgres PGDATABASE=postgres
psql() { "$bindir/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }
as_owner() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

# pgbench_log LABEL USER DB SCRIPT [extra pgbench args...]: runs pgbench for
# $seconds, its per-transaction log kept under $work/LABEL.
pgbench_log() {
    local label=$1 user=$2 db=$3 script=$4
    shift 4
    as_owner "$bindir/pgbench" -n -h "$dir" -p "$port" -U "$user" -T "$seconds" -f "$script" -l --log-prefix="$work/$label" "$@" "$db" >/dev/null 2>&1 || true
}

# p50 and p99 (ms) of the latencies logged under LABEL.
percentiles() {
    cat "$work/$1".* 2>/dev/null | awk '{print $3 / 1000}' | sort -g | awk '
        {a[NR] = $1} END { if (NR == 0) { print "- | -"; exit }
        i50 = int(NR * 0.50); if (i50 < 1) i50 = 1; i99 = int(NR * 0.99); if (i99 < 1) i99 = 1;
        printf "%.2f | %.2f | %d", a[i50], a[i99], NR }'
}

trap '"$root/scripts/cluster.sh" stop "$dir" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

echo "### One role floods, another draws tickets (#31 items 3 and 4; $seconds s each)"
echo

# 1. One database, 64 slots.
"$root/scripts/cluster.sh" start "$dir" "$port" "pg_ticket.ticket_cache_scopes = 64" "pg_ticket.max_scopes_per_role = 1000" >/dev/null
psql <<'SQL'
CREATE EXTENSION pg_ticket;
CREATE ROLE victim LOGIN; CREATE ROLE capped LOGIN; CREATE ROLE flooder LOGIN;
ALTER ROLE capped SET pg_ticket.max_scopes_per_role = 5;
ALTER ROLE flooder SET pg_ticket.max_scopes_per_role = 0;
-- An attacker's call that goes on past a refusal (53400 past its cap).
CREATE FUNCTION attack(q text, n bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM next_ticket(q, 'n' || n);
EXCEPTION WHEN others THEN NULL;
END $$;
SQL
printf '\\set n random(1, 20)\nSELECT next_ticket('"'"'v'"'"', '"'"'scope-'"'"' || :n);\n' >"$work/victim.sql"
printf '\\set n random(1, 1000000000)\nSELECT attack('"'"'c'"'"', :n);\n' >"$work/attack_c.sql"
printf '\\set n random(1, 1000000000)\nSELECT attack('"'"'f'"'"', :n);\n' >"$work/attack_f.sql"
chmod 644 "$work"/*.sql
waits() { psql -At -c "SELECT coalesce(sum(waits), 0) FROM pgticket.ticket_cache WHERE queue = 'v'"; }
psql -c "SELECT next_ticket('v', 'scope-' || n) FROM generate_series(1, 20) n" >/dev/null
echo "| 64 cache slots, the victim on 20 scopes | victim p50 (ms) | p99 (ms) | calls | victim's waits for a segment |"
echo "|---|---|---|---|---|"
w0=$(waits)
pgbench_log alone victim postgres "$work/victim.sql"
w1=$(waits)
echo "| alone | $(percentiles alone) | $((w1 - w0)) |"
pgbench_log capped capped postgres "$work/attack_c.sql" -T $((seconds + 1)) &
pgbench_log beside_capped victim postgres "$work/victim.sql"
wait
w2=$(waits)
echo "| beside a role at its cap asking new names | $(percentiles beside_capped) | $((w2 - w1)) |"
pgbench_log flood flooder postgres "$work/attack_f.sql" -T $((seconds + 1)) &
pgbench_log beside_flood victim postgres "$work/victim.sql"
wait
w3=$(waits)
echo "| beside a role with no cap asking new names | $(percentiles beside_flood) | $((w3 - w2)) |"
echo
"$root/scripts/cluster.sh" stop "$dir" >/dev/null

# 2. Busy databases and the ticket workers.
"$root/scripts/cluster.sh" start "$dir" "$port" "pg_ticket.max_ticket_workers = 4" "max_worker_processes = 16" >/dev/null
for db in busy1 busy2 busy3 busy4 victim5; do
    psql -c "CREATE DATABASE $db" >/dev/null
    psql -d "$db" -c "CREATE EXTENSION pg_ticket" >/dev/null
done
printf '\\set n random(1, 1000000000)\nSELECT next_ticket('"'"'a'"'"', '"'"'n'"'"' || :n);\n' >"$work/new_scope.sql"
chmod 644 "$work/new_scope.sql"
echo "| pg_ticket.max_ticket_workers = 4; a fifth database, a new scope at every call (5 a second) | victim p50 (ms) | p99 (ms) | calls |"
echo "|---|---|---|---|"
pgbench_log workers_alone postgres victim5 "$work/new_scope.sql" -R 5
echo "| alone | $(percentiles workers_alone) |"
for db in busy1 busy2 busy3 busy4; do
    pgbench_log "busy_$db" postgres "$db" "$work/new_scope.sql" -R 1 -T $((seconds + 2)) &
done
sleep 1
pgbench_log workers_beside postgres victim5 "$work/new_scope.sql" -R 5
wait
echo "| beside four databases each asking a new scope a second | $(percentiles workers_beside) |"
echo
