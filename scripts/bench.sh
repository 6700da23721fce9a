#!/usr/bin/env bash
# `make bench`: pg_ticket against nextval() and plain SQL, in one run, on a
# cluster of its own (durable settings: fsync and synchronous_commit on,
# unless a pgbench row says otherwise). Prints a Markdown report and writes
# it to target/bench/report.md. Needs the release build installed
# (`make bench` does that first).
#
# Knobs: BENCH_REPEAT (default 5 in-backend runs; pgbench runs use 3),
# BENCH_SECONDS (default 5 per pgbench run).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/bench-common.sh
source "$root/scripts/bench-common.sh"
dir=/tmp/pgt-bench
port=55461
repeat=${BENCH_REPEAT:-5}
seconds=${BENCH_SECONDS:-5}
bindir=$("${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}" --bindir)
out="$root/target/bench"
mkdir -p "$out"
report="$out/report.md"

"$root/scripts/cluster.sh" start "$dir" "$port" "shared_buffers = '512MB'" "max_wal_size = '4GB'" "pg_ticket.shards = '0-63'"
trap '"$root/scripts/cluster.sh" stop "$dir"' EXIT
export PGHOST=$dir PGPORT=$port PGUSER=postgres PGDATABASE=postgres
psql() { "$bindir/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }

psql <<'SQL'
CREATE EXTENSION pg_ticket;
CREATE SEQUENCE bench_seq;
-- The plain-SQL ticket server pg_ticket replaces (Flickr/Leaf style).
CREATE TABLE plain_counters (queue text, domain text, mark bigint NOT NULL, PRIMARY KEY (queue, domain));
CREATE FUNCTION plain_next(q text, d text) RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO plain_counters VALUES (q, d, 1)
    ON CONFLICT (queue, domain) DO UPDATE SET mark = plain_counters.mark + 1
    RETURNING mark $$;
CREATE TABLE plain_blocks (name text PRIMARY KEY, mark bigint NOT NULL);
INSERT INTO plain_blocks VALUES ('bench', 0);
CREATE FUNCTION plain_reserve(n text, size bigint) RETURNS TABLE(first_id bigint, last_id bigint) LANGUAGE sql AS $$
    UPDATE plain_blocks SET mark = mark + size WHERE name = n RETURNING mark - size + 1, mark $$;
SQL
psql -c "$BENCH_MS_SQL" >/dev/null


# in_backend NAME STATEMENT: median ms over $repeat runs; %RUN% becomes the run number.
declare -A ms
in_backend() {
    local name=$1 stmt=$2 samples=""
    for run in $(seq 1 "$repeat"); do
        samples+="$(psql -At -c "SELECT bench_ms(\$q\$${stmt//%RUN%/$run}\$q\$)")"$'\n'
    done
    ms[$name]=$(printf '%s' "$samples" | median)
    echo "  $name: ${ms[$name]} ms (median of $repeat)" >&2
}

# Calls per row of a target-list generate_series (value per call): unlike
# `FROM generate_series(...)`, it does not first materialize every row, so
# the time is the calls' own.
calls() { echo "SELECT count(x) FROM (SELECT $1 AS x, generate_series(1, $2)) s"; }

echo "in one backend..." >&2
in_backend baseline "$(calls 'pg_backend_pid()' 2000000)"
in_backend snowflake "$(calls 'snowflake_id()' 2000000)"
in_backend nextval "$(calls "nextval('bench_seq')" 2000000)"
in_backend uuid "$(calls 'gen_random_uuid()' 2000000)"
# The same generator on a leased machine id (this server its own registry):
# the lease is checked before and after each stamp. It leases from ids
# other than 0: the fixed id of the runs after it, which a server refuses
# to stamp while its registry has that id leased out (SPEC §17.4).
restart() { "$root/scripts/cluster.sh" stop "$dir"; "$root/scripts/cluster.sh" up "$dir"; }
psql -c "ALTER SYSTEM SET pg_ticket.machine_id = -1" -c "ALTER SYSTEM SET pg_ticket.lease_ids = '1-1023'" \
    -c "ALTER SYSTEM SET pg_ticket.registry = 'host=$dir port=$port user=postgres dbname=postgres'"
restart
# A registry holds off after every start; this one is new to its fleet.
psql -c "SELECT pgticket.end_lease_hold_off()" >/dev/null
for _ in $(seq 1 150); do
    [ "$(psql -At -c 'SELECT machine_id IS NOT NULL FROM pgticket.status')" = t ] && break
    sleep 0.2
done
in_backend snowflake_leased "$(calls 'snowflake_id()' 2000000)"
# The application's leased generator (ticket-client, one thread; the
# release build of its leased_ids example, `make bench` builds it), leasing
# from the same registry: IDs in one second, median of 3 runs.
client_runs=""
for _ in 1 2 3; do
    client_runs+="$("$root/target/release/examples/leased_ids" "host=$dir port=$port user=postgres dbname=postgres" |
        sed -n 's/^\([0-9]*\) IDs in one second.*/\1/p')"$'\n'
done
client_rate=$(printf '%s' "$client_runs" | median)
echo "  client generator: $client_rate IDs/s (median of 3)" >&2
# The Python package (crates/ticket-py, the wheel `make bench` builds and
# installs into the Python tools' venv) on the same registry: next_id() and
# next_ids(1000) in one thread, IDs in one second, median of 3 runs each.
python_rates=$(/opt/pgt-py/bin/python "$root/scripts/bench-python.py" "host=$dir port=$port user=postgres dbname=postgres")
python_one=$(echo "$python_rates" | sed -n 's/^next_id \([0-9]*\)$/\1/p')
python_batch=$(echo "$python_rates" | sed -n 's/^next_ids \([0-9]*\)$/\1/p')
echo "  python: next_id $python_one IDs/s, next_ids(1000) $python_batch IDs/s" >&2
psql -c "ALTER SYSTEM RESET pg_ticket.machine_id" -c "ALTER SYSTEM RESET pg_ticket.lease_ids" -c "ALTER SYSTEM RESET pg_ticket.registry"
restart
for n in 10000 100000 1000000; do
    in_backend "scoped_$n" "$(calls "next_scoped_id('bulk-$n', 'run-%RUN%')" $n)"
    in_backend "nextval_$n" "$(calls "nextval('bench_seq')" $n)"
done
in_backend ticket_1000000 "$(calls "next_ticket('bulk', 'run-%RUN%')" 1000000)"
# Public IDs (#50) against one cheap function per row, md5 of the ID's text.
psql -c "SELECT pgticket.create_public_key('bench')" >/dev/null
bench_form=$(psql -At -c "SELECT pgticket.public_id(31337, 'bench')")
in_backend md5_1000000 "$(calls "md5(pg_backend_pid()::text)" 1000000)"
in_backend public_id_1000000 "$(calls "pgticket.public_id(pg_backend_pid(), 'bench')" 1000000)"
in_backend private_id_1000000 "$(calls "pgticket.private_id('$bench_form', 'bench')" 1000000)"
# Sharded IDs: one shard in one backend (the layout's cap is 1 024 000/s),
# then shards in parallel, one backend each, against snowflake_id() from as
# many backends (one shared state).
psql -c "SELECT count(pgticket.accept_shard(s, 0)) FROM generate_series(0, 8) s" >/dev/null # new shards
in_backend sharded "$(calls 'sharded_id(1)' 2000000)"
parallel_rate() { # backends statement-with-%I
    local n=$1 started ended
    started=$(date +%s%N)
    for i in $(seq 1 "$n"); do
        psql -At -c "SELECT count(x) FROM (SELECT ${2//%I/$i} AS x, generate_series(1, 1000000)) s" >/dev/null &
    done
    wait
    ended=$(date +%s%N)
    awk -v n="$n" -v ns=$((ended - started)) 'BEGIN { printf "%.0f", n * 1000000 / (ns / 1e9) }'
}
declare -A parallel
for n in 1 2 8; do
    parallel[sharded_$n]=$(parallel_rate "$n" 'sharded_id(%I)')
    parallel[snowflake_$n]=$(parallel_rate "$n" 'snowflake_id()')
    echo "  $n backends: sharded ${parallel[sharded_$n]} IDs/s, snowflake ${parallel[snowflake_$n]} IDs/s" >&2
done
# The plain upsert is quadratic inside one transaction: only sizes that
# finish within a minute.
in_backend plain_10000 "$(calls "plain_next('bulk-plain', 'run-%RUN%')" 10000)"
# How full the snowflake milliseconds are when one backend draws flat out.
fill=$(psql -At -c "SELECT round(100.0 * count(*) / (4096 * (max(id >> 22) - min(id >> 22) + 1)), 1)
                     FROM (SELECT snowflake_id() AS id, generate_series(1, 2000000)) s")

rate() { awk -v n="$1" -v t="$2" 'BEGIN { printf "%.0f", n / (t / 1000) }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

echo "pgbench, one ID per transaction..." >&2
scripts_dir="$out/pgbench"
mkdir -p "$scripts_dir"
echo "SELECT snowflake_id();" >"$scripts_dir/snowflake.sql"
echo "SELECT nextval('bench_seq');" >"$scripts_dir/nextval.sql"
echo "SELECT next_scoped_id('bench', 'shared');" >"$scripts_dir/scoped_same.sql"
echo "SELECT plain_next('bench', 'shared');" >"$scripts_dir/plain_same.sql"
echo "SELECT next_scoped_id('bench', 'client-' || :client_id);" >"$scripts_dir/scoped_distinct.sql"
echo "SELECT plain_next('bench', 'client-' || :client_id);" >"$scripts_dir/plain_distinct.sql"
echo "SELECT * FROM reserve_block('bench', 100);" >"$scripts_dir/block.sql"
echo "SELECT * FROM plain_reserve('bench', 100);" >"$scripts_dir/plain_block.sql"
echo "SELECT next_ticket('bench', 'shared');" >"$scripts_dir/ticket_same.sql"

declare -A tps pair_ratio
# With synchronous_commit off the baselines commit without a WAL flush, so
# pg_ticket runs with pg_ticket.durable_commit off there too (like for
# like); its default, durable commits, is measured apart below.
#
# One client runs on one CPU with its backend (the postmaster's affinity,
# which a new backend inherits, and pgbench's). On this kind of VM a wakeup
# across CPUs costs tens of microseconds, most of a one-client transaction
# in which both sides only wait for each other, and it varies by ±10% from
# one 5 s run to the next (next_ticket against nextval unpinned, five
# pairs: 0.89-1.14×); on one CPU the round trip is a context switch and
# what differs is the work of the two functions.
# The CPU they share: the last one this script may run on.
one_cpu=$(taskset -cp $$ | sed 's/.*: //' | tr ',' '\n' | tail -1 | sed 's/.*-//')
pgbench_tps() { # script clients sync [durable]
    local durable=${4:-$([ "$3" = off ] && echo off || echo on)} postmaster allowed="" pin=() result
    postmaster=$(head -1 "$dir/data/postmaster.pid")
    if [ "$2" = 1 ]; then
        allowed=$(taskset -cp "$postmaster" | sed 's/.*: //')
        taskset -cp "$one_cpu" "$postmaster" >/dev/null
        pin=(taskset -c "$one_cpu")
    fi
    result=$(PGOPTIONS="-c synchronous_commit=$3 -c pg_ticket.durable_commit=$durable" \
        "${pin[@]}" "$bindir/pgbench" -n -M prepared -T "$seconds" -c "$2" -j "$2" \
        -f "$scripts_dir/$1.sql" 2>"$out/pgbench.err" | awk '/^tps/ {printf "%.0f", $3}') || true
    if [ -n "$allowed" ]; then taskset -cp "$allowed" "$postmaster" >/dev/null; fi
    # A failed run stops the benchmark: a median would hide it.
    if [ -z "$result" ]; then
        echo "pgbench $1 ($2 clients, synchronous_commit=$3) failed:" >&2
        cat "$out/pgbench.err" >&2
        return 1
    fi
    echo "$result"
}
# alternate KEY OURS THEIRS: three alternating pairs of the commands OURS
# and THEIRS (each prints tps; drift hits both sides alike). tps[KEY] and
# tps[base for KEY] are their medians; pair_ratio[KEY] is the median of the
# pairs' ratios OURS/THEIRS, each pair's two runs side by side.
alternate() {
    local key=$1 a="" b="" r="" x y
    for _ in 1 2 3; do
        x=$(eval "$2")
        y=$(eval "$3")
        a+="$x"$'\n' b+="$y"$'\n'
        r+="$(awk -v x="$x" -v y="$y" 'BEGIN { printf "%.4f", x / y }')"$'\n'
    done
    tps[$key]=$(printf '%s' "$a" | median)
    tps["base for $key"]=$(printf '%s' "$b" | median)
    pair_ratio[$key]=$(printf '%s' "$r" | median)
    echo "  $key: ${tps[$key]} tps against ${tps[base for $key]}, pairs $(printf '%s' "$r" | tr '\n' ' ')" >&2
}
pairs=("snowflake nextval" "ticket_same nextval" "scoped_same plain_same" "scoped_distinct plain_distinct" "block plain_block")
for sync in on off; do
    for clients in 1 8; do
        for pair in "${pairs[@]}"; do
            read -r ours theirs <<<"$pair"
            alternate "$ours/$clients/$sync" "pgbench_tps $ours $clients $sync" "pgbench_tps $theirs $clients $sync"
        done
    done
done

# What the ticket runs cost in waits, and what a crash would lose: at most
# two segments of the size the rate drove it to.
ticket_stats=$(psql -At -F ' ' -c "SELECT waits, refills, segment_size, next_value FROM pgticket.ticket_cache WHERE queue = 'bench' AND domain = 'shared'")
read -r ticket_waits ticket_refills ticket_step ticket_next <<<"$ticket_stats"

echo "pgbench, the default durable commit under synchronous_commit = off..." >&2
durable_workloads=(scoped_same scoped_distinct block)
for clients in 1 8; do
    for w in "${durable_workloads[@]}"; do
        a=""
        for _ in 1 2 3; do a+="$(pgbench_tps "$w" "$clients" off on)"$'\n'; done
        tps["$w/$clients/durable"]=$(printf '%s' "$a" | median)
        echo "  sync=off durable c=$clients $w ${tps[$w/$clients/durable]}" >&2
    done
done

echo "rights per scope: a plain role with pg_ticket.scope_rights on and 1 000 grants, against one with it off..." >&2
psql <<'SQL'
CREATE ROLE bench_open LOGIN;
CREATE ROLE bench_tenant LOGIN;
ALTER ROLE bench_tenant SET pg_ticket.scope_rights = on;
-- 998 grants that cover nothing measured, then the two that do.
SELECT count(pgticket.grant_scope('bench_tenant', 'tenant-' || g, 'shop-' || g || '/*')) FROM generate_series(1, 998) g;
SELECT pgticket.grant_scope('bench_tenant', 'rights-*'), pgticket.grant_scope('bench_tenant', 'bench-rights', 'shared');
SQL
for role in bench_open bench_tenant; do
    PGUSER=$role in_backend "rights_1M_$role" "$(calls "next_scoped_id('rights-$role', 'run-%RUN%')" 1000000)"
done
echo "SELECT next_scoped_id('bench-rights', 'shared');" >"$scripts_dir/scoped_rights.sql"
alternate rights "PGUSER=bench_tenant pgbench_tps scoped_rights 1 off" "PGUSER=bench_open pgbench_tps scoped_rights 1 off"
cost() { awk -v off="$1" -v on="$2" 'BEGIN { printf "%+.1f%%", 100 * (on - off) / off }'; }

{
    echo "## Run of $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "Command: \`make bench\` (BENCH_REPEAT=$repeat, BENCH_SECONDS=$seconds)."
    echo "Machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(psql -At -c 'SELECT version()' | cut -d, -f1);"
    echo "settings: $(psql -At -c "SELECT string_agg(name || '=' || setting, ', ' ORDER BY name) FROM pg_settings WHERE name IN ('fsync','synchronous_commit','shared_buffers','wal_level','max_wal_size')")."
    echo
    echo "### In one backend (median ms)"
    echo
    echo "| what | ms | rate (IDs/s) | vs nextval() |"
    echo "|---|---|---|---|"
    for k in baseline snowflake nextval uuid; do
        echo "| ${k} × 2M | ${ms[$k]} | $(rate 2000000 "${ms[$k]}") | $(ratio "${ms[nextval]}" "${ms[$k]}")× the rate |"
    done
    echo
    echo "(baseline: \`pg_backend_pid()\`, the cost of the call and the query around it.)"
    echo
    echo "snowflake_id(): $(rate 2000000 "${ms[snowflake]}") IDs/s = $(awk -v r="$(rate 2000000 "${ms[snowflake]}")" 'BEGIN {printf "%.1f", 100 * r / 4096000}')% of the layout's cap (4 096 000/s);"
    echo "the milliseconds its IDs span are ${fill}% full (4 096 IDs each = 100%)."
    echo "With a leased machine id (\`pg_ticket.machine_id = -1\`): ${ms[snowflake_leased]} ms for 2M = $(rate 2000000 "${ms[snowflake_leased]}") IDs/s, $(ratio "${ms[snowflake]}" "${ms[snowflake_leased]}")× the fixed id's rate."
    echo "The leased client generator (ticket-client, one thread, \`leased_ids\` example, median of 3 one-second runs): $client_rate IDs/s = $(awk -v r="$client_rate" 'BEGIN {printf "%.1f", 100 * r / 4096000}')% of the layout's cap."
    echo "The Python package's leased generator (pg_ticket.LeasedGenerator, one thread, \`scripts/bench-python.py\`, median of 3 one-second runs): next_id() $python_one IDs/s, next_ids(1000) $python_batch IDs/s; the Rust client's rate above, same registry."
    echo
    echo "sharded_id(1) × 2M in one backend: ${ms[sharded]} ms = $(rate 2000000 "${ms[sharded]}") IDs/s = $(awk -v r="$(rate 2000000 "${ms[sharded]}")" 'BEGIN {printf "%.1f", 100 * r / 1024000}')% of one shard's cap (1 024 000/s; bar ≥ 95%)."
    echo
    echo "| backends at once, 1M IDs each | sharded_id(own shard) IDs/s | snowflake_id() IDs/s |"
    echo "|---|---|---|"
    for n in 1 2 8; do echo "| $n | ${parallel[sharded_$n]} | ${parallel[snowflake_$n]} |"; done
    echo
    echo "| IDs in one transaction | next_scoped_id ms | nextval() ms | ratio to nextval | plain upsert ms |"
    echo "|---|---|---|---|---|"
    for n in 10000 100000 1000000; do
        plain="${ms[plain_$n]:-skipped (quadratic)}"
        echo "| $n | ${ms[scoped_$n]} | ${ms[nextval_$n]} | $(ratio "${ms[scoped_$n]}" "${ms[nextval_$n]}") | $plain |"
    done
    echo
    echo "Linearity: t(1M)/t(100k) = $(ratio "${ms[scoped_1000000]}" "${ms[scoped_100000]}") (bar ≤ 12); t(1M) / t(1M nextval) = $(ratio "${ms[scoped_1000000]}" "${ms[nextval_1000000]}") (bar ≤ 2)."
    echo
    echo "next_ticket() × 1M in one statement: ${ms[ticket_1000000]} ms = $(ratio "${ms[ticket_1000000]}" "${ms[nextval_1000000]}")× the time of 1M nextval() (bar ≤ 1.0)."
    echo
    echo "| public IDs × 1M in one statement (#50) | ms | per second | vs md5(id::text) |"
    echo "|---|---|---|---|"
    for k in md5 public_id private_id; do
        echo "| ${k} | ${ms[${k}_1000000]} | $(rate 1000000 "${ms[${k}_1000000]}") | $(ratio "${ms[md5_1000000]}" "${ms[${k}_1000000]}")× the rate |"
    done
    echo
    echo "(goal: public_id and private_id ≥ 1 M/s each; FF1's ten AES rounds are most of their time.)"
    echo
    echo "### pgbench, one ID per transaction (3 alternating pairs of ${seconds}s runs, -M prepared; one client on one CPU with its backend)"
    echo
    echo "| workload | sync commit | clients | pg_ticket tps (median) | baseline | baseline tps (median) | ratio (median of the pairs) |"
    echo "|---|---|---|---|---|---|---|"
    for sync in on off; do
        for clients in 1 8; do
            for pair in "${pairs[@]}"; do
                read -r ours theirs <<<"$pair"
                key="$ours/$clients/$sync"
                echo "| $ours | $sync | $clients | ${tps[$key]} | $theirs | ${tps[base for $key]} | ${pair_ratio[$key]} |"
            done
        done
    done
    echo
    echo "(With synchronous_commit off, pg_ticket ran with pg_ticket.durable_commit off, as durable as the baseline.)"
    echo
    echo "Tickets on the hot scope over every ticket_same run: ${ticket_waits} waits for a refill and ${ticket_refills} refills in ${ticket_next} tickets ($(awk -v w="$ticket_waits" -v n="$ticket_next" 'BEGIN {printf "%.1f", w * 1e6 / n}') waits per million); the segment size reached ${ticket_step}, so a crash at this rate loses at most $((2 * ticket_step)) tickets of the scope (a gap)."
    echo
    echo "### Rights per scope (a plain role, 1 000 grants; bar: under 5%)"
    echo
    echo "| workload | pg_ticket.scope_rights off | on, 1 000 grants | cost |"
    echo "|---|---|---|---|"
    echo "| next_scoped_id × 1M in one transaction (ms) | ${ms[rights_1M_bench_open]} | ${ms[rights_1M_bench_tenant]} | $(cost "${ms[rights_1M_bench_open]}" "${ms[rights_1M_bench_tenant]}") time |"
    echo "| pgbench next_scoped_id, 1 client, synchronous_commit off (tps; cost: the median of 3 alternating pairs) | ${tps[base for rights]} | ${tps[rights]} | $(awk -v r="${pair_ratio[rights]}" 'BEGIN { printf "%+.1f%%", 100 * (1 / r - 1) }') time per transaction |"
    echo
    echo "### The default: durable commits under synchronous_commit = off"
    echo
    echo "| workload | clients | tps, durable_commit on (default) | tps, durable_commit off | tps, synchronous_commit on |"
    echo "|---|---|---|---|---|"
    for clients in 1 8; do
        for w in "${durable_workloads[@]}"; do
            echo "| $w | $clients | ${tps[$w/$clients/durable]} | ${tps[$w/$clients/off]} | ${tps[$w/$clients/on]} |"
        done
    done
    echo
} | tee "$report"
# A cluster of its own per cache size, after this one has stopped.
"$root/scripts/cluster.sh" stop "$dir"
trap - EXIT
"$root/scripts/bench-directory.sh" | tee -a "$report"
"$root/scripts/bench-victims.sh" | tee -a "$report"
"$root/scripts/bench-cpu.sh" | tee -a "$report"
"$root/scripts/bench-linearity.sh" | tee -a "$report"
