#!/usr/bin/env bash
# The package tier. Every package `make package` made (one per tested
# major) is checked for what it holds: its name, PGDG's layout for its major
# and nothing outside it, the library, the control file naming this
# version, the install script and every upgrade script, and its
# dependencies (its major's server, libpq5). Then the PostgreSQL 15 one —
# the only major with PGDG's layout on these machines — is installed
# without the build tree's install (what `make install` put there is
# removed first), its files are checked to come from it, and the pg_regress
# suite runs on fresh preloaded and plain clusters against it. Then the
# package is removed and the build tree's install put back.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)
arch=$(dpkg --print-architecture)
fail() { echo "test-package: $*" >&2; exit 1; }
for major in ${PACKAGE_VERSIONS:-15 16 17 18}; do
    name=postgresql-$major-pg-ticket
    deb="$root/target/debian/${name}_${version}_${arch}.deb"
    [ -f "$deb" ] || fail "no package $deb"
    [ "$(dpkg-deb -f "$deb" Package)" = "$name" ] || fail "$deb is not named $name"
    [ "$(dpkg-deb -f "$deb" Version)" = "$version" ] || fail "$deb is not version $version"
    depends=$(dpkg-deb -f "$deb" Depends)
    for dep in "postgresql-$major" libpq5 libc6; do
        grep -Eq "(^|, )$dep( |,|$)" <<<"$depends" || fail "$name does not depend on $dep: $depends"
    done
    files=$(dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|' | grep -v '/$')
    lib=/usr/lib/postgresql/$major/lib ext=/usr/share/postgresql/$major/extension
    for f in "$lib/pg_ticket.so" "$ext/pg_ticket.control" "$ext/pg_ticket--$version.sql" \
        $(cd "$root/sql" && ls pg_ticket--*--*.sql | sed "s|^|$ext/|"); do
        grep -qx "$f" <<<"$files" || fail "$name lacks $f"
    done
    outside=$(grep -Ev "^($lib/|$ext/|/usr/share/doc/$name/)" <<<"$files" || true)
    [ -z "$outside" ] || fail "$name puts files outside PGDG's layout: $outside"
    control=$(dpkg-deb --fsys-tarfile "$deb" | tar -xO ".$ext/pg_ticket.control")
    grep -qx "default_version = '$version'" <<<"$control" || fail "$name's control file is not for $version"
    echo "test-package: $name: PGDG's layout for $major, $(wc -l <<<"$files") files, depends on $depends"
done

export PG_CONFIG=$("$root/scripts/pg-config.sh" 15)
deb="$root/target/debian/postgresql-15-pg-ticket_${version}_${arch}.deb"
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
