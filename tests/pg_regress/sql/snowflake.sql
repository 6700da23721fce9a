-- Snowflake IDs (SPEC §3).
-- Quietly: the suite also runs on a database upgraded from 0.1.0
-- (scripts/regress.sh with UPGRADE_FROM), where the extension exists.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_ticket;
RESET client_min_messages;

-- The worked example: 24 000 000 000 ms after the epoch, machine 7, sequence 3.
SELECT * FROM snowflake_decode(24000000000::bigint * 4194304 + 7 * 4096 + 3);

SHOW pg_ticket.machine_id;
SHOW pg_ticket.epoch;

CREATE TABLE event (
    id   bigint PRIMARY KEY DEFAULT snowflake_id(),
    seen int
);
INSERT INTO event(seen) SELECT g FROM generate_series(1, 10000) g;
-- Unique (the primary key held), increasing in issue order, and now-ish.
SELECT count(*) AS ids,
       bool_and(id > prev) AS increasing
  FROM (SELECT id, lag(id) OVER (ORDER BY seen) AS prev FROM event) s;
SELECT bool_and(d.machine_id = 0) AS machine_0,
       bool_and(abs(extract(epoch FROM d.created_at - now())) < 60) AS timestamp_is_now
  FROM event, snowflake_decode(event.id) d;

-- Not transactional, like nextval().
CREATE TEMP TABLE kept AS SELECT snowflake_id() AS id;
BEGIN;
CREATE TEMP TABLE lost AS SELECT snowflake_id() AS id;
ROLLBACK;
SELECT snowflake_id() > (SELECT id FROM kept) AS still_increasing;

SELECT * FROM snowflake_decode(-5);
\echo :LAST_ERROR_SQLSTATE
