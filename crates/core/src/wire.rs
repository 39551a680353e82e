//! Names the router puts on the wire that other parts of the project read back: one place for
//! each, so the server that writes them and the load generator that reads them cannot drift.

/// Response header naming the instance that served the request (its id, as `serve` lists it).
pub const INSTANCE_HEADER: &str = "x-prefix-router-instance";
/// Response header with the routing decision's reason (`cache_hit`, `cold`, `overflow`, ...).
pub const DECISION_HEADER: &str = "x-prefix-router-decision";
