-- pg_ticket's state: one row per scoped counter and per block name, holding
-- the high-water mark (the last value handed out; a scope never used has no
-- row and reads as 0). Ordinary roles read the marks through the view and
-- change them only through the functions, which write as this schema's owner.

CREATE SCHEMA pgticket;
COMMENT ON SCHEMA pgticket IS 'pg_ticket state: counter and block high-water marks';

CREATE TABLE pgticket.scoped_counters (
    queue  text COLLATE "C" NOT NULL,
    domain text COLLATE "C" NOT NULL,
    mark   bigint NOT NULL CHECK (mark >= 0),
    PRIMARY KEY (queue, domain)
);

CREATE TABLE pgticket.blocks (
    name text COLLATE "C" NOT NULL PRIMARY KEY,
    mark bigint NOT NULL CHECK (mark >= 0)
);

-- pg_dump carries every mark, so a restore continues where the dump left off.
SELECT pg_catalog.pg_extension_config_dump('pgticket.scoped_counters', '');
SELECT pg_catalog.pg_extension_config_dump('pgticket.blocks', '');

REVOKE ALL ON pgticket.scoped_counters, pgticket.blocks FROM PUBLIC;

CREATE VIEW pgticket.marks AS
    SELECT 'scope'::text AS kind, queue, domain, NULL::text AS block_name, mark,
           9223372036854775807 - mark AS remaining
      FROM pgticket.scoped_counters
    UNION ALL
    SELECT 'block'::text, NULL, NULL, name, mark, 9223372036854775807 - mark
      FROM pgticket.blocks;
COMMENT ON VIEW pgticket.marks IS
    'Every counter and block with its committed mark and the values left before 2^63-1';

GRANT USAGE ON SCHEMA pgticket TO PUBLIC;
GRANT SELECT ON pgticket.marks TO PUBLIC;
