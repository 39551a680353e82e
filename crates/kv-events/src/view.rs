//! One engine's cache as its events describe it: which blocks it holds, where, and how the
//! blocks chain into prefixes. Exact while every batch since the engine started was applied;
//! [`Completeness`] says when it is not (joined mid-stream, batches lost for good).

use std::collections::{HashMap, HashSet};

use crate::event::{EngineHash, EventBatch, KvEvent, Medium};

/// How much of the engine's history the view has applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Completeness {
    /// Every batch since the engine started (or since it last cleared its cache).
    #[default]
    Exact,
    /// Some batches were never applied (the subscriber joined mid-stream, or a gap could not
    /// be replayed): blocks stored before are missing and blocks removed then still listed,
    /// until the engine clears its cache.
    Partial,
}

#[derive(Debug, Clone, Copy)]
struct Block {
    parent: Option<EngineHash>,
    /// The router's name for it ([`crate::chain`]), when its tokens and its parent's name are
    /// known.
    ours: Option<u64>,
    /// Blocks from the start of the prefix to this one (1 for a root; 0: the chain above is
    /// not known to the view).
    depth: u32,
    /// Listed on the GPU (a prefix hit).
    gpu: bool,
    /// Listed on another medium (CPU memory or further): the engine can load it instead of
    /// computing it. vLLM's offloading stores a copy while the GPU still holds the block, so
    /// a block can be on both.
    offloaded: bool,
}

/// A prefix the view holds: its last block and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldPrefix {
    pub last: EngineHash,
    /// Blocks from its start (0 when the start is unknown).
    pub blocks: u32,
}

/// A block's share of a cache's [digest](EngineView::digest): SplitMix64's finalizer of its
/// hash, so that XOR over a set of blocks names the set (two caches that list the same blocks
/// have the same digest, whatever the order they were stored and evicted in).
pub fn block_digest(h: EngineHash) -> u64 {
    let mut z = h.0;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The bits of a digest that a Prometheus gauge (an `f64`) carries exactly.
pub const DIGEST_MASK: u64 = (1 << 52) - 1;

/// See the module documentation.
#[derive(Debug, Clone, Default)]
pub struct EngineView {
    blocks: HashMap<EngineHash, Block>,
    /// The router's names of the blocks listed on the GPU.
    ours: HashMap<u64, EngineHash>,
    /// The router's names of the blocks listed offloaded.
    ours_offloaded: HashMap<u64, EngineHash>,
    /// The [`adapter_mix`](crate::adapter_mix) of every LoRA adapter the engine stored blocks
    /// for that the view could name, since the view was created (a cleared cache keeps them:
    /// an adapter that has none of its blocks left simply matches nothing).
    adapters: HashSet<u64>,
    gpu: usize,
    offloaded: usize,
    /// XOR of [`block_digest`] over the blocks on the GPU.
    digest: u64,
    block_size: u32,
    completeness: Completeness,
    /// Removals of blocks the view did not list (expected only when partial).
    pub unknown_removals: u64,
}

impl EngineView {
    /// An empty view of an engine that has just started.
    pub fn new() -> Self {
        Self::default()
    }

    /// Blocks listed on the GPU (resident for routing).
    pub fn gpu_blocks(&self) -> usize {
        self.gpu
    }
    /// Blocks listed elsewhere (offloaded to CPU memory or further), whether or not the GPU
    /// also holds them.
    pub fn offloaded_blocks(&self) -> usize {
        self.offloaded
    }
    /// The block size the engine last reported (tokens per block; 0 before any store).
    pub fn block_size(&self) -> u32 {
        self.block_size
    }
    /// Names the set of blocks on the GPU (see [`block_digest`]), in [`DIGEST_MASK`]'s bits.
    pub fn digest(&self) -> u64 {
        self.digest & DIGEST_MASK
    }
    /// See [`Completeness`].
    pub fn completeness(&self) -> Completeness {
        self.completeness
    }
    /// Marks batches as missed for good.
    pub fn mark_partial(&mut self) {
        self.completeness = Completeness::Partial;
    }
    /// Whether the engine holds `h` on its GPU.
    pub fn holds(&self, h: EngineHash) -> bool {
        self.blocks.get(&h).is_some_and(|b| b.gpu)
    }

    /// How many leading blocks of `chain` (the router's names, [`crate::token_chain`]) the
    /// engine holds on its GPU.
    pub fn matched(&self, chain: &[u64]) -> usize {
        self.matched_as(chain, 0)
    }

    /// [`EngineView::matched`] for a request run under the adapter of `mix`
    /// ([`adapter_mix`](crate::adapter_mix); 0 for the base model).
    fn matched_as(&self, chain: &[u64], mix: u64) -> usize {
        chain
            .iter()
            .take_while(|&&h| self.ours.contains_key(&(h ^ mix)))
            .count()
    }

    /// Whether the engine stored blocks for the adapter of `mix` that the view could name, since
    /// the view was created.
    pub fn has_adapter(&self, mix: u64) -> bool {
        self.adapters.contains(&mix)
    }

    /// How many leading blocks of `chain` the engine holds on its GPU, and how many more
    /// after those it can load from an offloaded copy (each held on the GPU or offloaded,
    /// without a gap): what a request costs there is the first free, the second cheaper than
    /// computing. `mix`: the request's adapter ([`adapter_mix`](crate::adapter_mix)), 0 for
    /// the base model.
    pub fn matched_with_offloaded(&self, chain: &[u64], mix: u64) -> (usize, usize) {
        let gpu = self.matched_as(chain, mix);
        let more = chain[gpu..]
            .iter()
            .map(|&h| h ^ mix)
            .take_while(|h| self.ours_offloaded.contains_key(h) || self.ours.contains_key(h))
            .count();
        (gpu, more)
    }

    /// Forgets everything: the engine cleared its cache or restarted. The view is exact again.
    pub fn clear(&mut self) {
        self.blocks.clear();
        self.ours.clear();
        self.ours_offloaded.clear();
        self.gpu = 0;
        self.offloaded = 0;
        self.digest = 0;
        self.completeness = Completeness::Exact;
    }

    /// Applies one batch, in order.
    pub fn apply(&mut self, batch: &EventBatch) {
        for e in &batch.events {
            match e {
                KvEvent::Stored(s) => {
                    if s.block_size > 0 {
                        self.block_size = s.block_size;
                    }
                    let gpu = s.medium == Medium::Gpu;
                    let offloaded = !gpu;
                    let mut parent = s.parent;
                    // The depth of the block before the first: 0 before a root, `None` when
                    // the view does not know where the chain starts.
                    let mut before = match s.parent {
                        None => Some(0),
                        Some(p) => self.blocks.get(&p).map(|b| b.depth).filter(|&d| d > 0),
                    };
                    // An adapter's blocks are named as the base model's of the same tokens,
                    // XOR the adapter's mix (an engine keys them apart, and so must the
                    // router). Ones keyed by more than their tokens (images, salts), or by an
                    // adapter given only by number (no name a request could give), are not
                    // what any request's tokens name: unnamed.
                    let mix = match (&s.lora_name, s.lora_id, s.extra_keys) {
                        (_, _, true) => None,
                        (Some(name), _, false) => Some(crate::chain::adapter_mix(name)),
                        (None, Some(_), false) => None,
                        (None, None, false) => Some(0),
                    };
                    if let Some(m) = mix.filter(|&m| m != 0) {
                        self.adapters.insert(m);
                    }
                    // The base model's name of the block before the first, and each block's
                    // tokens (only when the event carries all of them). A parent is the same
                    // adapter's (its hash is keyed by it): its name XOR the mix is the base's.
                    let mut prev_plain = match s.parent {
                        None => Some(crate::chain::ROOT),
                        Some(p) => self
                            .blocks
                            .get(&p)
                            .and_then(|b| b.ours)
                            .zip(mix)
                            .map(|(o, m)| o ^ m),
                    };
                    let size = s.block_size as usize;
                    let whole = mix.is_some()
                        && size > 0
                        && s.token_ids.len() == size * s.block_hashes.len();
                    for (k, &h) in s.block_hashes.iter().enumerate() {
                        let depth = before.map_or(0, |d| d.saturating_add(1));
                        let plain = match (prev_plain, whole) {
                            (Some(prev), true) => Some(crate::chain::token_block(
                                prev,
                                &s.token_ids[k * size..(k + 1) * size],
                            )),
                            _ => None,
                        };
                        let ours = plain.zip(mix).map(|(p, m)| p ^ m);
                        self.insert(
                            h,
                            Block {
                                parent,
                                ours,
                                depth,
                                gpu,
                                offloaded,
                            },
                        );
                        before = (depth > 0).then_some(depth);
                        prev_plain = plain;
                        parent = Some(h);
                    }
                }
                KvEvent::Removed(r) => {
                    for h in &r.block_hashes {
                        self.remove(*h, r.medium == Medium::Gpu);
                    }
                }
                KvEvent::Cleared => self.clear(),
            }
        }
    }

    /// Lists `b` under `h`; a block already listed keeps the media it is on (an offload's
    /// store adds the CPU copy of a block the GPU still holds) and what it knew of its chain.
    fn insert(&mut self, h: EngineHash, mut b: Block) {
        if let Some(old) = self.blocks.get(&h).copied() {
            self.unlist(h, old);
            b.gpu |= old.gpu;
            b.offloaded |= old.offloaded;
            b.ours = b.ours.or(old.ours);
            if b.depth == 0 {
                b.depth = old.depth;
            }
        }
        self.list(h, b);
    }

    /// Counts `b` on its media and names it.
    fn list(&mut self, h: EngineHash, b: Block) {
        if b.gpu {
            self.gpu += 1;
            self.digest ^= block_digest(h);
            if let Some(o) = b.ours {
                self.ours.insert(o, h);
            }
        }
        if b.offloaded {
            self.offloaded += 1;
            if let Some(o) = b.ours {
                self.ours_offloaded.insert(o, h);
            }
        }
        self.blocks.insert(h, b);
    }

    /// Undoes [`Self::list`]'s counts and names (the entry itself stays).
    fn unlist(&mut self, h: EngineHash, b: Block) {
        // Two engine blocks can share a name (the same tokens stored again under another
        // hash): a name is dropped only while it still names `h`.
        let forget = |names: &mut HashMap<u64, EngineHash>| {
            if let Some(o) = b.ours {
                if names.get(&o) == Some(&h) {
                    names.remove(&o);
                }
            }
        };
        if b.gpu {
            self.gpu -= 1;
            self.digest ^= block_digest(h);
            forget(&mut self.ours);
        }
        if b.offloaded {
            self.offloaded -= 1;
            forget(&mut self.ours_offloaded);
        }
    }

    fn remove(&mut self, h: EngineHash, from_gpu: bool) {
        match self.blocks.get(&h).copied() {
            Some(b) if (from_gpu && b.gpu) || (!from_gpu && b.offloaded) => {
                self.unlist(h, b);
                let rest = Block {
                    gpu: b.gpu && !from_gpu,
                    offloaded: b.offloaded && from_gpu,
                    ..b
                };
                if rest.gpu || rest.offloaded {
                    self.list(h, rest);
                } else {
                    self.blocks.remove(&h);
                }
            }
            // Removed from a medium it is not listed on: a stale event; the listing stands.
            Some(_) => {}
            None => self.unknown_removals += 1,
        }
    }

    /// The `n` longest prefixes held on the GPU (by their last block), longest first.
    pub fn longest_prefixes(&self, n: usize) -> Vec<HeldPrefix> {
        let mut has_child: std::collections::HashSet<EngineHash> = Default::default();
        for b in self.blocks.values().filter(|b| b.gpu) {
            if let Some(p) = b.parent {
                has_child.insert(p);
            }
        }
        let mut leaves: Vec<HeldPrefix> = self
            .blocks
            .iter()
            .filter(|(h, b)| b.gpu && !has_child.contains(h))
            .map(|(h, b)| HeldPrefix {
                last: *h,
                blocks: b.depth,
            })
            .collect();
        leaves.sort_by(|a, b| b.blocks.cmp(&a.blocks).then(a.last.cmp(&b.last)));
        leaves.truncate(n);
        leaves
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{BlockRemoved, BlockStored};

    fn stored(hashes: &[u64], parent: Option<u64>, medium: Medium) -> KvEvent {
        KvEvent::Stored(BlockStored {
            block_hashes: hashes.iter().map(|&h| EngineHash(h)).collect(),
            parent: parent.map(EngineHash),
            // Block h holds tokens h, h, h, h.
            token_ids: hashes.iter().flat_map(|&h| [h as u32; 4]).collect(),
            block_size: 4,
            medium,
            ..BlockStored::default()
        })
    }
    fn removed(hashes: &[u64], medium: Medium) -> KvEvent {
        KvEvent::Removed(BlockRemoved {
            block_hashes: hashes.iter().map(|&h| EngineHash(h)).collect(),
            medium,
            group_idx: None,
        })
    }
    fn batch(events: Vec<KvEvent>) -> EventBatch {
        EventBatch {
            events,
            ..EventBatch::default()
        }
    }

    #[test]
    fn stores_removes_offloads_and_clears() {
        let mut v = EngineView::new();
        v.apply(&batch(vec![
            stored(&[1, 2, 3], None, Medium::Gpu),
            stored(&[4], Some(2), Medium::Gpu),
            stored(&[9], Some(77), Medium::Gpu),
        ]));
        assert_eq!(v.gpu_blocks(), 5);
        assert_eq!(v.block_size(), 4);
        // The router names blocks from their tokens: a prompt 1111 2222 4444 matches three.
        let chain = crate::token_chain(&[1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 4, 5, 5], 4);
        assert_eq!(v.matched(&chain), 3);
        assert_eq!(
            v.matched(&crate::token_chain(&[2, 2, 2, 2], 4)),
            0,
            "not a prefix"
        );
        assert!(v.holds(EngineHash(3)));
        assert_eq!(
            v.longest_prefixes(3),
            vec![
                HeldPrefix {
                    last: EngineHash(3),
                    blocks: 3
                },
                HeldPrefix {
                    last: EngineHash(4),
                    blocks: 3
                },
                // Its parent was never announced: the start is unknown.
                HeldPrefix {
                    last: EngineHash(9),
                    blocks: 0
                },
            ]
        );
        // Offloaded to CPU: no longer resident for routing, still counted.
        v.apply(&batch(vec![
            removed(&[3], Medium::Gpu),
            stored(&[3], Some(2), Medium::Cpu),
            removed(&[55], Medium::Gpu),
        ]));
        assert!(!v.holds(EngineHash(3)));
        assert_eq!((v.gpu_blocks(), v.offloaded_blocks()), (4, 1));
        let chain = crate::token_chain(&[1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3], 4);
        assert_eq!(v.matched(&chain), 2, "an offloaded block is not resident");
        assert_eq!(v.unknown_removals, 1);
        assert_eq!(
            v.matched_with_offloaded(&chain, 0),
            (2, 1),
            "but it can be loaded"
        );
        assert_eq!(v.longest_prefixes(1)[0].last, EngineHash(4));
        v.mark_partial();
        assert_eq!(v.completeness(), Completeness::Partial);
        v.apply(&batch(vec![KvEvent::Cleared]));
        assert_eq!((v.gpu_blocks(), v.offloaded_blocks()), (0, 0));
        assert_eq!(v.matched(&chain), 0);
        assert_eq!(v.completeness(), Completeness::Exact);
    }

    #[test]
    fn an_offloaded_copy_of_a_resident_block_is_on_both_media_until_each_drops_it() {
        let mut v = EngineView::new();
        v.apply(&batch(vec![stored(&[1, 2], None, Medium::Gpu)]));
        let digest = v.digest();
        // The offloading connector copies both to CPU memory; the GPU keeps them.
        v.apply(&batch(vec![stored(&[1, 2], None, Medium::Cpu)]));
        let chain = crate::token_chain(&[1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3], 4);
        assert_eq!((v.gpu_blocks(), v.offloaded_blocks()), (2, 2));
        assert_eq!(v.matched_with_offloaded(&chain, 0), (2, 0));
        assert_eq!(v.digest(), digest, "the GPU's set is unchanged");
        // The GPU evicts the second: it is still loadable from the CPU copy.
        v.apply(&batch(vec![removed(&[2], Medium::Gpu)]));
        assert_eq!((v.gpu_blocks(), v.offloaded_blocks()), (1, 2));
        assert_eq!(v.matched_with_offloaded(&chain, 0), (1, 1));
        // The CPU drops its copy of the first: the GPU's stands.
        v.apply(&batch(vec![removed(&[1], Medium::Cpu)]));
        assert_eq!(v.matched_with_offloaded(&chain, 0), (1, 1));
        assert_eq!((v.gpu_blocks(), v.offloaded_blocks()), (1, 1));
        // A removal from a medium a block is not on changes nothing.
        v.apply(&batch(vec![removed(&[1], Medium::Cpu)]));
        assert_eq!((v.gpu_blocks(), v.offloaded_blocks()), (1, 1));
        v.apply(&batch(vec![
            removed(&[1], Medium::Gpu),
            removed(&[2], Medium::Cpu),
        ]));
        assert_eq!((v.gpu_blocks(), v.offloaded_blocks()), (0, 0));
        assert_eq!(v.matched_with_offloaded(&chain, 0), (0, 0));
        assert_eq!(v.unknown_removals, 0);
    }

    #[test]
    fn shared_names_survive_removals_and_digests_name_the_set() {
        let mut v = EngineView::new();
        // Two engine blocks with the same tokens (stored again under another hash).
        v.apply(&batch(vec![stored(&[1], None, Medium::Gpu)]));
        let mut again = stored(&[1], None, Medium::Gpu);
        if let KvEvent::Stored(s) = &mut again {
            s.block_hashes = vec![EngineHash(100)];
        }
        v.apply(&batch(vec![again, removed(&[1], Medium::Gpu)]));
        assert_eq!(
            v.matched(&crate::token_chain(&[1, 1, 1, 1], 4)),
            1,
            "100 still has them"
        );
        // An adapter's blocks are not the base model's.
        let mut lora = stored(&[7], None, Medium::Gpu);
        if let KvEvent::Stored(s) = &mut lora {
            s.lora_name = Some("sql".into());
        }
        v.apply(&batch(vec![lora]));
        assert_eq!(v.matched(&crate::token_chain(&[7, 7, 7, 7], 4)), 0);
        // Named under the adapter: a request naming it matches them, one naming another does
        // not, and the base model's request above did not.
        let sql = crate::adapter_mix("sql");
        let chain = crate::token_chain(&[7, 7, 7, 7], 4);
        assert!(v.has_adapter(sql) && !v.has_adapter(crate::adapter_mix("chat")));
        assert_eq!(v.matched_with_offloaded(&chain, sql), (1, 0));
        assert_eq!(
            v.matched_with_offloaded(&chain, crate::adapter_mix("chat")),
            (0, 0)
        );
        // Given only by number, an adapter's blocks match no request.
        let mut numbered = stored(&[8], None, Medium::Gpu);
        if let KvEvent::Stored(s) = &mut numbered {
            s.lora_id = Some(3);
        }
        v.apply(&batch(vec![numbered]));
        assert_eq!(v.matched(&crate::token_chain(&[8, 8, 8, 8], 4)), 0);
        // The same set, reached in another order, has the same digest.
        let mut w = EngineView::new();
        w.apply(&batch(vec![
            stored(&[8], None, Medium::Gpu),
            stored(&[7], None, Medium::Gpu),
            stored(&[5], None, Medium::Gpu),
            stored(&[100], None, Medium::Gpu),
            removed(&[5], Medium::Gpu),
        ]));
        assert_eq!(v.digest(), w.digest());
        assert_ne!(v.digest(), EngineView::new().digest());
    }
}
