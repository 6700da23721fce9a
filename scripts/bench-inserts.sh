#!/usr/bin/env bash
# `make bench-inserts` (#49): IDs as primary keys under insert load, side by
# side — identity, snowflake_id(), next_ticket(), sharded_id(), IDs made by
# the leased client (ticket-client's insert_leased example, sent as
# parameters), UUIDv4 (gen_random_uuid()), UUIDv7 (uuidv7(), PostgreSQL
# 18's) and the PL/pgSQL snowflake people copy from gists. One table per kind
# (id PK, created_at timestamptz, payload text ~100 bytes), filled by
# pgbench at BENCH_CLIENTS clients (default 8) in four quarters; every
# quarter runs every kind in turn, so the machine's noise hits all of them.
# shared_buffers is small (BENCH_SHARED_BUFFERS, 8 MB) so each table, and
# UUIDv4's index (37 MB at a million rows), ends at several times it;
# a CHECKPOINT before each run and none timed during one, so every run
# pays the full-page writes of the pages it touches first, alike; no
# autovacuum (its WAL would land in whichever kind runs next).
# Reports per kind: rows/s in the first and the last quarter (the cliff
# when the index leaves the cache), final heap and index size, WAL bytes
# per row, and for the PL/pgSQL recipe the IDs it handed out twice (its
# table has a plain index, not a primary key, to count them); and a chart
# of each quarter's rate over the table's size (scripts/bench-chart.py).
#
# Needs PostgreSQL 18 (PG_CONFIG) with the release build installed
# (`make bench-inserts` does both). Knobs: BENCH_ROWS (rows per kind,
# default 1 000 000), BENCH_CLIENTS.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=/tmp/pgt-bench-inserts
port=55465
rows=${BENCH_ROWS:-1000000}
clients=${BENCH_CLIENTS:-8}
bindir=$("${PG_CONFIG:?PG_CONFIG: the pg_config of PostgreSQL 18}" --bindir)
out="$root/target/bench"
mkdir -p "$out/inserts"
report="$out/inserts-$clients.md"

shared_buffers=${BENCH_SHARED_BUFFERS:-8MB}
"$root/scripts/cluster.sh" start "$dir" "$port" "shared_buffers = '$shared_buffers'" "max_wal_size = '4GB'" "checkpoint_timeout = '1h'" "autovacuum = off" "pg_ticket.shards = '0-7'" \
    "max_connections = 100" "pg_ticket.lease_ids = '1-1023'"
trap '"$root/scripts/cluster.sh" stop "$dir"' EXIT
export PGHOST=$dir PGPORT=$port PGUSER=postgres PGDATABASE=postgres
psql() { "$bindir/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }

version=$(psql -At -c "SHOW server_version_num")
[ "$version" -ge 180000 ] || { echo "bench-inserts: PostgreSQL 18 is needed (uuidv7); this is $version" >&2; exit 1; }
version=$(psql -At -c "SHOW server_version")

psql <<'SQL'
CREATE EXTENSION pg_ticket;
SELECT pgticket.accept_shard(s, 0) FROM generate_series(0, 7) s;
-- The leased client (the kind "client") leases from this server: new, it
-- has no earlier leases to wait out.
SELECT pgticket.end_lease_hold_off();
-- The Instagram-style recipe copied from gists: the same ID twice whenever
-- one shard makes more than 1 024 IDs in a millisecond.
CREATE SEQUENCE gist_seq;
CREATE FUNCTION gist_snowflake() RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    our_epoch bigint := 1767225600000;
    seq_id bigint;
    now_millis bigint;
    shard_id int := 1;
BEGIN
    SELECT nextval('gist_seq') % 1024 INTO seq_id;
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000) INTO now_millis;
    RETURN ((now_millis - our_epoch) << 23) | (shard_id << 10) | seq_id;
END $$;
CREATE TABLE k_identity  (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, created_at timestamptz NOT NULL DEFAULT now(), payload text);
CREATE TABLE k_snowflake (id bigint DEFAULT snowflake_id() PRIMARY KEY, created_at timestamptz NOT NULL DEFAULT now(), payload text);
CREATE TABLE k_ticket    (id bigint DEFAULT next_ticket('bench', 'rows') PRIMARY KEY, created_at timestamptz NOT NULL DEFAULT now(), payload text);
CREATE TABLE k_sharded   (id bigint DEFAULT sharded_id(3) PRIMARY KEY, created_at timestamptz NOT NULL DEFAULT now(), payload text);
CREATE TABLE k_uuidv4    (id uuid DEFAULT gen_random_uuid() PRIMARY KEY, created_at timestamptz NOT NULL DEFAULT now(), payload text);
CREATE TABLE k_uuidv7    (id uuid DEFAULT uuidv7() PRIMARY KEY, created_at timestamptz NOT NULL DEFAULT now(), payload text);
CREATE TABLE k_plpgsql   (id bigint DEFAULT gist_snowflake() NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), payload text);
CREATE TABLE k_client    (id bigint PRIMARY KEY, created_at timestamptz NOT NULL DEFAULT now(), payload text);
CREATE INDEX k_plpgsql_id ON k_plpgsql (id);
SQL

kinds=(identity snowflake ticket sharded client uuidv4 uuidv7 plpgsql)
per_txn=10
quarter_txns=$(( rows / 4 / per_txn / clients ))
for k in "${kinds[@]}"; do
    echo "INSERT INTO k_$k (payload) SELECT substr(repeat(md5(random()::text), 4), 1, 100) FROM generate_series(1, $per_txn);" >"$out/inserts/$k.sql"
done

declare -A q1 q4 wal
# Each quarter's rate against the table's size at its middle: the chart.
curve="$out/inserts/curve-$clients.csv"
echo "kind,quarter,table_mb,rows_per_s" >"$curve"
table_mb() { psql -At -c "SELECT round(pg_total_relation_size('k_$1') / 1048576.0, 1)"; }
for q in 1 2 3 4; do
    # Each quarter in another order, so no kind always runs first (the
    # first run also meets fresh WAL segments) or last (helper-13).
    order=("${kinds[@]:$(( (q - 1) * 2 % ${#kinds[@]} ))}" "${kinds[@]:0:$(( (q - 1) * 2 % ${#kinds[@]} ))}")
    for k in "${order[@]}"; do
        mb0=$(table_mb "$k")
        psql -c CHECKPOINT
        lsn0=$(psql -At -c "SELECT pg_current_wal_insert_lsn()")
        start=$(date +%s.%N)
        if [ "$k" = client ]; then
            # IDs made by the leased client (ticket-client, one generator for
            # its threads) and sent as parameters, 10 rows a transaction.
            "$root/target/release/examples/insert_leased" "host=$dir port=$port user=postgres dbname=postgres" \
                $(( quarter_txns * clients * per_txn )) "$clients" >"$out/inserts/$k.$q.log" 2>&1 \
                || { echo "insert_leased quarter $q failed:" >&2; tail -5 "$out/inserts/$k.$q.log" >&2; exit 1; }
        else
            "$bindir/pgbench" -n -M prepared -c "$clients" -j "$clients" -t "$quarter_txns" -f "$out/inserts/$k.sql" >"$out/inserts/$k.$q.log" 2>&1 \
                || { echo "pgbench $k quarter $q failed:" >&2; tail -5 "$out/inserts/$k.$q.log" >&2; exit 1; }
        fi
        end=$(date +%s.%N)
        lsn1=$(psql -At -c "SELECT pg_current_wal_insert_lsn()")
        n=$(( quarter_txns * clients * per_txn ))
        rate=$(awk -v n="$n" -v a="$start" -v b="$end" 'BEGIN { printf "%.0f", n / (b - a) }')
        if [ "$k" = client ]; then
            # Its own clock: the inserts, not the process's start and lease.
            secs=$(sed -n 's/^[0-9]* rows in \([0-9.]*\) s$/\1/p' "$out/inserts/$k.$q.log")
            rate=$(awk -v n="$n" -v s="$secs" 'BEGIN { printf "%.0f", n / s }')
        fi
        bytes=$(psql -At -c "SELECT pg_wal_lsn_diff('$lsn1', '$lsn0')")
        wal[$k]=$(awk -v w="${wal[$k]:-0}" -v b="$bytes" 'BEGIN { printf "%.0f", w + b }')
        [ "$q" = 1 ] && q1[$k]=$rate
        [ "$q" = 4 ] && q4[$k]=$rate
        echo "  quarter $q $k: $rate rows/s, $bytes WAL bytes" >&2
        mb1=$(table_mb "$k")
        echo "$k,$q,$(awk -v a="$mb0" -v b="$mb1" 'BEGIN { printf "%.1f", (a + b) / 2 }'),$rate" >>"$curve"
    done
done

{
    echo "### Inserts with each kind of key (\`make bench-inserts\`, PostgreSQL $version, $clients clients, $rows rows per kind, shared_buffers $shared_buffers)"
    echo
    echo "| key | rows/s, first quarter | rows/s, last quarter | heap | index (bytes, vs identity) | WAL bytes per row | IDs twice |"
    echo "|---|---|---|---|---|---|---|"
    identity_index=$(psql -At -c "SELECT pg_indexes_size('k_identity')")
    for k in "${kinds[@]}"; do
        sizes=$(psql -At -F ' ' -c "SELECT pg_size_pretty(pg_relation_size('k_$k')), pg_indexes_size('k_$k'), count(*), count(*) - count(DISTINCT id) FROM k_$k")
        read -r heap index count twice <<<"$(echo "$sizes" | sed 's/ \([kMG]B\)/\1/')"
        per_row=$(awk -v w="${wal[$k]}" -v n="$count" 'BEGIN { printf "%.0f", w / n }')
        echo "| $k | ${q1[$k]} | ${q4[$k]} | $heap | $index, $(awk -v a="$index" -v b="$identity_index" 'BEGIN { printf "%.3f", a / b }')× | $per_row | $twice |"
    done
    echo
    echo "Anchors of the same run: identity for rate and size, UUIDv4 for the last quarter's cliff."
    echo
    echo "Rows/s over table size: $out/inserts/rows-per-second-$clients.svg (each quarter's rate at the table's size in its middle; data in $curve)."
} | tee "$report"
python3 "$root/scripts/bench-chart.py" "$curve" "$out/inserts/rows-per-second-$clients.svg" \
    "Inserts by key kind, $clients clients, PostgreSQL $version ($rows rows, shared_buffers $shared_buffers)"
