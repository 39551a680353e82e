//! The current strategy and key length, and the per-thread random source strategies draw from.

use std::cell::RefCell;

use prefix_router_core::{ConfigError, PrefixLength, RouteRng, Strategy, StrategyConfig};
use rand::SeedableRng;

/// Strategy and key length in force; replaced whole (never edited) on reload.
#[derive(Debug)]
pub struct Routing {
    /// How the strategy was configured.
    pub config: StrategyConfig,
    /// Key length.
    pub prefix_length: PrefixLength,
    /// The built strategy.
    pub strategy: Box<dyn Strategy>,
}

impl Routing {
    /// Builds the strategy.
    pub fn new(config: StrategyConfig, prefix_length: PrefixLength) -> Result<Self, ConfigError> {
        let strategy = config.build()?;
        Ok(Self {
            config,
            prefix_length,
            strategy,
        })
    }
}

thread_local! {
    // One generator per worker thread: no lock on the hot path. Seeded from the OS so replicas
    // break ties differently.
    static RNG: RefCell<RouteRng> = RefCell::new(RouteRng::from_entropy());
}

/// Runs `f` with this thread's generator.
pub fn with_rng<R>(f: impl FnOnce(&mut RouteRng) -> R) -> R {
    RNG.with(|r| match r.try_borrow_mut() {
        Ok(mut rng) => f(&mut rng),
        // Re-entrancy cannot happen (strategies do not call back), but never panic for it.
        Err(_) => f(&mut RouteRng::from_entropy()),
    })
}
