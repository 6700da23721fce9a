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
CREATE TRIGGER by_replication BEFORE INSERT OR UPDATE OR DELETE ON pgticket.rights
    FOR EACH ROW EXECUTE FUNCTION pgticket.by_replication();
ALTER TABLE pgticket.scoped_counters ENABLE REPLICA TRIGGER by_replication;
ALTER TABLE pgticket.blocks ENABLE REPLICA TRIGGER by_replication;
ALTER TABLE pgticket.tickets ENABLE REPLICA TRIGGER by_replication;
ALTER TABLE pgticket.id_space ENABLE REPLICA TRIGGER by_replication;
ALTER TABLE pgticket.machine_id_leases ENABLE REPLICA TRIGGER by_replication;
ALTER TABLE pgticket.lease_registry ENABLE REPLICA TRIGGER by_replication;
ALTER TABLE pgticket.scope_quota ENABLE REPLICA TRIGGER by_replication;
ALTER TABLE pgticket.rights ENABLE REPLICA TRIGGER by_replication;

-- Review of #47: a ticket scope's floor raised, its cache dropped either
-- way (src/tickets/mod.rs; conversions from a sequence use it).
CREATE  FUNCTION pgticket."raise_ticket_floor"(
	"queue" text, /* Option < Name < '_ > > */
	"domain" text, /* Option < Name < '_ > > */
	"floor" bigint /* Option < i64 > */
) RETURNS bigint /* i64 */
VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'raise_ticket_floor_wrapper';
REVOKE EXECUTE ON FUNCTION pgticket.raise_ticket_floor(text, text, bigint) FROM PUBLIC;
COMMENT ON FUNCTION pgticket.raise_ticket_floor(text, text, bigint) IS
    'Admin: every later ticket of (queue, domain) is above floor (the mark raised if below, the cached ones dropped either way); returns the mark';

-- SPEC s.19.3: the functions of a group of primaries (src/group.rs).
CREATE  FUNCTION pgticket."join_group"(
	"renamed_from" TEXT DEFAULT NULL /* Option < & str > */
) RETURNS TEXT /* String */
VOLATILE  
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
REVOKE EXECUTE ON FUNCTION pgticket.join_group(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgticket.move_home(text, text, text, text, bigint) FROM PUBLIC;
COMMENT ON FUNCTION pgticket.join_group(text) IS
    'Announces this node in pgticket.nodes (its name, whether it creates new gap-free scopes, its allocators'' settings) to the group of primaries, renamed_from its former name if it was renamed; returns its name';
COMMENT ON FUNCTION pgticket.move_home(text, text, text, text, bigint) IS
    'Moves the home node of a gap-free scope (kind scope) or block name (kind block, domain NULL) to node to_node: on its home, with its mark; elsewhere only with above, a value past all the old home committed';

-- 0.5.0 (review of #47): subscriptions made before pg_ticket carry its
-- state tables only after a refresh; until then the nodes do not hear of
-- each other and each takes itself for a server alone.
DO $$
DECLARE
    n bigint;
BEGIN
    SELECT pg_catalog.count(*) INTO n FROM pg_catalog.pg_subscription s
     WHERE s.subdbid OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database());
    IF n OPERATOR(pg_catalog.>) 0 THEN
        RAISE WARNING 'pg_ticket: this database has % subscription(s) made before pg_ticket''s state tables: they carry them only after ALTER SUBSCRIPTION ... REFRESH PUBLICATION', n
            USING HINT = 'In a group of primaries, refresh each subscription on every node (WITH (copy_data = false) where the nodes already hold the same rows), then SELECT pgticket.join_group() on every node (docs/multi-primary.md); a subscription to a one-way feed needs nothing.';
    END IF;
END $$;

-- 0.5.0 (SPEC s.19.4): key columns converted from a sequence to tickets or
-- snowflakes, and what they had before (a node's own, as its schema is).
CREATE TABLE pgticket.conversions (
    relation text NOT NULL,
    id_column text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('ticket', 'snowflake')),
    sequence text NOT NULL,
    old_default text,
    old_identity "char" NOT NULL DEFAULT '',
    converted_above bigint NOT NULL,
    converted_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (relation, id_column)
);
COMMENT ON TABLE pgticket.conversions IS
    'Key columns converted from a sequence to tickets or snowflakes (pgticket.convert_sequence): the table (its qualified name), the sequence it took values from (the ticket scope''s queue), the default or identity it had';
REVOKE ALL ON pgticket.conversions FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('pgticket.conversions', '');
CREATE TRIGGER by_replication BEFORE INSERT OR UPDATE OR DELETE ON pgticket.conversions
    FOR EACH ROW EXECUTE FUNCTION pgticket.by_replication();
ALTER TABLE pgticket.conversions ENABLE REPLICA TRIGGER by_replication;

-- The tables a conversion may read and alter: plain or partitioned tables
-- (no view: its functions would run as the caller), this session's own if
-- temporary, each owned by the caller.
CREATE FUNCTION pgticket.conversion_checks(rel regclass, col name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    c record;
BEGIN
    SELECT k.relkind, k.relpersistence, k.relnamespace, k.relowner INTO c FROM pg_catalog.pg_class k WHERE k.oid OPERATOR(pg_catalog.=) rel;
    IF c.relkind OPERATOR(pg_catalog.<>) ALL (ARRAY['r', 'p']::"char"[]) THEN
        RAISE EXCEPTION 'pg_ticket: % takes values from the sequence but is not a table: a conversion reads and alters tables only', rel
            USING ERRCODE = 'wrong_object_type', HINT = 'Drop that default (or the object) first.';
    END IF;
    IF c.relpersistence OPERATOR(pg_catalog.=) 't' AND c.relnamespace OPERATOR(pg_catalog.<>) pg_catalog.pg_my_temp_schema() THEN
        RAISE EXCEPTION 'pg_ticket: column % of another session''s temporary table % takes values from the sequence', pg_catalog.quote_ident(col), rel
            USING ERRCODE = 'object_in_use', HINT = 'Convert once that session has ended.';
    END IF;
    IF NOT pg_catalog.pg_has_role(c.relowner, 'USAGE') THEN
        RAISE EXCEPTION 'pg_ticket: must be the owner of table % to convert its column % (it takes values from the same sequence)', rel, pg_catalog.quote_ident(col)
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END $$;
REVOKE ALL ON FUNCTION pgticket.conversion_checks(regclass, name) FROM PUBLIC;
COMMENT ON FUNCTION pgticket.conversion_checks(regclass, name) IS
    'Internal: refuses a relation a conversion may not read or alter (not a table, another session''s temporary table, not the caller''s)';

CREATE FUNCTION pgticket.convert_sequence(
    relation regclass,
    id_column name,
    kind text DEFAULT 'ticket',
    above bigint DEFAULT 0
) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    att record;
    seq regclass;
    identity_seq boolean;
    rels regclass[];
    cols name[];
    defs text[] := '{}';
    idents "char"[] := '{}';
    seq_last bigint;
    seq_max bigint;
    col_max bigint;
    floor_value bigint;
    queue text;
BEGIN
    IF relation IS NULL OR id_column IS NULL OR kind IS NULL OR above IS NULL THEN
        RAISE EXCEPTION 'pg_ticket: relation, id_column, kind and above must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF kind OPERATOR(pg_catalog.<>) ALL (ARRAY['ticket', 'snowflake']) THEN
        RAISE EXCEPTION 'pg_ticket: kind is ''ticket'' or ''snowflake'', not %', pg_catalog.quote_literal(kind)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT (pg_catalog.has_table_privilege('pgticket.conversions', 'SELECT') AND pg_catalog.has_table_privilege('pgticket.conversions', 'INSERT'))
       OR (kind OPERATOR(pg_catalog.=) 'ticket' AND NOT pg_catalog.has_function_privilege('pgticket.raise_ticket_floor(text, text, bigint)', 'EXECUTE')) THEN
        RAISE EXCEPTION 'pg_ticket: converting a sequence is an administrator''s: it records the conversion in pgticket.conversions and raises the ticket scope'
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Run it as a superuser, or GRANT SELECT, INSERT, DELETE ON pgticket.conversions, EXECUTE ON FUNCTION pgticket.raise_ticket_floor(text, text, bigint), pgticket.convert_sequence(regclass, name, text, bigint) and pgticket.revert_conversion(regclass, name) to the tables'' owner.';
    END IF;
    PERFORM pgticket.conversion_checks(relation, id_column);
    EXECUTE pg_catalog.format('LOCK TABLE %s IN SHARE ROW EXCLUSIVE MODE', relation);
    SELECT a.attnum INTO att FROM pg_catalog.pg_attribute a
     WHERE a.attrelid OPERATOR(pg_catalog.=) relation AND a.attname OPERATOR(pg_catalog.=) id_column AND NOT a.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pg_ticket: column % of % does not exist', pg_catalog.quote_ident(id_column), relation USING ERRCODE = 'undefined_column';
    END IF;
    -- The sequence: the column's own (serial, identity), else the one its
    -- default takes from (a nextval() default depends on its sequence).
    seq := pg_catalog.pg_get_serial_sequence(relation::text, id_column::text)::pg_catalog.regclass;
    IF seq IS NULL THEN
        SELECT dep.refobjid::pg_catalog.regclass INTO seq
          FROM pg_catalog.pg_attrdef d
          JOIN pg_catalog.pg_depend dep ON dep.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_attrdef'::pg_catalog.regclass
               AND dep.objid OPERATOR(pg_catalog.=) d.oid AND dep.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
          JOIN pg_catalog.pg_class s ON s.oid OPERATOR(pg_catalog.=) dep.refobjid AND s.relkind OPERATOR(pg_catalog.=) 'S'
         WHERE d.adrelid OPERATOR(pg_catalog.=) relation AND d.adnum OPERATOR(pg_catalog.=) att.attnum
         LIMIT 1;
    END IF;
    IF seq IS NULL THEN
        RAISE EXCEPTION 'pg_ticket: column % of % takes no value from a sequence (no serial, identity or nextval() default)',
            pg_catalog.quote_ident(id_column), relation USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    identity_seq := EXISTS (SELECT FROM pg_catalog.pg_depend dep
                             WHERE dep.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                               AND dep.objid OPERATOR(pg_catalog.=) seq AND dep.deptype OPERATOR(pg_catalog.=) 'i');
    -- Every column that takes values from it: one series, converted
    -- together (two tables of one sequence hold no key twice); parents
    -- before their partitions and children.
    SELECT pg_catalog.array_agg(u.rel ORDER BY u.depth, u.rel::text, u.col), pg_catalog.array_agg(u.col ORDER BY u.depth, u.rel::text, u.col) INTO rels, cols
      FROM (SELECT x.rel, x.col, (SELECT pg_catalog.count(*) FROM pg_catalog.pg_inherits i WHERE i.inhrelid OPERATOR(pg_catalog.=) x.rel) AS depth
              FROM (SELECT relation AS rel, id_column AS col
                    UNION
                    SELECT d.adrelid::pg_catalog.regclass, a.attname
                      FROM pg_catalog.pg_depend dep
                      JOIN pg_catalog.pg_attrdef d ON dep.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_attrdef'::pg_catalog.regclass
                           AND dep.objid OPERATOR(pg_catalog.=) d.oid
                      JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) d.adrelid AND a.attnum OPERATOR(pg_catalog.=) d.adnum
                     WHERE dep.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                       AND dep.refobjid OPERATOR(pg_catalog.=) seq AND NOT a.attisdropped
                    UNION
                    -- The identity column the sequence belongs to.
                    SELECT dep.refobjid::pg_catalog.regclass, a.attname
                      FROM pg_catalog.pg_depend dep
                      JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) dep.refobjid AND a.attnum OPERATOR(pg_catalog.=) dep.refobjsubid
                     WHERE dep.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass AND dep.objid OPERATOR(pg_catalog.=) seq
                       AND dep.deptype OPERATOR(pg_catalog.=) 'i' AND a.attidentity OPERATOR(pg_catalog.<>) '') x) u;
    IF identity_seq AND pg_catalog.array_length(rels, 1) OPERATOR(pg_catalog.>) 1 THEN
        RAISE EXCEPTION 'pg_ticket: the identity sequence % of column % of % is also the default of % other column(s): converting drops the identity and its sequence',
            seq, pg_catalog.quote_ident(id_column), relation, pg_catalog.array_length(rels, 1) OPERATOR(pg_catalog.-) 1
            USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'Give the other columns a sequence of their own first.';
    END IF;
    -- What the sequence handed out: its value, even not yet called (a
    -- RESTART point is where the owner wants it to go on).
    EXECUTE pg_catalog.format('SELECT last_value FROM %s', seq) INTO seq_last;
    SELECT s.seqmax INTO seq_max FROM pg_catalog.pg_sequence s WHERE s.seqrelid OPERATOR(pg_catalog.=) seq;
    floor_value := GREATEST(above, 0, seq_last);
    -- Checked, and what each column has now read, before anything changes.
    FOR i IN 1 .. pg_catalog.array_length(rels, 1) LOOP
        PERFORM pgticket.conversion_checks(rels[i], cols[i]);
        EXECUTE pg_catalog.format('LOCK TABLE %s IN SHARE ROW EXCLUSIVE MODE', rels[i]);
        IF EXISTS (SELECT FROM pgticket.conversions c WHERE c.relation OPERATOR(pg_catalog.=) rels[i]::text
                                                       AND c.id_column OPERATOR(pg_catalog.=) cols[i]::text) THEN
            RAISE EXCEPTION 'pg_ticket: column % of % is converted already (pgticket.revert_conversion undoes it)', pg_catalog.quote_ident(cols[i]), rels[i]
                USING ERRCODE = 'object_not_in_prerequisite_state';
        END IF;
        SELECT a.atttypid, a.attidentity, pg_catalog.pg_get_expr(d.adbin, d.adrelid) AS def INTO att
          FROM pg_catalog.pg_attribute a
          LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid OPERATOR(pg_catalog.=) a.attrelid AND d.adnum OPERATOR(pg_catalog.=) a.attnum
         WHERE a.attrelid OPERATOR(pg_catalog.=) rels[i] AND a.attname OPERATOR(pg_catalog.=) cols[i];
        IF att.atttypid OPERATOR(pg_catalog.<>) 'pg_catalog.int8'::pg_catalog.regtype
           AND (kind OPERATOR(pg_catalog.=) 'snowflake' OR att.atttypid OPERATOR(pg_catalog.<>) 'pg_catalog.int4'::pg_catalog.regtype) THEN
            RAISE EXCEPTION 'pg_ticket: column % of % is %: % keys need bigint%', pg_catalog.quote_ident(cols[i]), rels[i],
                pg_catalog.format_type(att.atttypid, NULL), kind, CASE WHEN kind OPERATOR(pg_catalog.=) 'ticket' THEN ' or integer' ELSE '' END
                USING ERRCODE = 'datatype_mismatch',
                      HINT = 'ALTER TABLE ... ALTER COLUMN ... TYPE bigint first (and every column that references it).';
        END IF;
        defs := defs OPERATOR(pg_catalog.||) att.def;
        idents := idents OPERATOR(pg_catalog.||) att.attidentity;
        EXECUTE pg_catalog.format('SELECT pg_catalog.max(%I)::pg_catalog.int8 FROM %s', cols[i], rels[i]) INTO col_max;
        floor_value := GREATEST(floor_value, col_max);
    END LOOP;
    queue := seq::text;
    IF kind OPERATOR(pg_catalog.=) 'ticket' THEN
        PERFORM pgticket.raise_ticket_floor(queue, 'sequence', floor_value);
    ELSIF floor_value OPERATOR(pg_catalog.>=) @extschema@.snowflake_min_id(pg_catalog.now()) THEN
        RAISE EXCEPTION 'pg_ticket: column % of % holds values up to %, not below today''s snowflakes', pg_catalog.quote_ident(id_column), relation, floor_value
            USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'Convert it to tickets instead.';
    END IF;
    FOR i IN 1 .. pg_catalog.array_length(rels, 1) LOOP
        INSERT INTO pgticket.conversions (relation, id_column, kind, sequence, old_default, old_identity, converted_above)
            VALUES (rels[i]::text, cols[i]::text, kind, queue, defs[i], idents[i], floor_value);
        IF idents[i] OPERATOR(pg_catalog.<>) '' THEN
            EXECUTE pg_catalog.format('ALTER TABLE %s ALTER COLUMN %I DROP IDENTITY', rels[i], cols[i]);
        END IF;
        -- A partitioned table's default reaches its partitions; a plain
        -- table's stays its own (each child has its own row).
        EXECUTE pg_catalog.format('ALTER TABLE %s %s ALTER COLUMN %I SET DEFAULT %s',
            CASE WHEN (SELECT k.relkind FROM pg_catalog.pg_class k WHERE k.oid OPERATOR(pg_catalog.=) rels[i]) OPERATOR(pg_catalog.=) 'p' THEN '' ELSE 'ONLY' END,
            rels[i], cols[i],
            CASE kind WHEN 'ticket' THEN pg_catalog.format('@extschema@.next_ticket(%L, %L)', queue, 'sequence')
                      ELSE '@extschema@.snowflake_id()' END);
    END LOOP;
    -- The sequence goes on no further: at its last value, a nextval()
    -- elsewhere (an ORM that takes keys first) fails instead of handing out
    -- a ticket's value (what it had reached is under converted_above).
    IF NOT identity_seq THEN
        PERFORM pg_catalog.setval(seq, seq_max, true);
    END IF;
    RETURN floor_value;
END $$;
REVOKE ALL ON FUNCTION pgticket.convert_sequence(regclass, name, text, bigint) FROM PUBLIC;
COMMENT ON FUNCTION pgticket.convert_sequence(regclass, name, text, bigint) IS
    'Converts a key column from its sequence (serial, identity, nextval default), with every other column taking values from that sequence, to tickets of scope (sequence, ''sequence'') or snowflakes, above every value in them, what the sequence handed out and above, the sequence set to its last value; returns that floor';

CREATE FUNCTION pgticket.revert_conversion(relation regclass, id_column name) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    conv record;
    r record;
    rel regclass;
    col_max bigint := 0;
    m bigint;
    seq regclass;
    seq_min bigint;
BEGIN
    IF relation IS NULL OR id_column IS NULL THEN
        RAISE EXCEPTION 'pg_ticket: relation and id_column must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT (pg_catalog.has_table_privilege('pgticket.conversions', 'SELECT') AND pg_catalog.has_table_privilege('pgticket.conversions', 'DELETE')) THEN
        RAISE EXCEPTION 'pg_ticket: reverting a conversion is an administrator''s: it removes the record from pgticket.conversions'
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Run it as a superuser, or GRANT SELECT, INSERT, DELETE ON pgticket.conversions to the tables'' owner.';
    END IF;
    SELECT * INTO conv FROM pgticket.conversions c
     WHERE c.relation OPERATOR(pg_catalog.=) revert_conversion.relation::text AND c.id_column OPERATOR(pg_catalog.=) revert_conversion.id_column::text;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pg_ticket: column % of % was not converted (pgticket.conversions)', pg_catalog.quote_ident(id_column), relation
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    -- Every column converted from the same sequence goes back with it.
    FOR r IN SELECT * FROM pgticket.conversions c WHERE c.sequence OPERATOR(pg_catalog.=) conv.sequence LOOP
        rel := pg_catalog.to_regclass(r.relation);
        IF rel IS NULL THEN
            RAISE EXCEPTION 'pg_ticket: table % converted with % is not there under that name', r.relation, conv.sequence
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Renamed since: UPDATE pgticket.conversions SET relation = its new qualified name; dropped, or a temporary table of a session that has ended: DELETE its row from pgticket.conversions.';
        END IF;
        PERFORM pgticket.conversion_checks(rel, r.id_column::name);
        EXECUTE pg_catalog.format('LOCK TABLE %s IN SHARE ROW EXCLUSIVE MODE', rel);
        EXECUTE pg_catalog.format('SELECT pg_catalog.max(%I)::pg_catalog.int8 FROM %s', r.id_column, rel) INTO m;
        col_max := GREATEST(col_max, m);
    END LOOP;
    -- Parents before their partitions and children: a partitioned table's
    -- default reaches its partitions, then each child's own is put back.
    FOR r IN SELECT c.*, k.relkind FROM pgticket.conversions c
               JOIN pg_catalog.pg_class k ON k.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(c.relation)
              WHERE c.sequence OPERATOR(pg_catalog.=) conv.sequence
              ORDER BY (SELECT pg_catalog.count(*) FROM pg_catalog.pg_inherits i WHERE i.inhrelid OPERATOR(pg_catalog.=) k.oid), c.relation, c.id_column LOOP
        rel := pg_catalog.to_regclass(r.relation);
        EXECUTE pg_catalog.format('ALTER TABLE %s %s ALTER COLUMN %I DROP DEFAULT', CASE WHEN r.relkind OPERATOR(pg_catalog.=) 'p' THEN '' ELSE 'ONLY' END, rel, r.id_column);
        IF r.old_identity OPERATOR(pg_catalog.<>) '' THEN
            EXECUTE pg_catalog.format('ALTER TABLE %s ALTER COLUMN %I ADD GENERATED %s AS IDENTITY (START WITH %s)', rel, r.id_column,
                CASE r.old_identity WHEN 'a' THEN 'ALWAYS' ELSE 'BY DEFAULT' END, col_max OPERATOR(pg_catalog.+) 1);
        ELSIF r.old_default IS NOT NULL THEN
            EXECUTE pg_catalog.format('ALTER TABLE %s %s ALTER COLUMN %I SET DEFAULT %s', CASE WHEN r.relkind OPERATOR(pg_catalog.=) 'p' THEN '' ELSE 'ONLY' END,
                rel, r.id_column, r.old_default);
        END IF;
        DELETE FROM pgticket.conversions c
         WHERE c.relation OPERATOR(pg_catalog.=) r.relation AND c.id_column OPERATOR(pg_catalog.=) r.id_column;
    END LOOP;
    -- The sequence (not an identity's, made anew above), off its last
    -- value: above every value in its columns and every value it handed out
    -- before the conversion (converted_above covers them; review of #47).
    seq := pg_catalog.to_regclass(conv.sequence);
    IF conv.old_identity OPERATOR(pg_catalog.=) '' AND seq IS NOT NULL THEN
        SELECT s.seqmin INTO seq_min FROM pg_catalog.pg_sequence s WHERE s.seqrelid OPERATOR(pg_catalog.=) seq;
        PERFORM pg_catalog.setval(seq, GREATEST(col_max, conv.converted_above, seq_min),
                                  GREATEST(col_max, conv.converted_above) OPERATOR(pg_catalog.>=) seq_min);
    END IF;
    RETURN col_max;
END $$;
REVOKE ALL ON FUNCTION pgticket.revert_conversion(regclass, name) FROM PUBLIC;
COMMENT ON FUNCTION pgticket.revert_conversion(regclass, name) IS
    'Puts back the sequence default or identity a converted key column had, with every column converted from the same sequence, the sequence above their values and what it had handed out; returns the highest';

-- 0.5.0 (#50): public IDs (src/public_ids.rs).
CREATE  FUNCTION pgticket."public_id"(
	"id" bigint, /* i64 */
	"key" text /* Name < '_ > */
) RETURNS TEXT /* String */
STRICT STABLE PARALLEL RESTRICTED 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'public_id_wrapper';
CREATE  FUNCTION pgticket."private_id"(
	"form" text, /* Name < '_ > */
	"key" text /* Name < '_ > */
) RETURNS bigint /* i64 */
STRICT STABLE PARALLEL RESTRICTED 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'private_id_wrapper';
CREATE  FUNCTION pgticket."create_public_key"(
	"name" text /* Option < Name < '_ > > */
) RETURNS INT /* i32 */
VOLATILE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'create_public_key_wrapper';
CREATE  FUNCTION pgticket."retire_public_key"(
	"name" text, /* Option < Name < '_ > > */
	"version" INT /* Option < i32 > */
) RETURNS bool /* bool */
VOLATILE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'retire_public_key_wrapper';
-- 0.5.0 (#50): the keys of public IDs, each version 32 bytes from the
-- server's strong random source. Readable by the extension's owner only;
-- dumped (a restore keeps the forms readable): a dump holds the keys.
CREATE TABLE pgticket.public_keys (
    name text COLLATE "C" NOT NULL,
    version integer NOT NULL CHECK (version > 0),
    key bytea NOT NULL CHECK (pg_catalog.octet_length(key) OPERATOR(pg_catalog.=) 32),
    created_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    retired_at timestamptz,
    PRIMARY KEY (name, version)
);
COMMENT ON TABLE pgticket.public_keys IS
    'The keys of public IDs (pgticket.public_id, pgticket.private_id): each version of each named key, its creation and retirement';
REVOKE ALL ON pgticket.public_keys FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('pgticket.public_keys', '');
CREATE FUNCTION pgticket.public_keys_changed() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'rights_changed_wrapper';
REVOKE ALL ON FUNCTION pgticket.public_keys_changed() FROM PUBLIC;
COMMENT ON FUNCTION pgticket.public_keys_changed() IS
    'Trigger: a change of pgticket.public_keys reaches every session';
CREATE TRIGGER changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON pgticket.public_keys
    FOR EACH STATEMENT EXECUTE FUNCTION pgticket.public_keys_changed();
ALTER TABLE pgticket.public_keys ENABLE ALWAYS TRIGGER changed;
-- Rows applied by logical replication fire row triggers only (a retirement
-- replicated from another node reached no session here).
CREATE TRIGGER changed_row AFTER INSERT OR UPDATE OR DELETE ON pgticket.public_keys
    FOR EACH ROW EXECUTE FUNCTION pgticket.public_keys_changed();
ALTER TABLE pgticket.public_keys ENABLE ALWAYS TRIGGER changed_row;
-- A dump restored into the database it came from: a key version there
-- already is skipped (the same secret).
CREATE TRIGGER keeps_present BEFORE INSERT ON pgticket.public_keys
    FOR EACH ROW EXECUTE FUNCTION pgticket.merge_loaded_row();
ALTER TABLE pgticket.public_keys ENABLE ALWAYS TRIGGER keeps_present;
ALTER TABLE pgticket.rights DROP CONSTRAINT rights_kind_check;
ALTER TABLE pgticket.rights ADD CONSTRAINT rights_kind_check CHECK (kind IN ('scope', 'block', 'public_key'));
CREATE OR REPLACE VIEW pgticket.scope_grants AS
    SELECT role, kind,
           CASE WHEN kind OPERATOR(pg_catalog.=) 'scope' THEN queue END AS queue,
           CASE WHEN kind OPERATOR(pg_catalog.=) 'scope' THEN domain END AS domain,
           CASE WHEN kind OPERATOR(pg_catalog.=) 'block' THEN queue END AS block_name,
           CASE WHEN kind OPERATOR(pg_catalog.=) 'public_key' THEN queue END AS public_key
      FROM pgticket.rights;
CREATE FUNCTION pgticket.grant_public_key(role regrole, name text) RETURNS boolean
VOLATILE SECURITY DEFINER LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$ SELECT pgticket.change_right(true, role, 'public_key', name, NULL) $$;
CREATE FUNCTION pgticket.revoke_public_key(role regrole, name text) RETURNS boolean
VOLATILE SECURITY DEFINER LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$ SELECT pgticket.change_right(false, role, 'public_key', name, NULL) $$;
COMMENT ON FUNCTION pgticket.grant_public_key(regrole, text) IS
    'Lets role encode and decode public IDs with key name (a trailing * is a prefix); true if new';
COMMENT ON FUNCTION pgticket.revoke_public_key(regrole, text) IS
    'Removes the grant pgticket.grant_public_key(role, name) made; true if there was one';
REVOKE EXECUTE ON FUNCTION pgticket.grant_public_key(regrole, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgticket.revoke_public_key(regrole, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgticket.create_public_key(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgticket.retire_public_key(text, integer) FROM PUBLIC;
COMMENT ON FUNCTION pgticket.public_id(bigint, text) IS
    'The public form of id under key (15 characters, Crockford base 32): a keyed permutation (FF1 over AES-256), reversible only with the key';
COMMENT ON FUNCTION pgticket.private_id(text, text) IS
    'The id whose public form under key is form; a mistyped form or another key''s is refused (22P02)';
COMMENT ON FUNCTION pgticket.create_public_key(text) IS
    'Admin: a new version of public key name (the first makes it), from the server''s strong random source; it encodes from now on, older live versions still decode; the version';
COMMENT ON FUNCTION pgticket.retire_public_key(text, integer) IS
    'Admin: that version of public key name no longer decodes; true if it was live';
