-- pg_ticket 0.1.0 -> 0.2.0: ALTER EXTENSION pg_ticket UPDATE TO '0.2.0'.
--
-- Every SQL object added or changed since 0.1.0 goes here, in the same
-- commit as the change, so that an upgraded database ends up with exactly
-- the objects a fresh CREATE EXTENSION of 0.2.0 makes (the upgrade test in
-- tests/integration/tests/upgrade.rs compares the catalogs).
--
-- The hardening of 0.1.0 (durable commits, savepoint state, names in any
-- encoding, settings validated at start and at ALTER SYSTEM) is inside the
-- library; the settings pg_ticket.durable_commit and
-- pg_ticket.max_transaction_entries come with it, not with this script.

\echo Use "ALTER EXTENSION pg_ticket UPDATE TO '0.2.0'" to load this file. \quit

-- Limits for 32-bit series (set_scoped_limit, set_block_limit).
ALTER TABLE pgticket.scoped_counters
    ADD COLUMN max_mark bigint NOT NULL DEFAULT 9223372036854775807,
    ADD CONSTRAINT scoped_counters_mark_within_limit CHECK (mark <= max_mark);
ALTER TABLE pgticket.blocks
    ADD COLUMN max_mark bigint NOT NULL DEFAULT 9223372036854775807,
    ADD CONSTRAINT blocks_mark_within_limit CHECK (mark <= max_mark);

-- Tickets (next_ticket, advance_ticket, the ticket_cache view).
CREATE TABLE pgticket.tickets (
    queue  text COLLATE "C" NOT NULL,
    domain text COLLATE "C" NOT NULL,
    mark   bigint NOT NULL CHECK (mark >= 0),
    ticket_offset integer NOT NULL,
    ticket_increment integer NOT NULL,
    PRIMARY KEY (queue, domain),
    CONSTRAINT tickets_series CHECK (ticket_increment >= 1 AND ticket_offset BETWEEN 1 AND ticket_increment)
);
SELECT pg_catalog.pg_extension_config_dump('pgticket.tickets', '');
REVOKE ALL ON pgticket.tickets FROM PUBLIC;

CREATE OR REPLACE VIEW pgticket.marks AS
    SELECT 'scope'::text AS kind, queue, domain, NULL::text AS block_name, mark,
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

-- snowflake_decode reads the epoch, a server setting: STABLE, not IMMUTABLE.
ALTER FUNCTION snowflake_decode(bigint) STABLE;

-- Limits, admin only.
CREATE FUNCTION "set_scoped_limit"(
	"queue" text,
	"domain" text,
	"max" bigint
) RETURNS bigint
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'set_scoped_limit_wrapper';
CREATE FUNCTION "set_block_limit"(
	"name" text,
	"max" bigint
) RETURNS bigint
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'set_block_limit_wrapper';
REVOKE EXECUTE ON FUNCTION set_scoped_limit(text, text, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION set_block_limit(text, bigint) FROM PUBLIC;

-- Time ranges on snowflake keys.
CREATE FUNCTION "snowflake_min_id"(
	"at" timestamp with time zone
) RETURNS bigint
STABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'snowflake_min_id_wrapper';
CREATE FUNCTION "snowflake_max_id"(
	"at" timestamp with time zone
) RETURNS bigint
STABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'snowflake_max_id_wrapper';

-- Per-row scopes.
CREATE FUNCTION "assign_scoped_id"()
	RETURNS TRIGGER
	LANGUAGE c
	AS 'MODULE_PATHNAME', 'assign_scoped_id_wrapper';

-- Monitoring.
CREATE FUNCTION "ticket_status"() RETURNS TABLE (
	"preloaded" bool,
	"epoch" timestamp with time zone,
	"machine_id" INT,
	"last_snowflake_at" timestamp with time zone,
	"reserved_until" timestamp with time zone,
	"years_left" double precision,
	"refusals_clock_behind" bigint,
	"refusals_overflow" bigint,
	"refusals_read_only" bigint,
	"waits_full_millisecond" bigint,
	"waits_clock_back" bigint,
	"waits_ticket_refill" bigint,
	"reset_at" timestamp with time zone,
	"machine_lease" bigint,
	"machine_lease_expires_at" timestamp with time zone
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'ticket_status_wrapper';
CREATE FUNCTION "reset_ticket_status"() RETURNS void
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'reset_ticket_status_wrapper';
CREATE VIEW pgticket.status AS SELECT * FROM ticket_status();
COMMENT ON VIEW pgticket.status IS
    'pg_ticket on this server: snowflake identity and clock, refusals and waits since start';
GRANT SELECT ON pgticket.status TO PUBLIC;
REVOKE EXECUTE ON FUNCTION reset_ticket_status() FROM PUBLIC;

-- Tickets: next_ticket, advance_ticket (admin), the cache view.
CREATE FUNCTION "next_ticket"(
	"queue" text,
	"domain" text
) RETURNS bigint
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'next_ticket_wrapper';
CREATE FUNCTION "advance_ticket"(
	"queue" text,
	"domain" text,
	"mark" bigint
) RETURNS bigint
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'advance_ticket_wrapper';
CREATE FUNCTION "ticket_cache"() RETURNS TABLE (
	"queue" TEXT,
	"domain" TEXT,
	"next_value" bigint,
	"cached_until" bigint,
	"segment_size" bigint,
	"refills" bigint,
	"waits" bigint
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'ticket_cache_wrapper';
CREATE VIEW pgticket.ticket_cache AS SELECT * FROM ticket_cache();
COMMENT ON VIEW pgticket.ticket_cache IS
    'Ticket scopes of this database cached in shared memory: next value, end of the cached range, segment size, refills, waits';
GRANT SELECT ON pgticket.ticket_cache TO PUBLIC;
REVOKE EXECUTE ON FUNCTION advance_ticket(text, text, bigint) FROM PUBLIC;

-- Per-row tickets.
CREATE FUNCTION "assign_ticket"()
	RETURNS TRIGGER
	LANGUAGE c
	AS 'MODULE_PATHNAME', 'assign_ticket_wrapper';

-- Machine-id leases: the registry's tables, its functions (not PUBLIC) and view.
CREATE TABLE pgticket.machine_id_leases (
    machine_id integer PRIMARY KEY CHECK (machine_id BETWEEN 0 AND 1023),
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

CREATE FUNCTION "lease_machine_id"(
	"holder" text,
	"ttl" interval DEFAULT '60 seconds'
) RETURNS TABLE (
	"machine_id" INT,
	"lease" bigint,
	"not_before_ms" bigint,
	"expires_at" timestamp with time zone,
	"epoch_ms" bigint
)
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'lease_machine_id_wrapper';

CREATE FUNCTION "renew_machine_id"(
	"machine_id" INT,
	"lease" bigint,
	"ttl" interval DEFAULT '60 seconds',
	"last_issued_ms" bigint DEFAULT NULL
) RETURNS timestamp with time zone
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'renew_machine_id_wrapper';

CREATE FUNCTION "release_machine_id"(
	"machine_id" INT,
	"lease" bigint,
	"last_issued_ms" bigint DEFAULT NULL
) RETURNS void
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'release_machine_id_wrapper';

CREATE FUNCTION "revoke_machine_lease"(
	"machine_id" INT
) RETURNS bool
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'revoke_machine_lease_wrapper';

CREATE VIEW pgticket.machine_leases AS
    SELECT machine_id, holder, lease, leased_at, expires_at, last_issued_ms,
           CASE WHEN revoked THEN 'revoked'
                WHEN ended_at IS NOT NULL THEN 'released'
                WHEN expires_at > pg_catalog.clock_timestamp() THEN 'held'
                ELSE 'expired' END AS state
      FROM pgticket.machine_id_leases;
COMMENT ON VIEW pgticket.machine_leases IS
    'Each machine id''s latest lease: holder, fencing token, times, last reported stamp, state';
REVOKE ALL ON pgticket.machine_leases FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION lease_machine_id(text, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION renew_machine_id(integer, bigint, interval, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION release_machine_id(integer, bigint, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION revoke_machine_lease(integer) FROM PUBLIC;
