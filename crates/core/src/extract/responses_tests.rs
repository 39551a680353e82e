//! The Responses API's canonical text (`/v1/responses`, read by the router's own reader).

use super::*;
use crate::chain::ChainSpec;

const RS: char = ROLE_SEPARATOR;
const ME: char = MESSAGE_END;

fn opts() -> KeyOptions {
    KeyOptions::key_only(PrefixLength::new(65_536).unwrap_or_else(|e| panic!("{e}")))
}

fn route(body: &str) -> Result<RequestInfo, ExtractError> {
    responses_route(body.as_bytes(), &opts())
}

fn text_key(group: Option<&str>, text: &str) -> KeyHash {
    KeyHash::new(group, text.as_bytes())
}

/// The stand-in of a value whose JSON text is `raw`.
fn stand_in(raw: &str) -> String {
    let hash = xxhash_rust::xxh3::xxh3_64_with_seed(raw.as_bytes(), PART_SEED);
    format!("{PART_STAND_IN}{hash:016x}")
}

#[test]
fn instructions_open_the_text_whatever_the_order_of_the_fields() {
    let want = text_key(None, &format!("system{RS}Be brief.{ME}user{RS}hello{ME}"));
    // The OpenAI Python SDK writes `input` before `instructions`.
    for body in [
        r#"{"input":"hello","model":"m","instructions":"Be brief."}"#,
        r#"{"instructions":"Be brief.","input":"hello","model":"m"}"#,
        r#"{"instructions":"Be brief.","input":[{"role":"user","content":"hello"}]}"#,
        r#"{"instructions":"Be brief.","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"hel"},{"type":"input_text","text":"lo"}]}]}"#,
    ] {
        let info = route(body).unwrap_or_else(|e| panic!("{body}: {e}"));
        assert_eq!(info.key, want, "{body}");
    }
}

#[test]
fn every_kind_of_item_contributes() {
    let image = r#"{"type":"input_image","image_url":"data:image/png;base64,AAAA"}"#;
    let reasoning = r#"{"type":"reasoning","id":"rs_1","summary":[]}"#;
    let body = format!(
        r#"{{"model":"m","input":[
            {{"role":"developer","content":"Use tools."}},
            {{"type":"message","role":"user","content":[{{"type":"input_text","text":"Look:"}},{image}]}},
            {reasoning},
            {{"type":"function_call","call_id":"c1","name":"lookup","arguments":"{{\"q\":1}}"}},
            {{"type":"function_call_output","call_id":"c1","output":"found it"}},
            {{"type":"message","role":"assistant","content":[{{"type":"output_text","text":"Done.","annotations":[]}}]}}
        ]}}"#
    );
    let want = format!(
        "developer{RS}Use tools.{ME}user{RS}Look:{}{ME}{}{ME}{TOOL_CALL_START}lookup{RS}{{\"q\":1}}{ME}tool{RS}found it{ME}assistant{RS}Done.{ME}",
        stand_in(image),
        stand_in(reasoning)
    );
    let info = route(&body).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(info.key, text_key(None, &want));
    assert_eq!(info.model.as_deref(), Some("m"));
    assert!(!info.stream);
}

#[test]
fn stream_model_and_prompt_cache_key_are_read() {
    let info = route(r#"{"input":"x","stream":true,"prompt_cache_key":"t1","model":"m"}"#)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(info.stream);
    assert_eq!(info.model.as_deref(), Some("m"));
    assert_eq!(info.key, text_key(Some("t1"), &format!("user{RS}x{ME}")));
}

#[test]
fn a_request_without_input_is_routed_on_its_instructions() {
    let info = route(r#"{"instructions":"sys","previous_response_id":"resp_1"}"#)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(info.key, text_key(None, &format!("system{RS}sys{ME}")));
    assert!(route("{}").is_ok());
}

#[test]
fn the_previous_response_is_read_whole() {
    let info = route(r#"{"previous_response_id":"resp_\u0061bc","input":"next"}"#)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(info.previous_response_id.as_deref(), Some("resp_abc"));
    let none =
        route(r#"{"previous_response_id":null,"input":"x"}"#).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(none.previous_response_id, None);
    for bad in [
        r#"{"previous_response_id":7}"#.to_string(),
        format!(r#"{{"previous_response_id":"{}"}}"#, "r".repeat(257)),
    ] {
        assert!(
            matches!(
                route(&bad),
                Err(ExtractError::FieldType {
                    field: "previous_response_id",
                    ..
                })
            ),
            "{bad}"
        );
    }
    // Stored unless `store` says false.
    let stored = |body: &str| {
        route(body)
            .map(|i| i.stores_response)
            .unwrap_or_else(|e| panic!("{e}"))
    };
    assert!(stored(r#"{"input":"x"}"#) && stored(r#"{"input":"x","store":null}"#));
    assert!(!stored(r#"{"input":"x","store":false}"#));
    assert!(matches!(
        route(r#"{"store":1}"#),
        Err(ExtractError::FieldType { field: "store", .. })
    ));
    // Chat has no such field: a chat body's is ignored.
    let chat = chat_route(
        br#"{"messages":[],"previous_response_id":"resp_1"}"#,
        &opts(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(chat.previous_response_id, None);
    assert!(!chat.stores_response);
}

#[test]
fn bad_input_names_the_field() {
    let field = |body: &str| match route(body) {
        Err(ExtractError::FieldType { field, .. }) => field.to_string(),
        Err(ExtractError::Missing(field)) => format!("missing {field}"),
        Err(ExtractError::Json(m)) => format!("json {m}"),
        other => format!("{other:?}"),
    };
    assert_eq!(field(r#"{"input":3}"#), "input");
    assert_eq!(field(r#"{"input":[3]}"#), "input[]");
    assert_eq!(
        field(r#"{"input":[{"content":"x"}]}"#),
        "missing input[].role"
    );
    assert_eq!(field(r#"{"input":[{"role":1}]}"#), "input[].role");
    assert_eq!(
        field(r#"{"input":[{"type":2,"role":"user"}]}"#),
        "input[].type"
    );
    assert_eq!(
        field(r#"{"input":[{"role":"user","content":[{"text":"x"}]}]}"#),
        "missing input[].content[].type"
    );
    assert_eq!(
        field(r#"{"input":[{"role":"user","content":[{"type":"input_text","text":5}]}]}"#),
        "input[].content[].text"
    );
    assert_eq!(
        field(r#"{"input":[{"type":"function_call","name":7}]}"#),
        "input[].name"
    );
    assert_eq!(field(r#"{"input":"x","instructions":[]}"#), "instructions");
    assert_eq!(
        field(r#"{"input":"x","input":"y"}"#),
        "json duplicate field 'input'"
    );
    assert_eq!(field(r#"{"input":"x","stream":"yes"}"#), "stream");
    assert!(field(r#"{"input":"x""#).starts_with("json"));
}

/// A shared system prompt gives two requests the same first blocks, whichever their inputs.
#[test]
fn shared_instructions_share_the_chain() {
    let system = "policy ".repeat(200);
    let chain = |input: &str| {
        let body = serde_json::json!({"input": input, "instructions": system}).to_string();
        let o = KeyOptions {
            chain: Some(ChainSpec::DEFAULT),
            ..opts()
        };
        responses_route(body.as_bytes(), &o)
            .unwrap_or_else(|e| panic!("{e}"))
            .chain
    };
    let (a, b) = (chain(&"alpha ".repeat(100)), chain(&"beta ".repeat(100)));
    let shared = (system.len() + "system".len()) / ChainSpec::DEFAULT_BLOCK_UNITS as usize;
    assert!(shared >= 10);
    assert_eq!(a.blocks[..shared], b.blocks[..shared]);
    assert_ne!(a.blocks[shared + 1..], b.blocks[shared + 1..]);
    assert_eq!(
        a.units as usize,
        "system".len() + system.len() + 2 + "user".len() + 600 + 2
    );
}

mod props {
    use super::*;
    use proptest::prelude::*;

    /// One input item, as JSON.
    fn item() -> impl Strategy<Value = serde_json::Value> {
        let text = "[a-z \\u{e9}\\u{1F}\"\\\\]{0,12}";
        prop_oneof![
            (prop::sample::select(vec!["user", "assistant", "developer"]), text)
                .prop_map(|(r, t)| serde_json::json!({"role": r, "content": t})),
            (text, text).prop_map(|(a, b)| serde_json::json!({"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": a}, {"type": "input_image", "image_url": b}]})),
            (text, text).prop_map(|(n, a)| serde_json::json!({"type": "function_call", "call_id": "c", "name": n, "arguments": a})),
            text.prop_map(|o| serde_json::json!({"type": "function_call_output", "call_id": "c", "output": o})),
            text.prop_map(|s| serde_json::json!({"type": "reasoning", "summary": [s]})),
        ]
    }

    proptest! {
        /// Valid bodies are read, and the same whichever of `instructions` and `input` comes
        /// first; a longer input (an item appended) keeps the shorter one's chain as a prefix.
        #[test]
        fn field_order_does_not_matter_and_a_longer_input_extends_the_chain(
            instructions in proptest::option::of("[a-z ]{0,300}"),
            items in prop::collection::vec(item(), 0..6),
            extra in item(),
        ) {
            let o = KeyOptions { chain: Some(ChainSpec { block_units: 8, max_units: 1 << 16 }), ..opts() };
            let body = |items: &[serde_json::Value], instructions_first: bool| {
                let (i, n) = (
                    format!("\"instructions\":{}", serde_json::json!(instructions)),
                    format!("\"input\":{}", serde_json::json!(items)),
                );
                if instructions_first { format!("{{{i},{n}}}") } else { format!("{{{n},{i}}}") }
            };
            let a = responses_route(body(&items, true).as_bytes(), &o);
            let b = responses_route(body(&items, false).as_bytes(), &o);
            prop_assert!(a.is_ok(), "{a:?}");
            prop_assert_eq!(&a, &b);
            let mut longer = items.clone();
            longer.push(extra);
            let c = responses_route(body(&longer, true).as_bytes(), &o);
            let (Ok(a), Ok(c)) = (a, c) else { return Err(TestCaseError::fail("not read")) };
            prop_assert!(c.chain.blocks.starts_with(&a.chain.blocks));
        }

        /// Arbitrary bytes never panic.
        #[test]
        fn arbitrary_bodies_do_not_panic(body in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = responses_route(&body, &opts());
        }
    }
}
