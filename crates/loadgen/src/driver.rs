//! The drivers: open loop (send on schedule) and closed loop (C workers), and the collector
//! that turns their records into a [`BenchOutcome`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prefix_router_workload::Request;
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use crate::client::{secs, ChatClient, Listing, Slot};
use crate::schedule::{asks_whole, request_body, send_offsets};
use crate::{BenchConfig, BenchOutcome, LoadMode, LoadgenError, RequestRecord};

/// Where a run stands; handed to the progress callback after every send and every answer.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Progress {
    /// Requests the run may send (fewer are sent when `duration` ends it first).
    pub planned: u64,
    /// Requests sent so far.
    pub sent: u64,
    /// Requests answered completely.
    pub completed: u64,
    /// Requests failed.
    pub failed: u64,
    /// Seconds since the start.
    pub elapsed_s: f64,
    /// When sending stops, seconds since the start, if a duration was set.
    pub stop_s: Option<f64>,
}

impl Progress {
    /// Requests sent and not yet answered.
    pub fn in_flight(&self) -> u64 {
        self.sent.saturating_sub(self.completed + self.failed)
    }
}

/// What drivers report to the collector.
enum Event {
    Sent,
    Done(Box<RequestRecord>),
}

/// Runs `requests` (sorted by arrival) against the configured target; see [`run_with_progress`].
pub async fn run(
    config: &BenchConfig,
    requests: Vec<Request>,
) -> Result<BenchOutcome, LoadgenError> {
    run_with_progress(config, requests, |_| {}).await
}

/// Runs `requests` against the configured target and returns what was observed.
///
/// The list is first cut to `max_requests` and given the configured `model`. Open loop sends
/// each request at its scheduled time on its own task, so responses never delay the schedule;
/// closed loop runs `concurrency` workers over the list in order. With `duration`, no request is
/// sent after it; requests in flight then finish or time out. Returns once every sent request is
/// answered, failed or timed out. Fails only on bad settings, before sending anything.
pub async fn run_with_progress<F>(
    config: &BenchConfig,
    mut requests: Vec<Request>,
    mut on_progress: F,
) -> Result<BenchOutcome, LoadgenError>
where
    F: FnMut(&Progress),
{
    let target = config.validate()?;
    if let Some(n) = config.max_requests {
        requests.truncate(usize::try_from(n).unwrap_or(usize::MAX));
    }
    if let Some(model) = &config.model {
        for r in &mut requests {
            r.model = Some(model.clone());
        }
    }
    let client = ChatClient::new(&target, config.timeout);
    let model_from_target = check_models(&client, &mut requests, config.wait_for_target).await?;
    let stop_s = config.duration.map(|d| d.as_secs_f64());
    let (tx, mut rx) = unbounded_channel();
    let clock = Instant::now();
    let planned;
    let driver = match config.mode {
        LoadMode::OpenLoop { rate } => {
            let offsets = send_offsets(&requests, rate);
            planned = offsets
                .iter()
                .take_while(|&&t| stop_s.is_none_or(|s| t < s))
                .count() as u64;
            tokio::spawn(open_loop(
                client,
                requests,
                offsets,
                stop_s,
                config.unstreamed,
                clock,
                tx,
            ))
        }
        LoadMode::ClosedLoop { concurrency } => {
            planned = requests.len() as u64;
            tokio::spawn(closed_loop(
                client,
                requests,
                concurrency,
                stop_s,
                config.unstreamed,
                clock,
                tx,
            ))
        }
    };

    let mut progress = Progress {
        planned,
        stop_s,
        ..Progress::default()
    };
    let mut records = Vec::new();
    // The channel closes once the driver and every request task have dropped their senders,
    // that is once every sent request has its record.
    while let Some(event) = rx.recv().await {
        match event {
            Event::Sent => progress.sent += 1,
            Event::Done(rec) => {
                if rec.is_ok() {
                    progress.completed += 1;
                } else {
                    progress.failed += 1;
                }
                records.push(*rec);
            }
        }
        progress.elapsed_s = secs(clock);
        on_progress(&progress);
    }
    // The driver has finished (its sender is gone); a panic in it would already have lost
    // requests, so its join result adds nothing.
    let _ = driver.await;
    let mut outcome = BenchOutcome::from_records(
        target.base.clone(),
        target.endpoint.to_string(),
        config.mode,
        planned,
        records,
        secs(clock),
    );
    outcome.model_from_target = model_from_target;
    Ok(outcome)
}

/// Checks the requests' models against those the target lists at `/v1/models` (a target that
/// lists none is not checked). Requests that name no model get the first one listed, which is
/// returned: an engine serves its base model under its own name, not a placeholder, so the
/// defaults of `bench` fit any engine. A request naming a model the target does not list stops
/// the run before it starts: every request would fail with a 404, and the run would measure
/// nothing.
async fn check_models(
    client: &ChatClient,
    requests: &mut [Request],
    wait: Duration,
) -> Result<Option<String>, LoadgenError> {
    if requests.is_empty() {
        return Ok(None);
    }
    // A target started a moment ago (a script that starts the router, then `bench`) gets a
    // few seconds to come up; then the run goes ahead and its failures say why.
    let deadline = Instant::now() + wait;
    let listed = loop {
        match client.served_models().await {
            Listing::Models(ids) => break ids,
            Listing::NotUp if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Listing::NotUp | Listing::Nothing => return Ok(None),
        }
    };
    let asked: std::collections::BTreeSet<&str> =
        requests.iter().filter_map(|r| r.model.as_deref()).collect();
    let missing: Vec<&str> = asked
        .into_iter()
        .filter(|m| !listed.iter().any(|l| l == m))
        .collect();
    if !missing.is_empty() {
        return Err(LoadgenError::Config {
            field: "model",
            why: format!(
                "the requests name {} but the target serves {} (GET /v1/models); pass --model {}",
                quoted(&missing),
                quoted(&listed.iter().map(String::as_str).collect::<Vec<_>>()),
                listed[0]
            ),
        });
    }
    let mut filled = false;
    for r in requests.iter_mut().filter(|r| r.model.is_none()) {
        r.model = Some(listed[0].clone());
        filled = true;
    }
    Ok(filled.then(|| listed[0].clone()))
}

fn quoted(names: &[&str]) -> String {
    let shown: Vec<String> = names.iter().take(5).map(|n| format!("'{n}'")).collect();
    let more = names.len().saturating_sub(5);
    if more > 0 {
        format!("{} and {more} more", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

/// Sends request `index` at `due_s` on its own task.
async fn open_loop(
    client: ChatClient,
    requests: Vec<Request>,
    offsets: Vec<f64>,
    stop_s: Option<f64>,
    unstreamed: f64,
    clock: Instant,
    tx: UnboundedSender<Event>,
) {
    for (index, (request, due_s)) in requests.into_iter().zip(offsets).enumerate() {
        if stop_s.is_some_and(|s| due_s >= s) {
            break;
        }
        // A trace can hold absurd times; a due time past the clock's range ends the run.
        let Some(at) = Duration::try_from_secs_f64(due_s)
            .ok()
            .and_then(|d| clock.checked_add(d))
        else {
            break;
        };
        tokio::time::sleep_until(at.into()).await;
        let (client, tx) = (client.clone(), tx.clone());
        tokio::spawn(async move {
            send_one(&client, &request, index, due_s, unstreamed, clock, &tx).await;
        });
    }
}

/// Sends the run's request `index` (due at `due_s`; asked whole as `unstreamed` says) and tells
/// the collector it went and how it ended: both drivers' send.
async fn send_one(
    client: &ChatClient,
    request: &Request,
    index: usize,
    due_s: f64,
    unstreamed: f64,
    clock: Instant,
    tx: &UnboundedSender<Event>,
) {
    let whole = asks_whole(index, unstreamed);
    let body = request_body(request, whole);
    let _ = tx.send(Event::Sent);
    let slot = Slot {
        index,
        id: request.id,
        due_s,
        whole,
    };
    let rec = client.send(slot, body, clock).await;
    let _ = tx.send(Event::Done(Box::new(rec)));
}

/// `concurrency` workers, each taking the next unsent request when its previous one ends.
async fn closed_loop(
    client: ChatClient,
    requests: Vec<Request>,
    concurrency: u32,
    stop_s: Option<f64>,
    unstreamed: f64,
    clock: Instant,
    tx: UnboundedSender<Event>,
) {
    let workers = usize::try_from(concurrency)
        .unwrap_or(usize::MAX)
        .min(requests.len());
    let requests = Arc::new(requests);
    let next = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::with_capacity(workers);
    for _ in 0..workers {
        let (client, tx) = (client.clone(), tx.clone());
        let (requests, next) = (Arc::clone(&requests), Arc::clone(&next));
        handles.push(tokio::spawn(async move {
            loop {
                if stop_s.is_some_and(|s| secs(clock) >= s) {
                    break;
                }
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(request) = requests.get(index) else {
                    break;
                };
                let due_s = secs(clock);
                send_one(&client, request, index, due_s, unstreamed, clock, &tx).await;
            }
        }));
    }
    for h in handles {
        let _ = h.await;
    }
}
