//! The marks one transaction holds, with savepoint undo, free of PostgreSQL.
//!
//! A transaction that took values from a scope holds that scope's row
//! locked until it ends; later allocations are served from here without
//! SQL. Subtransactions (SAVEPOINT, a PL/pgSQL EXCEPTION block) record, on
//! their first change to a scope, the mark to restore if they abort; a scope
//! first locked inside one records "forget" instead.
//!
//! Bounds: the undo log holds at most one entry per (scope, open
//! subtransaction), because a committing subtransaction's entries are merged
//! into its parent — dropped where the parent already has an older entry
//! for the scope — instead of relabelled one by one and kept. So memory is
//! bounded by the pairs that are open now, and every entry is touched a
//! bounded number of times: both a loop of a million exception blocks and
//! N nested savepoints stay linear. `max_entries` caps the total, because Rust
//! allocations are outside PostgreSQL's memory accounting and a failed one
//! would abort the backend.
//!
//! Keys are opaque bytes to this module (the caller encodes kind, table and
//! names in the database's own encoding).

use crate::fast_map::{same_key, FastMap};
use thiserror::Error;

use crate::counter::Mark;

/// PostgreSQL's TopSubTransactionId: the transaction's top level.
pub const TOP_LEVEL: u32 = 1;

/// The state is given back to the allocator after a transaction that grew it
/// beyond this many entries; a small one is kept to avoid reallocating.
const KEEP_CAPACITY: usize = 256;

/// The state cannot grow: the configured cap, or memory.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum LimitReached {
    #[error("this transaction tracks {limit} scopes and savepoint entries, the limit set by pg_ticket.max_transaction_entries")]
    Entries { limit: usize },
    /// An allocation the state needed failed: an error for this
    /// transaction, never an abort of the process (SPEC §13.7).
    #[error("out of memory for this transaction's scopes and savepoint entries ({entries} held)")]
    Memory { entries: usize },
}

#[derive(Debug)]
struct Held {
    key: Box<[u8]>,
    /// Mark and limit as the row stores them now.
    stored: Mark,
    /// Mark and limit including changes since, not yet written.
    current: Mark,
    /// Subtransactions with an undo entry for this scope, innermost last.
    levels: Vec<u32>,
}

#[derive(Debug)]
enum Action {
    Restore(Mark),
    Forget,
}

#[derive(Debug)]
struct Undo {
    subxact: u32,
    key: Box<[u8]>,
    action: Action,
}

#[derive(Debug)]
pub struct LocalMarks {
    /// The scopes held, in no order; `index` finds one by its key.
    held: Vec<Held>,
    index: FastMap<Box<[u8]>, usize>,
    /// The scope served last. A run of calls on one scope (a bulk INSERT,
    /// a loop) compares its key with this one's instead of hashing it:
    /// hashing was 11% of a call served from here (perf, 1M calls in one
    /// transaction).
    last: Option<usize>,
    /// Grouped by open subtransaction in nesting order: the innermost one's
    /// entries are at the end.
    undo: Vec<Undo>,
    max_entries: usize,
    /// Undo entries visited by `commit_sub`: the work the tests bound.
    #[cfg(test)]
    visited: usize,
}

impl Default for LocalMarks {
    fn default() -> Self {
        LocalMarks::new(usize::MAX)
    }
}

impl LocalMarks {
    pub fn new(max_entries: usize) -> Self {
        LocalMarks {
            held: Vec::new(),
            index: FastMap::default(),
            last: None,
            undo: Vec::new(),
            max_entries,
            #[cfg(test)]
            visited: 0,
        }
    }

    pub fn set_max_entries(&mut self, max_entries: usize) {
        self.max_entries = max_entries;
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Scopes held plus undo entries: what `max_entries` counts.
    pub fn entries(&self) -> usize {
        self.held.len() + self.undo.len()
    }

    /// The mark of a scope this transaction holds, if it holds it.
    pub fn mark(&self, key: &[u8]) -> Option<i64> {
        self.index.get(key).map(|&i| self.held[i].current.mark)
    }

    /// Where the scope `key` is held, if it is; remembered as the last.
    fn find(&mut self, key: &[u8]) -> Option<usize> {
        if let Some(i) = self.last {
            if same_key(&self.held[i].key, key) {
                return Some(i);
            }
        }
        let i = *self.index.get(key)?;
        self.last = Some(i);
        Some(i)
    }

    /// Stop holding the scope `key`: the last one held moves into its place.
    fn release(&mut self, key: &[u8]) {
        let Some(i) = self.index.remove(key) else { return };
        self.held.swap_remove(i);
        if let Some(moved) = self.held.get(i) {
            *self.index.get_mut(&moved.key).expect("a held scope is indexed") = i;
        }
        self.last = None;
    }

    fn check_room(&self, more: usize) -> Result<(), LimitReached> {
        if self.entries() + more > self.max_entries {
            return Err(LimitReached::Entries { limit: self.max_entries });
        }
        Ok(())
    }

    /// Apply `change` to the mark of a held scope in `subxact` (None if the
    /// scope is not held), recording the value to restore if that
    /// subtransaction aborts. One hash lookup: this is the per-ID path.
    pub fn update<E: From<LimitReached>>(
        &mut self,
        key: &[u8],
        subxact: u32,
        change: impl FnOnce(Mark) -> Result<Mark, E>,
    ) -> Option<Result<Mark, E>> {
        let (entries, max_entries) = (self.entries(), self.max_entries);
        let i = self.find(key)?;
        let held = &mut self.held[i];
        let new = match change(held.current) {
            Ok(new) => new,
            Err(e) => return Some(Err(e)),
        };
        if subxact != TOP_LEVEL && held.levels.last() != Some(&subxact) {
            if entries >= max_entries {
                return Some(Err(LimitReached::Entries { limit: max_entries }.into()));
            }
            if held.levels.try_reserve(1).is_err() || self.undo.try_reserve(1).is_err() {
                return Some(Err(LimitReached::Memory { entries }.into()));
            }
            held.levels.push(subxact);
            self.undo.push(Undo { subxact, key: key.into(), action: Action::Restore(held.current) });
        }
        held.current = new;
        Some(Ok(new))
    }

    /// The run of calls on one scope (a bulk INSERT, a loop), cheaper than
    /// [`update`](Self::update): if the scope served last is the one
    /// `is_it` recognises by its key, and `subxact` needs no undo entry for
    /// it (the top level, or one that already has its entry), take `n` from
    /// its mark and return the new mark. None, with nothing changed,
    /// wherever `update` has more to do or something to refuse: another
    /// scope, a first change in this subtransaction, the limit reached.
    #[inline]
    pub fn take_again(&mut self, is_it: impl FnOnce(&[u8]) -> bool, subxact: u32, n: i64) -> Option<i64> {
        let held = &mut self.held[self.last?];
        if !is_it(&held.key) || (subxact != TOP_LEVEL && held.levels.last() != Some(&subxact)) {
            return None;
        }
        let mark = crate::counter::after_taking(held.current.mark, n, held.current.limit)?;
        held.current.mark = mark;
        Some(mark)
    }

    /// Start holding a scope whose row was just locked in `subxact` and now
    /// stores `stored`; `current` may already differ from it.
    pub fn hold(&mut self, key: &[u8], subxact: u32, stored: Mark, current: Mark) -> Result<(), LimitReached> {
        let nested = subxact != TOP_LEVEL;
        self.check_room(1 + usize::from(nested))?;
        // The table's and the undo list's growth (the large allocations,
        // doubling) may fail; everything else is a few bytes.
        if self.held.try_reserve(1).is_err()
            || self.index.try_reserve(1).is_err()
            || (nested && self.undo.try_reserve(1).is_err())
        {
            return Err(LimitReached::Memory { entries: self.entries() });
        }
        let mut levels = Vec::new();
        if nested {
            levels.push(subxact);
            self.undo.push(Undo { subxact, key: key.into(), action: Action::Forget });
        }
        let held = Held { key: key.into(), stored, current, levels };
        let i = match self.index.get(key) {
            Some(&i) => {
                self.held[i] = held;
                i
            }
            None => {
                self.held.push(held);
                self.index.insert(key.into(), self.held.len() - 1);
                self.held.len() - 1
            }
        };
        self.last = Some(i);
        Ok(())
    }

    /// Room for one more scope (checked before its row is locked, so that a
    /// refusal leaves nothing locked that this state does not know of).
    pub fn room_for_new_scope(&self, subxact: u32) -> Result<(), LimitReached> {
        self.check_room(1 + usize::from(subxact != TOP_LEVEL))
    }

    /// `my` committed into `parent`: its entries now belong to the parent,
    /// except where the parent already holds an older value for the scope.
    pub fn commit_sub(&mut self, my: u32, parent: u32) {
        if self.undo.last().is_none_or(|u| u.subxact != my) {
            return;
        }
        let start = self.undo.iter().rposition(|u| u.subxact != my).map_or(0, |i| i + 1);
        #[cfg(test)]
        {
            self.visited += self.undo.len() - start + 1;
        }
        // Compact the tail in place: kept entries move down, dropped ones
        // end up past `kept` and are truncated.
        let mut kept = start;
        for i in start..self.undo.len() {
            let held = &mut self.held[self.index[&self.undo[i].key]];
            held.levels.pop();
            if parent == TOP_LEVEL || held.levels.last() == Some(&parent) {
                continue;
            }
            held.levels.push(parent);
            self.undo[i].subxact = parent;
            self.undo.swap(kept, i);
            kept += 1;
        }
        self.undo.truncate(kept);
    }

    /// `my` aborted: restore what it changed, forget what it locked.
    pub fn abort_sub(&mut self, my: u32) {
        while self.undo.last().is_some_and(|u| u.subxact == my) {
            let entry = self.undo.pop().expect("checked");
            match entry.action {
                Action::Restore(before) => {
                    let held = &mut self.held[self.index[&entry.key]];
                    held.levels.pop();
                    held.current = before;
                }
                Action::Forget => self.release(&entry.key),
            }
        }
    }

    /// Scopes whose mark or limit changed since their row was written.
    pub fn dirty(&self) -> impl Iterator<Item = (&[u8], Mark)> {
        self.held.iter().filter(|h| h.current != h.stored).map(|h| (&h.key[..], h.current))
    }

    /// The transaction ended: forget everything, and give back the memory of
    /// a large transaction.
    pub fn clear(&mut self) {
        self.last = None;
        if self.index.capacity() > KEEP_CAPACITY {
            self.index = FastMap::default();
            self.held = Vec::new();
        } else {
            self.index.clear();
            self.held.clear();
        }
        if self.undo.capacity() > KEEP_CAPACITY {
            self.undo = Vec::new();
        } else {
            self.undo.clear();
        }
    }

    /// Allocated capacity (held slots + undo slots), to test that memory is
    /// bounded and returned.
    pub fn capacity(&self) -> usize {
        self.held.capacity() + self.index.capacity() + self.undo.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::counter::NO_LIMIT;

    const K: &[u8] = b"q\0d";
    const J: &[u8] = b"q\0e";

    fn at(mark: i64) -> Mark {
        Mark { mark, limit: NO_LIMIT }
    }

    /// Take one value from a held scope in `subxact`.
    fn take(m: &mut LocalMarks, key: &[u8], subxact: u32) -> i64 {
        m.update(key, subxact, |c| Ok::<_, LimitReached>(Mark { mark: c.mark + 1, ..c })).expect("held").unwrap().mark
    }

    #[test]
    fn an_aborted_savepoint_restores_and_a_committed_one_keeps() {
        let mut m = LocalMarks::default();
        m.hold(K, TOP_LEVEL, at(1), at(1)).unwrap();
        take(&mut m, K, 2);
        take(&mut m, K, 2);
        m.abort_sub(2);
        assert_eq!(m.mark(K), Some(1));
        take(&mut m, K, 3);
        m.commit_sub(3, TOP_LEVEL);
        assert_eq!(m.mark(K), Some(2));
        assert_eq!(m.undo.len(), 0, "the top level needs no undo");
    }

    #[test]
    fn a_limit_set_in_an_aborted_savepoint_is_restored_with_the_mark() {
        let mut m = LocalMarks::default();
        m.hold(K, TOP_LEVEL, at(3), at(3)).unwrap();
        m.update(K, 2, |c| Ok::<_, LimitReached>(Mark { mark: c.mark, limit: 10 })).unwrap().unwrap();
        assert_eq!(m.dirty().collect::<Vec<_>>(), vec![(K, Mark { mark: 3, limit: 10 })], "a new limit is written at commit");
        m.abort_sub(2);
        assert_eq!(m.dirty().count(), 0, "the old limit is back, nothing to write");
    }

    #[test]
    fn a_scope_first_locked_in_an_aborted_savepoint_is_forgotten() {
        let mut m = LocalMarks::default();
        m.hold(K, 2, at(5), at(5)).unwrap();
        take(&mut m, K, 2);
        m.abort_sub(2);
        assert_eq!(m.mark(K), None);
        assert!(m.is_empty());
    }

    #[test]
    fn a_committed_child_merges_into_a_parent_that_has_an_older_value() {
        let mut m = LocalMarks::default();
        m.hold(K, TOP_LEVEL, at(1), at(1)).unwrap();
        take(&mut m, K, 2); // parent 2 records 1
        take(&mut m, K, 3); // child 3 records 2
        m.commit_sub(3, 2);
        assert_eq!(m.undo.len(), 1, "the child's entry is redundant");
        m.abort_sub(2);
        assert_eq!(m.mark(K), Some(1), "the parent's abort restores the value before both");
    }

    #[test]
    fn a_committed_child_whose_parent_has_no_entry_hands_its_entry_up() {
        let mut m = LocalMarks::default();
        m.hold(K, TOP_LEVEL, at(1), at(1)).unwrap();
        take(&mut m, K, 4); // grandchild of 2, child of 3; only 4 changes K
        m.commit_sub(4, 3);
        take(&mut m, K, 3); // already logged at 3 by the merge: no new entry
        assert_eq!(m.undo.len(), 1);
        m.abort_sub(3);
        assert_eq!(m.mark(K), Some(1));
    }

    #[test]
    fn forget_entries_travel_up_and_forget_at_the_parent_abort() {
        let mut m = LocalMarks::default();
        m.hold(J, 3, at(7), at(7)).unwrap();
        take(&mut m, J, 3);
        m.commit_sub(3, 2);
        assert_eq!(m.mark(J), Some(8));
        m.abort_sub(2);
        assert_eq!(m.mark(J), None, "locked inside the aborted parent");
    }

    #[test]
    fn a_million_exception_blocks_inside_one_keep_one_entry() {
        // DO $$ BEGIN BEGIN LOOP BEGIN next_scoped_id(); EXCEPTION ... END; END LOOP; ... $$
        let mut m = LocalMarks::default();
        m.hold(K, 2, at(0), at(1)).unwrap();
        for sub in 3..1_000_003u32 {
            take(&mut m, K, sub);
            m.commit_sub(sub, 2);
        }
        assert_eq!(m.mark(K), Some(1_000_001));
        assert_eq!(m.entries(), 2, "one scope and its one entry at level 2");
        assert!(m.visited <= 2 * 1_000_000, "each commit visits only its own entry: {}", m.visited);
        assert!(m.capacity() < 64, "memory stays bounded: {}", m.capacity());
    }

    #[test]
    fn nested_savepoints_commit_in_linear_work_and_space() {
        // SAVEPOINT s1; take; SAVEPOINT s2; take; ... then COMMIT.
        let n = 200_000u32;
        let mut m = LocalMarks::default();
        m.hold(K, 2, at(0), at(1)).unwrap();
        for sub in 3..n {
            take(&mut m, K, sub);
        }
        assert_eq!(m.undo.len() as u32, n - 2, "one entry per open level");
        for sub in (3..n).rev() {
            m.commit_sub(sub, sub - 1);
            assert!((m.undo.len() as u32) < sub);
        }
        m.commit_sub(2, TOP_LEVEL);
        assert_eq!(m.undo.len(), 0);
        assert_eq!(m.mark(K), Some(i64::from(n) - 2));
        // Relabelling without merging visits 1 + 2 + ... + n entries.
        assert!(m.visited <= 2 * n as usize, "linear: {} entries visited for {n} levels", m.visited);
    }

    #[test]
    fn the_limit_refuses_a_new_scope_or_entry_and_changes_nothing() {
        let mut m = LocalMarks::new(3);
        m.hold(K, TOP_LEVEL, at(0), at(1)).unwrap();
        m.hold(J, 2, at(0), at(1)).unwrap(); // scope + forget entry: 3
        assert_eq!(m.room_for_new_scope(TOP_LEVEL), Err(LimitReached::Entries { limit: 3 }));
        assert_eq!(m.update(K, 2, |_| Ok(at(2))), Some(Err(LimitReached::Entries { limit: 3 })));
        assert_eq!(m.update(J, 2, |_| Err(LimitReached::Entries { limit: 0 })), Some(Err(LimitReached::Entries { limit: 0 })), "a refused change");
        assert_eq!(m.update(b"not held", 2, |_| Ok::<_, LimitReached>(at(1))), None);
        assert_eq!(m.mark(K), Some(1), "a refused change changes nothing");
        take(&mut m, K, TOP_LEVEL); // the top level needs no entry
        assert_eq!(m.mark(K), Some(2));
    }

    #[test]
    fn clearing_after_a_large_transaction_gives_memory_back() {
        let mut m = LocalMarks::default();
        for i in 0..10_000u32 {
            m.hold(&i.to_le_bytes(), TOP_LEVEL, at(0), at(1)).unwrap();
        }
        assert!(m.capacity() >= 10_000);
        m.clear();
        assert_eq!(m.capacity(), 0);
    }

    #[test]
    fn dirty_lists_only_moved_marks() {
        let mut m = LocalMarks::default();
        m.hold(K, TOP_LEVEL, at(3), at(3)).unwrap();
        m.hold(J, 2, at(1), at(4)).unwrap();
        let dirty: Vec<_> = m.dirty().collect();
        assert_eq!(dirty, vec![(J, at(4))]);
    }

    #[test]
    fn a_scope_forgotten_from_the_middle_leaves_the_others_found_and_served() {
        // Three scopes, the first and third locked in savepoint 2; the
        // first is served last, then 2 aborts: the scope that moves into a
        // freed place must still be found under its own key, and the
        // remembered last one must not serve another scope's mark.
        const L: &[u8] = b"q\0f";
        let mut m = LocalMarks::default();
        m.hold(K, 2, at(10), at(10)).unwrap();
        m.hold(J, TOP_LEVEL, at(20), at(20)).unwrap();
        m.hold(L, 2, at(30), at(30)).unwrap();
        assert_eq!(take(&mut m, K, 2), 11);
        m.abort_sub(2);
        assert_eq!((m.mark(K), m.mark(L)), (None, None));
        assert_eq!(m.update(K, TOP_LEVEL, |c| Ok::<_, LimitReached>(at(c.mark + 1))), None, "K is forgotten");
        assert_eq!(take(&mut m, J, TOP_LEVEL), 21);
        m.hold(L, TOP_LEVEL, at(5), at(5)).unwrap();
        assert_eq!(take(&mut m, J, TOP_LEVEL), 22);
        assert_eq!(take(&mut m, L, TOP_LEVEL), 6);
        assert_eq!(take(&mut m, J, TOP_LEVEL), 23);
        let mut dirty: Vec<_> = m.dirty().collect();
        dirty.sort_by_key(|(key, _)| key.to_vec());
        assert_eq!(dirty, vec![(J, at(23)), (L, at(6))]);
    }

    #[test]
    fn the_scope_served_last_is_forgotten_with_everything_at_the_end() {
        let mut m = LocalMarks::default();
        m.hold(K, TOP_LEVEL, at(1), at(1)).unwrap();
        assert_eq!(take(&mut m, K, TOP_LEVEL), 2);
        m.clear();
        assert_eq!(m.update(K, TOP_LEVEL, |c| Ok::<_, LimitReached>(at(c.mark + 1))), None);
        m.hold(J, TOP_LEVEL, at(7), at(7)).unwrap();
        assert_eq!(m.update(K, TOP_LEVEL, |c| Ok::<_, LimitReached>(at(c.mark + 1))), None, "not J's place");
        assert_eq!(take(&mut m, J, TOP_LEVEL), 8);
    }

    #[test]
    fn take_again_declines_what_update_must_do_and_changes_nothing_then() {
        let mut m = LocalMarks::default();
        m.hold(K, TOP_LEVEL, at(1), at(1)).unwrap();
        m.hold(J, TOP_LEVEL, at(50), Mark { mark: 50, limit: 51 }).unwrap();
        assert_eq!(m.take_again(|k| k == K, TOP_LEVEL, 1), None, "J was served last");
        assert_eq!(take(&mut m, K, TOP_LEVEL), 2);
        assert_eq!(m.take_again(|k| k == K, TOP_LEVEL, 1), Some(3));
        // A first change in savepoint 2 needs its undo entry: update's.
        assert_eq!(m.take_again(|k| k == K, 2, 1), None);
        assert_eq!(m.mark(K), Some(3));
        assert_eq!(take(&mut m, K, 2), 4);
        assert_eq!(m.take_again(|k| k == K, 2, 1), Some(5));
        m.abort_sub(2);
        assert_eq!(m.mark(K), Some(3), "the savepoint's takes are undone, those of take_again too");
        // At the limit: declined, for update to refuse.
        assert_eq!(take(&mut m, J, TOP_LEVEL), 51);
        assert_eq!(m.take_again(|k| k == J, TOP_LEVEL, 1), None);
        assert_eq!(m.take_again(|k| k == J, TOP_LEVEL, i64::MAX), None, "no wrap");
        assert_eq!(m.mark(J), Some(51));
        m.clear();
        assert_eq!(m.take_again(|_| true, TOP_LEVEL, 1), None, "nothing is held after the end");
    }

    #[test]
    fn take_again_beside_update_gives_what_update_alone_gives() {
        // Random runs of takes, savepoints, their aborts and commits on four
        // scopes: a state served by take_again where it can must hold the
        // same marks, dirty scopes and undo as one served by update alone.
        const KEYS: [&[u8]; 4] = [b"a\0x", b"a\0y", b"ab\0", b"b\0x"];
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut served_again = 0;
        for _ in 0..200 {
            let (mut fast, mut plain) = (LocalMarks::default(), LocalMarks::default());
            let mut open = vec![TOP_LEVEL];
            let mut next_subxact = 2;
            for _ in 0..60 {
                let subxact = *open.last().unwrap();
                match next(10) {
                    0..=5 => {
                        let key = KEYS[next(4) as usize];
                        // What the allocator does: take_again, and update where it declines.
                        let again = fast.take_again(|k| k == key, subxact, 1);
                        served_again += usize::from(again.is_some());
                        let served = again.or_else(|| fast.update(key, subxact, |c| Ok::<_, LimitReached>(Mark { mark: c.mark + 1, ..c })).map(|r| r.unwrap().mark));
                        let expected = plain.update(key, subxact, |c| Ok::<_, LimitReached>(Mark { mark: c.mark + 1, ..c })).map(|r| r.unwrap().mark);
                        assert_eq!(served, expected);
                        if expected.is_none() {
                            let start = at(100 * next(5) as i64);
                            fast.hold(key, subxact, start, start).unwrap();
                            plain.hold(key, subxact, start, start).unwrap();
                        }
                    }
                    6 => {
                        open.push(next_subxact);
                        next_subxact += 1;
                    }
                    7 if open.len() > 1 => {
                        let my = open.pop().unwrap();
                        fast.abort_sub(my);
                        plain.abort_sub(my);
                    }
                    8 if open.len() > 1 => {
                        let my = open.pop().unwrap();
                        let parent = *open.last().unwrap();
                        fast.commit_sub(my, parent);
                        plain.commit_sub(my, parent);
                    }
                    _ => {}
                }
                for key in KEYS {
                    assert_eq!(fast.mark(key), plain.mark(key));
                }
                assert_eq!(fast.undo.len(), plain.undo.len());
            }
            let sorted = |m: &LocalMarks| {
                let mut d: Vec<_> = m.dirty().map(|(k, v)| (k.to_vec(), v)).collect();
                d.sort_by(|x, y| x.0.cmp(&y.0));
                d
            };
            assert_eq!(sorted(&fast), sorted(&plain));
        }
        assert!(served_again > 1_000, "take_again served {served_again} of the takes");
    }
}
