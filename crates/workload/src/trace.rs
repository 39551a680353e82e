//! Trace files: our JSONL and Mooncake's.

/// A trace file that cannot be read; names the line and field.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// Reading failed.
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: std::io::Error },
    /// A line does not parse.
    #[error("{path}:{line}: {why}")]
    Line { path: String, line: usize, why: String },
}
