-- pg_ticket 0.3.0 -> 0.4.0 (ALTER EXTENSION pg_ticket UPDATE). What changed is
-- listed in CHANGELOG.md; the library's changes take effect after its
-- install and a restart (install, restart, then update).
\echo Use "ALTER EXTENSION pg_ticket UPDATE" to load this file. \quit

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
CREATE TRIGGER keeps_present BEFORE INSERT ON pgticket.id_space
    FOR EACH ROW EXECUTE FUNCTION pgticket.merge_loaded_row();
ALTER TABLE pgticket.id_space ENABLE ALWAYS TRIGGER keeps_present;
CREATE TRIGGER keeps_present BEFORE INSERT ON pgticket.rights
    FOR EACH ROW EXECUTE FUNCTION pgticket.merge_loaded_row();
ALTER TABLE pgticket.rights ENABLE ALWAYS TRIGGER keeps_present;

-- 0.4.0 (SPEC s.17.1): a server that lost its snowflake mark (pg_upgrade
-- does not copy pg_ticket_snowflake.mark) refuses snowflakes and shards
-- until the file is carried over or an administrator vouches with:
CREATE FUNCTION pgticket."raise_snowflake_mark"(
	"after" timestamp with time zone
) RETURNS timestamp with time zone
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'raise_snowflake_mark_wrapper';
COMMENT ON FUNCTION pgticket.raise_snowflake_mark(timestamptz) IS
    'Admin: vouch for a lost snowflake mark (pg_upgrade, a restore without pg_ticket_snowflake.mark): this server makes snowflakes and sharded IDs only after the time given';
REVOKE EXECUTE ON FUNCTION pgticket.raise_snowflake_mark(timestamptz) FROM PUBLIC;

-- 0.4.0 (SPEC s.18.3): the everyday allocators stay in the schema the
-- extension was created in; administration, monitoring, the registry,
-- shard handover and rights move to pgticket, some renamed for one
-- vocabulary (CHANGELOG.md lists every rename). Their C symbols stay.
ALTER FUNCTION @extschema@.advance_scoped_id(text, text, bigint) SET SCHEMA pgticket;
ALTER FUNCTION @extschema@.advance_block_mark(text, bigint) RENAME TO advance_block;
ALTER FUNCTION @extschema@.advance_block(text, bigint) SET SCHEMA pgticket;
ALTER FUNCTION @extschema@.advance_ticket(text, text, bigint) SET SCHEMA pgticket;
ALTER FUNCTION @extschema@.set_scoped_limit(text, text, bigint) RENAME TO set_scoped_id_limit;
ALTER FUNCTION @extschema@.set_scoped_id_limit(text, text, bigint) SET SCHEMA pgticket;
ALTER FUNCTION @extschema@.set_block_limit(text, bigint) SET SCHEMA pgticket;
ALTER FUNCTION @extschema@.retire_scope(text, text) RENAME TO retire_scoped_id;
ALTER FUNCTION @extschema@.retire_scoped_id(text, text) SET SCHEMA pgticket;
ALTER FUNCTION @extschema@.retire_block(text) SET SCHEMA pgticket;
ALTER FUNCTION @extschema@.grant_scope(regrole, text, text) SET SCHEMA pgticket;
ALTER FUNCTION @extschema@.revoke_scope(regrole, text, text) SET SCHEMA pgticket;
ALTER FUNCTION @extschema@.grant_block(regrole, text) SET SCHEMA pgticket;
ALTER FUNCTION @extschema@.revoke_block(regrole, text) SET SCHEMA pgticket;
ALTER FUNCTION @extschema@.may_allocate(text, text, text) SET SCHEMA pgticket;
ALTER FUNCTION @extschema@.lease_machine_id(text, interval) SET SCHEMA pgticket;
ALTER FUNCTION @extschema@.renew_machine_id(integer, bigint, text, interval, bigint) SET SCHEMA pgticket;
ALTER FUNCTION @extschema@.release_machine_id(integer, bigint, text, bigint) SET SCHEMA pgticket;
ALTER FUNCTION @extschema@.revoke_machine_lease(integer) RENAME TO revoke_machine_id;
ALTER FUNCTION @extschema@.revoke_machine_id(integer) SET SCHEMA pgticket;
ALTER FUNCTION @extschema@.end_lease_hold_off() SET SCHEMA pgticket;
-- s.18.2: a new registry grants within a minute: pg_ticket.lease_max_ttl's
-- default is 45 s (it was 10 min), so a lease's default ttl is 30 s (it was
-- 60 s, over the new longest), as ticket-client's and a self-leasing
-- server's.
CREATE OR REPLACE FUNCTION pgticket.lease_machine_id(
	"holder" text,
	"ttl" interval DEFAULT '30 seconds'
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
CREATE OR REPLACE FUNCTION pgticket.renew_machine_id(
	"machine_id" INT,
	"lease" bigint,
	"secret" TEXT,
	"ttl" interval DEFAULT '30 seconds',
	"last_issued_ms" bigint DEFAULT NULL
) RETURNS timestamp with time zone
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'renew_machine_id_with_secret_wrapper';
ALTER FUNCTION @extschema@.sharded_release(integer) RENAME TO release_shard;
ALTER FUNCTION @extschema@.release_shard(integer) SET SCHEMA pgticket;
ALTER FUNCTION @extschema@.sharded_accept(integer, bigint) RENAME TO accept_shard;
ALTER FUNCTION @extschema@.accept_shard(integer, bigint) SET SCHEMA pgticket;
ALTER FUNCTION @extschema@.snowflake_id_space() SET SCHEMA pgticket;
ALTER FUNCTION @extschema@.ticket_status() RENAME TO status_rows;
ALTER FUNCTION @extschema@.status_rows() SET SCHEMA pgticket;
ALTER FUNCTION @extschema@.reset_ticket_status() RENAME TO reset_status;
ALTER FUNCTION @extschema@.reset_status() SET SCHEMA pgticket;
ALTER FUNCTION @extschema@.ticket_cache() RENAME TO ticket_cache_rows;
ALTER FUNCTION @extschema@.ticket_cache_rows() SET SCHEMA pgticket;
ALTER FUNCTION @extschema@.ticket_machine_id_source() RENAME TO machine_id_source;
ALTER FUNCTION @extschema@.machine_id_source() SET SCHEMA pgticket;
ALTER VIEW pgticket.machine_leases RENAME TO machine_ids;
CREATE OR REPLACE VIEW pgticket.ticket_cache AS SELECT * FROM pgticket.ticket_cache_rows();
COMMENT ON FUNCTION pgticket.revoke_scope(regrole, text, text) IS
    'Removes the grant pgticket.grant_scope(role, queue, domain) made; true if there was one';
COMMENT ON FUNCTION pgticket.revoke_block(regrole, text) IS
    'Removes the grant pgticket.grant_block(role, name) made; true if there was one';
COMMENT ON TABLE pgticket.rights IS
    'Which roles may allocate from which scopes and block names while pg_ticket.scope_rights is on (pgticket.grant_scope, pgticket.grant_block)';
-- The allocator kinds are scoped_id, ticket and block everywhere.
CREATE OR REPLACE VIEW pgticket.marks WITH (security_barrier) AS
    SELECT m.kind, m.queue, m.domain, m.block_name, m.mark, m.remaining, m.max_mark
      FROM (SELECT 'scoped_id'::text AS kind, queue, domain, NULL::text AS block_name, mark,
                   max_mark - mark AS remaining, max_mark
              FROM pgticket.scoped_counters
            UNION ALL
            SELECT 'block'::text, NULL, NULL, name, mark, max_mark - mark, max_mark
              FROM pgticket.blocks
            UNION ALL
            SELECT 'ticket'::text, queue, domain, NULL, mark, 9223372036854775807 - mark, 9223372036854775807
              FROM pgticket.tickets) m
     WHERE pgticket.may_allocate(m.kind, coalesce(m.queue, m.block_name), m.domain);
CREATE OR REPLACE VIEW pgticket.prepared_holders AS
    SELECT p.gid, p.owner, p.prepared, 'scoped_id'::text AS kind, c.queue, c.domain, NULL::text AS block_name
      FROM pg_catalog.pg_prepared_xacts p
      JOIN pgticket.scoped_counters c ON c.xmax OPERATOR(pg_catalog.=) p.transaction
     WHERE p.database OPERATOR(pg_catalog.=) pg_catalog.current_database()
    UNION ALL
    SELECT p.gid, p.owner, p.prepared, 'block'::text, NULL, NULL, b.name
      FROM pg_catalog.pg_prepared_xacts p
      JOIN pgticket.blocks b ON b.xmax OPERATOR(pg_catalog.=) p.transaction
     WHERE p.database OPERATOR(pg_catalog.=) pg_catalog.current_database();

COMMENT ON FUNCTION @extschema@.next_scoped_id(text, text) IS
    'The next number of the gap-free series (queue, domain), created at 1 on first use; transactional: a rolled-back number is given back';
COMMENT ON FUNCTION @extschema@.current_scoped_id(text, text) IS
    'The last number of the series (queue, domain) as this transaction sees it (0 if never used); takes nothing';
COMMENT ON FUNCTION @extschema@.reserve_block(text, bigint) IS
    'Reserves size consecutive IDs of block name for the caller to hand out; committed at once if called outside a transaction block';
COMMENT ON FUNCTION @extschema@.current_block_mark(text) IS
    'The last ID reserved from block name (0 if never used); takes nothing';
COMMENT ON FUNCTION @extschema@.next_ticket(text, text) IS
    'The next ticket of (queue, domain): unique and increasing on this server, never reused, not transactional (Flickr/Leaf tickets from shared memory)';
COMMENT ON FUNCTION @extschema@.snowflake_id() IS
    'A 64-bit time-ordered ID: milliseconds since pg_ticket.epoch, this server''s machine id, a sequence (needs preloading)';
COMMENT ON FUNCTION @extschema@.snowflake_decode(bigint) IS
    'The parts of a snowflake ID in this server''s ID space: creation time, machine id, sequence';
COMMENT ON FUNCTION @extschema@.snowflake_min_id(timestamptz) IS
    'The lowest snowflake ID any machine can have in the millisecond of at (for id >= ... range scans)';
COMMENT ON FUNCTION @extschema@.snowflake_max_id(timestamptz) IS
    'The highest snowflake ID any machine can have in the millisecond of at (for id <= ... range scans)';
COMMENT ON FUNCTION @extschema@.sharded_id(integer) IS
    'The next ID of a logical shard this server owns (pg_ticket.shards, accepted here): ms << 22 | shard << 10 | sequence';
COMMENT ON FUNCTION @extschema@.sharded_decode(bigint) IS
    'The parts of a sharded ID: creation time, shard, sequence';
COMMENT ON FUNCTION @extschema@.sharded_min_id(timestamptz) IS
    'The lowest sharded ID any shard can have in the millisecond of at';
COMMENT ON FUNCTION @extschema@.sharded_max_id(timestamptz) IS
    'The highest sharded ID any shard can have in the millisecond of at';
COMMENT ON FUNCTION @extschema@.shard_of(text, integer) IS
    'The shard of key among shard_count: FNV-1a (64 bits) of its bytes modulo the count, stable (ticket_client::shard_of computes the same)';
COMMENT ON FUNCTION @extschema@.assign_scoped_id() IS
    'Trigger (BEFORE INSERT OR UPDATE, FOR EACH ROW): numbers a column per scope taken from the row, gap-free (see number_rows)';
COMMENT ON FUNCTION @extschema@.assign_ticket() IS
    'Trigger (BEFORE INSERT OR UPDATE, FOR EACH ROW): fills a column with the next ticket of a scope taken from the row (see number_rows)';
COMMENT ON FUNCTION pgticket.advance_scoped_id(text, text, bigint) IS
    'Admin: moves the mark of the series (queue, domain) forward to mark (never back); the next number is mark + 1';
COMMENT ON FUNCTION pgticket.advance_block(text, bigint) IS
    'Admin: moves the mark of block name forward to mark (never back); the next block starts above it';
COMMENT ON FUNCTION pgticket.advance_ticket(text, text, bigint) IS
    'Admin: every ticket of (queue, domain) from now on is above mark (the cached ones are dropped)';
COMMENT ON FUNCTION pgticket.set_scoped_id_limit(text, text, bigint) IS
    'Admin: the series (queue, domain) hands out nothing above max (2200H past it; for integer columns); never below its mark';
COMMENT ON FUNCTION pgticket.set_block_limit(text, bigint) IS
    'Admin: block name reserves nothing above max; never below its mark';
COMMENT ON FUNCTION pgticket.retire_scoped_id(text, text) IS
    'Admin: closes the series (queue, domain) for good, keeping its mark (later takes are 2200H; the name never counts from 1 again)';
COMMENT ON FUNCTION pgticket.retire_block(text) IS
    'Admin: closes block name for good, keeping its mark';
COMMENT ON FUNCTION pgticket.may_allocate(text, text, text) IS
    'May the current user allocate from (kind scoped_id or ticket: queue, domain) or block name (kind block: queue is the name)? true for everyone while pg_ticket.scope_rights is off';
COMMENT ON FUNCTION pgticket.lease_machine_id(text, interval) IS
    'Registry: leases a free machine id to holder for ttl; returns it with its fencing token, secret, not_before_ms, expiry and ID space';
COMMENT ON FUNCTION pgticket.renew_machine_id(integer, bigint, text, interval, bigint) IS
    'Registry: extends the lease (machine id, token, secret) by ttl from now, recording the holder''s last stamp; refused once it ended';
COMMENT ON FUNCTION pgticket.release_machine_id(integer, bigint, text, bigint) IS
    'Registry: ends the lease now, recording the holder''s last stamp; the id is free again after pg_ticket.lease_margin';
COMMENT ON FUNCTION pgticket.revoke_machine_id(integer) IS
    'Registry admin: ends the current lease of a machine id (its holder learns at its next renewal; the id frees after the lease''s expiry plus the margin)';
COMMENT ON FUNCTION pgticket.end_lease_hold_off() IS
    'Registry admin: a registry holding off after a start, a restore or its creation grants at once; the caller vouches that no lease of its earlier life is live';
COMMENT ON FUNCTION pgticket.release_shard(integer) IS
    'Admin, on a shard''s old owner (after removing it from pg_ticket.shards): closes the shard here and returns the handover point for pgticket.accept_shard on its new owner';
COMMENT ON FUNCTION pgticket.accept_shard(integer, bigint) IS
    'Admin, on a shard''s new owner (after adding it to pg_ticket.shards): issues the shard here only above handover_id (0 for a shard no server issued); returns its first ID here';
COMMENT ON FUNCTION pgticket.snowflake_id_space() IS
    'This server''s snowflake ID space: the epoch (Unix ms) and pg_ticket.machine_bits';
COMMENT ON FUNCTION pgticket.status_rows() IS
    'The row of the pgticket.status view';
COMMENT ON FUNCTION pgticket.reset_status() IS
    'Admin: sets the refusal and wait counters of pgticket.status to 0';
COMMENT ON FUNCTION pgticket.ticket_cache_rows() IS
    'The rows of the pgticket.ticket_cache view';
COMMENT ON FUNCTION pgticket.machine_id_source() IS
    'Where this server''s machine id comes from: configured, leased, or default (pg_ticket.machine_id left unset)';
COMMENT ON FUNCTION pgticket.change_right(boolean, regrole, text, text, text) IS
    'The grants'' and revokes'' common body (pgticket.grant_scope and the others)';
COMMENT ON FUNCTION pgticket.id_space_changed() IS
    'Trigger: a change of pgticket.id_space reaches every session';
COMMENT ON FUNCTION pgticket.rights_changed() IS
    'Trigger: a change of pgticket.rights reaches every session';
COMMENT ON FUNCTION pgticket.machine_id_leases_changed() IS
    'Trigger: a lease row of this server''s own machine id written from outside reaches every session';
COMMENT ON TABLE pgticket.scoped_counters IS
    'The mark (last number handed out) and limit of every gap-free series (queue, domain) ever used';
COMMENT ON TABLE pgticket.blocks IS
    'The mark (last ID reserved) and limit of every block name ever used';
COMMENT ON TABLE pgticket.tickets IS
    'The mark (last value of the last segment reserved) and series of every ticket scope';
COMMENT ON TABLE pgticket.machine_id_leases IS
    'The registry: each machine id''s latest lease (an id never leased has no row)';
COMMENT ON TABLE pgticket.lease_registry IS
    'The registry''s identity: which server, timeline and database it serves as since when (another one holds it off)';
COMMENT ON TABLE pgticket.scope_quota IS
    'How many scopes and block names each role created in this database (pg_ticket.max_scopes_per_role)';
COMMENT ON SEQUENCE pgticket.lease_tokens IS
    'The registry''s fencing tokens';
COMMENT ON SEQUENCE pgticket.lease_registry_seen IS
    'When the registry first saw its state not its own (a restore, a copy): the start of its hold-off';

-- 0.4.0 (SPEC s.18.4): number_rows() in C (no PL/pgSQL context on its
-- refusals), with kind (was allocator), on_explicit and trigger_name.
DROP FUNCTION @extschema@.number_rows(regclass, name, name, text, name, text);
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
-- SPEC s.18.4: a trigger numbering a column must also see an UPDATE that
-- sets the number (0.4.0's triggers refuse to run otherwise). 0.3.0's
-- number_rows() made BEFORE INSERT triggers: each row trigger of
-- assign_scoped_id() or assign_ticket() that fires BEFORE INSERT only, with
-- no WHEN condition, is made again, same name and arguments (so its scopes
-- keep their text and series), BEFORE INSERT OR UPDATE. A partition's clone
-- goes with its parent's.
DO $upgrade$
DECLARE
    t record;
BEGIN
    FOR t IN
        SELECT tg.tgname, tg.tgrelid::pg_catalog.regclass AS rel, pg_catalog.pg_get_triggerdef(tg.oid) AS def
          FROM pg_catalog.pg_trigger tg
          JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) tg.tgfoid
         WHERE p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['assign_scoped_id', 'assign_ticket']::pg_catalog.name[])
           AND p.pronamespace OPERATOR(pg_catalog.=) '@extschema@'::pg_catalog.regnamespace
           AND NOT tg.tgisinternal
           AND tg.tgparentid OPERATOR(pg_catalog.=) 0
           AND tg.tgtype OPERATOR(pg_catalog.=) 7   -- ROW | BEFORE | INSERT
           AND tg.tgqual IS NULL
    LOOP
        EXECUTE pg_catalog.format('DROP TRIGGER %I ON %s', t.tgname, t.rel);
        EXECUTE pg_catalog.replace(t.def, ' BEFORE INSERT ON ', ' BEFORE INSERT OR UPDATE ON ');
    END LOOP;
END
$upgrade$;
