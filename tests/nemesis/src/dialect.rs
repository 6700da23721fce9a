//! The release under test. The nemesis speaks 0.4.0's names; run against a
//! 0.3.0 build, to show that it finds by itself what 0.4.0 fixed (#30 item
//! 7, TESTING.md), it calls what 0.3.0 called them (CHANGELOG.md's table of
//! moves). Learned once, from the registry's `CREATE EXTENSION`.

use std::sync::atomic::{AtomicBool, Ordering};

static RELEASE_0_3: AtomicBool = AtomicBool::new(false);

/// Learn the release from `extversion`.
pub fn learn(version: &str) {
    RELEASE_0_3.store(version == "0.3.0", Ordering::SeqCst);
}

/// 0.3.0 is under test.
pub fn is_0_3() -> bool {
    RELEASE_0_3.load(Ordering::SeqCst)
}

/// `name` (a function or view as 0.4.0 calls it) as the release under
/// test calls it.
pub fn name(name: &'static str) -> &'static str {
    if !is_0_3() {
        return name;
    }
    match name {
        "pgticket.release_shard" => "sharded_release",
        "pgticket.accept_shard" => "sharded_accept",
        "pgticket.machine_ids" => "pgticket.machine_leases",
        "pgticket.advance_scoped_id" => "advance_scoped_id",
        "pgticket.advance_block" => "advance_block_mark",
        "pgticket.advance_ticket" => "advance_ticket",
        "pgticket.end_lease_hold_off" => "end_lease_hold_off",
        same => same,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_release_learned() {
        learn("0.4.0");
        assert_eq!(name("pgticket.accept_shard"), "pgticket.accept_shard");
        learn("0.3.0");
        assert_eq!(name("pgticket.accept_shard"), "sharded_accept");
        assert_eq!(name("pgticket.advance_block"), "advance_block_mark");
        assert_eq!(name("pgticket.marks"), "pgticket.marks");
        learn("0.4.0");
        assert!(!is_0_3());
    }
}
