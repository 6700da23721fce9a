-- Runs first when scripts/regress.sh is given UPGRADE_FROM=0.4.0: the rest
-- of the suite then runs on a database whose extension was created at 0.4.0
-- and updated, with the current library.
CREATE EXTENSION pg_ticket VERSION '0.4.0';
SELECT extversion FROM pg_extension WHERE extname = 'pg_ticket';
SELECT next_scoped_id('made-by-0.4.0', 'd'), next_scoped_id('made-by-0.4.0', 'd');
SELECT next_ticket('made-by-0.4.0', 'd') AS ticket_before;
SELECT last_id FROM reserve_block('made-by-0.4.0', 10);
ALTER EXTENSION pg_ticket UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'pg_ticket';
SELECT next_scoped_id('made-by-0.4.0', 'd') AS continues;
SELECT next_ticket('made-by-0.4.0', 'd') > 1 AS ticket_continues;
SELECT first_id FROM reserve_block('made-by-0.4.0', 5) AS block_continues;
-- Leave the marks as a fresh database has them, for the tests that follow
-- (a mark is never deleted: the trigger is put aside for it).
ALTER TABLE pgticket.scoped_counters DISABLE TRIGGER never_emptied;
DELETE FROM pgticket.scoped_counters WHERE queue = 'made-by-0.4.0';
ALTER TABLE pgticket.scoped_counters ENABLE ALWAYS TRIGGER never_emptied;
ALTER TABLE pgticket.tickets DISABLE TRIGGER never_emptied;
DELETE FROM pgticket.tickets WHERE queue = 'made-by-0.4.0';
ALTER TABLE pgticket.tickets ENABLE ALWAYS TRIGGER never_emptied;
ALTER TABLE pgticket.blocks DISABLE TRIGGER never_emptied;
DELETE FROM pgticket.blocks WHERE name = 'made-by-0.4.0';
ALTER TABLE pgticket.blocks ENABLE ALWAYS TRIGGER never_emptied;
