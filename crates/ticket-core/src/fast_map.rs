//! The hash map of the allocation path, and the comparison of its memos
//! (`same_key`). std's SipHash cost 12% of a `next_scoped_id()` call served
//! from the transaction's held marks (perf, 1M calls in one transaction);
//! foldhash's is a fraction of that.
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

/// `a == b` for the short keys the allocation paths' one-entry memos
/// compare (a scope's encoded key, a queue and a domain name): in 8-byte
/// words, inline. A slice comparison calls libc's memcmp, whose call and
/// dispatch cost about 4 ns each (perf: 14% of a `next_scoped_id()` that
/// compares three keys). Longer keys go to memcmp.
#[inline]
pub fn same_key(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n > 64 {
        return a == b;
    }
    if n < 8 {
        // Two overlapping 4-byte words, or the bytes one by one.
        if n >= 4 {
            let word = |s: &[u8], i: usize| u32::from_ne_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]]);
            return word(a, 0) == word(b, 0) && word(a, n - 4) == word(b, n - 4);
        }
        return a.iter().zip(b).all(|(x, y)| x == y);
    }
    let word = |s: &[u8], i: usize| u64::from_ne_bytes(s[i..i + 8].try_into().expect("8 bytes"));
    let mut i = 0;
    while i + 8 < n {
        if word(a, i) != word(b, i) {
            return false;
        }
        i += 8;
    }
    // The last word, overlapping the one before it when n is not a multiple of 8.
    word(a, n - 8) == word(b, n - 8)
}

#[cfg(test)]
mod tests {
    use super::same_key;

    #[test]
    fn same_key_agrees_with_slice_equality_at_every_length_and_every_differing_byte() {
        for n in 0..=80usize {
            let a: Vec<u8> = (0..n).map(|i| (i * 7 + 1) as u8).collect();
            assert!(same_key(&a, &a.clone()), "equal, length {n}");
            for at in 0..n {
                let mut b = a.clone();
                b[at] ^= 0x40;
                assert!(!same_key(&a, &b), "length {n}, byte {at} differs");
            }
            let mut longer = a.clone();
            longer.push(0);
            assert!(!same_key(&a, &longer), "length {n} against {}", n + 1);
        }
    }
}
