//! One workload split across several targets at once: the client load of a fleet behind
//! several router replicas, each client talking to one replica.
//!
//! Requests are dealt round-robin by position (request `i` to target `i mod n`), so every
//! replica sees a share of every prefix: the hard case for replicas that learn placement on
//! their own. A closed loop's clients are divided as evenly as possible (each target gets at
//! least one). Open loop, every request is sent at its time in the whole workload's schedule
//! (rescaled to `rate` as a whole, before the split): each target's run starts when its first
//! request is due. Their records come back as one outcome, indexed by the position in the
//! original list, each time counted from the common start.

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
    let stop_s = configs[0].duration.map(|d| d.as_secs_f64());
    let parts = deal(requests, n, configs[0].mode, stop_s);
    let progress = Arc::new(Mutex::new((vec![Progress::default(); n], on_progress)));
    let mut tasks = Vec::with_capacity(n);
    for (k, (config, (part, delay))) in configs.iter().zip(parts).enumerate() {
        let mut config = config.clone();
        match config.mode {
            LoadMode::ClosedLoop { concurrency } => {
                let share = concurrency / n as u32 + u32::from((k as u32) < concurrency % n as u32);
                config.mode = LoadMode::ClosedLoop {
                    concurrency: share.max(1),
                };
            }
            // Rescaled as a whole already, and cut at the duration: a share that started
            // late would count the duration from its own start.
            LoadMode::OpenLoop { .. } => {
                config.mode = LoadMode::OpenLoop { rate: None };
                config.duration = None;
            }
        }
        if let Some(m) = config.max_requests {
            // The limit is the whole run's: each target takes its share of it.
            config.max_requests =
                Some((m / n as u64 + u64::from((k as u64) < m % n as u64)).max(1));
        }
        let progress = Arc::clone(&progress);
        tasks.push(tokio::spawn(async move {
            if delay > 0.0 {
                tokio::time::sleep(std::time::Duration::from_secs_f64(delay)).await;
            }
            let outcome = run_with_progress(&config, part, move |p| {
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
            .await;
            // On the common timeline.
            outcome.map(|mut o| {
                for r in &mut o.records {
                    r.due_s += delay;
                    r.sent_s += delay;
                    r.finished_s += delay;
                    r.first_content_s = r.first_content_s.map(|t| t + delay);
                }
                o.wall_s += delay;
                o
            })
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

/// Deals `requests` round-robin into `n` parts, each with how long after the common start its
/// run begins. Open loop, with the whole workload rescaled to its rate first: a part's run
/// begins when its first request is due in the whole schedule, and its own schedule (counted
/// from its first request) then sends every request at its time in the whole one. Each part
/// timed from its own first request instead pulled it earlier by that gap, reordering
/// requests that share a prefix across the replicas; and each part rescaled to the rate by
/// itself sent `n` times the rate in all.
/// Open loop, the requests due at or after `stop_s` (the run's duration) are left out, as the
/// whole run would not send them.
fn deal(
    requests: Vec<Request>,
    n: usize,
    mode: LoadMode,
    stop_s: Option<f64>,
) -> Vec<(Vec<Request>, f64)> {
    let mut requests = requests;
    let open = matches!(mode, LoadMode::OpenLoop { .. });
    if let LoadMode::OpenLoop { rate: Some(rate) } = mode {
        crate::schedule::rescale_arrivals(&mut requests, rate);
    }
    // Every request's due time in the whole schedule (monotone, as the driver sends them),
    // written back so that each share's own schedule is the whole one's (a trace's bad or
    // out-of-order arrival would otherwise be read against the share's neighbours).
    let due = crate::schedule::send_offsets(&requests, None);
    if open {
        for (r, &d) in requests.iter_mut().zip(&due) {
            r.arrival_s = d;
        }
        if let Some(stop) = stop_s {
            let keep = due.iter().take_while(|&&d| d < stop).count();
            requests.truncate(keep);
        }
    }
    let mut parts: Vec<(Vec<Request>, f64)> = vec![(Vec::new(), 0.0); n];
    for (i, r) in requests.into_iter().enumerate() {
        let part = &mut parts[i % n];
        if part.0.is_empty() && open {
            part.1 = due.get(i).copied().unwrap_or(0.0);
        }
        part.0.push(r);
    }
    parts
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
            streamed: true,
            asked_whole: false,
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

    /// Open loop, each request is due at its time in the whole schedule, on whichever target:
    /// a part's start delay plus its own offsets. Arrivals 0, 10, 11, 20 over two targets were
    /// sent at 0, 0, 11, 10 (request 3 before request 2), and with a rate each part was
    /// rescaled to it on its own.
    #[test]
    fn each_target_sends_at_the_whole_schedules_times() {
        let at = |times: &[f64]| -> Vec<Request> {
            times
                .iter()
                .enumerate()
                .map(|(i, &t)| Request {
                    arrival_s: t,
                    ..request(1, i as u64)
                })
                .collect()
        };
        let due_by_part = |parts: &[(Vec<Request>, f64)], n: usize, len: usize| -> Vec<f64> {
            let mut due = vec![f64::NAN; len];
            for (k, (part, delay)) in parts.iter().enumerate() {
                for (j, o) in crate::schedule::send_offsets(part, None).iter().enumerate() {
                    due[j * n + k] = delay + o;
                }
            }
            due
        };
        let parts = deal(
            at(&[0.0, 10.0, 11.0, 20.0]),
            2,
            LoadMode::OpenLoop { rate: None },
            None,
        );
        assert_eq!(due_by_part(&parts, 2, 4), [0.0, 10.0, 11.0, 20.0]);
        // An arrival out of order is due with the one before it, in whichever share.
        let parts = deal(
            at(&[0.0, 10.0, f64::NAN, 20.0]),
            2,
            LoadMode::OpenLoop { rate: None },
            None,
        );
        assert_eq!(due_by_part(&parts, 2, 4), [0.0, 10.0, 10.0, 20.0]);
        // A duration of 15 s: what is due after it is not sent, by any share.
        let parts = deal(
            at(&[0.0, 10.0, 11.0, 20.0]),
            2,
            LoadMode::OpenLoop { rate: None },
            Some(15.0),
        );
        assert_eq!(parts[0].0.len() + parts[1].0.len(), 3);
        // Rescaled as a whole: 4 requests at 1 per second span 3 s, in the same shape.
        let parts = deal(
            at(&[0.0, 10.0, 11.0, 20.0]),
            2,
            LoadMode::OpenLoop { rate: Some(1.0) },
            None,
        );
        let due = due_by_part(&parts, 2, 4);
        for (got, want) in due.iter().zip([0.0, 1.5, 1.65, 3.0]) {
            assert!((got - want).abs() < 1e-9, "{due:?}");
        }
        // Closed loop: no schedule, every run starts at once.
        let parts = deal(
            at(&[0.0, 10.0, 11.0]),
            2,
            LoadMode::ClosedLoop { concurrency: 2 },
            None,
        );
        assert!(parts.iter().all(|(_, d)| *d == 0.0));
        assert_eq!(parts[0].0.len() + parts[1].0.len(), 3);
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
