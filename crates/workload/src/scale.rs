//! Fleet scale events (`+1@600s,-2@1800s`).

/// Instances added (positive) or removed (negative) at a time.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScaleEvent {
    /// Seconds from the start.
    pub at_s: f64,
    /// Instances added (> 0) or removed (< 0).
    pub delta: i32,
}

/// A scale list that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid scale event '{item}': {why} (expected e.g. +1@600s,-2@1800s)")]
pub struct ScaleParseError {
    /// The offending item.
    pub item: String,
    /// What is wrong.
    pub why: String,
}

/// Parses `+1@600s,-2@1800s` (seconds; `m` suffix for minutes).
pub fn parse_scale_events(s: &str) -> Result<Vec<ScaleEvent>, ScaleParseError> {
    todo!("{s}")
}
