//! Workloads for prefix-router: request types, seeded generators, trace files, and a
//! deterministic text rendering so the simulator and an HTTP load generator send equal bytes for
//! equal prefixes.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod affinity;
pub mod generators;
pub mod ids;
pub mod percentile;
pub mod request;
pub mod scale;
pub mod sharegpt;
pub mod text;
pub mod trace;

pub use affinity::Affinity;
pub use generators::{
    generate, Arrival, Generator, SpecError, TokenDist, TokenRange, UnknownWorkload, WorkloadKind,
    WorkloadParams, WorkloadSpec,
};
pub use request::{Message, Request, Role, Segment};
pub use scale::{parse_scale_events, ScaleEvent, ScaleParseError};
pub use trace::TraceError;
