//! A request as workloads describe it: messages made of prefix-chained content segments.

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

impl Request {
    /// Prompt length in tokens (all segments of all messages).
    pub fn prompt_tokens(&self) -> u32 {
        todo!()
    }
    /// Chained hash of every full `block_tokens`-token block of the prompt, in order: equal
    /// hashes mean equal prompt content up to the end of that block.
    pub fn block_hashes(&self, block_tokens: u32) -> Vec<u64> {
        todo!("{block_tokens}")
    }
    /// The OpenAI chat-completions JSON body for this request (`model`, `messages`,
    /// `max_tokens`, `stream`, `prompt_cache_key` when grouped). With `max_chars`, message text
    /// stops after that many characters in total: enough for a routing key, much cheaper.
    pub fn chat_body(&self, stream: bool, max_chars: Option<usize>) -> String {
        todo!("{stream} {max_chars:?}")
    }
}
