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
