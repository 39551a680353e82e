//! `prefix-router epp`: the endpoint picker behind Envoy's ext_proc filter (the Gateway API
//! Inference Extension's protocol). The same configuration as `serve`; the traffic goes through
//! the proxy, which asks the picker where each request goes.

use std::net::SocketAddr;

use anyhow::{anyhow, Result};
use clap::Args;
use prefix_router_epp::{Listeners, PickerOptions};

use crate::serve_cmd::{init_logging, runtime, RouterArgs};

/// Flags of `epp`.
#[derive(Debug, Args)]
pub struct EppArgs {
    /// gRPC listen address: Envoy's ext_proc service and gRPC health (9002 is the port the
    /// Gateway API Inference Extension's pickers use).
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1:9002",
        env = "PREFIX_ROUTER_EPP_LISTEN"
    )]
    pub listen: String,

    /// HTTP listen address of /health, /ready and /metrics; `off` serves none.
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1:9090",
        env = "PREFIX_ROUTER_EPP_OPS_LISTEN"
    )]
    pub ops_listen: String,

    /// Endpoints named after the chosen one in `x-gateway-destination-endpoint`, in the order
    /// the strategy would choose them, for a proxy that tries them on failure (Envoy's
    /// override-host policy). Envoy's ORIGINAL_DST cluster reads a single address: keep 0.
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=16))]
    pub fallbacks: u16,

    /// Everything else, shared with `serve`.
    #[command(flatten)]
    pub router: RouterArgs,
}

fn addr(flag: &str, value: &str) -> Result<SocketAddr> {
    value.parse().map_err(|_| {
        anyhow!("{flag}: '{value}' is not an address (write IP:PORT, e.g. 0.0.0.0:9002)")
    })
}

/// Runs the picker until SIGTERM or SIGINT.
pub fn run(args: EppArgs) -> Result<()> {
    let listeners = Listeners {
        grpc: addr("--listen", &args.listen)?,
        ops: match args.ops_listen.as_str() {
            "off" => None,
            other => Some(addr("--ops-listen", other)?),
        },
    };
    let options = PickerOptions {
        fallbacks: usize::from(args.fallbacks),
        ..PickerOptions::default()
    };
    let log_format = args.router.log_format;
    let source = args.router.source(None);
    // Validate before starting anything, so a bad value is one line and exit code 1.
    source.load()?;
    init_logging(log_format);
    runtime()?.block_on(prefix_router_epp::run_until_signal(
        source, listeners, options,
    ))?;
    Ok(())
}
