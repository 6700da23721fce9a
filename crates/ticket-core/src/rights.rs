//! Rights per scope (SPEC §16): which grants cover a scope or block name.
//!
//! A grant names a queue (or a block name) and a domain, each a pattern: a
//! trailing `*` makes it a prefix (`shop-*`, and `*` alone: every name),
//! anything else is the name itself. A scope grant covers both a queue's
//! scoped counters and its tickets; a block grant covers block names. A
//! grant's "every domain" is the domain pattern `*`.

use crate::fast_map::{FastMap, FastSet};

/// What a grant covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RightKind {
    /// `(queue, domain)` of scoped counters and tickets.
    Scope,
    /// A block name (its domain pattern is `*`).
    Block,
    /// A public-ID key's name (0.5.0; its domain pattern is `*`): who may
    /// encode and decode with it. Always asked, whatever
    /// `pg_ticket.scope_rights` says: a key is a secret.
    PublicKey,
}

impl RightKind {
    /// A kind whose grants name one thing, with no domain.
    pub fn has_domain(self) -> bool {
        self == RightKind::Scope
    }
}

impl RightKind {
    pub fn sql_name(self) -> &'static str {
        match self {
            RightKind::Scope => "scope",
            RightKind::Block => "block",
            RightKind::PublicKey => "public_key",
        }
    }

    pub fn from_sql_name(name: &str) -> Option<RightKind> {
        match name {
            "scope" => Some(RightKind::Scope),
            "block" => Some(RightKind::Block),
            "public_key" => Some(RightKind::PublicKey),
            _ => None,
        }
    }
}

/// One grant as stored: patterns in the database's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeGrant {
    pub kind: RightKind,
    pub queue: Vec<u8>,
    pub domain: Vec<u8>,
}

/// Does `pattern` cover `name`? A trailing `*` is a prefix; nothing else
/// is special.
pub fn pattern_covers(pattern: &[u8], name: &[u8]) -> bool {
    match pattern.strip_suffix(b"*") {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

impl ScopeGrant {
    pub fn covers(&self, kind: RightKind, queue: &[u8], domain: &[u8]) -> bool {
        self.kind == kind && pattern_covers(&self.queue, queue) && (!kind.has_domain() || pattern_covers(&self.domain, domain))
    }
}

/// Is `(kind, queue, domain)` covered by any of `grants`?
pub fn covered(grants: &[ScopeGrant], kind: RightKind, queue: &[u8], domain: &[u8]) -> bool {
    grants.iter().any(|g| g.covers(kind, queue, domain))
}

/// The domains granted under one exact queue.
#[derive(Debug, Default)]
struct Domains {
    exact: FastSet<Vec<u8>>,
    prefixes: Vec<Vec<u8>>,
}

/// A role's grants arranged for lookups that cost the same with 10 000
/// grants as with one: exact queues and domains by hash, and only the
/// prefix patterns scanned (a role has few of those, or one that covers
/// much).
#[derive(Debug, Default)]
pub struct GrantIndex {
    by_queue: FastMap<(RightKind, Vec<u8>), Domains>,
    queue_prefixes: Vec<ScopeGrant>,
}

impl GrantIndex {
    pub fn new(grants: Vec<ScopeGrant>) -> Self {
        let mut index = GrantIndex::default();
        for grant in grants {
            if grant.queue.ends_with(b"*") {
                index.queue_prefixes.push(grant);
                continue;
            }
            let domains = index.by_queue.entry((grant.kind, grant.queue)).or_default();
            match grant.domain.strip_suffix(b"*") {
                Some(prefix) => domains.prefixes.push(prefix.to_vec()),
                None => {
                    domains.exact.insert(grant.domain);
                }
            }
        }
        index
    }

    pub fn covers(&self, kind: RightKind, queue: &[u8], domain: &[u8]) -> bool {
        let exact_queue = self.by_queue.get(&(kind, queue.to_vec())).is_some_and(|d| {
            !kind.has_domain() || d.exact.contains(domain) || d.prefixes.iter().any(|p| domain.starts_with(p))
        });
        exact_queue || self.queue_prefixes.iter().any(|g| g.covers(kind, queue, domain))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(kind: RightKind, queue: &str, domain: &str) -> ScopeGrant {
        ScopeGrant { kind, queue: queue.into(), domain: domain.into() }
    }

    #[test]
    fn a_trailing_star_is_a_prefix_and_nothing_else_is_special() {
        assert!(pattern_covers(b"invoices", b"invoices"));
        assert!(!pattern_covers(b"invoices", b"invoices2"));
        assert!(!pattern_covers(b"invoices", b"invoice"));
        assert!(pattern_covers(b"shop-*", b"shop-17"));
        assert!(pattern_covers(b"shop-*", b"shop-"));
        assert!(!pattern_covers(b"shop-*", b"shop"));
        assert!(pattern_covers(b"*", b"anything"));
        assert!(!pattern_covers(b"a*b", b"axb"), "a star inside is a character");
        assert!(pattern_covers(b"a*b", b"a*b"));
        assert!(pattern_covers(b"**", b"*x"), "only the last star is a prefix");
        assert!(!pattern_covers(b"**", b"x"));
    }

    #[test]
    fn a_grant_covers_its_kind_queue_and_domain() {
        let g = grant(RightKind::Scope, "invoices", "shop-17/*");
        assert!(g.covers(RightKind::Scope, b"invoices", b"shop-17/2026"));
        assert!(!g.covers(RightKind::Scope, b"invoices", b"shop-18/2026"));
        assert!(!g.covers(RightKind::Scope, b"orders", b"shop-17/2026"));
        assert!(!g.covers(RightKind::Block, b"invoices", b""), "a scope grant is not a block grant");
        let every_domain = grant(RightKind::Scope, "invoices", "*");
        assert!(every_domain.covers(RightKind::Scope, b"invoices", b"x"));
        let block = grant(RightKind::Block, "batch-*", "*");
        assert!(block.covers(RightKind::Block, b"batch-7", b""));
        assert!(!block.covers(RightKind::Scope, b"batch-7", b"d"));
        let key = grant(RightKind::PublicKey, "receipts", "*");
        assert!(key.covers(RightKind::PublicKey, b"receipts", b""));
        assert!(!key.covers(RightKind::Block, b"receipts", b""), "a key grant is not a block grant");
        assert!(!block.covers(RightKind::PublicKey, b"batch-7", b""), "nor a block grant a key grant");
    }

    #[test]
    fn no_grant_covers_nothing() {
        assert!(!covered(&[], RightKind::Scope, b"q", b"d"));
        let grants = [grant(RightKind::Scope, "a", "1"), grant(RightKind::Scope, "b*", "*")];
        assert!(covered(&grants, RightKind::Scope, b"a", b"1"));
        assert!(covered(&grants, RightKind::Scope, b"bee", b"9"));
        assert!(!covered(&grants, RightKind::Scope, b"a", b"2"));
    }

    #[test]
    fn the_index_decides_as_the_grants_do() {
        let grants = vec![
            grant(RightKind::Scope, "invoices", "shop-17/2026"),
            grant(RightKind::Scope, "invoices", "shop-18/*"),
            grant(RightKind::Scope, "orders-*", "eu"),
            grant(RightKind::Scope, "*", "public-*"),
            grant(RightKind::Block, "pool", "*"),
            grant(RightKind::Block, "batch-*", "*"),
            grant(RightKind::Scope, "a*b", "x"),
        ];
        let index = GrantIndex::new(grants.clone());
        let names: [&[u8]; 12] =
            [b"invoices", b"shop-17/2026", b"shop-17/2027", b"shop-18/", b"shop-18/x", b"orders-", b"orders-1", b"eu", b"public-x", b"pool", b"batch-9", b"a*b"];
        for kind in [RightKind::Scope, RightKind::Block] {
            for queue in names {
                for domain in names.iter().copied().chain([b"x" as &[u8], b""]) {
                    assert_eq!(
                        index.covers(kind, queue, domain),
                        covered(&grants, kind, queue, domain),
                        "{kind:?} {:?} {:?}",
                        String::from_utf8_lossy(queue),
                        String::from_utf8_lossy(domain)
                    );
                }
            }
        }
        assert!(index.covers(RightKind::Block, b"pool", b""));
        assert!(!index.covers(RightKind::Scope, b"pool", b""));
        assert!(index.covers(RightKind::Scope, b"a*b", b"x"), "a star inside an exact queue");
        assert!(!GrantIndex::new(Vec::new()).covers(RightKind::Scope, b"q", b"d"));
    }

    #[test]
    fn kinds_round_trip_their_sql_names() {
        for kind in [RightKind::Scope, RightKind::Block] {
            assert_eq!(RightKind::from_sql_name(kind.sql_name()), Some(kind));
        }
        assert_eq!(RightKind::from_sql_name("ticket"), None);
    }
}
