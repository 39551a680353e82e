//! [`EventBatch`] → MessagePack, in either layout vLLM has published (see [`crate::decode`]).
//! The mock engine publishes with this, so the whole event path is tested over a real socket
//! against both layouts; the decoder's own tests build their payloads byte by byte instead.

use rmpv::Value;

use crate::event::{BlockStored, EngineHash, EventBatch, KvEvent};

/// The layout of a payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    /// Positional arrays tagged by type name, block hashes as unsigned integers (vLLM before
    /// mid-2026).
    Positional,
    /// Maps with a `"type"` key, block hashes as 8 big-endian bytes (newer vLLM sends bytes).
    #[default]
    Map,
}

impl Encoding {
    /// By name, as flags spell it.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "positional" | "array" => Some(Encoding::Positional),
            "map" => Some(Encoding::Map),
            _ => None,
        }
    }
    /// The name [`Encoding::parse`] takes.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Positional => "positional",
            Encoding::Map => "map",
        }
    }
    /// How a hash sent in this layout reads back: bytes are folded by the decoder.
    pub fn read_back(self, h: EngineHash) -> EngineHash {
        match self {
            Encoding::Positional => h,
            Encoding::Map => EngineHash::of_bytes(&h.0.to_be_bytes()),
        }
    }
}

/// Encodes one batch.
pub fn encode_batch(batch: &EventBatch, encoding: Encoding) -> Vec<u8> {
    let events = Value::Array(batch.events.iter().map(|e| event(e, encoding)).collect());
    let value = match encoding {
        Encoding::Positional => {
            let mut a = vec![Value::F64(batch.ts), events];
            if let Some(r) = batch.data_parallel_rank {
                a.push(Value::from(r));
            }
            Value::Array(a)
        }
        Encoding::Map => {
            let mut m = vec![
                (Value::from("ts"), Value::F64(batch.ts)),
                (Value::from("events"), events),
            ];
            if let Some(r) = batch.data_parallel_rank {
                m.push((Value::from("data_parallel_rank"), Value::from(r)));
            }
            Value::Map(m)
        }
    };
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &value).expect("writing to a Vec cannot fail");
    out
}

fn hash(h: EngineHash, encoding: Encoding) -> Value {
    match encoding {
        Encoding::Positional => Value::from(h.0),
        Encoding::Map => Value::Binary(h.0.to_be_bytes().to_vec()),
    }
}

fn hashes(hs: &[EngineHash], encoding: Encoding) -> Value {
    Value::Array(hs.iter().map(|h| hash(*h, encoding)).collect())
}

fn opt<T: Into<Value>>(v: Option<T>) -> Value {
    v.map_or(Value::Nil, Into::into)
}

/// Named fields, in declaration order; the positional layout keeps the order and drops the
/// names and the trailing defaults (`None`s at the end, as msgspec's `omit_defaults` does).
fn fields(tag: &'static str, named: Vec<(&'static str, Value, bool)>, encoding: Encoding) -> Value {
    match encoding {
        Encoding::Positional => {
            let keep = named
                .iter()
                .rposition(|(_, v, optional)| !*optional || !v.is_nil())
                .map_or(0, |p| p + 1);
            let mut a = vec![Value::from(tag)];
            a.extend(named.into_iter().take(keep).map(|(_, v, _)| v));
            Value::Array(a)
        }
        Encoding::Map => {
            let mut m = vec![(Value::from("type"), Value::from(tag))];
            m.extend(
                named
                    .into_iter()
                    .filter(|(_, v, optional)| !*optional || !v.is_nil())
                    .map(|(k, v, _)| (Value::from(k), v)),
            );
            Value::Map(m)
        }
    }
}

fn stored(s: &BlockStored, encoding: Encoding) -> Value {
    // (name, value, has a default): the fields without one are always written.
    let named = vec![
        ("block_hashes", hashes(&s.block_hashes, encoding), false),
        (
            "parent_block_hash",
            opt(s.parent.map(|h| hash(h, encoding))),
            false,
        ),
        (
            "token_ids",
            Value::Array(s.token_ids.iter().map(|&t| Value::from(t)).collect()),
            false,
        ),
        ("block_size", Value::from(s.block_size), false),
        ("lora_id", opt(s.lora_id), false),
        ("medium", Value::from(s.medium.name()), false),
        ("lora_name", opt(s.lora_name.clone()), false),
        (
            "extra_keys",
            if s.extra_keys {
                // One entry per block (at least one, so that it reads back), each a tuple of
                // keys (what a salt looks like).
                Value::Array(
                    (0..s.block_hashes.len().max(1))
                        .map(|_| Value::Array(vec![Value::from("salt")]))
                        .collect(),
                )
            } else if let Some(name) = &s.lora_name {
                // An adapter's blocks are hashed with its name as their extra key, and vLLM
                // lists it so.
                Value::Array(
                    (0..s.block_hashes.len().max(1))
                        .map(|_| Value::Array(vec![Value::from(name.as_str())]))
                        .collect(),
                )
            } else {
                Value::Nil
            },
            true,
        ),
        ("group_idx", opt(s.group_idx), true),
    ];
    fields("BlockStored", named, encoding)
}

fn event(e: &KvEvent, encoding: Encoding) -> Value {
    match e {
        KvEvent::Stored(s) => stored(s, encoding),
        KvEvent::Removed(r) => fields(
            "BlockRemoved",
            vec![
                ("block_hashes", hashes(&r.block_hashes, encoding), false),
                ("medium", Value::from(r.medium.name()), false),
                ("group_idx", opt(r.group_idx), true),
            ],
            encoding,
        ),
        KvEvent::Cleared => fields("AllBlocksCleared", Vec::new(), encoding),
    }
}
