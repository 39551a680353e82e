//! `cache-aware`'s parameters (shared with `kv-aware`) and the settings read from them.

use super::load::Cost;
use crate::strategy::ParamSpec;
use crate::{ChainSpec, ConfigError, StrategyConfig};

/// Its parameters (also `kv-aware`'s).
pub(crate) const PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "index-blocks",
        default: "1048576",
        help: "blocks the index tracks for the whole fleet (48-56 bytes each, fixed at start)",
    },
    ParamSpec {
        name: "block-chars",
        default: "128",
        help: "characters (bytes for the native API) per chain block",
    },
    ParamSpec {
        name: "max-chars",
        default: "262144",
        help: "how far into a prompt the chain reads",
    },
    ParamSpec {
        name: "prefill-us-per-char",
        default: "5",
        help: "prior prefill cost per character in microseconds (learned per instance)",
    },
    ParamSpec {
        name: "decode-chars",
        default: "256",
        help: "prior: prefill-equivalent characters each decoding request adds to an instance's time to first token (learned per instance)",
    },
    ParamSpec {
        name: "progress-floor",
        default: "0.6",
        help: "share of an instance's queued prefill always counted ahead of a new request; above it, each queued request counts less with the time since it was sent over its expected time to first token (1: all of it until first tokens)",
    },
    ParamSpec {
        name: "tie-tolerance",
        default: "0.1",
        help: "candidates within this fraction of the whole prompt's prefill cost of the best expected TTFT count as tied",
    },
    ParamSpec {
        name: "cold-tie-tolerance",
        default: "0.5",
        help: "the same for a prompt nobody holds any of: a wide tie places new prefixes by rendezvous among all but clearly busier instances, so router replicas agree",
    },
    ParamSpec {
        name: "max-share",
        default: "1.2",
        help: "an instance whose share of recent requests would exceed this multiple of the mean takes no more until others catch up, so a hot prefix gains homes (0: off)",
    },
    ParamSpec {
        name: "hold-share",
        default: "1.25",
        help: "past max-share, an instance still takes the requests it alone holds most of (a revisit it would otherwise lose to a miss), up to this multiple of the mean (at most max-share's bound when lower; 0: no exemption)",
    },
    ParamSpec {
        name: "offload-credit",
        default: "0.8",
        help: "kv-aware: share of a block's prefill saved where the engine can load it from an offloaded (CPU) copy instead of computing it (0: none, 1: as good as a GPU hit)",
    },
    ParamSpec {
        name: "cache-chars",
        default: "0",
        help: "each instance's prefix cache in characters (0: learned from cached_tokens)",
    },
];

/// Cache-aware settings.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheAwareConfig {
    /// Index budget in blocks.
    pub index_blocks: usize,
    /// How chains are cut.
    pub chain: ChainSpec,
    /// Prior cost.
    pub prior: Cost,
    /// Share of an instance's queued prefill always counted ahead of a new request (see
    /// [`load`](super::load)).
    pub progress_floor: f64,
    /// Relative tolerance for ties.
    pub tie_tolerance: f64,
    /// Relative tolerance for ties where no candidate holds any of the prompt.
    pub cold_tie_tolerance: f64,
    /// Starting estimate of each instance's cache, in blocks (`u32::MAX`: unknown).
    pub cache_blocks: u32,
    /// Bound on an instance's share of recent requests, as a multiple of the mean (0: none).
    pub max_share: f64,
    /// Past `max_share`, the bound for requests one instance alone holds most of (0: none).
    pub hold_share: f64,
    /// Share of the prefill an offloaded block saves (`kv-aware`'s reports).
    pub offload_credit: f64,
}

impl CacheAwareConfig {
    /// Reads and checks the parameters.
    pub fn from_strategy(c: &StrategyConfig) -> Result<Self, ConfigError> {
        let bad = |param: &str, why: &str| ConfigError::Param {
            strategy: "cache-aware",
            param: param.to_string(),
            why: why.to_string(),
        };
        let index_blocks: usize = c.param("index-blocks")?;
        if !(1..=1 << 28).contains(&index_blocks) {
            return Err(bad("index-blocks", "must be within 1..=268435456"));
        }
        let block_units: u32 = c.param("block-chars")?;
        if !(16..=65536).contains(&block_units) {
            return Err(bad("block-chars", "must be within 16..=65536"));
        }
        let max_units: u32 = c.param("max-chars")?;
        if max_units < block_units || max_units > 16 << 20 {
            return Err(bad("max-chars", "must be within block-chars..=16777216"));
        }
        let us: f64 = c.param("prefill-us-per-char")?;
        if !(us.is_finite() && us > 0.0) {
            return Err(bad("prefill-us-per-char", "must be a positive number"));
        }
        let decode_units: f64 = c.param("decode-chars")?;
        if !(decode_units.is_finite() && decode_units >= 0.0) {
            return Err(bad("decode-chars", "must be a number ≥ 0"));
        }
        let progress_floor: f64 = c.param("progress-floor")?;
        if !(0.0..=1.0).contains(&progress_floor) {
            return Err(bad("progress-floor", "must be within 0..=1"));
        }
        let tie_tolerance: f64 = c.param("tie-tolerance")?;
        if !(0.0..=1.0).contains(&tie_tolerance) {
            return Err(bad("tie-tolerance", "must be within 0..=1"));
        }
        let cold_tie_tolerance: f64 = c.param("cold-tie-tolerance")?;
        if !(0.0..=1.0).contains(&cold_tie_tolerance) {
            return Err(bad("cold-tie-tolerance", "must be within 0..=1"));
        }
        let max_share: f64 = c.param("max-share")?;
        if !(max_share == 0.0 || (1.0..=100.0).contains(&max_share)) {
            return Err(bad("max-share", "must be 0 (off) or within 1..=100"));
        }
        let hold_share: f64 = c.param("hold-share")?;
        if !(hold_share == 0.0 || (1.0..=100.0).contains(&hold_share)) {
            return Err(bad("hold-share", "must be 0 (off) or within 1..=100"));
        }
        let offload_credit: f64 = c.param("offload-credit")?;
        if !(0.0..=1.0).contains(&offload_credit) {
            return Err(bad("offload-credit", "must be within 0..=1"));
        }
        let cache_chars: u64 = c.param("cache-chars")?;
        let cache_blocks = if cache_chars == 0 {
            u32::MAX
        } else {
            (cache_chars / u64::from(block_units)).clamp(1, u64::from(u32::MAX - 1)) as u32
        };
        Ok(Self {
            index_blocks,
            chain: ChainSpec {
                block_units,
                max_units,
            },
            prior: Cost {
                base_s: 0.0,
                per_unit_s: us * 1e-6,
                per_decoding_s: decode_units * us * 1e-6,
            },
            progress_floor,
            tie_tolerance,
            cold_tie_tolerance,
            cache_blocks,
            max_share,
            hold_share,
            offload_credit,
        })
    }
}
