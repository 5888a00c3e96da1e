//! Transfers over links, with contention.
//!
//! **Model: FIFO links in tandem, cut-through.** Every directed link (a NIC's transmit or
//! receive side, a GPU's PCIe link, a GPU's NVLink port) is a FIFO server with a time
//! `free_at` until which it is busy. A transfer of `b` bytes crosses the links of its path in
//! order; on link `i`, with `d = b / bw_min` (the path's bottleneck sets the pace),
//!
//! ```text
//! start_i = max(free_at_i, start_{i-1})        (start_0 = now)
//! end_i   = max(start_i + d, end_{i-1})        (bytes cannot leave before they arrive)
//! free_at_i = end_i
//! ```
//!
//! and it arrives `latency(path)` after its last byte leaves the last link.
//!
//! Why FIFO rather than fair sharing: a NIC serves RDMA work requests from its send queue in
//! order, and bulk transfers (KV prefixes of megabytes) are what contend; FIFO gives each
//! transfer a completion time at the moment it is issued, in O(path length), without
//! rescheduling other transfers' completion events as processor sharing would, and it keeps
//! the total throughput of a link at its bandwidth. Each link is busy only while the transfer
//! crosses it: a transfer waiting for a busy receiver does not hold its sender idle (a convoy
//! that would waste the sender's bandwidth). What it ignores: a small transfer cannot overtake
//! a large one already queued (fair sharing would let it finish earlier), and a sender is
//! charged as if it streamed at the bottleneck's pace even while the receiver is still busy.
//!
//! Control messages between the frontend and a node terminate at the node's host CPU: they
//! cross both NICs and the fabric but not PCIe. Data read from another node goes NIC to NIC
//! into the GPU (GPUDirect RDMA), so only the NICs are charged; data between a GPU and its own
//! node's host memory crosses the GPU's PCIe link. A node's SSDs are one read and one write
//! channel, each as fast as all drives striped, plus the drives' latency.

use super::{HardwareSpec, LinkSpec, Place};
use crate::units::Nanos;

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
    /// Whether the nodes have SSDs (a bare fabric has none).
    ssds: bool,
}

impl Shape {
    fn total_gpus(&self) -> u32 {
        self.nodes * self.gpus_per_node
    }
}

#[derive(Clone, Copy, Debug)]
struct Link {
    bandwidth: f64,
    free_at: Nanos,
    bytes: u64,
    /// Fraction of `bandwidth` available now (a `link-slow` fault; 1 otherwise).
    factor: f64,
    /// A cut link carries nothing before this time (a `link-slow` fault with factor 0).
    blocked_until: Nanos,
}

/// Byte counters per kind of link, for results.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkBytes {
    pub network: u64,
    pub pcie: u64,
    pub nvlink: u64,
    pub ssd: u64,
}

/// The state of every link of a cluster.
#[derive(Debug)]
pub struct Network {
    spec: Shape,
    links: Vec<Link>,
    totals: LinkBytes,
}

#[derive(Clone, Copy)]
enum Dir {
    Tx = 0,
    Rx = 1,
}

impl Network {
    /// `nodes` hosts joined by a switched fabric: one NIC per node (and one for the frontend)
    /// of `link.bandwidth` per direction, `link.latency` one way between two nodes; no GPUs and
    /// no SSDs. Pipeline routes use it: their shards exchange activations host to host.
    pub fn fabric(nodes: u32, link: LinkSpec) -> Network {
        let nic = Link {
            bandwidth: link.bandwidth,
            free_at: Nanos::ZERO,
            bytes: 0,
            factor: 1.0,
            blocked_until: Nanos::ZERO,
        };
        Network {
            spec: Shape {
                nodes,
                gpus_per_node: 0,
                nics_per_node: 1,
                inter_node_latency: link.latency,
                nvlink_latency: Nanos::ZERO,
                pcie_latency: Nanos::ZERO,
                ssd_latency: Nanos::ZERO,
                ssds: false,
            },
            links: vec![nic; 2 * (nodes as usize + 1)],
            totals: LinkBytes::default(),
        }
    }

    pub fn new(spec: &HardwareSpec) -> Network {
        let nics = spec.network.nics_per_node as usize;
        let gpus = spec.total_gpus() as usize;
        // Layout: [node NICs tx/rx][frontend NIC tx/rx][GPU PCIe tx/rx][GPU NVLink tx/rx]
        // [node SSD read/write].
        let mut links = Vec::with_capacity(2 * (spec.nodes as usize * nics + 1 + 2 * gpus));
        let nic = Link {
            bandwidth: spec.network.nic.bandwidth,
            free_at: Nanos::ZERO,
            bytes: 0,
            factor: 1.0,
            blocked_until: Nanos::ZERO,
        };
        links.resize(2 * (spec.nodes as usize * nics + 1), nic);
        let pcie = Link {
            bandwidth: spec.pcie.bandwidth,
            ..nic
        };
        links.resize(links.len() + 2 * gpus, pcie);
        let nvlink = Link {
            bandwidth: spec.nvlink.bandwidth,
            ..nic
        };
        links.resize(links.len() + 2 * gpus, nvlink);
        let drives = spec.ssd.drives as f64;
        for _ in 0..spec.nodes {
            links.push(Link {
                bandwidth: drives * spec.ssd.read_bandwidth_per_drive,
                ..nic
            });
            links.push(Link {
                bandwidth: drives * spec.ssd.write_bandwidth_per_drive,
                ..nic
            });
        }
        Network {
            spec: Shape {
                nodes: spec.nodes,
                gpus_per_node: spec.gpus_per_node,
                nics_per_node: spec.network.nics_per_node,
                inter_node_latency: spec.inter_node_latency(),
                nvlink_latency: spec.nvlink.latency,
                pcie_latency: spec.pcie.latency,
                ssd_latency: spec.ssd.latency,
                ssds: true,
            },
            links,
            totals: LinkBytes::default(),
        }
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

    fn gpu_link(&self, node: u32, gpu: u32, base: usize, dir: Dir) -> usize {
        let g = (node * self.spec.gpus_per_node + gpu) as usize;
        base + 2 * g + dir as usize
    }

    fn pcie_base(&self) -> usize {
        2 * (self.spec.nodes as usize * self.spec.nics_per_node as usize + 1)
    }

    fn nvlink_base(&self) -> usize {
        self.pcie_base() + 2 * self.spec.total_gpus() as usize
    }

    /// Moves `bytes` from `from` to `to`, starting no earlier than `now`; returns the arrival
    /// time of the last byte.
    pub fn transfer(&mut self, now: Nanos, from: Place, to: Place, bytes: u64) -> Nanos {
        let path: [usize; 2];
        let latency;
        let kind;
        match (from.node(), to.node()) {
            (a, b) if a != b => {
                path = [
                    self.nic_link(from, to, Dir::Tx),
                    self.nic_link(to, from, Dir::Rx),
                ];
                latency = self.spec.inter_node_latency;
                kind = 0;
            }
            _ => match (from, to) {
                (Place::Gpu { node, gpu: g1 }, Place::Gpu { gpu: g2, .. }) if g1 != g2 => {
                    let base = self.nvlink_base();
                    path = [
                        self.gpu_link(node, g1, base, Dir::Tx),
                        self.gpu_link(node, g2, base, Dir::Rx),
                    ];
                    latency = self.spec.nvlink_latency;
                    kind = 2;
                }
                (Place::Gpu { node, gpu }, Place::Host { .. }) => {
                    let l = self.gpu_link(node, gpu, self.pcie_base(), Dir::Tx);
                    path = [l, l];
                    latency = self.spec.pcie_latency;
                    kind = 1;
                }
                (Place::Host { .. }, Place::Gpu { node, gpu }) => {
                    let l = self.gpu_link(node, gpu, self.pcie_base(), Dir::Rx);
                    path = [l, l];
                    latency = self.spec.pcie_latency;
                    kind = 1;
                }
                // Same place: delivered in memory, at once.
                _ => return now,
            },
        }
        let (a, b) = (&self.links[path[0]], &self.links[path[1]]);
        let bandwidth = (a.bandwidth * a.factor).min(b.bandwidth * b.factor);
        let d = Nanos::for_bytes(bytes, bandwidth);
        let (mut start, mut done) = (now, now);
        for &l in &path[..if path[0] == path[1] { 1 } else { 2 }] {
            let link = &mut self.links[l];
            start = start.max(link.free_at).max(link.blocked_until);
            done = (start + d).max(done);
            link.free_at = done;
            link.bytes += bytes;
        }
        match kind {
            0 => self.totals.network += bytes,
            1 => self.totals.pcie += bytes,
            _ => self.totals.nvlink += bytes,
        }
        done + latency
    }

    /// Sets the NICs of `node` (both directions) to `factor` of their bandwidth, carrying
    /// nothing before `blocked_until` (a `link-slow` fault; `(1.0, ZERO)` restores them). A
    /// transfer is charged the rate of the moment it is issued.
    pub fn set_nics(&mut self, node: u32, factor: f64, blocked_until: Nanos) {
        if node >= self.spec.nodes {
            return;
        }
        let nics = self.spec.nics_per_node as usize;
        let first = 2 * node as usize * nics;
        for link in &mut self.links[first..first + 2 * nics] {
            link.factor = factor;
            link.blocked_until = blocked_until;
        }
    }

    fn ssd_base(&self) -> usize {
        self.nvlink_base() + 2 * self.spec.total_gpus() as usize
    }

    /// Reads or writes `bytes` on `node`'s SSDs (striped over all drives), starting no earlier
    /// than `now`, FIFO per direction; returns when the last byte is done, or `None` when the
    /// node has no SSDs.
    pub fn ssd(&mut self, now: Nanos, node: u32, write: bool, bytes: u64) -> Option<Nanos> {
        if !self.spec.ssds || node >= self.spec.nodes {
            return None;
        }
        let l = self.ssd_base() + 2 * node as usize + write as usize;
        let link = &mut self.links[l];
        let start = now.max(link.free_at);
        let done = start + Nanos::for_bytes(bytes, link.bandwidth);
        link.free_at = done;
        link.bytes += bytes;
        self.totals.ssd += bytes;
        Some(done + self.spec.ssd_latency)
    }

    pub fn totals(&self) -> LinkBytes {
        self.totals
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::*;

    pub(crate) fn small_cluster() -> HardwareSpec {
        HardwareSpec {
            nodes: 2,
            gpus_per_node: 2,
            gpu: GpuSpec {
                name: "test".into(),
                memory_bytes: 16 << 30,
                memory_bandwidth: 1e12,
                peak_flops: 1e14,
                compute_efficiency: 1.0,
                memory_efficiency: 1.0,
            },
            host: HostSpec {
                memory_bytes: 64 << 30,
                memory_bandwidth: 1e11,
            },
            ssd: SsdSpec {
                drives: 1,
                capacity_bytes_per_drive: 1 << 40,
                read_bandwidth_per_drive: 1e9,
                write_bandwidth_per_drive: 1e9,
                latency: Nanos(10_000),
            },
            pcie: LinkSpec {
                bandwidth: 1e10,
                latency: Nanos(1_000),
            },
            nvlink: LinkSpec {
                bandwidth: 1e11,
                latency: Nanos(500),
            },
            network: NetworkSpec {
                nics_per_node: 1,
                nic: LinkSpec {
                    bandwidth: 1e9,
                    latency: Nanos(1_000),
                },
                switch_latency: Nanos(100),
                switch_hops: 3,
            },
        }
    }

    #[test]
    fn a_transfer_costs_bytes_over_bandwidth_plus_path_latency() {
        let mut net = Network::new(&small_cluster());
        // 1 MB at 1 GB/s = 1 ms; latency 2 x 1 us + 3 x 100 ns.
        let t = net.transfer(
            Nanos(0),
            Place::Frontend,
            Place::Host { node: 1 },
            1_000_000,
        );
        assert_eq!(t, Nanos(1_000_000 + 2_300));
    }

    #[test]
    fn transfers_sharing_a_link_queue_behind_each_other() {
        let mut net = Network::new(&small_cluster());
        let a = net.transfer(
            Nanos(0),
            Place::Host { node: 0 },
            Place::Host { node: 1 },
            1_000_000,
        );
        // Same receiving NIC: waits for the first to finish serialising.
        let b = net.transfer(
            Nanos(0),
            Place::Frontend,
            Place::Host { node: 1 },
            1_000_000,
        );
        assert_eq!(b - a, Nanos(1_000_000));
        // Links in the other direction are free: no wait.
        let c = net.transfer(
            Nanos(0),
            Place::Host { node: 1 },
            Place::Host { node: 0 },
            1_000,
        );
        assert_eq!(c, Nanos(1_000 + 2_300));
        // The frontend's transmit side sent `b` from 0 to 1 ms, although `b` only finished on
        // node 1's receiving side at 2 ms: the sender was not held idle.
        let d = net.transfer(Nanos(0), Place::Frontend, Place::Host { node: 0 }, 1_000);
        assert_eq!(d, Nanos(1_000_000 + 1_000 + 2_300));
        assert_eq!(net.totals().network, 2_002_000);
    }

    #[test]
    fn same_place_is_free_and_intra_node_uses_nvlink_or_pcie() {
        let mut net = Network::new(&small_cluster());
        let g0 = Place::Gpu { node: 0, gpu: 0 };
        let g1 = Place::Gpu { node: 0, gpu: 1 };
        assert_eq!(net.transfer(Nanos(5), g0, g0, 1 << 20), Nanos(5));
        assert_eq!(
            net.transfer(Nanos(0), g0, g1, 100_000_000),
            Nanos(1_000_000 + 500)
        );
        assert_eq!(
            net.transfer(Nanos(0), Place::Host { node: 0 }, g1, 10_000_000),
            Nanos(1_000_000 + 1_000)
        );
        assert_eq!(net.totals().nvlink, 100_000_000);
        assert_eq!(net.totals().pcie, 10_000_000);
    }
}
