//! Response JSON in OpenAI's shapes: `chat.completion`, `text_completion`, and their streaming
//! chunks (`chat.completion.chunk`; completions stream `text_completion` objects).

use bytes::Bytes;
use serde_json::{json, Value};

use crate::request::ApiKind;
use crate::words::push_words;

/// `finish_reason` of every answer: the mock always generates exactly `max_tokens` tokens.
const FINISH_REASON: &str = "length";

/// The SSE end marker.
pub(crate) const DONE: &[u8] = b"data: [DONE]\n\n";

/// What every response and chunk of one request shares.
#[derive(Debug, Clone)]
pub(crate) struct Meta {
    pub kind: ApiKind,
    /// `chatcmpl-…` or `cmpl-…`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    pub model: String,
    pub prompt_tokens: u32,
    /// Seed of the generated words.
    pub seed: u64,
    pub include_usage: bool,
}

impl Meta {
    /// The `usage` object, with `prompt_tokens_details.cached_tokens` as vLLM reports it when
    /// asked to (`--enable-prompt-tokens-details`); without a count (`None`), without the
    /// details, as vLLM's default does.
    pub fn usage(&self, completion_tokens: u32, cached_tokens: Option<u32>) -> Value {
        let mut u = json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": u64::from(self.prompt_tokens) + u64::from(completion_tokens),
        });
        if let Some(c) = cached_tokens {
            u["prompt_tokens_details"] = json!({ "cached_tokens": c });
        }
        u
    }

    /// The whole (non-streaming) response body.
    pub fn full(&self, completion_tokens: u32, cached_tokens: Option<u32>) -> Vec<u8> {
        if self.kind == ApiKind::Responses {
            let r = crate::responses::response(self, Some((completion_tokens, cached_tokens)));
            return r.to_string().into_bytes();
        }
        let mut text = String::new();
        push_words(self.seed, 0, completion_tokens, &mut text);
        let choice = match self.kind {
            ApiKind::Chat | ApiKind::Responses => json!({
                "index": 0,
                "message": { "role": "assistant", "content": text },
                "logprobs": null,
                "finish_reason": FINISH_REASON,
            }),
            ApiKind::Completion => json!({
                "index": 0,
                "text": text,
                "logprobs": null,
                "finish_reason": FINISH_REASON,
            }),
        };
        let v = json!({
            "id": self.id,
            "object": match self.kind {
                ApiKind::Chat | ApiKind::Responses => "chat.completion",
                ApiKind::Completion => "text_completion",
            },
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self.usage(completion_tokens, cached_tokens),
        });
        v.to_string().into_bytes()
    }

    /// One streaming chunk carrying tokens `from..to`; a chat stream's first chunk also
    /// carries the role; the chunk with the last token carries the finish reason. (A Responses
    /// stream's events are numbered: [`crate::stream::SseStream`] builds them.)
    pub fn chunk(&self, from: u32, to: u32, last: bool) -> Bytes {
        let mut text = String::new();
        push_words(self.seed, from, to, &mut text);
        let finish = if last { Some(FINISH_REASON) } else { None };
        let choice = match self.kind {
            ApiKind::Chat | ApiKind::Responses => {
                let delta = if from == 0 {
                    json!({ "role": "assistant", "content": text })
                } else {
                    json!({ "content": text })
                };
                json!({ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish })
            }
            ApiKind::Completion => {
                json!({ "index": 0, "text": text, "logprobs": null, "finish_reason": finish })
            }
        };
        let mut v = self.chunk_head(vec![choice]);
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        sse(&v)
    }

    /// The final usage chunk (`include_usage`): no choices, the whole request's usage.
    pub fn usage_chunk(&self, completion_tokens: u32, cached_tokens: Option<u32>) -> Bytes {
        let mut v = self.chunk_head(Vec::new());
        v["usage"] = self.usage(completion_tokens, cached_tokens);
        sse(&v)
    }

    fn chunk_head(&self, choices: Vec<Value>) -> Value {
        json!({
            "id": self.id,
            "object": match self.kind {
                ApiKind::Chat | ApiKind::Responses => "chat.completion.chunk",
                ApiKind::Completion => "text_completion",
            },
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }
}

/// One SSE event: `data: <json>` and a blank line.
fn sse(v: &Value) -> Bytes {
    let mut out = b"data: ".to_vec();
    out.extend_from_slice(v.to_string().as_bytes());
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(kind: ApiKind) -> Meta {
        Meta {
            kind,
            id: "chatcmpl-1".into(),
            created: 1,
            model: "m".into(),
            prompt_tokens: 10,
            seed: 3,
            include_usage: true,
        }
    }

    #[test]
    fn chat_chunks_carry_role_first_and_finish_last() {
        let m = meta(ApiKind::Chat);
        let c = m.chunk(0, 2, false);
        let v: Value = serde_json::from_slice(&c[6..]).unwrap();
        assert_eq!(v["object"], "chat.completion.chunk");
        assert_eq!(v["choices"][0]["delta"]["role"], "assistant");
        assert!(v["choices"][0]["finish_reason"].is_null());
        assert!(v["usage"].is_null() && v.get("usage").is_some());
        let v: Value = serde_json::from_slice(&m.chunk(2, 4, true)[6..]).unwrap();
        assert!(v["choices"][0]["delta"].get("role").is_none());
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        let v: Value = serde_json::from_slice(&m.usage_chunk(4, Some(8))[6..]).unwrap();
        assert_eq!(v["choices"].as_array().map(Vec::len), Some(0));
        assert_eq!(v["usage"]["total_tokens"], 14);
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 8);
    }

    #[test]
    fn full_text_equals_the_concatenated_deltas() {
        let m = meta(ApiKind::Completion);
        let full: Value = serde_json::from_slice(&m.full(5, Some(0))).unwrap();
        let mut joined = String::new();
        for (a, b) in [(0, 2), (2, 5)] {
            let v: Value = serde_json::from_slice(&m.chunk(a, b, b == 5)[6..]).unwrap();
            joined.push_str(v["choices"][0]["text"].as_str().unwrap());
        }
        assert_eq!(full["choices"][0]["text"].as_str().unwrap(), joined);
        assert_eq!(full["object"], "text_completion");
    }
}
