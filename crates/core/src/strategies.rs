//! The strategies, one file each, plus the selection helpers they share.

pub mod cache_aware;
mod common;
pub mod kv_aware;
pub mod least_outstanding;
pub mod prefix_aware;
pub mod random;
pub mod recording;
pub mod round_robin;

pub use cache_aware::CacheAware;
pub use common::no_instance;
pub use kv_aware::KvAware;
pub use least_outstanding::LeastOutstanding;
pub use prefix_aware::PrefixAware;
pub use random::Random;
pub use recording::Recording;
pub use round_robin::RoundRobin;
