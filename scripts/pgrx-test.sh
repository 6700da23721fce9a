#!/usr/bin/env bash
# The #[pg_test] tier on one PostgreSQL major version (15 or 18; default 15).
# As root, cargo pgrx test must run the cluster as the `postgres` user
# (PostgreSQL refuses root), in a pgdata that user can write.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-15}
features=(--no-default-features --features "pg$version")
if [ "$(id -u)" = 0 ]; then
    rm -rf "/tmp/pgt-pgrx$version"
    mkdir -p "/tmp/pgt-pgrx$version" && chown postgres: "/tmp/pgt-pgrx$version"
    exec cargo pgrx test "pg$version" "${features[@]}" --runas postgres --pgdata "/tmp/pgt-pgrx$version/data"
else
    exec cargo pgrx test "pg$version" "${features[@]}"
fi
