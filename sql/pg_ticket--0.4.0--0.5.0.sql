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

-- #46 item 6: a lease granted before 0.5.0 has no line in the server's
-- lease ledger. Each live one is written again as it is, and the table's
-- changed trigger records it (on a preloading server), so that a standby
-- promoted before its holder's next renewal holds its id.
UPDATE pgticket.machine_id_leases SET holder = holder WHERE expires_at OPERATOR(pg_catalog.>) pg_catalog.now();

-- SPEC s.20.1 (review of #46): the machine-id leases' forward_only trigger
-- multiplied a numeric by an integer, for which pg_catalog has no exact
-- operator: CREATE EXTENSION (and 0.3.0's update) bound it to one a
-- database owner could plant in the extension's schema, run as the table's
-- owner at every lease. Made again with pg_catalog's, named.
DROP TRIGGER forward_only ON pgticket.machine_id_leases;
CREATE TRIGGER forward_only BEFORE UPDATE ON pgticket.machine_id_leases
    FOR EACH ROW WHEN (NEW.machine_id IS DISTINCT FROM OLD.machine_id OR NEW.lease < OLD.lease
                       OR NEW.not_before_ms < OLD.not_before_ms
                       -- the same lease: its end, stamps and margin only grow
                       OR (NEW.lease = OLD.lease AND (NEW.expires_at < OLD.expires_at
                           OR NEW.last_issued_ms < OLD.last_issued_ms OR (OLD.last_issued_ms IS NOT NULL AND NEW.last_issued_ms IS NULL)
                           OR NEW.margin_ms < OLD.margin_ms OR (OLD.margin_ms IS NOT NULL AND NEW.margin_ms IS NULL)
                           OR (OLD.revoked AND NOT NEW.revoked)
                           OR (OLD.ended_at IS NOT NULL AND NEW.ended_at IS DISTINCT FROM OLD.ended_at)))
                       -- a new lease stamps above the old one's end plus its margin
                       OR (NEW.lease > OLD.lease AND NEW.not_before_ms <
                           (extract(epoch FROM CASE WHEN OLD.revoked THEN OLD.expires_at
                                                    ELSE LEAST(coalesce(OLD.ended_at, OLD.expires_at), OLD.expires_at) END)
                            OPERATOR(pg_catalog.*) 1000::pg_catalog.numeric)::bigint
                           + coalesce(OLD.margin_ms, 0)))
    EXECUTE FUNCTION pgticket.refuse_rewind();
ALTER TABLE pgticket.machine_id_leases ENABLE ALWAYS TRIGGER forward_only;

-- 0.5.0 (SPEC s.19): rows that arrive by logical replication (apply
-- workers and initial copies run in replica mode) merge into a node's
-- state: the marks of the group's series never go back, and no row of
-- another node's own state is applied (src/replicated.rs says which).
CREATE FUNCTION pgticket.by_replication() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'by_replication_wrapper';
REVOKE ALL ON FUNCTION pgticket.by_replication() FROM PUBLIC;
COMMENT ON FUNCTION pgticket.by_replication() IS
    'Trigger: a row replicated from another primary keeps the higher mark of a series, and leaves this node''s own state alone';
CREATE TRIGGER by_replication BEFORE INSERT OR UPDATE OR DELETE ON pgticket.scoped_counters
    FOR EACH ROW EXECUTE FUNCTION pgticket.by_replication();
CREATE TRIGGER by_replication BEFORE INSERT OR UPDATE OR DELETE ON pgticket.blocks
    FOR EACH ROW EXECUTE FUNCTION pgticket.by_replication();
CREATE TRIGGER by_replication BEFORE INSERT OR UPDATE OR DELETE ON pgticket.tickets
    FOR EACH ROW EXECUTE FUNCTION pgticket.by_replication();
CREATE TRIGGER by_replication BEFORE INSERT OR UPDATE OR DELETE ON pgticket.id_space
    FOR EACH ROW EXECUTE FUNCTION pgticket.by_replication();
CREATE TRIGGER by_replication BEFORE INSERT OR UPDATE OR DELETE ON pgticket.machine_id_leases
    FOR EACH ROW EXECUTE FUNCTION pgticket.by_replication();
CREATE TRIGGER by_replication BEFORE INSERT OR UPDATE OR DELETE ON pgticket.lease_registry
    FOR EACH ROW EXECUTE FUNCTION pgticket.by_replication();
CREATE TRIGGER by_replication BEFORE INSERT OR UPDATE OR DELETE ON pgticket.scope_quota
    FOR EACH ROW EXECUTE FUNCTION pgticket.by_replication();
ALTER TABLE pgticket.scoped_counters ENABLE REPLICA TRIGGER by_replication;
ALTER TABLE pgticket.blocks ENABLE REPLICA TRIGGER by_replication;
ALTER TABLE pgticket.tickets ENABLE REPLICA TRIGGER by_replication;
ALTER TABLE pgticket.id_space ENABLE REPLICA TRIGGER by_replication;
ALTER TABLE pgticket.machine_id_leases ENABLE REPLICA TRIGGER by_replication;
ALTER TABLE pgticket.lease_registry ENABLE REPLICA TRIGGER by_replication;
ALTER TABLE pgticket.scope_quota ENABLE REPLICA TRIGGER by_replication;

-- SPEC s.19.3: the functions of a group of primaries (src/group.rs).
CREATE  FUNCTION pgticket."join_group"() RETURNS TEXT /* String */
STRICT VOLATILE  
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'join_group_wrapper';
CREATE  FUNCTION pgticket."move_home"(
	"kind" TEXT, /* Option < & str > */
	"queue" TEXT, /* Option < & str > */
	"domain" TEXT DEFAULT NULL, /* Option < & str > */
	"to_node" TEXT DEFAULT NULL, /* Option < & str > */
	"above" bigint DEFAULT NULL /* Option < i64 > */
) RETURNS bool /* bool */
VOLATILE  
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'move_home_wrapper';

-- 0.5.0 (SPEC s.19.3): the nodes of a group of primaries this database
-- knows (each node writes its own row with pgticket.join_group(); the
-- others arrive by replication), and each gap-free series' home node (none
-- on a server alone) with the count of handovers that moved it.
CREATE TABLE pgticket.nodes (
    node bigint PRIMARY KEY,
    name text NOT NULL,
    creates_scopes boolean NOT NULL,
    machine_id integer,
    ticket_offset bigint NOT NULL,
    ticket_increment bigint NOT NULL,
    epoch_ms bigint NOT NULL,
    machine_bits bigint NOT NULL,
    announced_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE pgticket.nodes IS
    'The nodes of the group of primaries this database replicates with (system identifier, name, whether it creates new gap-free scopes, fixed machine id, ticket series, snowflake space), each written by its own node';
REVOKE ALL ON pgticket.nodes FROM PUBLIC;
CREATE FUNCTION pgticket.nodes_changed() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'nodes_changed_wrapper';
REVOKE ALL ON FUNCTION pgticket.nodes_changed() FROM PUBLIC;
COMMENT ON FUNCTION pgticket.nodes_changed() IS
    'Trigger: a change of pgticket.nodes reaches every session';
CREATE TRIGGER changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON pgticket.nodes
    FOR EACH STATEMENT EXECUTE FUNCTION pgticket.nodes_changed();
ALTER TABLE pgticket.nodes ENABLE ALWAYS TRIGGER changed;
CREATE TRIGGER by_replication BEFORE INSERT OR UPDATE OR DELETE ON pgticket.nodes
    FOR EACH ROW EXECUTE FUNCTION pgticket.by_replication();
ALTER TABLE pgticket.nodes ENABLE REPLICA TRIGGER by_replication;
ALTER TABLE pgticket.scoped_counters ADD COLUMN home bigint, ADD COLUMN home_moves bigint NOT NULL DEFAULT 0;
ALTER TABLE pgticket.blocks ADD COLUMN home bigint, ADD COLUMN home_moves bigint NOT NULL DEFAULT 0;
REVOKE EXECUTE ON FUNCTION pgticket.join_group() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgticket.move_home(text, text, text, text, bigint) FROM PUBLIC;
COMMENT ON FUNCTION pgticket.join_group() IS
    'Announces this node in pgticket.nodes (its name, whether it creates new gap-free scopes) to the group of primaries; returns its name';
COMMENT ON FUNCTION pgticket.move_home(text, text, text, text, bigint) IS
    'Moves the home node of a gap-free scope (kind scope) or block name (kind block, domain NULL) to node to_node: on its home, with its mark; elsewhere only with above, a value past all the old home committed';
