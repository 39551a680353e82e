//! `kv-aware`: [`cache-aware`](super::cache_aware)'s expected time to first token, with each
//! instance's match taken from what its engine reports holding (vLLM's KV events, through
//! [`RouteRequest::tokens`]) instead of inferred from what the router sent it. Where an
//! engine's report is missing or incomplete (no events, a subscriber that lost some, a
//! request the router could not tokenize), that instance's match falls back to cache-aware's
//! own index, which this strategy keeps learning from every request, so losing the events
//! degrades it to cache-aware rather than to blind routing.

use std::sync::Arc;

use super::cache_aware::{CacheAware, CacheAwareConfig, PARAMS};
use crate::strategy::{Feedback, MembershipChange, Note, StrategyEntry, StrategyStats};
use crate::{
    ChainSpec, Decision, FleetSnapshot, Instance, InstanceId, RouteError, RouteRequest, RouteRng,
    Strategy, TicketInfo,
};

/// Registry entry.
pub const ENTRY: StrategyEntry = StrategyEntry {
    name: "kv-aware",
    about: "cache-aware on what each engine reports it holds (KV events and a tokenizer); \
            infers where no report is",
    params: PARAMS,
    build: |c| {
        Ok(Arc::new(KvAware(CacheAware::new(
            CacheAwareConfig::from_strategy(c)?,
        ))))
    },
};

/// See the module documentation.
#[derive(Debug)]
pub struct KvAware(CacheAware);

impl Strategy for KvAware {
    fn name(&self) -> &'static str {
        ENTRY.name
    }
    fn select(
        &self,
        req: &RouteRequest<'_>,
        fleet: &FleetSnapshot,
        rng: &mut RouteRng,
    ) -> Result<Decision, RouteError> {
        self.0.select(req, fleet, rng)
    }
    fn chain_spec(&self) -> Option<ChainSpec> {
        self.0.chain_spec()
    }
    fn reads_usage(&self) -> bool {
        true
    }
    fn reads_tokens(&self) -> bool {
        true
    }
    fn dispatched(&self, req: &RouteRequest<'_>, decision: &Decision, instance: &Instance) -> Note {
        self.0.dispatched(req, decision, instance)
    }
    fn feedback(&self, t: &TicketInfo, event: &Feedback, now: f64) {
        self.0.feedback(t, event, now)
    }
    fn membership(&self, instance: &InstanceId, change: MembershipChange, now: f64) {
        self.0.membership(instance, change, now)
    }
    fn stats(&self) -> Option<StrategyStats> {
        self.0.stats()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use rand::SeedableRng;

    use super::*;
    use crate::{
        dispatch, Chain, ChainSpec, End, Fleet, InstanceSpec, Reason, Residency, StrategyConfig,
        StrategyKind, TokenRoute,
    };

    /// Reports, per instance URL, how many leading blocks it holds on its GPU and how many
    /// after those offloaded (absent: not known).
    struct Reports(HashMap<String, (u32, u32)>);

    impl Residency for Reports {
        fn report(&self, instance: &Instance, chain: &[u64], _: u64) -> Option<crate::Report> {
            self.0.get(&instance.spec().url).map(|&(b, off)| {
                let matched_blocks = b.min(chain.len() as u32);
                crate::Report {
                    matched_blocks,
                    offloaded_blocks: off.min(chain.len() as u32 - matched_blocks),
                }
            })
        }
    }

    fn url(i: usize) -> String {
        format!("http://127.0.0.1:{}", 9100 + i)
    }

    /// Routes an 8,000-character prompt of 2,000 tokens (125 blocks of 16) with these reports;
    /// returns the instance index and the reason.
    fn route(
        s: &Arc<dyn Strategy>,
        fleet: &Fleet,
        reports: &[(usize, u32)],
        doc: u8,
    ) -> (usize, Reason, u32) {
        route_with(
            s,
            fleet,
            &reports.iter().map(|&(i, b)| (i, b, 0)).collect::<Vec<_>>(),
            doc,
        )
    }

    /// [`route`], with `(instance, GPU blocks, offloaded blocks after them)` reports.
    fn route_with(
        s: &Arc<dyn Strategy>,
        fleet: &Fleet,
        reports: &[(usize, u32, u32)],
        doc: u8,
    ) -> (usize, Reason, u32) {
        let text: String = std::iter::repeat_n(char::from(b'a' + doc), 8_000).collect();
        let spec = ChainSpec {
            block_units: 128,
            max_units: 1 << 20,
        };
        let chain = Chain::of_chars(None, &text, spec);
        let tokens: Vec<u64> = (0..125).map(|b| u64::from(doc) << 32 | b).collect();
        let residency = Reports(
            reports
                .iter()
                .map(|&(i, b, off)| (url(i), (b, off)))
                .collect(),
        );
        let req = RouteRequest {
            key: None,
            chain: &chain.blocks,
            prompt_units: chain.units,
            model: None,
            now: 1.0,
            tokens: Some(TokenRoute {
                chain: &tokens,
                block_tokens: 16,
                prompt_tokens: 2_000,
                adapter: 0,
                residency: &residency,
            }),
            whole_answer: false,
        };
        let mut rng = RouteRng::seed_from_u64(3);
        let d = dispatch(s, &req, &fleet.snapshot(), &mut rng).expect("routes");
        let at = d.index;
        let reason = d.reason.clone();
        let cached = d.ticket.info().predicted_cached_units;
        d.ticket.finish(End::Finished { usage: None }, 1.1);
        (at, reason, cached)
    }

    fn setup() -> (Arc<dyn Strategy>, Fleet) {
        setup_with(&[])
    }

    fn setup_with(params: &[(&str, &str)]) -> (Arc<dyn Strategy>, Fleet) {
        let mut c = StrategyConfig::new(StrategyKind::named("kv-aware").expect("registered"));
        c.params.insert("max-share".into(), "0".into());
        for (k, v) in params {
            c.params.insert((*k).into(), (*v).into());
        }
        let s = c.build().expect("builds");
        assert!(s.reads_tokens() && s.reads_usage());
        let fleet = Fleet::new((0..4).map(|i| InstanceSpec::from_url(url(i))).collect());
        (s, fleet)
    }

    #[test]
    fn goes_where_the_engine_reports_the_prefix_even_if_the_router_never_sent_it() {
        let (s, fleet) = setup();
        // Instance 2 was warmed by someone else (another router replica, a batch job).
        let (at, reason, cached) = route(&s, &fleet, &[(0, 0), (1, 0), (2, 125), (3, 0)], 1);
        assert_eq!(at, 2);
        assert_eq!(reason, Reason::CacheHit);
        assert_eq!(cached, 8_000, "125 of 125 blocks: the whole prompt");
    }

    #[test]
    fn a_report_overrides_the_index_and_its_absence_falls_back_to_it() {
        let (s, fleet) = setup();
        // No reports at all: cache-aware's own placement, which the index then remembers.
        let (home, reason, _) = route(&s, &fleet, &[], 1);
        assert_eq!(reason, Reason::Cold);
        let (again, reason, _) = route(&s, &fleet, &[], 1);
        assert_eq!(
            (again, reason),
            (home, Reason::CacheHit),
            "the index's guess"
        );
        // The home's engine says it evicted the prefix and another holds it: the report wins.
        let other = (home + 1) % 4;
        let reports: Vec<(usize, u32)> = (0..4)
            .map(|i| (i, if i == other { 125 } else { 0 }))
            .collect();
        let (at, reason, _) = route(&s, &fleet, &reports, 1);
        assert_eq!((at, reason), (other, Reason::CacheHit));
        // Only the home's report is missing (its view lost events): the index still speaks
        // for it, and the reported holder of the same prefix competes on equal terms.
        let partial: Vec<(usize, u32)> = (0..4).filter(|&i| i != home).map(|i| (i, 0)).collect();
        let (at, _, cached) = route(&s, &fleet, &partial, 1);
        assert_eq!(at, home, "inferred match on the unreported instance");
        assert!(cached > 7_000);
    }

    #[test]
    fn an_opening_most_engines_hold_does_not_keep_new_documents_off_the_others() {
        // Instances 0-2 report holding the prompt's first `opening` blocks (a system prompt
        // every request starts with); instance 3 has never been sent one. The queues are empty.
        let spread = |opening: u32| {
            let (s, fleet) = setup();
            let mut per = [0usize; 4];
            for doc in 0..40u8 {
                let (at, _, cached) = route(
                    &s,
                    &fleet,
                    &[(0, opening), (1, opening), (2, opening), (3, 0)],
                    doc,
                );
                per[at] += 1;
                // The prediction stays what the instance holds.
                let holds = if at == 3 { 0 } else { opening * 64 };
                assert_eq!(cached, holds, "doc {doc} on {at}");
            }
            per
        };
        // A short opening (25 of 125 blocks): new documents behind it go to all four, the one
        // without it too (it then holds it; counted only where held, it would never get any
        // while the queues are short).
        let per = spread(25);
        assert!(per.iter().all(|&n| n >= 5), "{per:?}");
        // Most of the prompt (100 of 125 blocks): recomputing it is real work, so its holders
        // keep it.
        let per = spread(100);
        assert_eq!(per[3], 0, "{per:?}");
    }

    #[test]
    fn an_offloaded_copy_draws_new_requests_and_a_gpu_hit_beats_it() {
        for doc in 0..6u8 {
            // Where the prefix would go with nobody holding it.
            let (s, fleet) = setup();
            let (cold_home, reason, _) = route(&s, &fleet, &[(0, 0), (1, 0), (2, 0), (3, 0)], doc);
            assert_eq!(reason, Reason::Cold);
            let holder = (cold_home + 1) % 4;
            let off: Vec<(usize, u32, u32)> = (0..4)
                .map(|i| (i, 0, if i == holder { 125 } else { 0 }))
                .collect();
            // Another instance keeps the whole prompt in CPU memory: loading beats computing.
            let (s, fleet) = setup();
            assert_eq!(route_with(&s, &fleet, &off, doc).0, holder, "doc {doc}");
            // Without credit for it, the copy is ignored.
            let (s, fleet) = setup_with(&[("offload-credit", "0")]);
            assert_eq!(route_with(&s, &fleet, &off, doc).0, cold_home, "doc {doc}");
            // A GPU hit elsewhere beats the offloaded copy.
            let gpu = (holder + 1) % 4;
            let both: Vec<(usize, u32, u32)> = off
                .iter()
                .map(|&(i, b, o)| if i == gpu { (i, 125, 0) } else { (i, b, o) })
                .collect();
            let (s, fleet) = setup();
            assert_eq!(route_with(&s, &fleet, &both, doc).0, gpu, "doc {doc}");
        }
    }
}
