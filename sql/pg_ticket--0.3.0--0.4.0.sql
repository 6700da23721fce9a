-- pg_ticket 0.3.0 -> 0.4.0 (ALTER EXTENSION pg_ticket UPDATE). What changed is
-- listed in CHANGELOG.md; the library's changes take effect after its
-- install and a restart (install, restart, then update).
\echo Use "ALTER EXTENSION pg_ticket UPDATE" to load this file. \quit

-- 0.4.0: a lease row of the server's own fixed machine id written from
-- outside the registry's calls (a data-only restore, a replication apply,
-- an INSERT by hand) reaches every session's cached check of its own id
-- (SPEC §17.4): the trigger sends a relcache invalidation of the table for
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
-- primary key and keeping every lower mark (SPEC §17.3). pg_ticket's own
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

-- 0.4.0 (SPEC §17.1): a server that lost its snowflake mark (pg_upgrade
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
