//! A progress bar on stderr that appears only once a run has taken more than a second (short
//! runs stay quiet) and never when stderr is not a terminal.

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use prefix_router_sim::Progress;

/// How long a run must take before the bar shows.
const SHOW_AFTER: Duration = Duration::from_secs(1);

/// Lazily created progress bar fed by the simulator's progress callback.
#[derive(Debug)]
pub struct DelayedBar {
    started: Instant,
    bar: Option<ProgressBar>,
}

impl DelayedBar {
    /// A bar that will show once the run is older than a second.
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
            bar: None,
        }
    }

    /// Records where the simulation is.
    pub fn update(&mut self, p: Progress<'_>) {
        self.update_raw(
            p.done_total(),
            p.grand_total(),
            &format!("{} ({}/{})", p.strategy, p.strategy_index + 1, p.strategies),
        );
    }

    /// Records `pos` of `len` done, with `msg` beside the bar.
    pub fn update_raw(&mut self, pos: u64, len: u64, msg: &str) {
        if self.bar.is_none() {
            if self.started.elapsed() < SHOW_AFTER {
                return;
            }
            self.bar = Some(bar(len));
        }
        if let Some(bar) = &self.bar {
            bar.set_length(len);
            bar.set_position(pos);
            bar.set_message(msg.to_string());
        }
    }

    /// Removes the bar from the terminal.
    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

/// A bar of `len` steps on stderr, in the style every command's progress uses (indicatif draws
/// nothing when stderr is not a terminal).
pub fn bar(len: u64) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template("[{elapsed_precise}] {wide_bar} {pos}/{len} {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}
