//! The current strategy and key length, and the per-thread random source strategies draw from.

use std::cell::RefCell;
use std::sync::Arc;

use prefix_router_core::{ConfigError, PrefixLength, RouteRng, Strategy, StrategyConfig};
use rand::SeedableRng;

/// Strategy and key length in force; replaced whole (never edited) on reload.
#[derive(Debug)]
pub struct Routing {
    /// How the strategy was configured.
    pub config: StrategyConfig,
    /// Key length.
    pub prefix_length: PrefixLength,
    /// The built strategy (shared with the tickets of requests in flight).
    pub strategy: Arc<dyn Strategy>,
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

    /// The routing that replaces `self` with `config` and `prefix_length`. An unchanged strategy
    /// configuration keeps the very same strategy: what it learned (cache-aware's block index
    /// and per-instance costs) survives reloads and admin edits that do not touch it. The key
    /// length is not part of any strategy's state, so changing only it keeps the strategy too.
    pub fn replaced_by(
        &self,
        config: StrategyConfig,
        prefix_length: PrefixLength,
    ) -> Result<Self, ConfigError> {
        if config == self.config {
            return Ok(Self {
                config,
                prefix_length,
                strategy: Arc::clone(&self.strategy),
            });
        }
        Self::new(config, prefix_length)
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

#[cfg(test)]
mod tests {
    use super::*;
    use prefix_router_core::StrategyKind;

    fn config(name: &str) -> StrategyConfig {
        StrategyConfig::new(StrategyKind::named(name).unwrap_or_else(|| panic!("{name}")))
    }

    fn len(n: u64) -> PrefixLength {
        PrefixLength::new(n).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn an_unchanged_strategy_config_keeps_the_learned_strategy() {
        let first =
            Routing::new(config("cache-aware"), len(1024)).unwrap_or_else(|e| panic!("{e}"));
        let same = first
            .replaced_by(config("cache-aware"), len(2048))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(Arc::ptr_eq(&first.strategy, &same.strategy));
        assert_eq!(same.prefix_length.get(), 2048);

        let mut tuned = config("cache-aware");
        tuned.params.insert("index-blocks".into(), "4096".into());
        let rebuilt = same
            .replaced_by(tuned.clone(), len(2048))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!Arc::ptr_eq(&same.strategy, &rebuilt.strategy));
        let kept = rebuilt
            .replaced_by(tuned, len(2048))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(Arc::ptr_eq(&rebuilt.strategy, &kept.strategy));

        let other = kept
            .replaced_by(config("round-robin"), len(2048))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(other.strategy.name(), "round-robin");
    }

    #[test]
    fn a_bad_parameter_is_refused_and_names_it() {
        let first =
            Routing::new(config("cache-aware"), len(1024)).unwrap_or_else(|e| panic!("{e}"));
        let mut bad = config("cache-aware");
        bad.params.insert("index-blocks".into(), "0".into());
        let e = first
            .replaced_by(bad, len(1024))
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert!(matches!(&e, Err(m) if m.contains("index-blocks")), "{e:?}");
    }
}
