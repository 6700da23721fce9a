-- Helpers (SPEC §12): per-row scopes, time ranges on snowflake keys, 32-bit
-- series, the status view.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_ticket;
RESET client_min_messages;
\set VERBOSITY default

-- Per-row scopes: invoices numbered per shop by a trigger.
CREATE TABLE invoice_h (shop text, no bigint, total numeric);
CREATE TRIGGER number_invoices BEFORE INSERT OR UPDATE ON invoice_h
    FOR EACH ROW EXECUTE FUNCTION assign_scoped_id('no', 'shop', 'invoice');
INSERT INTO invoice_h (shop, total) VALUES ('shop-1', 10), ('shop-2', 20), ('shop-1', 30);
-- A given number is refused (0.4.0, SPEC §18.4: 0.3.0 left it alone, and
-- the series handed it out again later).
INSERT INTO invoice_h (shop, no, total) VALUES ('shop-1', 2, 5);
\echo :LAST_ERROR_SQLSTATE
INSERT INTO invoice_h (shop, total) SELECT 'shop-2', g FROM generate_series(1, 3) g;
COPY invoice_h (shop, total) FROM stdin;
shop-3	1
shop-1	2
\.
SELECT shop, no, total FROM invoice_h ORDER BY shop, no;
-- A failed multi-row INSERT gives its numbers back.
INSERT INTO invoice_h (shop, total) VALUES ('shop-1', 1), ('shop-1', 1/0);
INSERT INTO invoice_h (shop, total) VALUES ('shop-1', 7) RETURNING shop, no;
-- A NULL queue value.
INSERT INTO invoice_h (shop, total) VALUES (NULL, 1);
\echo :LAST_ERROR_SQLSTATE

-- The domain from a column (per shop per fiscal year); integer ids; the
-- queue column an integer, numbered by its text.
CREATE TABLE invoice_y (shop int, fiscal_year int, no integer);
CREATE TRIGGER number_per_year BEFORE INSERT OR UPDATE ON invoice_y
    FOR EACH ROW EXECUTE FUNCTION assign_scoped_id('no', 'shop', 'column', 'fiscal_year');
INSERT INTO invoice_y (shop, fiscal_year) VALUES (17, 2026), (17, 2026), (17, 2027), (18, 2026);
SELECT shop, fiscal_year, no FROM invoice_y ORDER BY shop, fiscal_year, no;
SELECT queue, domain, mark FROM pgticket.marks WHERE queue IN ('17', '18') ORDER BY queue, domain;
INSERT INTO invoice_y (shop, fiscal_year) VALUES (17, NULL);
\echo :LAST_ERROR_SQLSTATE

-- A misdefined trigger fails at the first row.
CREATE TABLE bad_h (shop text, no date);
CREATE TRIGGER misnamed BEFORE INSERT OR UPDATE ON bad_h FOR EACH ROW EXECUTE FUNCTION assign_scoped_id('number', 'shop', 'd');
INSERT INTO bad_h (shop) VALUES ('x');
\echo :LAST_ERROR_SQLSTATE
DROP TRIGGER misnamed ON bad_h;
CREATE TRIGGER mistyped BEFORE INSERT OR UPDATE ON bad_h FOR EACH ROW EXECUTE FUNCTION assign_scoped_id('no', 'shop', 'd');
INSERT INTO bad_h (shop) VALUES ('x');
\echo :LAST_ERROR_SQLSTATE
DROP TRIGGER mistyped ON bad_h;
CREATE TRIGGER too_few BEFORE INSERT OR UPDATE ON bad_h FOR EACH ROW EXECUTE FUNCTION assign_scoped_id('no', 'shop');
INSERT INTO bad_h (shop) VALUES ('x');
\echo :LAST_ERROR_SQLSTATE
DROP TRIGGER too_few ON bad_h;
CREATE TRIGGER too_late AFTER INSERT ON invoice_h FOR EACH ROW EXECUTE FUNCTION assign_scoped_id('no', 'shop', 'invoice');
INSERT INTO invoice_h (shop, total) VALUES ('shop-9', 1);
\echo :LAST_ERROR_SQLSTATE
DROP TRIGGER too_late ON invoice_h;
SELECT count(*) AS nothing_taken FROM pgticket.marks WHERE queue IN ('x', 'shop-9');

-- number_rows(): the trigger made with its arguments checked at once.
CREATE TABLE invoice_n (shop text, fiscal_year int, no numeric(6), note date);
SELECT number_rows('invoice_n', 'no', 'shop', domain => 'invoice-n');
INSERT INTO invoice_n (shop) VALUES ('shop-1'), ('shop-1'), ('shop-2') RETURNING shop, no;
SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = 'invoice_n'::regclass;
-- Each mistake refused when the trigger is made, with the trigger's SQLSTATE.
SELECT number_rows('invoice_n', 'number', 'shop', domain => 'd');          -- no such id column
\echo :LAST_ERROR_SQLSTATE
SELECT number_rows('invoice_n', 'no', 'branch', domain => 'd');            -- no such queue column
\echo :LAST_ERROR_SQLSTATE
SELECT number_rows('invoice_n', 'no', 'shop', domain_column => 'year');    -- no such domain column
\echo :LAST_ERROR_SQLSTATE
SELECT number_rows('invoice_n', 'note', 'shop', domain => 'd');            -- an id column of dates
\echo :LAST_ERROR_SQLSTATE
SELECT number_rows('invoice_n', 'no', 'shop');                             -- no domain
\echo :LAST_ERROR_SQLSTATE
SELECT number_rows('invoice_n', 'no', 'shop', 'd', 'fiscal_year');         -- both
\echo :LAST_ERROR_SQLSTATE
SELECT number_rows('invoice_n', 'no', 'shop', domain => '');               -- an empty domain
\echo :LAST_ERROR_SQLSTATE
SELECT number_rows('invoice_n', 'no', 'shop', domain => 'd', kind => 'sequence');
\echo :LAST_ERROR_SQLSTATE
SELECT number_rows(NULL, 'no', 'shop', domain => 'd');
\echo :LAST_ERROR_SQLSTATE
CREATE TABLE invoice_g (shop text, tag text GENERATED ALWAYS AS ('shop-' || shop) STORED,
                        no bigint, made bigint GENERATED ALWAYS AS IDENTITY, given bigint DEFAULT 0);
SELECT number_rows('invoice_g', 'no', 'tag', domain => 'd');               -- a generated queue column
\echo :LAST_ERROR_SQLSTATE
SELECT number_rows('invoice_g', 'no', 'no', domain => 'd');                -- the id column names the scope
\echo :LAST_ERROR_SQLSTATE
SELECT number_rows('invoice_g', 'no', 'shop', domain_column => 'no');
\echo :LAST_ERROR_SQLSTATE
SELECT number_rows('invoice_g', 'made', 'shop', domain => 'd');            -- an identity
\echo :LAST_ERROR_SQLSTATE
SELECT number_rows('invoice_g', 'given', 'shop', domain => 'd');           -- a default
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS no_trigger FROM pg_trigger WHERE tgrelid = 'invoice_g'::regclass;
SELECT number_rows('invoice_n', 'no', 'shop', domain => 'd');              -- the trigger exists
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS one_trigger FROM pg_trigger WHERE tgrelid = 'invoice_n'::regclass;
-- A domain column and tickets; an id column of a domain over bigint.
CREATE DOMAIN ticket_no AS bigint CHECK (VALUE > 0);
CREATE TABLE invoice_t (shop text, fiscal_year int, no ticket_no);
SELECT number_rows('invoice_t', 'no', 'shop', domain_column => 'fiscal_year', kind => 'ticket');
INSERT INTO invoice_t (shop, fiscal_year) VALUES ('shop-1', 2026), ('shop-1', 2026);
SELECT count(DISTINCT no) AS two_tickets FROM invoice_t;
-- SPEC §18.4: a value given for a numbered column never leads to a
-- duplicate: refused (the default), or it moves the series above it.
CREATE TABLE refused (shop text, no bigint);
SELECT number_rows('refused', 'no', 'shop', domain => 'invoice');
INSERT INTO refused VALUES ('s', 1);
\echo :LAST_ERROR_SQLSTATE
CREATE TABLE imp (shop text, no bigint);
SELECT number_rows('imp', 'no', 'shop', domain => 'invoice', on_explicit => 'advance');
INSERT INTO imp VALUES ('s', 1), ('s', 2);
INSERT INTO imp (shop) VALUES ('s') RETURNING no;                  -- 3, not 1
INSERT INTO imp VALUES ('s', 10);                                   -- a gap the caller chose
INSERT INTO imp (shop) VALUES ('s') RETURNING no;                  -- 11
INSERT INTO imp VALUES ('s', 5);                                    -- at or below the mark: refused
\echo :LAST_ERROR_SQLSTATE
UPDATE imp SET no = 12 WHERE no = 11;                              -- an UPDATE of the number gives one too
UPDATE imp SET no = 4 WHERE no = 12;                               -- refused: below the mark
\echo :LAST_ERROR_SQLSTATE
UPDATE imp SET shop = 't' WHERE no = 12;                           -- 12 becomes a number of scope t
INSERT INTO imp (shop) VALUES ('t') RETURNING no;                  -- 13, not 1..12
UPDATE imp SET shop = 's' WHERE no = 1;                            -- the scope it had: kept
SELECT shop, no FROM imp ORDER BY shop, no;
INSERT INTO refused (shop) VALUES ('s');
UPDATE refused SET no = 9;                                         -- refused
\echo :LAST_ERROR_SQLSTATE
UPDATE refused SET shop = 's';                                     -- the same scope: nothing to number

SELECT number_rows('refused', 'no', 'shop', domain => 'x', on_explicit => 'sometimes');
\echo :LAST_ERROR_SQLSTATE
-- One series per value the scope column's type compares equal: 17, 17.0
-- and 17.00; 0 and -0; char(8) whatever its padding.
CREATE TABLE per_shop (shop numeric, rate float8, code char(8), no bigint);
SELECT number_rows('per_shop', 'no', 'shop', domain => 'n');
INSERT INTO per_shop (shop) VALUES (17), (17.0), (17.00) RETURNING shop, no;
CREATE TABLE per_rate (rate float8, no bigint);
SELECT number_rows('per_rate', 'no', 'rate', domain => 'r');
INSERT INTO per_rate (rate) VALUES (0), ('-0') RETURNING rate, no;
CREATE TABLE per_code (code char(8), no bigint);
SELECT number_rows('per_code', 'no', 'code', domain => 'c');
INSERT INTO per_code (code) VALUES ('ab'), ('ab      ') RETURNING code, no;
-- #32 review: scope types whose equal values print differently (interval
-- '1 day' = '24 hours', jsonb 17 = 17.0, a case-insensitive type) would
-- number one scope as two series: refused when made, and by a trigger
-- made by hand at its first row.
CREATE TABLE per_period (shop text, period interval, tags jsonb, no bigint);
SELECT number_rows('per_period', 'no', 'period', domain => 'p');
\echo :LAST_ERROR_SQLSTATE
SELECT number_rows('per_period', 'no', 'shop', domain_column => 'tags');
\echo :LAST_ERROR_SQLSTATE
CREATE TRIGGER by_hand BEFORE INSERT OR UPDATE ON per_period FOR EACH ROW
    EXECUTE FUNCTION assign_scoped_id('no', 'period', 'p', 'on_explicit=refuse');
INSERT INTO per_period (period) VALUES ('1 day');
\echo :LAST_ERROR_SQLSTATE
-- A trigger that does not fire on UPDATE would let an UPDATE set a number
-- unchecked: refused at its first row (0.3.0's, without the last argument,
-- are made OR UPDATE by the update to 0.4.0).
CREATE TABLE insert_only (shop text, no bigint);
CREATE TRIGGER insert_only BEFORE INSERT ON insert_only FOR EACH ROW EXECUTE FUNCTION assign_scoped_id('no', 'shop', 'io', 'on_explicit=refuse');
INSERT INTO insert_only (shop) VALUES ('s');
\echo :LAST_ERROR_SQLSTATE
-- The trigger fires on every UPDATE: a trigger of the user's that runs
-- before it and changes the number in an UPDATE of another column is seen.
CREATE TABLE renumbered (shop text, no bigint, note text);
SELECT number_rows('renumbered', 'no', 'shop', domain => 'rn');
INSERT INTO renumbered (shop) VALUES ('s'), ('s');
CREATE FUNCTION renumber() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN NEW.no := NEW.no + 10; RETURN NEW; END$$;
CREATE TRIGGER a_renumber BEFORE UPDATE ON renumbered FOR EACH ROW EXECUTE FUNCTION renumber();
UPDATE renumbered SET note = 'x' WHERE no = 1;
\echo :LAST_ERROR_SQLSTATE
-- A table with inheritance children, which its triggers do not reach.
CREATE TABLE parent_h (shop text, no bigint);
CREATE TABLE child_h () INHERITS (parent_h);
SELECT number_rows('parent_h', 'no', 'shop', domain => 'ph');
\echo :LAST_ERROR_SQLSTATE
-- Columns a trigger cannot number are refused when it is made: a domain
-- with a DEFAULT (every row would get it) or NOT NULL (every insert fails).
CREATE DOMAIN defaulted_no AS bigint DEFAULT 1;
CREATE DOMAIN required_no AS bigint NOT NULL;
CREATE TABLE bad_no (shop text, a defaulted_no, b required_no);
SELECT number_rows('bad_no', 'a', 'shop', domain => 'd');
\echo :LAST_ERROR_SQLSTATE
SELECT number_rows('bad_no', 'b', 'shop', domain => 'd');
\echo :LAST_ERROR_SQLSTATE
-- The trigger's name sorts after the table's own BEFORE triggers (a
-- row-skipping one runs first and takes no number), or is the caller's.
CREATE TABLE named (shop text, no bigint);
SELECT number_rows('named', 'no', 'shop', domain => 'd', trigger_name => 'number_named');
SELECT tgname FROM pg_trigger WHERE tgrelid = 'per_shop'::regclass;
-- An ordinary role cannot put a trigger on a table it does not own.
CREATE ROLE number_rows_plain;
SET ROLE number_rows_plain;
SELECT number_rows('invoice_n', 'no', 'shop', domain => 'other');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
DROP ROLE number_rows_plain;

-- Time ranges on snowflake keys: every machine's IDs of a millisecond.
SELECT snowflake_min_id('2026-01-01 00:00:00+00') AS min_at_epoch,
       snowflake_max_id('2026-01-01 00:00:00+00') AS max_at_epoch;
SELECT snowflake_min_id('2026-03-01 12:00:00.001+00') = snowflake_max_id('2026-03-01 12:00:00+00') + 1 AS consecutive_ms_touch,
       snowflake_min_id('2026-03-01 12:00:00.0009+00') = snowflake_min_id('2026-03-01 12:00:00+00') AS rounded_down;
SELECT snowflake_min_id('2025-12-31 23:59:59.999+00');
\echo :LAST_ERROR_SQLSTATE
SELECT snowflake_max_id('infinity');
\echo :LAST_ERROR_SQLSTATE
SELECT proname, provolatile FROM pg_proc
 WHERE proname IN ('snowflake_decode', 'snowflake_min_id', 'snowflake_max_id') ORDER BY proname;
CREATE TABLE event_h (id bigint PRIMARY KEY DEFAULT snowflake_id(), what text);
INSERT INTO event_h (what) SELECT 'e' || g FROM generate_series(1, 100) g;
SELECT count(*) AS in_the_last_hour FROM event_h
 WHERE id BETWEEN snowflake_min_id(now() - interval '1 hour') AND snowflake_max_id(clock_timestamp());
SET enable_seqscan = off;
EXPLAIN (COSTS OFF) SELECT * FROM event_h
 WHERE id BETWEEN snowflake_min_id('2026-11-01') AND snowflake_max_id('2026-11-30');
RESET enable_seqscan;

-- 32-bit series: a ceiling per scope.
SELECT pgticket.set_scoped_id_limit('t32', 'd', 3);
SELECT next_scoped_id('t32', 'd') FROM generate_series(1, 3);
SELECT next_scoped_id('t32', 'd');
\echo :LAST_ERROR_SQLSTATE
SELECT current_scoped_id('t32', 'd') AS mark_stays;
SELECT pgticket.set_scoped_id_limit('t32', 'd', 2);
\echo :LAST_ERROR_SQLSTATE
SELECT pgticket.set_scoped_id_limit('t32', 'd', 2147483647);
SELECT next_scoped_id('t32', 'd');
SELECT pgticket.advance_scoped_id('t32', 'd', 2147483648);
\echo :LAST_ERROR_SQLSTATE
-- A limit set in a rolled-back savepoint goes with it.
BEGIN;
SAVEPOINT s;
SELECT pgticket.set_scoped_id_limit('t32', 'd', 5);
ROLLBACK TO SAVEPOINT s;
SELECT next_scoped_id('t32', 'd'), next_scoped_id('t32', 'd');
COMMIT;
SELECT kind, queue, domain, mark, remaining, max_mark FROM pgticket.marks WHERE queue = 't32';
-- Blocks too.
SELECT pgticket.set_block_limit('b32', 10);
SELECT * FROM reserve_block('b32', 6);
SELECT * FROM reserve_block('b32', 6);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM reserve_block('b32', 4);
-- An integer column fed by a limited series never overflows it.
CREATE TABLE small_h (k text, no integer);
CREATE TRIGGER number_small BEFORE INSERT OR UPDATE ON small_h FOR EACH ROW EXECUTE FUNCTION assign_scoped_id('no', 'k', 'small');
SELECT pgticket.advance_scoped_id('big', 'small', 2147483647);
INSERT INTO small_h (k) VALUES ('big');
\echo :LAST_ERROR_SQLSTATE

-- Status: readable by everyone.
SELECT preloaded, machine_id, epoch = '2026-01-01 00:00:00+00' AS default_epoch,
       years_left BETWEEN 60 AND 69.8 AS years_left_ok, last_snowflake_at > now() - interval '1 minute' AS recent,
       reserved_until >= last_snowflake_at AS reserved_ahead, refusals_overflow >= 2 AS overflows_counted
  FROM pgticket.status;
-- pg_ticket.machine_id is not set here: the status says so (and the server
-- log has a WARNING from its start).
SELECT machine_id, machine_id_source FROM pgticket.status;
CREATE ROLE status_reader;
SET ROLE status_reader;
SELECT preloaded FROM pgticket.status;
SELECT pgticket.reset_status();
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT pgticket.reset_status();
SELECT refusals_overflow, refusals_clock_behind, refusals_read_only, reset_at IS NOT NULL AS was_reset FROM pgticket.status;
BEGIN READ ONLY;
SELECT next_scoped_id('t32', 'd');
ROLLBACK;
SELECT refusals_read_only FROM pgticket.status;
DROP ROLE status_reader;

-- 0.3.0: a scope taken from a column is its canonical text, whatever the
-- session's settings (0.2.0: '2026-03-01' and '01/03/2026' were two scopes
-- for one day, and invoice 1 came twice).
CREATE TABLE daily_h (no bigint, shop text, day date, at timestamptz, ratio float8);
CREATE TRIGGER number_daily BEFORE INSERT OR UPDATE ON daily_h
    FOR EACH ROW EXECUTE FUNCTION assign_scoped_id('no', 'shop', 'column', 'day');
CREATE TABLE at_h (no bigint, at timestamptz);
CREATE TRIGGER number_at BEFORE INSERT OR UPDATE ON at_h
    FOR EACH ROW EXECUTE FUNCTION assign_scoped_id('no', 'at', 'moment');
SET DateStyle = 'ISO, YMD';
INSERT INTO daily_h (shop, day) VALUES ('s1', '2026-03-01');
SET DateStyle = 'SQL, DMY';
INSERT INTO daily_h (shop, day) VALUES ('s1', '2026-03-01');
SET DateStyle = 'German';
INSERT INTO daily_h (shop, day) VALUES ('s1', '2026-03-01');
RESET DateStyle;
SELECT no FROM daily_h ORDER BY no;
SELECT domain, mark FROM pgticket.marks WHERE queue = 's1';
SET TimeZone = 'America/New_York';
INSERT INTO at_h (at) VALUES ('2026-03-01 12:00:00+00');
SET TimeZone = 'Asia/Tokyo';
INSERT INTO at_h (at) VALUES ('2026-03-01 12:00:00+00');
SHOW TimeZone;
RESET TimeZone;
SELECT no FROM at_h ORDER BY no;
SELECT queue, mark FROM pgticket.marks WHERE domain = 'moment';

-- The value written respects the column's type modifier and domain, as an
-- INSERT of it would (0.2.0 stored 1000 in numeric(3,0), and 101 in a
-- domain that allows 1..100).
CREATE TABLE narrow_h (no numeric(3,0), k text);
CREATE TRIGGER number_narrow BEFORE INSERT OR UPDATE ON narrow_h FOR EACH ROW EXECUTE FUNCTION assign_scoped_id('no', 'k', 'narrow');
SELECT pgticket.advance_scoped_id('n', 'narrow', 997);
INSERT INTO narrow_h (k) VALUES ('n'), ('n');
INSERT INTO narrow_h (k) VALUES ('n');
\echo :LAST_ERROR_SQLSTATE
SELECT no FROM narrow_h ORDER BY no;
CREATE DOMAIN percent_h AS integer CHECK (VALUE BETWEEN 1 AND 100);
CREATE TABLE pct_h (no percent_h, k text);
CREATE TRIGGER number_pct BEFORE INSERT OR UPDATE ON pct_h FOR EACH ROW EXECUTE FUNCTION assign_scoped_id('no', 'k', 'pct');
SELECT pgticket.advance_scoped_id('p', 'pct', 99);
INSERT INTO pct_h (k) VALUES ('p');
INSERT INTO pct_h (k) VALUES ('p');
\echo :LAST_ERROR_SQLSTATE
SELECT no FROM pct_h ORDER BY no;
-- reg* types print names relative to search_path: canonical too.
CREATE SCHEMA app_h;
CREATE TABLE app_h.things (x int);
CREATE TABLE reg_h (no bigint, q regclass);
CREATE TRIGGER number_reg BEFORE INSERT OR UPDATE ON reg_h FOR EACH ROW EXECUTE FUNCTION assign_scoped_id('no', 'q', 'reg');
INSERT INTO reg_h (q) VALUES ('app_h.things');
SET search_path = app_h, public;
INSERT INTO reg_h (q) VALUES ('app_h.things');
SET quote_all_identifiers = on;
INSERT INTO reg_h (q) VALUES ('app_h.things');
RESET quote_all_identifiers;
RESET search_path;
SELECT no FROM reg_h ORDER BY no;
-- A scale that rounds would write two values as one ID: refused.
CREATE TABLE round_h (no numeric(3,-1), k text);
CREATE TRIGGER number_round BEFORE INSERT OR UPDATE ON round_h FOR EACH ROW EXECUTE FUNCTION assign_scoped_id('no', 'k', 'round');
INSERT INTO round_h (k) VALUES ('r');
\echo :LAST_ERROR_SQLSTATE
SELECT pgticket.advance_scoped_id('r', 'round', 9);
INSERT INTO round_h (k) VALUES ('r');
SELECT no FROM round_h;
-- 0.3.0: string resource IDs (SPEC §15): a text or varchar id column gets
-- the canonical decimal string, and pgticket.resource_id accepts nothing
-- else. The seed's schema, numbered per queue:
CREATE TABLE request (queue text, id pgticket.resource_id, PRIMARY KEY (queue, id));
SELECT number_rows('request', 'id', 'queue', domain => 'requests');
INSERT INTO request (queue) VALUES ('demo-queue'), ('demo-queue'), ('other')
    RETURNING queue, id, '/queues/' || queue || '/requests/' || id AS url;
COPY request (queue) FROM stdin;
demo-queue
other
\.
SELECT queue, id FROM request ORDER BY queue, id::bigint;
INSERT INTO request (queue, id) VALUES ('demo-queue', 'demo-queue/4');   -- a URL is not an ID
\echo :LAST_ERROR_SQLSTATE
-- varchar(n): a value that does not fit is refused, as an INSERT of it would be.
CREATE TABLE short_h (k text, id varchar(1));
SELECT number_rows('short_h', 'id', 'k', domain => 'short');
SELECT pgticket.advance_scoped_id('s', 'short', 8);
INSERT INTO short_h (k) VALUES ('s') RETURNING id;
INSERT INTO short_h (k) VALUES ('s') RETURNING id;
\echo :LAST_ERROR_SQLSTATE
SELECT current_scoped_id('s', 'short') AS mark_kept;
-- The domain's bounds and refusals.
SELECT '1'::pgticket.resource_id AS lowest, '9223372036854775807'::pgticket.resource_id AS highest;
DO $$
DECLARE v text;
BEGIN
    FOREACH v IN ARRAY ARRAY['0', '-1', '+1', '042', ' 42', '42 ', E'42\n', '4.2', '1e3', 'demo-queue/42',
                             '9223372036854775808', '10000000000000000000', '', '٤٢'] LOOP
        BEGIN
            PERFORM v::pgticket.resource_id;
            RAISE NOTICE '% accepted', quote_literal(v);
        EXCEPTION WHEN check_violation THEN
            RAISE NOTICE '% refused (%)', quote_literal(v), SQLSTATE;
        END;
    END LOOP;
END $$;
