//! What every host of a serving run needs, built once: the scenario's trace, the actors'
//! specs (what a `meshsim node` receives to build an instance or a store server) and the
//! actors themselves, in id order, with the store's parameters and the live model's
//! configuration. The runners are peers over this module: [`super::sim`] (the simulator),
//! [`super::live`] (the live host in one process) and [`super::cluster`] (the live host
//! across processes). None of them builds what another needs.
//!
//! Actor ids: the router is actor 0, instance `i` actor `1 + i`, the metadata service
//! `1 + instances`, node `n`'s store server `2 + instances + n` (store policies only).

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::Msg;
use super::instance::{Instance, InstanceConfig, StoreLink};
use super::kv::prompt_hashes::PromptHashes;
use super::kv_routing::KvRouting;
use super::metadata::Metadata;
use super::policy::{Policy, Scope, StoreRules};
use super::router::kv_index::{Credits, KvIndex, StoreView};
use super::router::{Router, RouterStrategy};
use super::scenario::Scenario;
use super::store::directory::{Directory, StoreParams};
use super::store::memory::ClusterMemory;
use super::store_server::StoreServer;
use crate::actor::{Actor, ActorId};
use crate::backend::BatchBackend;
use crate::exec::TransformerConfig;
use crate::hardware::Place;
use crate::live::LiveError;
use crate::model::cost::BatchShape;
use crate::serving::chaos::Targets;
use crate::units::Nanos;
use crate::workload::{Trace, TraceError, WorkloadSpec, qa, replay};

/// Builds the scenario's trace: generated, or loaded from its dataset or trace file. A
/// replayed request that arrives after the time limit or whose prompt is longer than the
/// model's context is an error naming its line (the scenario checks generated prompts).
pub fn trace(s: &Scenario) -> Result<Trace, TraceError> {
    match &s.workload {
        WorkloadSpec::Generated(w) => {
            let t = qa::generate(w, s.model.vocab as u32, s.seed);
            // The scenario checked the expected span; a Poisson tail may still pass the limit.
            match t.requests.last() {
                Some(r) if r.arrival > s.limits.max_time => Err(TraceError::whole(
                    Path::new(&s.name),
                    "workload.arrival_rate_per_s",
                    format!(
                        "the last request arrives at {:.3} s, after limits.max_sim_time_s = {}",
                        r.arrival.as_secs_f64(),
                        s.limits.max_time.as_secs_f64()
                    ),
                )),
                _ => Ok(t),
            }
        }
        WorkloadSpec::Replay(spec) => {
            let mut loaded = replay::load(spec, s.seed)?;
            if spec.skip_too_long {
                let n = loaded.drop_too_long(s.model.max_context);
                if loaded.trace.requests.is_empty() {
                    return Err(TraceError::whole(
                        &spec.path,
                        "workload.skip_too_long",
                        format!(
                            "every request's prompt is longer than the context of {} ({} tokens)",
                            s.model.name, s.model.max_context
                        ),
                    ));
                }
                if n > 0 {
                    tracing::warn!(
                        skipped = n,
                        kept = loaded.trace.requests.len(),
                        "requests longer than the context of {} left out (workload.skip_too_long)",
                        s.model.name
                    );
                }
            }
            loaded.check_fits(
                &spec.path,
                s.limits.max_time,
                s.model.max_context,
                s.model.name,
            )?;
            Ok(loaded.trace)
        }
    }
}

/// The store's sizes and GDSF costs, from the scenario's hardware and model.
pub fn store_params(s: &Scenario, rules: &StoreRules) -> StoreParams {
    let hw = &s.hardware;
    let g = rules.tensor_tokens as u64;
    let cost = s.batch_backend();
    let prefill = |cached: u64| {
        let mut b = BatchShape::default();
        b.add(g, cached, false);
        cost.price(&b).0 as f64
    };
    let base = prefill(0);
    StoreParams {
        nodes: hw.nodes,
        tensor_bytes: g * s.model.kv_bytes_per_token(),
        host_capacity: rules.host_capacity_bytes,
        replica_capacity: (rules.host_capacity_bytes as f64 * rules.replica_fraction) as u64,
        ssd_capacity: rules.ssd_capacity_bytes,
        eviction: rules.eviction,
        admission: rules.admission,
        consolidate: rules.consolidate,
        replicate_after_reads: rules.replicate_after_reads,
        host_ns_per_byte: 1e9 / hw.pcie.bandwidth,
        ssd_ns_per_byte: 1e9 / (hw.ssd.drives as f64 * hw.ssd.read_bandwidth_per_drive),
        net_ns_per_byte: 1e9 / hw.network.nic.bandwidth,
        recompute_base_ns: base,
        recompute_per_index_ns: prefill(g) - base,
    }
}

/// Actors with their places, in id order.
pub type Placed = Vec<(Box<dyn Actor<Msg>>, Place)>;

/// The actors of one policy's run with their places, in id order (router, instances,
/// metadata, store servers), and the targets of fault injection. Both hosts run exactly
/// these: `backend` gives instance `i` its batch backend; with `memory` the store servers
/// hold real bytes (the live host).
pub fn actors(
    s: &Scenario,
    trace: Arc<Trace>,
    policy: &Policy,
    backend: &mut dyn FnMut(u32) -> Box<dyn BatchBackend>,
    memory: Option<Arc<ClusterMemory>>,
) -> (Placed, Targets) {
    let policy_impl: Arc<Policy> = Arc::new(policy.clone());
    let n = s.instances();
    let router_id = ActorId(0);
    let instance_ids: Vec<ActorId> = (0..n).map(|i| ActorId(1 + i)).collect();
    let metadata_id = ActorId(1 + n);
    let server_ids: Vec<ActorId> = (0..s.hardware.nodes).map(|i| ActorId(2 + n + i)).collect();
    let rules = policy.store_rules();
    let nodes: Vec<u32> = (0..n)
        .map(|i| s.instance_place(i).node().unwrap_or(0))
        .collect();
    let hashes = Arc::new(PromptHashes::new(trace.clone()));
    let mut router = Router::new(
        trace.clone(),
        instance_ids.clone(),
        nodes.clone(),
        s.serving.router,
    )
    .with_prompt_hashes(hashes.clone());
    let cfg = &s.serving.instance;
    match s.serving.router {
        RouterStrategy::KvApprox => {
            router = router.with_kv(KvRouting::new(
                n as usize,
                cfg.num_blocks,
                cfg.block_size,
                s.serving.kv_overlap_weight,
            ));
        }
        RouterStrategy::KvAware => router = router.with_kv_index(kv_index(s, policy)),
        RouterStrategy::RoundRobin | RouterStrategy::LeastLoaded => {}
    }
    let mut list: Placed = vec![(Box::new(router), Place::Frontend)];
    // Instances and store servers from their specs (the constructors a node uses too).
    let mut servers: Vec<(Box<dyn Actor<Msg>>, Place)> = Vec::new();
    for (id, spec, place) in specs(s, policy) {
        match spec {
            ActorSpec::Instance(i) => {
                debug_assert_eq!(list.len() as u32, id);
                let instance = i.actor(
                    trace.clone(),
                    hashes.clone(),
                    policy_impl.clone(),
                    backend(i.index),
                );
                list.push((Box::new(instance), place));
            }
            ActorSpec::Server(sv) => servers.push((Box::new(sv.actor(memory.clone())), place)),
        }
    }
    if let Some(rules) = rules {
        let mut dir = Directory::new(store_params(s, rules));
        dir.set_lease(s.store.read_lease.0);
        let mut metadata = Metadata::new(dir, s.store.metadata_service, server_ids.clone());
        if memory.is_some() {
            metadata = metadata.with_bytes();
        }
        if s.serving.router.needs_kv_events() {
            metadata = metadata.with_kv_events(router_id, s.serving.kv_event_interval);
        }
        debug_assert_eq!(list.len() as u32, metadata_id.0);
        list.push((Box::new(metadata), Place::Host { node: 0 }));
        list.extend(servers);
    }
    let targets = Targets {
        router: router_id,
        instances: instance_ids.into_iter().zip(nodes).collect(),
        metadata: rules.map(|_| metadata_id),
        servers: if rules.is_some() {
            server_ids
        } else {
            Vec::new()
        },
    };
    (list, targets)
}

/// Everything a node needs to build one serving instance.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct InstanceSpec {
    pub index: u32,
    pub router: ActorId,
    pub config: InstanceConfig,
    pub policy: Policy,
    /// How it reaches the store (store policies only).
    pub link: Option<StoreLink>,
    /// Publishes KV events to the router, gathered over this interval (`kv-aware` only).
    pub kv_events: Option<Nanos>,
}

impl InstanceSpec {
    /// The instance over `backend`: the one constructor of serving instances, for the
    /// simulator, one live process and a node alike.
    pub fn actor(
        &self,
        trace: Arc<Trace>,
        hashes: Arc<PromptHashes>,
        policy: Arc<Policy>,
        backend: Box<dyn BatchBackend>,
    ) -> Instance {
        let instance = Instance::new(
            self.index,
            self.router,
            trace,
            policy,
            self.config,
            self.link.clone(),
            backend,
        )
        .with_prompt_hashes(hashes);
        match self.kv_events {
            Some(interval) => instance.with_kv_events(interval),
            None => instance,
        }
    }
}

/// Everything a node needs to build one node's store server.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ServerSpec {
    pub node: u32,
    pub metadata: ActorId,
    /// Bytes its memory may hold (host and SSD capacity): what the directory bounds it by.
    pub capacity: u64,
}

impl ServerSpec {
    /// The store server, holding real bytes in `memory` when given: the one constructor of
    /// store servers.
    pub fn actor(&self, memory: Option<Arc<ClusterMemory>>) -> StoreServer {
        let server = StoreServer::new(self.node, self.metadata);
        match memory {
            Some(m) => server.with_memory(m),
            None => server,
        }
    }
}

/// An actor a node builds.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
// Built once per actor when a run starts, and sent once to a node: boxing the larger variant
// would save nothing that matters.
#[allow(clippy::large_enum_variant)]
pub enum ActorSpec {
    Instance(InstanceSpec),
    Server(ServerSpec),
}

/// The instances and store servers of a run of `policy` on `s`: `(actor id, spec, place)`,
/// in id order. The router is actor 0, instance `i` actor `1 + i`, the metadata service
/// `1 + instances`, node `n`'s store server `2 + instances + n` (store policies only).
pub fn specs(s: &Scenario, policy: &Policy) -> Vec<(u32, ActorSpec, Place)> {
    let n = s.instances();
    let metadata = ActorId(1 + n);
    let servers: Vec<ActorId> = (0..s.hardware.nodes).map(|i| ActorId(2 + n + i)).collect();
    let mut out = Vec::new();
    for i in 0..n {
        let place = s.instance_place(i);
        let node = place.node().unwrap_or(0);
        let link = policy.store_rules().map(|r| StoreLink {
            metadata,
            servers: servers.clone(),
            node,
            tensor_tokens: r.tensor_tokens,
            tensor_bytes: r.tensor_tokens as u64 * s.model.kv_bytes_per_token(),
            overlap: r.load_overlap,
            load: r.load,
            staging: r
                .remote_kv_path
                .unwrap_or(s.hardware.network.remote_kv_path),
            layers: s.model.layers as u32,
            namespace: namespace(r.scope, node, i),
        });
        let spec = InstanceSpec {
            index: i,
            router: ActorId(0),
            config: s.serving.instance,
            policy: policy.clone(),
            link,
            kv_events: s
                .serving
                .router
                .needs_kv_events()
                .then_some(s.serving.kv_event_interval),
        };
        out.push((1 + i, ActorSpec::Instance(spec), place));
    }
    if let Some(r) = policy.store_rules() {
        for node in 0..s.hardware.nodes {
            let spec = ServerSpec {
                node,
                metadata,
                capacity: r.host_capacity_bytes + r.ssd_capacity_bytes,
            };
            out.push((
                servers[node as usize].0,
                ActorSpec::Server(spec),
                Place::Host { node },
            ));
        }
    }
    out
}

/// The `kv-aware` router's index for `policy` on `s`: every instance's KV blocks, and under
/// store policies how each instance names its tensors and how many the stores hold.
fn kv_index(s: &Scenario, policy: &Policy) -> KvIndex {
    let cfg = &s.serving.instance;
    let credits = Credits {
        overlap_weight: s.serving.kv_overlap_weight,
        host: s.serving.kv_host_credit,
        disk: s.serving.kv_disk_credit,
    };
    let store = policy.store_rules().map(|r| {
        let namespaces = specs(s, policy)
            .into_iter()
            .filter_map(|(_, spec, _)| match spec {
                ActorSpec::Instance(i) => Some(i.link.and_then(|l| l.namespace)),
                ActorSpec::Server(_) => None,
            })
            .collect();
        let tensor_bytes = (r.tensor_tokens as u64 * s.model.kv_bytes_per_token()).max(1);
        let per_node = (r.host_capacity_bytes + r.ssd_capacity_bytes) / tensor_bytes;
        let per = r.tensor_tokens / cfg.block_size;
        StoreView::new(per, namespaces, per_node * u64::from(s.hardware.nodes))
    });
    KvIndex::new(
        s.instances() as usize,
        cfg.num_blocks,
        cfg.block_size,
        credits,
        store,
    )
}

/// The namespace of an instance's tensor ids under a store of `scope` (see
/// [`StoreLink::namespace`]): none across the cluster, its node's or its own otherwise.
fn namespace(scope: Scope, node: u32, instance: u32) -> Option<u64> {
    match scope {
        Scope::Cluster => None,
        Scope::Node => Some(u64::from(node)),
        Scope::Instance => Some((1 << 32) | u64::from(instance)),
    }
}

/// The candle configuration of the scenario's model.
pub fn transformer(s: &Scenario) -> Result<TransformerConfig, LiveError> {
    let p = crate::model::preset(s.model.name)
        .ok_or_else(|| LiveError::Config(format!("no preset {}", s.model.name)))?;
    Ok(TransformerConfig::from_model(
        &s.model,
        p.rope_theta,
        p.rms_eps,
    ))
}
