//! A name server on 127.0.0.1 (UDP) whose answers a test changes: it stands in for CoreDNS or
//! Consul when DNS discovery is tested. It serves one SRV name (every entry, with its address
//! as glue in the additional section) and, for A queries, each entry's host name and the SRV
//! name itself (every entry's address). Also included by the CLI's chaos test.

#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::rdata::{A, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};

/// One instance as DNS publishes it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Host name (relative to nothing: a full name, e.g. `e1.fleet.test.`).
    pub host: String,
    /// Its address.
    pub ip: Ipv4Addr,
    /// Its port (SRV).
    pub port: u16,
    /// Its SRV priority (0, the first choice, unless a test sets a backup).
    pub priority: u16,
    /// Its SRV weight (1 unless a test sets another).
    pub weight: u16,
}

impl Entry {
    /// An entry on 127.0.0.1.
    pub fn local(host: &str, port: u16) -> Entry {
        Entry {
            host: host.to_string(),
            ip: Ipv4Addr::LOCALHOST,
            port,
            priority: 0,
            weight: 1,
        }
    }
}

#[derive(Default)]
struct Zone {
    entries: Vec<Entry>,
    failing: bool,
}

/// The server; stops when dropped.
pub struct DnsServer {
    /// Where it listens.
    pub addr: SocketAddr,
    srv_name: Name,
    zone: Arc<Mutex<Zone>>,
    queries: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl DnsServer {
    /// Serves `srv_name` (e.g. `_http._tcp.fleet.test.`) with `entries`.
    pub fn start(srv_name: &str, entries: &[Entry]) -> DnsServer {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind dns: {e}"));
        let addr = socket.local_addr().unwrap_or_else(|e| panic!("{e}"));
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap_or_else(|e| panic!("{e}"));
        let srv_name = Name::from_ascii(srv_name).unwrap_or_else(|e| panic!("{srv_name}: {e}"));
        let zone = Arc::new(Mutex::new(Zone {
            entries: entries.to_vec(),
            failing: false,
        }));
        let (queries, stop) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let thread = {
            let (name, zone, queries, stop) = (
                srv_name.clone(),
                Arc::clone(&zone),
                Arc::clone(&queries),
                Arc::clone(&stop),
            );
            std::thread::spawn(move || serve(&socket, &name, &zone, &queries, &stop))
        };
        DnsServer {
            addr,
            srv_name,
            zone,
            queries,
            stop,
            thread: Some(thread),
        }
    }

    /// Publishes `entries` from now on.
    pub fn set(&self, entries: &[Entry]) {
        self.lock().entries = entries.to_vec();
    }

    /// While true, every query gets SERVFAIL.
    pub fn set_failing(&self, failing: bool) {
        self.lock().failing = failing;
    }

    /// Queries answered so far.
    pub fn queries(&self) -> usize {
        self.queries.load(Ordering::Relaxed)
    }

    /// The SRV name it serves.
    pub fn srv_name(&self) -> String {
        self.srv_name.to_ascii()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Zone> {
        self.zone.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn name(host: &str) -> Name {
    Name::from_ascii(host).unwrap_or_else(|e| panic!("{host}: {e}"))
}

fn serve(
    socket: &UdpSocket,
    srv_name: &Name,
    zone: &Mutex<Zone>,
    queries: &AtomicUsize,
    stop: &AtomicBool,
) {
    let mut buf = [0u8; 1500];
    while !stop.load(Ordering::Relaxed) {
        let Ok((n, peer)) = socket.recv_from(&mut buf) else {
            continue;
        };
        let Ok(query) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        let zone = zone.lock().unwrap_or_else(|p| p.into_inner());
        let answer = answer(&query, srv_name, &zone);
        drop(zone);
        if let Ok(bytes) = answer.to_vec() {
            let _ = socket.send_to(&bytes, peer);
            queries.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn answer(query: &Message, srv_name: &Name, zone: &Zone) -> Message {
    let id = query.metadata.id;
    let op = query.metadata.op_code;
    if zone.failing {
        let mut m = Message::error_msg(id, op, ResponseCode::ServFail);
        m.queries = query.queries.clone();
        return m;
    }
    let mut m = Message::response(id, op);
    m.metadata.authoritative = true;
    m.metadata.recursion_desired = query.metadata.recursion_desired;
    m.queries = query.queries.clone();
    let mut known = false;
    for q in &query.queries {
        let asked = q.name();
        let is_srv_name = asked.eq_case(srv_name) || asked == srv_name;
        // TTL 0: a resolver must not keep an answer past this query.
        match q.query_type() {
            RecordType::SRV if is_srv_name => {
                known = true;
                for e in &zone.entries {
                    let target = name(&e.host);
                    m.add_answer(Record::from_rdata(
                        asked.clone(),
                        0,
                        RData::SRV(SRV::new(e.priority, e.weight, e.port, target.clone())),
                    ));
                    m.add_additional(Record::from_rdata(target, 0, RData::A(A(e.ip))));
                }
            }
            RecordType::A => {
                for e in &zone.entries {
                    if is_srv_name || name(&e.host) == *asked {
                        known = true;
                        m.add_answer(Record::from_rdata(asked.clone(), 0, RData::A(A(e.ip))));
                    }
                }
            }
            _ => known |= is_srv_name || zone.entries.iter().any(|e| name(&e.host) == *asked),
        }
    }
    if !known {
        m.metadata.response_code = ResponseCode::NXDomain;
    }
    m
}
