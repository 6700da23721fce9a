//! The registry's table access: the only code that touches
//! `pgticket.machine_id_leases`, `pgticket.lease_registry` and the
//! `pgticket.lease_tokens` sequence.
//!
//! Every rule (which id, when it frees, who may renew) is decided in
//! `ticket_core::leases`; this file reads rows, locks them, and writes the
//! decision. Statements run through SPI as the tables' owner, names and
//! operators qualified. Lease calls are rare (a holder renews every third
//! of its ttl), so statements are planned per call.
//!
//! Concurrency: a grant reads every lease row without locking, then tries
//! the free ids in order, locking each with `FOR UPDATE SKIP LOCKED` (an
//! id another grant is taking is skipped, not waited for) and checking it
//! again under the lock; an id never leased is taken by an `INSERT ... ON
//! CONFLICT DO NOTHING`, which lets exactly one of two concurrent grants
//! have it. Renewals, releases and revocations lock their one row.
//!
//! Identity (SPEC §8 rule 7): `pgticket.lease_registry` says which server,
//! timeline, database and postmaster start the registry has served as.
//! Any start may be a copy (a base backup or snapshot started on the same
//! timeline, a restored VM), so nothing proves a started registry follows
//! its own latest state: after every start of its server, a promotion, a
//! restore from a dump or a copy of its database, its row is not its own,
//! and it grants nothing until the longest ttl it ever allowed plus the
//! margin has passed since it started serving. It renews the leases it
//! knows meanwhile: only their holders have their secrets, and none of
//! their ids was granted to anyone else before they ended.
//!
//! When it started serving: the first call that saw its row not its own,
//! kept in the sequence `pgticket.lease_registry_seen`, which is not
//! transactional (the refusal that sees it rolls back) and not dumped; a
//! sighting from before the server's start, the timeline's start or the
//! last settle is not this state's. The first grant after the hold-off,
//! under a table lock, makes the row its own again.

use pgrx::datum::{DatumWithOid, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::spi::{SpiClient, SpiError, SpiTupleTable};
use std::collections::HashMap;

use crate::backend_local::BackendLocal;
use crate::errors::TicketError;
use crate::names::Name;
use crate::clock::{now_unix_ms, postmaster_start_ms, timeline_start_ms, timestamptz_or_error, unix_ms_of_timestamptz};
use crate::{settings, xact};
use ticket_core::leases::{self, CurrentLease, Grant, LastLease, LeaseError, SecretCheck};

/// This registry as a server, timeline, database and start.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Identity {
    system_identifier: i64,
    timeline: i32,
    database: pg_sys::Oid,
    started_ms: i64,
}

fn identity() -> Identity {
    unsafe {
        Identity {
            // pg_control_system() shows the same bits as bigint.
            system_identifier: pg_sys::GetSystemIdentifier() as i64,
            timeline: pg_sys::GetWALInsertionTimeLine() as i32,
            database: pg_sys::MyDatabaseId,
            started_ms: postmaster_start_ms(),
        }
    }
}

/// From when the registry grants, and whether its identity row is its own.
struct Serving {
    grants_from_ms: i64,
    /// The identity row is this registry's alone: nothing to settle.
    settled: bool,
    /// The longest ttl and margin it ever allowed (its settings now, and
    /// what its rows recorded — a dump carries them).
    max_ttl_ms: i64,
    margin_ms: i64,
    /// Its row records less than its settings allow now.
    record_settings: bool,
    /// Stamps of leases it may have forgotten end here: the end of its
    /// latest hold-off (0 for none); every grant starts after it.
    forgotten_stamps_until_ms: i64,
}

fn ts(unix_ms: i64) -> DatumWithOid<'static> {
    DatumWithOid::from(timestamptz_or_error(unix_ms))
}

fn ms(t: Option<TimestampWithTimeZone>) -> Option<i64> {
    t.map(unix_ms_of_timestamptz)
}

const SEEN: &str = "'pgticket.lease_registry_seen'::pg_catalog.regclass";

/// When this registry started serving in its present state: the first call
/// that saw it unsettled, recorded now if no call did. A recorded sighting
/// counts only if it is later than the server's (or timeline's) start and
/// than every identity row's `grants_from` (each row was written when a
/// registry settled, or was created, so a sighting from before a settle —
/// or one copied with a database from a template — is not this state's).
/// Nothing resets it: a settle whose transaction rolls back (no id free)
/// leaves the sighting, and the hold-off, as they were.
fn serving_since_ms(client: &mut SpiClient<'_>, me: Identity, latest_row_ms: i64) -> Result<i64, SpiError> {
    let floor_ms = me.started_ms.max(timeline_start_ms(me.timeline).unwrap_or(i64::MIN)).max(latest_row_ms);
    let seen_ms: i64 = client.select("SELECT last_value FROM pgticket.lease_registry_seen", None, &[])?.first().get_one()?.unwrap_or(0);
    // Strictly after: the sighting a settle made of its own (same ms) is not
    // one of a copy's.
    if seen_ms > floor_ms {
        return Ok(seen_ms);
    }
    let now_ms = now_unix_ms();
    client.update(&format!("SELECT pg_catalog.setval({SEEN}, $1)"), None, &[now_ms.into()])?;
    Ok(now_ms)
}

fn serving(client: &mut SpiClient<'_>, me: Identity) -> Result<Serving, SpiError> {
    let (mut rows, mut latest_row_ms) = (Vec::new(), i64::MIN);
    for row in client.select(
        "SELECT system_identifier, timeline, database_oid, started_at, max_ttl_ms, margin_ms, grants_from \
           FROM pgticket.lease_registry",
        None,
        &[],
    )? {
        let id = Identity {
            system_identifier: row.get::<i64>(1)?.unwrap_or_default(),
            timeline: row.get::<i32>(2)?.unwrap_or_default(),
            database: row.get::<pg_sys::Oid>(3)?.unwrap_or_default(),
            // Through the same conversion as the server's own start.
            started_ms: ms(row.get::<TimestampWithTimeZone>(4)?).unwrap_or(i64::MIN),
        };
        rows.push((id, row.get::<i64>(5)?.unwrap_or_default(), row.get::<i64>(6)?.unwrap_or_default()));
        latest_row_ms = latest_row_ms.max(ms(row.get::<TimestampWithTimeZone>(7)?).unwrap_or(i64::MAX));
    }
    let (ttl_now, margin_now) = (settings::lease_max_ttl_ms(), settings::lease_margin_ms());
    // And what the server's lease ledger recorded: a primary's settings
    // reach its standbys there, though they were raised by ALTER SYSTEM
    // and the row that recorded them was lost at the failover (#46 item 6 c).
    let (ledger_ttl, ledger_margin) = crate::snowflake::ledger::longest_ttl_and_margin().unwrap_or_else(|e| e.raise());
    let max_ttl_ms = rows.iter().map(|r| r.1).fold(ttl_now.max(ledger_ttl), i64::max);
    let margin_ms = rows.iter().map(|r| r.2).fold(margin_now.max(ledger_margin), i64::max);
    let record_settings = rows.iter().any(|r| r.1 < ttl_now || r.2 < margin_now);
    // A token sequence behind the tokens in the table was restored (a
    // data-only restore puts back an older sequence even when its rows
    // clash with the ones here): this state is not one the registry can
    // vouch for.
    // (The next token must be above every one in the table: a sequence
    // set to the highest one with is_called false, or counting down, would
    // hand it out again.)
    let tokens_rewound: bool = client
        .select(
            "SELECT t.last_value OPERATOR(pg_catalog.<) m.top \
                    OR (t.last_value OPERATOR(pg_catalog.=) m.top AND NOT t.is_called) \
                    OR s.seqincrement OPERATOR(pg_catalog.<=) 0 \
               FROM pgticket.lease_tokens t, pg_catalog.pg_sequence s, \
                    (SELECT coalesce(pg_catalog.max(lease), 0::pg_catalog.int8) AS top FROM pgticket.machine_id_leases) m \
              WHERE s.seqrelid OPERATOR(pg_catalog.=) 'pgticket.lease_tokens'::pg_catalog.regclass",
            None,
            &[],
        )?
        .first()
        .get_one()?
        .unwrap_or(false);
    if let [(id, _, _)] = rows[..] {
        if id == me && !tokens_rewound {
            return Ok(Serving {
                grants_from_ms: i64::MIN,
                settled: true,
                max_ttl_ms,
                margin_ms,
                record_settings,
                forgotten_stamps_until_ms: latest_row_ms.max(0),
            });
        }
    }
    let since_ms = serving_since_ms(client, me, latest_row_ms)?;
    let grants_from_ms = leases::grants_resume_at(since_ms, max_ttl_ms, margin_ms);
    Ok(Serving {
        grants_from_ms,
        settled: false,
        max_ttl_ms,
        margin_ms,
        record_settings,
        forgotten_stamps_until_ms: grants_from_ms.max(latest_row_ms).max(0),
    })
}

/// Make the registry's identity row its own (under a lock, so concurrent
/// first grants write one row), and move the tokens past any it may have
/// forgotten (Unix microseconds: more than the grants any registry can
/// have made since an earlier such move). The leases it knows stay as they
/// are: their holders renew them.
///
/// Never waited for (SPEC §13.11): the lock is held to the caller's commit,
/// and a grant left open in a transaction would stop every other one. A
/// grant that finds another settling moves the tokens itself (that is what
/// its own token needs) and leaves the identity row to the other; if that
/// one rolls back, a later grant settles.
fn settle(client: &mut SpiClient<'_>, me: Identity, serving: &Serving) -> Result<(), SpiError> {
    let locked = unsafe { pg_sys::ConditionalLockRelationOid(identity_table(client)?, pg_sys::ExclusiveLock as pg_sys::LOCKMODE) };
    if !locked {
        return move_tokens_past_the_clock(client);
    }
    if serving_again(client, me)? {
        return Ok(());
    }
    client.update("DELETE FROM pgticket.lease_registry", None, &[])?;
    client.update(
        "INSERT INTO pgticket.lease_registry (system_identifier, timeline, database_oid, grants_from, started_at, max_ttl_ms, margin_ms) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        None,
        &[
            me.system_identifier.into(),
            me.timeline.into(),
            me.database.into(),
            ts(serving.grants_from_ms),
            ts(me.started_ms),
            serving.max_ttl_ms.into(),
            serving.margin_ms.into(),
        ],
    )?;
    move_tokens_past_the_clock(client)
}

/// The tokens past any this registry may have forgotten: Unix microseconds
/// (more than the grants any registry can have made since an earlier such
/// move), and past every token in the table. `setval` is not transactional
/// and waits for no transaction.
fn move_tokens_past_the_clock(client: &mut SpiClient<'_>) -> Result<(), SpiError> {
    client.update(
        "SELECT pg_catalog.setval('pgticket.lease_tokens'::pg_catalog.regclass, \
                GREATEST(last_value, $1, (SELECT pg_catalog.max(lease) FROM pgticket.machine_id_leases))) FROM pgticket.lease_tokens",
        None,
        &[(now_unix_ms().saturating_mul(1000)).into()],
    )?;
    Ok(())
}

/// Settled by a concurrent grant while this one waited for the lock?
fn serving_again(client: &mut SpiClient<'_>, me: Identity) -> Result<bool, SpiError> {
    Ok(serving(client, me)?.settled)
}

const LEASE_COLUMNS: &str = "machine_id, lease, leased_at, expires_at, ended_at, revoked, last_issued_ms, not_before_ms, margin_ms";

/// Each row's lease, and (with `secret_match`, a column compared with the
/// secret given) how the secret compares.
fn leases_of(table: SpiTupleTable<'_>, secret_match: bool) -> Result<Vec<(CurrentLease, LastLease, SecretCheck)>, SpiError> {
    let mut out = Vec::new();
    for row in table {
        let current = CurrentLease {
            machine_id: row.get::<i32>(1)?.unwrap_or_default() as u16,
            lease: row.get::<i64>(2)?.unwrap_or_default(),
            leased_at_ms: ms(row.get(3)?).unwrap_or_default(),
            expires_at_ms: ms(row.get(4)?).unwrap_or_default(),
            ended_at_ms: ms(row.get(5)?),
            revoked: row.get::<bool>(6)?.unwrap_or_default(),
        };
        let last = LastLease {
            expires_at_ms: current.expires_at_ms,
            ended_at_ms: current.ended_at_ms,
            revoked: current.revoked,
            last_issued_ms: row.get::<i64>(7)?,
            not_before_ms: row.get::<i64>(8)?.unwrap_or_default(),
            margin_ms: row.get::<i64>(9)?,
        };
        let secret = match secret_match.then(|| row.get::<bool>(10)).transpose()?.flatten() {
            Some(true) => SecretCheck::Matches,
            Some(false) => SecretCheck::Differs,
            None if secret_match => SecretCheck::NoneOnRecord,
            None => SecretCheck::Differs,
        };
        out.push((current, last, secret));
    }
    Ok(out)
}

/// The lock class of a never-leased id's first grant ('pgti').
const NEVER_LEASED_LOCK_CLASS: u32 = 0x7067_7469;
/// An advisory lock's fourth field the SQL functions never use (they use 1
/// and 2): no role can take these locks with `pg_advisory_lock` and stop
/// our grants (#31 review: a role with no rights held (0x70677469, id) for
/// every id, and every first grant failed with 53400).
const PRIVATE_ADVISORY_SPACE: u16 = 0x7074;

/// This transaction's lock of the first grant of never-leased `id` (held to
/// its end), if no other transaction holds it.
fn try_lock_never_leased(_client: &mut SpiClient<'_>, id: u16) -> Result<bool, SpiError> {
    let tag = pg_sys::LOCKTAG {
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        locktag_field2: NEVER_LEASED_LOCK_CLASS,
        locktag_field3: u32::from(id),
        locktag_field4: PRIVATE_ADVISORY_SPACE,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    };
    let got = unsafe { pg_sys::LockAcquire(&tag, pg_sys::ExclusiveLock as pg_sys::LOCKMODE, false, true) };
    Ok(got != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL)
}

/// The hash a lease's secret is kept as: the table never holds a secret.
const SECRET_HASH: &str = "pg_catalog.sha256(pg_catalog.decode($2, 'hex'))";

/// Lock one id's row: waiting for another call on it (those are short), or
/// with `skip_locked` not waiting (None if another call holds it); with a
/// secret, say how it compares. Locking reads run as updates: SPI refuses
/// FOR UPDATE in a read-only one.
fn lock_lease(
    client: &mut SpiClient<'_>,
    machine_id: u16,
    skip_locked: bool,
    secret: Option<u128>,
) -> Result<Option<(CurrentLease, LastLease, SecretCheck)>, SpiError> {
    let skip = if skip_locked { " SKIP LOCKED" } else { "" };
    let table = match secret {
        Some(secret) => client.update(
            &format!(
                "SELECT {LEASE_COLUMNS}, secret_hash OPERATOR(pg_catalog.=) {SECRET_HASH} FROM pgticket.machine_id_leases \
                  WHERE machine_id OPERATOR(pg_catalog.=) $1 FOR UPDATE{skip}"
            ),
            None,
            &[i32::from(machine_id).into(), leases::secret_text(secret).into()],
        )?,
        None => client.update(
            &format!("SELECT {LEASE_COLUMNS} FROM pgticket.machine_id_leases WHERE machine_id OPERATOR(pg_catalog.=) $1 FOR UPDATE{skip}"),
            None,
            &[i32::from(machine_id).into()],
        )?,
    };
    Ok(leases_of(table, secret.is_some())?.pop())
}

/// 128 bits from the operating system's secure source, as PostgreSQL's own
/// salts and cancel keys are made.
fn new_secret() -> u128 {
    let mut bytes = [0u8; 16];
    if !unsafe { pg_sys::pg_strong_random(bytes.as_mut_ptr().cast(), bytes.len()) } {
        pgrx::error!("pg_ticket: could not generate a random lease secret");
    }
    u128::from_le_bytes(bytes)
}

/// Runs `f` as the tables' owner with SPI connected; a failed statement is
/// PostgreSQL's error, raised as it raised it. What it changed commits
/// durably (SPEC §8 rule 4: a holder believes only committed replies) —
/// set here, after the owner's block, whose settings are undone with it.
fn with_registry<R>(f: impl FnOnce(&mut SpiClient<'_>) -> Result<Result<R, TicketError>, SpiError>) -> Result<R, TicketError> {
    xact::check_writable()?;
    let outcome = crate::state_tables::as_owner_of(crate::state_tables::machine_id_leases(), || {
        Spi::connect_mut(|client| {
            // Every lock wait bounded (SPEC §13.11): a caller that keeps its
            // transaction open holds what it locked (the identity table
            // while settling, its lease's row) until it ends; the others
            // fail after a second (55P03) and retry, rather than wait.
            client.update("SET LOCAL lock_timeout = 1000", None, &[])?;
            f(client)
        }).unwrap_or_else(|e| pgrx::error!("pg_ticket: the lease registry: {e}"))
    });
    if outcome.is_ok() {
        xact::make_commit_durable();
    }
    outcome
}

/// Raise the longest ttl and margin recorded to the settings now, so that a
/// dump carries them (a restore onto a server with smaller settings still
/// holds off long enough for the leases they allowed).
/// `pgticket.lease_registry`'s relation id.
fn identity_table(client: &SpiClient<'_>) -> Result<pg_sys::Oid, SpiError> {
    Ok(client.select("SELECT 'pgticket.lease_registry'::pg_catalog.regclass::pg_catalog.oid", None, &[])?.first().get_one()?.unwrap_or_default())
}

/// Rows another call is recording in (a transaction left open) are skipped,
/// not waited for: that call records the same settings, and if it rolls
/// back, a later call records them. A settle under way (its table lock to
/// its transaction's end) is not waited for either: it records them (#31
/// review: every renewal waited for a settle left open, 55P03).
fn record_settings(client: &mut SpiClient<'_>) -> Result<(), SpiError> {
    if !unsafe { pg_sys::ConditionalLockRelationOid(identity_table(client)?, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE) } {
        return Ok(());
    }
    client.update(
        "UPDATE pgticket.lease_registry r SET max_ttl_ms = GREATEST(r.max_ttl_ms, $1), margin_ms = GREATEST(r.margin_ms, $2) \
           FROM (SELECT ctid FROM pgticket.lease_registry FOR UPDATE SKIP LOCKED) free WHERE r.ctid OPERATOR(pg_catalog.=) free.ctid",
        None,
        &[settings::lease_max_ttl_ms().into(), settings::lease_margin_ms().into()],
    )?;
    Ok(())
}

/// The ids `pg_ticket.lease_ids` names within the space's layout (a
/// database recorded with fewer machine bits than the setting's list
/// allows leases fewer).
fn allowed_ids(layout: ticket_core::snowflake::Layout) -> Result<Vec<u16>, TicketError> {
    let mut allowed = settings::lease_ids()?;
    allowed.retain(|id| *id <= layout.max_machine_id());
    Ok(allowed)
}

/// The registry's settings and the ids it may grant (never its server's
/// own) in the server's lease ledger, before it grants or renews under them.
fn record_in_ledger(allowed: &[u16], margin_ms: i64) -> Result<(), TicketError> {
    let own = settings::own_snowflake_machine_id();
    let leasable: Vec<u16> = allowed.iter().copied().filter(|id| Some(*id) != own).collect();
    crate::snowflake::ledger::record_registry(settings::lease_max_ttl_ms(), margin_ms, &leasable)
}

pub fn lease(holder: Name<'_>, ttl_ms: i64) -> Result<Grant, TicketError> {
    leases::check_ttl_within(ttl_ms, settings::lease_max_ttl_ms())?;
    xact::check_writable()?;
    let (epoch_ms, layout) = crate::snowflake::registry_space()?;
    if settings::preloaded() {
        crate::snowflake::record_space_in_mark()?;
    }
    let margin_ms = settings::lease_margin_ms();
    let allowed = allowed_ids(layout)?;
    with_registry(|client| {
        let me = identity();
        let serving = serving(client, me)?;
        let now_ms = now_unix_ms();
        if now_ms < serving.grants_from_ms {
            return Ok(Err(LeaseError::HoldOff { from_ms: serving.grants_from_ms, wait_ms: serving.grants_from_ms - now_ms }.into()));
        }
        if !serving.settled {
            settle(client, me, &serving)?;
        } else if serving.record_settings {
            record_settings(client)?;
        }
        let rows: HashMap<u16, LastLease> = leases_of(
            client.select(&format!("SELECT {LEASE_COLUMNS} FROM pgticket.machine_id_leases"), None, &[])?,
            false,
        )?
        .into_iter()
        .map(|(c, l, _)| (c.machine_id, l))
        .collect();
        if let Err(e) = record_in_ledger(&allowed, margin_ms) {
            return Ok(Err(e));
        }
        let own = settings::own_snowflake_machine_id();
        let available = leases::availability(&allowed, own, |id| rows.get(&id).copied(), now_ms, margin_ms);
        let secret = new_secret();
        for id in available.free {
            let (granted, leased_at_ms, not_before_ms) = if rows.contains_key(&id) {
                // Locked by another grant, or changed since it was read.
                let Some((_, last, _)) = lock_lease(client, id, true, None)? else { continue };
                let leased_at_ms = now_unix_ms();
                if last.free_from_ms(margin_ms) > leased_at_ms {
                    continue;
                }
                let not_before_ms = leases::grant_not_before_ms(Some(&last), margin_ms, serving.forgotten_stamps_until_ms);
                let granted = client.update(
                    &format!(
                        "UPDATE pgticket.machine_id_leases SET holder = $3, lease = pg_catalog.nextval('pgticket.lease_tokens'::pg_catalog.regclass), \
                            secret_hash = {SECRET_HASH}, leased_at = $4, expires_at = $5, ended_at = NULL, revoked = false, \
                            last_issued_ms = NULL, not_before_ms = $6, margin_ms = $7 \
                          WHERE machine_id OPERATOR(pg_catalog.=) $1 RETURNING lease"
                    ),
                    None,
                    &[
                        i32::from(id).into(),
                        leases::secret_text(secret).into(),
                        holder.to_datum(),
                        ts(leased_at_ms),
                        ts(leased_at_ms + ttl_ms),
                        not_before_ms.into(),
                        margin_ms.into(),
                    ],
                )?;
                (granted, leased_at_ms, not_before_ms)
            } else {
                // Never leased here: only a holder this registry may have
                // forgotten can have stamped with it. Another grant of it
                // in a transaction left open holds this id's lock: skipped,
                // not waited for (the insert would wait on its row).
                if !try_lock_never_leased(client, id)? {
                    continue;
                }
                let leased_at_ms = now_unix_ms();
                let not_before_ms = leases::grant_not_before_ms(None, margin_ms, serving.forgotten_stamps_until_ms);
                let granted = client.update(
                    &format!(
                        "INSERT INTO pgticket.machine_id_leases \
                            (machine_id, holder, lease, secret_hash, leased_at, expires_at, not_before_ms, margin_ms) \
                         VALUES ($1, $3, pg_catalog.nextval('pgticket.lease_tokens'::pg_catalog.regclass), {SECRET_HASH}, $4, $5, $7, $6) \
                         ON CONFLICT DO NOTHING RETURNING lease"
                    ),
                    None,
                    &[
                        i32::from(id).into(),
                        leases::secret_text(secret).into(),
                        holder.to_datum(),
                        ts(leased_at_ms),
                        ts(leased_at_ms + ttl_ms),
                        margin_ms.into(),
                        not_before_ms.into(),
                    ],
                )?;
                // Empty: another grant took it first.
                (granted, leased_at_ms, not_before_ms)
            };
            if granted.is_empty() {
                continue;
            }
            let lease = granted.first().get_one::<i64>()?.expect("a granted lease has a token");
            if let Err(e) = crate::snowflake::ledger::record_lease(id, leased_at_ms + ttl_ms + margin_ms, ttl_ms) {
                return Ok(Err(e));
            }
            return Ok(Ok(Grant {
                machine_id: id,
                lease,
                not_before_ms,
                expires_at_ms: leased_at_ms + ttl_ms,
                epoch_ms,
                layout,
                margin_ms,
                secret,
            }));
        }
        Ok(Err(LeaseError::NoneFree {
            held: available.held,
            cooling: available.cooling,
            next_free_in_ms: available.next_free_ms.map(|t| t - now_ms),
        }
        .into()))
    })
}

pub fn renew(machine_id: u16, lease: i64, secret: u128, ttl_ms: i64, last_issued_ms: Option<i64>) -> Result<i64, TicketError> {
    leases::check_ttl_within(ttl_ms, settings::lease_max_ttl_ms())?;
    let margin_ms = settings::lease_margin_ms();
    // Where the configuration names no space or ids that grant (moved
    // since), a recorded lease is renewed all the same, and the grants'
    // line in the ledger stands.
    let allowed = crate::snowflake::registry_space().and_then(|(_, layout)| allowed_ids(layout)).ok();
    with_registry(|client| {
        // A ttl raised by reload may be used by renewals alone: recorded
        // too, in the ledger (review of item 6) and the identity row.
        if let Some(Err(e)) = allowed.as_deref().map(|allowed| record_in_ledger(allowed, margin_ms)) {
            return Ok(Err(e));
        }
        if serving(client, identity())?.record_settings {
            record_settings(client)?;
        }
        let locked = lock_lease(client, machine_id, false, Some(secret))?;
        let now_ms = now_unix_ms();
        let (current, secret_check) = (locked.map(|(c, _, _)| c), locked.map_or(SecretCheck::Differs, |(_, _, s)| s));
        if let Err(e) = leases::check_renewal(current.as_ref(), machine_id, lease, secret_check, now_ms, settings::own_snowflake_machine_id()) {
            // The server stamps this id itself: a lease of it that no line
            // recorded (granted before the server preloaded pg_ticket)
            // reaches the ledger at the latest here, so that every
            // database refuses the id until the lease is over.
            if let (LeaseError::OwnId { .. }, Some((_, last, _))) = (&e, &locked) {
                if let Err(e) = crate::snowflake::ledger::record_found_lease(machine_id, last.free_from_ms(margin_ms)) {
                    return Ok(Err(e));
                }
            }
            return Ok(Err(e.into()));
        }
        let (current, last) = locked.map(|(c, l, _)| (c, l)).expect("checked above");
        let expires_at_ms = leases::renewed_expiry_ms(current.expires_at_ms, now_ms, ttl_ms);
        let margin_ms = last.margin_ms.map_or(margin_ms, |own| own.max(margin_ms));
        // Stamps issued by now (not the new expiry: #31 item 6).
        if let Err(e) = leases::check_last_issued(lease, last_issued_ms, now_ms, margin_ms) {
            return Ok(Err(e.into()));
        }
        if let Err(e) = crate::snowflake::ledger::record_lease(machine_id, expires_at_ms + margin_ms, ttl_ms) {
            return Ok(Err(e));
        }
        client.update(
            "UPDATE pgticket.machine_id_leases SET expires_at = $2, margin_ms = $4, \
                    last_issued_ms = GREATEST(last_issued_ms, $3) \
              WHERE machine_id OPERATOR(pg_catalog.=) $1",
            None,
            &[i32::from(machine_id).into(), ts(expires_at_ms), last_issued_ms.into(), margin_ms.into()],
        )?;
        Ok(Ok(expires_at_ms))
    })
}

pub fn release(machine_id: u16, lease: i64, secret: u128, last_issued_ms: Option<i64>) -> Result<(), TicketError> {
    let margin_ms = settings::lease_margin_ms();
    with_registry(|client| {
        let locked = lock_lease(client, machine_id, false, Some(secret))?;
        let secret_check = locked.map_or(SecretCheck::Differs, |(_, _, s)| s);
        if let Err(e) = leases::check_release(locked.map(|(c, _, _)| c).as_ref(), machine_id, lease, secret_check) {
            return Ok(Err(e.into()));
        }
        let (_, last, _) = locked.expect("checked above");
        // A lease ends at its release or its expiry, whichever came first;
        // a second release changes only the reported stamp.
        let ended = LastLease { ended_at_ms: Some(last.ended_at_ms.unwrap_or(now_unix_ms()).min(last.expires_at_ms)), ..last };
        let margin_ms = last.margin_ms.map_or(margin_ms, |own| own.max(margin_ms));
        if let Err(e) = leases::check_last_issued(lease, last_issued_ms, ended.end_ms(), margin_ms) {
            return Ok(Err(e.into()));
        }
        // A report recorded earlier past the end plus the margin (0.3.0
        // believed one up to a renewal's new expiry) stays in the row (a
        // stamp never moves back) and is capped where it is used
        // (`LastLease::not_before_ms`).
        client.update(
            "UPDATE pgticket.machine_id_leases \
                SET ended_at = coalesce(ended_at, $2), last_issued_ms = GREATEST(last_issued_ms, $3) \
              WHERE machine_id OPERATOR(pg_catalog.=) $1",
            None,
            &[i32::from(machine_id).into(), ts(ended.ended_at_ms.expect("set above")), last_issued_ms.into()],
        )?;
        Ok(Ok(()))
    })
}

/// Grant from now on: an administrator vouches that no lease granted by an
/// earlier life of this registry (before a restart, a restore, a DROP
/// EXTENSION) can still be live — a registry new to its fleet. True if it
/// was holding off.
pub fn end_hold_off() -> Result<bool, TicketError> {
    with_registry(|client| {
        let me = identity();
        let serving = serving(client, me)?;
        if serving.settled {
            return Ok(Ok(false));
        }
        settle(client, me, &Serving { grants_from_ms: now_unix_ms(), ..serving })?;
        Ok(Ok(true))
    })
}

/// End the id's lease now; true if a live one was ended.
pub fn revoke(machine_id: u16) -> Result<bool, TicketError> {
    with_registry(|client| {
        let Some((current, _, _)) = lock_lease(client, machine_id, false, None)? else { return Ok(Ok(false)) };
        let now_ms = now_unix_ms();
        if current.ended_at_ms.is_some() || current.expires_at_ms <= now_ms {
            return Ok(Ok(false));
        }
        client.update(
            "UPDATE pgticket.machine_id_leases SET revoked = true, ended_at = $2 WHERE machine_id OPERATOR(pg_catalog.=) $1",
            None,
            &[i32::from(machine_id).into(), ts(now_ms)],
        )?;
        Ok(Ok(true))
    })
}

/// The state-table generation and own machine id at which this
/// database's leases were found to leave the server's own id alone.
static OWN_ID_CHECKED: BackendLocal<Option<(u64, u16)>> = BackendLocal::new(None);

/// SPEC §17.4: refuses (55000) while this database's registry has a lease
/// of `machine_id` — the id this server stamps itself — that is held or
/// within its margin: a registry restarted with its fixed id set to an id
/// it had leased out (0.3.0 stamped beside that holder). Grants never give
/// the server's own id and renewals of it are refused, so through our own
/// calls a clear database stays clear: checked once per backend and
/// state-table generation. A row of that id written from outside (a
/// data-only restore, an INSERT by hand; not a replication apply, SPEC §19) moves the
/// generation in every session at its commit: the table's trigger
/// `changed` (below). Not yet covered (#30, a known hole): only this
/// database's registry is read, not another database's on the same server.
pub fn check_own_id_unleased(machine_id: u16) -> Result<(), TicketError> {
    let generation = crate::state_tables::generation();
    if OWN_ID_CHECKED.get() == Some((generation, machine_id)) {
        return Ok(());
    }
    let Some(tables) = crate::state_tables::lookup() else { return Ok(()) };
    let Some(table) = tables.machine_id_leases else { return Ok(()) };
    // 0.2.0's table (before ALTER EXTENSION UPDATE) has no margin_ms, and
    // no trigger that tells a change from outside (#30 review, helper 1:
    // snowflake_id() failed there on the missing column).
    let of_0_2_0 = tables.id_space.is_none();
    if !of_0_2_0 {
        crate::state_tables::check_row_change_trigger(table, "machine_id_leases");
    }
    let columns = if of_0_2_0 { LEASE_COLUMNS.replace("margin_ms", "NULL::pg_catalog.int8") } else { LEASE_COLUMNS.to_string() };
    let last = crate::state_tables::as_owner_of(table, || {
        Spi::connect(|client| {
            let rows = client.select(
                &format!("SELECT {columns} FROM pgticket.machine_id_leases WHERE machine_id OPERATOR(pg_catalog.=) $1"),
                None,
                &[i32::from(machine_id).into()],
            )?;
            Ok::<_, SpiError>(leases_of(rows, false)?.pop().map(|(_, last, _)| last))
        })
    })
    .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot read pgticket.machine_id_leases: {e}"));
    if let Some(free_from_ms) = last.map(|l| l.free_from_ms(settings::lease_margin_ms())).filter(|t| *t > now_unix_ms()) {
        // Into the server's ledger too, so that every database refuses it
        // from now on (a registry that ran before its server preloaded
        // pg_ticket recorded none of its grants).
        crate::snowflake::ledger::record_found_lease(machine_id, free_from_ms)?;
        return Err(LeaseError::OwnIdLeasedOut { machine_id, free_from_ms }.into());
    }
    OWN_ID_CHECKED.set(Some((generation, machine_id)));
    Ok(())
}

/// A lease row inserted or updated by anything. Every live lease goes into
/// the server's ledger (#46 item 6: a restored or loaded row reaches no
/// grant's line, and other databases read the ledger only); our own grants
/// and renewals recorded theirs before, so for them this reads the file and
/// writes nothing. A row of this server's own fixed id also makes every
/// session of this database check its own id again at its next
/// `snowflake_id()` (a relcache invalidation of the table, sent at commit);
/// our own calls never write such a row.
#[pg_trigger(sql = false)]
fn machine_id_leases_changed<'a>(trigger: &'a pgrx::PgTrigger<'a>) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, pgrx::PgTriggerError> {
    let Some(row) = trigger.new() else { return Ok(None) };
    let Some(id) = row.get_by_name::<i32>("machine_id").ok().flatten().and_then(|id| u16::try_from(id).ok()) else { return Ok(None) };
    // A lease runs at most to its expiry (a release only shortens it): the
    // ledger may say too much, never too little. Our own grants and
    // renewals record theirs, a ttl ahead (a line here too would make each
    // grant wait for the standbys twice).
    let expires_at_ms = ms(row.get_by_name::<TimestampWithTimeZone>("expires_at").ok().flatten());
    let margin_ms = row.get_by_name::<i64>("margin_ms").ok().flatten().unwrap_or(0).max(settings::lease_margin_ms());
    let live = expires_at_ms.map(|t| t.saturating_add(margin_ms)).filter(|t| *t > now_unix_ms());
    if let (Some(free_from_ms), false) = (live, crate::state_tables::in_own_statement()) {
        crate::snowflake::ledger::record_found_lease(id, free_from_ms).unwrap_or_else(|e| e.raise());
    }
    if settings::machine_id() == settings::MachineId::Fixed(id) {
        unsafe { pg_sys::CacheInvalidateRelcacheByRelid(trigger.relation()?.oid()) };
    }
    Ok(None)
}

/// SPEC §17.3: a lease row loaded from outside (a restore into a registry
/// that already granted) meets the row of its id here: the later lease
/// (the higher fencing token) is kept — the loaded row replaces this one
/// only where a new lease may (`forward_only` refuses the load otherwise,
/// as it refuses a rewind). False if the id has no row (the load inserts
/// it).
pub fn merge_loaded(row: pg_sys::Datum, row_type: pg_sys::Oid) -> bool {
    // The loaded row as one composite argument.
    let loaded = || unsafe { DatumWithOid::new(row, row_type) };
    crate::state_tables::as_owner_of(crate::state_tables::machine_id_leases(), || {
        Spi::connect_mut(|client| {
            let here = client.update(
                "SELECT t.lease, r.lease FROM pgticket.machine_id_leases t, (SELECT ($1::pgticket.machine_id_leases).*) r \
                  WHERE t.machine_id OPERATOR(pg_catalog.=) r.machine_id FOR UPDATE OF t",
                None,
                &[loaded()],
            )?;
            let Some((ours, theirs)) = here.into_iter().next().map(|r| (r.get::<i64>(1), r.get::<i64>(2))) else {
                return Ok(false);
            };
            if theirs?.unwrap_or(i64::MIN) > ours?.unwrap_or(i64::MAX) {
                client.update(
                    "UPDATE pgticket.machine_id_leases t SET holder = r.holder, lease = r.lease, leased_at = r.leased_at, \
                            expires_at = r.expires_at, ended_at = r.ended_at, revoked = r.revoked, \
                            last_issued_ms = r.last_issued_ms, not_before_ms = r.not_before_ms, \
                            secret_hash = r.secret_hash, margin_ms = r.margin_ms \
                       FROM (SELECT ($1::pgticket.machine_id_leases).*) r WHERE t.machine_id OPERATOR(pg_catalog.=) r.machine_id",
                    None,
                    &[loaded()],
                )?;
            }
            Ok::<_, SpiError>(true)
        })
    })
    .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot merge a loaded lease into pgticket.machine_id_leases: {e}"))
}
