//! Transfers over the links of a cluster, sharing each link fairly between the transfers on it.
//!
//! **Links.** Every resource a byte crosses is a link with an achievable bandwidth (line rate x
//! efficiency, see [`super::defaults`]): each NIC's transmit and receive side, each GPU's PCIe
//! link to the host (host to GPU, GPU to host), each GPU's NVLink port (out, in), each node's
//! host DRAM (reads and writes together), and each node's SSDs (one read and one write
//! channel, as fast as all drives striped). The switched fabric between NICs is taken as
//! non-blocking (full bisection, as Polaris's dragonfly is for these loads): it adds
//! latency, not contention.
//!
//! **Paths.** A transfer crosses, in order (`DRAM` is the node's host memory, `PCIe↓` the
//! reader GPU's host-to-GPU direction, `PCIe↑` the writer GPU's GPU-to-host direction):
//!
//! | transfer | links |
//! |---|---|
//! | host memory → own GPU (local load) | DRAM, PCIe↓ |
//! | GPU → own host memory (store write, replica copy) | PCIe↑, DRAM |
//! | GPU → GPU of the same node | NVLink out, NVLink in |
//! | host memory → GPU of another node (remote load, `remote_kv_path = "gpudirect"`: GPUDirect RDMA) | DRAM, NIC tx, NIC rx, PCIe↓ |
//! | the same, `"host-staged"` (hop after hop) | DRAM, NIC tx, NIC rx, reader's DRAM; once arrived, reader's DRAM, PCIe↓ |
//! | the same, `"host-pipelined"` (chunk by chunk) | DRAM, NIC tx, NIC rx, reader's DRAM twice (written, read), PCIe↓ |
//! | GPU → another node's host memory | PCIe↑, NIC tx, NIC rx, DRAM |
//! | host → host, frontend ↔ node | DRAM (at a node's end), NIC tx, NIC rx, DRAM |
//! | SSD → a place (streamed through a bounce buffer in host memory) | SSD read, DRAM, then the path from host memory to that place (DRAM again) |
//! | host memory → SSD (demotion) | DRAM, SSD write |
//!
//! Latency is the sum of the latencies of the kinds of link crossed (inter-node: both NICs and
//! `switch_hops` switches; PCIe; NVLink; the SSD's access latency), added once after the last
//! byte leaves.
//!
//! **Fair sharing (max-min).** Transfers of more than [`MICE_BYTES`] are *flows*: at every
//! moment each flow has one rate, the same on every link of its path (a fluid model:
//! cut-through, no store-and-forward), and the rates are the max-min fair allocation of the
//! links' bandwidths (progressive filling: the link whose bandwidth divided by its unfixed
//! flows is smallest fixes those flows at that share; repeat). When a flow starts or ends, or
//! a link's bandwidth changes (a `link-slow` fault), the rates of the flows connected to it
//! through shared links are recomputed and each flow whose rate changed gets a new finish
//! time; the others keep theirs. This is what a NIC serving many queue pairs, a PCIe root
//! port serving several DMA engines, or a memory controller does to first order: bandwidth is
//! shared among what is in flight, so a transfer is never stuck behind another's bulk load.
//!
//! **Small messages** (at most [`MICE_BYTES`]: control messages, lookups, token ids) do not
//! join the share: each crosses its path at the fair share it would get at its start, the
//! bottleneck's `bandwidth / (flows + 1)`, and does not slow the flows already there. The
//! error is at most its own transmission time taken from those flows (below 3 µs at 25 GB/s),
//! and it spares the simulation two rate recomputations per message. A 4 KiB message sent
//! while a 1 GiB load occupies a link therefore arrives within about twice its transmission
//! time plus the path's latency (tested).
//!
//! **What the links carried.** Every transfer says what it is for (a load, a store write, a
//! replica, a demotion, a message); the network counts its bytes on each kind of link it
//! crosses and the time each link had a transfer on it ([`LinkLoad`]; the rules are in the
//! `load` module's doc).
//!
//! **Determinism.** Rates are `f64` computed by the same operations in the same order on
//! every machine (no fused or library math), flows are visited in a fixed order, and finish
//! times are rounded up to whole nanoseconds.

mod flows;
mod load;
#[cfg(test)]
pub(crate) mod tests;

use super::{HardwareSpec, LinkSpec, Place, RemoteKvPath};
use crate::units::Nanos;
use flows::Flows;
pub use flows::{FlowId, Reschedule};
use load::LinkRole;
pub use load::{LinkKind, LinkLoad, Purpose};

/// Largest transfer that crosses its path at its fair share at once instead of joining the
/// share as a flow: 64 KiB.
pub const MICE_BYTES: u64 = 64 << 10;

/// Most links on one path (SSD read, DRAM, DRAM, NIC tx, NIC rx, PCIe↓: 6).
pub const MAX_PATH: usize = 8;

/// What the network needs to know of the cluster's shape and latencies.
#[derive(Clone, Copy, Debug)]
struct Shape {
    nodes: u32,
    gpus_per_node: u32,
    nics_per_node: u32,
    inter_node_latency: Nanos,
    nvlink_latency: Nanos,
    pcie_latency: Nanos,
    ssd_latency: Nanos,
    /// Whether the nodes have host memory and SSDs as links (a bare fabric has neither).
    memory: bool,
}

impl Shape {
    fn total_gpus(&self) -> u32 {
        self.nodes * self.gpus_per_node
    }
}

/// The links a transfer crosses, with its latency.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Path {
    links: [u32; MAX_PATH],
    len: usize,
    latency: Nanos,
}

impl Path {
    fn new() -> Path {
        Path {
            links: [0; MAX_PATH],
            len: 0,
            latency: Nanos::ZERO,
        }
    }

    fn push(&mut self, link: usize) {
        debug_assert!(self.len < MAX_PATH);
        self.links[self.len] = link as u32;
        self.len += 1;
    }

    pub(crate) fn links(&self) -> &[u32] {
        &self.links[..self.len]
    }
}

/// How a transfer that was started will end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transfer {
    /// It arrives at this time (same place, or a small message).
    At(Nanos),
    /// It is a flow in the fair share: [`Network::reschedules`] says when it finishes, and
    /// [`Network::finish`] then gives its arrival.
    Flow(FlowId),
}

/// The state of every link of a cluster.
#[derive(Debug)]
pub struct Network {
    spec: Shape,
    flows: Flows,
    /// Each link's kind and what of it counts ([`load`]).
    roles: Vec<LinkRole>,
    /// Bytes by kind of link and purpose, and by purpose once per transfer ([`LinkLoad`]).
    bytes: [[u64; 5]; 7],
    moved: [u64; 5],
}

#[derive(Clone, Copy)]
enum Dir {
    Tx = 0,
    Rx = 1,
}

impl Network {
    /// `nodes` hosts joined by a switched fabric: one NIC per node (and one for the frontend)
    /// of `link`'s achievable bandwidth per direction, `link.latency` one way between two
    /// nodes; no GPUs, no host-memory or SSD links. Pipeline routes use it: their shards
    /// exchange activations host to host.
    pub fn fabric(nodes: u32, link: LinkSpec) -> Network {
        let capacities = vec![link.achievable(); 2 * (nodes as usize + 1)];
        let mut network = Network {
            spec: Shape {
                nodes,
                gpus_per_node: 0,
                nics_per_node: 1,
                inter_node_latency: link.latency,
                nvlink_latency: Nanos::ZERO,
                pcie_latency: Nanos::ZERO,
                ssd_latency: Nanos::ZERO,
                memory: false,
            },
            flows: Flows::new(capacities),
            roles: Vec::new(),
            bytes: [[0; 5]; 7],
            moved: [0; 5],
        };
        network.roles = network.link_roles();
        network
    }

    pub fn new(spec: &HardwareSpec) -> Network {
        let nics = spec.network.nics_per_node as usize;
        let gpus = spec.total_gpus() as usize;
        let nodes = spec.nodes as usize;
        // Layout: [node NICs tx/rx][frontend NIC tx/rx][GPU PCIe up/down][GPU NVLink out/in]
        // [node DRAM][node SSD read/write].
        let mut caps = Vec::with_capacity(2 * (nodes * nics + 1) + 4 * gpus + 3 * nodes);
        caps.resize(2 * (nodes * nics + 1), spec.network.nic.achievable());
        caps.resize(caps.len() + 2 * gpus, spec.pcie.achievable());
        caps.resize(caps.len() + 2 * gpus, spec.nvlink.achievable());
        caps.resize(
            caps.len() + nodes,
            spec.host.memory_bandwidth * spec.host.memory_efficiency,
        );
        let drives = spec.ssd.drives as f64 * spec.ssd.efficiency;
        for _ in 0..nodes {
            caps.push(drives * spec.ssd.read_bandwidth_per_drive);
            caps.push(drives * spec.ssd.write_bandwidth_per_drive);
        }
        let mut network = Network {
            spec: Shape {
                nodes: spec.nodes,
                gpus_per_node: spec.gpus_per_node,
                nics_per_node: spec.network.nics_per_node,
                inter_node_latency: spec.inter_node_latency(),
                nvlink_latency: spec.nvlink.latency,
                pcie_latency: spec.pcie.latency,
                ssd_latency: spec.ssd.latency,
                memory: true,
            },
            flows: Flows::new(caps),
            roles: Vec::new(),
            bytes: [[0; 5]; 7],
            moved: [0; 5],
        };
        network.roles = network.link_roles();
        network
    }

    /// Every link's role, in the layout's order.
    fn link_roles(&self) -> Vec<LinkRole> {
        let role = |kind, counts_bytes, counts_busy| LinkRole {
            kind,
            counts_bytes,
            counts_busy,
        };
        let nics = self.spec.nodes as usize * self.spec.nics_per_node as usize;
        let gpus = self.spec.total_gpus() as usize;
        let mut roles = Vec::new();
        for side in 0..2 * (nics + 1) {
            // Transmit sides count the bytes; the frontend's NIC (last) is not a node's.
            roles.push(role(LinkKind::Nic, side % 2 == 0, side < 2 * nics));
        }
        if !self.spec.memory {
            return roles;
        }
        for side in 0..2 * gpus {
            // Up (GPU to host) then down, per GPU (see `end_links`).
            let kind = [LinkKind::PcieToHost, LinkKind::PcieToGpu][side % 2];
            roles.push(role(kind, true, true));
        }
        for side in 0..2 * gpus {
            roles.push(role(LinkKind::Nvlink, side % 2 == 0, true));
        }
        for _ in 0..self.spec.nodes {
            roles.push(role(LinkKind::Dram, true, true));
        }
        for _ in 0..self.spec.nodes {
            roles.push(role(LinkKind::SsdRead, true, true));
            roles.push(role(LinkKind::SsdWrite, true, true));
        }
        roles
    }

    /// The NIC a place uses to talk to `peer`: a GPU uses NIC `gpu mod nics` (Polaris: GPUs
    /// 0 and 2 on NIC 0, 1 and 3 on NIC 1); host memory uses the NIC of the GPU it talks to,
    /// or NIC 0; the frontend has one NIC of its own.
    fn nic_link(&self, place: Place, peer: Place, dir: Dir) -> usize {
        let nics = self.spec.nics_per_node;
        let gpu_of = |p: Place| match p {
            Place::Gpu { gpu, .. } => Some(gpu),
            _ => None,
        };
        let nic_index = match place {
            Place::Frontend => self.spec.nodes * nics,
            Place::Host { node } => node * nics + gpu_of(peer).unwrap_or(0) % nics,
            Place::Gpu { node, gpu } => node * nics + gpu % nics,
        };
        2 * nic_index as usize + dir as usize
    }

    fn gpu_index(&self, node: u32, gpu: u32) -> usize {
        (node * self.spec.gpus_per_node + gpu) as usize
    }

    fn pcie_base(&self) -> usize {
        2 * (self.spec.nodes as usize * self.spec.nics_per_node as usize + 1)
    }

    fn nvlink_base(&self) -> usize {
        self.pcie_base() + 2 * self.spec.total_gpus() as usize
    }

    fn dram(&self, node: u32) -> usize {
        self.nvlink_base() + 2 * self.spec.total_gpus() as usize + node as usize
    }

    fn ssd_link(&self, node: u32, write: bool) -> usize {
        self.dram(0) + self.spec.nodes as usize + 2 * node as usize + write as usize
    }

    /// Whether `place` lies in this cluster.
    fn valid(&self, place: Place) -> bool {
        match place {
            Place::Frontend => true,
            Place::Host { node } => node < self.spec.nodes,
            Place::Gpu { node, gpu } => node < self.spec.nodes && gpu < self.spec.gpus_per_node,
        }
    }

    /// The links at `place`'s end of a transfer that leaves it (`out`) or enters it: its
    /// PCIe direction for a GPU, its DRAM for a node's host.
    fn end_links(&self, place: Place, out: bool, path: &mut Path) {
        match place {
            Place::Gpu { node, gpu } => {
                let g = self.gpu_index(node, gpu);
                path.push(self.pcie_base() + 2 * g + (!out) as usize);
                path.latency += self.spec.pcie_latency;
            }
            Place::Host { node } if self.spec.memory => path.push(self.dram(node)),
            _ => {}
        }
    }

    /// The path from `from` to `to` (empty for the same place).
    fn path(&self, from: Place, to: Place) -> Path {
        let mut path = Path::new();
        match (from.node(), to.node()) {
            (a, b) if a != b => {
                self.end_links(from, true, &mut path);
                path.push(self.nic_link(from, to, Dir::Tx));
                path.push(self.nic_link(to, from, Dir::Rx));
                path.latency += self.spec.inter_node_latency;
                self.end_links(to, false, &mut path);
            }
            _ => match (from, to) {
                (Place::Gpu { node, gpu: g1 }, Place::Gpu { gpu: g2, .. }) if g1 != g2 => {
                    let base = self.nvlink_base();
                    path.push(base + 2 * self.gpu_index(node, g1));
                    path.push(base + 2 * self.gpu_index(node, g2) + 1);
                    path.latency += self.spec.nvlink_latency;
                }
                (Place::Gpu { .. }, Place::Host { .. })
                | (Place::Host { .. }, Place::Gpu { .. }) => {
                    self.end_links(from, true, &mut path);
                    self.end_links(to, false, &mut path);
                }
                // Same place: delivered in memory, at once.
                _ => {}
            },
        }
        path
    }

    /// Moves `bytes` from `from` to `to` for `purpose`, starting at `now`.
    pub fn transfer(
        &mut self,
        now: Nanos,
        from: Place,
        to: Place,
        bytes: u64,
        purpose: Purpose,
    ) -> Transfer {
        if !self.valid(from) || !self.valid(to) {
            // Places come from the host's own actor table; out of range is a bug upstream.
            debug_assert!(
                false,
                "transfer between {from:?} and {to:?} outside the cluster"
            );
            return Transfer::At(now);
        }
        self.moved[purpose as usize] += bytes;
        let path = self.path(from, to);
        self.start(now, &path, bytes, purpose)
    }

    /// The second leg of a load staged hop after hop (see [`Network::load`]): `bytes` from
    /// the reader's host memory `from` on to `to`; the load's bytes were counted as moved
    /// when it started.
    pub fn onward(&mut self, now: Nanos, from: Place, to: Place, bytes: u64) -> Transfer {
        let path = self.path(from, to);
        self.start(now, &path, bytes, Purpose::Load)
    }

    /// Reads `bytes` from `node`'s SSDs and streams them to `to` through a bounce buffer in
    /// `node`'s host memory (the read and the onward transfer overlap); `None` when the
    /// cluster has no SSDs there.
    pub fn ssd_read(&mut self, now: Nanos, node: u32, to: Place, bytes: u64) -> Option<Transfer> {
        let (path, _) = self.ssd_read_path(node, to, RemoteKvPath::Gpudirect)?;
        self.moved[Purpose::Load as usize] += bytes;
        Some(self.start(now, &path, bytes, Purpose::Load))
    }

    /// How long moving `bytes` from `from` (its host memory, or its node's SSDs when `ssd`)
    /// to `to` would take if it started at `now` and kept, all along, the share of its
    /// bottleneck it would get now (`bandwidth / (flows + 1)`, as a small message is
    /// charged), plus the path's latency: what a sender that sees the links' load can
    /// estimate. It starts nothing. `None` for a path the cluster does not have.
    pub fn estimate(
        &self,
        now: Nanos,
        from: Place,
        to: Place,
        ssd: bool,
        bytes: u64,
        staging: RemoteKvPath,
    ) -> Option<Nanos> {
        if !self.valid(from) || !self.valid(to) {
            return None;
        }
        let (path, stage) = if ssd {
            self.ssd_read_path(from.node()?, to, staging)?
        } else {
            self.load_legs(from, to, staging)
        };
        let leg = |path: &Path| {
            if path.len == 0 {
                path.latency
            } else {
                self.flows.mouse(now, path.links(), bytes) - now + path.latency
            }
        };
        let second = stage.map_or(Nanos::ZERO, |s| leg(&self.path(s, to)));
        Some(leg(&path) + second)
    }

    /// A load from `from` (host memory) into `to` along `staging`: the path of its first leg,
    /// and where a second leg starts when the load is staged hop after hop (the reader's host
    /// memory, from which it then crosses the reader's DRAM and PCIe). Only a load from
    /// another node's host memory into a GPU is staged.
    fn load_legs(&self, from: Place, to: Place, staging: RemoteKvPath) -> (Path, Option<Place>) {
        let stage = match (from, to) {
            (Place::Host { node: a }, Place::Gpu { node: b, .. }) if a != b && self.spec.memory => {
                Place::Host { node: b }
            }
            _ => return (self.path(from, to), None),
        };
        match staging {
            RemoteKvPath::Gpudirect => (self.path(from, to), None),
            RemoteKvPath::HostStaged => (self.path(from, stage), Some(stage)),
            RemoteKvPath::HostPipelined => {
                let (mut path, onward) = (self.path(from, stage), self.path(stage, to));
                for &l in onward.links() {
                    path.push(l as usize);
                }
                path.latency += onward.latency;
                (path, None)
            }
        }
    }

    /// Starts a load of `bytes` from `from`'s host memory (or its node's SSDs when `ssd`) into
    /// `to` along `staging`: the first leg's transfer, and where the second leg starts when
    /// the load is staged hop after hop (see [`RemoteKvPath`]; the caller starts it, from
    /// there to `to`, when the first arrives). `None` for SSDs the cluster does not have.
    pub fn load(
        &mut self,
        now: Nanos,
        from: Place,
        ssd: bool,
        to: Place,
        bytes: u64,
        staging: RemoteKvPath,
    ) -> Option<(Transfer, Option<Place>)> {
        if !self.valid(from) || !self.valid(to) {
            debug_assert!(
                false,
                "load between {from:?} and {to:?} outside the cluster"
            );
            return Some((Transfer::At(now), None));
        }
        let (path, stage) = if ssd {
            self.ssd_read_path(from.node()?, to, staging)?
        } else {
            self.load_legs(from, to, staging)
        };
        self.moved[Purpose::Load as usize] += bytes;
        Some((self.start(now, &path, bytes, Purpose::Load), stage))
    }

    /// The links of an SSD read on `node` streamed to `to` (see [`Network::ssd_read`]), its
    /// onward part along `staging`, and where a staged load's second leg starts.
    fn ssd_read_path(
        &self,
        node: u32,
        to: Place,
        staging: RemoteKvPath,
    ) -> Option<(Path, Option<Place>)> {
        if !self.spec.memory || node >= self.spec.nodes || !self.valid(to) {
            return None;
        }
        let (onward, stage) = self.load_legs(Place::Host { node }, to, staging);
        let mut path = Path::new();
        // Written into the bounce buffer, then read from it onward (the onward path starts
        // at this node's DRAM) unless it stays in this node's memory.
        path.push(self.ssd_link(node, false));
        path.push(self.dram(node));
        for &l in onward.links() {
            path.push(l as usize);
        }
        path.latency = onward.latency + self.spec.ssd_latency;
        Some((path, stage))
    }

    /// Writes `bytes` from `node`'s host memory to its SSDs; `None` when it has none.
    pub fn ssd_write(&mut self, now: Nanos, node: u32, bytes: u64) -> Option<Transfer> {
        if !self.spec.memory || node >= self.spec.nodes {
            return None;
        }
        let mut path = Path::new();
        path.push(self.dram(node));
        path.push(self.ssd_link(node, true));
        path.latency = self.spec.ssd_latency;
        self.moved[Purpose::Demotion as usize] += bytes;
        Some(self.start(now, &path, bytes, Purpose::Demotion))
    }

    fn start(&mut self, now: Nanos, path: &Path, bytes: u64, purpose: Purpose) -> Transfer {
        for &l in path.links() {
            let role = self.roles[l as usize];
            if role.counts_bytes {
                self.bytes[role.kind as usize][purpose as usize] += bytes;
            }
        }
        if path.len == 0 {
            return Transfer::At(now + path.latency);
        }
        if bytes <= MICE_BYTES {
            return Transfer::At(self.flows.send_mouse(now, path.links(), bytes) + path.latency);
        }
        Transfer::Flow(self.flows.start(now, path.links(), bytes, path.latency))
    }

    /// Flow `flow` reached the finish time of its `version`: if that is still its current
    /// version, it ends now (its links' shares are recomputed) and its arrival time is
    /// returned; a stale version (its rate changed since) gives `None`.
    pub fn finish(&mut self, now: Nanos, flow: FlowId, version: u32) -> Option<Nanos> {
        self.flows.finish(now, flow, version)
    }

    /// The flows whose finish time changed since the last call, to be scheduled.
    pub fn reschedules(&mut self) -> std::vec::Drain<'_, Reschedule> {
        self.flows.reschedules()
    }

    /// Flows in the share now.
    pub fn active_flows(&self) -> usize {
        self.flows.active()
    }

    /// Sets the NICs of `node` (both directions) to `factor` of their bandwidth from `now`
    /// (a `link-slow` fault; 1 restores them, 0 cuts them: flows on them stop until they are
    /// restored, and small messages wait until `blocked_until`).
    pub fn set_nics(&mut self, now: Nanos, node: u32, factor: f64, blocked_until: Nanos) {
        if node >= self.spec.nodes {
            return;
        }
        let nics = self.spec.nics_per_node as usize;
        let first = 2 * node as usize * nics;
        for l in first..first + 2 * nics {
            self.flows.set_factor(now, l, factor, blocked_until);
        }
    }

    /// What the links carried from time 0 to `end` (the run's last event).
    pub fn link_load(&self, end: Nanos) -> LinkLoad {
        let mut load = LinkLoad {
            bytes: self.bytes,
            moved: self.moved,
            span: end,
            ..LinkLoad::default()
        };
        let mut sides = [0u32; 7];
        let mut busy = [0u64; 7];
        for (l, role) in self.roles.iter().enumerate() {
            if !role.counts_busy {
                continue;
            }
            let k = role.kind as usize;
            let b = self.flows.busy(l, end);
            sides[k] += 1;
            busy[k] += b;
            if end.0 > 0 {
                load.busiest[k] = load.busiest[k].max(b as f64 / end.0 as f64);
            }
        }
        for k in 0..7 {
            if sides[k] > 0 && end.0 > 0 {
                load.busy[k] = busy[k] as f64 / sides[k] as f64 / end.0 as f64;
            }
            // NICs and NVLink ports have two sides each.
            let two_sided = matches!(LinkKind::ALL[k], LinkKind::Nic | LinkKind::Nvlink);
            load.links[k] = if two_sided { sides[k] / 2 } else { sides[k] };
        }
        load
    }
}
