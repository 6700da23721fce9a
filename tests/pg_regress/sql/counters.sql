-- Scoped counters and blocks as a user sees them (SPEC §1, §2, §4, §5).
-- Quietly: the suite also runs on a database upgraded from 0.1.0
-- (scripts/regress.sh with UPGRADE_FROM), where the extension exists.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_ticket;
RESET client_min_messages;

-- A scope springs into existence on first use, at 1.
SELECT next_scoped_id('demo-queue', 'request') AS r1,
       next_scoped_id('demo-queue', 'request') AS r2,
       next_scoped_id('demo-queue', 'batch') AS b1;
SELECT '/queues/demo-queue/requests/' || next_scoped_id('demo-queue', 'request') AS url;

-- ROLLBACK gives values back: the gap-free invoice series.
BEGIN;
SELECT next_scoped_id('invoices', 'shop-17/2026');
SELECT next_scoped_id('invoices', 'shop-17/2026');
ROLLBACK;
BEGIN;
SELECT next_scoped_id('invoices', 'shop-17/2026');
COMMIT;

-- ROLLBACK TO SAVEPOINT gives back what was taken after the savepoint.
BEGIN;
SELECT next_scoped_id('invoices', 'shop-17/2026');
SAVEPOINT s1;
SELECT next_scoped_id('invoices', 'shop-17/2026');
SELECT next_scoped_id('invoices', 'shop-18/2026');
ROLLBACK TO SAVEPOINT s1;
SELECT next_scoped_id('invoices', 'shop-17/2026'), next_scoped_id('invoices', 'shop-18/2026');
COMMIT;

-- An error after allocating aborts the transaction and gives the values back.
BEGIN;
SELECT next_scoped_id('invoices', 'shop-17/2026');
SELECT 1/0;
COMMIT;
SELECT next_scoped_id('invoices', 'shop-17/2026');

-- DEFAULT expressions.
CREATE TABLE invoice (
    no   bigint NOT NULL DEFAULT next_scoped_id('invoices', 'shop-99/2026'),
    item text
);
INSERT INTO invoice(item) VALUES ('tea'), ('cake');
BEGIN;
INSERT INTO invoice(item) VALUES ('lost');
ROLLBACK;
INSERT INTO invoice(item) VALUES ('coffee');
SELECT * FROM invoice ORDER BY no;

-- Blocks: (1,3) then (4,6) for size 3 on a fresh name.
SELECT * FROM reserve_block('worker-pool', 3);
SELECT * FROM reserve_block('worker-pool', 3);
SELECT current_block_mark('worker-pool'), current_scoped_id('demo-queue', 'request'),
       current_scoped_id('never', 'used');

-- The view of every mark.
SELECT kind, queue, domain, block_name, mark, remaining FROM pgticket.marks ORDER BY kind, queue, domain, block_name;

-- Bad input: a clear error, the SQLSTATE of SPEC §4, nothing changed.
SELECT next_scoped_id(NULL, 'request');
\echo :LAST_ERROR_SQLSTATE
SELECT next_scoped_id('demo-queue', '');
\echo :LAST_ERROR_SQLSTATE
SELECT next_scoped_id(repeat('q', 256), 'request');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM reserve_block('worker-pool', 0);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM reserve_block('worker-pool', 2000000000000);
\echo :LAST_ERROR_SQLSTATE
SELECT current_block_mark('worker-pool');

-- Overflow at 2^63-1: refused, the mark left as it was.
SELECT pgticket.advance_scoped_id('edge', 'top', 9223372036854775806);
SELECT next_scoped_id('edge', 'top');
SELECT next_scoped_id('edge', 'top');
\echo :LAST_ERROR_SQLSTATE
SELECT current_scoped_id('edge', 'top');
SELECT pgticket.advance_block('edge', 9223372036854775800);
SELECT * FROM reserve_block('edge', 8);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM reserve_block('edge', 7);

-- Marks move forward, never back.
SELECT pgticket.advance_scoped_id('demo-queue', 'request', 2);
\echo :LAST_ERROR_SQLSTATE
SELECT pgticket.advance_scoped_id('demo-queue', 'request', 1000);
SELECT next_scoped_id('demo-queue', 'request');

-- Read-only transactions cannot allocate.
BEGIN READ ONLY;
SELECT next_scoped_id('demo-queue', 'request');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;

-- Many scopes in one transaction: each written once at commit.
BEGIN;
SELECT count(next_scoped_id('many', 'scope-' || (g % 1000))) FROM generate_series(1, 5000) g;
COMMIT;
SELECT count(*) AS scopes, min(mark), max(mark) FROM pgticket.marks WHERE queue = 'many';

-- A deferred trigger that allocates at commit runs before the marks are
-- written, so its values are kept.
CREATE TABLE shipment (id int, label bigint);
CREATE FUNCTION label_shipment() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE shipment SET label = next_scoped_id('labels', 'deferred') WHERE id = NEW.id;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER label_at_commit AFTER INSERT ON shipment
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION label_shipment();
BEGIN;
INSERT INTO shipment(id) VALUES (1), (2);
SELECT current_scoped_id('labels', 'deferred') AS before_commit;
COMMIT;
SELECT * FROM shipment ORDER BY id;
SELECT current_scoped_id('labels', 'deferred') AS after_commit, next_scoped_id('labels', 'deferred');
