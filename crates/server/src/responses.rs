//! Where the Responses API's stored responses live.
//!
//! An engine keeps the responses it gives (vLLM with `VLLM_ENABLE_RESPONSES_API_STORE=1`, the
//! default of `store`), in its own process: a request that continues one
//! (`previous_response_id`), or asks for it (`GET`/`DELETE /v1/responses/{id}`, `.../cancel`,
//! `.../input_items`), is answered only by the instance that gave it. Elsewhere the engine
//! answers 404, so behind N instances a router that does not know where each response lives
//! fails such a request N-1 times in N.
//!
//! The router learns it from the answers: the first `"id"` of a successful `POST /v1/responses`
//! answer (a JSON answer opens with it; a stream's first event, `response.created`, carries the
//! response, which opens with it) is recorded against the instance that answered, in
//! [`ResponseHomes`]. A request that names a known response goes to that instance while it can
//! take requests ([`prefix_router_core::Reason::StoredResponse`]); an unknown one (given before
//! this router started, or through another replica) is routed as any other.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use prefix_router_core::InstanceId;

/// Responses remembered at most: the oldest is forgotten past it. Each is a 64-bit hash of its
/// id and the instance's id (shared), about 40 bytes with the map's and the queue's overhead, so
/// about 10 MiB when full. At 1,000 stored responses a second, a response is remembered for
/// about 4 minutes; a conversation that waits longer between turns is routed as a new request.
pub const REMEMBERED: usize = 256 * 1024;

/// Response id → the instance that gave it, for the [`REMEMBERED`] most recent responses.
#[derive(Debug, Default)]
pub struct ResponseHomes {
    inner: Mutex<Homes>,
}

#[derive(Debug, Default)]
struct Homes {
    /// By the id's hash ([`key`]): two ids that share one are 1 in 2^64.
    by_id: HashMap<u64, InstanceId>,
    /// Hashes in the order they were recorded (the oldest first).
    order: VecDeque<u64>,
}

/// The map's key for response `id`.
fn key(id: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(id.as_bytes())
}

impl ResponseHomes {
    /// Remembers that `instance` gave response `id`.
    pub fn record(&self, id: &str, instance: &InstanceId) {
        let k = key(id);
        let mut h = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if h.by_id.insert(k, instance.clone()).is_some() {
            return; // the same id again: already in the order
        }
        h.order.push_back(k);
        while h.order.len() > REMEMBERED {
            if let Some(old) = h.order.pop_front() {
                h.by_id.remove(&old);
            }
        }
    }

    /// The instance that gave response `id`, if remembered.
    pub fn home(&self, id: &str) -> Option<InstanceId> {
        let h = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        h.by_id.get(&key(id)).cloned()
    }

    /// Responses remembered.
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_id
            .len()
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The response a request names in its path: `/v1/responses/{id}` and what is under it.
pub fn id_in_path(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1/responses/")?;
    let id = rest.split('/').next()?;
    (!id.is_empty()).then_some(id)
}

/// Bytes of an answer searched for its id, at most: the id opens the answer or its first event.
const SEARCHED: usize = 64 * 1024;

/// Longest id taken (vLLM's are `resp_` and 32 hex digits).
const MAX_ID: usize = 256;

/// Most whitespace read on either side of the colon after `"id"`: more is no answer an engine
/// writes, and reading on would keep a growing piece of the answer to search again.
const MAX_SPACE: usize = 16;

/// Finds the first `"id"` string value of an answer as it streams by (`"id":"resp_..."`,
/// whitespace allowed around the colon), keeping only what a value cut between two pieces
/// needs. Gives up after [`SEARCHED`] bytes, or at an `"id"` whose value is not a string of at
/// most [`MAX_ID`] printable ASCII characters.
#[derive(Debug, Default)]
pub struct IdScanner {
    /// The unread end of the previous pieces (a match cut between them), at most
    /// `MAX_ID + 32` bytes.
    carry: Vec<u8>,
    read: usize,
    done: bool,
}

impl IdScanner {
    /// Whether it stopped reading (found the id, or gave up).
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Reads the next piece; the id, once found (then nothing more is read).
    pub fn feed(&mut self, data: &[u8]) -> Option<String> {
        if self.done {
            return None;
        }
        self.read += data.len();
        let mut joined = std::mem::take(&mut self.carry);
        joined.extend_from_slice(data);
        match find_id(&joined) {
            Found::Id(id) => {
                self.done = true;
                return Some(id);
            }
            Found::No => self.done = true,
            Found::Cut(from) => self.carry = joined[from..].to_vec(),
            Found::Nothing => {
                // Keep what could be the start of a match: `"id"` and its value.
                let keep = joined.len().saturating_sub(MAX_ID + 32);
                self.carry = joined[keep..].to_vec();
            }
        }
        if self.read > SEARCHED {
            self.done = true;
        }
        None
    }
}

enum Found {
    Id(String),
    /// An `"id"` with another value: the answer's first id is no response id.
    No,
    /// An `"id"` whose value the data ends in: read again from here with more.
    Cut(usize),
    Nothing,
}

fn find_id(data: &[u8]) -> Found {
    let mut from = 0;
    while let Some(at) = memchr::memmem::find(&data[from..], b"\"id\"") {
        let start = from + at;
        let mut i = start + 4;
        let skip = |i: &mut usize| {
            let from = *i;
            while *i - from <= MAX_SPACE
                && data
                    .get(*i)
                    .is_some_and(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
            {
                *i += 1;
            }
            *i - from <= MAX_SPACE
        };
        if !skip(&mut i) {
            return Found::No;
        }
        match data.get(i) {
            None => return Found::Cut(start),
            Some(b':') => {}
            // `"id"` as a value (`["id", ...]`) or a string's end: not a key.
            Some(_) => {
                from = start + 1;
                continue;
            }
        }
        i += 1;
        if !skip(&mut i) {
            return Found::No;
        }
        match data.get(i) {
            None => return Found::Cut(start),
            Some(b'"') => {}
            Some(_) => return Found::No,
        }
        let value = &data[i + 1..];
        let len = value
            .iter()
            .take(MAX_ID + 1)
            .take_while(|&&b| b != b'"' && (0x21..0x7f).contains(&b) && b != b'\\')
            .count();
        return match value.get(len) {
            None if len <= MAX_ID => Found::Cut(start),
            Some(b'"') if len > 0 && len <= MAX_ID => {
                Found::Id(String::from_utf8_lossy(&value[..len]).into_owned())
            }
            _ => Found::No,
        };
    }
    Found::Nothing
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(answer: &[u8], step: usize) -> Option<String> {
        let mut s = IdScanner::default();
        answer.chunks(step).find_map(|piece| s.feed(piece))
    }

    #[test]
    fn the_first_id_is_found_however_the_answer_is_cut() {
        let json = br#"{"id": "resp_0a1b","object":"response","output":[{"id":"msg_2"}],"previous_response_id":"resp_9"}"#;
        let stream = b"event: response.created\ndata: {\"response\":{\"id\":\"resp_77\",\"output\":[]},\"type\":\"response.created\"}\n\n";
        for step in [1, 2, 5, 13, 1000] {
            assert_eq!(
                scan(json, step).as_deref(),
                Some("resp_0a1b"),
                "step {step}"
            );
            assert_eq!(
                scan(stream, step).as_deref(),
                Some("resp_77"),
                "step {step}"
            );
        }
    }

    #[test]
    fn no_id_or_an_odd_one_is_none() {
        for answer in [
            &br#"{"object":"response","previous_response_id":"resp_1"}"#[..],
            br#"{"id":17}"#,
            br#"{"id":"has space"}"#,
            br#"{"id":""}"#,
            br#"{"error":{"message":"x"}}"#,
        ] {
            assert_eq!(scan(answer, 3), None, "{}", String::from_utf8_lossy(answer));
        }
        let long = format!(r#"{{"id":"{}"}}"#, "r".repeat(MAX_ID + 1));
        assert_eq!(scan(long.as_bytes(), 7), None);
        // A flood of whitespace after `"id"` is no id (and is not kept to search again).
        let flood = format!("{{\"id\"{}:\"resp_1\"}}", " ".repeat(MAX_SPACE + 1));
        assert_eq!(scan(flood.as_bytes(), 1), None);
        let mut s = IdScanner::default();
        s.feed(b"{\"id\"");
        for _ in 0..100 {
            s.feed(&[b' '; 64]);
        }
        assert!(s.carry.len() <= MAX_ID + 32, "carry {}", s.carry.len());
        // Past the searched bytes nothing more is read.
        let late = format!("{}\"id\":\"resp_1\"", " ".repeat(SEARCHED + 8192));
        assert_eq!(scan(late.as_bytes(), 4096), None);
    }

    #[test]
    fn the_homes_keep_the_most_recent_responses() {
        let homes = ResponseHomes::default();
        let a = InstanceId("http://a".into());
        homes.record("resp_first", &a);
        for i in 0..REMEMBERED {
            homes.record(&format!("resp_{i}"), &a);
        }
        assert_eq!(homes.len(), REMEMBERED);
        assert_eq!(homes.home("resp_first"), None, "the oldest was forgotten");
        assert_eq!(homes.home(&format!("resp_{}", REMEMBERED - 1)), Some(a));
    }

    #[test]
    fn the_id_in_a_path() {
        assert_eq!(id_in_path("/v1/responses/resp_1"), Some("resp_1"));
        assert_eq!(id_in_path("/v1/responses/resp_1/cancel"), Some("resp_1"));
        assert_eq!(id_in_path("/v1/responses/"), None);
        assert_eq!(id_in_path("/v1/responses"), None);
        assert_eq!(id_in_path("/v1/chat/completions"), None);
    }
}
