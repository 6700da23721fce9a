#!/usr/bin/env bash
# Throwaway PostgreSQL clusters for the demo, the tests and the benchmark,
# of the version whose pg_config is in $PG_CONFIG (default: 15).
#   scripts/cluster.sh start DIR PORT [postgresql.conf line ...]
#   scripts/cluster.sh stop DIR [fast|immediate]
#   scripts/cluster.sh up DIR            start an existing cluster again; with
#                                        FAKETIME_OFFSET set (e.g. -5m), under
#                                        faketime with the clock that far off;
#                                        or FAKETIME_FILE set, with the offset
#                                        read from that file on every call
# PostgreSQL refuses to run as root, so as root the cluster belongs to the
# `postgres` OS user; as anyone else, to that user. The socket lives in DIR
# (keep DIR short: Unix socket paths are limited to ~107 bytes).
set -euo pipefail
PGBIN=$("${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}" --bindir)

as_owner() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

cmd=${1:?usage: cluster.sh start|stop DIR [PORT] [conf lines]}
dir=${2:?cluster directory}
case "$cmd" in
start)
    port=${3:?port}
    shift 3
    if [ -f "$dir/data/postmaster.pid" ]; then
        as_owner "$PGBIN/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
    fi
    rm -rf "$dir"
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres: "$dir"
    as_owner "$PGBIN/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log"
    {
        echo "port = $port"
        echo "listen_addresses = ''  # Unix socket in DIR only: no port clashes"
        echo "unix_socket_directories = '$dir'"
        echo "shared_preload_libraries = 'pg_ticket'"
        echo "max_prepared_transactions = 10"
        echo "max_connections = 60"
        for line in "$@"; do echo "$line"; done
    } | as_owner tee -a "$dir/data/postgresql.conf" >/dev/null
    as_owner "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start >/dev/null
    ;;
stop)
    as_owner "$PGBIN/pg_ctl" -D "$dir/data" -m "${3:-fast}" -w stop >/dev/null
    ;;
up)
    if [ -n "${FAKETIME_FILE:-}" ]; then
        # The clock's offset read from a file on every call: a test steps
        # the clock of the running server by writing it (e.g. +3600s).
        lib=$(dpkg -L libfaketime | grep '/libfaketime\.so\.1$' | head -1)
        as_owner env LD_PRELOAD="$lib" FAKETIME_TIMESTAMP_FILE="$FAKETIME_FILE" FAKETIME_NO_CACHE=1 \
            FAKETIME_DONT_FAKE_MONOTONIC=1 "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start >/dev/null
    elif [ -n "${FAKETIME_OFFSET:-}" ]; then
        # libfaketime preloaded directly: the `faketime` wrapper waits for
        # every process that inherited it, the postmaster included.
        lib=$(dpkg -L libfaketime | grep '/libfaketime\.so\.1$' | head -1)
        as_owner env LD_PRELOAD="$lib" FAKETIME="$FAKETIME_OFFSET" FAKETIME_DONT_FAKE_MONOTONIC=1 \
            "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start >/dev/null
    else
        as_owner "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start >/dev/null
    fi
    ;;
*)
    echo "unknown command $cmd" >&2
    exit 2
    ;;
esac
