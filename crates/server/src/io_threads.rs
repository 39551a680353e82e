//! Client connections served on threads of their own, one connection on one thread for its
//! whole life.
//!
//! On tokio's shared (work-stealing) runtime, the tasks of one request hop between its worker
//! threads: the client's socket wakes one worker, the upstream's another, and every hop is a
//! futex wake and a cold cache. bench/peers.sh measured it where it hurts most, one connection
//! at a time: a single worker cut the router's CPU per streamed request by about 30%, but then
//! a busy router used one core. Here each thread runs a single-threaded runtime, the listener
//! (on the shared runtime) hands each accepted connection to the thread with the fewest open
//! connections, and the connection, its requests and the upstream connections they use
//! ([`crate::pool`] keeps one idle list per thread) stay there. This is how HAProxy, nginx and
//! Envoy run their workers.
//!
//! Everything else (health checks, discovery, the admin API, the access log's writer) stays on
//! the shared runtime.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use futures_util::future::BoxFuture;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::error::ServerError;

/// What a thread does with a connection handed to it: the connection's whole service.
pub type Serve = Box<dyn FnOnce(TcpStream) -> BoxFuture<'static, ()> + Send>;

thread_local! {
    /// 1-based index of the I/O thread running here; 0 on every other thread.
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// Called first on every I/O thread (set once per process; for embedding and tests, such as
/// marking the threads whose allocations a test counts).
static ON_START: OnceLock<fn()> = OnceLock::new();

/// Sets the function each I/O thread calls when it starts. Returns false if one was set
/// already (the first stays).
pub fn on_thread_start(f: fn()) -> bool {
    ON_START.set(f).is_ok()
}

/// Which I/O thread runs the caller: 1..=n on I/O threads, 0 elsewhere. Per-thread state
/// (the upstream pool's idle lists) is indexed by it.
pub fn current() -> usize {
    INDEX.with(Cell::get)
}

/// How many threads `io_threads = auto` means: one per CPU the process may use.
pub fn auto() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

struct Thread {
    tx: mpsc::UnboundedSender<(std::net::TcpStream, Serve)>,
    /// Connections handed to this thread and not yet finished.
    open: Arc<AtomicUsize>,
}

/// The I/O threads. Dropping it closes their queues: each thread then stops, dropping the
/// connections it still serves (the accept loop drops it only once they finished or the
/// shutdown grace is over).
pub struct IoThreads {
    threads: Vec<Thread>,
    /// Where the search for the least busy thread starts (rotates, so ties spread).
    next: AtomicUsize,
}

impl std::fmt::Debug for IoThreads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoThreads")
            .field("threads", &self.threads.len())
            .finish()
    }
}

/// Decrements a thread's count of open connections when the connection's task ends, however
/// it ends (finished, failed, or dropped with the thread's runtime).
struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl IoThreads {
    /// Starts `n` threads (n ≥ 1), each with its own single-threaded runtime.
    pub fn start(n: usize) -> Result<Self, ServerError> {
        let mut threads = Vec::with_capacity(n);
        for i in 0..n.max(1) {
            let (tx, mut rx) = mpsc::unbounded_channel::<(std::net::TcpStream, Serve)>();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(ServerError::Runtime)?;
            std::thread::Builder::new()
                .name(format!("prefix-router-io-{}", i + 1))
                .spawn(move || {
                    INDEX.with(|c| c.set(i + 1));
                    if let Some(f) = ON_START.get() {
                        f();
                    }
                    runtime.block_on(async move {
                        while let Some((stream, serve)) = rx.recv().await {
                            // Registered with this thread's reactor: its readiness wakes this
                            // thread and no other.
                            match TcpStream::from_std(stream) {
                                Ok(stream) => {
                                    tokio::spawn(serve(stream));
                                }
                                Err(e) => {
                                    tracing::warn!(error = %e, "cannot register a connection");
                                }
                            }
                        }
                    });
                    // The queue closed: the listener is done. Connections still open here are
                    // dropped with the runtime (shutdown's grace is over).
                })
                .map_err(ServerError::Runtime)?;
            threads.push(Thread {
                tx,
                open: Arc::new(AtomicUsize::new(0)),
            });
        }
        Ok(IoThreads {
            threads,
            next: AtomicUsize::new(0),
        })
    }

    /// Number of threads.
    pub fn len(&self) -> usize {
        self.threads.len()
    }

    /// Always false: at least one thread runs.
    pub fn is_empty(&self) -> bool {
        self.threads.is_empty()
    }

    /// The thread with the fewest open connections, the search starting after the last pick.
    fn pick(&self) -> Option<&Thread> {
        let n = self.threads.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..n)
            .map(|k| &self.threads[(start + k) % n])
            .min_by_key(|t| t.open.load(Ordering::Relaxed))
    }

    /// Hands an accepted connection to the least busy thread, which runs `serve` on it. The
    /// connection is closed (dropped) if no thread can take it (they only stop at shutdown).
    pub fn hand(&self, stream: TcpStream, serve: Serve) {
        let Some(thread) = self.pick() else { return };
        let stream = match stream.into_std() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot hand a connection to an I/O thread");
                return;
            }
        };
        thread.open.fetch_add(1, Ordering::Relaxed);
        let open = Open(Arc::clone(&thread.open));
        let serve: Serve = Box::new(move |s| {
            Box::pin(async move {
                let _open = open;
                serve(s).await;
            })
        });
        if thread.tx.send((stream, serve)).is_err() {
            tracing::warn!("an I/O thread stopped; connection closed");
        }
    }

    /// Open connections per thread (for tests and the admin view).
    pub fn open(&self) -> Vec<usize> {
        self.threads
            .iter()
            .map(|t| t.open.load(Ordering::Relaxed))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Each connection is served on one I/O thread, connections spread over the threads, and
    /// a finished connection no longer counts.
    #[tokio::test]
    async fn connections_spread_over_threads_and_stay_on_one() {
        let threads = IoThreads::start(2).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut clients = Vec::new();
        for _ in 0..4 {
            let client = TcpStream::connect(addr).await.unwrap();
            let (server, _) = listener.accept().await.unwrap();
            threads.hand(
                server,
                Box::new(|mut s| {
                    Box::pin(async move {
                        let mut buf = [0u8; 1];
                        while s.read_exact(&mut buf).await.is_ok() {
                            // Answers with the index of the thread serving it, each time.
                            let at = u8::try_from(current()).unwrap_or(u8::MAX);
                            tokio::task::yield_now().await;
                            if s.write_all(&[at]).await.is_err() {
                                return;
                            }
                        }
                    })
                }),
            );
            clients.push(client);
        }
        let mut seen = Vec::new();
        for c in clients.iter_mut() {
            let mut first = None;
            for _ in 0..3 {
                c.write_all(b"x").await.unwrap();
                let mut at = [0u8; 1];
                c.read_exact(&mut at).await.unwrap();
                assert!(
                    at[0] == 1 || at[0] == 2,
                    "served off the I/O threads: {}",
                    at[0]
                );
                assert_eq!(
                    *first.get_or_insert(at[0]),
                    at[0],
                    "a connection moved thread"
                );
            }
            seen.push(first.unwrap());
        }
        seen.sort_unstable();
        assert_eq!(seen, vec![1, 1, 2, 2], "connections not spread evenly");
        assert_eq!(threads.open(), vec![2, 2]);
        clients.truncate(1);
        // The closed connections' tasks end and are no longer counted.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while threads.open().iter().sum::<usize>() != 1 {
            assert!(std::time::Instant::now() < deadline, "{:?}", threads.open());
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(current(), 0, "the test's own thread is no I/O thread");
    }
}
