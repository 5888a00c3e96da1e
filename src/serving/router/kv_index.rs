//! KV-event routing (`router = "kv-aware"`): the router's index of the KV events it has
//! received, and the score it picks an instance by.
//!
//! **What the router knows.** What the instances and the store told it, when the telling
//! arrived, as Dynamo's KV router and llm-d's KV-cache indexer know it from vLLM's KV events
//! (`vllm/distributed/kv_events.py`: `BlockStored`, `BlockRemoved`, `AllBlocksCleared`, each
//! with the `medium` it is about, sent in one batch per engine step):
//!
//! - per instance, the chained hashes of the prompt blocks its GPU prefix cache registered
//!   and has not reported evicted ([`KvEvent::Stored`], [`KvEvent::Removed`],
//!   [`KvEvent::Cleared`] when its cache is emptied), the same hashes the router computes
//!   from a prompt ([`crate::serving::kv::prompt_hashes`]);
//! - under store policies, per tensor id of the store (a chunk's last block hash, in the
//!   instance's namespace under a node or instance scope), the nodes whose host memory
//!   (owned or replica) or SSD holds it, from the metadata service's directory changes
//!   ([`KvEvent::Store`], [`KvEvent::StoreCleared`] when a store restarts).
//!
//! Events are messages ([`crate::serving::kv_events`]): late under a publishing interval or
//! a slow link, lost with a crashed node. On [`crate::serving::Msg::NodeDown`] the router
//! forgets what the node's instances and store server reported. It knows nothing else: not
//! what is being loaded, nor what a request in flight will register.
//!
//! **Bounds.** An instance's set holds at most its KV blocks (`num_blocks`): with every event
//! delivered it never holds more, since the instance has no more registered; past that (events
//! lost) the oldest entry goes. The store's index holds at most [`StoreView::max_entries`]
//! locations (every node's host and SSD capacity in tensors, twice, for replicas and
//! demotions in flight); a location past that is not recorded.
//!
//! **The score** of instance `i` for a prompt of `B` blocks, of which the leading `h_i` are
//! in its GPU set, and whose next chunks the store holds where `i` can load them from, is
//!
//! ```text
//! cost_i = overlap_weight x (B - h_i - sum over the next held chunks of credit x new blocks)
//!          + active_i
//! ```
//!
//! Dynamo's KV router cost (`overlap_score_weight x prefill blocks + decode blocks`,
//! `overlap_score_weight` 1 by default: ai-dynamo/dynamo `lib/llm/src/kv_router/config.rs`
//! at 79a21ca4) with the blocks the store can load credited per tier, as llm-d's
//! `LongestPrefixScorer` weighs each matched block by its medium (llm-d/llm-d-kv-cache-manager
//! `pkg/kvcache/backend.go` at a378f5b3: gpu 1.0, cpu 0.8). A chunk counts from the first one
//! that holds a block past the GPU hit, for its blocks past it, while the store holds each
//! next chunk; its credit is the best of where it is: host memory (owned or a replica, on any
//! node the instance's scope reaches: its tensor ids say which) `serving.kv_host_credit`
//! (default 0.8, llm-d's cpu weight), SSD `serving.kv_disk_credit` (default 0.8 too: llm-d
//! names no other off-GPU medium, and weighs one it has no weight for as much as the GPU, which
//! would rank SSD above host memory). Dynamo has no tier credits. `active_i` is the KV blocks
//! (prompt and output) of the requests the router sent to `i` that have not ended, as
//! `kv-approx` counts them ([`crate::serving::kv_routing`]). The lowest cost wins; ties go to
//! the lowest index.
//!
//! **Against `least-loaded`.** With no event (under `vanilla`, which keeps nothing), every
//! instance's cost is `overlap_weight x B + active_i`: the least active blocks win, where
//! `least-loaded` counts requests. The two pick alike when every request holds as many
//! blocks; otherwise the units differ.

use std::collections::HashMap;

use crate::hash::IdBuildHasher;
use crate::serving::kv_routing::{ActiveBlocks, PrefixSet};
use crate::serving::msg::{KvEvent, KvEvents};
use crate::serving::store::directory::{Change, TensorId};

/// Where a store server holds a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    Host,
    Replica,
    Ssd,
}

/// A tensor's copy on one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    node: u32,
    place: Place,
}

/// The credits of blocks the store can load, against a GPU hit's 1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Credits {
    pub overlap_weight: f64,
    pub host: f64,
    pub disk: f64,
}

/// What the router knows of the store's tiers, and how an instance names its tensors.
#[derive(Debug)]
pub struct StoreView {
    /// Blocks per tensor (the store's chunk).
    per: usize,
    /// Each instance's namespace of tensor ids (see [`crate::serving::instance::StoreLink`]).
    namespaces: Vec<Option<u64>>,
    held: HashMap<TensorId, Vec<Held>, IdBuildHasher>,
    entries: usize,
    /// Most locations recorded (see the module doc).
    pub max_entries: usize,
}

impl StoreView {
    /// For chunks of `per` blocks, instances naming their tensors in `namespaces`, and
    /// stores that hold at most `capacity_tensors` tensors in all.
    pub fn new(per: u32, namespaces: Vec<Option<u64>>, capacity_tensors: u64) -> StoreView {
        StoreView {
            per: per.max(1) as usize,
            namespaces,
            held: HashMap::default(),
            entries: 0,
            max_entries: capacity_tensors.saturating_mul(2).min(usize::MAX as u64) as usize,
        }
    }

    fn add(&mut self, id: TensorId, h: Held) {
        if self.entries >= self.max_entries {
            return;
        }
        let at = self.held.entry(id).or_default();
        if !at.contains(&h) {
            at.push(h);
            self.entries += 1;
        }
    }

    /// Removes the copies of `id` on `node` that `is` picks.
    fn remove(&mut self, id: TensorId, node: u32, is: impl Fn(Place) -> bool) {
        let Some(at) = self.held.get_mut(&id) else {
            return;
        };
        let before = at.len();
        at.retain(|h| !(h.node == node && is(h.place)));
        self.entries -= before - at.len();
        if at.is_empty() {
            self.held.remove(&id);
        }
    }

    fn apply(&mut self, c: Change) {
        match c {
            Change::Stored { node, id } => self.add(
                id,
                Held {
                    node,
                    place: Place::Host,
                },
            ),
            Change::Demoted { node, id } => {
                self.remove(id, node, |p| p == Place::Host);
                self.add(
                    id,
                    Held {
                        node,
                        place: Place::Ssd,
                    },
                );
            }
            Change::Dropped { node, id } => self.remove(id, node, |p| p != Place::Replica),
            Change::Replicated { node, id } => self.add(
                id,
                Held {
                    node,
                    place: Place::Replica,
                },
            ),
            Change::ReplicaGone { node, id } => self.remove(id, node, |p| p == Place::Replica),
        }
    }

    /// Node `node`'s store holds nothing any more.
    fn cleared(&mut self, node: u32) {
        let mut gone = 0;
        self.held.retain(|_, at| {
            let before = at.len();
            at.retain(|h| h.node != node);
            gone += before - at.len();
            !at.is_empty()
        });
        self.entries -= gone;
    }

    /// The best credit of the copies of `id`, if any.
    fn credit(&self, id: TensorId, credits: &Credits) -> Option<f64> {
        let at = self.held.get(&id)?;
        at.iter()
            .map(|h| match h.place {
                Place::Host | Place::Replica => credits.host,
                Place::Ssd => credits.disk,
            })
            .reduce(f64::max)
    }
}

/// The router's index of KV events, and its score (see the module doc).
#[derive(Debug)]
pub struct KvIndex {
    gpu: Vec<PrefixSet>,
    tick: u64,
    active: ActiveBlocks,
    credits: Credits,
    store: Option<StoreView>,
    hashes: Vec<u64>,
    /// The GPU-hit blocks the last pick scored for the instance it picked.
    last_gpu_hit: u32,
}

impl KvIndex {
    /// For `instances` instances of `num_blocks` KV blocks of `block_size` tokens, with the
    /// store's view under store policies.
    pub fn new(
        instances: usize,
        num_blocks: u32,
        block_size: u32,
        credits: Credits,
        store: Option<StoreView>,
    ) -> KvIndex {
        KvIndex {
            gpu: (0..instances)
                .map(|_| PrefixSet::new(num_blocks as usize))
                .collect(),
            tick: 0,
            active: ActiveBlocks::new(instances, block_size),
            credits,
            store,
            hashes: Vec::new(),
            last_gpu_hit: 0,
        }
    }

    pub fn block_size(&self) -> u32 {
        self.active.block_size()
    }

    /// The KV blocks a request of these sizes holds at most.
    pub fn blocks(&self, prompt_tokens: u32, output_tokens: u32) -> u64 {
        self.active.blocks(prompt_tokens, output_tokens)
    }

    /// Applies a batch of events, in order. Events about an instance the index does not know
    /// are ignored.
    pub fn apply(&mut self, batch: &KvEvents) {
        for &e in &batch.events {
            match (e, batch.instance) {
                (KvEvent::Store(c), None) => {
                    if let Some(s) = &mut self.store {
                        s.apply(c);
                    }
                }
                (KvEvent::StoreCleared(node), None) => self.store_cleared(node),
                (_, None) | (KvEvent::Store(_) | KvEvent::StoreCleared(_), Some(_)) => {}
                (e, Some(i)) => {
                    let Some(set) = self.gpu.get_mut(i as usize) else {
                        continue;
                    };
                    match e {
                        KvEvent::Stored(h) => {
                            self.tick += 1;
                            set.touch(h, self.tick);
                        }
                        KvEvent::Removed(h) => {
                            set.remove(h);
                        }
                        _ => set.clear(),
                    }
                }
            }
        }
    }

    /// The leading blocks of `hashes` that instance `i` reported in its GPU cache.
    pub fn gpu_hit(&self, i: usize, hashes: &[u64]) -> usize {
        self.gpu[i].overlap(hashes)
    }

    /// Blocks past the first `h` of `hashes` that the store can load for instance `i`, each
    /// weighed by its tier's credit.
    fn credited(&self, i: usize, hashes: &[u64], h: usize) -> f64 {
        let Some(s) = &self.store else {
            return 0.0;
        };
        let ns = s.namespaces.get(i).copied().flatten();
        let mut credited = 0.0;
        let mut k = h / s.per;
        // Bounded by the prompt's chunks.
        while (k + 1) * s.per <= hashes.len() {
            let last = hashes[(k + 1) * s.per - 1];
            let id = crate::serving::instance::tensor_id(ns, last);
            let Some(c) = s.credit(id, &self.credits) else {
                break;
            };
            credited += c * ((k + 1) * s.per - h.max(k * s.per)) as f64;
            k += 1;
        }
        credited
    }

    /// The cheapest instance among those `alive` for a prompt whose block hashes are
    /// `hashes` (kept for [`Self::sent`]).
    pub fn pick(&mut self, hashes: Vec<u64>, alive: &[bool]) -> Option<usize> {
        self.hashes = hashes;
        let hashes = &self.hashes;
        let b = hashes.len() as f64;
        let picked = self
            .active
            .cheapest(alive, self.credits.overlap_weight, |i| {
                let h = self.gpu[i].overlap(hashes);
                b - h as f64 - self.credited(i, hashes, h)
            });
        if let Some(i) = picked {
            self.last_gpu_hit = self.gpu[i].overlap(hashes) as u32;
        }
        picked
    }

    /// The GPU-hit blocks the last pick scored for the instance it picked.
    pub fn last_gpu_hit(&self) -> u32 {
        self.last_gpu_hit
    }

    /// A request of `blocks` KV blocks went to `i`.
    pub fn sent(&mut self, i: usize, blocks: u64) {
        self.active.sent(i, blocks);
    }

    /// A request of `blocks` KV blocks at `i` ended (finished, rejected or failed over).
    pub fn ended(&mut self, i: usize, blocks: u64) {
        self.active.ended(i, blocks);
    }

    /// Instance `i` is gone: nothing of its cache remains.
    pub fn lost(&mut self, i: usize) {
        self.gpu[i].clear();
        self.active.reset(i);
    }

    /// The store server of `node` holds nothing any more.
    pub fn store_cleared(&mut self, node: u32) {
        if let Some(s) = &mut self.store {
            s.cleared(node);
        }
    }
}

#[cfg(test)]
mod tests;
