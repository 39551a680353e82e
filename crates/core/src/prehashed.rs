//! Maps keyed by values that are already hashes (an instance's [`crate::Instance::id_hash`], a
//! request's key: xxh3 outputs, every bit mixed). The standard map hashes them again with
//! SipHash, about 500 instructions per lookup under callgrind, and `cache-aware` looks up
//! several per request; these maps use the key as its own hash.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

/// A `HashMap` whose `u64` keys are hashes already.
pub type PreHashedMap<V> = HashMap<u64, V, PreHashed>;

/// Builds [`PassThrough`] hashers.
#[derive(Debug, Default, Clone, Copy)]
pub struct PreHashed;

impl BuildHasher for PreHashed {
    type Hasher = PassThrough;
    fn build_hasher(&self) -> PassThrough {
        PassThrough(0)
    }
}

/// Hands a `u64` key back as its hash. Anything else written is folded in, a byte at a time:
/// a fair hash for short keys that are the operator's configuration rather than a peer's
/// choice (the server's idle connections by instance URL use it so), cheaper than SipHash.
#[derive(Debug, Default, Clone, Copy)]
pub struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 ^= n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_u64_key_is_its_own_hash_and_the_map_works() {
        assert_eq!(PreHashed.hash_one(0xDEAD_BEEF_u64), 0xDEAD_BEEF);
        let mut m: PreHashedMap<u16> = PreHashedMap::default();
        for i in 0..1000u64 {
            m.insert(i.wrapping_mul(0x9E37_79B9_7F4A_7C15), i as u16);
        }
        for i in 0..1000u64 {
            assert_eq!(
                m.get(&i.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
                Some(&(i as u16))
            );
        }
        assert_ne!(PreHashed.hash_one("a"), PreHashed.hash_one("b"));
    }
}
