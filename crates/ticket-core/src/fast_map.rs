//! The hash map of the allocation path. std's SipHash cost 12% of a
//! `next_scoped_id()` call served from the transaction's held marks
//! (perf, 1M calls in one transaction); foldhash's is a fraction of that.
//!
//! What it gives up: foldhash seeds each process from addresses (ASLR) and
//! the clock, not from the OS's entropy as std does, and its authors do not
//! claim resistance to an attacker who probes timings to find colliding
//! keys. What bounds that here is the maps, not the hash: each belongs to
//! one backend and is capped (a transaction's held marks by
//! `pg_ticket.max_transaction_entries`, which a role cannot raise; the
//! rights memo by its own cap), so colliding scope names make only their
//! own caller's calls slower (each O(entries), never a panic or growth),
//! and a role can burn that CPU with a plain loop anyway.

pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::quality::RandomState>;
pub type FastSet<K> = std::collections::HashSet<K, foldhash::quality::RandomState>;
