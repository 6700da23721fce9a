-- pg_ticket 0.1.0 -> 0.2.0: ALTER EXTENSION pg_ticket UPDATE TO '0.2.0'.
--
-- Every SQL object added or changed since 0.1.0 goes here, in the same
-- commit as the change, so that an upgraded database ends up with exactly
-- the objects a fresh CREATE EXTENSION of 0.2.0 makes (the upgrade test in
-- tests/integration/tests/upgrade.rs compares the catalogs).
--
-- So far 0.2.0 changes behaviour inside the library only (the hardening of
-- 0.1.0: durable commits, savepoint state, names in any encoding, settings
-- validated at start and at ALTER SYSTEM); its SQL objects are those of
-- 0.1.0. The settings pg_ticket.durable_commit and
-- pg_ticket.max_transaction_entries come with the library, not this script.

\echo Use "ALTER EXTENSION pg_ticket UPDATE TO '0.2.0'" to load this file. \quit
