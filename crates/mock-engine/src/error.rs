//! Errors of configuring and starting a mock engine.

use std::net::SocketAddr;

/// A configuration that cannot run.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `--preset` names no engine preset.
    #[error("unknown engine preset `{0}` (see `prefix-router presets`)")]
    UnknownPreset(String),
    /// The engine configuration itself is invalid.
    #[error(transparent)]
    Engine(#[from] prefix_router_engine_model::ConfigError),
    /// `time_scale` is not a positive finite number.
    #[error("`time_scale` must be a positive finite number, got {0}")]
    TimeScale(f64),
    /// A probability is outside 0..=1.
    #[error("`{field}` must be a probability between 0 and 1, got {value}")]
    Rate {
        /// Which setting.
        field: &'static str,
        /// The value given.
        value: f64,
    },
    /// The failure status is not 500 or 503.
    #[error("`fail_status` must be 500 or 503, got {0}")]
    FailStatus(u16),
    /// The base model name is empty.
    #[error("the model name must not be empty")]
    EmptyModel,
    /// A LoRA adapter name is empty or repeats another served name.
    #[error("LoRA adapter name `{0}` is empty or already served")]
    BadLora(String),
}

/// Why a mock engine did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The bound listener has no local address.
    #[error("cannot read the listener's local address")]
    LocalAddr(#[source] std::io::Error),
}
