//! The routing key hash: part of the public contract (router replicas and releases agree on it).
//!
//! A key is xxh3-64 with seed [`KEY_SEED`] over `group ++ [GROUP_SEPARATOR] ++ prefix`. The
//! separator byte 0xFF never occurs in a group id (printable ASCII) nor in UTF-8 text, so
//! `(group "a", prefix "b…")` and `(no group, prefix "a\xFF b…")` cannot be confused in practice.
//! [`KeyHasher`] computes the same value incrementally, so extractors can feed text piece by
//! piece without concatenating it first (xxh3's streaming and one-shot forms agree).

use crate::GroupId;
use xxhash_rust::xxh3::{xxh3_64_with_seed, Xxh3};

/// Seed of the key hash. Changing it moves every key: never change it.
pub const KEY_SEED: u64 = 0x7072_6566_6978_2d72; // "prefix-r"

/// Separator between group and prefix in the hashed bytes (never valid UTF-8, never in a group).
pub const GROUP_SEPARATOR: u8 = 0xFF;

/// xxh3-64 (seed [`KEY_SEED`]) over `group bytes ++ [GROUP_SEPARATOR] ++ prefix bytes`;
/// the group is empty when absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyHash(pub u64);

impl KeyHash {
    /// Hashes a group and an already-cut prefix.
    pub fn new(group: Option<&str>, prefix: &[u8]) -> Self {
        let group = group.map(str::as_bytes).unwrap_or_default();
        // Small keys: one-shot on a stack buffer is cheaper than the streaming state.
        if group.len() <= GroupId::MAX_LEN && prefix.len() <= 192 {
            let mut buf = [0u8; GroupId::MAX_LEN + 1 + 192];
            let n = group.len() + 1 + prefix.len();
            buf[..group.len()].copy_from_slice(group);
            buf[group.len()] = GROUP_SEPARATOR;
            buf[group.len() + 1..n].copy_from_slice(prefix);
            return KeyHash(xxh3_64_with_seed(&buf[..n], KEY_SEED));
        }
        let mut h = KeyHasher::new(group);
        h.update(prefix);
        h.finish()
    }
}

/// Incremental form of [`KeyHash::new`]: feed the prefix in pieces, get the same hash.
#[derive(Clone)]
pub struct KeyHasher {
    state: Xxh3,
}

impl std::fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyHasher").finish_non_exhaustive()
    }
}

impl KeyHasher {
    /// Starts a key for `group` (empty bytes when the request has no group).
    pub fn new(group: &[u8]) -> Self {
        let mut state = Xxh3::with_seed(KEY_SEED);
        state.update(group);
        state.update(&[GROUP_SEPARATOR]);
        Self { state }
    }

    /// Appends prefix bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.state.update(bytes);
    }

    /// The key of everything fed so far.
    pub fn finish(&self) -> KeyHash {
        KeyHash(self.state.digest())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Golden vectors: these values are the public contract. If this test fails, the key
    /// function changed and every deployed router would route differently: do not "fix" the
    /// expected numbers, fix the code.
    #[test]
    fn golden_vectors() {
        let long: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        let cases: [(Option<&str>, &[u8], u64); 6] = [
            (None, b"", 0xa206640e3628924a),
            (None, b"hello", 0xd0f4b8c71e88b55c),
            (Some("tenant-a"), b"hello", 0x399ad72a1a4c1909),
            (Some("tenant-b"), b"hello", 0xa638c24e3cc5a8c6),
            (None, "système\u{1F}prompt".as_bytes(), 0x3c29475e4c73ace1),
            (Some("g"), &long, 0x273ce27d0b21f9db),
        ];
        for (group, prefix, expected) in cases {
            let got = KeyHash::new(group, prefix).0;
            assert_eq!(
                got,
                expected,
                "group {group:?}, prefix of {} bytes: got {got:#018x}",
                prefix.len()
            );
        }
    }

    #[test]
    fn group_separates_tenants() {
        assert_ne!(KeyHash::new(Some("a"), b"x"), KeyHash::new(Some("b"), b"x"));
        assert_ne!(KeyHash::new(None, b"x"), KeyHash::new(Some("x"), b""));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        #[test]
        fn streaming_matches_one_shot(
            group in proptest::option::of("[ -~]{1,64}"),
            prefix in proptest::collection::vec(any::<u8>(), 0..1000),
            cut in 0usize..1000,
        ) {
            let cut = cut.min(prefix.len());
            let mut h = KeyHasher::new(group.as_deref().unwrap_or("").as_bytes());
            h.update(&prefix[..cut]);
            h.update(&prefix[cut..]);
            prop_assert_eq!(h.finish(), KeyHash::new(group.as_deref(), &prefix));
        }
    }
}
