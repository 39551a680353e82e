//! The Responses API (`POST /v1/responses`, `GET /v1/responses/{id}`), as vLLM serves it: the
//! request's `instructions` and `input` items read as chat messages, its answers in the
//! `response` shape, streams as `response.*` events, and the responses it gives stored in the
//! process (`store`, true by default), so that `previous_response_id` continues one here and
//! is refused with a 404 anywhere else.
//!
//! As vLLM, a stream sends `response.created` and `response.in_progress` as soon as it takes the
//! request, before queueing and prefill; its first token comes with the events after them.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use bytes::Bytes;
use http::StatusCode;
use serde_json::{json, Map, Value};

use crate::api_error::ApiError;
use crate::request::text_parts;
use crate::response::Meta;
use crate::words::push_words;

/// Responses kept at most; the oldest is forgotten past it.
const STORED: usize = 4096;

/// One message of a conversation: role and text.
pub(crate) type Turn = (String, String);

/// The responses this engine gave and stored: each one's whole conversation, its answer last.
#[derive(Debug, Default)]
pub(crate) struct ResponseStore {
    inner: Mutex<Stored>,
}

/// The conversations by id, and the ids in the order they were stored (the oldest first).
type Stored = (HashMap<String, Vec<Turn>>, VecDeque<String>);

impl ResponseStore {
    /// Stores `conversation` (the prompt's messages and the answer) as response `id`.
    pub fn put(&self, id: &str, conversation: Vec<Turn>) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (by_id, order) = &mut *g;
        if by_id.insert(id.to_owned(), conversation).is_none() {
            order.push_back(id.to_owned());
        }
        while order.len() > STORED {
            if let Some(old) = order.pop_front() {
                by_id.remove(&old);
            }
        }
    }

    /// The conversation of response `id`, if stored here.
    pub fn get(&self, id: &str) -> Option<Vec<Turn>> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.0.get(id).cloned()
    }
}

/// vLLM's answer to a response it does not hold.
pub(crate) fn not_stored(id: &str) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!("Response with id '{id}' not found."),
        kind: "invalid_request_error",
        param: Some("previous_response_id".to_owned()),
        code: None,
    }
}

/// The messages of a Responses request, in vLLM's order (`_construct_input_messages` in
/// vllm/entrypoints/openai/serving_responses.py): `instructions` as a system message, then the
/// whole stored conversation it continues (`previous_response_id`), its own instructions
/// included, then `input`. (So instructions sent on every turn pile up in vLLM's prompt, and
/// each turn's prompt shares only its opening with the last one's.)
pub(crate) fn messages(
    obj: &Map<String, Value>,
    store: &ResponseStore,
    out: &mut Vec<Turn>,
) -> Result<(), ApiError> {
    match obj.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => out.push(("system".into(), s.clone())),
        Some(_) => {
            return Err(ApiError::invalid(
                "instructions",
                "`instructions` must be a string",
            ))
        }
    }
    match obj.get("previous_response_id") {
        None | Some(Value::Null) => {}
        Some(Value::String(id)) => {
            out.extend(store.get(id).ok_or_else(|| not_stored(id))?);
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "previous_response_id",
                "`previous_response_id` must be a string",
            ))
        }
    }
    match obj.get("input") {
        Some(Value::String(s)) => out.push(("user".into(), s.clone())),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                out.push(input_item(item, i)?);
            }
        }
        None | Some(Value::Null) => return Err(ApiError::invalid("input", "`input` is required")),
        Some(_) => {
            return Err(ApiError::invalid(
                "input",
                "`input` must be a string or an array of input items",
            ))
        }
    }
    Ok(())
}

/// One input item as a message: a message's role and text, a function call as the assistant's,
/// its output as the tool's.
fn input_item(item: &Value, i: usize) -> Result<Turn, ApiError> {
    let bad = |what: &str| ApiError::invalid(format!("input[{i}]"), what.to_owned());
    let Value::Object(o) = item else {
        return Err(bad("each input item must be an object"));
    };
    let text = |v: Option<&Value>, field: &str| -> Result<String, ApiError> {
        match v {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(Value::Array(parts)) => {
                text_parts(parts, &["input_text", "output_text", "text"], |_| {
                    ApiError::invalid(
                        format!("input[{i}].{field}"),
                        "only text parts are supported",
                    )
                })
            }
            Some(_) => Err(ApiError::invalid(
                format!("input[{i}].{field}"),
                format!("`{field}` must be a string or an array of text parts"),
            )),
        }
    };
    match o.get("type").and_then(Value::as_str) {
        None | Some("message") => {
            let role = match o.get("role").and_then(Value::as_str) {
                Some(r @ ("system" | "developer" | "user" | "assistant")) => r.to_owned(),
                _ => {
                    return Err(ApiError::invalid(
                        format!("input[{i}].role"),
                        "`role` must be one of system, developer, user, assistant",
                    ))
                }
            };
            Ok((role, text(o.get("content"), "content")?))
        }
        Some("function_call") => {
            let name = o.get("name").and_then(Value::as_str).unwrap_or_default();
            let args = o
                .get("arguments")
                .and_then(Value::as_str)
                .unwrap_or_default();
            Ok(("assistant".into(), format!("{name}({args})")))
        }
        Some("function_call_output") => Ok(("tool".into(), text(o.get("output"), "output")?)),
        Some(other) => Err(bad(&format!(
            "input items of type `{other}` are not supported"
        ))),
    }
}

/// The answer's text (the mock always generates exactly its output tokens).
pub(crate) fn answer_text(meta: &Meta, output_tokens: u32) -> String {
    let mut text = String::new();
    push_words(meta.seed, 0, output_tokens, &mut text);
    text
}

/// The id of the answer's one output message.
fn message_id(meta: &Meta) -> String {
    format!("msg_{}", meta.id.trim_start_matches("resp_"))
}

/// The `usage` object.
fn usage(meta: &Meta, output_tokens: u32, cached_tokens: Option<u32>) -> Value {
    json!({
        "input_tokens": meta.prompt_tokens,
        "input_tokens_details": { "cached_tokens": cached_tokens.unwrap_or(0) },
        "output_tokens": output_tokens,
        "output_tokens_details": { "reasoning_tokens": 0 },
        "total_tokens": u64::from(meta.prompt_tokens) + u64::from(output_tokens),
    })
}

/// The output message holding `text`.
fn message(meta: &Meta, text: &str, status: &str) -> Value {
    let content = if status == "completed" {
        json!([{ "type": "output_text", "text": text, "annotations": [] }])
    } else {
        json!([])
    };
    json!({
        "id": message_id(meta),
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    })
}

/// The `response` object: in progress (no output, no usage) or completed.
pub(crate) fn response(meta: &Meta, done: Option<(u32, Option<u32>)>) -> Value {
    let (status, output, usage) = match done {
        None => ("in_progress", json!([]), Value::Null),
        Some((n, cached)) => (
            "completed",
            json!([message(meta, &answer_text(meta, n), "completed")]),
            usage(meta, n, cached),
        ),
    };
    json!({
        "id": meta.id,
        "object": "response",
        "created_at": meta.created,
        "model": meta.model,
        "status": status,
        "output": output,
        "usage": usage,
    })
}

/// A stored response, for `GET /v1/responses/{id}`: its answer is the conversation's last
/// message.
pub(crate) fn stored(id: &str, conversation: &[Turn]) -> Value {
    let text = conversation.last().map_or("", |(_, t)| t.as_str());
    json!({
        "id": id,
        "object": "response",
        "status": "completed",
        "output": [{
            "id": format!("msg_{}", id.trim_start_matches("resp_")),
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{ "type": "output_text", "text": text, "annotations": [] }],
        }],
    })
}

/// One event: `event: <type>`, `data: <json>`, a blank line (as vLLM and OpenAI send them).
fn event(mut v: Value, sequence: &mut u32) -> Vec<u8> {
    let ty = v["type"].as_str().unwrap_or_default().to_owned();
    v["sequence_number"] = json!(*sequence);
    *sequence += 1;
    format!("event: {ty}\ndata: {v}\n\n").into_bytes()
}

/// What a stream sends before the first token: `response.created`, `response.in_progress`.
pub(crate) fn opening(meta: &Meta, sequence: &mut u32) -> Bytes {
    let r = response(meta, None);
    let mut out = event(
        json!({ "type": "response.created", "response": r }),
        sequence,
    );
    out.extend(event(
        json!({ "type": "response.in_progress", "response": r }),
        sequence,
    ));
    Bytes::from(out)
}

/// Tokens `from..to` of the answer, as `response.output_text.delta`; the first also opens the
/// output message (`response.output_item.added`, `response.content_part.added`).
pub(crate) fn delta(meta: &Meta, from: u32, to: u32, sequence: &mut u32) -> Bytes {
    let mut out = Vec::new();
    let item_id = message_id(meta);
    if from == 0 {
        out.extend(event(
            json!({
                "type": "response.output_item.added",
                "output_index": 0,
                "item": message(meta, "", "in_progress"),
            }),
            sequence,
        ));
        out.extend(event(
            json!({
                "type": "response.content_part.added",
                "item_id": item_id,
                "output_index": 0,
                "content_index": 0,
                "part": { "type": "output_text", "text": "", "annotations": [] },
            }),
            sequence,
        ));
    }
    let mut text = String::new();
    push_words(meta.seed, from, to, &mut text);
    out.extend(event(
        json!({
            "type": "response.output_text.delta",
            "item_id": item_id,
            "output_index": 0,
            "content_index": 0,
            "delta": text,
        }),
        sequence,
    ));
    Bytes::from(out)
}

/// The stream's end: the text, the part and the item done, then `response.completed` with the
/// usage.
pub(crate) fn closing(
    meta: &Meta,
    output_tokens: u32,
    cached_tokens: Option<u32>,
    sequence: &mut u32,
) -> Bytes {
    let text = answer_text(meta, output_tokens);
    let item_id = message_id(meta);
    let mut out = event(
        json!({
            "type": "response.output_text.done",
            "item_id": item_id,
            "output_index": 0,
            "content_index": 0,
            "text": text,
        }),
        sequence,
    );
    out.extend(event(
        json!({
            "type": "response.content_part.done",
            "item_id": item_id,
            "output_index": 0,
            "content_index": 0,
            "part": { "type": "output_text", "text": text, "annotations": [] },
        }),
        sequence,
    ));
    out.extend(event(
        json!({
            "type": "response.output_item.done",
            "output_index": 0,
            "item": message(meta, &text, "completed"),
        }),
        sequence,
    ));
    out.extend(event(
        json!({
            "type": "response.completed",
            "response": response(meta, Some((output_tokens, cached_tokens))),
        }),
        sequence,
    ));
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::ApiKind;

    fn meta() -> Meta {
        Meta {
            kind: ApiKind::Responses,
            id: "resp_01".into(),
            created: 1,
            model: "m".into(),
            prompt_tokens: 10,
            seed: 3,
            include_usage: false,
        }
    }

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(o) => o,
            _ => Map::new(),
        }
    }

    #[test]
    fn instructions_input_and_the_stored_conversation_are_the_messages() {
        let store = ResponseStore::default();
        store.put(
            "resp_a",
            vec![
                ("user".into(), "hi".into()),
                ("assistant".into(), "yo".into()),
            ],
        );
        let mut out = Vec::new();
        let body = json!({
            "previous_response_id": "resp_a",
            "instructions": "be brief",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "q"}]},
                {"type": "function_call", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c", "output": "42"},
            ],
        });
        messages(&obj(body), &store, &mut out).unwrap_or_else(|e| panic!("{e:?}"));
        let roles: Vec<&str> = out.iter().map(|(r, _)| r.as_str()).collect();
        assert_eq!(
            roles,
            ["system", "user", "assistant", "user", "assistant", "tool"]
        );
        assert_eq!(out[4].1, "f({})");
        // The stored conversation keeps its own instructions, after the new ones (as vLLM).
        store.put(
            "resp_b",
            vec![
                ("system".into(), "old".into()),
                ("user".into(), "hi".into()),
            ],
        );
        let mut again = Vec::new();
        let body = json!({"previous_response_id": "resp_b", "instructions": "new", "input": "q"});
        messages(&obj(body), &store, &mut again).unwrap_or_else(|e| panic!("{e:?}"));
        let texts: Vec<&str> = again.iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!(texts, ["new", "old", "hi", "q"]);
        let e = messages(
            &obj(json!({"previous_response_id": "resp_x", "input": "q"})),
            &store,
            &mut out,
        );
        assert_eq!(e.map_err(|e| e.status), Err(StatusCode::NOT_FOUND));
        let e = messages(
            &obj(json!({"input": [{"type": "reasoning"}]})),
            &store,
            &mut out,
        );
        assert_eq!(e.map_err(|e| e.param), Err(Some("input[0]".into())));
    }

    #[test]
    fn the_deltas_add_up_to_the_completed_text() {
        let m = meta();
        let mut seq = 0;
        let mut stream = opening(&m, &mut seq).to_vec();
        stream.extend_from_slice(&delta(&m, 0, 2, &mut seq));
        stream.extend_from_slice(&delta(&m, 2, 5, &mut seq));
        stream.extend_from_slice(&closing(&m, 5, Some(4), &mut seq));
        let text = String::from_utf8_lossy(&stream).into_owned();
        let datas: Vec<Value> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str(d).ok())
            .collect();
        assert_eq!(datas[0]["type"], "response.created");
        assert_eq!(datas[1]["type"], "response.in_progress");
        let joined: String = datas
            .iter()
            .filter(|d| d["type"] == "response.output_text.delta")
            .filter_map(|d| d["delta"].as_str())
            .collect();
        let last = &datas[datas.len() - 1];
        assert_eq!(last["type"], "response.completed");
        assert_eq!(
            last["response"]["output"][0]["content"][0]["text"],
            json!(joined)
        );
        assert_eq!(
            last["response"]["usage"]["input_tokens_details"]["cached_tokens"],
            4
        );
        let numbers: Vec<u64> = datas
            .iter()
            .filter_map(|d| d["sequence_number"].as_u64())
            .collect();
        assert_eq!(numbers, (0..datas.len() as u64).collect::<Vec<_>>());
        assert_eq!(
            response(&m, Some((5, Some(4))))["output"][0]["content"][0]["text"],
            json!(joined)
        );
    }
}
