//! The strategies, one file each.

pub mod least_outstanding;
pub mod prefix_aware;
pub mod random;
pub mod round_robin;
