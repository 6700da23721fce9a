//! The rules of a group of primaries replicating to each other (SPEC
//! §19.3), as decisions over what a database knows of its group: this
//! node's settings, its own row in the group's table of nodes (what the
//! other nodes know of it), the other nodes' rows, and how many
//! subscriptions the database has.
//!
//! A database is alone when it knows no other node and subscribes to
//! nothing: no rule applies. Otherwise every node must have announced
//! itself as it is set now (else the others judge it by a stale row), every
//! node it subscribes to must have announced itself (a node not heard of
//! may be handing out the same values), and then:
//! - tickets: every node the same increment, each its own offset;
//! - snowflakes: every node its own fixed machine id, or every node
//!   leasing (from one registry: not checked here), never the two mixed;
//!   one epoch and machine-bit layout for all;
//! - new gap-free scopes and block names: created on one node only.

/// A node as its row in the group's table says (or, for this node, as its
/// settings say now).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub id: i64,
    pub name: String,
    pub creates_scopes: bool,
    /// The fixed snowflake machine id (None: leased, or none).
    pub machine_id: Option<i32>,
    pub ticket_offset: i64,
    pub ticket_increment: i64,
    pub epoch_ms: i64,
    pub machine_bits: i64,
}

/// What a database knows of its group.
#[derive(Clone, Debug, Default)]
pub struct View {
    /// This node's row, as the other nodes know it.
    pub mine: Option<Node>,
    pub others: Vec<Node>,
    pub subscriptions: i64,
    /// The name of another server seen with this node's identity (a copy
    /// of it made from a base backup), if one was.
    pub clash: Option<String>,
    /// This node's name is set (`pg_ticket.node_name`), not taken from
    /// `cluster_name` or the system identifier, which differ between a
    /// primary and the standby promoted in its place (helper-10): only a
    /// set name tells a copy from the node itself.
    pub named: bool,
}

/// What asks the group's leave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    Tickets,
    Snowflakes,
    NewScope,
}

/// Why the group's rule refuses, naming what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// This node's row is missing or says other settings than it runs with.
    NotAnnounced,
    /// The database subscribes to more publications than it knows nodes.
    OthersNotAnnounced { subscriptions: i64, known: usize },
    /// The rule's conflict with another node.
    Conflict { node: String, why: String },
    /// This node is set not to create scopes.
    NotCreator { creator: Option<String> },
    /// Another server of the group has this node's identity.
    IdentityClash { other: String },
    /// This server holds, under its own identity, the row of a node of
    /// another name: it is a copy of that node (a base backup or standby
    /// promoted under another name: the same system identifier, the same
    /// homes), or that node renamed, which only `join_group(renamed_from)`
    /// says.
    CopyOf { name: String },
}

impl View {
    pub fn alone(&self) -> bool {
        self.others.is_empty() && self.subscriptions == 0
    }

    /// Is this server the node its identity says, as far as the database
    /// knows? Not if a copy of it was seen in the group (the clash record),
    /// nor if its own row names another node, alone too (review of #47: a
    /// copy promoted under another name, subscribing to nothing, served
    /// the original's scopes; at its join_group() it overwrote that row).
    /// What every use asks first, and every scope it would serve.
    pub fn identity(&self, me: &Node) -> Result<(), Refusal> {
        if let Some(other) = &self.clash {
            return Err(Refusal::IdentityClash { other: other.clone() });
        }
        match &self.mine {
            Some(mine) if self.named && mine.name != me.name => Err(Refusal::CopyOf { name: mine.name.clone() }),
            _ => Ok(()),
        }
    }

    /// May `me` (this node, as set now) do `what`?
    pub fn check(&self, me: &Node, what: Use) -> Result<(), Refusal> {
        self.identity(me)?;
        if what == Use::NewScope && !me.creates_scopes {
            return Err(Refusal::NotCreator { creator: self.others.iter().find(|n| n.creates_scopes).map(|n| n.name.clone()) });
        }
        if self.alone() {
            return Ok(());
        }
        if self.mine.as_ref() != Some(me) {
            return Err(Refusal::NotAnnounced);
        }
        if self.subscriptions > self.others.len() as i64 {
            return Err(Refusal::OthersNotAnnounced { subscriptions: self.subscriptions, known: self.others.len() });
        }
        let conflict = |node: &Node, why: String| Err(Refusal::Conflict { node: node.name.clone(), why });
        // Names are how nodes are told apart in refusals and handovers
        // (review of #47: Debian's cluster_name, "15/main", is every
        // node's).
        if let Some(other) = self.others.iter().find(|n| n.name == me.name) {
            return conflict(other, "it has this node's name too (pg_ticket.node_name, else cluster_name): set a name of its own on each node of the group".into());
        }
        for other in &self.others {
            match what {
                Use::Tickets if other.ticket_increment != me.ticket_increment => {
                    return conflict(
                        other,
                        format!(
                            "it hands out tickets with pg_ticket.ticket_increment = {}, this node with {}: every node of a group uses the same increment",
                            other.ticket_increment, me.ticket_increment
                        ),
                    );
                }
                Use::Tickets if other.ticket_offset == me.ticket_offset => {
                    return conflict(
                        other,
                        format!(
                            "it hands out the same tickets (pg_ticket.ticket_offset = {} of {}): every node of a group its own offset",
                            me.ticket_offset, me.ticket_increment
                        ),
                    );
                }
                Use::Snowflakes if (other.epoch_ms, other.machine_bits) != (me.epoch_ms, me.machine_bits) => {
                    return conflict(
                        other,
                        format!(
                            "it stamps snowflakes with epoch {} ms and {} machine bits, this node with {} ms and {}: one ID space for the group",
                            other.epoch_ms, other.machine_bits, me.epoch_ms, me.machine_bits
                        ),
                    );
                }
                // A registry keeps apart the ids it leases, not the fixed
                // ones of servers it never heard of (review of #47: a fixed
                // id 1 beside a node leasing from '1': 304 822 IDs twice).
                Use::Snowflakes if me.machine_id.is_some() != other.machine_id.is_some() => {
                    let (fixed, leased) = if me.machine_id.is_some() { ("this node", "it") } else { ("it", "this node") };
                    return conflict(
                        other,
                        format!(
                            "{fixed} stamps with a fixed pg_ticket.machine_id and {leased} leases one (pg_ticket.machine_id = -1): a registry does not keep its leases apart from fixed ids; in a group every node has its own fixed id, or every node leases from one registry"
                        ),
                    );
                }
                Use::Snowflakes if me.machine_id.is_some() && other.machine_id == me.machine_id => {
                    return conflict(
                        other,
                        format!("it stamps with the same machine id {} (pg_ticket.machine_id): every node of a group its own", me.machine_id.unwrap_or_default()),
                    );
                }
                Use::NewScope if other.creates_scopes => {
                    return conflict(
                        other,
                        "it is set to create new gap-free scopes too (pg_ticket.creates_scopes), and two nodes creating one scope would hand out the same numbers".into(),
                    );
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// A replicated row's home against the one this node's row has (SPEC
/// §19.3), each `(home, home_moves)`: true to keep this node's. A home moves
/// only by a later handover (more moves; a former home's write arriving
/// late has fewer). Two take-overs of one count, made on two nodes at once
/// (each with `above`, neither seeing the other), settle on the higher node
/// id on every node: the group ends with one home (review of #47: two
/// homes kept serving).
pub fn keeps_home_here(here: Option<(i64, i64)>, incoming: (Option<i64>, i64)) -> bool {
    let Some((home, moves)) = here else { return false };
    let (incoming_home, incoming_moves) = incoming;
    match incoming_moves.cmp(&moves) {
        std::cmp::Ordering::Less => true,
        std::cmp::Ordering::Greater => false,
        std::cmp::Ordering::Equal => incoming_home.is_none_or(|other| other <= home),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: i64, offset: i64, machine_id: i32, creates: bool) -> Node {
        Node {
            id,
            name: format!("n{id}"),
            creates_scopes: creates,
            machine_id: Some(machine_id),
            ticket_offset: offset,
            ticket_increment: 2,
            epoch_ms: 0,
            machine_bits: 10,
        }
    }

    #[test]
    fn a_database_alone_is_ruled_by_nothing_but_its_own_creates_setting() {
        let me = node(1, 1, 1, true);
        let alone = View::default();
        for what in [Use::Tickets, Use::Snowflakes, Use::NewScope] {
            assert_eq!(alone.check(&me, what), Ok(()));
        }
        let off = Node { creates_scopes: false, ..me };
        assert_eq!(alone.check(&off, Use::NewScope), Err(Refusal::NotCreator { creator: None }));
    }

    #[test]
    fn every_node_announces_itself_as_it_is_set_and_hears_of_every_publisher() {
        let me = node(1, 1, 1, true);
        let other = node(2, 2, 2, false);
        let view = View { mine: None, others: vec![other.clone()], subscriptions: 1, clash: None, named: true };
        assert_eq!(view.check(&me, Use::Tickets), Err(Refusal::NotAnnounced));
        let stale = View { mine: Some(Node { ticket_offset: 2, ..me.clone() }), ..view.clone() };
        assert_eq!(stale.check(&me, Use::Tickets), Err(Refusal::NotAnnounced), "a row of other settings");
        let unheard = View { mine: Some(me.clone()), others: vec![], subscriptions: 1, clash: None, named: true };
        assert_eq!(unheard.check(&me, Use::Snowflakes), Err(Refusal::OthersNotAnnounced { subscriptions: 1, known: 0 }));
        let whole = View { mine: Some(me.clone()), others: vec![other], subscriptions: 1, clash: None, named: true };
        for what in [Use::Tickets, Use::Snowflakes, Use::NewScope] {
            assert_eq!(whole.check(&me, what), Ok(()), "{what:?}");
        }
    }

    #[test]
    fn two_nodes_of_one_name_are_refused() {
        let me = node(1, 1, 1, true);
        let twin = Node { name: me.name.clone(), ..node(2, 2, 2, false) };
        let view = View { mine: Some(me.clone()), others: vec![twin], subscriptions: 1, clash: None, named: true };
        assert!(matches!(view.check(&me, Use::Tickets), Err(Refusal::Conflict { why, .. }) if why.contains("name")));
    }

    #[test]
    fn a_copy_of_this_node_in_the_group_stops_everything() {
        let me = node(1, 1, 1, true);
        let clash = View { mine: Some(me.clone()), others: vec![node(2, 2, 2, false)], subscriptions: 1, clash: Some("b".into()), named: true };
        for what in [Use::Tickets, Use::Snowflakes, Use::NewScope] {
            assert_eq!(clash.check(&me, what), Err(Refusal::IdentityClash { other: "b".into() }), "{what:?}");
        }
    }

    #[test]
    fn a_row_of_another_name_under_this_identity_is_a_copy_until_a_rename_says_otherwise() {
        let me = node(1, 1, 1, false);
        let original = Node { name: "a".into(), ..me.clone() };
        let copy = View { mine: Some(original.clone()), others: vec![node(2, 2, 2, true)], subscriptions: 1, clash: None, named: true };
        for what in [Use::Tickets, Use::Snowflakes, Use::NewScope] {
            assert_eq!(copy.check(&me, what), Err(Refusal::CopyOf { name: "a".into() }), "{what:?}");
        }
        assert_eq!(copy.identity(&me), Err(Refusal::CopyOf { name: "a".into() }));
        // A name not set (cluster_name's, the identifier's) differs between
        // a primary and its promoted standby: not taken for a copy, only
        // for a node not announced as it is now.
        let unnamed = View { named: false, ..copy.clone() };
        assert_eq!(unnamed.identity(&me), Ok(()));
        assert_eq!(unnamed.check(&me, Use::Tickets), Err(Refusal::NotAnnounced));
        // Other settings under this node's own name: not announced yet.
        let stale = View { mine: Some(Node { ticket_offset: 3, ..me.clone() }), ..copy.clone() };
        assert_eq!(stale.identity(&me), Ok(()));
        assert_eq!(stale.check(&me, Use::Tickets), Err(Refusal::NotAnnounced));
        // A copy that subscribes to nothing and knows no other node too.
        let alone = View { mine: Some(original), others: vec![], subscriptions: 0, clash: None, named: true };
        for what in [Use::Tickets, Use::Snowflakes, Use::NewScope] {
            assert_eq!(alone.check(&me, what), Err(Refusal::CopyOf { name: "a".into() }), "{what:?}");
        }
    }

    #[test]
    fn a_home_moves_by_a_later_handover_and_two_take_overs_settle_on_one() {
        assert!(!keeps_home_here(None, (Some(2), 0)), "no home here: the incoming one");
        assert!(keeps_home_here(Some((1, 2)), (Some(2), 1)), "a former home's late write");
        assert!(!keeps_home_here(Some((1, 1)), (Some(2), 2)), "a later handover");
        assert!(keeps_home_here(Some((1, 1)), (Some(1), 1)), "the home's own write-back");
        // Two take-overs at once: both nodes keep the higher id's.
        let (a, b) = (-5_i64, 7_i64);
        assert!(!keeps_home_here(Some((a, 3)), (Some(b), 3)), "a yields to b");
        assert!(keeps_home_here(Some((b, 3)), (Some(a), 3)), "b keeps its own");
    }

    #[test]
    fn each_allocators_conflict_is_refused_naming_the_other_node() {
        let me = node(1, 1, 1, true);
        let view = |other: Node| View { mine: Some(me.clone()), others: vec![other], subscriptions: 1, clash: None, named: true };
        let refused = |v: View, what| matches!(v.check(&me, what), Err(Refusal::Conflict { node, .. }) if node == "n2");
        assert!(refused(view(node(2, 1, 2, false)), Use::Tickets), "the same offset");
        assert!(refused(view(Node { ticket_increment: 3, ..node(2, 2, 2, false) }), Use::Tickets), "another increment");
        assert!(refused(view(node(2, 2, 1, false)), Use::Snowflakes), "the same machine id");
        assert!(refused(view(Node { machine_bits: 12, ..node(2, 2, 2, false) }), Use::Snowflakes), "another layout");
        assert!(refused(view(node(2, 2, 2, true)), Use::NewScope), "two creators");
        // Each rule is its own allocator's: the same machine id does not
        // stop tickets, the same offset does not stop snowflakes.
        assert_eq!(view(node(2, 2, 1, false)).check(&me, Use::Tickets), Ok(()));
        assert_eq!(view(node(2, 1, 2, false)).check(&me, Use::Snowflakes), Ok(()));
        // Leased machine ids are the registry's to keep apart.
        let leased = Node { machine_id: None, ..me.clone() };
        let v = View { mine: Some(leased.clone()), others: vec![Node { machine_id: None, ..node(2, 2, 2, false) }], subscriptions: 1, clash: None, named: true };
        assert_eq!(v.check(&leased, Use::Snowflakes), Ok(()));
        // A fixed id beside a leasing node is refused on both (the registry
        // may lease that very id), tickets untouched.
        let mixed = View { mine: Some(me.clone()), others: vec![Node { machine_id: None, ..node(2, 2, 2, false) }], subscriptions: 1, clash: None, named: true };
        assert!(refused(mixed.clone(), Use::Snowflakes), "fixed beside leased");
        assert_eq!(mixed.check(&me, Use::Tickets), Ok(()));
        let v = View { mine: Some(leased.clone()), others: vec![node(2, 2, 2, false)], subscriptions: 1, clash: None, named: true };
        assert!(v.check(&leased, Use::Snowflakes).is_err(), "leased beside fixed");
    }
}
