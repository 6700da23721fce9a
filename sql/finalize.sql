-- Last in the install script, after every object: the privileges of the
-- admin functions, and (0.4.0, SPEC s.18.3) a comment on every function,
-- table and view of pg_ticket, so \dx+ and \df+ read well. The everyday allocators live in
-- the schema the extension is created in; administration, monitoring, the
-- registry, shard handover and rights live in pgticket. The same text is
-- in sql/pg_ticket--0.3.0--0.4.0.sql (an upgraded catalog equals a fresh
-- one: tests/integration/tests/upgrade.rs).
REVOKE EXECUTE ON FUNCTION pgticket.advance_scoped_id(text, text, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgticket.advance_block(text, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgticket.set_scoped_id_limit(text, text, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgticket.set_block_limit(text, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgticket.retire_scoped_id(text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgticket.retire_block(text) FROM PUBLIC;

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
COMMENT ON FUNCTION pgticket.marks_rows() IS
    'The rows of the view pgticket.marks: the marks of the scopes, block names and ticket scopes the current user may use';
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
