//! A request as workloads describe it: messages made of prefix-chained content segments.
//!
//! Token model: a prompt is the concatenation of every message's segments, in order. Roles are
//! *not* tokens: a message adds no header tokens, so `prompt_tokens` and `block_hashes` count
//! segment tokens only, and [`Request::chat_body`] carries the role in the JSON `role` field and
//! only the rendered segment words in `content`. (Real engines add a few chat-template tokens per
//! message; leaving them out keeps one word = one token exact for the mock engine.)

use crate::ids::block_hash;
use crate::text::{render_segment, render_segment_bounded};

/// Who speaks a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// System prompt / instructions.
    System,
    /// The user.
    User,
    /// The model's earlier answer.
    Assistant,
}

/// A run of prompt tokens with one content id. Ids are prefix-chained: two segments with the same
/// id have the same tokens *and* everything before them in the prompt is the same. A request may
/// hold only the first `tokens` of a segment's content (a truncated last block).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Segment {
    /// Content id (prefix-chained).
    pub id: u64,
    /// Length in tokens (≥ 1).
    pub tokens: u32,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Message {
    /// Speaker.
    pub role: Role,
    /// Content, in order.
    pub segments: Vec<Segment>,
}

/// Most prompt tokens a request of a trace may have: 10 M, the longest context windows served.
pub const MAX_PROMPT_TOKENS: u32 = 10_000_000;

/// Most output tokens a request of a trace may ask for.
pub const MAX_OUTPUT_TOKENS: u32 = 1_000_000;

/// One request of a workload.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Request {
    /// Sequence number within the workload.
    pub id: u64,
    /// Arrival time in seconds from the start (open loop); closed-loop drivers ignore it.
    pub arrival_s: f64,
    /// Routing group (`prompt_cache_key`), if any.
    pub group: Option<String>,
    /// Model or adapter name, if the workload sets one.
    pub model: Option<String>,
    /// The prompt.
    pub messages: Vec<Message>,
    /// Tokens to generate.
    pub output_tokens: u32,
}

impl Role {
    /// The OpenAI role string.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

impl Message {
    /// A message of `role` with `segments`.
    pub fn new(role: Role, segments: Vec<Segment>) -> Self {
        Message { role, segments }
    }

    /// Tokens of this message (its segments' sum, saturating).
    pub fn tokens(&self) -> u32 {
        self.segments
            .iter()
            .fold(0u32, |a, s| a.saturating_add(s.tokens))
    }

    /// Appends this message's text (its segments rendered, joined by single spaces) to `out`.
    pub fn render(&self, out: &mut String) {
        let mut first = true;
        for seg in self.segments.iter().filter(|s| s.tokens > 0) {
            if !first {
                out.push(' ');
            }
            first = false;
            render_segment(seg.id, seg.tokens, out);
        }
    }

    /// Like [`Message::render`] but appends at most `max_chars` characters; returns how many.
    pub fn render_bounded(&self, out: &mut String, max_chars: usize) -> usize {
        let mut written = 0usize;
        let mut first = true;
        for seg in self.segments.iter().filter(|s| s.tokens > 0) {
            if written >= max_chars {
                break;
            }
            if !first {
                out.push(' ');
                written += 1;
                if written >= max_chars {
                    break;
                }
            }
            first = false;
            written += render_segment_bounded(seg.id, seg.tokens, out, max_chars - written);
        }
        written
    }
}

impl Request {
    /// The content it shares with other requests, named by the id of its next-to-last
    /// segment (ids are prefix-chained, so the id names everything up to it): the document or
    /// conversation it continues. `None` for a prompt of one segment.
    pub fn shared_prefix(&self) -> Option<u64> {
        let mut segments = self
            .messages
            .iter()
            .rev()
            .flat_map(|m| m.segments.iter().rev());
        segments.next()?;
        segments.next().map(|s| s.id)
    }

    /// Refuses a request no engine runs, before anything is allocated for its blocks: more than
    /// [`MAX_PROMPT_TOKENS`] prompt tokens or [`MAX_OUTPUT_TOKENS`] output tokens (a trace line
    /// with 4,294,967,295 tokens aborted `analyze` allocating 2 GB of block hashes).
    pub fn check_size(&self) -> Result<(), String> {
        let prompt = self
            .messages
            .iter()
            .fold(0u64, |a, m| a + u64::from(m.tokens()));
        if prompt > u64::from(MAX_PROMPT_TOKENS) {
            return Err(format!(
                "{prompt} prompt tokens: at most {MAX_PROMPT_TOKENS} (the longest context any engine serves)"
            ));
        }
        if self.output_tokens > MAX_OUTPUT_TOKENS {
            return Err(format!(
                "{} output tokens: at most {MAX_OUTPUT_TOKENS}",
                self.output_tokens
            ));
        }
        Ok(())
    }

    /// Prompt length in tokens (all segments of all messages; saturates at `u32::MAX`).
    pub fn prompt_tokens(&self) -> u32 {
        self.messages
            .iter()
            .fold(0u32, |a, m| a.saturating_add(m.tokens()))
    }

    /// Chained hash of every full `block_tokens`-token block of the prompt, in order: equal
    /// hashes mean equal prompt content up to the end of that block. A trailing partial block has
    /// no hash; `block_tokens == 0` gives none.
    ///
    /// The block ending at absolute position `p` is named by ([`block_hash`]) the id of the
    /// segment holding token `p - 1` and `p`: segment ids are prefix-chained, so that pair fixes
    /// the content up to `p`. Cost is O(segments + blocks), never per token.
    pub fn block_hashes(&self, block_tokens: u32) -> Vec<u64> {
        let mut out = Vec::new();
        self.block_hashes_into(block_tokens, &mut out);
        out
    }

    /// [`Request::block_hashes`] into a reused buffer (cleared first), for hot loops.
    pub fn block_hashes_into(&self, block_tokens: u32, out: &mut Vec<u64>) {
        out.clear();
        if block_tokens == 0 {
            return;
        }
        let block = u64::from(block_tokens);
        out.reserve((u64::from(self.prompt_tokens()) / block) as usize);
        let mut end_of_segment = 0u64;
        let mut next_end = block;
        for seg in self.messages.iter().flat_map(|m| m.segments.iter()) {
            end_of_segment += u64::from(seg.tokens);
            while next_end <= end_of_segment {
                out.push(block_hash(seg.id, next_end));
                next_end += block;
            }
        }
    }

    /// The prompt's text as [`Request::chat_body`] renders it: every message's content, in
    /// order, joined by newlines (for tests and tools; the body keeps messages separate).
    pub fn prompt_text(&self) -> String {
        let mut out = String::new();
        for (i, m) in self.messages.iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            m.render(&mut out);
        }
        out
    }

    /// The OpenAI chat-completions JSON body for this request (`model`, `messages`,
    /// `max_tokens`, `stream`, `prompt_cache_key` when grouped). With `max_chars`, message text
    /// stops after that many characters in total: enough for a routing key, much cheaper.
    ///
    /// `model` is the request's model or `"default"`. With `max_chars = Some(n)` the message
    /// contents hold the first `n` characters of the concatenated contents; the message where the
    /// budget runs out is the last one in the body. Roles and other fields are always present, so
    /// any routing key over at most `n` characters of text equals the full body's key.
    pub fn chat_body(&self, stream: bool, max_chars: Option<usize>) -> String {
        let mut out = String::with_capacity(match max_chars {
            Some(n) => n + 128,
            None => 128 + self.prompt_tokens() as usize * 5,
        });
        out.push_str("{\"model\":");
        push_json_string(&mut out, self.model.as_deref().unwrap_or("default"));
        out.push_str(",\"messages\":[");
        let mut budget = max_chars;
        for (i, m) in self.messages.iter().enumerate() {
            if budget == Some(0) {
                break;
            }
            if i > 0 {
                out.push(',');
            }
            out.push_str("{\"role\":\"");
            out.push_str(m.role.as_str());
            out.push_str("\",\"content\":\"");
            // Rendered words are lowercase ASCII and spaces: nothing needs escaping.
            match budget.as_mut() {
                Some(left) => *left -= m.render_bounded(&mut out, *left),
                None => m.render(&mut out),
            }
            out.push_str("\"}");
        }
        out.push_str("],\"max_tokens\":");
        out.push_str(&self.output_tokens.to_string());
        out.push_str(if stream {
            ",\"stream\":true"
        } else {
            ",\"stream\":false"
        });
        if let Some(g) = &self.group {
            out.push_str(",\"prompt_cache_key\":");
            push_json_string(&mut out, g);
        }
        out.push('}');
        out
    }
}

/// Appends `s` as a JSON string literal (quotes, backslash and control characters escaped).
pub(crate) fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn seg(id: u64, tokens: u32) -> Segment {
        Segment { id, tokens }
    }

    fn req(messages: Vec<Message>) -> Request {
        Request {
            id: 0,
            arrival_s: 0.0,
            group: None,
            model: None,
            messages,
            output_tokens: 7,
        }
    }

    #[test]
    fn the_shared_prefix_is_named_by_the_next_to_last_segment_across_messages() {
        let r = req(vec![
            Message::new(Role::System, vec![seg(1, 10), seg(2, 5)]),
            Message::new(Role::User, vec![seg(3, 7)]),
        ]);
        assert_eq!(r.shared_prefix(), Some(2));
        assert_eq!(
            req(vec![Message::new(Role::User, vec![seg(9, 3)])]).shared_prefix(),
            None
        );
        assert_eq!(req(Vec::new()).shared_prefix(), None);
    }

    #[test]
    fn prompt_tokens_sums_all_segments() {
        let r = req(vec![
            Message::new(Role::System, vec![seg(1, 10), seg(2, 5)]),
            Message::new(Role::User, vec![seg(3, 7)]),
        ]);
        assert_eq!(r.prompt_tokens(), 22);
        assert_eq!(r.block_hashes(4).len(), 5);
        assert_eq!(r.block_hashes(22).len(), 1);
        assert_eq!(r.block_hashes(23).len(), 0);
        assert!(r.block_hashes(0).is_empty());
    }

    #[test]
    fn block_hash_names_segment_holding_the_last_token() {
        let r = req(vec![Message::new(Role::User, vec![seg(1, 4), seg(2, 4)])]);
        assert_eq!(r.block_hashes(4), vec![block_hash(1, 4), block_hash(2, 8)]);
        assert_eq!(r.block_hashes(3), vec![block_hash(1, 3), block_hash(2, 6)]);
    }

    #[test]
    fn chat_body_shape() {
        let mut r = req(vec![
            Message::new(Role::System, vec![seg(1, 3)]),
            Message::new(Role::User, vec![seg(2, 2), seg(3, 2)]),
        ]);
        r.group = Some("ten\"ant".into());
        r.model = Some("m".into());
        let body = r.chat_body(true, None);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["model"], "m");
        assert_eq!(v["max_tokens"], 7);
        assert_eq!(v["stream"], true);
        assert_eq!(v["prompt_cache_key"], "ten\"ant");
        assert_eq!(v["messages"][0]["role"], "system");
        assert_eq!(v["messages"][1]["role"], "user");
        let user = v["messages"][1]["content"].as_str().unwrap();
        assert_eq!(user.split(' ').count(), 4);
        r.group = None;
        r.model = None;
        let v: serde_json::Value = serde_json::from_str(&r.chat_body(false, Some(0))).unwrap();
        assert_eq!(v["model"], "default");
        assert_eq!(v["stream"], false);
        assert!(v.get("prompt_cache_key").is_none());
        assert_eq!(v["messages"].as_array().unwrap().len(), 0);
    }

    #[test]
    fn escapes_control_characters() {
        let mut s = String::new();
        push_json_string(&mut s, "a\u{1}b\\\n");
        assert_eq!(serde_json::from_str::<String>(&s).unwrap(), "a\u{1}b\\\n");
    }

    fn arb_request() -> impl Strategy<Value = Request> {
        let message = (0usize..3, prop::collection::vec((0u64..6, 0u32..40), 0..4)).prop_map(
            |(role, segs)| {
                let role = [Role::System, Role::User, Role::Assistant][role];
                Message::new(role, segs.into_iter().map(|(id, t)| seg(id, t)).collect())
            },
        );
        prop::collection::vec(message, 0..4).prop_map(req)
    }

    fn contents(body: &str) -> Vec<String> {
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["content"].as_str().unwrap().to_string())
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn chat_body_text_equals_rendered_text(r in arb_request()) {
            let texts = contents(&r.chat_body(false, None));
            prop_assert_eq!(texts.join("\n"), r.prompt_text());
            let words: usize = texts.iter().map(|t| t.split_whitespace().count()).sum();
            prop_assert_eq!(words, r.prompt_tokens() as usize);
        }

        #[test]
        fn max_chars_bound_respected(r in arb_request(), max in 0usize..400) {
            let full = contents(&r.chat_body(false, None)).concat();
            let cut = contents(&r.chat_body(false, Some(max))).concat();
            prop_assert!(cut.len() <= max);
            prop_assert_eq!(cut.len(), full.len().min(max));
        }

        #[test]
        fn equal_prefixes_equal_hashes_then_diverge(
            shared in prop::collection::vec((any::<u64>(), 1u32..50), 1..5),
            a in prop::collection::vec((any::<u64>(), 1u32..50), 0..3),
            b in prop::collection::vec((any::<u64>(), 1u32..50), 1..3),
            block in 1u32..40,
        ) {
            let mk = |tail: &[(u64, u32)]| {
                // Chain ids the way generators do, so equal ids imply equal prefixes.
                let mut parent = 0u64;
                let segs = shared.iter().chain(tail).map(|&(salt, t)| {
                    parent = crate::ids::generator_id(parent, salt);
                    seg(parent, t)
                }).collect();
                req(vec![Message::new(Role::User, segs)])
            };
            let (ra, rb) = (mk(&a), mk(&b));
            let shared_tokens: u32 = shared.iter().map(|s| s.1).sum();
            let ha = ra.block_hashes(block);
            let hb = rb.block_hashes(block);
            let common = (shared_tokens / block) as usize;
            prop_assert_eq!(&ha[..common], &hb[..common]);
            // Divergent first tail salts give different chains from there on.
            if a.first().map(|x| x.0) != b.first().map(|x| x.0) {
                for (x, y) in ha[common..].iter().zip(&hb[common..]) {
                    prop_assert_ne!(x, y);
                }
            }
        }
    }
}
