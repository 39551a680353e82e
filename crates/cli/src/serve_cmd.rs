//! `prefix-router serve`: the production router. Flags and `PREFIX_ROUTER_*` variables override
//! the TOML file given with `--config`; everything is validated once before anything listens.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use prefix_router_server::{run_until_signal, ConfigSource, Overrides};

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Flags of `serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Data-plane listen address [default: 127.0.0.1:8080].
    #[arg(long, value_name = "ADDR", env = "PREFIX_ROUTER_LISTEN")]
    pub listen: Option<String>,

    /// Everything else, shared with `epp`.
    #[command(flatten)]
    pub router: RouterArgs,
}

/// The flags `serve` and `epp` share: the fleet, the strategy, the admin API, logging.
#[derive(Debug, Args)]
pub struct RouterArgs {
    /// TOML configuration file (see router.example.toml); reloaded on SIGHUP.
    #[arg(long, value_name = "FILE", env = "PREFIX_ROUTER_CONFIG")]
    pub config: Option<PathBuf>,

    /// Admin API listen address [default: 127.0.0.1:8081]; needs --admin-token.
    #[arg(long, value_name = "ADDR", env = "PREFIX_ROUTER_ADMIN_LISTEN")]
    pub admin_listen: Option<String>,

    /// Bearer token of the admin API; the admin API is off without one.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "PREFIX_ROUTER_ADMIN_TOKEN",
        hide_env_values = true
    )]
    pub admin_token: Option<String>,

    /// Instance base URL (http://host:port), repeatable; replaces the file's instance list.
    #[arg(
        long = "instance",
        value_name = "URL",
        env = "PREFIX_ROUTER_INSTANCES",
        value_delimiter = ','
    )]
    pub instances: Vec<String>,

    /// Routing strategy (the list below) [default: cache-aware].
    #[arg(long, value_name = "S", env = "PREFIX_ROUTER_STRATEGY")]
    pub strategy: Option<String>,

    /// A strategy's own parameter, `NAME=VALUE` (repeatable; the list below; also
    /// `[routing.params]` in the config file).
    #[arg(long = "strategy-param", value_name = "NAME=VALUE")]
    pub strategy_params: Vec<String>,

    /// Routing-key length: bytes (native API) or characters (OpenAI APIs), 1024..=65536 [default: 1024].
    #[arg(long, value_name = "N", env = "PREFIX_ROUTER_PREFIX_LENGTH")]
    pub prefix_length: Option<u64>,

    /// In-flight requests at which prefix-aware routing overflows, 1..=1024 [default: 32].
    #[arg(long, value_name = "N", env = "PREFIX_ROUTER_CONCURRENCY_THRESHOLD")]
    pub concurrency_threshold: Option<u64>,

    /// Append one JSON line per request to FILE: hashes and lengths, never prompt text or group
    /// ids; reopened on SIGHUP (logrotate). `simulate --trace FILE` replays it.
    #[arg(long, value_name = "FILE", env = "PREFIX_ROUTER_ACCESS_LOG")]
    pub access_log: Option<std::path::PathBuf>,

    /// Log format; the level comes from RUST_LOG (default info).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "PREFIX_ROUTER_LOG_FORMAT")]
    pub log_format: LogFormat,
}

impl RouterArgs {
    /// Where settings come from: the file, overridden by these flags (and `listen`).
    pub fn source(self, listen: Option<String>) -> ConfigSource {
        ConfigSource {
            path: self.config,
            overrides: Overrides {
                listen,
                admin_listen: self.admin_listen,
                admin_token: self.admin_token,
                instances: self.instances,
                strategy: self.strategy,
                prefix_length: self.prefix_length,
                concurrency_threshold: self.concurrency_threshold,
                strategy_params: self.strategy_params,
                access_log: self.access_log,
            },
        }
    }
}

/// Logging as `--log-format` says, the level from RUST_LOG (default info).
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only on a terminal: a log file or a collector reads escape codes as text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi);
    // A second initialisation (tests) is not an error worth failing for.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// The async runtime the long-running commands use.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Runs `serve` until SIGTERM or SIGINT.
pub fn run(args: ServeArgs) -> Result<()> {
    let log_format = args.router.log_format;
    let source = args.router.source(args.listen);
    // Validate before starting anything, so a bad value is one line and exit code 1.
    source.load()?;
    init_logging(log_format);
    runtime()?.block_on(run_until_signal(source))?;
    Ok(())
}
