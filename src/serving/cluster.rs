//! Serving runs across processes ([`crate::live::cluster`]): `meshsim run --live` with
//! `[live] nodes` (or `--nodes`) hosts the router and the metadata service, and scenario node
//! `n`'s instances and store server go to `meshsim node` number `1 + n mod N` of the `N`
//! named. The actors are the one-process live run's ([`super::build::actors`]), built from the
//! same specs ([`super::build::InstanceSpec`], [`super::build::ServerSpec`]) by the same
//! constructors.
//!
//! **What every node gets** when it joins a run ([`RunData`], in the run's `Setup`): the
//! model's architecture and the seed of its weights, the trace (every prompt's token ids:
//! nodes need no dataset), the instances' K/V geometry and the actor of every node's store
//! server. A node builds the model's weights once for all the instances placed on it, and
//! one store memory ([`ClusterMemory`]) for the servers placed on it.
//!
//! **Store loads cross the socket.** A load is a one-sided read (the simulation's
//! `Work::Fetch`, an RDMA read in a real store): an instance's backend reads every tensor of
//! its plan through [`ClusterSource`], from its own process's memory when the owner's server
//! is there, and otherwise from the owner's process with a [`Frame::Read`] that the owner's
//! process answers from its memory without its actors taking part. The K/V travels as raw
//! little-endian f32 ([`super::wire::WireKv`]). Writes, placement changes and lookups are
//! actor messages and travel as such ([`super::wire`]).
//!
//! **A lost process.** Its actors are placed again, empty, and every actor hears of it
//! ([`Msg::ActorLost`]): the router runs the lost instances' requests again (counted as
//! failovers), the metadata service forgets the lost stores' tensors, and loads in flight from
//! the process fail and are recomputed. Outputs travel to the router as requests end
//! ([`Msg::Output`]), so none is lost with an instance (docs/live.md, "A lost process").
//!
//! **Limits.** Instances of one process share its device lock
//! (`serving.shared_device`); processes on one machine share its cores without one.
//!
//! [`Frame::Read`]: crate::live::wire::Frame::Read

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use candle_core::DType;
use serde::{Deserialize, Serialize};

use super::Msg;
use super::build::{ActorSpec, actors, specs, transformer};
use super::kv::prompt_hashes::PromptHashes;
use super::outcome::{AcrossProcesses, PolicyRun};
use super::policy::Policy;
use super::scenario::Scenario;
use super::store::directory::Location;
use super::store::memory::ClusterMemory;
use crate::actor::{Actor, ActorId};
use crate::backend::{DeviceLock, KvSource, PagedCandleBackend};
use crate::exec::weights::{self, WeightSource};
use crate::exec::{HostKv, ShardModel, TransformerConfig, default_device};
use crate::live::LiveError;
use crate::live::cluster::{Coordinator, Placement, Reads, System};
use crate::live::wire::{FRAME_OVERHEAD, Setup, postcard_whole};
use crate::metrics::Summary;
use crate::workload::Trace;

/// What every process of a serving run gets (see the module doc).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct RunData {
    pub model: TransformerConfig,
    /// Seed of the weights ([`WeightSource::Seeded`]).
    pub seed: u64,
    pub block_size: u32,
    pub num_blocks: u32,
    /// The instances of one process share one device lock.
    pub shared_device: bool,
    /// The actor of every scenario node's store server (store policies; else empty).
    pub servers: Vec<ActorId>,
    pub trace: Trace,
}

/// Largest K/V geometry a node accepts from a peer.
const MAX_BLOCKS: u64 = 1 << 24;

impl RunData {
    fn check(&self, max_memory: u64) -> Result<(), String> {
        let m = &self.model;
        if m.layers == 0 || m.hidden == 0 || m.heads == 0 || m.kv_heads == 0 || m.head_dim == 0 {
            return Err("a model with a zero dimension".into());
        }
        if m.vocab == 0 || m.vocab > 1 << 24 {
            return Err(format!("a vocabulary of {} ids", m.vocab));
        }
        if self.block_size == 0
            || self.num_blocks == 0
            || self.block_size as u64 * self.num_blocks as u64 > MAX_BLOCKS * 64
            || self.num_blocks as u64 > MAX_BLOCKS
        {
            return Err(format!(
                "{} blocks of {} tokens: out of range",
                self.num_blocks, self.block_size
            ));
        }
        let weights = m.f32_weight_bytes(m.layers);
        if weights > max_memory {
            return Err(format!(
                "the model needs {weights} bytes of f32 weights, over this node's limit of \
                 {max_memory} (--max-memory-gib)"
            ));
        }
        self.trace.check(m.vocab as u32)
    }
}

/// Where an instance's backend reads store tensors from in a run across processes: this
/// process's store memory for the nodes whose server is here, the holder's process (a
/// one-sided read over the socket) for the others.
pub struct ClusterSource {
    memory: Arc<ClusterMemory>,
    /// Process of every scenario node's store server.
    holder: Vec<u16>,
    reads: Arc<Reads>,
}

/// The key of a one-sided read of a store tensor: postcard of `(node, ssd, tensor id)`.
type ReadKey = (u32, bool, u64);

impl KvSource for ClusterSource {
    fn read(&self, node: u32, ssd: bool, id: u64) -> Option<Arc<HostKv>> {
        let &p = self.holder.get(node as usize)?;
        if p == self.reads.me() {
            return KvSource::read(&*self.memory, node, ssd, id);
        }
        let key = postcard::to_allocvec(&(node, ssd, id) as &ReadKey).ok()?;
        let bytes = self.reads.read(p, key)?;
        match super::wire::decode_kv(&bytes) {
            Ok(kv) => {
                self.reads.payload(kv.bytes());
                Some(Arc::new(kv))
            }
            Err(e) => {
                tracing::warn!("a read of tensor {id:016x} from process {p}: {e}");
                None
            }
        }
    }
}

/// What the serving actors of one run share inside one node process.
pub struct NodeShared {
    data: RunData,
    trace: Arc<Trace>,
    hashes: Arc<PromptHashes>,
    model: ShardModel,
    device: Arc<DeviceLock>,
    memory: Arc<ClusterMemory>,
    source: Arc<ClusterSource>,
    me: u16,
    /// Bytes the actors built here may hold besides the weights (K/V capacity, store
    /// capacity), and how many the ones built so far hold.
    budget: u64,
    committed: AtomicU64,
    /// Timing of the instances' iterations here, for the log.
    timing: Arc<Mutex<crate::backend::Timing>>,
}

/// The serving system on a node.
pub struct Serving;

impl System for Serving {
    type Msg = Msg;
    type Shared = NodeShared;

    fn shared(setup: &Setup, max_memory: u64, reads: Arc<Reads>) -> Result<NodeShared, String> {
        let mut data: RunData = postcard_whole(&setup.shared).map_err(|e| e.to_string())?;
        data.check(max_memory)?;
        let holder = data
            .servers
            .iter()
            .map(|a| {
                setup
                    .home
                    .get(a.0 as usize)
                    .copied()
                    .ok_or_else(|| format!("store server actor {} is not of this run", a.0))
            })
            .collect::<Result<Vec<u16>, String>>()?;
        let device = default_device();
        let m = &data.model;
        let vb = weights::var_builder(
            m,
            0..m.layers,
            &WeightSource::Seeded(data.seed),
            DType::F32,
            &device,
        )
        .map_err(|e| e.to_string())?;
        let model = ShardModel::new(m, 0..m.layers, vb).map_err(|e| e.to_string())?;
        // One copy of the trace, shared by the instances (the run data keeps an empty one).
        let empty = Trace {
            arena: Default::default(),
            requests: Vec::new(),
            contexts: 0,
        };
        let trace = Arc::new(std::mem::replace(&mut data.trace, empty));
        let memory = Arc::new(ClusterMemory::new(data.servers.len() as u32));
        let source = Arc::new(ClusterSource {
            memory: memory.clone(),
            holder,
            reads,
        });
        Ok(NodeShared {
            hashes: Arc::new(PromptHashes::new(trace.clone())),
            trace,
            budget: max_memory - m.f32_weight_bytes(m.layers),
            model,
            device: Arc::new(DeviceLock::default()),
            memory,
            source,
            me: setup.node,
            committed: AtomicU64::new(0),
            timing: Arc::new(Mutex::new(Default::default())),
            data,
        })
    }

    fn build(
        spec: &[u8],
        _max_memory: u64,
        sh: &NodeShared,
    ) -> Result<Box<dyn Actor<Msg>>, String> {
        let spec: ActorSpec = postcard_whole(spec).map_err(|e| e.to_string())?;
        let d = &sh.data;
        let kv_per_token = d.model.f32_kv_bytes_per_token();
        let (bytes, what) = match &spec {
            ActorSpec::Instance(i) => (
                d.num_blocks as u64 * d.block_size as u64 * kv_per_token,
                format!("instance {}", i.index),
            ),
            ActorSpec::Server(s) => (s.capacity, format!("the store server of node {}", s.node)),
        };
        let before = sh.committed.fetch_add(bytes, Ordering::SeqCst);
        if before.saturating_add(bytes) > sh.budget {
            sh.committed.fetch_sub(bytes, Ordering::SeqCst);
            return Err(format!(
                "{what} needs {bytes} bytes, over what this node's limit leaves ({} of {} \
                 besides the weights; --max-memory-gib)",
                sh.budget.saturating_sub(before),
                sh.budget
            ));
        }
        match spec {
            ActorSpec::Instance(i) => {
                let c = &i.config;
                if c.block_size != d.block_size || c.num_blocks != d.num_blocks {
                    return Err(format!(
                        "instance {} has {} blocks of {} tokens, the run {} of {}",
                        i.index, c.num_blocks, c.block_size, d.num_blocks, d.block_size
                    ));
                }
                if let Some(l) = &i.link
                    && (l.node as usize >= d.servers.len() || l.servers != d.servers)
                {
                    return Err(format!("instance {} names other store servers", i.index));
                }
                if c.max_num_seqs == 0 || c.max_num_seqs > 1 << 16 || c.max_waiting > 1 << 24 {
                    return Err(format!("instance {}: limits out of range", i.index));
                }
                if i.policy.uses_store() != i.link.is_some() {
                    return Err(format!(
                        "instance {}: policy {} {} a store link",
                        i.index,
                        i.policy.name(),
                        if i.link.is_some() { "with" } else { "without" }
                    ));
                }
                let policy = Arc::new(i.policy.clone());
                let source = i
                    .link
                    .as_ref()
                    .map(|_| sh.source.clone() as Arc<dyn KvSource>);
                let mut b = PagedCandleBackend::new(
                    sh.model.clone(),
                    sh.trace.clone(),
                    d.block_size,
                    d.num_blocks,
                    source,
                )
                .map_err(|e| e.to_string())?
                .with_timing(sh.timing.clone());
                if d.shared_device {
                    b = b.with_device_lock(sh.device.clone());
                }
                Ok(Box::new(i.actor(
                    sh.trace.clone(),
                    sh.hashes.clone(),
                    policy,
                    Box::new(b),
                )))
            }
            ActorSpec::Server(s) => {
                if s.node as usize >= d.servers.len() {
                    return Err(format!(
                        "a store server of node {}, not of this run",
                        s.node
                    ));
                }
                Ok(Box::new(s.actor(Some(sh.memory.clone()))))
            }
        }
    }

    fn read(sh: &NodeShared, key: &[u8]) -> Option<Vec<u8>> {
        let (node, ssd, id): ReadKey = postcard_whole(key).ok()?;
        if sh.source.holder.get(node as usize) != Some(&sh.me) {
            return None;
        }
        let location = if ssd { Location::Ssd } else { Location::Host };
        let kv = sh.memory.read(node, location, id)?;
        super::wire::encode_kv(&kv).ok()
    }
}

impl Drop for NodeShared {
    fn drop(&mut self) {
        let t = *self.timing.lock().unwrap_or_else(|e| e.into_inner());
        let all = t.all();
        if all.iterations > 0 {
            tracing::info!(
                node = self.me,
                iterations = all.iterations,
                compute_s = all.compute.as_secs_f64(),
                waiting_for_device_s = t.waiting.as_secs_f64(),
                kv_copies_s = t.copies.as_secs_f64(),
                "live iterations on this node"
            );
        }
    }
}

/// The run data of `s` with `trace`.
pub fn run_data(s: &Scenario, trace: &Trace, policy: &Policy) -> Result<RunData, LiveError> {
    let n = s.instances();
    Ok(RunData {
        model: transformer(s)?,
        seed: s.seed,
        block_size: s.serving.instance.block_size,
        num_blocks: s.serving.instance.num_blocks,
        shared_device: s.serving.shared_device,
        servers: if policy.uses_store() {
            (0..s.hardware.nodes).map(|i| ActorId(2 + n + i)).collect()
        } else {
            Vec::new()
        },
        trace: trace.clone(),
    })
}

/// The largest frame a run of `s` on `trace` can send: its setup (the trace), a node's
/// placement, or its largest message (a whole prompt's store write).
pub fn max_frame(s: &Scenario, trace: &Trace) -> Result<u64, LiveError> {
    let cfg = |e: &dyn std::fmt::Display| LiveError::Config(e.to_string());
    // The largest of every policy's setup and placement (a store policy's are the larger).
    let mut setup = 0;
    let mut place = 0;
    let mut tensor_tokens = s.store.tensor_tokens as u64;
    for p in &s.policies {
        let data = run_data(s, trace, p)?;
        let bytes = postcard::to_allocvec(&data).map_err(|e| cfg(&e))?.len() as u64
            // The setup's other fields: the processes' addresses, every actor's home.
            + 4096
            + 4 * (s.instances() as u64 + s.hardware.nodes as u64 + 2);
        setup = bytes.max(setup);
        let placed: u64 = specs(s, p)
            .iter()
            .map(|(_, spec, _)| postcard::to_allocvec(spec).map_or(0, |b| b.len() as u64 + 16))
            .sum();
        place = placed.max(place);
        if let Some(r) = p.store_rules() {
            tensor_tokens = tensor_tokens.max(r.tensor_tokens as u64);
        }
    }
    let model = transformer(s)?;
    let longest = trace
        .requests
        .iter()
        .map(|r| r.prompt_tokens as u64)
        .max()
        .unwrap_or(1);
    let message =
        super::wire::largest_message(longest, tensor_tokens, model.f32_kv_bytes_per_token());
    Ok(setup.max(place).max(message) + FRAME_OVERHEAD)
}

/// Runs one policy of `s` across the coordinator's nodes: the router and the metadata
/// service here, node `n`'s instances and store server on node `1 + n mod N`.
pub async fn live(
    s: &Scenario,
    trace: Arc<Trace>,
    policy: &Policy,
    coordinator: &mut Coordinator,
) -> Result<PolicyRun, LiveError> {
    let started = Instant::now();
    let procs = coordinator.addresses().len();
    if procs == 0 {
        return Err(LiveError::Config(
            "no nodes to place the instances on".into(),
        ));
    }
    let cfg = |e: &dyn std::fmt::Display| LiveError::Config(e.to_string());
    let max_frame = max_frame(s, &trace)?;
    let data = run_data(s, &trace, policy)?;
    // The router and the metadata service, from the same constructors as every run; the
    // instances and servers built alongside them are dropped (their specs go to nodes).
    let memory = policy
        .uses_store()
        .then(|| Arc::new(ClusterMemory::new(s.hardware.nodes)));
    let (list, _) = actors(
        s,
        trace.clone(),
        policy,
        &mut |_| Box::new(s.batch_backend()),
        memory,
    );
    let n = s.instances();
    let mut placement = Placement {
        local: Default::default(),
        remote: Default::default(),
        shared: postcard::to_allocvec(&data).map_err(|e| cfg(&e))?,
    };
    for (id, (actor, _)) in list.into_iter().enumerate() {
        let id = id as u32;
        if id == 0 || id == 1 + n {
            placement.local.insert(id, actor);
        }
    }
    for (id, spec, place) in specs(s, policy) {
        let node = place.node().unwrap_or(0) as usize;
        let bytes = postcard::to_allocvec(&spec).map_err(|e| cfg(&e))?;
        placement
            .remote
            .insert(id, ((1 + node % procs) as u16, bytes));
    }
    let out = coordinator
        .run::<Serving>(placement, s.seed, max_frame, s.max_wall)
        .await?;
    tracing::info!(
        policy = policy.name(),
        frames = out.wire_frames,
        frame_bytes = out.wire_bytes,
        payload_bytes = out.bytes,
        fetched_bytes = out.fetched,
        remote_read_bytes = out.remote_read,
        "actor messages and store reads across processes"
    );
    let summary = Summary::new(policy.name(), &out.report, out.messages);
    Ok(PolicyRun {
        policy: policy.clone(),
        summary,
        wall: started.elapsed().max(out.wall),
        spooled: None,
        latencies: None,
        output_check: None,
        timing: None,
        across: Some(AcrossProcesses {
            remote_read: out.remote_read,
            fetched: out.fetched,
            frames: out.wire_frames,
            frame_bytes: out.wire_bytes,
        }),
        report: out.report,
    })
}
