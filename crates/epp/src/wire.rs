//! The ext_proc messages the picker reads and writes, and the Gateway API Inference Extension's
//! names for them: one place for each wire constant.

use std::collections::HashMap;

use envoy_types::pb::envoy::config::core::v3::{
    header_value_option::HeaderAppendAction, HeaderMap as EnvoyHeaders, HeaderValue,
    HeaderValueOption, Metadata,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, common_response::ResponseStatus, processing_response, BodyMutation,
    BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, ImmediateResponse,
    ProcessingResponse, StreamedBodyResponse, TrailersResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, ListValue, Struct, Value};

/// The header that names the chosen endpoint(s), `ip:port[,ip:port...]`, primary first.
pub const DESTINATION: &str = "x-gateway-destination-endpoint";
/// The dynamic-metadata namespace the destination is also written under.
pub const LB_NAMESPACE: &str = "envoy.lb";
/// The key (in [`LB_NAMESPACE`]) under which the proxy reports the endpoint that served.
pub const SERVED: &str = "x-gateway-destination-endpoint-served";
/// The metadata namespace in which the proxy may restrict the choice to a subset.
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
/// The key (in [`SUBSET_NAMESPACE`], or as a request header) of that subset.
pub const SUBSET: &str = "x-gateway-destination-endpoint-subset";
/// The ext_proc filter's namespace in `attributes`, where Envoy puts the attributes the filter
/// is configured to send (`response_attributes: ["upstream.address"]`).
pub const ATTRIBUTES_NAMESPACE: &str = "envoy.filters.http.ext_proc";
/// The attribute that says which upstream answered.
pub const UPSTREAM_ADDRESS: &str = "upstream.address";

/// A header's value as Envoy sends it: `raw_value` when set (Envoy's default since 1.30),
/// else `value`.
pub fn header_value(h: &HeaderValue) -> &[u8] {
    if h.raw_value.is_empty() {
        h.value.as_bytes()
    } else {
        &h.raw_value
    }
}

/// The value of header `name` (lower case, as Envoy sends names), if present.
pub fn find<'a>(headers: Option<&'a EnvoyHeaders>, name: &str) -> Option<&'a [u8]> {
    headers?
        .headers
        .iter()
        .find(|h| h.key == name)
        .map(header_value)
}

/// A string field of a metadata namespace, or each string of a list field.
pub fn metadata_strings(
    meta: Option<&Metadata>,
    namespace: &str,
    key: &str,
) -> Option<Vec<String>> {
    let field = meta?.filter_metadata.get(namespace)?.fields.get(key)?;
    strings_of(field)
}

/// The strings in an attribute (`attributes[namespace].fields[key]`).
pub fn attribute_strings(
    attributes: &HashMap<String, Struct>,
    namespace: &str,
    key: &str,
) -> Option<Vec<String>> {
    strings_of(attributes.get(namespace)?.fields.get(key)?)
}

fn strings_of(v: &Value) -> Option<Vec<String>> {
    match v.kind.as_ref()? {
        Kind::StringValue(s) => Some(split_endpoints(s)),
        Kind::ListValue(l) => Some(
            l.values
                .iter()
                .filter_map(|v| match v.kind.as_ref() {
                    Some(Kind::StringValue(s)) => Some(s.trim().to_string()),
                    _ => None,
                })
                .filter(|s| !s.is_empty())
                .collect(),
        ),
        _ => None,
    }
}

/// `a:1, b:2` as `["a:1", "b:2"]`.
pub fn split_endpoints(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

fn string_value(s: String) -> Value {
    Value {
        kind: Some(Kind::StringValue(s)),
    }
}

/// A header to set (replacing any value the request had).
pub fn set_header(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_string(),
            raw_value: value.as_bytes().to_vec(),
            ..HeaderValue::default()
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..HeaderValueOption::default()
    }
}

/// Continue, with these headers set.
pub fn common(set: Vec<HeaderValueOption>) -> CommonResponse {
    CommonResponse {
        status: ResponseStatus::Continue as i32,
        header_mutation: (!set.is_empty()).then(|| HeaderMutation {
            set_headers: set,
            remove_headers: Vec::new(),
        }),
        ..CommonResponse::default()
    }
}

/// `envoy.lb: { x-gateway-destination-endpoint: "<endpoints>" }`.
pub fn destination_metadata(endpoints: &str) -> Struct {
    let inner = Struct {
        fields: [(DESTINATION.to_string(), string_value(endpoints.to_string()))]
            .into_iter()
            .collect(),
    };
    Struct {
        fields: [(
            LB_NAMESPACE.to_string(),
            Value {
                kind: Some(Kind::StructValue(inner)),
            },
        )]
        .into_iter()
        .collect(),
    }
}

/// Which phase an answer is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The request's headers.
    RequestHeaders,
    /// The request's body.
    RequestBody,
    /// The response's headers.
    ResponseHeaders,
    /// A chunk of the response's body.
    ResponseBody,
    /// The request's trailers.
    RequestTrailers,
    /// The response's trailers.
    ResponseTrailers,
}

/// The answer to `phase`: continue, applying `common`, with `metadata` as dynamic metadata.
pub fn answer(
    phase: Phase,
    common: CommonResponse,
    metadata: Option<Struct>,
) -> ProcessingResponse {
    use processing_response::Response as R;
    let headers = || HeadersResponse {
        response: Some(common.clone()),
    };
    let body = || BodyResponse {
        response: Some(common.clone()),
    };
    let response = match phase {
        Phase::RequestHeaders => R::RequestHeaders(headers()),
        Phase::ResponseHeaders => R::ResponseHeaders(headers()),
        Phase::RequestBody => R::RequestBody(body()),
        Phase::ResponseBody => R::ResponseBody(body()),
        Phase::RequestTrailers => R::RequestTrailers(TrailersResponse::default()),
        Phase::ResponseTrailers => R::ResponseTrailers(TrailersResponse::default()),
    };
    ProcessingResponse {
        response: Some(response),
        dynamic_metadata: metadata,
        ..ProcessingResponse::default()
    }
}

/// A chunk of the request's or the response's body (`phase`) handed back to Envoy
/// (FULL_DUPLEX_STREAMED, where Envoy keeps no copy of what it sent the picker).
pub fn streamed_body(phase: Phase, chunk: &[u8], end_of_stream: bool) -> ProcessingResponse {
    let common = CommonResponse {
        status: ResponseStatus::Continue as i32,
        body_mutation: Some(BodyMutation {
            mutation: Some(body_mutation::Mutation::StreamedResponse(
                StreamedBodyResponse {
                    body: chunk.to_vec(),
                    end_of_stream,
                    ..StreamedBodyResponse::default()
                },
            )),
        }),
        ..CommonResponse::default()
    };
    answer(phase, common, None)
}

/// Answers the client directly with `status`, a JSON `body` and `details` for Envoy's
/// access log (the request goes to no endpoint).
pub fn immediate(status: u16, body: Vec<u8>, details: &str) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::ImmediateResponse(
            ImmediateResponse {
                status: Some(HttpStatus {
                    code: i32::from(status),
                }),
                headers: Some(HeaderMutation {
                    set_headers: vec![set_header("content-type", "application/json")],
                    remove_headers: Vec::new(),
                }),
                body,
                grpc_status: None,
                details: details.to_string(),
            },
        )),
        ..ProcessingResponse::default()
    }
}

/// A list value, for tests and for building metadata.
pub fn list(items: &[&str]) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue {
            values: items
                .iter()
                .map(|s| string_value((*s).to_string()))
                .collect(),
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_read_from_strings_and_lists() {
        let mut meta = Metadata::default();
        meta.filter_metadata.insert(
            SUBSET_NAMESPACE.into(),
            Struct {
                fields: [(
                    SUBSET.to_string(),
                    list(&["10.0.0.1:8000", " ", "10.0.0.2:8000"]),
                )]
                .into_iter()
                .collect(),
            },
        );
        meta.filter_metadata.insert(
            LB_NAMESPACE.into(),
            Struct {
                fields: [(
                    SERVED.to_string(),
                    string_value("10.0.0.3:8000, 10.0.0.4:8000".into()),
                )]
                .into_iter()
                .collect(),
            },
        );
        assert_eq!(
            metadata_strings(Some(&meta), SUBSET_NAMESPACE, SUBSET),
            Some(vec![
                "10.0.0.1:8000".to_string(),
                "10.0.0.2:8000".to_string()
            ])
        );
        assert_eq!(
            metadata_strings(Some(&meta), LB_NAMESPACE, SERVED),
            Some(vec![
                "10.0.0.3:8000".to_string(),
                "10.0.0.4:8000".to_string()
            ])
        );
        assert_eq!(metadata_strings(Some(&meta), "other", SERVED), None);
        assert_eq!(metadata_strings(None, LB_NAMESPACE, SERVED), None);
    }

    #[test]
    fn raw_values_win_over_values() {
        let h = HeaderValue {
            key: ":path".into(),
            value: "/old".into(),
            raw_value: b"/v1/chat/completions".to_vec(),
        };
        assert_eq!(header_value(&h), b"/v1/chat/completions");
        let h = HeaderValue {
            key: ":path".into(),
            value: "/v1/completions".into(),
            raw_value: Vec::new(),
        };
        assert_eq!(header_value(&h), b"/v1/completions");
    }
}
