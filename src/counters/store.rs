//! Table access for the marks: the only code that touches
//! `pgticket.scoped_counters` and `pgticket.blocks`.
//!
//! Statements run through SPI as the owner of the state tables (ordinary
//! roles have no rights on them), with every name and operator
//! schema-qualified, so a caller's `search_path` cannot redirect them. The
//! prepared plans are kept per backend, for the tables they were prepared
//! for (`tables::Tables`: a new owner, new relations or the 0.2.0 columns
//! prepare them anew).

use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, SpiClient};
use pgrx::PgOid;

use super::allocator::Kind;
use crate::backend_local::BackendRefCell;
use crate::state_tables::{self, as_owner_of, Tables};
use crate::names::Name;
use ticket_core::counter::Mark;

/// Every statement returns (or writes) `mark, max_mark`.
struct Statements {
    /// Lock the row and take `n` in one write; no row if the scope is new
    /// or the mark would pass its limit.
    bump: OwnedPreparedStatement,
    /// Create the row holding `n`; no row if another transaction created it.
    insert: OwnedPreparedStatement,
    read: OwnedPreparedStatement,
    write: OwnedPreparedStatement,
}

/// Per kind, with the tables they were prepared for: tables of another
/// shape (0.1.0's, before the update) or owner need other statements.
static STATEMENTS: BackendRefCell<[Option<(Tables, Statements)>; 2]> = BackendRefCell::new();

fn table(kind: Kind) -> (&'static str, &'static [&'static str]) {
    match kind {
        Kind::Scope => ("pgticket.scoped_counters", &["queue", "domain"]),
        Kind::Block => ("pgticket.blocks", &["name"]),
    }
}

/// `keys` matched against parameters $1, $2, ...
fn key_cond(keys: &[&str]) -> String {
    keys.iter().enumerate().map(|(i, col)| format!("{col} OPERATOR(pg_catalog.=) ${}", i + 1)).collect::<Vec<_>>().join(" AND ")
}

fn prepare(client: &SpiClient<'_>, kind: Kind, tables: Tables) -> Statements {
    let (table, keys) = table(kind);
    // 0.1.0's tables have no limit column: their limit is 2^63-1.
    let limit = if tables.has_limits { "max_mark" } else { "9223372036854775807::pg_catalog.int8" };
    // 0.5.0's home (a group's rule, SPEC §19.3): returned with the mark; a
    // new row's is this node's. Before the update there is none.
    let home = if tables.has_home { "home" } else { "NULL::pg_catalog.int8" };
    let key_cond = key_cond(keys);
    let n = keys.len() + 1;
    let mut types = vec![PgOid::from(pg_sys::TEXTOID); keys.len()];
    types.push(PgOid::from(pg_sys::INT8OID));
    let key_types = &types[..keys.len()];
    let mut write_types = types.clone();
    write_types.push(PgOid::from(pg_sys::INT8OID));
    let cols = keys.join(", ");
    let params = (1..=n).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ");
    let keep = |sql: String, types: &[PgOid]| {
        client
            .prepare_mut(sql.as_str(), types)
            .unwrap_or_else(|e| panic!("pg_ticket: cannot prepare {sql:?}: {e}"))
            .keep()
    };
    Statements {
        bump: keep(
            format!(
                "UPDATE {table} SET mark = mark OPERATOR(pg_catalog.+) ${n} \
                 WHERE {key_cond} AND mark OPERATOR(pg_catalog.<=) \
                 ({limit} OPERATOR(pg_catalog.-) ${n}) RETURNING mark, {limit}, {home}"
            ),
            &types,
        ),
        insert: keep(
            if tables.has_home {
                format!(
                    "INSERT INTO {table} ({cols}, mark, home) VALUES ({params}, ${}) ON CONFLICT DO NOTHING RETURNING mark, {limit}, home",
                    n + 1
                )
            } else {
                format!("INSERT INTO {table} ({cols}, mark) VALUES ({params}) ON CONFLICT DO NOTHING RETURNING mark, {limit}, {home}")
            },
            &write_types,
        ),
        // Read-only, so it also runs on a hot standby.
        read: client
            .prepare(format!("SELECT mark, {limit}, {home} FROM {table} WHERE {key_cond}").as_str(), key_types)
            .unwrap_or_else(|e| panic!("pg_ticket: cannot prepare the mark read: {e}"))
            .keep(),
        // Without the column no limit can have been set (set_*_limit come
        // with the update), so the unused parameter is left alone.
        write: keep(
            if tables.has_limits {
                format!("UPDATE {table} SET mark = ${n}, max_mark = ${} WHERE {key_cond}", n + 1)
            } else {
                format!("UPDATE {table} SET mark = ${n} WHERE {key_cond}")
            },
            &write_types,
        ),
    }
}

/// Runs `f` with SPI connected, as the state tables' owner, with this kind's
/// statements prepared.
fn with_statements<R>(kind: Kind, f: impl FnOnce(&mut SpiClient<'_>, &Statements) -> R) -> R {
    let tables = state_tables::current();
    as_owner_of(kind.table(&tables), || Spi::connect_mut(|client| {
        STATEMENTS.with(|all| {
            let slot = &mut all[kind as usize];
            if slot.as_ref().is_none_or(|(prepared_for, _)| *prepared_for != tables) {
                *slot = Some((tables, prepare(client, kind, tables)));
            }
            f(client, &slot.as_ref().unwrap().1)
        })
    }))
}

/// The key columns' values, then `values` (int8).
fn args<'a>(a: Name<'a>, b: Name<'a>, kind: Kind, values: &[i64]) -> Vec<DatumWithOid<'a>> {
    let mut v = vec![a.to_datum()];
    if kind == Kind::Scope {
        v.push(b.to_datum());
    }
    v.extend(values.iter().map(|n| DatumWithOid::from(*n)));
    v
}

/// A row: its mark and limit, and its home node (None: none recorded).
type Row = (Mark, Option<i64>);

fn first_row(client: &mut SpiClient<'_>, stmt: &OwnedPreparedStatement, args: &[DatumWithOid<'_>]) -> Option<Row> {
    mark_of(client.update(stmt, Some(1), args))
}

/// The row of `(a, b)` through the read-only statement (no row: None).
fn select_mark(client: &SpiClient<'_>, st: &Statements, kind: Kind, a: Name<'_>, b: Name<'_>) -> Option<Row> {
    mark_of(client.select(&st.read, Some(1), &args(a, b, kind, &[])))
}

fn mark_of(result: pgrx::spi::SpiResult<pgrx::spi::SpiTupleTable<'_>>) -> Option<Row> {
    let table = result.unwrap_or_else(|e| pgrx::error!("pg_ticket: {e}"));
    if table.is_empty() {
        return None;
    }
    let (mark, limit, home) = table.first().get_three::<i64, i64, i64>().unwrap_or_else(|e| pgrx::error!("pg_ticket: {e}"));
    Some((Mark { mark: mark.expect("mark is NOT NULL"), limit: limit.expect("max_mark is NOT NULL") }, home))
}

/// Outcome of locking a row and taking `n` from it.
pub enum Locked {
    /// The row is locked by this transaction and holds this new mark.
    Took(Mark),
    /// The row exists with this mark, and taking `n` would pass its limit.
    WouldOverflow(Mark),
}

/// Lock the row of `(a, b)` (creating it with mark 0 if new) and take `n`
/// values in the same write. Waits for a transaction that holds the row.
pub fn lock_and_take(kind: Kind, a: Name<'_>, b: Name<'_>, n: i64) -> Locked {
    // The caller, before the switch to the tables' owner: a new row counts
    // against the role that made it (`crate::quota`).
    let creator = crate::quota::creator();
    with_statements(kind, |client, st| {
        // SPEC §19.3: a row of another node's home is refused (what this
        // transaction's UPDATE took, the error rolls back); one of no home,
        // in a group, becomes the home of the node that creates scopes.
        let at_home = |client: &mut SpiClient<'_>, (row, home): Row| {
            match crate::group::check_home(&kind.label(a, b), home).unwrap_or_else(|e| e.raise()) {
                crate::group::AtHome::Yes => {}
                crate::group::AtHome::Claim => {
                    let (table, keys) = table(kind);
                    let key_cond = key_cond(keys);
                    client
                        .update(
                            &format!("UPDATE {table} SET home = ${} WHERE {key_cond} AND home IS NULL", keys.len() + 1),
                            None,
                            &args(a, b, kind, &[crate::group::node_id()]),
                        )
                        .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot record the home of {}: {e}", kind.label(a, b)));
                }
            }
            row
        };
        let with_n = args(a, b, kind, &[n]);
        // A few rounds cover "created concurrently between our UPDATE and
        // INSERT"; under REPEATABLE READ the INSERT itself raises 40001.
        for _ in 0..3 {
            if let Some(row) = first_row(client, &st.bump, &with_n) {
                return Locked::Took(at_home(client, row));
            }
            if let Some(row) = select_mark(client, st, kind, a, b) {
                let row = at_home(client, row);
                if row.mark.checked_add(n).is_none_or(|m| m > row.limit) {
                    return Locked::WouldOverflow(row);
                }
                continue; // created since the UPDATE looked: take from it
            }
            // A new row: room for it is checked first, and it is counted
            // (at the transaction's pre-commit, `crate::quota`); in a group
            // of primaries, only the node that creates scopes makes it.
            crate::quota::check_room(creator).unwrap_or_else(|e| e.about(kind.label(a, b)).raise());
            crate::group::check_may_create(&kind.label(a, b)).unwrap_or_else(|e| e.raise());
            let mut insert_args = args(a, b, kind, &[n]);
            insert_args.push(crate::group::home_of_new().into());
            if let Some(row) = first_row(client, &st.insert, &insert_args) {
                crate::quota::created(creator);
                return Locked::Took(at_home(client, row));
            }
        }
        pgrx::error!(
            "pg_ticket: could not lock the row for {}; it was changed concurrently, retry the transaction",
            a.quoted()
        )
    })
}

/// The committed mark as this transaction's snapshot sees it (0: never used).
pub fn read(kind: Kind, a: Name<'_>, b: Name<'_>) -> i64 {
    with_statements(kind, |client, st| select_mark(client, st, kind, a, b).map_or(0, |(row, _)| row.mark))
}

/// Store `row` in the row this transaction has locked. A row that is not
/// there (someone deleted it behind the functions' back) is an error: the
/// values taken from it would otherwise be handed out again.
pub fn write(kind: Kind, a: Name<'_>, b: Name<'_>, row: Mark) {
    let Mark { mark, limit } = row;
    let updated = with_statements(kind, |client, st| {
        client
            .update(&st.write, None, &args(a, b, kind, &[mark, limit]))
            .unwrap_or_else(|e| pgrx::error!("pg_ticket: {e}"))
            .len()
    });
    if updated != 1 {
        pgrx::ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
            format!(
                "pg_ticket: the row of {} {} was not found at commit; its mark {mark} could not be stored",
                kind.what(),
                a.quoted()
            )
        );
    }
}

/// SPEC §17.3: a row of `(a, b)` loaded from outside (a restore into a used
/// database) meets the row here: the mark becomes the higher of the two.
/// False if there is no row (the load inserts it).
pub fn merge_loaded(kind: Kind, a: Name<'_>, b: Name<'_>, mark: i64) -> bool {
    let (table, keys) = table(kind);
    let sql = format!("UPDATE {table} SET mark = GREATEST(mark, ${}) WHERE {} RETURNING mark", keys.len() + 1, key_cond(keys));
    let tables = state_tables::current();
    as_owner_of(kind.table(&tables), || {
        Spi::connect_mut(|client| client.update(sql.as_str(), Some(1), &args(a, b, kind, &[mark])).map(|rows| !rows.is_empty()))
    })
    .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot merge a loaded row into {table}: {e}"))
}
