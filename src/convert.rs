//! Converting an existing key column (a `serial`, an identity, a sequence
//! `DEFAULT`) to tickets or snowflakes in one call, and back (SPEC §19.4):
//! what a group of primaries needs, since a sequence hands out the same
//! values on every node. SQL only (PL/pgSQL, run as the caller, who must
//! own the table: it alters it).
//!
//! One transaction: the table is locked against writes (`SHARE ROW
//! EXCLUSIVE`, then the `ALTER TABLE`'s own lock), so an insert running
//! meanwhile waits and then takes its key from the new default; the new
//! series starts above every value in the column, the value the sequence
//! last handed out, and `above` (what the caller knows other nodes used).
//! A sequence is one series: every column that takes values from it (two
//! tables sharing one sequence, review of #47) converts with it, to one
//! ticket scope `(the sequence's name, 'sequence')`, and goes back with it.
//! What was there (the default, or the identity and its kind) is recorded
//! in `pgticket.conversions` (of the node, like the schema itself: DDL does
//! not replicate), by the table's name as text (a regclass column stopped
//! the other nodes' apply for a table they lack, a temporary one), so
//! `pgticket.revert_conversion` puts it back, the sequence set above the
//! columns' values and what it handed out before.
//!
//! Only tables take part (review of #47: a view's column whose default took
//! from the sequence was read, and its function ran as the caller, an
//! administrator), each owned by the caller; every old default is read
//! before anything is altered, and each table is altered alone (`ONLY`;
//! a partitioned table's default also reaches its partitions), so an
//! inheritance child gets back its own default. The sequence itself is
//! set to its last value: a `nextval()` elsewhere fails loudly rather than
//! hand out a ticket's value; reverting sets it above the columns' values
//! and what it had handed out.
//!
//! Touches: the caller's tables (as the caller), `pgticket.conversions`,
//! and the ticket scope through `pgticket.raise_ticket_floor` (its cached
//! tickets dropped: a column reverted and converted again got the tickets
//! cached before, which the sequence had handed out meanwhile).

use pgrx::prelude::*;

extension_sql!(
    r#"
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
"#,
    name = "convert",
    requires = ["by_replication", "schema", "ticket_views"]
);
