#!/usr/bin/env bash
# `make dist`: the source distribution PGXN takes, target/dist/pg_ticket-<version>.zip,
# one folder pg_ticket-<version>/ holding the tracked tree (META.json at its
# top). Made by `git archive` from the working tree's tracked files as they
# are now (`git stash create` snapshots uncommitted changes without touching
# them); untracked files are left out. tests/integration/tests/dist.rs checks it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
out="$root/target/dist/pg_ticket-$version.zip"
mkdir -p "$(dirname "$out")"
tree=$(git stash create 2>/dev/null || true) # no identity or nothing to snapshot: HEAD
git archive --format=zip --prefix="pg_ticket-$version/" -o "$out" "${tree:-HEAD}"
echo "dist: $out"
