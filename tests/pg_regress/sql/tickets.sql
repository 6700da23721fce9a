-- Tickets (SPEC §7): unique, never reused, not transactional, from shared
-- memory; the worker of this database reserves the segments.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_ticket;
RESET client_min_messages;
\set VERBOSITY default

-- Created on first use, at the server's offset (1); scopes are independent,
-- and unrelated to the scoped counter of the same name.
SELECT next_ticket('orders', 'eu') AS t1, next_ticket('orders', 'eu') AS t2, next_ticket('orders', 'us') AS other;
SELECT next_scoped_id('orders', 'eu') AS scoped_counter;
-- Not transactional: a rolled-back ticket is gone, never handed out again.
BEGIN;
SELECT next_ticket('orders', 'eu') AS rolled_back;
ROLLBACK;
SELECT next_ticket('orders', 'eu') AS after_rollback;
-- Many in one statement: all distinct, increasing.
SELECT count(DISTINCT t) AS distinct_tickets, bool_and(t > prev) AS increasing
  FROM (SELECT t, lag(t) OVER (ORDER BY g) AS prev
          FROM (SELECT g, next_ticket('bulk', 'x') AS t FROM generate_series(1, 20000) g) s) s2;
-- The reserved mark is ahead of what was handed out (a segment), in the
-- marks view and so in pg_dump.
SELECT kind, queue, domain, mark >= 4 AS reserved_ahead FROM pgticket.marks WHERE kind = 'ticket' AND queue = 'orders' ORDER BY domain;
SELECT queue, domain, next_value, cached_until >= next_value AS cached, segment_size >= 1 AS sized, refills >= 1 AS refilled
  FROM pgticket.ticket_cache WHERE queue = 'orders' ORDER BY domain;

-- Admin: forward only, and the cached rest is dropped.
SELECT pgticket.advance_ticket('orders', 'eu', 1000);
SELECT next_ticket('orders', 'eu') AS after_advance;
-- (The mark in its message depends on how far the worker fetched ahead.)
\set VERBOSITY sqlstate
SELECT pgticket.advance_ticket('orders', 'eu', 10);
\set VERBOSITY default
\echo :LAST_ERROR_SQLSTATE
CREATE ROLE ticket_user;
SET ROLE ticket_user;
SELECT next_ticket('orders', 'eu') > 1000 AS anyone_may_take;
SELECT pgticket.advance_ticket('orders', 'eu', 5000);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM pgticket.tickets;
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
DROP ROLE ticket_user;

-- Bad input.
SELECT next_ticket(NULL, 'eu');
\echo :LAST_ERROR_SQLSTATE
SELECT next_ticket('orders', '');
\echo :LAST_ERROR_SQLSTATE
BEGIN READ ONLY;
SELECT next_ticket('orders', 'eu');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- At the top of bigint: 2200H, never a wrap.
SELECT pgticket.advance_ticket('top', 'x', 9223372036854775806);
SELECT next_ticket('top', 'x');
SELECT next_ticket('top', 'x');
\echo :LAST_ERROR_SQLSTATE

-- Per-row tickets: the same trigger shape as assign_scoped_id.
CREATE TABLE job (queue text, no bigint);
CREATE TRIGGER number_jobs BEFORE INSERT OR UPDATE ON job FOR EACH ROW EXECUTE FUNCTION assign_ticket('no', 'queue', 'job');
INSERT INTO job (queue) VALUES ('mail'), ('mail'), ('sms');
BEGIN;
INSERT INTO job (queue) VALUES ('mail');
ROLLBACK;
INSERT INTO job (queue) VALUES ('mail');
SELECT queue, no FROM job ORDER BY queue, no;
INSERT INTO job (queue) VALUES (NULL);
\echo :LAST_ERROR_SQLSTATE
-- Waits for a refill are counted (every first use of a scope waits once).
SELECT waits_ticket_refill > 0 AS refill_waits_counted FROM pgticket.status;

SHOW pg_ticket.ticket_offset;
SHOW pg_ticket.ticket_increment;
SHOW pg_ticket.ticket_cache_scopes;
SHOW pg_ticket.ticket_wait_timeout;
