//! One workload split across several targets at once: the client load of a fleet behind
//! several router replicas, each client talking to one replica.
//!
//! Requests are dealt round-robin by position (request `i` to target `i mod n`), so every
//! replica sees a share of every prefix: the hard case for replicas that learn placement on
//! their own. A closed loop's clients are divided as evenly as possible (each target gets at
//! least one). The runs start together; their records come back as one outcome, indexed by the
//! position in the original list, each time counted from its own run's start (the starts are
//! within a scheduling tick of each other).

use std::sync::{Arc, Mutex};

use prefix_router_workload::Request;

use crate::driver::{run_with_progress, Progress};
use crate::{BenchConfig, BenchOutcome, LoadMode, LoadgenError};

/// Runs `requests` split across `configs` (one per target, same pacing) and merges the
/// outcomes; `on_progress` sees the runs' sums. Fails, before sending, on the first bad config.
pub async fn run_split<F>(
    configs: &[BenchConfig],
    requests: Vec<Request>,
    on_progress: F,
) -> Result<BenchOutcome, LoadgenError>
where
    F: FnMut(&Progress) + Send + 'static,
{
    let n = configs.len();
    if n == 0 {
        return Err(LoadgenError::Config {
            field: "targets",
            why: "at least one is needed".into(),
        });
    }
    for c in configs {
        c.validate()?;
    }
    let mut parts: Vec<Vec<Request>> = vec![Vec::new(); n];
    for (i, r) in requests.into_iter().enumerate() {
        parts[i % n].push(r);
    }
    let progress = Arc::new(Mutex::new((vec![Progress::default(); n], on_progress)));
    let mut tasks = Vec::with_capacity(n);
    for (k, (config, part)) in configs.iter().zip(parts).enumerate() {
        let mut config = config.clone();
        if let LoadMode::ClosedLoop { concurrency } = config.mode {
            let share = concurrency / n as u32 + u32::from((k as u32) < concurrency % n as u32);
            config.mode = LoadMode::ClosedLoop {
                concurrency: share.max(1),
            };
        }
        if let Some(m) = config.max_requests {
            // The limit is the whole run's: each target takes its share of it.
            config.max_requests =
                Some((m / n as u64 + u64::from((k as u64) < m % n as u64)).max(1));
        }
        let progress = Arc::clone(&progress);
        tasks.push(tokio::spawn(async move {
            run_with_progress(&config, part, move |p| {
                let mut g = progress.lock().unwrap_or_else(|e| e.into_inner());
                let (each, callback) = &mut *g;
                each[k] = *p;
                let sum = each.iter().fold(Progress::default(), |a, p| Progress {
                    planned: a.planned + p.planned,
                    sent: a.sent + p.sent,
                    completed: a.completed + p.completed,
                    failed: a.failed + p.failed,
                    elapsed_s: a.elapsed_s.max(p.elapsed_s),
                    stop_s: a.stop_s.or(p.stop_s),
                });
                callback(&sum);
            })
            .await
        }));
    }
    let mut outcomes = Vec::with_capacity(n);
    for t in tasks {
        let outcome = t.await.map_err(|e| LoadgenError::Config {
            field: "targets",
            why: format!("a replica's run stopped: {e}"),
        })??;
        outcomes.push(outcome);
    }
    Ok(merge(configs, outcomes))
}

fn merge(configs: &[BenchConfig], outcomes: Vec<BenchOutcome>) -> BenchOutcome {
    let n = outcomes.len();
    let mut records = Vec::new();
    let (mut planned, mut wall_s) = (0, 0.0f64);
    let mut model = None;
    for (k, o) in outcomes.into_iter().enumerate() {
        planned += o.planned;
        wall_s = wall_s.max(o.wall_s);
        model = model.or(o.model_from_target);
        records.extend(o.records.into_iter().map(|mut r| {
            r.index = r.index * n + k;
            r
        }));
    }
    let targets: Vec<&str> = configs.iter().map(|c| c.target.as_str()).collect();
    let mut merged = BenchOutcome::from_records(
        targets.join(","),
        format!("{n} targets"),
        configs[0].mode,
        planned,
        records,
        wall_s,
    );
    merged.model_from_target = model;
    merged
}

pub use prefix_router_workload::Affinity;

/// The affinity of `outcome`, whose records index `requests` (the list it ran), among
/// `instances` instances: every completed request with the instance that served it.
pub fn affinity(outcome: &BenchOutcome, requests: &[Request], instances: usize) -> Affinity {
    let served = outcome
        .records
        .iter()
        .filter(|r| r.is_ok())
        .filter_map(|r| {
            let inst = r.instance.as_deref()?;
            Some((requests.get(r.index)?, inst))
        });
    Affinity::of(served, instances)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RequestRecord;
    use prefix_router_workload::{Message, Role, Segment};

    fn request(doc: u64, q: u64) -> Request {
        let seg = |id, tokens| Segment { id, tokens };
        Request {
            id: q,
            arrival_s: 0.0,
            group: None,
            model: None,
            messages: vec![Message::new(
                Role::User,
                vec![seg(doc, 100), seg(1000 + q, 5)],
            )],
            output_tokens: 1,
        }
    }

    fn record(index: usize, instance: &str) -> RequestRecord {
        RequestRecord {
            index,
            id: index as u64,
            due_s: 0.0,
            sent_s: 0.0,
            first_content_s: Some(0.1),
            finished_s: 0.2,
            status: Some(200),
            usage: None,
            content_chunks: 1,
            instance: Some(instance.into()),
            decision: None,
            failure: None,
        }
    }

    fn outcome(records: Vec<RequestRecord>) -> BenchOutcome {
        let mode = LoadMode::ClosedLoop { concurrency: 1 };
        let n = records.len() as u64;
        BenchOutcome::from_records("t".into(), "e".into(), mode, n, records, 1.0)
    }

    #[test]
    fn merged_records_point_back_to_the_original_list() {
        // Requests 0..6 dealt to two targets: 0, 2, 4 to the first and 1, 3, 5 to the second.
        let a = outcome((0..3).map(|i| record(i, "x")).collect());
        let b = outcome((0..3).map(|i| record(i, "y")).collect());
        let configs = [
            BenchConfig::new(
                "http://127.0.0.1:1",
                LoadMode::ClosedLoop { concurrency: 1 },
            ),
            BenchConfig::new(
                "http://127.0.0.1:2",
                LoadMode::ClosedLoop { concurrency: 1 },
            ),
        ];
        let m = merge(&configs, vec![a, b]);
        let order: Vec<(usize, &str)> = m
            .records
            .iter()
            .map(|r| (r.index, r.instance.as_deref().unwrap_or("")))
            .collect();
        assert_eq!(
            order,
            [(0, "x"), (1, "y"), (2, "x"), (3, "y"), (4, "x"), (5, "y")]
        );
        assert_eq!(m.planned, 6);
    }

    #[test]
    fn affinity_counts_each_prefix_on_its_most_used_instance() {
        // Document 1: three on x, one on y; document 2: two on y. 5 of 6 on their home.
        let requests: Vec<Request> = [1, 1, 1, 1, 2, 2]
            .iter()
            .enumerate()
            .map(|(q, &d)| request(d, q as u64))
            .collect();
        let on = ["x", "x", "y", "x", "y", "y"];
        let o = outcome(on.iter().enumerate().map(|(i, s)| record(i, s)).collect());
        let a = affinity(&o, &requests, 3);
        assert_eq!((a.requests, a.prefixes), (6, 2));
        assert!((a.on_home - 5.0 / 6.0).abs() < 1e-9, "{a:?}");
        // 3 each on x and y, none on the third instance: the mean is 2.
        assert!((a.max_share_over_mean - 1.5).abs() < 1e-9, "{a:?}");
    }
}
