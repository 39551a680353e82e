//! What an OpenAI request body gives the tokenizer: a chat's messages (role and text, the
//! text parts of one content joined by a newline) or a completion's prompt. Lenient where the
//! engine would refuse (the engine says why to the client; the router only needs the tokens
//! the engine would compute when it accepts the request).

use serde_json::Value;

use crate::{ChatTokenizer, Message, TokenizeError};

/// The texts of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// `(role, content)` of each message, in order.
    Chat(Vec<(String, String)>),
    /// A completion's prompt.
    Completion(String),
}

impl Prompt {
    /// From a request body: `messages` makes a chat, `prompt` (a string, or an array of one) a
    /// completion. `None` for anything else.
    pub fn from_body(body: &[u8]) -> Option<Self> {
        let v: Value = serde_json::from_slice(body).ok()?;
        Self::from_value(&v)
    }

    /// [`Self::from_body`], with the body's `model` (when it is a non-empty string), from one
    /// parse of the body: which model's tokenizer to use is read with the prompt.
    pub fn from_body_with_model(body: &[u8]) -> Option<(Option<String>, Self)> {
        let v: Value = serde_json::from_slice(body).ok()?;
        let prompt = Self::from_value(&v)?;
        let model = match v.get("model") {
            Some(Value::String(m)) if !m.is_empty() => Some(m.clone()),
            _ => None,
        };
        Some((model, prompt))
    }

    fn from_value(v: &Value) -> Option<Self> {
        if let Some(Value::Array(list)) = v.get("messages") {
            let mut out = Vec::with_capacity(list.len());
            for m in list {
                let role = m.get("role")?.as_str()?.to_string();
                let content = match m.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => parts
                        .iter()
                        .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
                        .filter_map(|p| p.get("text").and_then(Value::as_str))
                        .collect::<Vec<_>>()
                        .join("\n"),
                    Some(_) => return None,
                };
                out.push((role, content));
            }
            return Some(Prompt::Chat(out));
        }
        match v.get("prompt")? {
            Value::String(s) => Some(Prompt::Completion(s.clone())),
            Value::Array(a) => match a.as_slice() {
                [Value::String(s)] => Some(Prompt::Completion(s.clone())),
                _ => None,
            },
            _ => None,
        }
    }
}

impl ChatTokenizer {
    /// The token ids the engine computes for `prompt`.
    pub fn ids(&self, prompt: &Prompt) -> Result<Vec<u32>, TokenizeError> {
        match prompt {
            Prompt::Chat(messages) => {
                let m: Vec<Message<'_>> = messages
                    .iter()
                    .map(|(role, content)| Message { role, content })
                    .collect();
                self.chat_ids(&m)
            }
            Prompt::Completion(p) => self.prompt_ids(p),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chats_and_completions_from_bodies() {
        let chat = br#"{"model":"m","messages":[{"role":"system","content":"a"},
            {"role":"user","content":[{"type":"text","text":"b"},{"type":"image_url"},
            {"type":"text","text":"c"}]},{"role":"assistant","content":null}]}"#;
        assert_eq!(
            Prompt::from_body(chat),
            Some(Prompt::Chat(vec![
                ("system".into(), "a".into()),
                ("user".into(), "b\nc".into()),
                ("assistant".into(), String::new()),
            ]))
        );
        assert_eq!(
            Prompt::from_body(br#"{"prompt":["x y"]}"#),
            Some(Prompt::Completion("x y".into()))
        );
        for bad in [
            &b"{"[..],
            br#"{"prompt":[1]}"#,
            br#"{"messages":[{"content":"x"}]}"#,
            b"[]",
        ] {
            assert_eq!(
                Prompt::from_body(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn the_model_comes_with_the_prompt() {
        assert_eq!(
            Prompt::from_body_with_model(br#"{"model":"a","prompt":"x y"}"#),
            Some((Some("a".into()), Prompt::Completion("x y".into())))
        );
        let chat = br#"{"messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(
            Prompt::from_body_with_model(chat),
            Some((None, Prompt::Chat(vec![("user".into(), "hi".into())])))
        );
        // Not a name: as if none were given.
        for odd in [
            &br#"{"model":"","prompt":"x"}"#[..],
            br#"{"model":7,"prompt":"x"}"#,
        ] {
            assert_eq!(
                Prompt::from_body_with_model(odd),
                Some((None, Prompt::Completion("x".into())))
            );
        }
        // No prompt: nothing, whatever the model.
        assert_eq!(Prompt::from_body_with_model(br#"{"model":"a"}"#), None);
        assert_eq!(Prompt::from_body_with_model(b"{"), None);
    }
}
