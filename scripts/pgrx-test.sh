#!/usr/bin/env bash
# The #[pg_test] tier on one PostgreSQL major version (15, 16, 17 or 18; default 15).
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
    # cargo pgrx test installs its test build itself, without sudo: give
    # this user write access to the two extension directories (an ACL entry)
    # and to pg_ticket's own files there (`make install` wrote them as root).
    pg_config=$(scripts/pg-config.sh "$version")
    for dir in "$("$pg_config" --pkglibdir)" "$("$pg_config" --sharedir)/extension"; do
        [ -w "$dir" ] || sudo setfacl -m "u:$(id -un):rwx" "$dir"
        for file in "$dir"/pg_ticket*; do
            [ ! -e "$file" ] || [ -w "$file" ] || sudo chown "$(id -un)" "$file"
        done
    done
    exec cargo pgrx test "pg$version" "${features[@]}"
fi
