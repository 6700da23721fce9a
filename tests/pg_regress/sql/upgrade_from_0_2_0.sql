-- Runs first when scripts/regress.sh is given UPGRADE_FROM=0.2.0: the rest
-- of the suite then runs on a database whose extension was created at 0.2.0
-- and updated, with the current library.
CREATE EXTENSION pg_ticket VERSION '0.2.0';
SELECT extversion FROM pg_extension WHERE extname = 'pg_ticket';
SELECT next_scoped_id('made-by-0.2.0', 'd'), next_scoped_id('made-by-0.2.0', 'd');
SELECT next_ticket('made-by-0.2.0', 'd') AS ticket_before;
-- Snowflakes keep working before the update too (0.4.0's check of the
-- server's own machine id read a column 0.2.0's leases table lacks).
SELECT snowflake_id() > 0 AS stamps_before_update;
-- 0.2.0's lease functions on this library: refused until the update (their
-- leases would have no secret).
\set VERBOSITY terse
SELECT * FROM lease_machine_id('before-update');
\set VERBOSITY default
ALTER EXTENSION pg_ticket UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'pg_ticket';
-- An updated registry cannot prove it follows its own latest state (0.2.0
-- did not hold off at a start): it holds off once.
\set VERBOSITY sqlstate
SELECT * FROM pgticket.lease_machine_id('after-update');
\set VERBOSITY default
SELECT next_scoped_id('made-by-0.2.0', 'd') AS continues;
SELECT next_ticket('made-by-0.2.0', 'd') > 1 AS ticket_continues;
-- Leave the marks as a fresh database has them, for the tests that follow
-- (0.3.0 refuses to delete a mark: the trigger is put aside for it).
ALTER TABLE pgticket.scoped_counters DISABLE TRIGGER never_emptied;
DELETE FROM pgticket.scoped_counters WHERE queue = 'made-by-0.2.0';
ALTER TABLE pgticket.scoped_counters ENABLE ALWAYS TRIGGER never_emptied;
ALTER TABLE pgticket.tickets DISABLE TRIGGER never_emptied;
DELETE FROM pgticket.tickets WHERE queue = 'made-by-0.2.0';
ALTER TABLE pgticket.tickets ENABLE ALWAYS TRIGGER never_emptied;
