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

-- 0.5.0 (SPEC s.19.4): key columns converted from a sequence to tickets or
-- snowflakes, and what they had before (a node's own, as its schema is).
CREATE TABLE pgticket.conversions (
    relation regclass NOT NULL,
    id_column text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('ticket', 'snowflake')),
    old_default text,
    old_identity "char" NOT NULL DEFAULT '',
    converted_above bigint NOT NULL,
    converted_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (relation, id_column)
);
COMMENT ON TABLE pgticket.conversions IS
    'Key columns converted from a sequence to tickets or snowflakes (pgticket.convert_sequence), with the default or identity they had';
REVOKE ALL ON pgticket.conversions FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('pgticket.conversions', '');
CREATE TRIGGER by_replication BEFORE INSERT OR UPDATE OR DELETE ON pgticket.conversions
    FOR EACH ROW EXECUTE FUNCTION pgticket.by_replication();
ALTER TABLE pgticket.conversions ENABLE REPLICA TRIGGER by_replication;

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
    seq_last bigint;
    col_max bigint;
    floor_value bigint;
    queue text := relation::text;
    domain text := id_column::text;
BEGIN
    IF relation IS NULL OR id_column IS NULL OR kind IS NULL OR above IS NULL THEN
        RAISE EXCEPTION 'pg_ticket: relation, id_column, kind and above must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF kind OPERATOR(pg_catalog.<>) ALL (ARRAY['ticket', 'snowflake']) THEN
        RAISE EXCEPTION 'pg_ticket: kind is ''ticket'' or ''snowflake'', not %', pg_catalog.quote_literal(kind)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    EXECUTE pg_catalog.format('LOCK TABLE %s IN SHARE ROW EXCLUSIVE MODE', relation);
    SELECT a.attnum, a.atttypid, a.attidentity, pg_catalog.pg_get_expr(d.adbin, d.adrelid) AS def
      INTO att
      FROM pg_catalog.pg_attribute a
      LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid OPERATOR(pg_catalog.=) a.attrelid AND d.adnum OPERATOR(pg_catalog.=) a.attnum
     WHERE a.attrelid OPERATOR(pg_catalog.=) relation AND a.attname OPERATOR(pg_catalog.=) id_column AND NOT a.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pg_ticket: column % of % does not exist', pg_catalog.quote_ident(id_column), relation USING ERRCODE = 'undefined_column';
    END IF;
    IF EXISTS (SELECT FROM pgticket.conversions c WHERE c.relation OPERATOR(pg_catalog.=) convert_sequence.relation
                                                   AND c.id_column OPERATOR(pg_catalog.=) convert_sequence.id_column::text) THEN
        RAISE EXCEPTION 'pg_ticket: column % of % is converted already (pgticket.revert_conversion undoes it)', pg_catalog.quote_ident(id_column), relation
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF att.atttypid OPERATOR(pg_catalog.<>) 'pg_catalog.int8'::pg_catalog.regtype
       AND (kind OPERATOR(pg_catalog.=) 'snowflake' OR att.atttypid OPERATOR(pg_catalog.<>) 'pg_catalog.int4'::pg_catalog.regtype) THEN
        RAISE EXCEPTION 'pg_ticket: column % of % is %: % keys need bigint%', pg_catalog.quote_ident(id_column), relation,
            pg_catalog.format_type(att.atttypid, NULL), kind, CASE WHEN kind OPERATOR(pg_catalog.=) 'ticket' THEN ' or integer' ELSE '' END
            USING ERRCODE = 'datatype_mismatch',
                  HINT = 'ALTER TABLE ... ALTER COLUMN ... TYPE bigint first (and every column that references it).';
    END IF;
    seq := pg_catalog.pg_get_serial_sequence(relation::text, id_column::text)::pg_catalog.regclass;
    IF seq IS NULL AND att.def LIKE 'nextval(''%' THEN
        -- A sequence the column does not own: named in its default.
        seq := pg_catalog."substring"(att.def, 'nextval\(''([^'']+)''')::pg_catalog.regclass;
    END IF;
    IF seq IS NULL AND att.attidentity OPERATOR(pg_catalog.=) '' AND coalesce(att.def, '') NOT LIKE 'nextval(%' THEN
        RAISE EXCEPTION 'pg_ticket: column % of % takes no value from a sequence (no serial, identity or nextval() default)',
            pg_catalog.quote_ident(id_column), relation USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF seq IS NOT NULL THEN
        seq_last := pg_catalog.pg_sequence_last_value(seq);
    END IF;
    EXECUTE pg_catalog.format('SELECT pg_catalog.max(%I)::pg_catalog.int8 FROM %s', id_column, relation) INTO col_max;
    floor_value := GREATEST(col_max, seq_last, above, 0);
    IF kind OPERATOR(pg_catalog.=) 'ticket' THEN
        BEGIN
            PERFORM pgticket.advance_ticket(queue, domain, floor_value);
        EXCEPTION WHEN invalid_parameter_value THEN
            NULL; -- the scope's mark is above it already
        END;
    ELSIF floor_value OPERATOR(pg_catalog.>=) @extschema@.snowflake_min_id(pg_catalog.now()) THEN
        RAISE EXCEPTION 'pg_ticket: column % of % holds values up to %, not below today''s snowflakes', pg_catalog.quote_ident(id_column), relation, floor_value
            USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'Convert it to tickets instead.';
    END IF;
    INSERT INTO pgticket.conversions (relation, id_column, kind, old_default, old_identity, converted_above)
        VALUES (relation, id_column::text, kind, att.def, att.attidentity, floor_value);
    IF att.attidentity OPERATOR(pg_catalog.<>) '' THEN
        EXECUTE pg_catalog.format('ALTER TABLE %s ALTER COLUMN %I DROP IDENTITY', relation, id_column);
    END IF;
    EXECUTE pg_catalog.format('ALTER TABLE %s ALTER COLUMN %I SET DEFAULT %s', relation, id_column,
        CASE kind WHEN 'ticket' THEN pg_catalog.format('@extschema@.next_ticket(%L, %L)', queue, domain)
                  ELSE '@extschema@.snowflake_id()' END);
    RETURN floor_value;
END $$;
REVOKE ALL ON FUNCTION pgticket.convert_sequence(regclass, name, text, bigint) FROM PUBLIC;
COMMENT ON FUNCTION pgticket.convert_sequence(regclass, name, text, bigint) IS
    'Converts a key column from its sequence (serial, identity, nextval default) to tickets or snowflakes, above every value in it, what the sequence handed out and above; returns that floor';

CREATE FUNCTION pgticket.revert_conversion(relation regclass, id_column name) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    conv record;
    col_max bigint;
    seq regclass;
BEGIN
    SELECT * INTO conv FROM pgticket.conversions c
     WHERE c.relation OPERATOR(pg_catalog.=) revert_conversion.relation AND c.id_column OPERATOR(pg_catalog.=) revert_conversion.id_column::text;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pg_ticket: column % of % was not converted (pgticket.conversions)', pg_catalog.quote_ident(id_column), relation
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    EXECUTE pg_catalog.format('LOCK TABLE %s IN SHARE ROW EXCLUSIVE MODE', relation);
    EXECUTE pg_catalog.format('SELECT pg_catalog.max(%I)::pg_catalog.int8 FROM %s', id_column, relation) INTO col_max;
    col_max := coalesce(col_max, 0);
    EXECUTE pg_catalog.format('ALTER TABLE %s ALTER COLUMN %I DROP DEFAULT', relation, id_column);
    IF conv.old_identity OPERATOR(pg_catalog.<>) '' THEN
        EXECUTE pg_catalog.format('ALTER TABLE %s ALTER COLUMN %I ADD GENERATED %s AS IDENTITY (START WITH %s)', relation, id_column,
            CASE conv.old_identity WHEN 'a' THEN 'ALWAYS' ELSE 'BY DEFAULT' END, col_max OPERATOR(pg_catalog.+) 1);
    ELSE
        EXECUTE pg_catalog.format('ALTER TABLE %s ALTER COLUMN %I SET DEFAULT %s', relation, id_column, conv.old_default);
        seq := pg_catalog.pg_get_serial_sequence(relation::text, id_column::text)::pg_catalog.regclass;
        IF seq IS NOT NULL AND col_max OPERATOR(pg_catalog.>) 0 THEN
            PERFORM pg_catalog.setval(seq, col_max);
        END IF;
    END IF;
    DELETE FROM pgticket.conversions c
     WHERE c.relation OPERATOR(pg_catalog.=) revert_conversion.relation AND c.id_column OPERATOR(pg_catalog.=) revert_conversion.id_column::text;
    RETURN col_max;
END $$;
REVOKE ALL ON FUNCTION pgticket.revert_conversion(regclass, name) FROM PUBLIC;
COMMENT ON FUNCTION pgticket.revert_conversion(regclass, name) IS
    'Puts back the sequence default or identity a converted key column had, its sequence set above the values in the column; returns the highest';
