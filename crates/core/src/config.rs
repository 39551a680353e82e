//! Validated configuration values shared by every strategy.

/// A configuration value out of its allowed range; the message names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// `prefix_length` outside 1024..=65536.
    #[error("prefix_length must be within 1024..=65536, got {0}")]
    PrefixLength(u64),
    /// `concurrency_threshold` outside 1..=1024.
    #[error("concurrency_threshold must be within 1..=1024, got {0}")]
    ConcurrencyThreshold(u64),
    /// `balance_factor` not greater than 1 (or not finite).
    #[error("balance_factor must be a finite number greater than 1, got {0}")]
    BalanceFactor(f64),
    /// Unknown strategy or overflow policy name.
    #[error("unknown {field} '{value}' (expected one of: {expected})")]
    UnknownName {
        field: &'static str,
        value: String,
        expected: &'static str,
    },
    /// Unknown strategy name (the list comes from the registry).
    #[error("unknown strategy '{value}' (expected one of: {expected})")]
    UnknownStrategy { value: String, expected: String },
    /// A strategy parameter that is unknown to the strategy or has a bad value.
    #[error("strategy '{strategy}': parameter '{param}': {why}")]
    Param {
        strategy: &'static str,
        param: String,
        why: String,
    },
}

/// How much of a request forms its routing key: bytes for the native API, Unicode scalar values
/// for the OpenAI APIs. Always within 1024..=65536.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PrefixLength(u32);

impl PrefixLength {
    /// Smallest allowed prefix length.
    pub const MIN: u32 = 1024;
    /// Largest allowed prefix length.
    pub const MAX: u32 = 65536;

    /// Validates `n`.
    pub fn new(n: u64) -> Result<Self, ConfigError> {
        if (Self::MIN as u64..=Self::MAX as u64).contains(&n) {
            Ok(Self(n as u32))
        } else {
            Err(ConfigError::PrefixLength(n))
        }
    }

    /// The length as a `usize`.
    pub fn get(self) -> usize {
        self.0 as usize
    }
}

impl Default for PrefixLength {
    /// 1024, the smallest.
    fn default() -> Self {
        Self(Self::MIN)
    }
}

/// In-flight requests an instance may hold before prefix-aware routing overflows. 1..=1024.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConcurrencyThreshold(u32);

impl ConcurrencyThreshold {
    /// Smallest allowed threshold.
    pub const MIN: ConcurrencyThreshold = ConcurrencyThreshold(1);
    /// Largest allowed threshold.
    pub const MAX: ConcurrencyThreshold = ConcurrencyThreshold(1024);

    /// Validates `n`.
    pub fn new(n: u64) -> Result<Self, ConfigError> {
        if (1..=1024).contains(&n) {
            Ok(Self(n as u32))
        } else {
            Err(ConfigError::ConcurrencyThreshold(n))
        }
    }

    /// The threshold.
    pub fn get(self) -> u32 {
        self.0
    }
}
