-- pg_ticket 0.2.0 -> 0.3.0 (ALTER EXTENSION pg_ticket UPDATE). What changed is
-- listed in CHANGELOG.md; the library's changes take effect after its
-- install and a restart (install, restart, then update).
\echo Use "ALTER EXTENSION pg_ticket UPDATE" to load this file. \quit

-- 0.3.0: a mark never moves back, and no row or table of marks is emptied
-- (SPEC s.13.10): a value handed out must never be handed out again, and a
-- cache (the tickets' shared memory, a client's block) may still hold
-- values above a row that is gone. TRUNCATE and DELETE are refused, and on
-- the tickets table an UPDATE that lowers a mark or renames its scope (the
-- old name would count from 1 again); ENABLE ALWAYS, so
-- session_replication_role does not skip them. On the counters' tables an
-- UPDATE is not checked: a row trigger there costs 5-12% of the
-- one-ID-per-transaction rate (measured), and lowering a mark by hand is
-- an owner's deliberate rewind, like setval() on a sequence. To start a state over, DROP EXTENSION and CREATE
-- EXTENSION (a new extension is a new life); an owner who must remove rows
-- anyway disables the trigger for that statement, knowing the risk.
CREATE FUNCTION pgticket.refuse_rewind() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'pg_ticket: % on %.% would let values be handed out again',
                    TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME
        USING ERRCODE = 'object_not_in_prerequisite_state',
              DETAIL = 'Marks only move forward, a scope keeps its name, and no row or table of marks is emptied.',
              HINT = 'Move a mark with the advance_* functions; start over with DROP EXTENSION pg_ticket and CREATE EXTENSION pg_ticket.';
END $$;
COMMENT ON FUNCTION pgticket.refuse_rewind() IS
    'Trigger: refuses TRUNCATE, DELETE and lowering UPDATE of pg_ticket''s marks';
REVOKE ALL ON FUNCTION pgticket.refuse_rewind() FROM PUBLIC;
CREATE TRIGGER never_emptied BEFORE DELETE ON pgticket.scoped_counters
    FOR EACH ROW EXECUTE FUNCTION pgticket.refuse_rewind();
CREATE TRIGGER never_truncated BEFORE TRUNCATE ON pgticket.scoped_counters
    FOR EACH STATEMENT EXECUTE FUNCTION pgticket.refuse_rewind();
CREATE TRIGGER never_emptied BEFORE DELETE ON pgticket.blocks
    FOR EACH ROW EXECUTE FUNCTION pgticket.refuse_rewind();
CREATE TRIGGER never_truncated BEFORE TRUNCATE ON pgticket.blocks
    FOR EACH STATEMENT EXECUTE FUNCTION pgticket.refuse_rewind();
CREATE TRIGGER forward_only BEFORE UPDATE ON pgticket.tickets
    FOR EACH ROW WHEN (NEW.mark < OLD.mark OR NEW.queue IS DISTINCT FROM OLD.queue OR NEW.domain IS DISTINCT FROM OLD.domain)
    EXECUTE FUNCTION pgticket.refuse_rewind();
CREATE TRIGGER never_emptied BEFORE DELETE ON pgticket.tickets
    FOR EACH ROW EXECUTE FUNCTION pgticket.refuse_rewind();
CREATE TRIGGER never_truncated BEFORE TRUNCATE ON pgticket.tickets
    FOR EACH STATEMENT EXECUTE FUNCTION pgticket.refuse_rewind();
ALTER TABLE pgticket.scoped_counters ENABLE ALWAYS TRIGGER never_emptied, ENABLE ALWAYS TRIGGER never_truncated;
ALTER TABLE pgticket.blocks ENABLE ALWAYS TRIGGER never_emptied, ENABLE ALWAYS TRIGGER never_truncated;
ALTER TABLE pgticket.tickets ENABLE ALWAYS TRIGGER forward_only, ENABLE ALWAYS TRIGGER never_emptied,
    ENABLE ALWAYS TRIGGER never_truncated;

-- 0.3.0: every state table has a primary key, so a FOR ALL TABLES
-- publication does not refuse the registry's own writes (SPEC s.13.10).
ALTER TABLE pgticket.lease_registry ADD PRIMARY KEY (system_identifier, timeline, database_oid, grants_from);

-- 0.3.0: a prepared transaction can hold a gap-free scope's row for ever
-- (it survives restarts; idle_in_transaction_session_timeout cannot reach
-- it): this view names it, so an administrator can COMMIT or ROLLBACK
-- PREPARED. Not granted to PUBLIC.
CREATE VIEW pgticket.prepared_holders AS
    SELECT p.gid, p.owner, p.prepared, 'scope'::text AS kind, c.queue, c.domain, NULL::text AS block_name
      FROM pg_catalog.pg_prepared_xacts p
      JOIN pgticket.scoped_counters c ON c.xmax OPERATOR(pg_catalog.=) p.transaction
     WHERE p.database OPERATOR(pg_catalog.=) pg_catalog.current_database()
    UNION ALL
    SELECT p.gid, p.owner, p.prepared, 'block'::text, NULL, NULL, b.name
      FROM pg_catalog.pg_prepared_xacts p
      JOIN pgticket.blocks b ON b.xmax OPERATOR(pg_catalog.=) p.transaction
     WHERE p.database OPERATOR(pg_catalog.=) pg_catalog.current_database();
COMMENT ON VIEW pgticket.prepared_holders IS
    'Prepared transactions holding a scoped counter or block name locked (end them with COMMIT PREPARED or ROLLBACK PREPARED)';
REVOKE ALL ON pgticket.prepared_holders FROM PUBLIC;

-- 0.3.0: machine-id leases (SPEC s.8 rules 7, 9). Each lease has a secret,
-- kept here only as its SHA-256, and the margin it was granted under (a
-- margin lowered since does not shorten its holder's allowance). The
-- registry's identity includes its server's start (any start may be a copy:
-- it then holds off), and records the longest ttl and margin it allowed,
-- which a dump carries. The sequence keeps when a change of state while the
-- server ran (a database copied, a dump restored) was first seen: it is not
-- transactional (the refusal that sees it rolls back) and not dumped.
ALTER TABLE pgticket.machine_id_leases ADD COLUMN secret_hash bytea, ADD COLUMN margin_ms bigint;
-- 0.3.0: a registry leases ids up to its pg_ticket.machine_bits (at most
-- 16): the check is the widest layout's, the setting the registry's own.
ALTER TABLE pgticket.machine_id_leases DROP CONSTRAINT machine_id_leases_machine_id_check,
    ADD CONSTRAINT machine_id_leases_machine_id_check CHECK (machine_id BETWEEN 0 AND 65535);
ALTER TABLE pgticket.lease_registry ADD COLUMN started_at timestamptz,
    ADD COLUMN max_ttl_ms bigint NOT NULL DEFAULT 0, ADD COLUMN margin_ms bigint NOT NULL DEFAULT 0;
CREATE SEQUENCE pgticket.lease_registry_seen;
REVOKE ALL ON SEQUENCE pgticket.lease_registry_seen FROM PUBLIC;
-- An updated registry's row is not its own (it has no start): it holds off
-- once, from its first call, since 0.2.0 did not hold off at a restart.

-- 0.3.0: a registry's leases are never emptied or rewound (SPEC s.13.10): a
-- row gone or lowered would let an id be granted while its holder still
-- stamps. A registry created, dropped and created again, or whose identity
-- rows were removed holds off like a restored one (end_lease_hold_off()
-- vouches for one new to its fleet), and its tokens move past the clock.
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
                                                    ELSE LEAST(coalesce(OLD.ended_at, OLD.expires_at), OLD.expires_at) END) * 1000)::bigint
                           + coalesce(OLD.margin_ms, 0)))
    EXECUTE FUNCTION pgticket.refuse_rewind();
CREATE UNIQUE INDEX machine_id_leases_lease ON pgticket.machine_id_leases (lease);
CREATE TRIGGER never_emptied BEFORE DELETE ON pgticket.machine_id_leases
    FOR EACH ROW EXECUTE FUNCTION pgticket.refuse_rewind();
CREATE TRIGGER never_truncated BEFORE TRUNCATE ON pgticket.machine_id_leases
    FOR EACH STATEMENT EXECUTE FUNCTION pgticket.refuse_rewind();
ALTER TABLE pgticket.machine_id_leases ENABLE ALWAYS TRIGGER forward_only, ENABLE ALWAYS TRIGGER never_emptied,
    ENABLE ALWAYS TRIGGER never_truncated;

-- Leases need their secret: the functions change their signatures (0.2.0's
-- leases have none, run to their end, and are not renewed).
DROP FUNCTION lease_machine_id(text, interval);
DROP FUNCTION renew_machine_id(integer, bigint, interval, bigint);
DROP FUNCTION release_machine_id(integer, bigint, bigint);
CREATE FUNCTION "lease_machine_id"(
	"holder" text,
	"ttl" interval DEFAULT '60 seconds'
) RETURNS TABLE (
	"machine_id" INT,
	"lease" bigint,
	"secret" TEXT,
	"not_before_ms" bigint,
	"expires_at" timestamp with time zone,
	"epoch_ms" bigint,
	"machine_bits" INT
)
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'lease_machine_id_with_secret_wrapper';
CREATE FUNCTION "renew_machine_id"(
	"machine_id" INT,
	"lease" bigint,
	"secret" TEXT,
	"ttl" interval DEFAULT '60 seconds',
	"last_issued_ms" bigint DEFAULT NULL
) RETURNS timestamp with time zone
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'renew_machine_id_with_secret_wrapper';
CREATE FUNCTION "release_machine_id"(
	"machine_id" INT,
	"lease" bigint,
	"secret" TEXT,
	"last_issued_ms" bigint DEFAULT NULL
) RETURNS void
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'release_machine_id_with_secret_wrapper';
REVOKE EXECUTE ON FUNCTION lease_machine_id(text, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION renew_machine_id(integer, bigint, text, interval, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION release_machine_id(integer, bigint, text, bigint) FROM PUBLIC;
-- An administrator vouches that a holding-off registry may grant at once.
CREATE FUNCTION "end_lease_hold_off"() RETURNS bool
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'end_lease_hold_off_wrapper';
REVOKE EXECUTE ON FUNCTION end_lease_hold_off() FROM PUBLIC;
-- No view shows a lease's token to a role that is not the registry's owner.
CREATE OR REPLACE VIEW pgticket.machine_leases AS
    SELECT l.machine_id, l.holder,
           CASE WHEN pg_catalog.pg_has_role(c.relowner, 'USAGE') THEN l.lease END AS lease,
           l.leased_at, l.expires_at, l.last_issued_ms,
           CASE WHEN l.revoked THEN 'revoked'
                WHEN l.ended_at IS NOT NULL THEN 'released'
                WHEN l.expires_at > pg_catalog.clock_timestamp() THEN 'held'
                ELSE 'expired' END AS state
      FROM pgticket.machine_id_leases l, pg_catalog.pg_class c
     WHERE c.oid OPERATOR(pg_catalog.=) 'pgticket.machine_id_leases'::pg_catalog.regclass;
COMMENT ON VIEW pgticket.machine_leases IS
    'Each machine id''s latest lease: holder, fencing token (shown to the registry''s owner only), times, last reported stamp, state';

-- 0.3.0: the snowflake ID space (epoch, machine bits) is recorded with the
-- database's state at its first snowflake or lease, so a dump restored onto
-- a server set for another space refuses snowflake_id() and leases there
-- (SPEC s.13.10). 0.2.0 recorded no space: the first use after the update
-- records the server's (but see a registry's below).
CREATE FUNCTION "snowflake_id_space"() RETURNS TABLE (
	"epoch_ms" bigint,
	"machine_bits" INT
)
STRICT STABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'snowflake_id_space_wrapper';
CREATE TABLE pgticket.id_space (
    epoch_ms bigint NOT NULL,
    machine_bits integer NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (epoch_ms, machine_bits, recorded_at)
);
COMMENT ON TABLE pgticket.id_space IS
    'The snowflake ID space (epoch, machine bits) of the IDs made for this database, recorded at the first use; a server set for another refuses snowflake_id() and leases here';
CREATE FUNCTION pgticket.id_space_changed() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'id_space_changed_wrapper';
CREATE TRIGGER changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON pgticket.id_space
    FOR EACH STATEMENT EXECUTE FUNCTION pgticket.id_space_changed();
ALTER TABLE pgticket.id_space ENABLE ALWAYS TRIGGER changed;
SELECT pg_catalog.pg_extension_config_dump('pgticket.id_space', '');
REVOKE ALL ON pgticket.id_space FROM PUBLIC;
REVOKE ALL ON FUNCTION pgticket.id_space_changed() FROM PUBLIC;
-- One thing is known of a 0.2.0 registry that leased: its holders stamp in
-- 0.2.0's one layout, 10 machine bits (the epoch is the one configured, as
-- a first use would record it). Recorded, so that a registry set for more
-- pg_ticket.machine_bits refuses to lease into a fleet of 0.2.0 holders.
INSERT INTO pgticket.id_space (epoch_ms, machine_bits)
    SELECT s.epoch_ms, 10 FROM snowflake_id_space() s WHERE EXISTS (SELECT FROM pgticket.machine_id_leases);

-- 0.3.0: how many scopes, ticket scopes and block names each role created
-- (pg_ticket.max_scopes_per_role caps it), in a few rows per role so that
-- its sessions seldom wait on one another. Not dumped: role ids differ
-- between clusters, and a restored database counts anew. Rows created
-- before the update are not counted.
CREATE TABLE pgticket.scope_quota (
    role oid NOT NULL,
    shard integer NOT NULL,
    scopes bigint NOT NULL,
    PRIMARY KEY (role, shard)
);
REVOKE ALL ON pgticket.scope_quota FROM PUBLIC;
-- An administrator closes a counter or block name for good, keeping its mark.
CREATE FUNCTION "retire_block"(
	"name" text
) RETURNS bigint
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'retire_block_wrapper';
CREATE FUNCTION "retire_scope"(
	"queue" text,
	"domain" text
) RETURNS bigint
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'retire_scope_wrapper';
REVOKE EXECUTE ON FUNCTION retire_scope(text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION retire_block(text) FROM PUBLIC;

-- 0.3.0: pgticket.status says where the machine id comes from ('default'
-- when pg_ticket.machine_id was left unset: two servers of one keyspace
-- both on 0 would share IDs).
-- A function of its own: ticket_status() keeps its signature and the view
-- is replaced, not dropped (views and grants built on it survive).
CREATE FUNCTION "ticket_machine_id_source"() RETURNS TEXT
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'ticket_machine_id_source_wrapper';
CREATE OR REPLACE VIEW pgticket.status AS SELECT s.*, ticket_machine_id_source() AS machine_id_source,
    (SELECT machine_bits FROM snowflake_id_space()) AS machine_bits FROM ticket_status() s;

-- 0.3.0: number_rows() creates the assign_scoped_id() / assign_ticket()
-- trigger with its arguments checked at once (the trigger checks them only
-- at the first row). The checks are the trigger's (src/triggers.rs: columns
-- by name, the id column bigint, integer, smallint, numeric, text or varchar or a domain
-- over one, a literal domain of 1-255 bytes), with its SQLSTATEs. SECURITY
-- INVOKER: CREATE TRIGGER checks the caller's rights on the table.
CREATE FUNCTION number_rows(
    relation regclass,
    id_column name,
    queue_column name,
    domain text DEFAULT NULL,
    domain_column name DEFAULT NULL,
    allocator text DEFAULT 'scoped_id'
) RETURNS name
VOLATILE LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    trigger_function text := CASE allocator WHEN 'scoped_id' THEN 'assign_scoped_id' WHEN 'ticket' THEN 'assign_ticket' END;
    trigger_name name := 'number_' || id_column;
    own_schema name;
    id_type oid;
    column_name name;
BEGIN
    IF relation IS NULL OR id_column IS NULL OR queue_column IS NULL OR allocator IS NULL THEN
        RAISE EXCEPTION 'number_rows: relation, id_column, queue_column and allocator must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF trigger_function IS NULL THEN
        RAISE EXCEPTION 'number_rows: allocator is ''scoped_id'' or ''ticket'', not %', quote_literal(allocator)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (domain IS NULL) = (domain_column IS NULL) THEN
        RAISE EXCEPTION 'number_rows: give either domain (the same for every row) or domain_column'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF domain = '' THEN
        RAISE EXCEPTION 'domain must not be empty' USING ERRCODE = 'invalid_parameter_value';
    ELSIF octet_length(domain) > 255 THEN
        RAISE EXCEPTION 'domain is % bytes long; the limit is 255 bytes', octet_length(domain)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOREACH column_name IN ARRAY ARRAY[id_column, queue_column, domain_column] LOOP
        CONTINUE WHEN column_name IS NULL;
        IF NOT EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = relation AND a.attname = column_name
                                                  AND a.attnum > 0 AND NOT a.attisdropped) THEN
            RAISE EXCEPTION 'column "%" of table % does not exist', column_name, relation
                USING ERRCODE = 'undefined_column';
        END IF;
        -- A BEFORE trigger sees a generated column as NULL, and the
        -- generated value replaces the number it sets.
        IF EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = relation AND a.attname = column_name AND a.attgenerated <> '') THEN
            RAISE EXCEPTION 'column "%" of table % is generated: the trigger can neither read it nor set it', column_name, relation
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
    IF id_column IN (queue_column, domain_column) THEN
        RAISE EXCEPTION 'number_rows: the id column "%" cannot also name the scope (it is NULL when the trigger runs)', id_column
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- An identity or DEFAULT fills the column before the trigger runs, so
    -- it would number nothing.
    IF EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = relation AND a.attname = id_column
                                              AND (a.attidentity <> '' OR a.atthasdef)) THEN
        RAISE EXCEPTION 'column "%" of table % has an identity or a default: the trigger numbers only rows inserted without a value', id_column, relation
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'ALTER TABLE ... ALTER COLUMN ... DROP DEFAULT (or DROP IDENTITY) first.';
    END IF;
    SELECT a.atttypid INTO id_type FROM pg_attribute a WHERE a.attrelid = relation AND a.attname = id_column;
    WHILE (SELECT t.typtype FROM pg_type t WHERE t.oid = id_type) = 'd' LOOP
        SELECT t.typbasetype INTO id_type FROM pg_type t WHERE t.oid = id_type;
    END LOOP;
    IF id_type NOT IN ('bigint'::regtype, 'integer'::regtype, 'smallint'::regtype, 'numeric'::regtype,
                       'text'::regtype, 'character varying'::regtype) THEN
        RAISE EXCEPTION 'column "%" of table % is of type %; the trigger sets bigint, integer, smallint, numeric, text or varchar columns',
                        id_column, relation, format_type(id_type, NULL)
            USING ERRCODE = 'datatype_mismatch';
    END IF;
    SELECT n.nspname INTO own_schema
      FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'pg_ticket';
    EXECUTE format('CREATE TRIGGER %I BEFORE INSERT ON %s FOR EACH ROW EXECUTE FUNCTION %I.%I(%s)',
                   trigger_name, relation, own_schema, trigger_function,
                   CASE WHEN domain_column IS NULL THEN format('%L, %L, %L', id_column, queue_column, domain)
                        ELSE format('%L, %L, %L, %L', id_column, queue_column, 'column', domain_column) END);
    RETURN trigger_name;
END $$;
COMMENT ON FUNCTION number_rows(regclass, name, name, text, name, text) IS
    'Creates a BEFORE INSERT trigger numbering relation''s id_column per scope, its arguments checked now';

-- 0.3.0: may the current user allocate from a scope or block name
-- (pg_ticket.scope_rights)? The marks view shows only those rows.
CREATE FUNCTION "may_allocate"(
	"kind" TEXT,
	"queue" text,
	"domain" text
) RETURNS bool
STABLE PARALLEL RESTRICTED
LANGUAGE c
AS 'MODULE_PATHNAME', 'may_allocate_wrapper';
-- 0.3.0: rights per scope (SPEC s.16), used while pg_ticket.scope_rights is
-- on. A pattern's trailing * is a prefix ('*' alone: every name); a scope
-- grant covers the queue's counters and tickets, a block grant block names
-- (domain '*'). Grants name roles as regrole, so a dump carries them by
-- name (a restore needs the roles, as GRANT does).
CREATE TABLE pgticket.rights (
    role regrole NOT NULL,
    kind text NOT NULL CHECK (kind IN ('scope', 'block')),
    queue text COLLATE "C" NOT NULL,
    domain text COLLATE "C" NOT NULL DEFAULT '*',
    PRIMARY KEY (role, kind, queue, domain)
);
COMMENT ON TABLE pgticket.rights IS
    'Which roles may allocate from which scopes and block names while pg_ticket.scope_rights is on (grant_scope, grant_block)';
CREATE FUNCTION pgticket.rights_changed() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'rights_changed_wrapper';
CREATE TRIGGER changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON pgticket.rights
    FOR EACH STATEMENT EXECUTE FUNCTION pgticket.rights_changed();
ALTER TABLE pgticket.rights ENABLE ALWAYS TRIGGER changed;
-- A dropped role's grants stay (they show its OID) but are not dumped: in
-- another cluster that OID may be another role's.
SELECT pg_catalog.pg_extension_config_dump('pgticket.rights',
    'WHERE EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.oid OPERATOR(pg_catalog.=) role::pg_catalog.oid)');
REVOKE ALL ON pgticket.rights FROM PUBLIC;
REVOKE ALL ON FUNCTION pgticket.rights_changed() FROM PUBLIC;
CREATE VIEW pgticket.scope_grants AS
    SELECT role, kind,
           CASE WHEN kind OPERATOR(pg_catalog.=) 'scope' THEN queue END AS queue,
           CASE WHEN kind OPERATOR(pg_catalog.=) 'scope' THEN domain END AS domain,
           CASE WHEN kind OPERATOR(pg_catalog.=) 'block' THEN queue END AS block_name
      FROM pgticket.rights;
COMMENT ON VIEW pgticket.scope_grants IS
    'The grants of scopes (queue, domain) and block names to roles; a trailing * is a prefix';
REVOKE ALL ON pgticket.scope_grants FROM PUBLIC;
CREATE FUNCTION pgticket.change_right(grant_it boolean, role regrole, kind text, queue text, domain text)
RETURNS boolean VOLATILE LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    what text := CASE kind WHEN 'scope' THEN 'queue' ELSE 'name' END;
    changed integer;
BEGIN
    IF role IS NULL OR queue IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', CASE WHEN role IS NULL THEN 'role' ELSE what END
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles r WHERE r.oid = role) THEN
        RAISE EXCEPTION 'role with OID % does not exist', role::oid USING ERRCODE = 'undefined_object';
    END IF;
    domain := coalesce(domain, '*');
    IF queue = '' OR domain = '' THEN
        RAISE EXCEPTION '% must not be empty', CASE WHEN queue = '' THEN what ELSE 'domain' END
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A name is at most 255 bytes; a pattern adds its star.
    IF octet_length(queue) - (right(queue, 1) = '*')::integer > 255 THEN
        RAISE EXCEPTION '% is longer than 255 bytes', what USING ERRCODE = 'invalid_parameter_value';
    ELSIF octet_length(domain) - (right(domain, 1) = '*')::integer > 255 THEN
        RAISE EXCEPTION 'domain is longer than 255 bytes' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Rows of roles dropped since go (a new role could get their OID).
    DELETE FROM pgticket.rights r WHERE NOT EXISTS (SELECT FROM pg_roles x WHERE x.oid = r.role::oid);
    IF grant_it THEN
        INSERT INTO pgticket.rights AS r (role, kind, queue, domain) VALUES (role, kind, queue, domain) ON CONFLICT DO NOTHING;
    ELSE
        DELETE FROM pgticket.rights r
         WHERE r.role = change_right.role AND r.kind = change_right.kind AND r.queue = change_right.queue AND r.domain = change_right.domain;
    END IF;
    GET DIAGNOSTICS changed = ROW_COUNT;
    RETURN changed > 0;
END $$;
REVOKE ALL ON FUNCTION pgticket.change_right(boolean, regrole, text, text, text) FROM PUBLIC;
CREATE FUNCTION grant_scope(role regrole, queue text, domain text DEFAULT NULL) RETURNS boolean
VOLATILE SECURITY DEFINER LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$ SELECT pgticket.change_right(true, role, 'scope', queue, domain) $$;
CREATE FUNCTION revoke_scope(role regrole, queue text, domain text DEFAULT NULL) RETURNS boolean
VOLATILE SECURITY DEFINER LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$ SELECT pgticket.change_right(false, role, 'scope', queue, domain) $$;
CREATE FUNCTION grant_block(role regrole, name text) RETURNS boolean
VOLATILE SECURITY DEFINER LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$ SELECT pgticket.change_right(true, role, 'block', name, NULL) $$;
CREATE FUNCTION revoke_block(role regrole, name text) RETURNS boolean
VOLATILE SECURITY DEFINER LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$ SELECT pgticket.change_right(false, role, 'block', name, NULL) $$;
COMMENT ON FUNCTION grant_scope(regrole, text, text) IS
    'Lets role allocate from (queue, domain) while pg_ticket.scope_rights is on (NULL domain: every domain; a trailing * is a prefix); true if new';
COMMENT ON FUNCTION revoke_scope(regrole, text, text) IS
    'Removes the grant grant_scope(role, queue, domain) made; true if there was one';
COMMENT ON FUNCTION grant_block(regrole, text) IS
    'Lets role reserve blocks of name while pg_ticket.scope_rights is on (a trailing * is a prefix); true if new';
COMMENT ON FUNCTION revoke_block(regrole, text) IS
    'Removes the grant grant_block(role, name) made; true if there was one';
REVOKE EXECUTE ON FUNCTION grant_scope(regrole, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION revoke_scope(regrole, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION grant_block(regrole, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION revoke_block(regrole, text) FROM PUBLIC;
-- A role sees the marks of the scopes and block names it may use. The
-- filter is the view's own condition over the union, and the view a
-- security barrier: a condition of the caller's (a function that leaks its
-- arguments) never sees a row filtered out. (In each branch of the union
-- the caller's condition would be pushed down beside it, and run first.)
CREATE OR REPLACE VIEW pgticket.marks WITH (security_barrier) AS
    SELECT m.kind, m.queue, m.domain, m.block_name, m.mark, m.remaining, m.max_mark
      FROM (SELECT 'scope'::text AS kind, queue, domain, NULL::text AS block_name, mark,
                   max_mark - mark AS remaining, max_mark
              FROM pgticket.scoped_counters
            UNION ALL
            SELECT 'block'::text, NULL, NULL, name, mark, max_mark - mark, max_mark
              FROM pgticket.blocks
            UNION ALL
            SELECT 'ticket'::text, queue, domain, NULL, mark, 9223372036854775807 - mark, 9223372036854775807
              FROM pgticket.tickets) m
     WHERE may_allocate(m.kind, coalesce(m.queue, m.block_name), m.domain);

-- 0.3.0: string resource IDs (SPEC s.15): the canonical decimal string of a
-- positive counter value, as the triggers write into a text or varchar id
-- column -- no sign, no leading zero, no blank, no scope prefix
-- ("demo-queue/42" is a URL, not an ID), at most 2^63-1.
CREATE DOMAIN pgticket.resource_id AS text COLLATE "C"
    CONSTRAINT resource_id_canonical CHECK (
        VALUE ~ '^[1-9][0-9]{0,18}$'
        AND (pg_catalog.length(VALUE) < 19 OR VALUE <= '9223372036854775807'));
COMMENT ON DOMAIN pgticket.resource_id IS
    'A resource ID: the canonical decimal string of 1 .. 2^63-1 (no sign, no leading zero, no scope prefix)';

-- 0.3.0: sharded IDs (SPEC s.15): ms << 22 | shard << 10 | sequence for the
-- shards this server owns (pg_ticket.shards), on the snowflake generator's
-- clock and durable mark; a shard moves with sharded_release() on its old
-- owner and sharded_accept() on its new one (administrators only).
CREATE FUNCTION "sharded_id"(
	"shard" INT
) RETURNS bigint
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'sharded_id_wrapper';
CREATE FUNCTION "sharded_release"(
	"shard" INT
) RETURNS bigint
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'sharded_release_wrapper';
CREATE FUNCTION "sharded_accept"(
	"shard" INT,
	"handover_id" bigint
) RETURNS bigint
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'sharded_accept_wrapper';
CREATE FUNCTION "sharded_decode"(
	"id" bigint
) RETURNS TABLE (
	"created_at" timestamp with time zone,
	"shard" INT,
	"sequence" INT
)
STABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'sharded_decode_wrapper';
CREATE FUNCTION "sharded_min_id"(
	"at" timestamp with time zone
) RETURNS bigint
STABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'sharded_min_id_wrapper';
CREATE FUNCTION "sharded_max_id"(
	"at" timestamp with time zone
) RETURNS bigint
STABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'sharded_max_id_wrapper';
CREATE FUNCTION "shard_of"(
	"key" text,
	"shard_count" INT
) RETURNS INT
IMMUTABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'shard_of_wrapper';
REVOKE EXECUTE ON FUNCTION sharded_release(integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION sharded_accept(integer, bigint) FROM PUBLIC;
