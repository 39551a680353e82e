//! MessagePack payload → [`EventBatch`], for every layout vLLM has published.
//!
//! - **Positional** (vLLM before mid-2026, msgspec `array_like`): a batch is `[ts, events]` or
//!   `[ts, events, data_parallel_rank]`; an event is an array whose first element is its type
//!   name, then its fields in declaration order, trailing defaults left out:
//!   `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
//!   lora_name, extra_keys, group_idx, ...]`, `["BlockRemoved", block_hashes, medium,
//!   group_idx]`, `["AllBlocksCleared"]`.
//! - **Maps** (newer): a batch is `{"ts", "events", "data_parallel_rank"}`; an event is a map
//!   with its type name under `"type"` and its fields by name.
//!
//! Either way: block hashes may be `bytes`, int64 or uint64; fields left out take their
//! defaults; unknown fields are ignored; an event of an unknown type is skipped and counted
//! ([`EventBatch::unknown_events`]). Anything else (not MessagePack, a field of the wrong type)
//! is a [`DecodeError`]: the caller counts it and carries on; nothing here panics.

use rmpv::Value;

use crate::event::{BlockRemoved, BlockStored, EngineHash, EventBatch, KvEvent, Medium};

/// Nesting deeper than any event has (a batch, its events, an event, its lists, `extra_keys`'
/// tuples): a hostile payload cannot recurse the decoder into the ground.
const MAX_DEPTH: usize = 16;

/// Why a payload was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DecodeError {
    #[error("not MessagePack: {0}")]
    Msgpack(String),
    #[error("{0} bytes after the batch")]
    Trailing(usize),
    #[error("{what}: expected {expected}")]
    Shape {
        what: &'static str,
        expected: &'static str,
    },
}

fn shape(what: &'static str, expected: &'static str) -> DecodeError {
    DecodeError::Shape { what, expected }
}

/// Decodes one payload (the third frame of a published message, or the second of a replayed
/// one).
pub fn decode_batch(payload: &[u8]) -> Result<EventBatch, DecodeError> {
    let mut rd = payload;
    let value = rmpv::decode::read_value_with_max_depth(&mut rd, MAX_DEPTH)
        .map_err(|e| DecodeError::Msgpack(e.to_string()))?;
    if !rd.is_empty() {
        return Err(DecodeError::Trailing(rd.len()));
    }
    batch(&value)
}

fn batch(v: &Value) -> Result<EventBatch, DecodeError> {
    let (ts, events, rank) = match v {
        Value::Array(a) => (a.first(), a.get(1), a.get(2)),
        Value::Map(m) => (
            field(m, "ts"),
            field(m, "events"),
            field(m, "data_parallel_rank"),
        ),
        _ => return Err(shape("batch", "an array or a map")),
    };
    let mut out = EventBatch {
        ts: ts.map_or(Ok(0.0), |v| float(v, "ts"))?,
        data_parallel_rank: opt_int(rank, "data_parallel_rank")?,
        ..EventBatch::default()
    };
    let events = match events {
        None | Some(Value::Nil) => &[][..],
        Some(Value::Array(a)) => a.as_slice(),
        Some(_) => return Err(shape("events", "an array")),
    };
    out.events.reserve(events.len());
    for e in events {
        match event(e)? {
            Some(e) => out.events.push(e),
            None => out.unknown_events += 1,
        }
    }
    Ok(out)
}

/// The fields of one event, by position or by name.
enum Fields<'a> {
    Positional(&'a [Value]),
    Named(&'a [(Value, Value)]),
}

impl<'a> Fields<'a> {
    /// Field `name`, which is at `position` (counting after the tag) in the positional layout.
    fn get(&self, position: usize, name: &str) -> Option<&'a Value> {
        match self {
            Fields::Positional(a) => a.get(position),
            Fields::Named(m) => field(m, name),
        }
    }
}

/// One event; `None` for a type this decoder does not know.
fn event(v: &Value) -> Result<Option<KvEvent>, DecodeError> {
    let (tag, fields) = match v {
        Value::Array(a) => match a.split_first() {
            Some((Value::String(t), rest)) => (t.as_str(), Fields::Positional(rest)),
            _ => return Err(shape("event", "an array starting with its type name")),
        },
        Value::Map(m) => match field(m, "type") {
            Some(Value::String(t)) => (t.as_str(), Fields::Named(m.as_slice())),
            _ => return Err(shape("event", "a map with a string \"type\"")),
        },
        _ => return Err(shape("event", "an array or a map")),
    };
    let Some(tag) = tag else {
        return Err(shape("event type", "UTF-8"));
    };
    Ok(Some(match tag {
        "BlockStored" => {
            let lora_id = opt_int(fields.get(4, "lora_id"), "lora_id")?;
            let lora_name = opt_str(fields.get(6, "lora_name"), "lora_name")?.map(str::to_string);
            // `extra_keys`: one entry per block, nil for a block keyed by its tokens alone. An
            // entry that holds only the block's adapter (its name or number: vLLM keys a LoRA
            // request's blocks by it) adds nothing the adapter fields do not say.
            let more = |k: &Value| !adapter_only(k, lora_name.as_deref(), lora_id);
            let extra_keys = match fields.get(7, "extra_keys") {
                None | Some(Value::Nil) => false,
                Some(Value::Array(a)) => a.iter().any(more),
                Some(_) => true,
            };
            KvEvent::Stored(BlockStored {
                block_hashes: hashes(fields.get(0, "block_hashes"), "block_hashes")?,
                parent: opt_hash(fields.get(1, "parent_block_hash"), "parent_block_hash")?,
                token_ids: tokens(fields.get(2, "token_ids"))?,
                block_size: fields
                    .get(3, "block_size")
                    .map_or(Ok(0), |v| uint(v, "block_size"))?,
                lora_id,
                medium: Medium::parse(opt_str(fields.get(5, "medium"), "medium")?),
                lora_name,
                extra_keys,
                group_idx: opt_int(fields.get(8, "group_idx"), "group_idx")?,
            })
        }
        "BlockRemoved" => KvEvent::Removed(BlockRemoved {
            block_hashes: hashes(fields.get(0, "block_hashes"), "block_hashes")?,
            medium: Medium::parse(opt_str(fields.get(1, "medium"), "medium")?),
            group_idx: opt_int(fields.get(2, "group_idx"), "group_idx")?,
        }),
        "AllBlocksCleared" => KvEvent::Cleared,
        _ => return Ok(None),
    }))
}

fn field<'a>(m: &'a [(Value, Value)], name: &str) -> Option<&'a Value> {
    m.iter()
        .find(|(k, _)| k.as_str() == Some(name))
        .map(|(_, v)| v)
}

fn hash(v: &Value, what: &'static str) -> Result<EngineHash, DecodeError> {
    match v {
        Value::Binary(b) => Ok(EngineHash::of_bytes(b)),
        Value::Integer(i) => i
            .as_u64()
            .or_else(|| i.as_i64().map(|x| x as u64))
            .map(EngineHash)
            .ok_or(shape(what, "bytes or a 64-bit integer")),
        _ => Err(shape(what, "bytes or a 64-bit integer")),
    }
}

fn opt_hash(v: Option<&Value>, what: &'static str) -> Result<Option<EngineHash>, DecodeError> {
    match v {
        None | Some(Value::Nil) => Ok(None),
        Some(v) => hash(v, what).map(Some),
    }
}

fn hashes(v: Option<&Value>, what: &'static str) -> Result<Vec<EngineHash>, DecodeError> {
    match v {
        None | Some(Value::Nil) => Ok(Vec::new()),
        Some(Value::Array(a)) => a.iter().map(|h| hash(h, what)).collect(),
        Some(_) => Err(shape(what, "an array of block hashes")),
    }
}

fn tokens(v: Option<&Value>) -> Result<Vec<u32>, DecodeError> {
    match v {
        None | Some(Value::Nil) => Ok(Vec::new()),
        Some(Value::Array(a)) => a.iter().map(|t| uint(t, "token_ids")).collect(),
        Some(_) => Err(shape("token_ids", "an array of token ids")),
    }
}

fn uint(v: &Value, what: &'static str) -> Result<u32, DecodeError> {
    v.as_u64()
        .and_then(|x| u32::try_from(x).ok())
        .ok_or(shape(what, "an integer in 0..2^32"))
}

fn opt_int(v: Option<&Value>, what: &'static str) -> Result<Option<i64>, DecodeError> {
    match v {
        None | Some(Value::Nil) => Ok(None),
        Some(v) => v.as_i64().map(Some).ok_or(shape(what, "an integer or nil")),
    }
}

fn opt_str<'a>(v: Option<&'a Value>, what: &'static str) -> Result<Option<&'a str>, DecodeError> {
    match v {
        None | Some(Value::Nil) => Ok(None),
        Some(Value::String(s)) => s.as_str().map(Some).ok_or(shape(what, "UTF-8")),
        Some(_) => Err(shape(what, "a string or nil")),
    }
}

fn float(v: &Value, what: &'static str) -> Result<f64, DecodeError> {
    match v {
        Value::F64(x) => Ok(*x),
        Value::F32(x) => Ok(f64::from(*x)),
        Value::Integer(i) => i.as_f64().ok_or(shape(what, "a number")),
        _ => Err(shape(what, "a number")),
    }
}

/// Whether one block's `extra_keys` entry is nil or holds nothing but the block's adapter, by
/// `name` or `id`.
fn adapter_only(entry: &Value, name: Option<&str>, id: Option<i64>) -> bool {
    match entry {
        Value::Nil => true,
        Value::Array(keys) => keys.iter().all(|k| match k {
            Value::String(s) => s.as_str().is_some_and(|s| Some(s) == name),
            Value::Integer(i) => i.as_i64().is_some_and(|i| Some(i) == id),
            _ => false,
        }),
        _ => false,
    }
}
