-- PREPARE TRANSACTION / COMMIT PREPARED behave like COMMIT; ROLLBACK
-- PREPARED like ROLLBACK (SPEC §1).
-- Quietly: the suite also runs on a database upgraded from 0.1.0
-- (scripts/regress.sh with UPGRADE_FROM), where the extension exists.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_ticket;
RESET client_min_messages;

BEGIN;
SELECT next_scoped_id('twophase', 'a'), next_scoped_id('twophase', 'a');
SELECT * FROM reserve_block('twophase', 10);
PREPARE TRANSACTION 'pgt-1';
-- The prepared transaction still holds the scope; another scope is free.
SELECT next_scoped_id('twophase', 'b');
COMMIT PREPARED 'pgt-1';
SELECT next_scoped_id('twophase', 'a'), current_block_mark('twophase');

BEGIN;
SELECT next_scoped_id('twophase', 'a');
SELECT * FROM reserve_block('twophase', 5);
PREPARE TRANSACTION 'pgt-2';
ROLLBACK PREPARED 'pgt-2';
SELECT next_scoped_id('twophase', 'a'), current_block_mark('twophase');

-- The next transaction after a PREPARE starts clean.
BEGIN;
SELECT next_scoped_id('twophase', 'c');
PREPARE TRANSACTION 'pgt-3';
BEGIN;
SELECT next_scoped_id('twophase', 'd');
ROLLBACK;
COMMIT PREPARED 'pgt-3';
SELECT current_scoped_id('twophase', 'c'), current_scoped_id('twophase', 'd');

-- WITH HOLD cursors are materialized at commit, before the marks are written.
-- PostgreSQL re-runs a held cursor's query from the start to persist it, so
-- a volatile function's rows already fetched are computed again: 2 becomes a
-- gap (as with nextval()), and the mark written covers every value computed.
BEGIN;
DECLARE held CURSOR WITH HOLD FOR SELECT next_scoped_id('cursor', 'x') FROM generate_series(1, 3);
FETCH 1 FROM held;
COMMIT;
FETCH ALL FROM held;
CLOSE held;
SELECT current_scoped_id('cursor', 'x'), next_scoped_id('cursor', 'x');
