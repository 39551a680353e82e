//! A fake Kubernetes API server on 127.0.0.1 that serves EndpointSlices as the real one does:
//! lists with a `resourceVersion`, watches that stream JSON lines from a given version (events
//! missed while no watch was open are replayed, as the real server's history does), an ERROR
//! event with 410 Gone for a version too old. Tests script it: put and delete slices, break the
//! open watch, answer the next watch with 410 or the next few with 500, change the state
//! without telling any watch.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

#[derive(Default)]
struct Shared {
    objects: Mutex<BTreeMap<String, Value>>,
    /// Every change, as (resourceVersion, watch event line).
    history: Mutex<Vec<(u64, String)>>,
    rv: AtomicU64,
    lists: AtomicUsize,
    /// The `resourceVersion` each watch asked to start from.
    watches: Mutex<Vec<String>>,
    selectors: Mutex<Vec<String>>,
    open: Mutex<Option<mpsc::UnboundedSender<String>>>,
    gone_next: AtomicBool,
    /// Watches still to refuse with a 500 (the API server failing for a while).
    failing_watches: AtomicUsize,
}

/// The fake API server.
pub struct FakeApi {
    /// Its address.
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

/// An EndpointSlice of Service `llm` with one endpoint at 127.0.0.1 on `port` (named `http`;
/// a `metrics` port beside it).
pub fn slice(name: &str, port: u16, ready: bool, terminating: bool) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "labels": {"kubernetes.io/service-name": "llm", "model": "mock-llama"}
        },
        "addressType": "IPv4",
        "endpoints": [{
            "addresses": ["127.0.0.1"],
            "conditions": {"ready": ready, "serving": ready || terminating, "terminating": terminating}
        }],
        "ports": [
            {"name": "metrics", "port": 9000, "protocol": "TCP"},
            {"name": "http", "port": port, "protocol": "TCP"}
        ]
    })
}

impl FakeApi {
    /// Starts serving.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let shared = Arc::new(Shared {
            rv: AtomicU64::new(100),
            ..Shared::default()
        });
        let s = Arc::clone(&shared);
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let s = Arc::clone(&s);
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let s = Arc::clone(&s);
                        async move { Ok::<_, Infallible>(answer(&s, req)) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self { addr, shared }
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn record(&self, kind: &str, mut object: Value, store: Option<bool>) -> u64 {
        let rv = self.shared.rv.fetch_add(1, Ordering::SeqCst) + 1;
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        match store {
            Some(true) => {
                self.shared
                    .objects
                    .lock()
                    .expect("lock")
                    .insert(name, object.clone());
            }
            Some(false) => {
                self.shared.objects.lock().expect("lock").remove(&name);
            }
            None => {}
        }
        let line = json!({"type": kind, "object": object}).to_string();
        self.shared
            .history
            .lock()
            .expect("lock")
            .push((rv, line.clone()));
        if let Some(tx) = self.shared.open.lock().expect("lock").as_ref() {
            let _ = tx.send(line);
        }
        rv
    }

    /// Adds or replaces a slice (ADDED or MODIFIED to the open watch); returns its version.
    pub fn put(&self, slice: Value) -> u64 {
        let name = slice["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let known = self
            .shared
            .objects
            .lock()
            .expect("lock")
            .contains_key(&name);
        self.record(if known { "MODIFIED" } else { "ADDED" }, slice, Some(true))
    }

    /// Deletes a slice (DELETED to the open watch).
    pub fn delete(&self, name: &str) -> u64 {
        let object = self.shared.objects.lock().expect("lock").get(name).cloned();
        self.record("DELETED", object.expect("a known slice"), Some(false))
    }

    /// Changes the state without an event any watch will see (as if the history were
    /// compacted away): only a new list finds out.
    pub fn forget(&self, name: &str) {
        self.shared.objects.lock().expect("lock").remove(name);
        self.shared.rv.fetch_add(1, Ordering::SeqCst);
    }

    /// Ends the open watch stream (the API server restarting, a load balancer's timeout).
    pub fn break_watch(&self) {
        self.shared.open.lock().expect("lock").take();
    }

    /// The next watch gets an ERROR event with 410 Gone.
    pub fn gone_on_next_watch(&self) {
        self.shared.gone_next.store(true, Ordering::SeqCst);
    }

    /// The next `n` watches are refused with a 500 (the watcher reports an error for each and
    /// retries with backoff); the one after opens as any other.
    pub fn fail_watches(&self, n: usize) {
        self.shared.failing_watches.store(n, Ordering::SeqCst);
    }

    /// Lists served.
    pub fn lists(&self) -> usize {
        self.shared.lists.load(Ordering::SeqCst)
    }

    /// The version each watch started from, in order.
    pub fn watch_versions(&self) -> Vec<String> {
        self.shared.watches.lock().expect("lock").clone()
    }

    /// The label selectors asked for.
    pub fn selectors(&self) -> Vec<String> {
        self.shared.selectors.lock().expect("lock").clone()
    }
}

fn query(req: &Request<Incoming>) -> BTreeMap<String, String> {
    req.uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.replace("%2F", "/").replace("%3D", "=")))
        .collect()
}

fn full(status: StatusCode, v: Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(v.to_string())).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        "application/json".parse().expect("value"),
    );
    r
}

fn answer(s: &Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    if req.uri().path() != "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices" {
        return full(
            StatusCode::NOT_FOUND,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404, "reason": "NotFound"}),
        );
    }
    let q = query(&req);
    if let Some(sel) = q.get("labelSelector") {
        s.selectors.lock().expect("lock").push(sel.clone());
    }
    if q.get("watch").map(String::as_str) != Some("true") {
        s.lists.fetch_add(1, Ordering::SeqCst);
        let items: Vec<Value> = s.objects.lock().expect("lock").values().cloned().collect();
        let rv = s.rv.load(Ordering::SeqCst).to_string();
        return full(
            StatusCode::OK,
            json!({
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSliceList",
                "metadata": {"resourceVersion": rv},
                "items": items
            }),
        );
    }
    let from = q.get("resourceVersion").cloned().unwrap_or_default();
    s.watches.lock().expect("lock").push(from.clone());
    let refuse = s
        .failing_watches
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if refuse {
        return full(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500, "reason": "InternalError"}),
        );
    }
    let (tx, rx) = mpsc::unbounded_channel::<String>();
    if s.gone_next.swap(false, Ordering::SeqCst) {
        let _ = tx.send(
            json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {},
                "status": "Failure", "message": "too old resource version", "reason": "Expired", "code": 410}})
            .to_string(),
        );
        drop(tx);
    } else {
        let from: u64 = from.parse().unwrap_or(0);
        for (rv, line) in s.history.lock().expect("lock").iter() {
            if *rv > from {
                let _ = tx.send(line.clone());
            }
        }
        *s.open.lock().expect("lock") = Some(tx);
    }
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        let line = rx.recv().await?;
        Some((
            Ok::<_, Infallible>(Frame::data(Bytes::from(format!("{line}\n")))),
            rx,
        ))
    });
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        "application/json".parse().expect("value"),
    );
    r
}
