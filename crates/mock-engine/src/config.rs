//! What a mock engine serves and how it misbehaves.

use std::time::Duration;

use prefix_router_engine_model::EngineConfig;

use crate::kv_events::KvEventsConfig;
use crate::ConfigError;

/// Base model name when none is given.
pub const DEFAULT_MODEL: &str = "mock-llama";

/// Output tokens when a request sets neither `max_tokens` nor `max_completion_tokens`.
pub const DEFAULT_MAX_TOKENS: u32 = 16;

/// Largest `max_tokens` accepted; larger values are a 400 (a real engine would refuse them past
/// its context length; this keeps one request from occupying the fake engine for hours).
pub const MAX_OUTPUT_TOKENS: u32 = 65_536;

/// Failures injected on purpose, for testing clients and routers.
#[derive(Debug, Clone, PartialEq)]
pub struct Faults {
    /// Share (0..=1) of inference requests answered at once with `fail_status`.
    pub fail_rate: f64,
    /// Status of those failures: 500 or 503.
    pub fail_status: u16,
    /// Share (0..=1) of inference requests delayed by `latency_spike` (wall time) before they
    /// reach the engine.
    pub latency_spike_rate: f64,
    /// Length of a latency spike.
    pub latency_spike: Duration,
    /// After this many inference requests, the engine stops answering: every later request
    /// (health and pings included, `/metrics` excepted) gets a 503 and its connection is closed.
    pub stop_after: Option<u64>,
    /// Streaming responses are cut (the connection is closed, no `[DONE]`) after this many
    /// generated tokens.
    pub close_stream_after_tokens: Option<u32>,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            fail_rate: 0.0,
            fail_status: 500,
            latency_spike_rate: 0.0,
            latency_spike: Duration::ZERO,
            stop_after: None,
            close_stream_after_tokens: None,
        }
    }
}

/// Everything a mock engine needs to run.
#[derive(Debug, Clone)]
pub struct MockEngineConfig {
    /// The engine model: cache capacity, limits and step costs.
    pub engine: EngineConfig,
    /// Wall seconds per engine second (0.05: everything runs 20 times faster).
    pub time_scale: f64,
    /// Base model name served (listed by `/v1/models`, accepted in `model`).
    pub model: String,
    /// LoRA adapter names also accepted in `model`.
    pub loras: Vec<String>,
    /// Injected failures.
    pub faults: Faults,
    /// Seed of the fault decisions.
    pub seed: u64,
    /// Publish KV-cache events (vLLM's ZeroMQ publisher) from here; `None`: no events.
    pub kv_events: Option<KvEventsConfig>,
    /// The model's tokenizer and chat template; `None`: one token per word (the workload's
    /// text model, roles adding none).
    pub tokenizer: Option<std::sync::Arc<prefix_router_tokenize::ChatTokenizer>>,
    /// Answer every inference request at once, without the engine model (no cache, no queue,
    /// `prompt_tokens` estimated from the body's size): an upstream whose own cost is close to
    /// nothing, for measuring what a proxy in front of it adds (`bench/peers.sh`).
    pub instant: bool,
}

impl MockEngineConfig {
    /// A real-time engine of `engine`, serving [`DEFAULT_MODEL`], without faults.
    pub fn new(engine: EngineConfig) -> Self {
        MockEngineConfig {
            engine,
            time_scale: 1.0,
            model: DEFAULT_MODEL.to_owned(),
            loras: Vec::new(),
            faults: Faults::default(),
            seed: 0,
            kv_events: None,
            tokenizer: None,
            instant: false,
        }
    }

    /// [`MockEngineConfig::new`] with the engine preset called `name`.
    pub fn from_preset(name: &str) -> Result<Self, ConfigError> {
        let p = prefix_router_engine_model::preset(name)
            .ok_or_else(|| ConfigError::UnknownPreset(name.to_owned()))?;
        Ok(Self::new((p.config)()))
    }

    /// Sets the time scale (wall seconds per engine second).
    pub fn with_time_scale(mut self, time_scale: f64) -> Self {
        self.time_scale = time_scale;
        self
    }

    /// Checks that this configuration can run.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.engine.validate()?;
        if !(self.time_scale.is_finite() && self.time_scale > 0.0) {
            return Err(ConfigError::TimeScale(self.time_scale));
        }
        for (field, value) in [
            ("fail_rate", self.faults.fail_rate),
            ("latency_spike_rate", self.faults.latency_spike_rate),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return Err(ConfigError::Rate { field, value });
            }
        }
        if let Some(k) = &self.kv_events {
            if !(0.0..=1.0).contains(&k.drop_rate) {
                return Err(ConfigError::Rate {
                    field: "kv_events.drop_rate",
                    value: k.drop_rate,
                });
            }
        }
        if !matches!(self.faults.fail_status, 500 | 503) {
            return Err(ConfigError::FailStatus(self.faults.fail_status));
        }
        if self.model.is_empty() {
            return Err(ConfigError::EmptyModel);
        }
        for (i, l) in self.loras.iter().enumerate() {
            if l.is_empty() || *l == self.model || self.loras[..i].contains(l) {
                return Err(ConfigError::BadLora(l.clone()));
            }
        }
        Ok(())
    }

    /// Whether `name` is the base model or one of the adapters.
    pub fn serves(&self, name: &str) -> bool {
        self.model == name || self.loras.iter().any(|l| l == name)
    }
}

impl Default for MockEngineConfig {
    /// The `small` preset in real time.
    fn default() -> Self {
        Self::new(prefix_router_engine_model::presets::small())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_bad_setting() {
        assert!(MockEngineConfig::default().validate().is_ok());
        let bad = MockEngineConfig::default().with_time_scale(0.0);
        assert!(matches!(bad.validate(), Err(ConfigError::TimeScale(_))));
        let mut bad = MockEngineConfig::default();
        bad.faults.fail_rate = 1.5;
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("fail_rate"));
        let mut bad = MockEngineConfig::default();
        bad.faults.fail_status = 404;
        assert!(matches!(bad.validate(), Err(ConfigError::FailStatus(404))));
        let bad = MockEngineConfig {
            loras: vec!["a".into(), "a".into()],
            ..MockEngineConfig::default()
        };
        assert!(matches!(bad.validate(), Err(ConfigError::BadLora(_))));
        assert!(matches!(
            MockEngineConfig::from_preset("nope"),
            Err(ConfigError::UnknownPreset(_))
        ));
    }

    #[test]
    fn serves_base_and_adapters() {
        let mut c = MockEngineConfig::default();
        c.loras.push("sql".into());
        assert!(c.serves(DEFAULT_MODEL) && c.serves("sql") && !c.serves("other"));
    }
}
