//! Prefix cache of hash-chained blocks with LRU eviction of unreferenced blocks.

/// Block prefix cache.
#[derive(Debug)]
pub struct PrefixCache {}
