//! How well requests that share a prefix stayed together: the measure the demo, `bench`'s
//! replica runs and the simulator all report, computed once here from (request, instance)
//! pairs so the three cannot drift.

use std::collections::HashMap;
use std::hash::Hash;

use crate::Request;

/// How well requests that share a prefix stayed together.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct Affinity {
    /// Completed requests with a shared prefix.
    pub requests: u64,
    /// Distinct shared prefixes among them.
    pub prefixes: u64,
    /// Share of those requests that went to their prefix's most-used instance.
    pub on_home: f64,
    /// The busiest instance's completed requests over the mean per instance.
    pub max_share_over_mean: f64,
}

impl Affinity {
    /// Of every completed request with the instance that served it, among `instances`
    /// instances. A request without a shared prefix ([`Request::shared_prefix`]) counts in the
    /// load only.
    pub fn of<'a, I, K>(served: I, instances: usize) -> Self
    where
        I: IntoIterator<Item = (&'a Request, K)>,
        K: Hash + Eq + Copy,
    {
        let mut per: HashMap<u64, HashMap<K, u64>> = HashMap::new();
        let mut load: HashMap<K, u64> = HashMap::new();
        let mut completed = 0u64;
        for (req, inst) in served {
            completed += 1;
            *load.entry(inst).or_default() += 1;
            if let Some(p) = req.shared_prefix() {
                *per.entry(p).or_default().entry(inst).or_default() += 1;
            }
        }
        let with_prefix: u64 = per.values().flat_map(|m| m.values()).sum();
        let home: u64 = per.values().filter_map(|m| m.values().max()).sum();
        let mean = completed as f64 / instances.max(1) as f64;
        Affinity {
            requests: with_prefix,
            prefixes: per.len() as u64,
            on_home: if with_prefix == 0 {
                0.0
            } else {
                home as f64 / with_prefix as f64
            },
            max_share_over_mean: load
                .values()
                .max()
                .map_or(0.0, |&m| m as f64 / mean.max(1e-9)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Message, Role, Segment};

    fn request(doc: u64, q: u64) -> Request {
        let seg = |id, tokens| Segment { id, tokens };
        Request {
            id: q,
            arrival_s: 0.0,
            group: None,
            model: None,
            messages: vec![Message::new(
                Role::User,
                vec![seg(doc, 100), seg(1000 + q, 5)],
            )],
            output_tokens: 1,
        }
    }

    #[test]
    fn counts_each_prefix_on_its_most_used_instance() {
        let reqs: Vec<Request> = (0..6).map(|q| request(q % 2, q)).collect();
        // Prefix 0: instances 0, 0, 1 (2 of 3 home); prefix 1: 1, 1, 1 (3 of 3).
        let at = [0u32, 1, 0, 1, 1, 1];
        let a = Affinity::of(reqs.iter().zip(at), 2);
        assert_eq!((a.requests, a.prefixes), (6, 2));
        assert!((a.on_home - 5.0 / 6.0).abs() < 1e-9);
        assert!((a.max_share_over_mean - 4.0 / 3.0).abs() < 1e-9);
        assert_eq!(
            Affinity::of(std::iter::empty::<(&Request, u32)>(), 3).on_home,
            0.0
        );
    }
}
