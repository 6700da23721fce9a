-- pg_ticket's state: one row per scoped counter and per block name, holding
-- the high-water mark (the last value handed out; a scope never used has no
-- row and reads as 0). Ordinary roles read the marks through the view and
-- change them only through the functions, which write as this schema's owner.

CREATE SCHEMA pgticket;
COMMENT ON SCHEMA pgticket IS 'pg_ticket state: counter and block high-water marks';

-- max_mark (0.2.0): the highest value the scope may hand out, for series
-- that feed an integer column (set_scoped_limit / set_block_limit).
CREATE TABLE pgticket.scoped_counters (
    queue  text COLLATE "C" NOT NULL,
    domain text COLLATE "C" NOT NULL,
    mark   bigint NOT NULL CHECK (mark >= 0),
    PRIMARY KEY (queue, domain),
    max_mark bigint NOT NULL DEFAULT 9223372036854775807,
    CONSTRAINT scoped_counters_mark_within_limit CHECK (mark <= max_mark)
);

CREATE TABLE pgticket.blocks (
    name text COLLATE "C" NOT NULL PRIMARY KEY,
    mark bigint NOT NULL CHECK (mark >= 0),
    max_mark bigint NOT NULL DEFAULT 9223372036854775807,
    CONSTRAINT blocks_mark_within_limit CHECK (mark <= max_mark)
);

-- Tickets (0.2.0): the mark is the last value of the last segment reserved;
-- the series (offset, increment) is the one the scope was created in.
CREATE TABLE pgticket.tickets (
    queue  text COLLATE "C" NOT NULL,
    domain text COLLATE "C" NOT NULL,
    mark   bigint NOT NULL CHECK (mark >= 0),
    ticket_offset integer NOT NULL,
    ticket_increment integer NOT NULL,
    PRIMARY KEY (queue, domain),
    CONSTRAINT tickets_series CHECK (ticket_increment >= 1 AND ticket_offset BETWEEN 1 AND ticket_increment)
);

-- Machine-id leases (0.2.0): each machine id's latest lease (an id never
-- leased has no row), the fencing tokens, and which server, timeline and
-- database the registry has served as since when (a restore or promotion
-- shows as another identity: the registry then holds off, SPEC s.8 rule 7).
CREATE TABLE pgticket.machine_id_leases (
    machine_id integer PRIMARY KEY CHECK (machine_id BETWEEN 0 AND 65535),
    holder text NOT NULL,
    lease bigint NOT NULL,
    leased_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    ended_at timestamptz,
    revoked boolean NOT NULL DEFAULT false,
    last_issued_ms bigint,
    not_before_ms bigint NOT NULL
);
CREATE SEQUENCE pgticket.lease_tokens;
CREATE TABLE pgticket.lease_registry (
    system_identifier bigint NOT NULL,
    timeline integer NOT NULL,
    database_oid oid NOT NULL,
    grants_from timestamptz NOT NULL
);
INSERT INTO pgticket.lease_registry (system_identifier, timeline, database_oid, grants_from)
SELECT s.system_identifier,
       ('x' OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::pg_catalog.bit(32)::integer,
       d.oid, pg_catalog.now()
  FROM pg_catalog.pg_control_system() s, pg_catalog.pg_database d
 WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database();
SELECT pg_catalog.pg_extension_config_dump('pgticket.machine_id_leases', '');
SELECT pg_catalog.pg_extension_config_dump('pgticket.lease_tokens', '');
SELECT pg_catalog.pg_extension_config_dump('pgticket.lease_registry', '');
REVOKE ALL ON pgticket.machine_id_leases, pgticket.lease_tokens, pgticket.lease_registry FROM PUBLIC;

-- pg_dump carries every mark, so a restore continues where the dump left off.
SELECT pg_catalog.pg_extension_config_dump('pgticket.scoped_counters', '');
SELECT pg_catalog.pg_extension_config_dump('pgticket.blocks', '');
SELECT pg_catalog.pg_extension_config_dump('pgticket.tickets', '');

REVOKE ALL ON pgticket.scoped_counters, pgticket.blocks, pgticket.tickets FROM PUBLIC;

CREATE VIEW pgticket.marks AS
    SELECT 'scoped_id'::text AS kind, queue, domain, NULL::text AS block_name, mark,
           max_mark - mark AS remaining, max_mark
      FROM pgticket.scoped_counters
    UNION ALL
    SELECT 'block'::text, NULL, NULL, name, mark, max_mark - mark, max_mark
      FROM pgticket.blocks
    UNION ALL
    SELECT 'ticket'::text, queue, domain, NULL, mark, 9223372036854775807 - mark, 9223372036854775807
      FROM pgticket.tickets;
COMMENT ON VIEW pgticket.marks IS
    'Every counter and block with its committed mark, its limit, and the values left before it';

GRANT USAGE ON SCHEMA pgticket TO PUBLIC;
GRANT SELECT ON pgticket.marks TO PUBLIC;

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

-- 0.4.0: a row loaded into a mark table whose scope is already here (a
-- pg_restore or COPY into a database that already allocated) raises the
-- mark to the higher of the two instead of failing the whole load on the
-- primary key and keeping every lower mark (SPEC s.17.3). pg_ticket's own
-- inserts pass untouched. ENABLE ALWAYS, so a replica-mode load meets it.
CREATE FUNCTION pgticket.merge_loaded_row() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'merge_loaded_row_wrapper';
COMMENT ON FUNCTION pgticket.merge_loaded_row() IS
    'Trigger: a loaded row of a scope already here raises its mark to the higher of the two (of a leased id: the later lease is kept)';
REVOKE ALL ON FUNCTION pgticket.merge_loaded_row() FROM PUBLIC;
CREATE TRIGGER keeps_higher BEFORE INSERT ON pgticket.scoped_counters
    FOR EACH ROW EXECUTE FUNCTION pgticket.merge_loaded_row();
CREATE TRIGGER keeps_higher BEFORE INSERT ON pgticket.blocks
    FOR EACH ROW EXECUTE FUNCTION pgticket.merge_loaded_row();
CREATE TRIGGER keeps_higher BEFORE INSERT ON pgticket.tickets
    FOR EACH ROW EXECUTE FUNCTION pgticket.merge_loaded_row();
ALTER TABLE pgticket.scoped_counters ENABLE ALWAYS TRIGGER keeps_higher;
ALTER TABLE pgticket.blocks ENABLE ALWAYS TRIGGER keeps_higher;
ALTER TABLE pgticket.tickets ENABLE ALWAYS TRIGGER keeps_higher;
-- The registry's leases: the later lease of an id (the higher token) is kept.
CREATE TRIGGER keeps_higher BEFORE INSERT ON pgticket.machine_id_leases
    FOR EACH ROW EXECUTE FUNCTION pgticket.merge_loaded_row();
ALTER TABLE pgticket.machine_id_leases ENABLE ALWAYS TRIGGER keeps_higher;
-- The registry's identity rows, a loaded row already there is skipped (the
-- longest ttl and margin kept).
CREATE TRIGGER keeps_present BEFORE INSERT ON pgticket.lease_registry
    FOR EACH ROW EXECUTE FUNCTION pgticket.merge_loaded_row();
ALTER TABLE pgticket.lease_registry ENABLE ALWAYS TRIGGER keeps_present;

-- 0.3.0: every state table has a primary key, so a FOR ALL TABLES
-- publication does not refuse the registry's own writes (SPEC s.13.10).
ALTER TABLE pgticket.lease_registry ADD PRIMARY KEY (system_identifier, timeline, database_oid, grants_from);

-- 0.3.0: a prepared transaction can hold a gap-free scope's row for ever
-- (it survives restarts; idle_in_transaction_session_timeout cannot reach
-- it): this view names it, so an administrator can COMMIT or ROLLBACK
-- PREPARED. Not granted to PUBLIC.
CREATE VIEW pgticket.prepared_holders AS
    SELECT p.gid, p.owner, p.prepared, 'scoped_id'::text AS kind, c.queue, c.domain, NULL::text AS block_name
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
ALTER TABLE pgticket.lease_registry ADD COLUMN started_at timestamptz,
    ADD COLUMN max_ttl_ms bigint NOT NULL DEFAULT 0, ADD COLUMN margin_ms bigint NOT NULL DEFAULT 0;
CREATE SEQUENCE pgticket.lease_registry_seen;
REVOKE ALL ON SEQUENCE pgticket.lease_registry_seen FROM PUBLIC;
-- A new registry's identity row names no start: it holds off from its first
-- call, since a registry of this name may have lived here before.

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
                                                    ELSE LEAST(coalesce(OLD.ended_at, OLD.expires_at), OLD.expires_at) END)
                            OPERATOR(pg_catalog.*) 1000::pg_catalog.numeric)::bigint
                           + coalesce(OLD.margin_ms, 0)))
    EXECUTE FUNCTION pgticket.refuse_rewind();
CREATE UNIQUE INDEX machine_id_leases_lease ON pgticket.machine_id_leases (lease);
CREATE TRIGGER never_emptied BEFORE DELETE ON pgticket.machine_id_leases
    FOR EACH ROW EXECUTE FUNCTION pgticket.refuse_rewind();
CREATE TRIGGER never_truncated BEFORE TRUNCATE ON pgticket.machine_id_leases
    FOR EACH STATEMENT EXECUTE FUNCTION pgticket.refuse_rewind();
ALTER TABLE pgticket.machine_id_leases ENABLE ALWAYS TRIGGER forward_only, ENABLE ALWAYS TRIGGER never_emptied,
    ENABLE ALWAYS TRIGGER never_truncated;

-- 0.4.0: a lease row of the server's own fixed machine id written from
-- outside the registry's calls (a data-only restore, a replication apply,
-- an INSERT by hand) reaches every session's cached check of its own id
-- (SPEC s.17.4): the trigger sends a relcache invalidation of the table for
-- such a row only. ENABLE ALWAYS, so a replica-mode load fires it too.
CREATE FUNCTION pgticket.machine_id_leases_changed() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'machine_id_leases_changed_wrapper';
REVOKE ALL ON FUNCTION pgticket.machine_id_leases_changed() FROM PUBLIC;
CREATE TRIGGER changed AFTER INSERT OR UPDATE ON pgticket.machine_id_leases
    FOR EACH ROW EXECUTE FUNCTION pgticket.machine_id_leases_changed();
ALTER TABLE pgticket.machine_id_leases ENABLE ALWAYS TRIGGER changed;

-- 0.3.0: how many scopes, ticket scopes and block names each role created
-- (pg_ticket.max_scopes_per_role caps it), in a few rows per role so that
-- its sessions seldom wait on one another. Not dumped: role ids differ
-- between clusters, and a restored database counts anew.
CREATE TABLE pgticket.scope_quota (
    role oid NOT NULL,
    shard integer NOT NULL,
    scopes bigint NOT NULL,
    PRIMARY KEY (role, shard)
);
REVOKE ALL ON pgticket.scope_quota FROM PUBLIC;

-- number_rows() creates the assign_scoped_id() / assign_ticket() trigger
-- with its arguments checked at once (the trigger checks them only at the
-- first row): a C function since 0.4.0 (src/triggers.rs), so a refusal
-- carries no PL/pgSQL context. SECURITY INVOKER: CREATE TRIGGER checks the
-- caller's rights on the table.
CREATE FUNCTION number_rows(
    relation regclass,
    id_column name,
    queue_column name,
    domain text DEFAULT NULL,
    domain_column name DEFAULT NULL,
    kind text DEFAULT 'scoped_id',
    on_explicit text DEFAULT 'refuse',
    trigger_name name DEFAULT NULL
) RETURNS name
VOLATILE LANGUAGE c AS 'MODULE_PATHNAME', 'number_rows';
COMMENT ON FUNCTION number_rows(regclass, name, name, text, name, text, text, name) IS
    'Creates a BEFORE INSERT OR UPDATE trigger numbering relation''s id_column per scope (kind scoped_id or ticket), its arguments checked now; on_explicit refuse or advance says what a value given for the column does; returns the trigger''s name';

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
