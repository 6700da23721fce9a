#!/usr/bin/env bash
# `make package`: one Debian package per tested PostgreSQL major,
# target/debian/postgresql-NN-pg-ticket_<version>_<arch>.deb, in PGDG's
# layout (/usr/lib/postgresql/NN/lib, /usr/share/postgresql/NN/extension)
# whatever layout the build's pg_config has (16 and 18 build against the
# PyPI wheels' headers; a module built for a major loads in any server of
# that major). The control file is dpkg-gencontrol's, from
# packaging/deb/control.in as PGDG's pg_buildext does it (PGVERSION filled
# in), with the shared-library dependencies dpkg-shlibdeps finds (libc6,
# libgcc-s1) and libpq5 named in control.in: the lease worker opens libpq
# at run time to reach its registry, which dpkg-shlibdeps cannot see. The
# packages need no Rust on the machine they are installed on.
#   PACKAGE_VERSIONS="15 16 17 18" (default: every tested major)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
arch=$(dpkg --print-architecture)
out="$root/target/debian"
mkdir -p "$out"
for major in ${PACKAGE_VERSIONS:-15 16 17 18}; do
    pg_config=$("$root/scripts/pg-config.sh" "$major")
    name=postgresql-$major-pg-ticket
    build="$out/build-$major"   # cargo pgrx package's own layout
    work="$out/work-$major"     # debian/ files for the dpkg tools, and the tree
    stage="$work/debian/$name"  # the package's tree, where the dpkg tools expect it
    rm -rf "$build" "$work"
    cargo pgrx package --pg-config "$pg_config" --no-default-features --features "pg$major" --out-dir "$build"
    lib="$stage/usr/lib/postgresql/$major/lib"
    ext="$stage/usr/share/postgresql/$major/extension"
    doc="$stage/usr/share/doc/$name"
    mkdir -p "$lib" "$ext" "$doc" "$stage/DEBIAN"
    install -m 644 "$(find "$build" -name pg_ticket.so)" "$lib/pg_ticket.so"
    strip --strip-unneeded "$lib/pg_ticket.so"
    find "$build" \( -name 'pg_ticket.control' -o -name 'pg_ticket--*.sql' \) -exec install -m 644 {} "$ext/" \;
    cp README.md CHANGELOG.md "$doc/"
    cp -r docs "$doc/docs"
    cp LICENSE "$doc/copyright"
    sed "s/PGVERSION/$major/g" packaging/deb/control.in >"$work/debian/control"
    printf 'pg-ticket (%s) unstable; urgency=medium\n\n  * Release %s (CHANGELOG.md).\n\n -- pg_ticket developers <pg_ticket@localhost>  %s\n' \
        "$version" "$version" "$(date -R)" >"$work/debian/changelog"
    (cd "$work" && dpkg-shlibdeps -Tdebian/substvars "debian/$name/usr/lib/postgresql/$major/lib/pg_ticket.so")
    (cd "$work" && dpkg-gencontrol -p"$name" -P"debian/$name" -Tdebian/substvars)
    dpkg-deb --root-owner-group --build "$stage" "$out/${name}_${version}_${arch}.deb" >/dev/null
    echo "package: target/debian/${name}_${version}_${arch}.deb"
    dpkg-deb --info "$out/${name}_${version}_${arch}.deb" | sed -n 's/^ *\(Package\|Version\|Depends\|Installed-Size\):/  &/p'
    rm -rf "$build" "$work"
done
