#!/usr/bin/env bash
# `make package`: the Debian package postgresql-15-pg-ticket_<version>_amd64.deb
# in target/debian/, from a release build laid out by `cargo pgrx package`
# (library, control file, install and upgrade scripts under /usr). Depends
# on postgresql-15 and libpq5 (the lease worker reaches its registry
# through libpq); needs no Rust on the machine it is installed on.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
PG_CONFIG=$("$root/scripts/pg-config.sh" 15)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
arch=$(dpkg --print-architecture)
name=postgresql-15-pg-ticket
stage="$root/target/debian/${name}_${version}_${arch}"
rm -rf "$stage"
cargo pgrx package --pg-config "$PG_CONFIG" --no-default-features --features pg15 --out-dir "$stage"
strip --strip-unneeded "$stage/usr/lib/postgresql/15/lib/pg_ticket.so"
mkdir -p "$stage/DEBIAN" "$stage/usr/share/doc/$name"
cp README.md "$stage/usr/share/doc/$name/"
cp -r docs "$stage/usr/share/doc/$name/docs"
printf 'pg_ticket\nLicense: PostgreSQL\n' >"$stage/usr/share/doc/$name/copyright"
size_kb=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat >"$stage/DEBIAN/control" <<CONTROL
Package: $name
Version: $version
Architecture: $arch
Maintainer: pg_ticket developers <pg_ticket@localhost>
Depends: postgresql-15, libc6, libpq5
Section: database
Priority: optional
Installed-Size: $size_kb
Description: ID allocation inside PostgreSQL 15
 pg_ticket hands out IDs from inside the database: gap-free scoped counters
 (next_scoped_id), block reservations for workers (reserve_block) and 64-bit
 time-ordered snowflake IDs (snowflake_id). Add pg_ticket to
 shared_preload_libraries for snowflake IDs, then CREATE EXTENSION pg_ticket.
CONTROL
dpkg-deb --root-owner-group --build "$stage" "$root/target/debian/${name}_${version}_${arch}.deb" >/dev/null
echo "package: target/debian/${name}_${version}_${arch}.deb"
dpkg-deb --info "$root/target/debian/${name}_${version}_${arch}.deb" | sed -n 's/^ *\(Package\|Version\|Depends\|Installed-Size\):/  &/p'
