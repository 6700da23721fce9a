#!/usr/bin/env bash
# Installs what building and testing pg_ticket needs on a Debian machine,
# skipping whatever is already there: PostgreSQL 15 with its server headers,
# libclang (pgrx's bindgen), sudo (cargo pgrx test --runas), faketime
# (clock tests) and cargo-pgrx 0.18.1, then points pgrx at the system
# PostgreSQL 15. Works as root or as a user with sudo.
set -euo pipefail
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo

packages=(postgresql-15 postgresql-client-15 postgresql-server-dev-15 libclang-dev clang sudo faketime)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi

if ! cargo pgrx --version 2>/dev/null | grep -q '0\.18\.1'; then
    echo "setup: installing cargo-pgrx 0.18.1 (5-10 minutes on 2 cores)"
    cargo install --locked cargo-pgrx --version =0.18.1
fi

PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
if ! grep -qs "pg15" "${PGRX_HOME:-$HOME/.pgrx}/config.toml"; then
    cargo pgrx init --pg15 "$PG_CONFIG"
fi
