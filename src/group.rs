//! A group of primaries replicating to each other (SPEC §19.3): which node
//! this is, which nodes the database knows (`pgticket.nodes`, a table of
//! the group: each node writes its own row, the others arrive by
//! replication), and the rule for gap-free scopes and block names — one
//! home node at a time, new ones created on the one node of the group
//! set to (`pg_ticket.creates_scopes`).
//!
//! A node is its system identifier (a physical standby promoted in its
//! place is the same node; `pg_createsubscriber` gives a converted standby
//! a new one). A database is in a group once it knows another node, or
//! subscribes to a publication: then a new scope waits until every
//! publisher it subscribes to has announced itself (a node that has not
//! may be creating the same scope), and is refused while two nodes are
//! set to create.
//!
//! Touches: `pgticket.nodes` (as its owner), the catalogs `pg_subscription`
//! and pglogical's `subscription` table where it exists (read only).

use pgrx::prelude::*;

use crate::backend_local::{BackendLocal, BackendRefCell};
use ticket_core::group::{Node, Refusal, Use, View};
use crate::errors::TicketError;
use crate::settings;
use crate::state_tables;

/// This server as a node of a group: its system identifier.
pub fn node_id() -> i64 {
    unsafe { pg_sys::GetSystemIdentifier() as i64 }
}

/// This node's name: `pg_ticket.node_name`, else `cluster_name`, else its
/// system identifier.
pub fn node_name() -> String {
    if let Some(name) = settings::node_name() {
        return name;
    }
    let cluster = unsafe { pg_sys::cluster_name };
    if !cluster.is_null() {
        let name = unsafe { std::ffi::CStr::from_ptr(cluster) }.to_string_lossy().into_owned();
        if !name.is_empty() {
            return name;
        }
    }
    node_id().to_string()
}

const NODE_COLUMNS: &str = "node, name, creates_scopes, machine_id, ticket_offset, ticket_increment, epoch_ms, machine_bits";

fn nodes(client: &pgrx::spi::SpiClient<'_>) -> Result<Vec<Node>, pgrx::spi::Error> {
    client
        .select(&format!("SELECT {NODE_COLUMNS} FROM pgticket.nodes"), None, &[])?
        .map(|row| {
            Ok(Node {
                id: row.get::<i64>(1)?.unwrap_or_default(),
                name: row.get::<String>(2)?.unwrap_or_default(),
                creates_scopes: row.get::<bool>(3)?.unwrap_or_default(),
                machine_id: row.get::<i32>(4)?,
                ticket_offset: row.get::<i64>(5)?.unwrap_or_default(),
                ticket_increment: row.get::<i64>(6)?.unwrap_or_default(),
                epoch_ms: row.get::<i64>(7)?.unwrap_or_default(),
                machine_bits: row.get::<i64>(8)?.unwrap_or_default(),
            })
        })
        .collect()
}

/// This node as its settings say now.
fn me() -> Node {
    let series = settings::ticket_series();
    Node {
        id: node_id(),
        name: node_name(),
        creates_scopes: settings::creates_scopes(),
        machine_id: match settings::machine_id() {
            settings::MachineId::Fixed(id) if settings::preloaded() => Some(i32::from(id)),
            _ => None,
        },
        ticket_offset: series.offset,
        ticket_increment: series.increment,
        epoch_ms: settings::epoch_unix_ms(),
        machine_bits: i64::from(settings::layout().machine_bits()),
    }
}

/// How many subscriptions of this database bring other nodes' rows of
/// `pgticket.nodes`: native ones with that table among their relations (a
/// subscription to an unrelated feed is no group: review of #47, it
/// refused every allocator for good; nor is a second subscription to a
/// node for some of pg_ticket's tables without it, which refused for good
/// too, counted as a node unheard of), and every pglogical one (its
/// replication sets are the provider's to know).
fn subscriptions(client: &pgrx::spi::SpiClient<'_>) -> Result<i64, pgrx::spi::Error> {
    let native: i64 = client
        .select(
            "SELECT pg_catalog.count(DISTINCT r.srsubid) FROM pg_catalog.pg_subscription_rel r \
               JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) r.srrelid \
              WHERE c.relnamespace OPERATOR(pg_catalog.=) 'pgticket'::pg_catalog.regnamespace \
                AND c.relname OPERATOR(pg_catalog.=) 'nodes'::pg_catalog.name",
            None,
            &[],
        )?
        .first()
        .get_one()?
        .unwrap_or(0);
    // pglogical's table, found as a member of the pglogical extension, not
    // by name: this runs as the state tables' owner, and a schema called
    // pglogical with a view called subscription is anyone's to make who may
    // CREATE in the database (review of #47: the view ran the caller's code
    // as a superuser, SPEC §20.1). Only an extension's script, or its owner,
    // makes a member; a member table runs no code when read.
    let members = client
        .select(
            "SELECT pg_catalog.format('%I.%I', n.nspname, c.relname) FROM pg_catalog.pg_extension e \
               JOIN pg_catalog.pg_depend d ON d.refobjid OPERATOR(pg_catalog.=) e.oid \
                AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass \
                AND d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass \
                AND d.deptype OPERATOR(pg_catalog.=) 'e'::pg_catalog.\"char\" \
               JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) d.objid \
                AND c.relname OPERATOR(pg_catalog.=) 'subscription'::pg_catalog.name \
                AND c.relkind OPERATOR(pg_catalog.=) 'r'::pg_catalog.\"char\" \
               JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace \
              WHERE e.extname OPERATOR(pg_catalog.=) 'pglogical'::pg_catalog.name",
            None,
            &[],
        )?;
    let pglogical_table: Option<String> = if members.is_empty() { None } else { members.first().get_one()? };
    let pglogical: i64 = match pglogical_table {
        Some(table) => client.select(&format!("SELECT pg_catalog.count(*) FROM {table}"), None, &[])?.first().get_one()?.unwrap_or(0),
        None => 0,
    };
    Ok(native + pglogical)
}

/// How `announce` writes this node's row.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Announce<'a> {
    /// Only when it differs: no write, and no row lock, for a node whose
    /// row is current.
    IfChanged,
    /// Always (`join_group()`): a node added since, subscribed without the
    /// initial copy, hears of this one only from a write (review of #47).
    Again,
    /// Always, and over a row of this identity under the name given (the
    /// node renamed).
    Renamed(&'a str),
}

/// This node's row as the settings say now. A row of this identity under
/// another name is refused unless the node was renamed from it: it is
/// otherwise the row of the node this server is a copy of (review of #47:
/// a copy promoted under another name overwrote it here and served the
/// original's scopes).
fn announce(client: &mut pgrx::spi::SpiClient<'_>, how: Announce<'_>) -> Result<(), pgrx::spi::Error> {
    let me = me();
    let mine = nodes(client)?.into_iter().find(|n| n.id == me.id);
    if let Some(mine) = &mine {
        if settings::node_name().is_some() && mine.name != me.name && how != Announce::Renamed(&mine.name) {
            refused("this server", Refusal::CopyOf { name: mine.name.clone() }).raise();
        }
    }
    if how == Announce::IfChanged && mine.as_ref() == Some(&me) {
        return Ok(());
    }
    // Deleted and inserted, not updated: an UPDATE of a row a subscriber
    // lacks (a node added without the initial copy) is skipped there.
    delete_node(client, me.id)?;
    client.update(
        &format!(
            "INSERT INTO pgticket.nodes ({NODE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (node) DO UPDATE SET name = EXCLUDED.name, creates_scopes = EXCLUDED.creates_scopes, \
                 machine_id = EXCLUDED.machine_id, ticket_offset = EXCLUDED.ticket_offset, ticket_increment = EXCLUDED.ticket_increment, \
                 epoch_ms = EXCLUDED.epoch_ms, machine_bits = EXCLUDED.machine_bits, announced_at = pg_catalog.now()"
        ),
        None,
        &[
            me.id.into(),
            me.name.clone().into(),
            me.creates_scopes.into(),
            me.machine_id.into(),
            me.ticket_offset.into(),
            me.ticket_increment.into(),
            me.epoch_ms.into(),
            me.machine_bits.into(),
        ],
    )?;
    Ok(())
}

/// Called by `replicated` for a replicated INSERT of another node's row:
/// the row here, if any, makes way for it.
pub fn forget_node(node: i64) {
    let Some(table) = nodes_table() else { return };
    state_tables::as_owner_of(table, || Spi::connect_mut(|client| delete_node(client, node)))
        .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot merge a replicated row of pgticket.nodes: {e}"));
}

fn delete_node(client: &mut pgrx::spi::SpiClient<'_>, node: i64) -> Result<(), pgrx::spi::Error> {
    client.update("DELETE FROM pgticket.nodes WHERE node OPERATOR(pg_catalog.=) $1", None, &[node.into()]).map(|_| ())
}

fn nodes_table() -> Option<state_tables::Table> {
    state_tables::lookup().and_then(|t| t.nodes)
}

/// Written when a row naming this node's identity under another name
/// arrives by replication: another server of the group is a copy of this
/// one (a base backup made into a node keeps its system identifier), and
/// the two would pass for one node (review of #47: both served the same
/// gap-free scopes). Every group rule refuses while it is there; an
/// administrator removes it once the copy is made anew.
pub const CLASH_FILE: &str = "pg_ticket_node.clash";

fn clash() -> Option<String> {
    std::fs::read_to_string(CLASH_FILE).ok().map(|text| text.trim().to_string())
}

/// Called by `replicated` for such a row (in the apply worker).
pub fn record_clash(other_name: &str) {
    if clash().is_none() {
        if let Err(e) = ticket_core::snowflake::write_atomically(std::path::Path::new(CLASH_FILE), &format!("{other_name}\n")) {
            pgrx::warning!("pg_ticket: cannot record {CLASH_FILE}: {e}");
        }
    }
    pgrx::warning!(
        "pg_ticket: node {other_name:?} of this group has this server's system identifier (a copy of it, made from a base backup?): gap-free scopes, tickets and snowflakes are refused here until it is made anew and {CLASH_FILE} removed"
    );
}

/// What this database knows of its group, read as the nodes table's owner
/// (`with_subscriptions`: counted too, two catalog reads).
fn view(table: state_tables::Table, with_subscriptions: bool) -> View {
    let me = node_id();
    state_tables::as_owner_of(table, || {
        Spi::connect(|client| {
            let (mine, others): (Vec<Node>, Vec<Node>) = nodes(client)?.into_iter().partition(|n| n.id == me);
            let subscriptions = if with_subscriptions { subscriptions(client)? } else { 0 };
            Ok::<_, pgrx::spi::Error>(View { mine: mine.into_iter().next(), others, subscriptions, clash: clash(), named: settings::node_name().is_some() })
        })
    })
    .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot read pgticket.nodes: {e}"))
}

/// What this node may do by its group's rule, as last looked at: whether
/// the database is alone, and the leave for each use. Looked at again when
/// a state table (`pgticket.nodes` among them) or a subscription changes
/// (a relcache and a syscache callback), and every few seconds (pglogical's
/// subscriptions send no invalidation).
#[derive(Clone)]
struct Leave {
    alone: bool,
    /// `View::identity`: whether this server is the node it says.
    identity: Result<(), Refusal>,
    of: [Result<(), Refusal>; 3],
}

static LEAVE: BackendRefCell<Option<(u64, u64, i64, Leave)>> = BackendRefCell::new();
/// Moved by every change of `pg_subscription` or `pg_subscription_rel`.
static SUBSCRIPTIONS_CHANGED: BackendLocal<u64> = BackendLocal::new(0);
static CALLBACK_REGISTERED: BackendLocal<bool> = BackendLocal::new(false);
const LOOK_AGAIN_MS: i64 = 5_000;

#[pg_guard]
unsafe extern "C-unwind" fn on_subscription_change(_arg: pg_sys::Datum, _cache: i32, _hash: u32) {
    SUBSCRIPTIONS_CHANGED.set(SUBSCRIPTIONS_CHANGED.get().wrapping_add(1));
}

fn slot(what: Use) -> usize {
    match what {
        Use::Tickets => 0,
        Use::Snowflakes => 1,
        Use::NewScope => 2,
    }
}

fn leave() -> Option<Leave> {
    let table = nodes_table()?;
    if !CALLBACK_REGISTERED.replace(true) {
        for cache in [pg_sys::SysCacheIdentifier::SUBSCRIPTIONOID, pg_sys::SysCacheIdentifier::SUBSCRIPTIONRELMAP] {
            unsafe { pg_sys::CacheRegisterSyscacheCallback(cache as i32, Some(on_subscription_change), pg_sys::Datum::from(0)) };
        }
    }
    let (generation, subscriptions) = (state_tables::generation(), SUBSCRIPTIONS_CHANGED.get());
    let now = crate::clock::now_unix_ms();
    let cached = LEAVE.with(|c| {
        c.as_ref()
            .and_then(|(g, s, at, leave)| (*g == generation && *s == subscriptions && now.saturating_sub(*at) < LOOK_AGAIN_MS).then(|| leave.clone()))
    });
    Some(cached.unwrap_or_else(|| {
        let (view, me) = (view(table, true), me());
        let leave = Leave {
            alone: view.alone(),
            identity: view.identity(&me),
            of: [Use::Tickets, Use::Snowflakes, Use::NewScope].map(|what| view.check(&me, what)),
        };
        LEAVE.with(|c| *c = Some((generation, subscriptions, now, leave.clone())));
        leave
    }))
}

/// Whether this database is in a group (it knows another node, or a
/// subscription of it carries pg_ticket's tables).
pub fn in_group() -> bool {
    leave().is_some_and(|l| !l.alone)
}

/// The home a new scope or block name gets: this node in a group, none on
/// a server alone (a dump of it restored elsewhere is served there).
pub fn home_of_new() -> Option<i64> {
    in_group().then(node_id)
}

/// SPEC §19.3: may this node create the gap-free scope or block name
/// `label` now? On a server alone always (unless set not to create); in a
/// group only on the one node set to create, once every node it subscribes
/// to has announced itself and its own row says what its settings say.
pub fn check_may_create(label: &str) -> Result<(), TicketError> {
    check(Use::NewScope, &format!("{label} is new"))
}

/// SPEC §19.3: may this node hand out tickets / stamp snowflakes with its
/// fixed machine id, by its group's rule?
pub fn check_allocator(what: Use) -> Result<(), TicketError> {
    let subject = match what {
        Use::Tickets => "next_ticket() on this node",
        _ => "snowflake_id() on this node",
    };
    check(what, subject)
}

fn check(what: Use, subject: &str) -> Result<(), TicketError> {
    match leave() {
        None => Ok(()),
        Some(leave) => leave.of[slot(what)].clone().map_err(|r| refused(subject, r)),
    }
}

fn refused(subject: &str, refusal: Refusal) -> TicketError {
    let (why, hint) = match refusal {
        Refusal::NotCreator { creator: Some(name) } => (
            "this node is set not to create them (pg_ticket.creates_scopes = off)".to_string(),
            format!("Create it on node {name:?}, the one set to create new scopes (docs/multi-primary.md)."),
        ),
        Refusal::NotCreator { creator: None } => (
            "this node is set not to create them (pg_ticket.creates_scopes = off)".to_string(),
            "Create it on the node of the group set to create new scopes (pg_ticket.creates_scopes = on), or set it on here and reload (docs/multi-primary.md).".into(),
        ),
        Refusal::NotAnnounced => (
            "this node of a group of primaries has not announced itself as it is set now (pgticket.nodes)".into(),
            "Run SELECT pgticket.join_group(); here (after every change of its pg_ticket settings), and wait for its row to reach the other nodes (docs/multi-primary.md).".into(),
        ),
        Refusal::OthersNotAnnounced { subscriptions, known } => (
            format!(
                "this database subscribes to {subscriptions} publication(s) but knows {known} other node(s) of its group (pgticket.nodes): a node not announced yet may be handing out the same values"
            ),
            "Run SELECT pgticket.join_group(); in this database on every node of the group, and wait for the rows to replicate (docs/multi-primary.md).".into(),
        ),
        Refusal::CopyOf { name } => (
            format!("this server's system identifier is node {name:?}'s in pgticket.nodes, and this server is named {:?}: a copy of {name:?} (a base backup or a standby promoted under another name) would hand out {name:?}'s numbers", node_name()),
            format!("If this server is node {name:?} renamed, SELECT pgticket.join_group(renamed_from => '{}'); if it is a copy, make it a node of its own (pg_createsubscriber, or initdb and a logical copy) (docs/multi-primary.md).", name.replace('\'', "''")),
        ),
        Refusal::IdentityClash { other } => (
            format!("node {other:?} of this group has this server's system identifier: a copy of it (made from a base backup?) passes for this node"),
            format!("Make that node anew with its own identifier (initdb and a logical copy, or pg_createsubscriber), then remove {CLASH_FILE} from this server's data directory (docs/multi-primary.md)."),
        ),
        Refusal::Conflict { node, why } => (
            format!("node {node:?} of this group conflicts: {why}"),
            "Set the nodes apart (docs/multi-primary.md, each allocator in a group), reload or restart, and SELECT pgticket.join_group() on each.".into(),
        ),
    };
    TicketError::NotInGroupRule { what: format!("{subject}, and {why}"), hint }
}

/// What a row's home says of using it here (SPEC §19.3).
pub enum AtHome {
    Yes,
    /// A row of no home (made before 0.5.0, or before the database joined
    /// a group), in a group, on the node that creates scopes: it becomes
    /// this node's.
    Claim,
}

/// SPEC §19.3: a scope or block name whose home is another node is refused
/// here; one of no home, in a group, is used on the node that creates
/// scopes only (which claims it).
pub fn check_home(label: &str, home: Option<i64>) -> Result<AtHome, TicketError> {
    let me = node_id();
    // Not on a copy of a node, nor beside one: it passes for the home too.
    if let Some(Err(refusal)) = leave().map(|l| l.identity) {
        return Err(refused(&format!("{label} is served by the node this server is"), refusal));
    }
    let Some(home) = home else {
        // No home (before 0.5.0, or before the database joined a group): in
        // a group, used on the node that creates scopes only, once the
        // group's rule lets it create (review of #47: every node served
        // it until both had joined).
        return match leave() {
            Some(leave) if !leave.alone => match &leave.of[slot(Use::NewScope)] {
                Ok(()) => Ok(AtHome::Claim),
                Err(refusal) => Err(refused(&format!("{label} has no home node (made before this database joined a group of primaries), and it is used, and taken as its home, where a new one could be made"), refusal.clone())),
            },
            _ => Ok(AtHome::Yes),
        };
    };
    if home == me {
        return Ok(AtHome::Yes);
    }
    // A database alone (restored from a group member's dump: pgticket.nodes
    // is not dumped) serves what it holds; one that subscribes to pg_ticket's
    // tables is a member that may not have heard of its group yet.
    if !in_group() {
        return Ok(AtHome::Yes);
    }
    let name = nodes_table()
        .and_then(|table| view(table, false).others.into_iter().find(|n| n.id == home).map(|n| n.name))
        .unwrap_or_else(|| home.to_string());
    Err(TicketError::NotInGroupRule {
        what: format!("{label} has its home on node {name:?} of this group: its numbers come from one node at a time"),
        hint: format!(
            "Call it on node {name:?}, or move its home here: on {name:?}, SELECT pgticket.move_home(...) naming this node {:?} (docs/multi-primary.md, the handover).",
            node_name()
        ),
    })
}

/// A change of `pgticket.nodes` (a node announced, replicated or by hand)
/// reaches every session's cached view of its group.
#[pg_trigger(sql = false)]
fn nodes_changed<'a>(trigger: &'a pgrx::PgTrigger<'a>) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, pgrx::PgTriggerError> {
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(trigger.relation()?.oid()) };
    Ok(None)
}

/// Announces this node in `pgticket.nodes` (its name, whether it creates
/// scopes, its allocators' settings), as every node of a group does once
/// and after each change of those settings; written every time, so a node
/// added since hears of it. `renamed_from`: this node's former name, the
/// one its row has (without it, that row is taken for the row of the node
/// this server is a copy of). Returns its name.
#[pg_extern(name = "join_group", schema = "pgticket", volatile)]
fn join_group(renamed_from: default!(Option<&str>, "NULL")) -> String {
    crate::errors::postgres_errors_as_raised(|| {
        crate::xact::check_writable().unwrap_or_else(|e| e.raise());
        let table = nodes_table().unwrap_or_else(|| pgrx::error!("pg_ticket: pgticket.nodes is missing; run ALTER EXTENSION pg_ticket UPDATE"));
        let how = renamed_from.map_or(Announce::Again, Announce::Renamed);
        state_tables::as_owner_of(table, || Spi::connect_mut(|client| announce(client, how)))
            .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot write pgticket.nodes: {e}"));
        node_name()
    })
}

/// SPEC §19.3, the handover: the home of scope `(queue, domain)` (or, with
/// `domain` NULL and `kind` 'block', of block name `queue`) moves to node
/// `to_node`. On the current home it moves with the mark the home
/// committed (the row's UPDATE carries both: the new home starts above).
/// Elsewhere (the home is down) only with `above`: the caller vouches that
/// the old home committed nothing above it, and this node takes the home.
/// `to_node` NULL: this node.
#[pg_extern(name = "move_home", schema = "pgticket", volatile)]
fn move_home(
    kind: Option<&str>,
    queue: Option<&str>,
    domain: default!(Option<&str>, "NULL"),
    to_node: default!(Option<&str>, "NULL"),
    above: default!(Option<i64>, "NULL"),
) -> bool {
    crate::errors::postgres_errors_as_raised(|| {
        let kind = kind.unwrap_or_else(|| TicketError::NullArgument("kind").raise());
        let queue = queue.unwrap_or_else(|| TicketError::NullArgument("queue").raise());
        let to_node = to_node.map(str::to_string).unwrap_or_else(node_name);
        let to_node = to_node.as_str();
        crate::xact::check_writable().unwrap_or_else(|e| e.raise());
        let tables = state_tables::current();
        let (table, relation, key) = match (kind, domain) {
            ("scope", Some(_)) => (tables.scoped_counters, "pgticket.scoped_counters", "queue OPERATOR(pg_catalog.=) $1 AND domain OPERATOR(pg_catalog.=) $2"),
            ("block", None) => (tables.blocks, "pgticket.blocks", "name OPERATOR(pg_catalog.=) $1"),
            _ => TicketError::InvalidArgument("kind is 'scope' (with a domain) or 'block' (domain NULL)".into()).raise(),
        };
        let nodes_table = nodes_table().unwrap_or_else(|| pgrx::error!("pg_ticket: pgticket.nodes is missing; run ALTER EXTENSION pg_ticket UPDATE"));
        let target = state_tables::as_owner_of(nodes_table, || {
            Spi::connect_mut(|client| {
                announce(client, Announce::IfChanged)?;
                Ok::<_, pgrx::spi::Error>(nodes(client)?.into_iter().find(|n| n.name == to_node).map(|n| n.id))
            })
        })
        .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot read pgticket.nodes: {e}"))
        .unwrap_or_else(|| TicketError::InvalidArgument(format!("no node named {to_node:?} in pgticket.nodes (SELECT pgticket.join_group() on it)")).raise());
        let me = node_id();
        state_tables::as_owner_of(table, || {
            Spi::connect_mut(|client| {
                let keys = || -> Vec<pgrx::datum::DatumWithOid> {
                    match domain {
                        Some(d) => vec![queue.into(), d.into()],
                        None => vec![queue.into()],
                    }
                };
                let row = client.update(&format!("SELECT home, mark FROM {relation} WHERE {key} FOR UPDATE"), Some(1), &keys())?;
                if row.is_empty() {
                    TicketError::InvalidArgument(format!("no {kind} {queue:?} here")).raise();
                }
                let home: Option<i64> = row.first().get_one()?;
                // A row of no home is this node's to hand over only where
                // it would claim it at its first use (review of #47: any
                // node, a non-creator too, moved it without `above`).
                let here = match home {
                    Some(home) => home == me && leave().is_none_or(|l| l.identity.is_ok()),
                    None => leave().is_none_or(|l| l.alone || l.of[slot(Use::NewScope)].is_ok()),
                };
                if !here && (above.is_none() || target != me) {
                    TicketError::InvalidArgument(format!(
                        "{kind} {queue:?} is not this node's to hand over (its home is another node, or it has none and this node does not take it): move it on its home, or take it here with above => a value at or past everything the old home committed (and to_node => this node)"
                    ))
                    .raise();
                }
                let n = keys().len() + 1;
                let mut update_args = keys();
                update_args.push(target.into());
                update_args.push(above.unwrap_or(0).into());
                client.update(
                    &format!(
                        "UPDATE {relation} SET home = ${n}, home_moves = home_moves OPERATOR(pg_catalog.+) 1, \
                                mark = GREATEST(mark, ${}), max_mark = GREATEST(max_mark, ${}) WHERE {key}",
                        n + 1,
                        n + 1
                    ),
                    None,
                    &update_args,
                )?;
                Ok::<_, pgrx::spi::Error>(true)
            })
        })
        .unwrap_or_else(|e| pgrx::error!("pg_ticket: cannot move the home: {e}"))
    })
}

extension_sql!(
    r#"
-- 0.5.0 (SPEC s.19.3): the nodes of a group of primaries this database
-- knows (each node writes its own row with pgticket.join_group(); the
-- others arrive by replication), and each gap-free series' home node (none
-- on a server alone) with the count of handovers that moved it.
CREATE TABLE pgticket.nodes (
    node bigint PRIMARY KEY,
    name text NOT NULL,
    creates_scopes boolean NOT NULL,
    machine_id integer,
    ticket_offset bigint NOT NULL,
    ticket_increment bigint NOT NULL,
    epoch_ms bigint NOT NULL,
    machine_bits bigint NOT NULL,
    announced_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE pgticket.nodes IS
    'The nodes of the group of primaries this database replicates with (system identifier, name, whether it creates new gap-free scopes, fixed machine id, ticket series, snowflake space), each written by its own node';
REVOKE ALL ON pgticket.nodes FROM PUBLIC;
CREATE FUNCTION pgticket.nodes_changed() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'nodes_changed_wrapper';
REVOKE ALL ON FUNCTION pgticket.nodes_changed() FROM PUBLIC;
COMMENT ON FUNCTION pgticket.nodes_changed() IS
    'Trigger: a change of pgticket.nodes reaches every session';
CREATE TRIGGER changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON pgticket.nodes
    FOR EACH STATEMENT EXECUTE FUNCTION pgticket.nodes_changed();
ALTER TABLE pgticket.nodes ENABLE ALWAYS TRIGGER changed;
CREATE TRIGGER by_replication BEFORE INSERT OR UPDATE OR DELETE ON pgticket.nodes
    FOR EACH ROW EXECUTE FUNCTION pgticket.by_replication();
ALTER TABLE pgticket.nodes ENABLE REPLICA TRIGGER by_replication;
ALTER TABLE pgticket.scoped_counters ADD COLUMN home bigint, ADD COLUMN home_moves bigint NOT NULL DEFAULT 0;
ALTER TABLE pgticket.blocks ADD COLUMN home bigint, ADD COLUMN home_moves bigint NOT NULL DEFAULT 0;
REVOKE EXECUTE ON FUNCTION pgticket.join_group(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgticket.move_home(text, text, text, text, bigint) FROM PUBLIC;
COMMENT ON FUNCTION pgticket.join_group(text) IS
    'Announces this node in pgticket.nodes (its name, whether it creates new gap-free scopes, its allocators'' settings) to the group of primaries, renamed_from its former name if it was renamed; returns its name';
COMMENT ON FUNCTION pgticket.move_home(text, text, text, text, bigint) IS
    'Moves the home node of a gap-free scope (kind scope) or block name (kind block, domain NULL) to node to_node: on its home, with its mark; elsewhere only with above, a value past all the old home committed';
-- 0.5.0 (review of #47): subscriptions made before pg_ticket carry its
-- state tables only after a refresh; until then the nodes do not hear of
-- each other and each takes itself for a server alone.
DO $$
DECLARE
    n bigint;
BEGIN
    SELECT pg_catalog.count(*) INTO n FROM pg_catalog.pg_subscription s
     WHERE s.subdbid OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database());
    IF n OPERATOR(pg_catalog.>) 0 THEN
        RAISE WARNING 'pg_ticket: this database has % subscription(s) made before pg_ticket''s state tables: they carry them only after ALTER SUBSCRIPTION ... REFRESH PUBLICATION', n
            USING HINT = 'In a group of primaries, refresh each subscription on every node (WITH (copy_data = false) where the nodes already hold the same rows), then SELECT pgticket.join_group() on every node (docs/multi-primary.md); a subscription to a one-way feed needs nothing.';
    END IF;
END $$;
"#,
    name = "group",
    requires = ["by_replication", join_group, move_home, "schema"]
);
