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
//! What was there (the default, or the identity and its kind) is recorded
//! in `pgticket.conversions` (of the node, like the schema itself: DDL does
//! not replicate) so `pgticket.revert_conversion` puts it back, its
//! sequence set above the column's values.
//!
//! Touches: the caller's table (as the caller), `pgticket.conversions`,
//! and the ticket scope's mark through `pgticket.advance_ticket`.

use pgrx::prelude::*;

extension_sql!(
    r#"
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
"#,
    name = "convert",
    requires = ["by_replication", "schema"]
);
