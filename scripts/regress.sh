#!/usr/bin/env bash
# The pg_regress tier: golden files of what users see, run as the postgres
# user on temporary instances (one preloaded, one not), against the
# extension installed in the PostgreSQL of $PG_CONFIG (default 15; make install).
# REGRESS_UPDATE=1 copies the results over the expected files.
# UPGRADE_FROM=0.1.0 runs the preloaded suite on a database whose extension
# was created at that release and updated (test upgrade_from_0_1_0 first).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
bindir=$("$PG_CONFIG" --bindir)
pg_regress=$(dirname "$("$PG_CONFIG" --pgxs)")/../test/regress/pg_regress

work=$(mktemp -d /tmp/pgt-regress.XXXX)
cp -r "$root/tests/pg_regress/." "$work/"
printf "shared_preload_libraries = 'pg_ticket'\nmax_prepared_transactions = 5\n" >"$work/preload.conf"
printf "max_prepared_transactions = 5\n" >"$work/plain.conf"
as_owner() {
    if [ "$(id -u)" = 0 ]; then chown -R postgres: "$work"; runuser -u postgres -- "$@"; else "$@"; fi
}
run() { # config, port, tests...
    local conf=$1 port=$2
    shift 2
    as_owner "$pg_regress" --bindir="$bindir" --inputdir="$work" --outputdir="$work" \
        --temp-instance="$work/tmp_check_$port" --temp-config="$work/$conf" --port="$port" \
        --dbname=regression "$@"
}
status=0
suite=(counters prepared snowflake hardening helpers tickets leases)
if [ -n "${UPGRADE_FROM:-}" ]; then
    run preload.conf 55451 "upgrade_from_${UPGRADE_FROM//./_}" "${suite[@]}" || status=$?
else
    run preload.conf 55451 "${suite[@]}" || status=$?
    if [ $status = 0 ]; then run plain.conf 55452 no_preload || status=$?; fi
fi
if [ $status != 0 ]; then
    [ -f "$work/regression.diffs" ] && cat "$work/regression.diffs"
fi
if [ "${REGRESS_UPDATE:-}" = 1 ]; then
    cp "$work"/results/*.out "$root/tests/pg_regress/expected/"
fi
[ $status != 0 ] || rm -rf "$work"
exit $status
