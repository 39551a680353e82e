//! What an engine says about its KV cache: batches of block events, as vLLM publishes them
//! (`vllm/distributed/kv_events.py`: `KVEventBatch`, `BlockStored`, `BlockRemoved`,
//! `AllBlocksCleared`), with every field the decoder understands and defaults for those left out.

/// A block's hash as the engine names it. vLLM sends `bytes` (newer) or an integer (older,
/// signed or unsigned 64-bit): integers are taken as their 64 bits, bytes are folded to 64 bits
/// with xxh3. Only equality matters (a `BlockRemoved` names blocks a `BlockStored` named), and
/// one engine always uses one form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EngineHash(pub u64);

impl EngineHash {
    /// The hash of a `bytes` block hash.
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Self(xxhash_rust::xxh3::xxh3_64(bytes))
    }
}

/// Where the engine keeps a block. Only [`Medium::Gpu`] (or no medium given, as older vLLM
/// sends) is resident for routing: a block offloaded to CPU memory saves recomputation but
/// must be copied back first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Medium {
    /// `"GPU"`, or none given.
    #[default]
    Gpu,
    /// `"CPU"` (vLLM's offloading connector).
    Cpu,
    /// Anything else (`"DISK"`, a connector's own name).
    Other(String),
}

impl Medium {
    /// From the wire: `None` is the GPU (vLLM sends none for its own cache).
    pub fn parse(s: Option<&str>) -> Self {
        match s {
            None => Medium::Gpu,
            Some(s) if s.eq_ignore_ascii_case("gpu") => Medium::Gpu,
            Some(s) if s.eq_ignore_ascii_case("cpu") => Medium::Cpu,
            Some(s) => Medium::Other(s.to_string()),
        }
    }
    /// The wire name (`None` for the GPU: what older engines send).
    pub fn name(&self) -> &str {
        match self {
            Medium::Gpu => "GPU",
            Medium::Cpu => "CPU",
            Medium::Other(s) => s,
        }
    }
}

/// `BlockStored`: blocks `block_hashes` (in order, each the child of the one before, the first
/// the child of `parent`) now hold `token_ids` (`block_size` per block).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BlockStored {
    pub block_hashes: Vec<EngineHash>,
    pub parent: Option<EngineHash>,
    pub token_ids: Vec<u32>,
    pub block_size: u32,
    pub lora_id: Option<i64>,
    pub lora_name: Option<String>,
    pub medium: Medium,
    pub group_idx: Option<i64>,
    /// Whether any block carries `extra_keys` beyond its adapter (multimodal hashes, a cache
    /// salt): its hash then covers more than its tokens and adapter.
    pub extra_keys: bool,
}

/// `BlockRemoved`: the engine evicted these blocks from `medium`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BlockRemoved {
    pub block_hashes: Vec<EngineHash>,
    pub medium: Medium,
    pub group_idx: Option<i64>,
}

/// One event.
#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
    Stored(BlockStored),
    Removed(BlockRemoved),
    /// `AllBlocksCleared`: the engine emptied its cache (a reset, or a restart).
    Cleared,
}

impl KvEvent {
    /// The wire tag (the class name vLLM tags each event with).
    pub fn tag(&self) -> &'static str {
        match self {
            KvEvent::Stored(_) => "BlockStored",
            KvEvent::Removed(_) => "BlockRemoved",
            KvEvent::Cleared => "AllBlocksCleared",
        }
    }
}

/// One published message's payload.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EventBatch {
    /// The engine's wall clock when it built the batch (Unix seconds).
    pub ts: f64,
    pub events: Vec<KvEvent>,
    pub data_parallel_rank: Option<i64>,
    /// Events of a type this decoder does not know, skipped (a newer engine's additions).
    pub unknown_events: u32,
}
