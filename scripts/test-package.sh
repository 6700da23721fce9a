#!/usr/bin/env bash
# The package tier: install the .deb from `make package` on a PostgreSQL 15
# without the build tree's install (what `make install` put there is removed
# first), check that the files come from the package, and run the pg_regress
# suite on fresh preloaded and plain clusters against it. Then remove the
# package and put the build tree's install back.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
export PG_CONFIG=$("$root/scripts/pg-config.sh" 15)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)
deb="$root/target/debian/postgresql-15-pg-ticket_${version}_$(dpkg --print-architecture).deb"
libdir=$("$PG_CONFIG" --pkglibdir)
extdir="$("$PG_CONFIG" --sharedir)/extension"

$SUDO dpkg -r postgresql-15-pg-ticket >/dev/null 2>&1 || true
$SUDO rm -f "$libdir/pg_ticket.so" "$extdir"/pg_ticket.control "$extdir"/pg_ticket--*.sql
$SUDO dpkg -i "$deb" >/dev/null
echo "test-package: installed $(basename "$deb"); its files:"
dpkg -L postgresql-15-pg-ticket | grep -E 'pg_ticket(\.so|\.control|--)' | sed 's/^/  /'
# The library, the install script, and the upgrade scripts of every release
# (0.1.0 -> 0.2.0 -> ...), so an installed older version can be updated.
for f in "$libdir/pg_ticket.so" "$extdir/pg_ticket.control" "$extdir/pg_ticket--$version.sql" "$root"/sql/pg_ticket--*--*.sql; do
    case "$f" in "$root"/sql/*) f="$extdir/$(basename "$f")" ;; esac
    dpkg -S "$f" >/dev/null || { echo "test-package: $f does not come from the package" >&2; exit 1; }
done
status=0
"$root/scripts/regress.sh" || status=$?
$SUDO dpkg -r postgresql-15-pg-ticket >/dev/null
make -C "$root" --no-print-directory install PG_VERSION=15 >/dev/null
[ $status = 0 ] && echo "test-package: the regress suite passed on the installed package"
exit $status
