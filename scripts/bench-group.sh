#!/usr/bin/env bash
# `make bench-group` (#47 item 7, #49 item 4): what being in a group of
# primaries costs. Three servers of one build on this machine: S alone, and
# A and B replicating to each other (`origin = none`, PostgreSQL 16+), each
# announced with `pgticket.join_group()`; S has the same settings but no
# publication, subscription or announcement. Measured in one run, S and A
# alternated so drift hits both:
#   - in one backend, snowflake_id() and next_ticket() a call, A against S
#     (bar: A >= 0.97x S's rate);
#   - pgbench, one next_scoped_id() per transaction (random scope of 64, 8
#     clients, durable commits) on A with B's subscription to A disabled,
#     so A's walsender decodes nothing and what differs from S is the home
#     check (bar: <= 5% slower), and again with replication running (what a
#     user sees; the walsender shares the 2 CPUs);
#   - a table keyed by snowflake_id() (then next_ticket()) filled by pgbench
#     on A and B at once (BENCH_CLIENTS/2 clients each) against S alone with
#     BENCH_CLIENTS, and the lag at the end: seconds until each node holds
#     the other's rows.
# Needs the release build installed in PG_CONFIG's PostgreSQL (16+).
# Knobs: BENCH_REPEAT (5), BENCH_SECONDS (5), BENCH_ROWS (400 000 per fill),
# BENCH_CLIENTS (8).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/bench-common.sh
source "$root/scripts/bench-common.sh"
base=/tmp/pgt-bench-group
repeat=${BENCH_REPEAT:-5}
seconds=${BENCH_SECONDS:-5}
rows=${BENCH_ROWS:-400000}
clients=${BENCH_CLIENTS:-8}
bindir=$("${PG_CONFIG:?PG_CONFIG: the pg_config of PostgreSQL 16 or later}" --bindir)
out="$root/target/bench/group"
mkdir -p "$out"
report="$root/target/bench/group.md"

declare -A port=([s]=55670 [a]=55671 [b]=55672) machine=([s]=3 [a]=1 [b]=2) offset=([s]=1 [a]=1 [b]=2) creates=([s]=on [a]=on [b]=off)
for n in s a b; do
    "$root/scripts/cluster.sh" start "$base/$n" "${port[$n]}" "shared_buffers = '256MB'" "max_wal_size = '4GB'" \
        "wal_level = logical" "pg_ticket.machine_id = ${machine[$n]}" "pg_ticket.ticket_increment = 2" \
        "pg_ticket.ticket_offset = ${offset[$n]}" "pg_ticket.node_name = '$n'" "pg_ticket.creates_scopes = ${creates[$n]}"
done
trap 'for n in s a b; do "$root/scripts/cluster.sh" stop "$base/$n" || true; done' EXIT
psql() { local n=$1; shift; "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -h "$base/$n" -p "${port[$n]}" -U postgres -d postgres "$@"; }
dsn() { echo "host=$base/$1 port=${port[$1]} user=postgres dbname=postgres"; }

version=$(psql s -At -c "SHOW server_version_num")
version_name=$(psql s -At -c "SHOW server_version")
[ "$version" -ge 160000 ] || { echo "bench-group: origin = none needs PostgreSQL 16 or later; this is $version" >&2; exit 1; }

for n in s a b; do
    psql "$n" <<'SQL'
CREATE EXTENSION pg_ticket;
CREATE TABLE fill_snowflake (id bigint DEFAULT snowflake_id() PRIMARY KEY, created_at timestamptz NOT NULL DEFAULT now(), payload text);
CREATE TABLE fill_ticket (id bigint DEFAULT next_ticket('bench', 'rows') PRIMARY KEY, created_at timestamptz NOT NULL DEFAULT now(), payload text);
SQL
    psql "$n" -c "$BENCH_MS_SQL" >/dev/null
done
for n in a b; do psql "$n" -c "CREATE PUBLICATION everything FOR ALL TABLES"; done
psql b -c "CREATE SUBSCRIPTION from_a CONNECTION '$(dsn a)' PUBLICATION everything WITH (copy_data = false, origin = none)"
psql a -c "CREATE SUBSCRIPTION from_b CONNECTION '$(dsn b)' PUBLICATION everything WITH (copy_data = false, origin = none)"
for n in a b; do psql "$n" -c "SELECT pgticket.join_group()" >/dev/null; done
# Every scope of the pgbench runs made on A (its home) and on S first, so
# the runs time drawing, not creating.
for n in s a; do psql "$n" -c "SELECT next_scoped_id('bench', 'd' || d) FROM generate_series(1, 64) d" >/dev/null; done

# in_backend KEY STATEMENT: median ms of $repeat runs on S and on A,
# alternated; ms[KEY s], ms[KEY a].
declare -A ms
in_backend() {
    local key=$1 stmt=$2 s="" a=""
    for _ in $(seq 1 "$repeat"); do
        s+="$(psql s -At -c "SELECT bench_ms(\$q\$$stmt\$q\$)")"$'\n'
        a+="$(psql a -At -c "SELECT bench_ms(\$q\$$stmt\$q\$)")"$'\n'
    done
    ms["$key s"]=$(printf '%s' "$s" | median)
    ms["$key a"]=$(printf '%s' "$a" | median)
    echo "  $key: S ${ms[$key s]} ms, A ${ms[$key a]} ms (medians of $repeat)" >&2
}
calls() { echo "SELECT count(x) FROM (SELECT $1 AS x, generate_series(1, $2)) s"; }
echo "in one backend..." >&2
in_backend snowflake "$(calls 'snowflake_id()' 2000000)"
in_backend ticket "$(calls "next_ticket('bench', 'calls')" 1000000)"

echo "pgbench, one scoped ID per transaction..." >&2
echo "\\set d random(1, 64)
SELECT next_scoped_id('bench', 'd' || :d);" >"$out/scoped.sql"
tps_of() { # node
    "$bindir/pgbench" -n -M prepared -T "$seconds" -c "$clients" -j "$clients" -h "$base/$1" -p "${port[$1]}" -U postgres \
        -f "$out/scoped.sql" postgres 2>"$out/pgbench.err" | awk '/^tps/ {printf "%.0f", $3}'
}
# scoped KEY: three alternating pairs S, A; medians tps[KEY s], tps[KEY a].
declare -A tps
scoped() {
    local key=$1 s="" a="" x y
    for _ in 1 2 3; do
        x=$(tps_of s); y=$(tps_of a)
        [ -n "$x" ] && [ -n "$y" ] || { echo "pgbench failed:" >&2; cat "$out/pgbench.err" >&2; exit 1; }
        s+="$x"$'\n' a+="$y"$'\n'
    done
    tps["$key s"]=$(printf '%s' "$s" | median)
    tps["$key a"]=$(printf '%s' "$a" | median)
    echo "  $key: S ${tps[$key s]} tps, A ${tps[$key a]} tps" >&2
}
psql b -c "ALTER SUBSCRIPTION from_a DISABLE"
sleep 1
scoped home_check
psql b -c "ALTER SUBSCRIPTION from_a ENABLE"
scoped replicating

echo "filling tables..." >&2
per_txn=10
# wait_converged TABLE N: seconds until A and B each hold N rows of TABLE
# (at most 600 s; the rows are each node's own plus the other's).
wait_converged() {
    local t0 now
    t0=$(date +%s.%N)
    while :; do
        [ "$(psql a -At -c "SELECT count(*) FROM $1")" = "$2" ] && [ "$(psql b -At -c "SELECT count(*) FROM $1")" = "$2" ] && break
        now=$(date +%s.%N)
        if awk -v a="$t0" -v b="$now" 'BEGIN { exit !(b - a > 600) }'; then
            echo "bench-group: $1 did not converge within 600 s" >&2; exit 1
        fi
        sleep 0.2
    done
    now=$(date +%s.%N)
    awk -v a="$t0" -v b="$now" 'BEGIN { printf "%.1f", b - a }'
}
fill() { # node table clients txns-per-client
    echo "INSERT INTO $2 (payload) SELECT substr(repeat(md5(random()::text), 4), 1, 100) FROM generate_series(1, $per_txn);" >"$out/$2.sql"
    "$bindir/pgbench" -n -M prepared -c "$3" -j "$3" -t "$4" -h "$base/$1" -p "${port[$1]}" -U postgres -f "$out/$2.sql" postgres \
        >"$out/$1.$2.log" 2>&1 || { echo "pgbench on $1 failed:" >&2; tail -5 "$out/$1.$2.log" >&2; exit 1; }
}
declare -A rate lag twice
for t in fill_snowflake fill_ticket; do
    for n in s a b; do psql "$n" -c CHECKPOINT; done
    start=$(date +%s.%N)
    fill s "$t" "$clients" $(( rows / per_txn / clients ))
    end=$(date +%s.%N)
    rate["$t s"]=$(awk -v n="$rows" -v a="$start" -v b="$end" 'BEGIN { printf "%.0f", n / (b - a) }')
    for n in s a b; do psql "$n" -c CHECKPOINT; done
    half=$(( clients / 2 ))
    start=$(date +%s.%N)
    fill a "$t" "$half" $(( rows / per_txn / clients )) &
    fill b "$t" "$half" $(( rows / per_txn / clients ))
    wait $!
    end=$(date +%s.%N)
    rate["$t ab"]=$(awk -v n="$rows" -v a="$start" -v b="$end" 'BEGIN { printf "%.0f", n / (b - a) }')
    lag[$t]=$(wait_converged "$t" "$rows")
    twice[$t]=$(psql a -At -c "SELECT count(*) - count(DISTINCT id) FROM $t")
    echo "  $t: S ${rate[$t s]} rows/s, A+B ${rate[$t ab]} rows/s, converged ${lag[$t]} s after" >&2
done
errors=$(for n in a b; do psql "$n" -At -c "SELECT coalesce(sum(apply_error_count), 0) FROM pg_stat_subscription_stats"; done | awk '{ s += $1 } END { print s }')

ratio() { awk -v x="$1" -v y="$2" 'BEGIN { printf "%.2f", x / y }'; }
{
    echo "### In a group of two primaries (\`make bench-group\`, PostgreSQL $version_name, this machine's 2 CPUs shared by the three servers)"
    echo
    echo "| what | alone (S) | in the group (A) | ratio | bar |"
    echo "|---|---|---|---|---|"
    echo "| \`snowflake_id()\`, 2 M calls in one backend (ms, median of $repeat) | ${ms[snowflake s]} | ${ms[snowflake a]} | $(ratio "${ms[snowflake s]}" "${ms[snowflake a]}")x the rate | >= 0.97x |"
    echo "| \`next_ticket()\`, 1 M calls in one backend (ms) | ${ms[ticket s]} | ${ms[ticket a]} | $(ratio "${ms[ticket s]}" "${ms[ticket a]}")x the rate | >= 0.97x |"
    echo "| \`next_scoped_id()\`, one a transaction, $clients clients (tps, median of 3), A's walsender idle: the home check | ${tps[home_check s]} | ${tps[home_check a]} | $(ratio "${tps[home_check a]}" "${tps[home_check s]}")x | >= 0.95x |"
    echo "| the same, replicating to B | ${tps[replicating s]} | ${tps[replicating a]} | $(ratio "${tps[replicating a]}" "${tps[replicating s]}")x | - |"
    echo
    echo "| table filled ($rows rows, 10 a transaction) | S alone, $clients clients (rows/s) | A and B at once, $(( clients / 2 )) clients each (rows/s, both) | ratio | converged after | IDs twice |"
    echo "|---|---|---|---|---|---|"
    for t in fill_snowflake fill_ticket; do
        echo "| \`$t\` | ${rate[$t s]} | ${rate[$t ab]} | $(ratio "${rate[$t ab]}" "${rate[$t s]}")x | ${lag[$t]} s | ${twice[$t]} |"
    done
    echo
    echo "Apply errors on A and B at the end: $errors."
} | tee "$report"
