#!/usr/bin/env bash
# The nemesis (SPEC §14, tests/nemesis): a fleet on loopback under seeded
# random faults, then the checker.
#   make soak [MINUTES=10] [SEED=n]       (PG_VERSION=15|16|17|18, default 15)
#   SOAK_SECONDS=180 scripts/soak.sh      (CI's budget: make test-nemesis)
# Prints the seed first; the same seed replays the same faults. The
# history is kept in /tmp/pgt-nem-work (history.jsonl, clients/*.bin);
# after a violation the fleet is left running (/tmp/pgt-nem-*).
# NEMESIS_CLIENT_BIN runs other client processes (another release's
# ticket-worker); PG_CONFIG another server build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
seconds=${SOAK_SECONDS:-$(( ${MINUTES:-10} * 60 ))}
export PG_CONFIG=${PG_CONFIG:-$(scripts/pg-config.sh "${PG_VERSION:-15}")}
cargo build -p pg_ticket_nemesis --bin nemesis -p pg_ticket_integration --bin ticket-worker
# A run stopped half-way leaves servers behind: they would hold the ports.
for data in /tmp/pgt-nem-*/data; do
    [ -f "$data/postmaster.pid" ] || continue
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$("$PG_CONFIG" --bindir)/pg_ctl" -D "$data" -m immediate stop >/dev/null 2>&1 || true
    else "$("$PG_CONFIG" --bindir)/pg_ctl" -D "$data" -m immediate stop >/dev/null 2>&1 || true; fi
done
exec target/debug/nemesis run --seconds "$seconds" ${SEED:+--seed "$SEED"} \
    --client-bin "${NEMESIS_CLIENT_BIN:-target/debug/ticket-worker}"
