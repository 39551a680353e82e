//! The canonical text of an OpenAI request, built identically by both JSON back ends.
//!
//! A back end hands this module raw JSON values ([`JsonNode`]: the value's exact text plus a way
//! to walk its elements or entries); everything that decides what text a request contributes,
//! which types are accepted and which error names which field lives here, so the serde_json and
//! sonic-rs extractors cannot drift apart.

use super::text::{decode_json_str, decode_owned, PrefixText};
use super::{
    ExtractError, RequestInfo, MESSAGE_END, PART_STAND_IN, PROMPT_SEPARATOR, ROLE_SEPARATOR,
    TOOL_CALL_START,
};
use super::{KeyOptions, Scratch};
use crate::chain::ChainBuilder;
use crate::{GroupId, KeyHash};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed of the hash that stands in for a non-text content part (xxh3-64 of the part's JSON text).
pub const PART_SEED: u64 = 0x7061_7274_2d73_6565; // "part-see"

const PROMPT_EXPECTED: &str =
    "a string, an array of strings, an array of token ids or an array of token-id arrays";

/// A raw JSON value as a back end sees it.
pub(crate) trait JsonNode: Sized {
    /// The value's exact JSON text (no surrounding whitespace).
    fn raw(&self) -> &str;
    /// Calls `f` on each element of this array value (the caller has checked it is one).
    fn for_each_element(
        &self,
        f: impl FnMut(Self) -> Result<(), ExtractError>,
    ) -> Result<(), ExtractError>;
    /// Calls `f` on each entry of this object value (the caller has checked it is one).
    fn for_each_entry(
        &self,
        f: impl FnMut(&str, Self) -> Result<(), ExtractError>,
    ) -> Result<(), ExtractError>;
}

/// JSON type of a raw value, read from its first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object,
}

pub(crate) fn kind(raw: &str) -> Kind {
    match raw.as_bytes().first() {
        Some(b'"') => Kind::String,
        Some(b'[') => Kind::Array,
        Some(b'{') => Kind::Object,
        Some(b'n') => Kind::Null,
        Some(b't' | b'f') => Kind::Bool,
        _ => Kind::Number,
    }
}

/// Which OpenAI API a body belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api {
    /// `/v1/chat/completions`: text from `messages`.
    Chat,
    /// `/v1/completions`: text from `prompt`.
    Completion,
    /// `/v1/responses`: text from `instructions`, then `input` (read by the router's own reader
    /// only, which takes both before building the text: see [`Canon::instructions`]).
    Responses,
}

impl Api {
    fn main_field(self) -> &'static str {
        match self {
            Api::Chat => "messages",
            Api::Completion => "prompt",
            Api::Responses => "input",
        }
    }
}

/// Top-level fields the extractor reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TopField {
    Main,
    Model,
    Stream,
    Group,
    /// The Responses API's `instructions`.
    Instructions,
    /// The Responses API's `previous_response_id`.
    PreviousResponse,
    /// The Responses API's `store`.
    Store,
    Other,
}

const SEEN_MAIN: u8 = 1;
const SEEN_MODEL: u8 = 2;
const SEEN_STREAM: u8 = 4;
const SEEN_GROUP: u8 = 8;
const SEEN_INSTRUCTIONS: u8 = 16;
const SEEN_PREVIOUS: u8 = 32;
const SEEN_STORE: u8 = 64;

/// Accumulates what the router needs from one body.
#[derive(Debug)]
pub(crate) struct Canon<'b> {
    api: Api,
    text: PrefixText<'b>,
    model: Option<String>,
    stream: bool,
    group: Option<String>,
    previous_response_id: Option<String>,
    /// The Responses API's `store` (`None` when absent or null: the engine stores).
    store: Option<bool>,
    seen: u8,
}

impl<'b> Canon<'b> {
    /// A body of `len` bytes, read for `opts`, in the thread's `scratch` buffers.
    pub(crate) fn new(api: Api, scratch: &'b mut Scratch, opts: &KeyOptions, len: usize) -> Self {
        let Scratch { key, pending } = scratch;
        let key_chars = opts.prefix_length.get();
        let text = match opts.chain {
            Some(spec) => {
                PrefixText::with_chain(key, key_chars, ChainBuilder::new(spec, len, pending))
            }
            None => PrefixText::new(key, key_chars),
        };
        Self {
            api,
            text,
            model: None,
            stream: false,
            group: None,
            previous_response_id: None,
            store: None,
            seen: 0,
        }
    }

    /// Which API the body belongs to.
    pub(crate) fn api(&self) -> Api {
        self.api
    }

    /// Classifies a top-level key.
    pub(crate) fn top_field(&self, key: &str) -> TopField {
        match key {
            "model" => TopField::Model,
            "stream" => TopField::Stream,
            "prompt_cache_key" => TopField::Group,
            "instructions" if self.api == Api::Responses => TopField::Instructions,
            "previous_response_id" if self.api == Api::Responses => TopField::PreviousResponse,
            "store" if self.api == Api::Responses => TopField::Store,
            k if k == self.api.main_field() => TopField::Main,
            _ => TopField::Other,
        }
    }

    /// Refuses a repeated top-level field (which copy would the engine use?).
    pub(crate) fn mark(&mut self, field: TopField) -> Result<(), ExtractError> {
        let (bit, name) = match field {
            TopField::Main => (SEEN_MAIN, self.api.main_field()),
            TopField::Model => (SEEN_MODEL, "model"),
            TopField::Stream => (SEEN_STREAM, "stream"),
            TopField::Group => (SEEN_GROUP, "prompt_cache_key"),
            TopField::Instructions => (SEEN_INSTRUCTIONS, "instructions"),
            TopField::PreviousResponse => (SEEN_PREVIOUS, "previous_response_id"),
            TopField::Store => (SEEN_STORE, "store"),
            TopField::Other => return Ok(()),
        };
        if self.seen & bit != 0 {
            return Err(duplicate(name));
        }
        self.seen |= bit;
        Ok(())
    }

    /// Handles one top-level entry (lazy back ends); `mark` is applied here.
    pub(crate) fn top_entry<N: JsonNode>(
        &mut self,
        key: &str,
        value: N,
    ) -> Result<(), ExtractError> {
        let field = self.top_field(key);
        self.mark(field)?;
        match field {
            TopField::Main => match self.api {
                Api::Chat => self.messages(value),
                Api::Completion => self.prompt(value),
                Api::Responses => Err(responses_elsewhere()),
            },
            f => self.scalar(f, value.raw()),
        }
    }

    /// A top-level field read whole from its raw value: every one but the text's own
    /// (`messages`, `prompt`, `input`, `instructions`), which each back end walks its own way.
    pub(crate) fn scalar(&mut self, field: TopField, raw: &str) -> Result<(), ExtractError> {
        match field {
            TopField::Model => self.model(raw),
            TopField::Stream => self.stream(raw),
            TopField::Group => self.group(raw),
            TopField::PreviousResponse => self.previous_response(raw),
            TopField::Store => self.store(raw),
            TopField::Other => Ok(()),
            TopField::Main | TopField::Instructions => Err(responses_elsewhere()),
        }
    }

    /// `model`: a string, or null (absent).
    pub(crate) fn model(&mut self, raw: &str) -> Result<(), ExtractError> {
        self.model = match kind(raw) {
            Kind::Null => None,
            Kind::String => Some(decode_owned(raw, "model")?),
            _ => {
                return Err(ExtractError::FieldType {
                    field: "model",
                    expected: "a string",
                })
            }
        };
        Ok(())
    }

    /// `stream`: a boolean, or null (false).
    pub(crate) fn stream(&mut self, raw: &str) -> Result<(), ExtractError> {
        self.stream = match raw {
            "true" => true,
            "false" | "null" => false,
            _ => {
                return Err(ExtractError::FieldType {
                    field: "stream",
                    expected: "a boolean",
                })
            }
        };
        Ok(())
    }

    /// `prompt_cache_key`: a routing group id (1-64 printable ASCII), or null (no group).
    pub(crate) fn group(&mut self, raw: &str) -> Result<(), ExtractError> {
        match kind(raw) {
            Kind::Null => self.group = None,
            Kind::String => {
                let mut id = String::new();
                let mut total = 0usize;
                decode_json_str(raw, "prompt_cache_key", |piece| {
                    total += piece.len();
                    if total <= GroupId::MAX_LEN {
                        id.push_str(piece);
                    }
                    true
                })?;
                if total > GroupId::MAX_LEN {
                    return Err(crate::GroupError::Length(total).into());
                }
                GroupId::parse(id.as_bytes())?;
                self.group = Some(id);
            }
            _ => {
                return Err(ExtractError::FieldType {
                    field: "prompt_cache_key",
                    expected: "a string",
                })
            }
        }
        Ok(())
    }

    /// `messages`: an array of message objects.
    pub(crate) fn messages<N: JsonNode>(&mut self, node: N) -> Result<(), ExtractError> {
        if kind(node.raw()) != Kind::Array {
            return Err(ExtractError::FieldType {
                field: "messages",
                expected: "an array of message objects",
            });
        }
        node.for_each_element(|m| self.message_node(m))
    }

    fn message_node<N: JsonNode>(&mut self, node: N) -> Result<(), ExtractError> {
        if kind(node.raw()) != Kind::Object {
            return Err(ExtractError::FieldType {
                field: "messages[]",
                expected: "an object",
            });
        }
        let mut fields = MessageFields::default();
        node.for_each_entry(|k, v| fields.set(k, v))?;
        self.message(fields)
    }

    /// Appends one message: role, separator, content, tool calls, terminator.
    pub(crate) fn message<N: JsonNode>(&mut self, m: MessageFields<N>) -> Result<(), ExtractError> {
        self.required_str(m.role, "messages[].role")?;
        self.text.push_char(ROLE_SEPARATOR);
        if let Some(content) = m.content {
            match kind(content.raw()) {
                Kind::Null => {}
                Kind::String => self
                    .text
                    .push_json_str(content.raw(), "messages[].content")?,
                Kind::Array => content.for_each_element(|part| self.part(part, &CHAT_PART))?,
                _ => {
                    return Err(ExtractError::FieldType {
                        field: "messages[].content",
                        expected: "a string, an array of content parts or null",
                    })
                }
            }
        }
        if let Some(calls) = m.tool_calls {
            match kind(calls.raw()) {
                Kind::Null => {}
                Kind::Array => calls.for_each_element(|c| self.tool_call(c))?,
                _ => {
                    return Err(ExtractError::FieldType {
                        field: "messages[].tool_calls",
                        expected: "an array or null",
                    })
                }
            }
        }
        self.text.push_char(MESSAGE_END);
        Ok(())
    }

    /// One content part: the `text` of a part whose `type` is one of `f.text_types`, any other
    /// part a stand-in.
    fn part<N: JsonNode>(&mut self, part: N, f: &PartFields) -> Result<(), ExtractError> {
        if kind(part.raw()) != Kind::Object {
            return Err(ExtractError::FieldType {
                field: f.part,
                expected: "an object",
            });
        }
        let mut ty: Option<N> = None;
        let mut text: Option<N> = None;
        part.for_each_entry(|k, v| {
            match k {
                "type" => set_once(&mut ty, v, f.ty)?,
                "text" => set_once(&mut text, v, f.text)?,
                _ => {}
            }
            Ok(())
        })?;
        let ty = ty.ok_or(ExtractError::Missing(f.ty))?;
        if kind(ty.raw()) != Kind::String {
            return Err(ExtractError::FieldType {
                field: f.ty,
                expected: "a string",
            });
        }
        let mut buf = [0u8; SHORT];
        let textual =
            decoded_in(ty.raw(), f.ty, &mut buf)?.is_some_and(|t| f.text_types.contains(&t));
        if textual {
            self.required_str(text, f.text)?;
        } else {
            self.stand_in(part.raw());
        }
        Ok(())
    }

    fn tool_call<N: JsonNode>(&mut self, call: N) -> Result<(), ExtractError> {
        if kind(call.raw()) != Kind::Object {
            return Err(ExtractError::FieldType {
                field: "messages[].tool_calls[]",
                expected: "an object",
            });
        }
        let mut function: Option<N> = None;
        call.for_each_entry(|k, v| {
            if k == "function" {
                set_once(&mut function, v, "messages[].tool_calls[].function")
            } else {
                Ok(())
            }
        })?;
        self.text.push_char(TOOL_CALL_START);
        let Some(function) = function else {
            return Ok(());
        };
        match kind(function.raw()) {
            Kind::Null => return Ok(()),
            Kind::Object => {}
            _ => {
                return Err(ExtractError::FieldType {
                    field: "messages[].tool_calls[].function",
                    expected: "an object",
                })
            }
        }
        let mut name: Option<N> = None;
        let mut args: Option<N> = None;
        function.for_each_entry(|k, v| match k {
            "name" => set_once(&mut name, v, "messages[].tool_calls[].function.name"),
            "arguments" => set_once(&mut args, v, "messages[].tool_calls[].function.arguments"),
            _ => Ok(()),
        })?;
        self.optional_str(name, "messages[].tool_calls[].function.name")?;
        self.text.push_char(ROLE_SEPARATOR);
        self.optional_str(args, "messages[].tool_calls[].function.arguments")
    }

    /// The Responses API's `instructions`: a string, or null (none). The engine renders them as
    /// a system message before `input`, whichever comes first in the body (the OpenAI Python SDK
    /// writes `input` first), so a back end reads both and hands `instructions` over first: a
    /// shared system prompt then opens every request's text.
    pub(crate) fn instructions(&mut self, raw: &str) -> Result<(), ExtractError> {
        match kind(raw) {
            Kind::Null => Ok(()),
            Kind::String => {
                self.text.push_str("system");
                self.text.push_char(ROLE_SEPARATOR);
                self.text.push_json_str(raw, "instructions")?;
                self.text.push_char(MESSAGE_END);
                Ok(())
            }
            _ => Err(ExtractError::FieldType {
                field: "instructions",
                expected: "a string",
            }),
        }
    }

    /// The Responses API's `previous_response_id`: a string, or null (none). Kept whole (the
    /// router sends the request where that response is stored); an id over 256 bytes is no id
    /// an engine gives, and is refused.
    pub(crate) fn previous_response(&mut self, raw: &str) -> Result<(), ExtractError> {
        const FIELD: &str = "previous_response_id";
        self.previous_response_id = match kind(raw) {
            Kind::Null => None,
            Kind::String => Some(short_str(raw, FIELD, 256)?.ok_or(ExtractError::FieldType {
                field: FIELD,
                expected: "a response id (at most 256 bytes)",
            })?),
            _ => {
                return Err(ExtractError::FieldType {
                    field: FIELD,
                    expected: "a string",
                })
            }
        };
        Ok(())
    }

    /// The Responses API's `store`: a boolean, or null (the engine's default, true).
    pub(crate) fn store(&mut self, raw: &str) -> Result<(), ExtractError> {
        self.store = match raw {
            "true" => Some(true),
            "false" => Some(false),
            "null" => None,
            _ => {
                return Err(ExtractError::FieldType {
                    field: "store",
                    expected: "a boolean",
                })
            }
        };
        Ok(())
    }

    /// The Responses API's `input`: a string (one user message), an array of input items, or
    /// null. Each item contributes as a chat message would: a message its role and content
    /// (text parts' text, other parts a stand-in as in chat); a `function_call` its name and
    /// arguments after [`TOOL_CALL_START`]; a `function_call_output` its output as a `tool`
    /// message; any other item (reasoning, references, built-in tools' calls) a stand-in hash
    /// of its JSON text; each followed by [`MESSAGE_END`].
    pub(crate) fn input<N: JsonNode>(&mut self, node: N) -> Result<(), ExtractError> {
        match kind(node.raw()) {
            Kind::Null => Ok(()),
            Kind::String => {
                self.text.push_str("user");
                self.text.push_char(ROLE_SEPARATOR);
                self.text.push_json_str(node.raw(), "input")?;
                self.text.push_char(MESSAGE_END);
                Ok(())
            }
            Kind::Array => node.for_each_element(|item| self.input_item(item)),
            _ => Err(ExtractError::FieldType {
                field: "input",
                expected: "a string or an array of input items",
            }),
        }
    }

    fn input_item<N: JsonNode>(&mut self, item: N) -> Result<(), ExtractError> {
        if kind(item.raw()) != Kind::Object {
            return Err(ExtractError::FieldType {
                field: "input[]",
                expected: "an object",
            });
        }
        let mut f = ItemFields::default();
        item.for_each_entry(|k, v| match k {
            "type" => set_once(&mut f.ty, v, "input[].type"),
            "role" => set_once(&mut f.role, v, "input[].role"),
            "content" => set_once(&mut f.content, v, "input[].content"),
            "name" => set_once(&mut f.name, v, "input[].name"),
            "arguments" => set_once(&mut f.arguments, v, "input[].arguments"),
            "output" => set_once(&mut f.output, v, "input[].output"),
            _ => Ok(()),
        })?;
        let mut buf = [0u8; SHORT];
        let ty = match &f.ty {
            None => None,
            // A type longer than any the text depends on is some other item.
            Some(t) if kind(t.raw()) == Kind::String => {
                Some(decoded_in(t.raw(), "input[].type", &mut buf)?.unwrap_or_default())
            }
            Some(_) => {
                return Err(ExtractError::FieldType {
                    field: "input[].type",
                    expected: "a string",
                })
            }
        };
        match ty {
            None | Some("message") => {
                self.required_str(f.role, "input[].role")?;
                self.text.push_char(ROLE_SEPARATOR);
                if let Some(c) = f.content {
                    self.item_content(c, "input[].content")?;
                }
            }
            Some("function_call") => {
                self.text.push_char(TOOL_CALL_START);
                self.optional_str(f.name, "input[].name")?;
                self.text.push_char(ROLE_SEPARATOR);
                self.optional_str(f.arguments, "input[].arguments")?;
            }
            Some("function_call_output") => {
                self.text.push_str("tool");
                self.text.push_char(ROLE_SEPARATOR);
                if let Some(o) = f.output {
                    self.item_content(o, "input[].output")?;
                }
            }
            _ => self.stand_in(item.raw()),
        }
        self.text.push_char(MESSAGE_END);
        Ok(())
    }

    /// A message's `content` or a tool call's `output`: a string, an array of content parts,
    /// or null. Parts of type `input_text`, `output_text` or `text` contribute their `text`;
    /// any other part a stand-in, as in chat.
    fn item_content<N: JsonNode>(
        &mut self,
        node: N,
        field: &'static str,
    ) -> Result<(), ExtractError> {
        match kind(node.raw()) {
            Kind::Null => Ok(()),
            Kind::String => self.text.push_json_str(node.raw(), field),
            Kind::Array => node.for_each_element(|part| self.part(part, &INPUT_PART)),
            _ => Err(ExtractError::FieldType {
                field,
                expected: "a string, an array of content parts or null",
            }),
        }
    }

    /// A string field that must be there (a message's role): its text.
    fn required_str<N: JsonNode>(
        &mut self,
        value: Option<N>,
        field: &'static str,
    ) -> Result<(), ExtractError> {
        let value = value.ok_or(ExtractError::Missing(field))?;
        if kind(value.raw()) != Kind::String {
            return Err(ExtractError::FieldType {
                field,
                expected: "a string",
            });
        }
        self.text.push_json_str(value.raw(), field)
    }

    /// A string field that may be absent or null.
    fn optional_str<N: JsonNode>(
        &mut self,
        value: Option<N>,
        field: &'static str,
    ) -> Result<(), ExtractError> {
        match value.as_ref().map(|v| kind(v.raw())) {
            None | Some(Kind::Null) => Ok(()),
            Some(Kind::String) => match &value {
                Some(v) => self.text.push_json_str(v.raw(), field),
                None => Ok(()),
            },
            Some(_) => Err(ExtractError::FieldType {
                field,
                expected: "a string",
            }),
        }
    }

    /// [`PART_STAND_IN`] and the hash of a value's JSON text, while the text still grows (hashed
    /// only then: a part's JSON may be long).
    fn stand_in(&mut self, raw: &str) {
        if !self.text.is_full() {
            let hash = xxh3_64_with_seed(raw.as_bytes(), PART_SEED);
            self.text.push_char(PART_STAND_IN);
            self.text.push_str(&format!("{hash:016x}"));
        }
    }

    /// `prompt`: a string, an array of strings, an array of token ids, or an array of such arrays.
    pub(crate) fn prompt<N: JsonNode>(&mut self, node: N) -> Result<(), ExtractError> {
        let wrong = || ExtractError::FieldType {
            field: "prompt",
            expected: PROMPT_EXPECTED,
        };
        match kind(node.raw()) {
            Kind::String => self.text.push_json_str(node.raw(), "prompt"),
            Kind::Array => {
                let mut mode: Option<Kind> = None;
                node.for_each_element(|el| {
                    let k = kind(el.raw());
                    match (mode, k) {
                        (None, Kind::String | Kind::Number | Kind::Array) => mode = Some(k),
                        (Some(m), _) if m == k => match k {
                            Kind::Number => self.text.push_char(' '),
                            _ => self.text.push_char(PROMPT_SEPARATOR),
                        },
                        _ => return Err(wrong()),
                    }
                    match k {
                        Kind::String => self.text.push_json_str(el.raw(), "prompt"),
                        Kind::Number => self.token(el.raw()),
                        _ => {
                            let mut first = true;
                            el.for_each_element(|t| {
                                if kind(t.raw()) != Kind::Number {
                                    return Err(wrong());
                                }
                                if !first {
                                    self.text.push_char(' ');
                                }
                                first = false;
                                self.token(t.raw())
                            })
                        }
                    }
                })
            }
            _ => Err(wrong()),
        }
    }

    fn token(&mut self, raw: &str) -> Result<(), ExtractError> {
        // sonic-rs's lazy raw text of a number in an array runs up to the next `,` or `]`, so it
        // may end in JSON whitespace (`[1 , 2 ]`); that whitespace is not part of the number.
        let raw = raw.trim_end_matches([' ', '\t', '\n', '\r']);
        // A token id is a non-negative integer that fits in u64; JSON forbids leading zeros, so
        // the raw digits are already the canonical decimal rendering.
        if raw.bytes().all(|b| b.is_ascii_digit()) && raw.parse::<u64>().is_ok() {
            self.text.push_str(raw);
            Ok(())
        } else {
            Err(ExtractError::FieldType {
                field: "prompt",
                expected: "token ids that are non-negative 64-bit integers",
            })
        }
    }

    /// The request info, or `Missing` when the main field never appeared.
    /// The key covers the first `opts.prefix_length` characters of the text; the chain (when
    /// asked for) covers what was read, up to its own bound.
    pub(crate) fn finish(mut self) -> Result<RequestInfo, ExtractError> {
        // A Responses request may have no `input` (its text is then its instructions, or a
        // stored conversation the engine holds).
        if self.seen & SEEN_MAIN == 0 && self.api != Api::Responses {
            return Err(ExtractError::Missing(self.api.main_field()));
        }
        let group = self.group.as_deref();
        let chain = self.text.take_chain();
        Ok(RequestInfo {
            key: KeyHash::new(group, self.text.as_str().as_bytes()),
            chain: chain.map(|c| c.finish(group)).unwrap_or_default(),
            model: self.model,
            stream: self.stream,
            previous_response_id: self.previous_response_id,
            stores_response: self.api == Api::Responses && self.store != Some(false),
        })
    }
}

/// The fields of one Responses input item the canonical text uses.
struct ItemFields<N> {
    ty: Option<N>,
    role: Option<N>,
    content: Option<N>,
    name: Option<N>,
    arguments: Option<N>,
    output: Option<N>,
}

impl<N> Default for ItemFields<N> {
    fn default() -> Self {
        Self {
            ty: None,
            role: None,
            content: None,
            name: None,
            arguments: None,
            output: None,
        }
    }
}

/// A raw JSON string decoded when it is at most `max` bytes long (a response id); `None` when
/// longer.
fn short_str(raw: &str, field: &'static str, max: usize) -> Result<Option<String>, ExtractError> {
    let mut out = String::new();
    let mut fits = true;
    decode_json_str(raw, field, |piece| {
        fits = out.len() + piece.len() <= max;
        if fits {
            out.push_str(piece);
        }
        fits
    })?;
    Ok(fits.then_some(out))
}

/// The lazy back ends read chat and completions bodies only (the Responses API's text is built
/// by [`super::scan_impl`], the router's reader).
fn responses_elsewhere() -> ExtractError {
    ExtractError::Json("the Responses API is read by the router's own reader only".into())
}

/// The fields of one message the canonical text uses, collected in any document order.
#[derive(Debug)]
pub(crate) struct MessageFields<N> {
    pub(crate) role: Option<N>,
    pub(crate) content: Option<N>,
    pub(crate) tool_calls: Option<N>,
}

impl<N> Default for MessageFields<N> {
    fn default() -> Self {
        Self {
            role: None,
            content: None,
            tool_calls: None,
        }
    }
}

impl<N> MessageFields<N> {
    /// Records `key: value` if the key is one the canonical text uses; a repeat is an error.
    pub(crate) fn set(&mut self, key: &str, value: N) -> Result<(), ExtractError> {
        match key {
            "role" => set_once(&mut self.role, value, "messages[].role"),
            "content" => set_once(&mut self.content, value, "messages[].content"),
            "tool_calls" => set_once(&mut self.tool_calls, value, "messages[].tool_calls"),
            _ => Ok(()),
        }
    }

    /// Whether `key` is one of the fields collected here.
    pub(crate) fn wants(key: &str) -> bool {
        matches!(key, "role" | "content" | "tool_calls")
    }
}

fn set_once<N>(slot: &mut Option<N>, value: N, field: &'static str) -> Result<(), ExtractError> {
    if slot.is_some() {
        return Err(duplicate(field));
    }
    *slot = Some(value);
    Ok(())
}

fn duplicate(field: &str) -> ExtractError {
    ExtractError::Json(format!("duplicate field '{field}'"))
}

/// The field names and text types of a content part: chat's (`text`) or a Responses input's.
struct PartFields {
    part: &'static str,
    ty: &'static str,
    text: &'static str,
    text_types: &'static [&'static str],
}

const CHAT_PART: PartFields = PartFields {
    part: "messages[].content[]",
    ty: "messages[].content[].type",
    text: "messages[].content[].text",
    text_types: &["text"],
};

const INPUT_PART: PartFields = PartFields {
    part: "input[].content[]",
    ty: "input[].content[].type",
    text: "input[].content[].text",
    text_types: &["input_text", "output_text", "text"],
};

/// Longest `type` the text depends on, decoded on the stack.
const SHORT: usize = 32;

/// A raw JSON string decoded into `buf` when it fits (a part's or an item's `type`); `None` when
/// longer (no type the text depends on is), without decoding the rest.
fn decoded_in<'a>(
    raw: &str,
    field: &'static str,
    buf: &'a mut [u8; SHORT],
) -> Result<Option<&'a str>, ExtractError> {
    let mut len = 0usize;
    let mut overflow = false;
    decode_json_str(raw, field, |piece| {
        let Some(dst) = buf.get_mut(len..len + piece.len()) else {
            overflow = true;
            return false;
        };
        dst.copy_from_slice(piece.as_bytes());
        len += piece.len();
        true
    })?;
    // Whole decoded pieces of valid UTF-8 (refused otherwise by decode_json_str).
    Ok((!overflow)
        .then(|| std::str::from_utf8(&buf[..len]).ok())
        .flatten())
}
