//! The routing key hash: part of the public contract (router replicas and releases agree on it).

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
        todo!("{group:?} {prefix:?}")
    }
}
