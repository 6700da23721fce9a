//! The ticket cache's directory (SPEC §7, §13.11), free of PostgreSQL:
//! which slot holds which scope, and which slot a new scope takes.
//!
//! - An open-addressing hash index (linear probing, deletion by backward
//!   shift) maps a scope's hash to its slot: a lookup costs O(1) expected,
//!   however many slots there are (0.2.0 scanned every slot, under a lock).
//! - Free slots are a stack.
//! - With none free, a CLOCK sweep (second chance: a slot used since the
//!   hand last passed is spared once) picks a victim, and spares every slot
//!   of an owner — a role of a database (`owner_of`) — holding no more
//!   than `MIN_SPARED` slots or half its fair share (the slots divided by
//!   the owners holding any), whichever is more: a flood of new scopes
//!   from one role evicts its own, and never empties another role's cache,
//!   of its database or another (0.3.0 spared by database only: one role
//!   flooding evicted the other roles of its database) — however many
//!   join in. A
//!   sweep looks at `WINDOW` slots at most before it settles for a slot
//!   used lately. A run of spared slots at the hand is passed, however
//!   long, while some slot is surely not spared (0.4.0 gave up after 256
//!   slots and evicted a spared one, #46 item 12): the hand passes each
//!   slot once per turn and at most half the slots are spared (each owner
//!   half its fair share), so placements cost O(1) slots on average. When
//!   every slot may be spared (more owners than the cache has
//!   `MIN_SPARED` slots for) it takes the slot at hand after `SWEEP_MAX`,
//!   so no placement scans the cache.
//! - The slots each owner holds, and each database, are counted in
//!   open-addressing tables keyed by owner and by database (`DbCounts`).
//!
//! The caller keeps these arrays (shared memory in the server) and holds
//! the directory lock around every call: shared for `lookup`, exclusive for
//! the rest. Nothing here allocates, waits or fails.

/// A bucket of the scope index: 0 empty, else slot index + 1.
pub type Bucket = u32;

/// A bucket of the database table: (database, slots it holds); database 0
/// marks it empty (no database has oid 0).
pub type DbBucket = (u32, u32);

/// Buckets for `slots` slots: a power of two, at least twice as many, so
/// probe sequences stay short.
pub fn buckets_for(slots: usize) -> usize {
    (slots * 2).next_power_of_two().max(16)
}

fn home(hash: u64, len: usize) -> usize {
    // Fibonacci hashing spreads the scope hash's bits over the table.
    (hash.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize & (len - 1)
}

/// The slot holding a scope of `hash` for which `matches(slot)` holds.
pub fn lookup(index: &[Bucket], hash: u64, mut matches: impl FnMut(usize) -> bool) -> Option<usize> {
    let mask = index.len() - 1;
    let mut i = home(hash, index.len());
    loop {
        match index[i] {
            0 => return None,
            b if matches(b as usize - 1) => return Some(b as usize - 1),
            _ => i = (i + 1) & mask,
        }
    }
}

/// Index `slot` (holding a scope of `hash`).
pub fn insert(index: &mut [Bucket], hash: u64, slot: usize) {
    let mask = index.len() - 1;
    let mut i = home(hash, index.len());
    while index[i] != 0 {
        i = (i + 1) & mask;
    }
    index[i] = slot as Bucket + 1;
}

/// Remove `slot` (holding a scope of `hash`) from the index; `hash_of`
/// gives the hash of the scope in any other indexed slot (to shift the
/// entries after it back, so no tombstone lengthens later probes).
pub fn remove(index: &mut [Bucket], hash: u64, slot: usize, hash_of: impl Fn(usize) -> u64) {
    let (len, mask) = (index.len(), index.len() - 1);
    let mut i = home(hash, len);
    while index[i] != slot as Bucket + 1 {
        if index[i] == 0 {
            return;
        }
        i = (i + 1) & mask;
    }
    let mut hole = i;
    let mut j = i;
    loop {
        j = (j + 1) & mask;
        if index[j] == 0 {
            break;
        }
        let want = home(hash_of(index[j] as usize - 1), len);
        // Move j back into the hole unless its home lies cyclically in (hole, j].
        let stays = if hole <= j { hole < want && want <= j } else { hole < want || want <= j };
        if !stays {
            index[hole] = index[j];
            hole = j;
        }
    }
    index[hole] = 0;
}

/// Who a slot counts against in the sweep: the role that placed it in its
/// database, as one non-zero key (a clash of two owners merges their
/// counts: less fair to them, never a wrong scope).
pub fn owner_of(db: u32, role: u32) -> u32 {
    let mixed = (u64::from(db) << 32 | u64::from(role)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((mixed >> 32) as u32).max(1)
}

/// The slots each database (or owner) holds.
pub struct DbCounts<'a> {
    pub table: &'a mut [DbBucket],
    /// Databases holding at least one slot.
    pub active: &'a mut u32,
}

impl DbCounts<'_> {
    fn position(&self, db: u32) -> Result<usize, usize> {
        let mask = self.table.len() - 1;
        let mut i = home(u64::from(db), self.table.len());
        loop {
            match self.table[i] {
                (0, _) => return Err(i),
                (d, _) if d == db => return Ok(i),
                _ => i = (i + 1) & mask,
            }
        }
    }

    pub fn count(&self, db: u32) -> u32 {
        self.position(db).map_or(0, |i| self.table[i].1)
    }

    pub fn add(&mut self, db: u32) {
        match self.position(db) {
            Ok(i) => self.table[i].1 += 1,
            Err(i) => {
                self.table[i] = (db, 1);
                *self.active += 1;
            }
        }
    }

    pub fn take(&mut self, db: u32) {
        let Ok(i) = self.position(db) else { return };
        if self.table[i].1 > 1 {
            self.table[i].1 -= 1;
            return;
        }
        *self.active -= 1;
        // Backward-shift deletion, as in `remove`.
        let (len, mask) = (self.table.len(), self.table.len() - 1);
        let mut hole = i;
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            if self.table[j].0 == 0 {
                break;
            }
            let want = home(u64::from(self.table[j].0), len);
            let stays = if hole <= j { hole < want && want <= j } else { hole < want || want <= j };
            if !stays {
                self.table[hole] = self.table[j];
                hole = j;
            }
        }
        self.table[hole] = (0, 0);
    }

    /// Is `db` spared by a sweep for another: it holds no more than
    /// `MIN_SPARED` slots, or half its fair share of `slots`? (Only the
    /// slots it uses: `SlotView::idle`.)
    pub fn spared(&self, db: u32, slots: usize) -> bool {
        self.count(db) as usize <= self.spare_line(slots)
    }

    /// How many slots an owner keeps: half its fair share, or `MIN_SPARED`.
    fn spare_line(&self, slots: usize) -> usize {
        let half_fair = slots / (*self.active).max(1) as usize / 2;
        half_fair.max(MIN_SPARED)
    }

    /// Some slot in use is not spared: the owners keep fewer slots between
    /// them than there are (each at most its spare line). True whenever
    /// half the fair share is above `MIN_SPARED`: then at most half the
    /// slots are spared.
    fn some_slot_unspared(&self, slots: usize) -> bool {
        (*self.active as usize).saturating_mul(self.spare_line(slots)) < slots
    }
}

/// Slots every database keeps however many others compete (the smallest
/// cache has 16).
pub const MIN_SPARED: usize = 16;
/// Slots a sweep looks at before it settles for one used lately.
pub const WINDOW: usize = 64;
/// Slots a sweep looks at when every slot may be spared (more owners than
/// the cache has `MIN_SPARED` slots for) before it takes the slot at hand.
pub const SWEEP_MAX: usize = 4 * WINDOW;

/// What the sweep needs of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotView {
    pub in_use: bool,
    /// Its owner (`owner_of`).
    pub db: u32,
    /// Used since the hand last passed it.
    pub referenced: bool,
    /// Not used for a while (the server: `SPARE_IDLE_MS`): not spared any
    /// more, so the shares of owners that stopped using their slots go
    /// back (#31 review: 64 roles of one role with CREATEROLE, 16 slots
    /// each, used once, held the whole cache for ever). By time, not by
    /// passes of the hand: one sweep may pass a slot several times.
    pub idle: bool,
}

/// The slot a scope of owner `db` (`owner_of`; the counts are the owners')
/// takes when none is free: from the
/// hand on, a slot not in use, else the first neither spared nor used since
/// the hand last passed (`look` clears that bit as the hand passes: its
/// second chance). After `WINDOW` slots it settles for the first one not
/// spared. While some slot is surely not spared it goes on until it finds
/// one, however long the run of spared slots at the hand (each slot is
/// passed once per turn, and at most half are spared: O(1) on average);
/// when every slot may be spared it takes the slot at hand after
/// `SWEEP_MAX` (a whole turn would be O(slots) under the directory lock,
/// every time: #46 review).
pub fn sweep(hand: &mut usize, slots: usize, db: u32, counts: &DbCounts<'_>, mut look: impl FnMut(usize) -> SlotView) -> usize {
    let mut fallback = None;
    let mut last = *hand;
    let bound = if counts.some_slot_unspared(slots) { slots } else { slots.min(SWEEP_MAX) };
    for examined in 1..=bound {
        let i = *hand;
        *hand = (*hand + 1) % slots;
        let view = look(i);
        if !view.in_use {
            return i;
        }
        last = i;
        if view.db == db || !counts.spared(view.db, slots) || view.idle {
            if !view.referenced {
                return i;
            }
            fallback.get_or_insert(i);
        }
        if examined >= WINDOW {
            if let Some(i) = fallback {
                return i;
            }
        }
    }
    fallback.unwrap_or(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_of_one_database_are_told_apart_and_never_zero() {
        assert_ne!(owner_of(5, 10), owner_of(5, 11));
        assert_ne!(owner_of(5, 10), owner_of(6, 10));
        assert_eq!(owner_of(5, 10), owner_of(5, 10));
        assert!((0..1000).all(|r| owner_of(1, r) != 0));
    }

    fn hash(n: u64) -> u64 {
        n.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ (n << 7)
    }

    #[test]
    fn the_index_finds_inserts_and_removes_every_scope() {
        let slots = 1000;
        let mut index = vec![0; buckets_for(slots)];
        let hashes: Vec<u64> = (0..slots as u64).map(|n| if n % 10 == 0 { 42 } else { hash(n) }).collect(); // some collide
        for (slot, h) in hashes.iter().enumerate() {
            insert(&mut index, *h, slot);
        }
        for (slot, h) in hashes.iter().enumerate() {
            assert_eq!(lookup(&index, *h, |s| s == slot), Some(slot));
        }
        // Remove every third, in an order unlike insertion.
        for slot in (0..slots).rev().filter(|s| s % 3 == 0) {
            remove(&mut index, hashes[slot], slot, |s| hashes[s]);
        }
        for (slot, h) in hashes.iter().enumerate() {
            let found = lookup(&index, *h, |s| s == slot);
            assert_eq!(found, (slot % 3 != 0).then_some(slot), "slot {slot}");
        }
        assert_eq!(index.iter().filter(|b| **b != 0).count(), slots - slots.div_ceil(3));
    }

    #[test]
    fn database_counts_follow_adds_and_takes() {
        let mut table = vec![(0, 0); 64];
        let mut active = 0;
        let mut counts = DbCounts { table: &mut table, active: &mut active };
        for db in [5, 6, 5, 7, 5] {
            counts.add(db);
        }
        assert_eq!((counts.count(5), counts.count(6), counts.count(7), *counts.active), (3, 1, 1, 3));
        counts.take(6);
        counts.take(5);
        assert_eq!((counts.count(5), counts.count(6), *counts.active), (2, 0, 2));
        counts.take(6); // not there: nothing
        assert_eq!(*counts.active, 2);
    }

    /// A scope of owner `db` placed by a sweep from `hand` (a used slot's
    /// reference bit cleared as the hand passes, the victim's count taken
    /// off); how many slots the sweep examined.
    fn place(hand: &mut usize, db: u32, views: &mut [SlotView], counts: &mut DbCounts<'_>) -> usize {
        let mut examined = 0;
        let i = sweep(hand, views.len(), db, counts, |i| {
            examined += 1;
            let v = views[i];
            views[i].referenced = false;
            v
        });
        if views[i].in_use {
            counts.take(views[i].db);
        }
        views[i] = SlotView { in_use: true, db, referenced: true, idle: false };
        counts.add(db);
        examined
    }

    /// A database flooding new scopes evicts its own and never takes
    /// another's below half its fair share; every slot is examined at most
    /// a few times per placement.
    #[test]
    fn a_flood_from_one_database_leaves_another_half_its_fair_share() {
        let slots = 1024;
        let (mut table, mut active) = (vec![(0, 0); 64], 0);
        let mut views = vec![SlotView { in_use: false, db: 0, referenced: false, idle: false }; slots];
        let mut hand = 0;
        let mut counts = DbCounts { table: &mut table, active: &mut active };
        // The victim database caches 300 scopes and keeps using them.
        let place = |db: u32, views: &mut Vec<SlotView>, counts: &mut DbCounts<'_>, hand: &mut usize| place(hand, db, views, counts);
        for _ in 0..300 {
            place(1, &mut views, &mut counts, &mut hand);
        }
        let mut worst = 0;
        for round in 0..20_000 {
            worst = worst.max(place(2, &mut views, &mut counts, &mut hand));
            if round % 100 == 0 {
                // The victim's scopes are in use.
                for v in views.iter_mut().filter(|v| v.db == 1) {
                    v.referenced = true;
                }
            }
        }
        let kept = views.iter().filter(|v| v.in_use && v.db == 1).count();
        assert!(kept >= slots / 2 / 2, "the victim kept {kept} of its 300 scopes");
        assert_eq!(kept as u32, counts.count(1));
        assert!(worst <= slots / 2 + WINDOW, "one placement examined {worst} slots");
    }

    /// Review of #46 item 12's fix: with every slot spared (more owners than
    /// the cache has `MIN_SPARED` slots for, each holding its 16), a
    /// placement scanned the whole cache under the directory lock. It looks
    /// at `SWEEP_MAX` slots at most then.
    #[test]
    fn a_cache_spared_throughout_is_not_scanned_whole() {
        let slots = 4096;
        let owners = (slots / MIN_SPARED) as u32;
        let (mut table, mut active) = (vec![(0, 0); 2 * owners as usize], 0);
        let mut views = vec![SlotView { in_use: false, db: 0, referenced: false, idle: false }; slots];
        let mut hand = 0;
        let mut counts = DbCounts { table: &mut table, active: &mut active };
        for owner in 1..=owners {
            for _ in 0..MIN_SPARED {
                place(&mut hand, owner, &mut views, &mut counts);
            }
        }
        let mut worst = 0;
        for _ in 0..100 {
            for v in views.iter_mut() {
                v.referenced = true;
            }
            worst = worst.max(place(&mut hand, owners + 1, &mut views, &mut counts));
        }
        assert!(worst <= SWEEP_MAX, "one placement examined {worst} slots");
    }

    /// #46 item 12: a run of spared slots longer than the sweep's old bound
    /// (256) at the hand: 0.4.0 gave up there and evicted the run's last
    /// slot, a spared one. The victim holds exactly its spared share, all
    /// in one run, and a flood of new scopes from another owner goes round
    /// the cache many times: the victim keeps every slot, and placements
    /// stay cheap on average.
    #[test]
    fn a_long_run_of_spared_slots_at_the_hand_is_passed_not_evicted() {
        let slots = 1024;
        let (mut table, mut active) = (vec![(0, 0); 64], 0);
        let mut views = vec![SlotView { in_use: false, db: 0, referenced: false, idle: false }; slots];
        let mut hand = 0;
        let mut counts = DbCounts { table: &mut table, active: &mut active };
        let mut place = |db: u32, views: &mut Vec<SlotView>, counts: &mut DbCounts<'_>| place(&mut hand, db, views, counts);
        let share = slots / 2 / 2;
        for _ in 0..share {
            place(1, &mut views, &mut counts);
        }
        let (mut total, mut rounds) = (0, 0);
        for _ in 0..20 * slots {
            total += place(2, &mut views, &mut counts);
            rounds += 1;
            assert_eq!(counts.count(1) as usize, share, "the victim lost a spared slot after {rounds} placements");
        }
        assert!(total / rounds <= 4, "{} slots examined per placement on average", total / rounds);
    }

    /// Many small databases do not dilute a victim's protection below
    /// `MIN_SPARED` (with half the fair share alone, 31 databases holding
    /// a slot each left it nothing).
    #[test]
    fn databases_joining_in_leave_every_one_its_minimum() {
        let slots = 64;
        let (mut table, mut active) = (vec![(0, 0); 128], 0);
        let mut views = vec![SlotView { in_use: false, db: 0, referenced: false, idle: false }; slots];
        let mut hand = 0;
        let mut counts = DbCounts { table: &mut table, active: &mut active };
        let place = |db: u32, views: &mut Vec<SlotView>, counts: &mut DbCounts<'_>, hand: &mut usize| {
            let i = sweep(hand, slots, db, counts, |i| {
                let v = views[i];
                views[i].referenced = false;
                v
            });
            if views[i].in_use {
                counts.take(views[i].db);
            }
            views[i] = SlotView { in_use: true, db, referenced: true, idle: false };
            counts.add(db);
        };
        for _ in 0..20 {
            place(1, &mut views, &mut counts, &mut hand);
        }
        for round in 0..50u32 {
            for k in 0..40 {
                // 40 other databases holding a slot or two each.
                place(100 + (round * 7 + k) % 40, &mut views, &mut counts, &mut hand);
            }
            // The victim keeps using its scopes.
            for v in views.iter_mut().filter(|v| v.db == 1) {
                v.referenced = true;
            }
            for _ in 0..100 {
                place(2, &mut views, &mut counts, &mut hand);
            }
        }
        let kept = views.iter().filter(|v| v.in_use && v.db == 1).count();
        assert!(kept >= MIN_SPARED, "the victim kept {kept} of its 20 slots");
    }

    /// Owners that stopped using their slots are spared no more: 64 idle
    /// owners of 16 slots each no longer hold a 1 024-slot cache against
    /// one that comes later.
    #[test]
    fn idle_owners_give_their_share_back() {
        let slots = 1024;
        let (mut table, mut active) = (vec![(0, 0); 256], 0);
        let mut views = vec![SlotView { in_use: false, db: 0, referenced: false, idle: false }; slots];
        let mut hand = 0;
        let mut counts = DbCounts { table: &mut table, active: &mut active };
        let place = |db: u32, views: &mut Vec<SlotView>, counts: &mut DbCounts<'_>, hand: &mut usize| {
            let i = sweep(hand, slots, db, counts, |i| {
                let v = views[i];
                views[i].referenced = false;
                v
            });
            if views[i].in_use {
                counts.take(views[i].db);
            }
            views[i] = SlotView { in_use: true, db, referenced: true, idle: false };
            counts.add(db);
            i
        };
        for owner in 0..64u32 {
            for _ in 0..16 {
                place(1000 + owner, &mut views, &mut counts, &mut hand);
            }
        }
        // Then they go idle.
        for v in views.iter_mut() {
            v.idle = true;
        }
        for _ in 0..4 * slots {
            place(7, &mut views, &mut counts, &mut hand);
        }
        let newcomer = views.iter().filter(|v| v.in_use && v.db == 7).count();
        assert!(newcomer > 16, "the newcomer holds {newcomer} slots once the idle owners' shares went back");
    }
}
