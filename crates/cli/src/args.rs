//! Command-line flags (clap derive). Values are validated here with the library's own checks, so
//! a bad flag fails before anything runs, with a one-line message that names it.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use prefix_router_core::strategy::OverflowPolicy;
use prefix_router_core::{ConcurrencyThreshold, PrefixLength, StrategyKind};
use prefix_router_workload::scale::parse_scale_events;
use prefix_router_workload::ScaleEvent;

/// Engine preset of `simulate`, `demo` and `analyze` when `--preset` is not given: the
/// published experiment's (Llama 3.1 70B on 8 H100s).
pub const DEFAULT_PRESET: &str = "llama-3.1-70b-h100x8";

/// Instances of `simulate` and `analyze` when neither `--instances` nor a config gives them.
pub const DEFAULT_INSTANCES: u32 = 7;

/// Default routing-key length in characters; see the `--prefix-length` help for why.
pub const DEFAULT_PREFIX_LENGTH: u32 = 1024;

/// prefix-router: a prefix-cache-aware router for fleets of LLM inference servers.
#[derive(Debug, Parser)]
#[command(name = "prefix-router", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Simulate a fleet of engines behind the router, once per strategy, and compare them.
    #[command(after_help = strategies_help())]
    Simulate(Box<SimulateArgs>),
    /// List the engine presets and built-in workloads.
    Presets,
    /// Run the router in front of a fleet of inference servers.
    #[command(after_help = strategies_help())]
    Serve(Box<crate::serve_cmd::ServeArgs>),
    /// Pick endpoints for Envoy (ext_proc, the Gateway API Inference Extension's protocol),
    /// routing as `serve` does; Envoy carries the traffic.
    #[command(after_help = strategies_help())]
    Epp(Box<crate::epp_cmd::EppArgs>),
    /// Run a fake OpenAI-compatible engine (engine-model timing and prefix cache, in real time).
    MockEngine(Box<crate::mock_engine_cmd::MockEngineArgs>),
    /// Replay a workload over HTTP against an OpenAI-compatible URL and measure it.
    Bench(Box<crate::bench_cmd::BenchArgs>),
    /// Start mock engines and a router in process, replay a workload through each strategy in
    /// turn over real HTTP, and compare them (in engine time) with `simulate` and the
    /// published experiment.
    #[command(after_help = strategies_help())]
    Demo(Box<crate::demo_cmd::DemoArgs>),
    /// Profile a trace (or serve's access log) and sweep routing settings over it in the
    /// simulator: what prefix routing buys on this traffic, and the settings to use.
    Analyze(Box<crate::analyze_cmd::AnalyzeArgs>),
}

/// Where `--overflow` sends a request whose preferred instance is busy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OverflowArg {
    /// The next instance in the key's rendezvous order that has room (a stable second home).
    NextInOrder,
    /// The instance with the fewest requests in flight.
    LeastOutstanding,
}

impl From<OverflowArg> for OverflowPolicy {
    fn from(a: OverflowArg) -> Self {
        match a {
            OverflowArg::NextInOrder => OverflowPolicy::NextInOrder,
            OverflowArg::LeastOutstanding => OverflowPolicy::LeastOutstanding,
        }
    }
}

/// Flags of `simulate`.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// Built-in workload to generate (see `prefix-router presets`); long-context when neither
    /// --workload nor --trace is given.
    #[arg(long, value_name = "NAME", conflicts_with = "trace")]
    pub workload: Option<String>,

    /// Replay a trace file instead: our JSONL, Mooncake's, ShareGPT, or serve's --access-log.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,

    /// Instances (engines) in the fleet at the start.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_INSTANCES, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub instances: u32,

    /// Engine preset of every instance (see `prefix-router presets`).
    #[arg(long, value_name = "P", default_value = crate::args::DEFAULT_PRESET)]
    pub preset: String,

    /// Strategies to compare, comma-separated, run one after another on the same requests
    /// (kv-aware is left out by default, to keep the default run short; name it to model the
    /// engines' KV events, see --kv-event-delay-ms and --kv-event-loss).
    #[arg(
        long,
        value_name = "a,b,...",
        value_delimiter = ',',
        default_value = "random,round-robin,least-outstanding,prefix-aware,cache-aware",
        value_parser = parse_strategy
    )]
    pub strategies: Vec<StrategyKind>,

    /// A strategy's own parameter, e.g. `--strategy-param decode-chars=512` (repeatable; goes
    /// to every listed strategy that has it; `prefix-router simulate --help` lists them below).
    #[arg(long = "strategy-param", value_name = "NAME=VALUE")]
    pub strategy_params: Vec<String>,

    /// Seed of the workload generator and of the router's random choices.
    #[arg(long, value_name = "S", default_value_t = 1)]
    pub seed: u64,

    /// kv-aware: milliseconds from an engine step to the router's view applying the KV events
    /// it published (publisher, socket, subscriber).
    #[arg(long, value_name = "MS", default_value_t = prefix_router_sim::events::DEFAULT_DELAY_S * 1e3, value_parser = parse_delay_ms)]
    pub kv_event_delay_ms: f64,

    /// kv-aware: share (0..1) of event batches lost on the way; the router sees a loss at the
    /// instance's next batch and replays it then (its view is stale, and trusted, meanwhile).
    #[arg(long, value_name = "F", default_value_t = 0.0, value_parser = parse_share)]
    pub kv_event_loss: f64,

    /// Router replicas in front of the fleet, each with its own learned state; requests are
    /// dealt among them round-robin, so each sees a share of every prefix.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub replicas: u32,

    /// The replicas scrape every engine's queue (running and waiting requests) and count what
    /// the others sent there, as `serve` does with `[engine_metrics] route_on_queues`.
    #[arg(long)]
    pub engine_queues: bool,

    /// With --engine-queues: milliseconds between scrapes.
    #[arg(long, value_name = "MS", default_value_t = 1000.0, value_parser = parse_delay_ms, requires = "engine_queues")]
    pub scrape_interval_ms: f64,

    /// With --engine-queues: milliseconds from a scrape's send to the replicas reading it.
    #[arg(long, value_name = "MS", default_value_t = 5.0, value_parser = parse_delay_ms, requires = "engine_queues")]
    pub scrape_delay_ms: f64,

    /// With --engine-queues: milliseconds a reading is trusted from its send; past it the
    /// engine's queue is unknown (never zero). At least the scrape interval.
    #[arg(long, value_name = "MS", default_value_t = 3000.0, value_parser = parse_delay_ms, requires = "engine_queues")]
    pub scrape_stale_ms: f64,

    /// Number of requests (generators: how many to make; traces: the first N lines).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub requests: Option<u64>,

    /// Open loop: Poisson arrivals at R requests per second (traces: timestamps rescaled to a
    /// mean of R per second).
    #[arg(long, value_name = "R", conflicts_with = "concurrency", value_parser = parse_rate)]
    pub rate: Option<f64>,

    /// Closed loop: C clients, each sending its next request when the previous one finishes.
    #[arg(long, value_name = "C", value_parser = clap::value_parser!(u32).range(1..))]
    pub concurrency: Option<u32>,

    /// Generated workloads: set one parameter, e.g. `--param documents=1200` or
    /// `--param question_tokens.max=90` (repeatable; the names are those of the JSON report's
    /// `workload.params`; a wrong name lists the right ones).
    #[arg(long = "param", value_name = "KEY=VALUE", conflicts_with = "trace")]
    pub params: Vec<String>,

    /// Generated workloads: spread documents/conversations over G tenants, each with its own
    /// routing group (`prompt_cache_key`), so equal prefixes of different tenants are kept apart.
    #[arg(long, value_name = "G", conflicts_with = "trace", value_parser = clap::value_parser!(u32).range(1..))]
    pub groups: Option<u32>,

    /// Characters of the chat text (roles and message text, in order) that form the routing
    /// key, 1024..=65536. Default 1024, the smallest allowed: at five characters per token that
    /// is about 200 tokens, already unique per shared document or conversation start in the
    /// built-in workloads, while a longer key would also take in the part that differs between
    /// requests sharing a prefix (a ShareGPT chat's next turn, a question after a short
    /// document) and scatter them. Raise it when every request starts with a long shared
    /// system prompt, or all traffic gets one key.
    #[arg(long, value_name = "N", default_value_t = u64::from(DEFAULT_PREFIX_LENGTH), value_parser = parse_prefix_length)]
    pub prefix_length: u64,

    /// Prefix-aware: in-flight requests at which the preferred instance overflows (1..=1024;
    /// default: the strategy's own default).
    #[arg(long, value_name = "N", value_parser = parse_threshold)]
    pub concurrency_threshold: Option<u32>,

    /// Prefix-aware: where overflow goes.
    #[arg(
        long,
        value_enum,
        value_name = "POLICY",
        default_value = "next-in-order"
    )]
    pub overflow: OverflowArg,

    /// Prefix-aware: bounded-load factor c > 1 (an instance may hold at most
    /// ceil(c x average in-flight)); off by default.
    #[arg(long, value_name = "C", value_parser = parse_balance_factor)]
    pub balance_factor: Option<f64>,

    /// Instances added or removed during the run, e.g. +1@600s,-2@1800s (m suffix: minutes).
    #[arg(long, value_name = "EVENTS", value_parser = parse_scale, allow_hyphen_values = true)]
    pub scale: Option<ScaleEvents>,

    /// An instance added by --scale first gets the hottest recent prefixes that will move to it
    /// (at most 64, 4 at a time, one output token each, within 30 s), then takes its share;
    /// as `serve` does with `[prewarm] enabled = true`.
    #[arg(long)]
    pub prewarm: bool,

    /// Also run a clairvoyant reference (a row named `clairvoyant`, not a strategy): each
    /// request goes where its first token would come soonest, read exactly from a copy of
    /// every engine (queue, batch, cache). No router can see that much; it shows how much of
    /// the time to first token placement decides. Greedy, so not a bound. Every strategy's
    /// decisions are read against it too (a placement line each: how often it chose the
    /// soonest start, what its choices cost). Slower: every engine runs forward once per
    /// request and strategy.
    #[arg(long)]
    pub clairvoyant: bool,

    /// Load sweep, e.g. `--load 0.5,0.8,0.95`: the generated workload at open-loop (Poisson)
    /// rates that are these fractions of the fleet's capacity, every strategy at each. Capacity
    /// is measured first: the same requests closed loop with 64 clients per instance through
    /// least-outstanding, its completed requests per second. `--plot` then draws P90 TTFT
    /// against load (the floor, and the clairvoyant reference when asked for, dashed) and
    /// `--json` writes the whole sweep.
    #[arg(long, value_name = "L,L,...", value_delimiter = ',', conflicts_with_all = ["trace", "rate", "concurrency"], value_parser = parse_load)]
    pub load: Vec<f64>,

    /// Write the full report as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Write an SVG with the TTFT CDF, the per-instance share and the hit rate over time.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,

    /// Write the workload (generated, or the trace after --requests and --rate) to FILE as our
    /// JSONL and exit without simulating: a trace to replay with `simulate --trace`, `bench
    /// --trace` or `analyze`.
    #[arg(long, value_name = "FILE", conflicts_with = "load")]
    pub write_trace: Option<PathBuf>,
}

/// Applies `--strategy-param NAME=VALUE` assignments to the strategies that have `NAME`; an
/// assignment no listed strategy takes is an error naming it and the parameters there are.
pub fn apply_strategy_params(
    strategies: &mut [prefix_router_core::StrategyConfig],
    assignments: &[String],
) -> anyhow::Result<()> {
    for a in assignments {
        let (name, value) = a
            .split_once('=')
            .map(|(k, v)| (k.trim(), v.trim()))
            .filter(|(k, _)| !k.is_empty())
            .ok_or_else(|| anyhow::anyhow!("--strategy-param {a}: expected NAME=VALUE"))?;
        let mut taken = false;
        for s in strategies.iter_mut() {
            if s.kind.entry().params.iter().any(|p| p.name == name) {
                s.params.insert(name.to_string(), value.to_string());
                taken = true;
            }
        }
        if !taken {
            let known: Vec<String> = strategies
                .iter()
                .flat_map(|s| {
                    s.kind
                        .entry()
                        .params
                        .iter()
                        .map(move |p| format!("{}.{}", s.kind.name(), p.name))
                })
                .collect();
            anyhow::bail!(
                "--strategy-param {a}: no listed strategy has parameter '{name}' (they have: {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            );
        }
    }
    Ok(())
}

/// `--help` text listing every strategy and its parameters, from the registry.
pub fn strategies_help() -> String {
    let mut out = String::from("Strategies:\n");
    for e in prefix_router_core::REGISTRY {
        out.push_str(&format!("  {:<18} {}\n", e.name, e.about));
        for p in e.params {
            let setting = format!("{}={}", p.name, p.default);
            out.push_str(&format!("      {setting:<30} {}\n", p.help));
        }
    }
    out
}

/// A strategy name from the registry (the error lists them).
pub fn parse_strategy(s: &str) -> Result<StrategyKind, String> {
    s.trim().parse::<StrategyKind>().map_err(|e| e.to_string())
}

fn parse_prefix_length(s: &str) -> Result<u64, String> {
    let n: u64 = s
        .trim()
        .parse()
        .map_err(|_| format!("prefix_length must be a whole number, got '{s}'"))?;
    PrefixLength::new(n)
        .map(|p| p.get() as u64)
        .map_err(|e| e.to_string())
}

fn parse_threshold(s: &str) -> Result<u32, String> {
    let n: u64 = s
        .trim()
        .parse()
        .map_err(|_| format!("concurrency_threshold must be a whole number, got '{s}'"))?;
    ConcurrencyThreshold::new(n)
        .map(|t| t.get())
        .map_err(|e| e.to_string())
}

fn parse_delay_ms(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=60_000.0).contains(&v) => Ok(v),
        _ => Err(format!("must be milliseconds within 0..=60000, got '{s}'")),
    }
}

/// A finite number above 0, or `why` and what was given.
fn positive(s: &str, why: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{why}, got '{s}'")),
    }
}

/// A finite number above 0 (a rate).
pub(crate) fn parse_positive(s: &str) -> Result<f64, String> {
    positive(s, "must be a positive number")
}

/// Longest duration or timeout a flag takes, in seconds: a year, far past any run, and well
/// inside what a `Duration` and the runtime's timers hold (`1e20` panicked there).
const MAX_SECONDS: f64 = 365.0 * 86_400.0;

/// A number of seconds above 0 and at most [`MAX_SECONDS`] (a duration, a timeout).
pub(crate) fn parse_seconds(s: &str) -> Result<f64, String> {
    let v = positive(s, "must be a positive number of seconds")?;
    if v > MAX_SECONDS {
        return Err(format!(
            "must be at most {MAX_SECONDS} seconds (a year), got '{s}'"
        ));
    }
    Ok(v)
}

pub(crate) fn parse_share(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if (0.0..1.0).contains(&v) => Ok(v),
        _ => Err(format!("must be a share within [0, 1), got '{s}'")),
    }
}

pub(crate) fn parse_rate(s: &str) -> Result<f64, String> {
    positive(s, "rate must be a positive number of requests per second")
}

/// A `--load` level: a fraction of the fleet's measured capacity (above 1 allowed: a
/// cache-aware router can go past what least-outstanding completes).
fn parse_load(s: &str) -> Result<f64, String> {
    positive(
        s,
        "a load is a positive fraction of the fleet's capacity (e.g. 0.8)",
    )
}

fn parse_balance_factor(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(c) if c.is_finite() && c > 1.0 => Ok(c),
        _ => Err(format!(
            "balance_factor must be a finite number greater than 1, got '{s}'"
        )),
    }
}

/// A parsed `--scale` list (a newtype, so clap takes the whole list as one value).
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleEvents(pub Vec<ScaleEvent>);

fn parse_scale(s: &str) -> Result<ScaleEvents, String> {
    parse_scale_events(s)
        .map(ScaleEvents)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults() {
        let cli = Cli::try_parse_from(["prefix-router", "simulate"]).map_err(|e| e.to_string());
        let Ok(Cli {
            command: Command::Simulate(a),
        }) = cli
        else {
            panic!("parse failed: {cli:?}")
        };
        assert_eq!(a.instances, 7);
        assert_eq!(a.preset, "llama-3.1-70b-h100x8");
        // Every strategy but kv-aware (named on demand: it models the engines' KV events).
        assert_eq!(
            a.strategies,
            StrategyKind::all()
                .filter(|k| k.name() != "kv-aware")
                .collect::<Vec<_>>()
        );
        assert_eq!(a.prefix_length, u64::from(DEFAULT_PREFIX_LENGTH));
        assert_eq!(a.seed, 1);
    }

    #[test]
    fn prefix_length_out_of_range_names_the_setting() {
        let e = Cli::try_parse_from(["prefix-router", "simulate", "--prefix-length", "5"])
            .map(|_| ())
            .unwrap_err();
        let text = e.to_string();
        assert!(text.contains("--prefix-length"), "{text}");
        assert!(
            text.contains("prefix_length must be within 1024..=65536, got 5"),
            "{text}"
        );
    }

    #[test]
    fn durations_past_a_year_are_refused_by_name_not_a_panic() {
        for args in [
            &["bench", "--timeout", "1e20"][..],
            &["bench", "--duration", "1e300"],
            &["demo", "--duration", "1e300"],
        ] {
            let e =
                Cli::try_parse_from(std::iter::once("prefix-router").chain(args.iter().copied()))
                    .map(|_| ())
                    .unwrap_err()
                    .to_string();
            assert!(
                e.contains(args[1]) && e.contains("at most"),
                "{args:?}: {e}"
            );
        }
        assert_eq!(parse_seconds("31536000"), Ok(31_536_000.0));
    }

    #[test]
    fn rate_and_concurrency_conflict() {
        assert!(Cli::try_parse_from([
            "prefix-router",
            "simulate",
            "--rate",
            "2",
            "--concurrency",
            "3"
        ])
        .is_err());
    }
}

#[cfg(test)]
mod scale_tests {
    use super::*;

    #[test]
    fn scale_list_is_one_value() {
        let cli = Cli::try_parse_from(["prefix-router", "simulate", "--scale", "+1@600s,-2@30m"])
            .map_err(|e| e.to_string());
        let Ok(Cli {
            command: Command::Simulate(a),
        }) = cli
        else {
            panic!("parse failed: {cli:?}")
        };
        let events = a.scale.map(|s| s.0).unwrap_or_default();
        assert_eq!(events.len(), 2);
        assert_eq!((events[0].delta, events[1].delta), (1, -2));
        assert_eq!(events[1].at_s, 1800.0);
    }
}
