//! Errors answered in OpenAI's JSON shape: `{"error":{"message","type","param","code"}}`.

use http::StatusCode;

/// An error response.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`.
    pub kind: &'static str,
    /// The request field at fault, if any.
    pub param: Option<String>,
    /// OpenAI's machine-readable `code`, if any.
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400 about the field `param`.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.into()),
            code: Some("invalid_value"),
        }
    }

    /// 400 about the body as a whole.
    pub fn bad_body(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// 404 for a model this engine does not serve.
    pub fn unknown_model(model: &str) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("The model `{model}` does not exist."),
            kind: "invalid_request_error",
            param: Some("model".to_owned()),
            code: Some("model_not_found"),
        }
    }

    /// 404 for an unknown path.
    pub fn not_found(path: &str) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("no route for `{path}`"),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// 405 for a known path with another method.
    pub fn method_not_allowed(path: &str) -> Self {
        ApiError {
            status: StatusCode::METHOD_NOT_ALLOWED,
            message: format!("method not allowed on `{path}`"),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// 413 for a body over the size limit.
    pub fn too_large(limit: usize) -> Self {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("request body exceeds {limit} bytes"),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// An injected failure (`--fail-rate`) or a stopped engine (`--stop-after`).
    pub fn injected(status: StatusCode, message: &str) -> Self {
        ApiError {
            status,
            message: message.to_owned(),
            kind: if status == StatusCode::SERVICE_UNAVAILABLE {
                "service_unavailable"
            } else {
                "internal_server_error"
            },
            param: None,
            code: None,
        }
    }

    /// The JSON body.
    pub fn to_json(&self) -> Vec<u8> {
        let v = serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        });
        v.to_string().into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_the_openai_fields() {
        let e = ApiError::invalid("max_tokens", "must be at least 1");
        let v: serde_json::Value = serde_json::from_slice(&e.to_json()).unwrap();
        assert_eq!(v["error"]["param"], "max_tokens");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(v["error"]["message"].is_string());
        assert!(v["error"].get("code").is_some());
    }
}
