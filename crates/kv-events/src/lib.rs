//! vLLM's KV-cache events, pure: no sockets, no clock.
//!
//! An engine started with `--kv-events-config '{"enable_kv_cache_events": true, "publisher":
//! "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "..."}'`
//! publishes every KV block it stores or evicts. This crate holds what both ends of that wire
//! share: the message layout ([`wire`]), the events ([`event`]), a decoder that takes every
//! encoding vLLM has used ([`decode`]), an encoder for both (the mock engine publishes with it,
//! [`encode`]), the sequence bookkeeping that notices lost messages ([`sequence`]), and one engine's cache as
//! its events describe it ([`view`]). The
//! sockets live with their users: the server subscribes, the mock engine publishes.

pub mod chain;
pub mod decode;
pub mod encode;
pub mod event;
pub mod sequence;
pub mod view;
pub mod wire;

pub use chain::{adapter_mix, token_block, token_chain};
pub use decode::{decode_batch, DecodeError};
pub use encode::{encode_batch, Encoding};
pub use event::{BlockRemoved, BlockStored, EngineHash, EventBatch, KvEvent, Medium};
pub use sequence::{Sequence, Step};
pub use view::{block_digest, Completeness, EngineView, HeldPrefix, DIGEST_MASK};
