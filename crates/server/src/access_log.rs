//! The access log: one JSON line per dispatched request, for replaying a fleet's own traffic in
//! the simulator and for seeing what routing did. It holds hashes and lengths only: no prompt
//! text, and no group id (ids can name tenants; the log has a hash of each, which still tells
//! groups apart).
//!
//! The request path only moves an [`Entry`] into a bounded channel (`try_send`: never waits).
//! One writer, on a blocking thread (file writes must not hold a runtime worker), formats and
//! appends the lines, flushing whenever the channel is empty. When
//! the writer falls behind and the channel is full, the entry is dropped and counted
//! (`access_log_dropped_total`): a slow disk must not slow requests. `reopen` (SIGHUP) makes the
//! writer open the path again, so that logrotate can move the file away.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::metrics::counter::Counter;
use serde::Serialize;
use tokio::sync::{mpsc, Notify};

/// One request, as the writer gets it.
#[derive(Debug, Serialize)]
pub struct Entry {
    /// Arrival, Unix seconds.
    pub t: f64,
    /// `chat`, `completions`, `invocations` (the native API), `other`.
    pub api: &'static str,
    /// Requested model, if named.
    pub model: Option<Box<str>>,
    /// Hash of the routing group (`prompt_cache_key` or the group header), hex.
    #[serde(serialize_with = "hex")]
    pub group: Option<u64>,
    /// Prompt length in the chain's units (characters; bytes for the native API), as far as
    /// extraction read it.
    pub prompt_units: u32,
    /// Units per block of `chain`.
    pub block_units: u32,
    /// Hash of each full block of the prompt, each covering everything before it.
    pub chain: Box<[u64]>,
    /// The instance it went to (the last one, after retries).
    pub instance: Arc<str>,
    /// Why (the decision reason).
    pub reason: &'static str,
    /// Attempts before this one (retries).
    pub attempt: u32,
    /// HTTP status the instance answered (0: none, the request failed before a response).
    pub status: u16,
    /// How it ended (`ok`, `upstream_error`, `cancelled`, ...).
    pub outcome: &'static str,
    /// Arrival to first response byte, seconds.
    pub ttft_s: Option<f64>,
    /// Arrival to end, seconds.
    pub duration_s: f64,
    /// The engine's `usage.prompt_tokens`.
    pub prompt_tokens: Option<u32>,
    /// The engine's `usage.prompt_tokens_details.cached_tokens`.
    pub cached_tokens: Option<u32>,
    /// The engine's `usage.completion_tokens`.
    pub output_tokens: Option<u32>,
}

fn hex<S: serde::Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(h) => s.serialize_str(&format!("{h:016x}")),
        None => s.serialize_none(),
    }
}

/// Unix seconds now.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The log's request-side handle.
#[derive(Debug)]
pub struct AccessLog {
    tx: mpsc::Sender<Entry>,
    /// Taken once by [`AccessLog::writer`].
    rx: Mutex<Option<(mpsc::Receiver<Entry>, BufWriter<File>)>>,
    path: PathBuf,
    signals: Arc<Signals>,
    /// Lines written.
    pub written: Counter,
    /// Lines dropped because the writer was behind.
    pub dropped: Counter,
}

/// What the writer is asked to do besides writing.
#[derive(Debug, Default)]
struct Signals {
    reopen: AtomicBool,
    close: AtomicBool,
    wake: Notify,
}

fn open(path: &Path) -> std::io::Result<BufWriter<File>> {
    let file = OpenOptions::new().create(true).append(true).open(path)?;
    Ok(BufWriter::with_capacity(64 * 1024, file))
}

impl AccessLog {
    /// Opens (creates or appends to) `path` now, so that a bad path stops start-up.
    pub fn open(path: &Path, queue: usize) -> std::io::Result<Self> {
        let file = open(path)?;
        let (tx, rx) = mpsc::channel(queue.max(1));
        Ok(Self {
            tx,
            rx: Mutex::new(Some((rx, file))),
            path: path.to_path_buf(),
            signals: Arc::default(),
            written: Counter::default(),
            dropped: Counter::default(),
        })
    }

    /// Hands one entry to the writer, or counts it dropped; never waits.
    pub fn log(&self, entry: Entry) {
        if self.tx.try_send(entry).is_err() {
            self.dropped.inc();
        }
    }

    /// Starts the writer on a blocking thread of the current runtime.
    pub fn spawn_writer(&self) -> Option<tokio::task::JoinHandle<()>> {
        let writer = self.writer()?;
        let rt = tokio::runtime::Handle::current();
        Some(tokio::task::spawn_blocking(move || rt.block_on(writer)))
    }

    /// Asks the writer to open the path again (after logrotate moved the file).
    pub fn reopen(&self) {
        self.signals.reopen.store(true, Ordering::Release);
        self.signals.wake.notify_one();
    }

    /// Asks the writer to write what is queued and end (shutdown, once requests are done).
    pub fn close(&self) {
        self.signals.close.store(true, Ordering::Release);
        self.signals.wake.notify_one();
    }

    /// The writer task; `None` after the first call. It does blocking file I/O: run it with
    /// [`AccessLog::spawn_writer`] (or on a thread of its own).
    pub fn writer(&self) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        let (mut rx, mut out) = self.rx.lock().ok()?.take()?;
        let path = self.path.clone();
        let shown = self.path.display().to_string();
        let signals = Arc::clone(&self.signals);
        let written = self.written.clone();
        Some(async move {
            let mut line = Vec::with_capacity(1024);
            // Warned once per run of failures (a full disk must not flood the log as well).
            let mut failing = false;
            // Most write failures (a full disk) show at flush, past the buffer: both go
            // through the same check.
            let mut report = move |result: std::io::Result<()>| match result {
                Ok(()) => failing = false,
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(path = %shown, error = %e, "cannot write the access log");
                }
                Err(_) => {}
            };
            let mut write = |out: &mut BufWriter<File>, entry: &Entry| -> std::io::Result<()> {
                line.clear();
                if serde_json::to_writer(&mut line, entry).is_err() {
                    return Ok(());
                }
                line.push(b'\n');
                out.write_all(&line)?;
                written.inc();
                Ok(())
            };
            loop {
                let entry = tokio::select! {
                    e = rx.recv() => match e {
                        Some(e) => Some(e),
                        // Every sender is gone (the router's state was dropped): nothing more
                        // can come.
                        None => {
                            report(out.flush());
                            return;
                        }
                    },
                    () = signals.wake.notified() => None,
                };
                if let Some(entry) = &entry {
                    report(write(&mut out, entry));
                }
                if signals.reopen.swap(false, Ordering::AcqRel) {
                    report(out.flush());
                    match open(&path) {
                        Ok(f) => out = f,
                        Err(e) => {
                            tracing::warn!(path = %path.display(), error = %e, "cannot reopen the access log; writing on to the file open before")
                        }
                    }
                }
                if signals.close.load(Ordering::Acquire) {
                    while let Ok(entry) = rx.try_recv() {
                        report(write(&mut out, &entry));
                    }
                    report(out.flush());
                    return;
                }
                if rx.is_empty() {
                    report(out.flush());
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Entry {
        Entry {
            t: 0.0,
            api: "chat",
            model: None,
            group: Some(0xabc),
            prompt_units: 10,
            block_units: 128,
            chain: Box::new([]),
            instance: "http://127.0.0.1:1".into(),
            reason: "cold",
            attempt: 0,
            status: 200,
            outcome: "ok",
            ttft_s: Some(0.5),
            duration_s: 1.0,
            prompt_tokens: None,
            cached_tokens: None,
            output_tokens: None,
        }
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_and_close_writes_what_is_queued() {
        let dir = std::env::temp_dir().join(format!("pr-log-unit-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("a.jsonl");
        let _ = std::fs::remove_file(&path);
        let log = AccessLog::open(&path, 2).unwrap_or_else(|e| panic!("{e}"));
        for _ in 0..5 {
            log.log(entry());
        }
        assert_eq!(log.dropped.get(), 3, "two fit, three dropped, none waited");
        let writer = log.writer().unwrap_or_else(|| panic!("a writer"));
        assert!(log.writer().is_none(), "one writer");
        log.close();
        writer.await;
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(text.contains(r#""group":"0000000000000abc""#), "{text}");
        assert_eq!(log.written.get(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
