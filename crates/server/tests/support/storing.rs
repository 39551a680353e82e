//! An engine stand-in that stores the Responses API's responses, as vLLM does.

use super::{raw_engine, read_request};

/// An engine that stores the responses it gives: `POST /v1/responses` answers with a new id (as
/// JSON, or as a stream whose `response.created` event carries it) and usage
/// (`input_tokens` 100, `cached_tokens` 90), and 404s a `previous_response_id` it did not give;
/// `GET`/`DELETE /v1/responses/{id}` and what is under it 404 an id it does not hold. A request
/// whose body holds `FAIL` is answered 503. One request per connection.
pub async fn storing_engine(name: &'static str) -> String {
    let store = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    raw_engine(move |mut s| {
        let store = std::sync::Arc::clone(&store);
        async move {
            use tokio::io::AsyncWriteExt;
            let Some((head, raw_body)) = read_request(&mut s, &mut Vec::new()).await else {
                return;
            };
            let raw_body = String::from_utf8_lossy(&raw_body).into_owned();
            let body: serde_json::Value = serde_json::from_str(&raw_body).unwrap_or_default();
            let mut words = head.split_whitespace();
            let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
            let held = |id: &str| {
                store
                    .lock()
                    .map(|s| s.iter().any(|x| x == id))
                    .unwrap_or(false)
            };
            let not_found = r#"{"error":{"message":"not found"}}"#.to_string();
            let usage = r#"{"input_tokens":100,"input_tokens_details":{"cached_tokens":90},"output_tokens":2}"#;
            let (status, ctype, answer) = match (method, path.strip_prefix("/v1/responses")) {
                _ if raw_body.contains("FAIL") => (503, "application/json", not_found.clone()),
                ("POST", Some("")) => {
                    let previous = body["previous_response_id"].as_str().map(str::to_owned);
                    if previous.as_deref().is_some_and(|p| !held(p)) {
                        (404, "application/json", not_found.clone())
                    } else {
                        let id = {
                            let mut st = store.lock().unwrap_or_else(|p| p.into_inner());
                            let id = format!("resp_{name}_{}", st.len());
                            st.push(id.clone());
                            id
                        };
                        if body["stream"] == serde_json::Value::Bool(true) {
                            let events = format!(
                                "event: response.created\ndata: {{\"response\":{{\"id\":\"{id}\",\"output\":[]}},\"type\":\"response.created\"}}\n\nevent: response.completed\ndata: {{\"response\":{{\"id\":\"{id}\",\"usage\":{usage}}},\"type\":\"response.completed\"}}\n\n"
                            );
                            (200, "text/event-stream", events)
                        } else {
                            let p = previous.map_or("null".into(), |p| format!("\"{p}\""));
                            (
                                200,
                                "application/json",
                                format!(
                                    r#"{{"id": "{id}","object":"response","output":[{{"id":"msg_1"}}],"previous_response_id":{p},"usage":{usage}}}"#
                                ),
                            )
                        }
                    }
                }
                (_, Some(rest))
                    if held(rest.trim_start_matches('/').split('/').next().unwrap_or("")) =>
                {
                    (
                        200,
                        "application/json",
                        format!(r#"{{"id":"{}"}}"#, rest.trim_start_matches('/')),
                    )
                }
                _ => (404, "application/json", not_found),
            };
            let reply = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                answer.len()
            );
            let _ = s.write_all(reply.as_bytes()).await;
            let _ = s.shutdown().await;
        }
    })
    .await
}
