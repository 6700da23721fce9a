-- Machine-id leases (SPEC §8): the registry's calls, their refusals and
-- privileges. Timing (expiry, the margin, restore hold-off, concurrency)
-- is tested in tests/integration/tests/leases.rs. A registry of its own.
CREATE DATABASE regress_leases;
\c regress_leases
CREATE EXTENSION pg_ticket;
\set VERBOSITY default

-- A registry created holds off like a restarted one (one may have lived in
-- this database before it: DROP EXTENSION forgets its leases); an
-- administrator vouches for a registry new to its fleet.
\set VERBOSITY sqlstate
SELECT * FROM pgticket.lease_machine_id('too-early');
\set VERBOSITY default
SELECT pgticket.end_lease_hold_off() AS ended;
SELECT pgticket.end_lease_hold_off() AS ended_again;

-- Errors as a caller sees them, with the caller's own token (Unix
-- microseconds since the registry settled) written T.
CREATE FUNCTION pg_temp.attempt(statement text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE statement;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, '[0-9]{7,}', 'T', 'g');
END $$;

-- A small pool: ids 0-3, of which 0 is this server's own snowflake id.
ALTER SYSTEM SET pg_ticket.lease_ids = '0-3';
SELECT pg_reload_conf();
SELECT pg_sleep(0.5);
SHOW pg_ticket.lease_ids;
SHOW pg_ticket.machine_id;

-- A lease taken in a rolled-back transaction grants nothing.
BEGIN;
SELECT machine_id FROM pgticket.lease_machine_id('rolled-back');
SELECT machine_id, holder, state FROM pgticket.machine_ids;
ROLLBACK;
SELECT count(*) AS leases FROM pgticket.machine_ids;

CREATE TEMP TABLE granted AS SELECT * FROM pgticket.lease_machine_id('worker-a');
INSERT INTO granted SELECT * FROM pgticket.lease_machine_id('worker-b', '40 seconds');
INSERT INTO granted SELECT * FROM pgticket.lease_machine_id('worker-c', '1 second');
-- Never the own id 0; never leased ids first; fencing tokens increase;
-- the epoch is this server's; expiry is the ttl from now; not_before_ms is
-- where the hold-off ended (by pgticket.end_lease_hold_off() above: already past).
SELECT machine_id, lease > lag(lease) OVER (ORDER BY lease) AS token_increases,
       not_before_ms BETWEEN (extract(epoch FROM now() - interval '1 hour') * 1000)::bigint
                         AND (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS not_before_passed,
       epoch_ms = extract(epoch FROM timestamptz '2026-01-01 00:00:00+00') * 1000 AS epoch_is_the_servers,
       expires_at > now() AS expires_later
  FROM granted ORDER BY lease;
-- Every id held: 53400 (the message says how many and when one frees).
\set VERBOSITY sqlstate
SELECT * FROM pgticket.lease_machine_id('worker-d');
\set VERBOSITY default
SELECT machine_id, holder, state FROM pgticket.machine_ids ORDER BY machine_id;
-- Leases are never emptied or rewound (55000): a row gone would let its id
-- be granted while its holder stamps.
\set VERBOSITY sqlstate
TRUNCATE pgticket.machine_id_leases;
DELETE FROM pgticket.machine_id_leases WHERE machine_id = 1;
UPDATE pgticket.machine_id_leases SET lease = 0 WHERE machine_id = 1;
UPDATE pgticket.machine_id_leases SET expires_at = expires_at - interval '1 hour' WHERE machine_id = 1;
UPDATE pgticket.machine_id_leases SET last_issued_ms = 0, revoked = false WHERE machine_id = 1;
\set VERBOSITY default

-- Each lease has its own secret: 32 hexadecimal digits, kept only hashed.
SELECT count(DISTINCT secret) AS secrets, bool_and(secret ~ '^[0-9a-f]{32}$') AS hex FROM granted;
SELECT count(*) AS stored_anywhere FROM pgticket.machine_id_leases l, granted g
 WHERE l.secret_hash = decode(g.secret, 'hex') OR l.holder = g.secret;
-- Renew: only the current live lease, by its token and secret.
SELECT pgticket.renew_machine_id(g.machine_id, g.lease, g.secret, '40 seconds', 1234) > now() + interval '35 seconds' AS renewed
  FROM granted g WHERE machine_id = 1;
-- A wrong token and a wrong secret get the same answer, naming no token.
SELECT pg_temp.attempt('SELECT pgticket.renew_machine_id(g.machine_id, g.lease + 100, g.secret) FROM granted g WHERE machine_id = 1');
SELECT pg_temp.attempt('SELECT pgticket.renew_machine_id(g.machine_id, g.lease, o.secret) FROM granted g, granted o WHERE g.machine_id = 1 AND o.machine_id = 2');
SELECT pg_temp.attempt('SELECT pgticket.release_machine_id(g.machine_id, g.lease, o.secret) FROM granted g, granted o WHERE g.machine_id = 1 AND o.machine_id = 2');
SELECT pgticket.renew_machine_id(g.machine_id, g.lease, 'not hex') FROM granted g WHERE machine_id = 1;
\echo :LAST_ERROR_SQLSTATE
-- A shorter ttl never moves the expiry earlier.
SELECT pgticket.renew_machine_id(g.machine_id, g.lease, g.secret, '1 second') = l.expires_at AS kept
  FROM granted g JOIN pgticket.machine_ids l USING (machine_id) WHERE machine_id = 1;
-- A stamp reported past the lease's end plus the margin is refused.
\set VERBOSITY sqlstate
SELECT pgticket.renew_machine_id(g.machine_id, g.lease, g.secret, '40 seconds', 9223372036854775807) FROM granted g WHERE machine_id = 1;
\echo :LAST_ERROR_SQLSTATE
SELECT pgticket.release_machine_id(g.machine_id, g.lease, g.secret, 9223372036854775807) FROM granted g WHERE machine_id = 1;
\echo :LAST_ERROR_SQLSTATE
\set VERBOSITY default
-- Release records the last stamp; the lease cannot be renewed after.
SELECT pgticket.release_machine_id(g.machine_id, g.lease, g.secret, 1500) FROM granted g WHERE machine_id = 1;
SELECT pgticket.release_machine_id(g.machine_id, g.lease, g.secret) FROM granted g WHERE machine_id = 1;
SELECT machine_id, last_issued_ms, state FROM pgticket.machine_ids WHERE machine_id = 1;
SELECT pg_temp.attempt('SELECT pgticket.renew_machine_id(g.machine_id, g.lease, g.secret) FROM granted g WHERE machine_id = 1');
-- Within the margin (10 s by default) the released id is not leased again.
\set VERBOSITY sqlstate
SELECT * FROM pgticket.lease_machine_id('worker-d');
\set VERBOSITY default
-- Revoke (admin) ends a live lease; its holder learns at its next renewal.
SELECT pgticket.revoke_machine_id(2) AS revoked, pgticket.revoke_machine_id(2) AS again, pgticket.revoke_machine_id(0) AS never_leased;
SELECT pg_temp.attempt('SELECT pgticket.renew_machine_id(g.machine_id, g.lease, g.secret) FROM granted g WHERE machine_id = 2');
SELECT pgticket.renew_machine_id(0, 1, '00000000000000000000000000000000');
\echo :LAST_ERROR_SQLSTATE

-- Bad input: 22004, 22023; nothing changes.
SELECT * FROM pgticket.lease_machine_id(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM pgticket.lease_machine_id('');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM pgticket.lease_machine_id('x', '500 milliseconds');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM pgticket.lease_machine_id('x', '2 days');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM pgticket.lease_machine_id('x', '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM pgticket.lease_machine_id('x', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT pgticket.renew_machine_id(65536, 1, '00000000000000000000000000000000');
\echo :LAST_ERROR_SQLSTATE
SELECT pgticket.renew_machine_id(1, NULL, '00000000000000000000000000000000');
\echo :LAST_ERROR_SQLSTATE
SELECT pgticket.renew_machine_id(1, 1, NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT pgticket.release_machine_id(NULL, 1, '00000000000000000000000000000000');
\echo :LAST_ERROR_SQLSTATE
BEGIN READ ONLY;
SELECT * FROM pgticket.lease_machine_id('x');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
ALTER SYSTEM SET pg_ticket.lease_ids = '5-2';
\echo :LAST_ERROR_SQLSTATE
-- (The range's wording differs between PostgreSQL versions.)
\set VERBOSITY sqlstate
ALTER SYSTEM SET pg_ticket.lease_margin = '500ms';
\set VERBOSITY default

-- Not PUBLIC: the registry's functions and view need a GRANT.
CREATE ROLE lease_app;
SET ROLE lease_app;
SELECT * FROM pgticket.lease_machine_id('app');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM pgticket.machine_ids;
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM pgticket.machine_id_leases;
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
GRANT EXECUTE ON FUNCTION pgticket.lease_machine_id(text, interval), pgticket.renew_machine_id(integer, bigint, text, interval, bigint),
      pgticket.release_machine_id(integer, bigint, text, bigint) TO lease_app;
GRANT SELECT ON pgticket.machine_ids TO lease_app;
SET ROLE lease_app;
SELECT pgticket.renew_machine_id(3, 1, '00000000000000000000000000000000');
\echo :LAST_ERROR_SQLSTATE
-- The view names holders and states, but tokens only to the registry's owner.
SELECT machine_id, lease, state FROM pgticket.machine_ids ORDER BY machine_id;
SELECT pgticket.revoke_machine_id(1);
\echo :LAST_ERROR_SQLSTATE
SELECT pgticket.end_lease_hold_off();
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
REVOKE ALL ON FUNCTION pgticket.lease_machine_id(text, interval), pgticket.renew_machine_id(integer, bigint, text, interval, bigint),
      pgticket.release_machine_id(integer, bigint, text, bigint) FROM lease_app;
REVOKE ALL ON pgticket.machine_ids FROM lease_app;
DROP ROLE lease_app;

ALTER SYSTEM RESET pg_ticket.lease_ids;
SELECT pg_reload_conf();
\c regression
DROP DATABASE regress_leases;
