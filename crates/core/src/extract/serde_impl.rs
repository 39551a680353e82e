//! Key extraction with serde_json: one streaming pass over the body with visitors that borrow.
//!
//! The top-level object, `messages` and each message are visited as they stream by; the values
//! the canonical text needs (`role`, `content`, `tool_calls`, `prompt`, `model`, ...) are taken
//! as borrowed [`RawValue`]s (no copy, no unescaping) and handed to the shared canonical-text
//! builder, which unescapes only the characters it keeps. Everything else is skipped with
//! [`IgnoredAny`], which validates without allocating. Content-part arrays and tool-call arrays
//! are walked by a second, nested parse of their raw text.

use super::canon::{Api, Canon, JsonNode, MessageFields, TopField};
use super::{checked_body, with_scratch, ExtractError, KeyOptions, RequestInfo};
use crate::PrefixLength;
use serde::de::{DeserializeSeed, Deserializer as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;

/// `POST /v1/chat/completions` with serde_json; same contract as [`super::chat_request`].
pub fn chat_request(body: &[u8], len: PrefixLength) -> Result<RequestInfo, ExtractError> {
    extract(body, &KeyOptions::key_only(len), Api::Chat)
}

/// `POST /v1/completions` with serde_json; same contract as [`super::completion_request`].
pub fn completion_request(body: &[u8], len: PrefixLength) -> Result<RequestInfo, ExtractError> {
    extract(body, &KeyOptions::key_only(len), Api::Completion)
}

pub(crate) fn extract(
    body: &[u8],
    opts: &KeyOptions,
    api: Api,
) -> Result<RequestInfo, ExtractError> {
    // The `str` reader then borrows every string without re-checking.
    let text = checked_body(body)?;
    with_scratch(|scratch| {
        let mut st = State {
            canon: Canon::new(api, scratch, opts, body.len()),
            failure: None,
            context: None,
        };
        let mut de = serde_json::Deserializer::from_str(text);
        let r = (&mut de)
            .deserialize_map(Top { st: &mut st })
            .and_then(|()| de.end());
        if let Err(e) = r {
            return Err(st.error(e));
        }
        st.canon.finish()
    })
}

/// What the visitors share: the canonical text, the first typed error, and the typed error to
/// report if serde_json finds a value of the wrong JSON type where one is expected.
struct State<'b> {
    canon: Canon<'b>,
    failure: Option<ExtractError>,
    context: Option<ExtractError>,
}

impl State<'_> {
    fn fail<E: serde::de::Error>(&mut self, r: Result<(), ExtractError>) -> Result<(), E> {
        r.map_err(|e| {
            self.failure = Some(e);
            E::custom("typed extraction error")
        })
    }

    fn error(&mut self, e: serde_json::Error) -> ExtractError {
        if let Some(f) = self.failure.take() {
            return f;
        }
        match (e.classify(), self.context.take()) {
            (serde_json::error::Category::Data, Some(typed)) => typed,
            _ => ExtractError::Json(e.to_string()),
        }
    }
}

/// An object key, borrowed when it has no escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_str(V)
    }
}

struct Top<'a, 'b> {
    st: &'a mut State<'b>,
}

impl<'de> Visitor<'de> for Top<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let st = self.st;
        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
            let field = st.canon.top_field(&key);
            let r = st.canon.mark(field);
            st.fail(r)?;
            match field {
                TopField::Main if st.canon.api() == Api::Chat => {
                    st.context = Some(ExtractError::FieldType {
                        field: "messages",
                        expected: "an array of message objects",
                    });
                    map.next_value_seed(Messages { st: &mut *st })?;
                    st.context = None;
                }
                TopField::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
                _ => {
                    let raw: &'de RawValue = map.next_value()?;
                    let r = match field {
                        TopField::Main => st.canon.prompt(raw),
                        f => st.canon.scalar(f, raw.get()),
                    };
                    st.fail(r)?;
                }
            }
        }
        Ok(())
    }
}

struct Messages<'a, 'b> {
    st: &'a mut State<'b>,
}

impl<'de> DeserializeSeed<'de> for Messages<'_, '_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Messages<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of message objects")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        loop {
            self.st.context = Some(ExtractError::FieldType {
                field: "messages[]",
                expected: "an object",
            });
            if seq
                .next_element_seed(Message { st: &mut *self.st })?
                .is_none()
            {
                return Ok(());
            }
        }
    }
}

struct Message<'a, 'b> {
    st: &'a mut State<'b>,
}

impl<'de> DeserializeSeed<'de> for Message<'_, '_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Message<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a message object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut fields: MessageFields<&'de RawValue> = MessageFields::default();
        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
            if MessageFields::<&RawValue>::wants(&key) {
                let raw: &'de RawValue = map.next_value()?;
                let r = fields.set(&key, raw);
                self.st.fail(r)?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        let r = self.st.canon.message(fields);
        self.st.fail(r)
    }
}

impl<'x> JsonNode for &'x RawValue {
    fn raw(&self) -> &str {
        self.get()
    }

    fn for_each_element(
        &self,
        f: impl FnMut(Self) -> Result<(), ExtractError>,
    ) -> Result<(), ExtractError> {
        struct Elements<F> {
            f: F,
            failure: Option<ExtractError>,
        }
        impl<'de, F: FnMut(&'de RawValue) -> Result<(), ExtractError>> Visitor<'de> for &mut Elements<F> {
            type Value = ();
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
                while let Some(v) = seq.next_element::<&'de RawValue>()? {
                    if let Err(e) = (self.f)(v) {
                        self.failure = Some(e);
                        return Err(serde::de::Error::custom("typed extraction error"));
                    }
                }
                Ok(())
            }
        }
        let mut v = Elements { f, failure: None };
        let text: &'x str = RawValue::get(self);
        let mut de = serde_json::Deserializer::from_str(text);
        match de.deserialize_seq(&mut v) {
            Ok(()) => Ok(()),
            Err(e) => Err(v
                .failure
                .take()
                .unwrap_or_else(|| ExtractError::Json(e.to_string()))),
        }
    }

    fn for_each_entry(
        &self,
        f: impl FnMut(&str, Self) -> Result<(), ExtractError>,
    ) -> Result<(), ExtractError> {
        struct Entries<F> {
            f: F,
            failure: Option<ExtractError>,
        }
        impl<'de, F: FnMut(&str, &'de RawValue) -> Result<(), ExtractError>> Visitor<'de>
            for &mut Entries<F>
        {
            type Value = ();
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
                while let Some(Key(k)) = map.next_key::<Key<'de>>()? {
                    let v: &'de RawValue = map.next_value()?;
                    if let Err(e) = (self.f)(&k, v) {
                        self.failure = Some(e);
                        return Err(serde::de::Error::custom("typed extraction error"));
                    }
                }
                Ok(())
            }
        }
        let mut v = Entries { f, failure: None };
        let text: &'x str = RawValue::get(self);
        let mut de = serde_json::Deserializer::from_str(text);
        match de.deserialize_map(&mut v) {
            Ok(()) => Ok(()),
            Err(e) => Err(v
                .failure
                .take()
                .unwrap_or_else(|| ExtractError::Json(e.to_string()))),
        }
    }
}
