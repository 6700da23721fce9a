-- pg_ticket 0.4.0 -> 0.5.0 (ALTER EXTENSION pg_ticket UPDATE). What changed is
-- listed in CHANGELOG.md; the library's changes take effect after its
-- install and a restart (install, restart, then update).
\echo Use "ALTER EXTENSION pg_ticket UPDATE" to load this file. \quit

-- #46 item 3 (SPEC s.20): pgticket.marks reads the rows of a function,
-- which filters them by the caller's rights before any condition of the
-- caller's sees them (0.4.0's security-barrier view let a leakproof
-- condition into the tables' index scans, and EXPLAIN ANALYZE counted the
-- rows of other roles' scopes it removed). CREATE OR REPLACE keeps the
-- view's grant and comment and drops its security_barrier option.
CREATE  FUNCTION pgticket."marks_rows"() RETURNS TABLE (
	"kind" TEXT,  /* String */
	"queue" text,  /* Option < Text > */
	"domain" text,  /* Option < Text > */
	"block_name" text,  /* Option < Text > */
	"mark" bigint,  /* i64 */
	"remaining" bigint,  /* i64 */
	"max_mark" bigint  /* i64 */
)
STRICT STABLE PARALLEL RESTRICTED
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'marks_rows_wrapper';
COMMENT ON FUNCTION pgticket.marks_rows() IS
    'The rows of the view pgticket.marks: the marks of the scopes, block names and ticket scopes the current user may use';
CREATE OR REPLACE VIEW pgticket.marks AS
    SELECT m.kind, m.queue COLLATE "C" AS queue, m.domain COLLATE "C" AS domain,
           m.block_name COLLATE "C" AS block_name, m.mark, m.remaining, m.max_mark
      FROM pgticket.marks_rows() m;

-- #46 item 7: a database whose extension was created at 0.2.0 recorded no
-- snowflake ID space (0.3.0's update recorded one only where leases
-- existed), so its dump was served at once by a server with the same
-- machine id. Where none is recorded and the server has a snowflake mark,
-- the mark's space is recorded now; the function is not kept.
CREATE FUNCTION pgticket.record_space_of_the_mark() RETURNS boolean
    LANGUAGE c AS 'MODULE_PATHNAME', 'record_space_of_the_mark_wrapper';
SELECT pgticket.record_space_of_the_mark();
DROP FUNCTION pgticket.record_space_of_the_mark();
