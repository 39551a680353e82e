//! Support for tests that run this build's binary as real processes on 127.0.0.1: free ports,
//! a blocking HTTP/1.1 exchange, waiting for a condition, and mock engines that can be killed
//! and brought back on the same port.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The admin token the process tests configure.
pub const TOKEN: &str = "chaos-token";

pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind: {e}"));
    l.local_addr()
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A blocking HTTP/1.1 exchange on a fresh connection: (status, body).
pub fn http(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: chaos\r\nauthorization: Bearer {TOKEN}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    if s.write_all(req.as_bytes()).is_err() {
        return (0, String::new());
    }
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let status = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

pub fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One mock engine process on a fixed port (so it can come back where it was).
pub struct Engine {
    /// Its port.
    pub port: u16,
    child: Option<Child>,
}

impl Engine {
    pub fn start(port: u16) -> Engine {
        let mut e = Engine { port, child: None };
        e.spawn();
        e
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn spawn(&mut self) {
        let child = Command::new(env!("CARGO_BIN_EXE_prefix-router"))
            .args([
                "mock-engine",
                "--listen",
                &format!("127.0.0.1:{}", self.port),
            ])
            .args(["--preset", "small", "--time-scale", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start mock-engine: {e}"));
        self.child = Some(child);
        let port = self.port;
        wait_until("the engine to listen", Duration::from_secs(10), || {
            http(port, "GET", "/health", "").0 == 200
        });
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn child(&self) -> &Child {
        self.child
            .as_ref()
            .unwrap_or_else(|| panic!("engine {} is down", self.port))
    }
}

/// Sends `sig` to process `pid`; whether it was delivered.
pub fn signal_pid(pid: u32, sig: &str) -> bool {
    Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            // A stopped process does not die of SIGKILL until continued on some systems.
            signal_pid(c.id(), "CONT");
        }
        self.kill();
    }
}
