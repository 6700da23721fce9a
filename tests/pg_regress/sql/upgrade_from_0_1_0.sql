-- Runs first when scripts/regress.sh is given UPGRADE_FROM=0.1.0: the rest
-- of the suite then runs on a database whose extension was created at 0.1.0
-- and updated, with the current library.
CREATE EXTENSION pg_ticket VERSION '0.1.0';
SELECT extversion FROM pg_extension WHERE extname = 'pg_ticket';
SELECT next_scoped_id('made-by-0.1.0', 'd'), next_scoped_id('made-by-0.1.0', 'd');
ALTER EXTENSION pg_ticket UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'pg_ticket';
SELECT next_scoped_id('made-by-0.1.0', 'd') AS continues;
-- Leave the marks as a fresh database has them, for the tests that follow
-- (0.3.0 refuses to delete a mark: the trigger is put aside for it).
ALTER TABLE pgticket.scoped_counters DISABLE TRIGGER never_emptied;
DELETE FROM pgticket.scoped_counters WHERE queue = 'made-by-0.1.0';
ALTER TABLE pgticket.scoped_counters ENABLE ALWAYS TRIGGER never_emptied;
