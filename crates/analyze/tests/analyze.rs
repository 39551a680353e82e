//! `analyze` on the two traces issue 9 names: the repository's Mooncake sample and a generated
//! shared-system-prompt workload. The recommendation must beat the default settings, and on the
//! shared system prompt the collapse of short prefix lengths must be named with each length's
//! largest bucket. Sized for debug builds: a few hundred requests, two rates.

use prefix_router_analyze::{analyze, render, AnalyzeConfig, Input, Setting};
use prefix_router_core::{PrefixLength, StrategyConfig, StrategyKind};
use prefix_router_workload::generators::{
    self, Arrival, WorkloadKind, WorkloadParams, WorkloadSpec,
};

fn setting(name: &str) -> Setting {
    let kind = StrategyKind::named(name).unwrap_or_else(|| panic!("{name} is registered"));
    Setting::new(StrategyConfig::new(kind), PrefixLength::default())
}

fn config(instances: u32, current: Setting) -> AnalyzeConfig {
    let mut c = AnalyzeConfig::new("small", instances, current);
    c.rate_factors = vec![1.0, 2.0];
    c.fleet_deltas = vec![1];
    c
}

fn shared_system_prompt(requests: u64) -> Input {
    let mut spec = WorkloadSpec::default_for(WorkloadKind::SharedSystemPrompt);
    spec.requests = requests;
    spec.arrival = Arrival::Poisson { rate: 6.0 };
    let mut p = WorkloadParams::default_for(WorkloadKind::SharedSystemPrompt);
    p.apply_override("documents=24")
        .unwrap_or_else(|e| panic!("{e}"));
    p.apply_override("doc_tokens=1500")
        .unwrap_or_else(|e| panic!("{e}"));
    spec.params = p;
    Input::from_requests(
        "shared-system-prompt",
        generators::generate(&spec).collect(),
    )
}

#[test]
fn shared_system_prompt_names_the_collapse_and_beats_prefix_aware_defaults() {
    let input = shared_system_prompt(300);
    let today = setting("prefix-aware");
    let a = analyze(&input, &config(4, today), &mut |_| {}).unwrap_or_else(|e| panic!("{e}"));

    // The collapse: one bucket at 1024 and 2048 characters, split by 4096.
    let share = |len: usize| {
        a.traffic
            .keys
            .iter()
            .find(|k| k.prefix_length == len)
            .map(|k| k.largest_share)
            .unwrap_or(f64::NAN)
    };
    assert_eq!(share(1024), 1.0);
    assert_eq!(share(2048), 1.0);
    assert!(share(4096) < 0.2, "{}", share(4096));
    let c = a
        .traffic
        .collapse
        .as_ref()
        .unwrap_or_else(|| panic!("no collapse"));
    assert_eq!((c.prefix_length, c.splits_at), (1024, Some(4096)));
    let text = render::text(&a);
    assert!(
        text.contains("WARNING: one opening covers 100.0% of requests at prefix length 1024")
            && text.contains("It splits at 4096 characters"),
        "{text}"
    );
    // The system prompt is the hottest prefix: every request, 3,000 characters' worth.
    let hot = &a.traffic.hottest[0];
    assert_eq!(hot.requests, 300);
    assert!(hot.tokens >= 400 && hot.tokens <= 800, "{}", hot.tokens);

    // Today's prefix-aware at 1024 sends everything to one instance; the recommendation does
    // not, and is faster at every rate.
    let today_1x = a
        .outcome(a.current, 0)
        .unwrap_or_else(|| panic!("today at 1x"));
    assert!(today_1x.max_share > 0.99, "{}", today_1x.max_share);
    assert_ne!(a.recommended, a.current);
    assert!(
        a.scores[a.recommended] < 0.9 * a.scores[a.current],
        "{:?}",
        a.scores
    );
    for rate in 0..a.rate_factors.len() {
        let (r, t) = (
            a.outcome(a.recommended, rate).map(|o| o.ttft_ms.p90),
            a.outcome(a.current, rate).map(|o| o.ttft_ms.p90),
        );
        assert!(r < t, "rate {rate}: {r:?} vs {t:?}");
    }
    assert!(text.contains("Recommendation: ") && text.contains("Beside today's setting"));
    // Fleet size: the recommended setting on one more instance, at both rates.
    assert_eq!(a.fleet_sizes.len(), 2);
    assert!(a
        .fleet_sizes
        .iter()
        .all(|o| o.instances == 5 && o.setting == a.recommended));
    assert!(serde_json::to_string(&a).is_ok_and(|j| j.contains("\"recommended\"")));
}

#[test]
fn mooncake_sample_recommendation_beats_the_defaults() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../data/traces/mooncake_synthetic_trace.jsonl"
    );
    let mut input = Input::load(path).unwrap_or_else(|e| panic!("{e}"));
    input.requests.truncate(800);
    assert_eq!(input.format.map(|f| f.name()), Some("mooncake"));
    let a = analyze(&input, &config(4, setting("cache-aware")), &mut |_| {})
        .unwrap_or_else(|e| panic!("{e}"));
    // The profile's oracle is the simulator's own.
    let oracle =
        prefix_router_workload::trace::oracle_hit_rate(&input.requests, a.fleet.block_tokens);
    assert!((a.traffic.oracle_hit_rate - oracle).abs() < 1e-12);
    assert!(
        a.traffic.oracle_hit_rate > 0.1,
        "the sample shares prefixes: {}",
        a.traffic.oracle_hit_rate
    );
    // Against serve's default and prefix-aware's: no worse than either, and better than a
    // cache-blind balancer.
    let score_of = |name: &str| {
        a.settings
            .iter()
            .position(|s| s.same_as(&setting(name)))
            .map(|i| a.scores[i])
            .unwrap_or(f64::NAN)
    };
    let best = a.scores[a.recommended];
    assert!(best <= score_of("cache-aware") && best <= score_of("prefix-aware"));
    assert!(best < score_of("random") && best < score_of("least-outstanding"));
    assert!(a.traffic.collapse.is_none(), "Mooncake's openings are many");
    // Outcomes cover every setting at every rate.
    assert_eq!(a.outcomes.len(), a.settings.len() * a.rate_factors.len());
}

#[test]
fn bad_inputs_are_named() {
    let e = Input::load("/nonexistent/trace.jsonl")
        .map(|_| ())
        .unwrap_err();
    assert!(e.to_string().contains("/nonexistent/trace.jsonl"), "{e}");
    let one = Input::from_requests("one", shared_system_prompt(1).requests);
    let e = analyze(&one, &config(2, setting("random")), &mut |_| {})
        .map(|_| ())
        .unwrap_err();
    assert!(e.to_string().contains("at least two requests"), "{e}");
    let input = shared_system_prompt(20);
    let mut c = config(2, setting("random"));
    c.rate_factors = vec![0.0];
    let e = analyze(&input, &c, &mut |_| {}).map(|_| ()).unwrap_err();
    assert!(e.to_string().starts_with("rates:"), "{e}");
    c.rate_factors = vec![1.0];
    c.instances = 0;
    assert!(analyze(&input, &c, &mut |_| {}).is_err());
}

#[test]
fn a_rate_the_fleet_cannot_keep_up_with_is_named_overloaded() {
    let run = |rate: f64| {
        let mut spec = WorkloadSpec::default_for(WorkloadKind::LongContext);
        spec.requests = 60;
        spec.arrival = Arrival::Poisson { rate };
        spec.params
            .apply_override("documents=60")
            .unwrap_or_else(|e| panic!("{e}"));
        let input = Input::from_requests("long-context", generators::generate(&spec).collect());
        let mut c = config(1, setting("random"));
        c.rate_factors = vec![1.0];
        c.fleet_deltas = Vec::new();
        analyze(&input, &c, &mut |_| {}).unwrap_or_else(|e| panic!("{e}"))
    };
    // 60 uncached 8k-token prompts at 50 a second on one small engine: a queue for the whole run.
    let a = run(50.0);
    assert!(a.outcomes.iter().all(|o| o.overloaded), "{:?}", a.outcomes);
    assert!(render::text(&a).contains("overloaded: the fleet completed under half"));
    // One every 20 seconds: it keeps up.
    let a = run(0.05);
    assert!(a.outcomes.iter().all(|o| !o.overloaded), "{:?}", a.outcomes);
    assert!(!render::text(&a).contains("overloaded"));
}
