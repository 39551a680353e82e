//! `prefix-router mock-engine`: one fake OpenAI-compatible engine backed by the engine model.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use prefix_router_kv_events::Encoding;
use prefix_router_mock_engine::{
    ConfigError, Faults, KvEventsConfig, MockEngine, MockEngineConfig, DEFAULT_MODEL,
};
use prefix_router_tokenize::ChatTokenizer;

/// Flags of `mock-engine`.
#[derive(Debug, Args)]
pub struct MockEngineArgs {
    /// Listen address (IP:PORT; port 0 picks a free one).
    #[arg(long, value_name = "ADDR")]
    pub listen: SocketAddr,

    /// Engine preset: cache capacity, batch limits, step costs (see `prefix-router presets`).
    #[arg(long, value_name = "P", default_value = "small")]
    pub preset: String,

    /// Wall seconds per engine second: 0.05 runs everything 20 times faster.
    #[arg(long, value_name = "X", default_value_t = 1.0)]
    pub time_scale: f64,

    /// Base model name served.
    #[arg(long, value_name = "NAME", default_value = DEFAULT_MODEL)]
    pub model: String,

    /// LoRA adapter name also served (repeatable).
    #[arg(long = "lora", value_name = "NAME")]
    pub loras: Vec<String>,

    /// Share (0..1) of inference requests failed with --fail-status.
    #[arg(long, value_name = "F", default_value_t = 0.0)]
    pub fail_rate: f64,

    /// Status of injected failures: 500 or 503.
    #[arg(long, value_name = "STATUS", default_value_t = 500)]
    pub fail_status: u16,

    /// Share (0..1) of inference requests delayed by --latency-spike-ms.
    #[arg(long, value_name = "F", default_value_t = 0.0)]
    pub latency_spike_rate: f64,

    /// Length of a latency spike, wall milliseconds.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub latency_spike_ms: u64,

    /// Stop answering after N inference requests (503 and closed connections; /metrics stays up).
    #[arg(long, value_name = "N")]
    pub stop_after: Option<u64>,

    /// Cut streaming responses (close the connection, no [DONE]) after N tokens.
    #[arg(long, value_name = "N")]
    pub close_stream_after_tokens: Option<u32>,

    /// Seed of the fault decisions.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub seed: u64,

    /// Publish KV-cache events as vLLM does (ZeroMQ PUB) on this address, e.g.
    /// 127.0.0.1:5557 (port 0 picks a free one; the address is printed).
    #[arg(long, value_name = "ADDR")]
    pub kv_events: Option<SocketAddr>,

    /// The KV events' replay (ROUTER) address; with --kv-events, defaults to its port + 1.
    #[arg(long, value_name = "ADDR", requires = "kv_events")]
    pub kv_events_replay: Option<SocketAddr>,

    /// Payload layout: `map` (newer vLLM, byte hashes) or `positional` (older, integer hashes).
    #[arg(long, value_name = "E", default_value = "map", requires = "kv_events")]
    pub kv_events_encoding: String,

    /// The topic frame of every KV-event message.
    #[arg(long, value_name = "T", default_value = "", requires = "kv_events")]
    pub kv_events_topic: String,

    /// The model's tokenizer.json (its tokenizer_config.json beside it gives the chat template
    /// and BOS/EOS): prompts are then the model's tokens, not one token per word
    /// (`builtin:words`, the default's own model, names it explicitly).
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<std::path::PathBuf>,

    /// A chat template file (Jinja) to use instead of the one in tokenizer_config.json.
    #[arg(long, value_name = "FILE", requires = "tokenizer")]
    pub chat_template: Option<std::path::PathBuf>,

    /// Share (0..1) of KV-event batches not sent (still replayable): lost messages on purpose.
    #[arg(long, value_name = "F", default_value_t = 0.0, requires = "kv_events")]
    pub kv_events_drop: f64,

    /// Answer at once, without the engine model (no cache, no queue; prompt tokens estimated
    /// from the body's size): an upstream that costs next to nothing, for measuring what a
    /// proxy in front of it adds (bench/peers.sh).
    #[arg(long, conflicts_with_all = ["kv_events", "tokenizer"])]
    pub instant: bool,
}

/// Runs one mock engine until Ctrl-C.
pub fn run(args: MockEngineArgs) -> Result<()> {
    if args.latency_spike_rate > 0.0 && args.latency_spike_ms == 0 {
        bail!("--latency-spike-rate needs --latency-spike-ms");
    }
    let mut config = MockEngineConfig::from_preset(&args.preset)?.with_time_scale(args.time_scale);
    config.model = args.model;
    config.loras = args.loras;
    config.seed = args.seed;
    config.instant = args.instant;
    config.faults = Faults {
        fail_rate: args.fail_rate,
        fail_status: args.fail_status,
        latency_spike_rate: args.latency_spike_rate,
        latency_spike: Duration::from_millis(args.latency_spike_ms),
        stop_after: args.stop_after,
        close_stream_after_tokens: args.close_stream_after_tokens,
    };
    if let Some(addr) = args.kv_events {
        let encoding = Encoding::parse(&args.kv_events_encoding).with_context(|| {
            format!(
                "--kv-events-encoding: `{}` is neither `map` nor `positional`",
                args.kv_events_encoding
            )
        })?;
        let replay = match (args.kv_events_replay, addr.port()) {
            (Some(r), _) => r,
            // Port 0 picks any free port for both.
            (None, 0) => addr,
            (None, p) => SocketAddr::new(addr.ip(), p.saturating_add(1)),
        };
        config.kv_events = Some(KvEventsConfig {
            addr,
            replay_addr: Some(replay),
            topic: args.kv_events_topic,
            encoding,
            drop_rate: args.kv_events_drop,
            ..KvEventsConfig::default()
        });
    }
    if let Some(file) = &args.tokenizer {
        let template = match &args.chat_template {
            Some(t) => Some(
                std::fs::read_to_string(t)
                    .with_context(|| format!("--chat-template: cannot read {}", t.display()))?,
            ),
            None => None,
        };
        let t = ChatTokenizer::from_setting(file, template).context("--tokenizer")?;
        config.tokenizer = Some(std::sync::Arc::new(t));
    }
    config.validate().map_err(flag_error)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let engine = MockEngine::bind(args.listen, config).await?;
        if args.instant {
            crate::note!(
                "mock engine (instant answers) listening on {}",
                engine.url()
            );
        } else {
            crate::note!(
                "mock engine (preset {}, time scale {}) listening on {}",
                args.preset,
                args.time_scale,
                engine.url()
            );
        }
        if let (Some(e), Some(r)) = (
            engine.kv_events_endpoint(),
            engine.kv_events_replay_endpoint(),
        ) {
            crate::note!("KV events on {e}, replay on {r}");
        }
        tokio::signal::ctrl_c()
            .await
            .context("cannot wait for Ctrl-C")?;
        engine.shutdown().await;
        Ok(())
    })
}

/// The configuration's error as the flag the user typed names it (the library names its
/// fields: `time_scale`, `kv_events.drop_rate`).
fn flag_error(e: ConfigError) -> anyhow::Error {
    match e {
        ConfigError::TimeScale(v) => {
            anyhow::anyhow!("--time-scale must be a positive number, got {v}")
        }
        ConfigError::Rate { field, value } => {
            let flag = match field {
                "fail_rate" => "--fail-rate",
                "latency_spike_rate" => "--latency-spike-rate",
                "kv_events.drop_rate" => "--kv-events-drop",
                other => other,
            };
            anyhow::anyhow!("{flag} must be a probability between 0 and 1, got {value}")
        }
        ConfigError::FailStatus(s) => anyhow::anyhow!("--fail-status must be 500 or 503, got {s}"),
        ConfigError::EmptyModel => anyhow::anyhow!("--model must not be empty"),
        ConfigError::BadLora(name) => {
            anyhow::anyhow!("--lora {name:?}: empty, or the name of another served model")
        }
        other => anyhow::Error::new(other).context("invalid mock-engine flags"),
    }
}
