#!/usr/bin/env bash
# The #[pg_test] tier. As root, cargo pgrx test must run the cluster as the
# `postgres` user (PostgreSQL refuses root), in a pgdata that user can write.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ]; then
    rm -rf /tmp/pgt-pgrx
    mkdir -p /tmp/pgt-pgrx && chown postgres: /tmp/pgt-pgrx
    exec cargo pgrx test pg15 --runas postgres --pgdata /tmp/pgt-pgrx/data
else
    exec cargo pgrx test pg15
fi
