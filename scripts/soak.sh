#!/usr/bin/env bash
# The nemesis (SPEC §14, tests/nemesis): a fleet on loopback under seeded
# random faults, then the checker.
#   make soak [MINUTES=10] [SEED=n]       (PG_VERSION=15|16|17|18, default 15)
#   SOAK_SECONDS=180 scripts/soak.sh      (CI's budget: make test-nemesis)
# Prints the seed first; the same seed replays the same faults. The
# history is kept in /tmp/pgt-nem-work (history.jsonl, clients/*.bin);
# after a violation the fleet is left running (/tmp/pgt-nem-*).
# NEMESIS_CLIENT_BIN runs other client processes (another release's
# ticket-worker); PG_CONFIG another server build (a 0.3.0 build: see
# TESTING.md); NEMESIS_FLEET=N a second fleet beside a running one
# (/tmp/pgt-nemN-*, ports 10*N up).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
seconds=${SOAK_SECONDS:-$(( ${MINUTES:-10} * 60 ))}
export PG_CONFIG=${PG_CONFIG:-$(scripts/pg-config.sh "${PG_VERSION:-15}")}
cargo build -p pg_ticket_nemesis --bin nemesis -p pg_ticket_integration --bin ticket-worker
fleet=${NEMESIS_FLEET:-0}
prefix=/tmp/pgt-nem$([ "$fleet" = 0 ] || echo "$fleet")-
# A run stopped half-way leaves servers behind: they would hold the ports.
for data in "$prefix"*/data; do
    [ -f "$data/postmaster.pid" ] || continue
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$("$PG_CONFIG" --bindir)/pg_ctl" -D "$data" -m immediate stop >/dev/null 2>&1 || true
    else "$("$PG_CONFIG" --bindir)/pg_ctl" -D "$data" -m immediate stop >/dev/null 2>&1 || true; fi
done
exec target/debug/nemesis run --seconds "$seconds" ${SEED:+--seed "$SEED"} --fleet "$fleet" --work "${prefix}work" \
    --client-bin "${NEMESIS_CLIENT_BIN:-target/debug/ticket-worker}"
