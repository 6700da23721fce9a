-- Defects found in 0.1.0 by review, as a user meets them (issue "Hardening").
-- Quietly: the suite also runs on a database upgraded from 0.1.0
-- (scripts/regress.sh with UPGRADE_FROM), where the extension exists.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_ticket;
RESET client_min_messages;
\set VERBOSITY default

-- Values taken before SET TRANSACTION READ ONLY are stored at commit, and
-- the user's own rows with them; PostgreSQL commits such a transaction.
CREATE TABLE ro_rows (v int);
BEGIN;
SELECT next_scoped_id('ro', 'a') AS a1, next_scoped_id('ro', 'a') AS a2;
INSERT INTO ro_rows VALUES (1);
SET TRANSACTION READ ONLY;
COMMIT;
SELECT count(*) AS rows_kept FROM ro_rows;
SELECT current_scoped_id('ro', 'a') AS mark_kept;
-- Allocating after the flag is set stays refused.
BEGIN;
SELECT next_scoped_id('ro', 'a');
SET TRANSACTION READ ONLY;
SELECT next_scoped_id('ro', 'a');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT next_scoped_id('ro', 'a') AS next_after_rollback;

-- 0.3.0: marks are never emptied: DELETE and TRUNCATE of the state tables
-- are refused (55000), even for their owner, so no value handed out can be
-- handed out again (on the tickets table a lowering or renaming UPDATE too:
-- tickets_hardening.rs).
SELECT next_scoped_id('gone', 'a');
SELECT first_id FROM reserve_block('gone', 5);
DELETE FROM pgticket.scoped_counters WHERE queue = 'gone';
TRUNCATE pgticket.blocks;
TRUNCATE pgticket.tickets;
-- In replica mode (0.5.0, SPEC s.19: how replicated rows arrive) the
-- DELETE is not applied: the row stays.
SET session_replication_role = replica;
DELETE FROM pgticket.scoped_counters WHERE queue = 'gone';
RESET session_replication_role;
SELECT mark AS still_there FROM pgticket.scoped_counters WHERE queue = 'gone';
UPDATE pgticket.blocks SET mark = mark + 10 WHERE name = 'gone';
SELECT next_scoped_id('gone', 'a') AS continues, first_id AS above_the_raised_mark FROM reserve_block('gone', 1);
-- If the row goes anyway (an owner who disabled the trigger), values taken
-- from it are an error at commit, never a silent loss.
BEGIN;
SELECT next_scoped_id('gone2', 'a');
ALTER TABLE pgticket.scoped_counters DISABLE TRIGGER never_emptied;
DELETE FROM pgticket.scoped_counters WHERE queue = 'gone2';
ALTER TABLE pgticket.scoped_counters ENABLE ALWAYS TRIGGER never_emptied;
SELECT next_scoped_id('gone2', 'a');
COMMIT;
\echo :LAST_ERROR_SQLSTATE
SELECT current_scoped_id('gone2', 'a') AS nothing_committed;

-- Session settings (they exist without preloading too).
SHOW pg_ticket.durable_commit;
SHOW pg_ticket.max_transaction_entries;

-- A transaction may hold only so many scopes and savepoint entries.
BEGIN;
SET LOCAL pg_ticket.max_transaction_entries = 10;
SELECT count(next_scoped_id('cap', 'd' || g)) FROM generate_series(1, 10) g;
SELECT next_scoped_id('cap', 'one too many');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;

-- Snowflake settings are checked when set, not at the next restart.
ALTER SYSTEM SET pg_ticket.epoch = 'garbage';
\echo :LAST_ERROR_SQLSTATE
ALTER SYSTEM SET pg_ticket.machine_id = 1024;
\echo :LAST_ERROR_SQLSTATE
ALTER SYSTEM SET pg_ticket.epoch = '2025-06-01';
ALTER SYSTEM RESET pg_ticket.epoch;

-- DROP EXTENSION in a transaction that allocated commits; what was taken
-- went with the tables. (A database of its own: nothing here depends on
-- the extension.)
CREATE DATABASE pgt_drop;
\c pgt_drop
CREATE EXTENSION pg_ticket;
BEGIN;
SELECT next_scoped_id('dropped', 'a'), next_scoped_id('dropped', 'a');
SELECT * FROM reserve_block('dropped', 5);
DROP EXTENSION pg_ticket;
COMMIT;
SELECT count(*) AS extension_left FROM pg_extension WHERE extname = 'pg_ticket';
CREATE EXTENSION pg_ticket;
-- DROP and CREATE in one transaction: the new tables start afresh, and
-- nothing from backend memory leaks into them.
BEGIN;
SELECT next_scoped_id('recreated', 'a'), next_scoped_id('recreated', 'a'), next_scoped_id('recreated', 'a');
DROP EXTENSION pg_ticket;
CREATE EXTENSION pg_ticket;
SELECT next_scoped_id('recreated', 'a') AS first_in_new_tables;
COMMIT;
SELECT next_scoped_id('recreated', 'a') AS then, next_scoped_id('recreated', 'a') AS next;
SELECT mark FROM pgticket.marks WHERE queue = 'recreated';
\c regression
DROP DATABASE pgt_drop;

-- Names are text in the database's encoding, which need not be UTF-8.
CREATE DATABASE pgt_latin1 TEMPLATE template0 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C';
\c pgt_latin1
SET client_encoding = 'UTF8';
CREATE EXTENSION pg_ticket;
SELECT next_scoped_id('café', 'd') AS c1, next_scoped_id('café', 'd') AS c2, next_scoped_id('cafe', 'd') AS other;
SELECT * FROM reserve_block('bloc_é', 5);
SELECT * FROM reserve_block('bloc_é', 5);
SELECT current_scoped_id('café', 'd'), current_block_mark('bloc_é');
SELECT kind, queue, domain, block_name, mark FROM pgticket.marks ORDER BY kind, queue, block_name;
SELECT octet_length(queue) AS latin1_bytes FROM pgticket.scoped_counters WHERE queue = 'café';
-- The trigger helpers on a table whose name is not ASCII (0.2.0: XX000
-- from reading the LATIN1 name as UTF-8).
CREATE TABLE "facturé" (no bigint, shop text);
CREATE TRIGGER number_it BEFORE INSERT OR UPDATE ON "facturé" FOR EACH ROW EXECUTE FUNCTION assign_scoped_id('no', 'shop', 'facture');
CREATE TRIGGER ticket_it BEFORE INSERT OR UPDATE ON "facturé" FOR EACH ROW EXECUTE FUNCTION assign_ticket('no', 'shop', 'facture');
INSERT INTO "facturé" (shop) VALUES ('boutique');
SELECT no FROM "facturé";
CREATE TABLE "petite_facturé" (no smallint, shop text);
CREATE TRIGGER number_it BEFORE INSERT OR UPDATE ON "petite_facturé" FOR EACH ROW EXECUTE FUNCTION assign_scoped_id('no', 'shop', 'petite');
SELECT pgticket.advance_scoped_id('boutique', 'petite', 32767);
INSERT INTO "petite_facturé" (shop) VALUES ('boutique');
\echo :LAST_ERROR_SQLSTATE
CREATE TABLE "mal_nommé" (no bigint, shop text);
CREATE TRIGGER number_it BEFORE INSERT OR UPDATE ON "mal_nommé" FOR EACH ROW EXECUTE FUNCTION assign_scoped_id('numéro', 'shop', 'facture');
INSERT INTO "mal_nommé" (shop) VALUES ('boutique');
\c regression
DROP DATABASE pgt_latin1;
-- The same names in this UTF-8 database.
SELECT next_scoped_id('café', 'd') AS c1, next_scoped_id('café', 'd') AS c2;
SELECT * FROM reserve_block('bloc_é', 5);
SELECT octet_length(queue) AS utf8_bytes FROM pgticket.scoped_counters WHERE queue = 'café';
