//! Strategy round_robin.
