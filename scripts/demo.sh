#!/usr/bin/env bash
# `make run`: a throwaway cluster with pg_ticket preloaded, a short tour of
# the SQL API, and the cluster left running.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=/tmp/pgt-demo
port=${PGTICKET_DEMO_PORT:-55432}
"$root/scripts/cluster.sh" start "$dir" "$port" "pg_ticket.machine_id = 7"
psql="psql -X -h $dir -p $port -U postgres -d postgres"
$psql -v ON_ERROR_STOP=1 -e <<'SQL'
CREATE EXTENSION pg_ticket;
-- This server is also a machine-id registry (docs/leases.md) for the
-- ticket-client examples. A registry holds off after it is created (and
-- after every start) until a lease an earlier life of it granted could
-- have ended, 55 s by default; the refusal says until when, and how to end
-- it:
\set ON_ERROR_STOP 0
SELECT * FROM pgticket.lease_machine_id('tour');
\set ON_ERROR_STOP 1
-- This one is new, so an administrator may vouch for it:
SELECT pgticket.end_lease_hold_off();

-- Scoped IDs: one counter per (queue, domain), created on first use.
SELECT '/queues/' || q || '/' || path || '/' || next_scoped_id(q, d) AS url
  FROM (VALUES ('demo-queue', 'request', 'requests'), ('demo-queue', 'request', 'requests'),
               ('demo-queue', 'batch', 'batches'), ('mail-queue', 'request', 'requests'),
               ('mail-queue', 'batch', 'batches'), ('demo-queue', 'request', 'requests')) v(q, d, path);

-- A gap-free invoice series: a rolled-back invoice gives its number back.
CREATE TABLE invoice (
    no    bigint NOT NULL DEFAULT next_scoped_id('shop-17', 'invoice/2026'),
    total numeric NOT NULL
);
INSERT INTO invoice(total) VALUES (10);
BEGIN;
INSERT INTO invoice(total) VALUES (-1) RETURNING no AS taken_then_rolled_back;
ROLLBACK;
INSERT INTO invoice(total) VALUES (20) RETURNING no AS retried;
SELECT * FROM invoice ORDER BY no;

-- A block of IDs for a worker that numbers records itself.
SELECT * FROM reserve_block('importer', 1000);
SELECT * FROM reserve_block('importer', 1000);

-- Snowflake keys, decoded.
CREATE TABLE event (id bigint PRIMARY KEY DEFAULT snowflake_id(), what text);
INSERT INTO event(what) VALUES ('signup'), ('login'), ('logout');
SELECT e.id, e.what, d.* FROM event e, snowflake_decode(e.id) d ORDER BY e.id;

SELECT * FROM pgticket.marks ORDER BY kind, queue, domain, block_name;
SQL
echo
echo "pg_ticket demo is running. Connect: $psql   Stop: make stop"
