//! Public IDs (#50): a short, non-guessable, reversible public form of a
//! 64-bit ID under a named key — the seeds' "random public ID wherever a
//! link must not be guessable", without a second column.
//!
//! The permutation is NIST SP 800-38G FF1 over AES-256 (the `fpe` and `aes`
//! crates; no cryptography of ours), radix 32, 13 numerals: the ID's 64
//! bits are 13 base-32 digits (the top one below 16), FF1 maps them to 13
//! digits over the whole 2^65 domain, and those are the form's body in
//! Crockford's base-32 alphabet (no I, L, O or U; read case-insensitively,
//! I and L as 1, O as 0, hyphens ignored). The only code of ours on the
//! cipher's path is the numeral arithmetic FF1 asks of a numeral string
//! (`Digits`): with a radix of 32 its "mod radix^m" is a mask, and a unit
//! test holds it equal to the crate's own general implementation.
//!
//! A form is 15 characters: the key version's slot (`(version - 1) mod
//! 32`), the 13-digit body, and a check character. The check is
//! `tag + sum(alpha^(i+1) * s_i)` over the first 14 symbols in GF(32)
//! (alpha a primitive element, so the weights differ at every position
//! below 31): one mistyped character, or two characters swapped, always
//! changes it. The tag is 5 bits of the key (AES of a constant block), so a
//! form made with another key fails the check 31 times in 32, and its body
//! then also decrypts to a value of 2^64 or more half of the time: another
//! key's form is refused 63 times in 64, and the 64th decodes to an
//! unrelated ID. A public ID is not access control (docs/public-ids.md).

use aes::Aes256;
use cipher::{BlockCipherEncrypt, KeyInit};
use fpe::ff1::{NumeralString, Operations, FF1};

/// Crockford's base-32 alphabet.
const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
/// Digits of the body: 13 base-32 digits hold 65 bits.
const BODY: usize = 13;
/// Characters of a form: slot, body, check.
pub const FORM_LEN: usize = BODY + 2;
/// Key versions whose forms can be told apart by their slot symbol: at most
/// this many versions of one key are live at once.
pub const SLOTS: u32 = 32;
/// Bytes of a key.
pub const KEY_LEN: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublicIdError {
    #[error("a public ID is {FORM_LEN} characters of Crockford's base-32 alphabet (hyphens ignored); this has {0}")]
    Length(usize),
    #[error("a public ID is written in Crockford's base-32 alphabet (0-9, A-Z without I, L, O, U; case-insensitive); {0:?} is not in it")]
    Character(char),
    #[error("the public ID's check character does not match: it was mistyped, or made with another key or a retired version of this one")]
    Check,
    #[error("the public ID was not made with this key")]
    OtherKey,
    #[error("a public key is {KEY_LEN} bytes; this is {0}")]
    KeyLength(usize),
    #[error("a key version is 1 or more; this is {0}")]
    Version(i64),
}

/// One version of a named key, ready to encode and decode (the AES key
/// schedule made once).
pub struct PublicKey {
    slot: u8,
    tag: u8,
    ff1: FF1<Aes256>,
}

impl PublicKey {
    pub fn new(version: i64, key: &[u8]) -> Result<PublicKey, PublicIdError> {
        if key.len() != KEY_LEN {
            return Err(PublicIdError::KeyLength(key.len()));
        }
        let slot = slot_of(version)?;
        // 5 bits of the key for the check, from a block FF1 never encrypts
        // alone (its PRF's first block starts [1, 2, 1, ...]).
        let mut block = aes::Block::from(*b"pg_ticket tag v1");
        Aes256::new_from_slice(key).map_err(|_| PublicIdError::KeyLength(key.len()))?.encrypt_block(&mut block);
        let ff1 = FF1::<Aes256>::new(key, SLOTS).expect("32 is a radix FF1 takes");
        Ok(PublicKey { slot, tag: block[0] & 31, ff1 })
    }

    /// The public form of `id`.
    pub fn encode(&self, id: i64) -> String {
        let plain = Digits::whole(id as u64 as u128);
        let body = self.ff1.encrypt(&[], &plain).expect("13 digits below 32 are a valid numeral string").value;
        let mut symbols = [0u8; FORM_LEN];
        symbols[0] = self.slot;
        for (i, s) in symbols[1..=BODY].iter_mut().enumerate() {
            *s = ((body >> (5 * (BODY - 1 - i))) & 31) as u8;
        }
        symbols[FORM_LEN - 1] = check(&symbols[..FORM_LEN - 1], self.tag);
        symbols.iter().map(|s| ALPHABET[*s as usize] as char).collect()
    }

    /// The ID whose form under this key is `form`.
    pub fn decode(&self, form: &str) -> Result<i64, PublicIdError> {
        let symbols = parse(form)?;
        if symbols[0] != self.slot || check(&symbols[..FORM_LEN - 1], self.tag) != symbols[FORM_LEN - 1] {
            return Err(PublicIdError::Check);
        }
        let body = symbols[1..=BODY].iter().fold(0u128, |v, s| v << 5 | *s as u128);
        let plain = self.ff1.decrypt(&[], &Digits::whole(body)).expect("13 digits below 32 are a valid numeral string").value;
        u64::try_from(plain).map(|v| v as i64).map_err(|_| PublicIdError::OtherKey)
    }
}

/// The slot symbol of a key version.
pub fn slot_of(version: i64) -> Result<u8, PublicIdError> {
    if version < 1 {
        return Err(PublicIdError::Version(version));
    }
    Ok(((version - 1) % SLOTS as i64) as u8)
}

/// The slot a form names: which of a key's live versions decodes it.
pub fn slot_in(form: &str) -> Result<u8, PublicIdError> {
    Ok(parse(form)?[0])
}

/// A form's symbols, read as Crockford reads them.
fn parse(form: &str) -> Result<[u8; FORM_LEN], PublicIdError> {
    let mut symbols = [0u8; FORM_LEN];
    let mut n = 0;
    for c in form.chars().filter(|c| *c != '-') {
        let value = match c.to_ascii_uppercase() {
            'O' => 0,
            'I' | 'L' => 1,
            u => ALPHABET.iter().position(|a| *a as char == u).ok_or(PublicIdError::Character(c))? as u8,
        };
        if n < FORM_LEN {
            symbols[n] = value;
        }
        n += 1;
    }
    if n != FORM_LEN {
        return Err(PublicIdError::Length(n));
    }
    Ok(symbols)
}

/// GF(32) with x^5 + x^2 + 1 (primitive: x generates all 31 non-zero
/// elements).
fn gf_mul(mut a: u8, mut b: u8) -> u8 {
    let mut product = 0;
    while b != 0 {
        if b & 1 != 0 {
            product ^= a;
        }
        b >>= 1;
        a <<= 1;
        if a & 32 != 0 {
            a ^= 0b100101;
        }
    }
    product
}

fn check(symbols: &[u8], tag: u8) -> u8 {
    let mut weight = 1u8;
    symbols.iter().fold(tag, |sum, s| {
        weight = gf_mul(weight, 2);
        sum ^ gf_mul(weight, *s)
    })
}

/// A string of base-32 numerals as one integer (at most 13 digits, 65
/// bits): FF1's halves are 6 and 7 digits, and "mod 32^m" is a mask.
struct Digits {
    value: u128,
    count: usize,
}

impl Digits {
    fn whole(value: u128) -> Digits {
        Digits { value, count: BODY }
    }

    fn mask(m: usize) -> u128 {
        (1u128 << (5 * m)) - 1
    }

    /// NUM of a big-endian byte string, mod 32^m: its low 5m bits.
    fn low_bits(bytes: impl Iterator<Item = u8>, m: usize) -> u128 {
        bytes.fold(0u128, |v, b| v << 8 | b as u128) & Self::mask(m)
    }
}

impl NumeralString for Digits {
    type Ops = Digits;

    fn is_valid(&self, radix: u32) -> bool {
        radix == SLOTS && self.value <= Self::mask(self.count)
    }

    fn numeral_count(&self) -> usize {
        self.count
    }

    fn split(&self) -> (Digits, Digits) {
        let v = self.count - self.count / 2;
        (Digits { value: self.value >> (5 * v), count: self.count / 2 }, Digits { value: self.value & Self::mask(v), count: v })
    }

    fn concat(a: Digits, b: Digits) -> Digits {
        Digits { value: a.value << (5 * b.count) | b.value, count: a.count + b.count }
    }
}

/// `to_be_bytes`'s answer without an allocation: b is at most 16 here.
pub struct BeBytes {
    bytes: [u8; 16],
    from: usize,
}

impl AsRef<[u8]> for BeBytes {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[self.from..]
    }
}

impl Operations for Digits {
    type Bytes = BeBytes;

    fn numeral_count(&self) -> usize {
        self.count
    }

    fn to_be_bytes(&self, _radix: u32, b: usize) -> BeBytes {
        BeBytes { bytes: self.value.to_be_bytes(), from: 16 - b }
    }

    fn add_mod_exp(self, other: impl Iterator<Item = u8>, _radix: u32, m: usize) -> Digits {
        // other has at most 16 bytes here (d = 12 for halves of 7 digits),
        // so folding into a u128 keeps its low 5m bits exactly.
        let sum = self.value.wrapping_add(Self::low_bits(other, m)) & Self::mask(m);
        Digits { value: sum, count: m }
    }

    fn sub_mod_exp(self, other: impl Iterator<Item = u8>, _radix: u32, m: usize) -> Digits {
        let difference = self.value.wrapping_sub(Self::low_bits(other, m)) & Self::mask(m);
        Digits { value: difference, count: m }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fpe::ff1::FlexibleNumeralString;

    fn key(byte: u8) -> Vec<u8> {
        (0..KEY_LEN as u8).map(|i| i.wrapping_mul(31) ^ byte).collect()
    }

    /// A tiny deterministic generator for the tests' inputs.
    fn values(n: usize) -> impl Iterator<Item = i64> {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        (0..n).map(move |_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as i64
        })
    }

    #[test]
    fn our_numeral_arithmetic_gives_what_the_crates_own_does() {
        let ff1 = FF1::<Aes256>::new(&key(7), 32).unwrap();
        for id in values(300).chain([0, 1, -1, i64::MIN, i64::MAX]) {
            let digits: Vec<u16> = (0..BODY).rev().map(|i| ((id as u64 as u128 >> (5 * i)) & 31) as u16).collect();
            let theirs: Vec<u16> = ff1.encrypt(&[], &FlexibleNumeralString::from(digits)).unwrap().into();
            let ours = ff1.encrypt(&[], &Digits::whole(id as u64 as u128)).unwrap().value;
            let ours: Vec<u16> = (0..BODY).rev().map(|i| ((ours >> (5 * i)) & 31) as u16).collect();
            assert_eq!(ours, theirs, "{id}");
        }
    }

    #[test]
    fn every_id_round_trips_in_fifteen_url_safe_characters() {
        let k = PublicKey::new(1, &key(1)).unwrap();
        for id in values(2000).chain([0, 1, -1, i64::MIN, i64::MAX, i64::MIN + 1, i64::MAX - 1]) {
            let form = k.encode(id);
            assert_eq!(form.len(), FORM_LEN);
            assert!(form.bytes().all(|b| ALPHABET.contains(&b)), "{form}");
            assert_eq!(k.decode(&form), Ok(id), "{form}");
            assert_eq!(k.decode(&form.to_lowercase()), Ok(id));
            let hyphenated = format!("{}-{}-{}", &form[..5], &form[5..10], &form[10..]);
            assert_eq!(k.decode(&hyphenated), Ok(id));
        }
    }

    #[test]
    fn one_mistyped_character_and_two_swapped_are_always_refused() {
        let k = PublicKey::new(3, &key(2)).unwrap();
        for id in values(200) {
            let form: Vec<u8> = k.encode(id).into_bytes();
            for i in 0..FORM_LEN {
                for c in ALPHABET.iter().filter(|c| **c != form[i]) {
                    let mut typo = form.clone();
                    typo[i] = *c;
                    assert_eq!(k.decode(std::str::from_utf8(&typo).unwrap()), Err(PublicIdError::Check));
                }
                for j in i + 1..FORM_LEN {
                    if form[i] != form[j] {
                        let mut swapped = form.clone();
                        swapped.swap(i, j);
                        assert_eq!(k.decode(std::str::from_utf8(&swapped).unwrap()), Err(PublicIdError::Check));
                    }
                }
            }
        }
    }

    #[test]
    fn another_keys_forms_are_refused_unless_its_tag_matches_and_then_half_of_them() {
        let a = PublicKey::new(1, &key(1)).unwrap();
        let forms: Vec<(i64, String)> = values(1000).map(|id| (id, a.encode(id))).collect();
        let mut matching = 0;
        for other in 0..640u32 {
            let material: Vec<u8> = (0..KEY_LEN as u32).map(|i| (i * 7 + other * 131 + other / 3) as u8 ^ 0x5A).collect();
            let b = PublicKey::new(1, &material).unwrap();
            let accepted = forms.iter().filter(|(_, f)| b.decode(f).is_ok()).count();
            if b.tag == a.tag {
                matching += 1;
                assert!((400..=600).contains(&accepted), "a key of the same tag accepted {accepted} of 1000");
                assert!(forms.iter().all(|(id, f)| b.decode(f) != Ok(*id)), "another key decoded a form to its own ID");
            } else {
                assert_eq!(accepted, 0);
            }
        }
        // 1 key in 32: 20 of 640 expected.
        assert!((5..=45).contains(&matching), "{matching} of 640 keys share the tag");
    }

    /// The attacker's question: do many (ID, form) pairs of one key say
    /// anything about the form of the next ID? Over 20 000 consecutive IDs
    /// (a table's keys as they are made), each of the body's 65 bits flips
    /// from one ID's form to the next with a frequency within 0.5 +- 0.02,
    /// and agrees with each of the ID's 16 low bits within 0.5 +- 0.02 (a
    /// random permutation's standard deviation is 0.0035: +-5.7 of them).
    /// Crockford base 32 of the ID itself fails both at once; so would
    /// hashids' or Sqids' shuffled alphabets (their low digits follow the ID).
    #[test]
    fn consecutive_ids_forms_show_no_bias_a_distinguisher_can_use() {
        let k = PublicKey::new(1, &key(4)).unwrap();
        let body = |id: i64| {
            let s = parse(&k.encode(id)).unwrap();
            s[1..=BODY].iter().fold(0u128, |v, x| v << 5 | *x as u128)
        };
        let n = 20_000i64;
        let start = 1_234_567_890i64;
        let mut flips = [0u32; 65];
        let mut agree = [[0u32; 16]; 65];
        let mut previous = body(start - 1);
        for id in start..start + n {
            let b = body(id);
            for (bit, (flip, agree)) in flips.iter_mut().zip(agree.iter_mut()).enumerate() {
                *flip += ((b ^ previous) >> bit & 1) as u32;
                for (low, count) in agree.iter_mut().enumerate() {
                    *count += ((b >> bit & 1) == (id as u128 >> low & 1)) as u32;
                }
            }
            previous = b;
        }
        let off = |count: u32| (count as f64 / n as f64 - 0.5).abs();
        assert!(flips.iter().all(|f| off(*f) < 0.02), "{flips:?}");
        assert!(agree.iter().flatten().all(|a| off(*a) < 0.02));
        // The same statistic on the plain ID's bits does find it (the test can fail).
        let plain_flips = (start..start + n).filter(|id| (id ^ (id - 1)) & 2 != 0).count() as u32;
        assert!(off(plain_flips) >= 0.02 || off((start..start + n).filter(|id| (id ^ (id - 1)) & 1 != 0).count() as u32) >= 0.02);
    }

    #[test]
    fn versions_name_their_slot_and_bad_input_is_named() {
        let k1 = PublicKey::new(1, &key(1)).unwrap();
        let k2 = PublicKey::new(2, &key(1)).unwrap();
        let k33 = PublicKey::new(33, &key(1)).unwrap();
        let f = k2.encode(5);
        assert_eq!(slot_in(&f), Ok(1));
        assert_eq!(k1.decode(&f), Err(PublicIdError::Check));
        assert_eq!(k33.decode(&k1.encode(5)), Ok(5), "version 33 reuses slot 0");
        assert_eq!(k1.decode("short"), Err(PublicIdError::Length(5)));
        assert_eq!(k1.decode("0123456789ABCDU"), Err(PublicIdError::Character('U')));
        assert_eq!(k1.decode("0123456789ABCDEF"), Err(PublicIdError::Length(16)));
        assert_eq!(k1.decode("0123456789ABCD\u{e9}"), Err(PublicIdError::Character('\u{e9}')));
        assert!(matches!(PublicKey::new(1, &[0; 16]), Err(PublicIdError::KeyLength(16))));
        assert!(matches!(PublicKey::new(0, &key(1)), Err(PublicIdError::Version(0))));
    }

    /// The vectors the SQL functions and the Python package are checked
    /// against too (docs/public-ids.md): key bytes 0..32, version 1.
    pub const VECTORS: &[(i64, &str)] = &[
        (0, "01AHN4TC7RHJWK0"),
        (1, "0G9P3KZK4JK77JC"),
        (2, "0F7VNYDRHB74GNS"),
        (42, "0F8R8BWDRQ5F6SB"),
        (1_000_000, "0QK1R1QA2MW62CA"),
        (i64::MAX, "0N1K0PTREZBAR34"),
        (-1, "011XZ2HEGG8ZSHS"),
        (i64::MIN, "05JNEXGYWDHWZ83"),
    ];

    #[test]
    fn the_shared_vectors() {
        let key: Vec<u8> = (0..32).collect();
        let k = PublicKey::new(1, &key).unwrap();
        for (id, form) in VECTORS {
            assert_eq!(k.encode(*id), *form);
            assert_eq!(k.decode(form), Ok(*id));
        }
    }
}
