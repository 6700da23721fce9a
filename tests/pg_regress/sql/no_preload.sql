-- Without shared_preload_libraries: counters work, snowflake_id() explains
-- what to add (SPEC §3).
CREATE EXTENSION pg_ticket;
SELECT next_scoped_id('no-preload', 'x'), next_scoped_id('no-preload', 'x');
SELECT * FROM reserve_block('no-preload', 2);
SELECT snowflake_id();
\echo :LAST_ERROR_SQLSTATE
-- Decoding needs an epoch: with no space recorded in the database, the
-- server's, which exists only when preloaded.
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
-- A registry need not preload; it leases in its database's ID space, the
-- epoch its configuration names (recorded at the first lease), not one a
-- session sets on the placeholder.
SELECT pgticket.end_lease_hold_off();
SET pg_ticket.epoch = '2031-01-01';
SELECT epoch_ms = 1767225600000 AS configured_epoch FROM pgticket.lease_machine_id('no-preload holder', '5 s');
SELECT epoch_ms FROM pgticket.id_space;
RESET pg_ticket.epoch;
-- With a space recorded, IDs are read in it, preloaded or not (#32 item 7):
-- machine 5 of 10 machine bits, 3 ms after the recorded epoch.
SELECT created_at, machine_id, sequence FROM snowflake_decode((3::bigint << 22) | (5 << 12) | 7);
