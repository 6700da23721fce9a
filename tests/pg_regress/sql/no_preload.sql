-- Without shared_preload_libraries: counters work, snowflake_id() explains
-- what to add (SPEC §3).
CREATE EXTENSION pg_ticket;
SELECT next_scoped_id('no-preload', 'x'), next_scoped_id('no-preload', 'x');
SELECT * FROM reserve_block('no-preload', 2);
SELECT snowflake_id();
\echo :LAST_ERROR_SQLSTATE
-- Decoding needs this server's epoch, which exists only when preloaded.
SELECT * FROM snowflake_decode(1);
\echo :LAST_ERROR_SQLSTATE
-- The session settings exist without preloading.
SHOW pg_ticket.durable_commit;
-- Time ranges read the epoch too; the status view says what it can.
SELECT snowflake_min_id(now());
\echo :LAST_ERROR_SQLSTATE
SELECT preloaded, epoch, machine_id, refusals_overflow FROM pgticket.status;
-- Tickets live in shared memory.
SELECT next_ticket('q', 'd');
\echo :LAST_ERROR_SQLSTATE
