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
//! Identity: `pgticket.lease_registry` says which server, timeline and
//! database the registry has served as since when. CREATE EXTENSION writes
//! it; a restore from a dump (the dumped row next to the new one), a
//! promotion (another timeline) or a pg_upgrade (another system
//! identifier) shows as a mismatch, and then the registry grants nothing
//! until the longest ttl plus the margin after it started serving (SPEC §8
//! rule 7), and refuses to renew any lease granted before.

use pgrx::datum::{DatumWithOid, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::spi::{SpiClient, SpiError, SpiTupleTable};
use std::collections::HashMap;

use crate::errors::TicketError;
use crate::names::Name;
use crate::snowflake::{now_unix_ms, timestamptz_or_error, unix_ms_of_timestamptz};
use crate::{settings, xact};
use ticket_core::leases::{self, CurrentLease, Grant, LastLease, LeaseError};

/// This registry as a server, timeline and database.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Identity {
    system_identifier: i64,
    timeline: i32,
    database: pg_sys::Oid,
}

fn identity() -> Identity {
    unsafe {
        Identity {
            // pg_control_system() shows the same bits as bigint.
            system_identifier: pg_sys::GetSystemIdentifier() as i64,
            timeline: pg_sys::GetWALInsertionTimeLine() as i32,
            database: pg_sys::MyDatabaseId,
        }
    }
}

/// Since when the registry has known every lease it granted, and from when
/// it grants.
struct Serving {
    /// Leases granted before this may have been superseded by grants the
    /// registry forgot: they are not renewed.
    since_ms: i64,
    grants_from_ms: i64,
    /// The identity row is this registry's alone: nothing to settle.
    settled: bool,
}

fn ts(unix_ms: i64) -> DatumWithOid<'static> {
    DatumWithOid::from(timestamptz_or_error(unix_ms))
}

fn ms(t: Option<TimestampWithTimeZone>) -> Option<i64> {
    t.map(unix_ms_of_timestamptz)
}

fn postmaster_start_ms() -> i64 {
    unix_ms_of_timestamptz(TimestampWithTimeZone::try_from(unsafe { pg_sys::PgStartTime }).expect("a start time"))
}

/// When this timeline began: its history file is written at promotion (or
/// at the end of an archive recovery). Timeline 1 has none.
fn timeline_start_ms(timeline: i32) -> Option<i64> {
    let modified = std::fs::metadata(format!("pg_wal/{timeline:08X}.history")).ok()?.modified().ok()?;
    Some(modified.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as i64)
}

fn serving(client: &SpiClient<'_>, me: Identity) -> Result<Serving, SpiError> {
    let mut rows = Vec::new();
    for row in client.select(
        "SELECT system_identifier, timeline, database_oid, grants_from FROM pgticket.lease_registry",
        None,
        &[],
    )? {
        let id = Identity {
            system_identifier: row.get::<i64>(1)?.unwrap_or_default(),
            timeline: row.get::<i32>(2)?.unwrap_or_default(),
            database: row.get::<pg_sys::Oid>(3)?.unwrap_or_default(),
        };
        rows.push((id, ms(row.get::<TimestampWithTimeZone>(4)?).unwrap_or(i64::MAX)));
    }
    if let [(id, grants_from_ms)] = rows[..] {
        if id == me {
            return Ok(Serving { since_ms: i64::MIN, grants_from_ms, settled: true });
        }
    }
    let since_ms = match rows.iter().filter(|(id, _)| *id == me).map(|(_, t)| *t).max() {
        // A restore: CREATE EXTENSION wrote this row, the dump the others.
        Some(created_ms) => created_ms,
        None if rows.iter().any(|(id, _)| id.system_identifier == me.system_identifier && id.database == me.database) => {
            timeline_start_ms(me.timeline).unwrap_or_else(postmaster_start_ms).max(0)
        }
        // Another server's rows (pg_upgrade, a copied cluster): since it started.
        None => postmaster_start_ms(),
    };
    let grants_from_ms = leases::grants_resume_at(since_ms, settings::lease_max_ttl_ms(), settings::lease_margin_ms());
    Ok(Serving { since_ms, grants_from_ms, settled: false })
}

/// Make the registry's identity row its own, end every lease it may have
/// forgotten the successor of, and move the tokens past any it may have
/// forgotten (Unix microseconds: more than the grants any registry can
/// have made since an earlier such move).
fn settle(client: &mut SpiClient<'_>, me: Identity, serving: &Serving) -> Result<(), SpiError> {
    client.update(
        "UPDATE pgticket.machine_id_leases SET revoked = true, ended_at = $1 \
          WHERE ended_at IS NULL AND leased_at OPERATOR(pg_catalog.<) $1",
        None,
        &[ts(serving.since_ms)],
    )?;
    client.update("DELETE FROM pgticket.lease_registry", None, &[])?;
    client.update(
        "INSERT INTO pgticket.lease_registry (system_identifier, timeline, database_oid, grants_from) VALUES ($1, $2, $3, $4)",
        None,
        &[me.system_identifier.into(), me.timeline.into(), me.database.into(), ts(serving.grants_from_ms)],
    )?;
    client.update(
        "SELECT pg_catalog.setval('pgticket.lease_tokens'::pg_catalog.regclass, \
                GREATEST(last_value, $1)) FROM pgticket.lease_tokens",
        None,
        &[(now_unix_ms().saturating_mul(1000)).into()],
    )?;
    Ok(())
}

const LEASE_COLUMNS: &str = "machine_id, lease, leased_at, expires_at, ended_at, revoked, last_issued_ms, not_before_ms";

fn leases_of(table: SpiTupleTable<'_>) -> Result<Vec<(CurrentLease, LastLease)>, SpiError> {
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
        };
        out.push((current, last));
    }
    Ok(out)
}

/// Lock one id's row: waiting for another call on it (those are short), or
/// with `skip_locked` not waiting (None if another call holds it).
/// Locking reads run as updates: SPI refuses FOR UPDATE in a read-only one.
fn lock_lease(client: &mut SpiClient<'_>, machine_id: u16, skip_locked: bool) -> Result<Option<(CurrentLease, LastLease)>, SpiError> {
    let skip = if skip_locked { " SKIP LOCKED" } else { "" };
    let table = client.update(
        &format!("SELECT {LEASE_COLUMNS} FROM pgticket.machine_id_leases WHERE machine_id OPERATOR(pg_catalog.=) $1 FOR UPDATE{skip}"),
        None,
        &[i32::from(machine_id).into()],
    )?;
    Ok(leases_of(table)?.pop())
}

/// Runs `f` as the tables' owner with SPI connected; a failed statement is
/// PostgreSQL's error, raised as it raised it. What it changed commits
/// durably (SPEC §8 rule 4: a holder believes only committed replies) —
/// set here, after the owner's block, whose settings are undone with it.
fn with_registry<R>(f: impl FnOnce(&mut SpiClient<'_>) -> Result<Result<R, TicketError>, SpiError>) -> Result<R, TicketError> {
    xact::check_writable()?;
    let outcome = crate::state_tables::as_owner_of(crate::state_tables::machine_id_leases(), || {
        Spi::connect_mut(|client| f(client)).unwrap_or_else(|e| pgrx::error!("pg_ticket: the lease registry: {e}"))
    });
    if outcome.is_ok() {
        xact::make_commit_durable();
    }
    outcome
}

pub fn lease(holder: Name<'_>, ttl_ms: i64) -> Result<Grant, TicketError> {
    leases::check_ttl_within(ttl_ms, settings::lease_max_ttl_ms())?;
    let margin_ms = settings::lease_margin_ms();
    let allowed = settings::lease_ids();
    with_registry(|client| {
        let me = identity();
        let serving = serving(client, me)?;
        let now_ms = now_unix_ms();
        if now_ms < serving.grants_from_ms {
            return Ok(Err(LeaseError::HoldOff { wait_ms: serving.grants_from_ms - now_ms }.into()));
        }
        if !serving.settled {
            settle(client, me, &serving)?;
        }
        let rows: HashMap<u16, LastLease> = leases_of(client.select(
            &format!("SELECT {LEASE_COLUMNS} FROM pgticket.machine_id_leases"),
            None,
            &[],
        )?)?
        .into_iter()
        .map(|(c, l)| (c.machine_id, l))
        .collect();
        let own = settings::own_snowflake_machine_id();
        let available = leases::availability(&allowed, own, |id| rows.get(&id).copied(), now_ms, margin_ms);
        for id in available.free {
            let (granted, leased_at_ms, not_before_ms) = if rows.contains_key(&id) {
                // Locked by another grant, or changed since it was read.
                let Some((_, last)) = lock_lease(client, id, true)? else { continue };
                let leased_at_ms = now_unix_ms();
                if last.free_from_ms(margin_ms) > leased_at_ms {
                    continue;
                }
                let not_before_ms = last.not_before_ms(margin_ms);
                let granted = client.update(
                    "UPDATE pgticket.machine_id_leases SET holder = $2, lease = pg_catalog.nextval('pgticket.lease_tokens'::pg_catalog.regclass), \
                        leased_at = $3, expires_at = $4, ended_at = NULL, revoked = false, \
                        last_issued_ms = NULL, not_before_ms = $5 \
                      WHERE machine_id OPERATOR(pg_catalog.=) $1 RETURNING lease",
                    None,
                    &[i32::from(id).into(), holder.to_datum(), ts(leased_at_ms), ts(leased_at_ms + ttl_ms), not_before_ms.into()],
                )?;
                (granted, leased_at_ms, not_before_ms)
            } else {
                // Never leased: nobody stamped with it, nothing to wait for.
                let leased_at_ms = now_unix_ms();
                let granted = client.update(
                    "INSERT INTO pgticket.machine_id_leases \
                        (machine_id, holder, lease, leased_at, expires_at, not_before_ms) \
                     VALUES ($1, $2, pg_catalog.nextval('pgticket.lease_tokens'::pg_catalog.regclass), $3, $4, 0) \
                     ON CONFLICT DO NOTHING RETURNING lease",
                    None,
                    &[i32::from(id).into(), holder.to_datum(), ts(leased_at_ms), ts(leased_at_ms + ttl_ms)],
                )?;
                // Empty: another grant took it first.
                (granted, leased_at_ms, 0)
            };
            if granted.is_empty() {
                continue;
            }
            let lease = granted.first().get_one::<i64>()?.expect("a granted lease has a token");
            return Ok(Ok(Grant {
                machine_id: id,
                lease,
                not_before_ms,
                expires_at_ms: leased_at_ms + ttl_ms,
                epoch_ms: settings::registry_epoch_unix_ms(),
                margin_ms,
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

pub fn renew(machine_id: u16, lease: i64, ttl_ms: i64, last_issued_ms: Option<i64>) -> Result<i64, TicketError> {
    leases::check_ttl_within(ttl_ms, settings::lease_max_ttl_ms())?;
    with_registry(|client| {
        let serving = serving(client, identity())?;
        let current = lock_lease(client, machine_id, false)?.map(|(c, _)| c);
        let now_ms = now_unix_ms();
        if let Err(e) = leases::check_renewal(current.as_ref(), machine_id, lease, now_ms, serving.since_ms) {
            return Ok(Err(e.into()));
        }
        let expires_at_ms = now_ms + ttl_ms;
        client.update(
            "UPDATE pgticket.machine_id_leases SET expires_at = $2, \
                    last_issued_ms = GREATEST(last_issued_ms, $3) \
              WHERE machine_id OPERATOR(pg_catalog.=) $1",
            None,
            &[i32::from(machine_id).into(), ts(expires_at_ms), last_issued_ms.into()],
        )?;
        Ok(Ok(expires_at_ms))
    })
}

pub fn release(machine_id: u16, lease: i64, last_issued_ms: Option<i64>) -> Result<(), TicketError> {
    with_registry(|client| {
        let current = lock_lease(client, machine_id, false)?.map(|(c, _)| c);
        if let Err(e) = leases::check_release(current.as_ref(), machine_id, lease) {
            return Ok(Err(e.into()));
        }
        // A lease ends at its release or its expiry, whichever came first;
        // a second release changes only the reported stamp.
        client.update(
            "UPDATE pgticket.machine_id_leases \
                SET ended_at = coalesce(ended_at, LEAST($2, expires_at)), \
                    last_issued_ms = GREATEST(last_issued_ms, $3) \
              WHERE machine_id OPERATOR(pg_catalog.=) $1",
            None,
            &[i32::from(machine_id).into(), ts(now_unix_ms()), last_issued_ms.into()],
        )?;
        Ok(Ok(()))
    })
}

/// End the id's lease now; true if a live one was ended.
pub fn revoke(machine_id: u16) -> Result<bool, TicketError> {
    with_registry(|client| {
        let Some((current, _)) = lock_lease(client, machine_id, false)? else { return Ok(Ok(false)) };
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
