//! `prefix-router`: the single binary. Thin: it parses flags and calls the library crates.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod analyze_cmd;
mod args;
mod bench_cmd;
mod demo_cmd;
mod epp_cmd;
mod mock_engine_cmd;
mod out;
mod presets_cmd;
mod progress;
mod report_file;
mod serve_cmd;
mod simulate_cmd;
mod workload_flags;

use std::process::ExitCode;

use clap::Parser;

use crate::args::{Cli, Command};

/// mimalloc rather than glibc's malloc: over a million requests through `serve`, glibc's
/// footprint kept growing around a live heap that stayed flat (RELIABILITY.md, "Soak").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return clap_error(e),
    };
    let result = match cli.command {
        Command::Simulate(args) => simulate_cmd::run(*args),
        Command::Presets => presets_cmd::run(),
        Command::Serve(args) => serve_cmd::run(*args),
        Command::Epp(args) => epp_cmd::run(*args),
        Command::MockEngine(args) => mock_engine_cmd::run(*args),
        Command::Bench(args) => bench_cmd::run(*args),
        Command::Demo(args) => demo_cmd::run(*args),
        Command::Analyze(args) => analyze_cmd::run(*args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the error and its causes, outermost first; a cause that its error's
            // own message already ends with (`cannot read F: <io error>`) is not said twice.
            let mut line = String::new();
            for cause in e.chain().map(|c| c.to_string()) {
                if line.ends_with(&cause) {
                    continue;
                }
                if !line.is_empty() {
                    line.push_str(": ");
                }
                line.push_str(&cause);
            }
            crate::note!("error: {line}");
            ExitCode::FAILURE
        }
    }
}

/// Help and version go to stdout as clap renders them; a flag error is clap's message without
/// the usage block: one line that names the flag, and the lines clap adds to it where it adds
/// any (the arguments missing, the values possible, a did-you-mean tip).
fn clap_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            }
        }
        _ => {
            let text = e.render().to_string();
            let message: Vec<&str> = text
                .lines()
                .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
                .filter(|l| !l.trim().is_empty())
                .collect();
            if message.is_empty() {
                crate::note!("error: invalid arguments (see --help)");
            } else {
                crate::note!("{}", message.join("\n"));
            }
            ExitCode::from(2)
        }
    }
}
