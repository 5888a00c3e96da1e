//! Pins the store's eviction and replication decisions on small scripted traces.
//! Each snapshot is the log of decisions, one per line, with tensors named by the prompt
//! symbols that lead to them.

use std::collections::BTreeMap;

use meshsim::hash::{ROOT_PARENT, block_hash};
use meshsim::serving::store::TierEviction;
use meshsim::serving::store::admission::Admission;
use meshsim::serving::store::directory::{Directory, StoreEvent, StoreParams, TensorId};
use meshsim::serving::store::eviction::Eviction;

struct Script {
    d: Directory,
    names: BTreeMap<TensorId, String>,
    log: String,
}

impl Script {
    fn new(eviction: Eviction, replicate_after_reads: Option<u32>) -> Script {
        // Two nodes; per node an owned cache of 4 tensors, and 2 on SSD. With replication, a
        // replica cache of 2 tensors besides (EvoStore has none, as in a run).
        let replica_capacity = if replicate_after_reads.is_some() {
            200
        } else {
            0
        };
        let params = StoreParams {
            nodes: 2,
            tensor_bytes: 100,
            host_capacity: 400 + replica_capacity,
            replica_capacity,
            ssd_capacity: 200,
            eviction: TierEviction::all(eviction),
            admission: Admission::Always,
            consolidate: true,
            replicate_after_reads,
            host_ns_per_byte: 0.04,
            ssd_ns_per_byte: 0.3,
            net_ns_per_byte: 0.04,
            recompute_base_ns: 1e6,
            recompute_per_index_ns: 1e5,
        };
        let mut d = Directory::new(params);
        d.events = Some(Vec::new());
        Script {
            d,
            names: BTreeMap::new(),
            log: String::new(),
        }
    }

    fn chain(&mut self, prompt: &str) -> Vec<TensorId> {
        let mut parent = ROOT_PARENT;
        let mut ids = Vec::new();
        for (i, c) in prompt.char_indices() {
            parent = block_hash(parent, &[c as u32]);
            self.names
                .insert(parent, prompt[..i + c.len_utf8()].to_string());
            ids.push(parent);
        }
        ids
    }

    fn flush(&mut self, action: String) {
        self.log += &format!("{action}\n");
        for e in self.d.events.replace(Vec::new()).unwrap() {
            let line = match e {
                StoreEvent::Stored { node, id, .. } => {
                    format!("stored {} on {node}", self.names[&id])
                }
                StoreEvent::Demoted { node, index, .. } => format!("demoted #{index} on {node}"),
                StoreEvent::Dropped { node, id, .. } => {
                    format!("dropped {} on {node}", self.names[&id])
                }
                StoreEvent::Replicated { node, index } => format!("replicated #{index} to {node}"),
                StoreEvent::ReplicaEvicted { node, index } => {
                    format!("evicted replica #{index} on {node}")
                }
                StoreEvent::Refused { node, index } => {
                    format!("refused #{index} on {node}: no room without evicting its prefix")
                }
                StoreEvent::NotAdmitted { node, index } => {
                    format!("not admitted #{index} on {node}")
                }
            };
            self.log += &format!("  {line}\n");
        }
    }

    fn store(&mut self, prompt: &str, node: u32) {
        let c = self.chain(prompt);
        self.d.insert(&c, node);
        self.flush(format!("store {prompt} from node {node}"));
    }

    fn read(&mut self, prompt: &str, node: u32) {
        let c = self.chain(prompt);
        let plan = self.d.lookup(&c, 0, node);
        if !plan.replicate.is_empty() {
            self.d.add_replicas(node, &plan.replicate);
        }
        let (owned, replicas, ssd) = self.d.usage(node);
        self.flush(format!(
            "read {prompt} on node {node}: {} stored; node {node} holds {owned} B owned, {replicas} B replicas, {ssd} B on SSD",
            plan.stored_chunks
        ));
    }

    fn run(mut self) -> String {
        // Two prompts share "ab"; node 1 reads node 0's prompts often, then node 0 fills up.
        self.store("abc", 0);
        self.store("abd", 0);
        self.read("abc", 1);
        self.read("abc", 1);
        self.read("abd", 1);
        self.read("abd", 1);
        self.store("xy", 1);
        self.read("ab", 0);
        self.read("ab", 0);
        self.store("pqrs", 0);
        self.store("pqrst", 0);
        self.read("abc", 1);
        self.store("mnop", 1);
        self.d.check().unwrap();
        self.log
    }
}

#[test]
fn ptstore_decisions_with_gdsf_and_replication() {
    insta::assert_snapshot!(Script::new(Eviction::Gdsf, Some(2)).run());
}

#[test]
fn evostore_decisions_with_lru_and_no_replication() {
    insta::assert_snapshot!(Script::new(Eviction::Lru, None).run());
}
