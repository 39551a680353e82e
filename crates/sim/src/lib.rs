//! Discrete-event fleet simulator.
#![forbid(unsafe_code)]
