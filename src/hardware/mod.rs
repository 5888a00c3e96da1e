//! The hardware model: what a cluster is made of, and what moving bytes through it costs.
//!
//! A cluster is `nodes` identical nodes. Each node has `gpus_per_node` GPUs joined by NVLink,
//! one PCIe link per GPU to host memory, NVMe drives, and `nics_per_node` network interfaces
//! that connect it through a switched fabric to every other node. A *frontend* (where clients
//! and the router live) hangs off the same fabric with one interface of the same kind.
//!
//! Every figure comes from the scenario (units in key names) and is turned into SI units
//! here: bytes, bytes per second, FLOP/s, nanoseconds. Nothing downstream sees a string.
//! The cost of transfers over links is modelled in [`network`]; the cost of computing on a
//! GPU follows from [`crate::model::cost`].

pub mod network;

use crate::units::Nanos;

/// One GPU model.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuSpec {
    pub name: String,
    pub memory_bytes: u64,
    /// Peak HBM bandwidth, bytes/s.
    pub memory_bandwidth: f64,
    /// Peak dense FLOP/s at the model's element type.
    pub peak_flops: f64,
    /// Fraction of peak FLOP/s that kernels achieve (0, 1].
    pub compute_efficiency: f64,
    /// Fraction of peak memory bandwidth that kernels achieve (0, 1].
    pub memory_efficiency: f64,
}

#[cfg(test)]
impl GpuSpec {
    /// An A100-SXM4-40GB (datasheet figures) at the given efficiencies, for unit tests.
    pub(crate) fn a100_40gb(compute_efficiency: f64, memory_efficiency: f64) -> GpuSpec {
        GpuSpec {
            name: "A100-SXM4-40GB".into(),
            memory_bytes: 40 << 30,
            memory_bandwidth: 1.555e12,
            peak_flops: 312e12,
            compute_efficiency,
            memory_efficiency,
        }
    }
}

/// Host memory of one node.
#[derive(Clone, Debug, PartialEq)]
pub struct HostSpec {
    pub memory_bytes: u64,
    /// Peak DRAM bandwidth, bytes/s (reads and writes together).
    pub memory_bandwidth: f64,
    /// Fraction of `memory_bandwidth` that copies achieve (0, 1]; see [`defaults`].
    pub memory_efficiency: f64,
}

/// The NVMe drives of one node, striped.
#[derive(Clone, Debug, PartialEq)]
pub struct SsdSpec {
    pub drives: u32,
    pub capacity_bytes_per_drive: u64,
    pub read_bandwidth_per_drive: f64,
    pub write_bandwidth_per_drive: f64,
    pub latency: Nanos,
    /// Fraction of the drives' rated sequential bandwidth that large reads and writes achieve.
    pub efficiency: f64,
}

/// A point-to-point link: line rate in bytes/s (per direction), one-way latency, and the
/// fraction of the line rate that large transfers achieve (protocol headers, flow control,
/// DMA descriptors; see [`defaults`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkSpec {
    pub bandwidth: f64,
    pub latency: Nanos,
    pub efficiency: f64,
}

impl LinkSpec {
    /// A link that achieves its whole line rate.
    pub fn ideal(bandwidth: f64, latency: Nanos) -> LinkSpec {
        LinkSpec {
            bandwidth,
            latency,
            efficiency: 1.0,
        }
    }

    /// The bandwidth large transfers achieve: line rate x efficiency, bytes/s.
    pub fn achievable(&self) -> f64 {
        self.bandwidth * self.efficiency
    }
}

/// Default achievable fractions of line rate, used when a scenario does not give its own.
/// Each is a typical published figure for the kind of link (assumptions to be replaced by
/// measurements of the machine at hand), never a fit to meshsim's results.
pub mod defaults {
    /// RDMA over a 100-200 Gb/s NIC: perftest's `ib_read_bw`/`ib_write_bw` are commonly
    /// reported at 90-97 % of line rate for messages of 64 KiB and more; 0.9 leaves room for
    /// a loaded fabric.
    pub const NIC_EFFICIENCY: f64 = 0.9;
    /// PCIe Gen4 x16: 31.5 GB/s per direction after 128b/130b coding; CUDA's `bandwidthTest`
    /// with pinned memory is commonly reported at 24-26 GB/s between host and an A100 (TLP
    /// headers and DMA descriptors take the rest): 0.8.
    pub const PCIE_EFFICIENCY: f64 = 0.8;
    /// NVLink 3 on A100: 300 GB/s per direction per GPU; peer-to-peer copies and NCCL's bus
    /// bandwidth are commonly reported at 80-90 % of it.
    pub const NVLINK_EFFICIENCY: f64 = 0.85;
    /// DDR4 host memory: STREAM copy commonly reaches 70-80 % of the channels' peak on
    /// 8-channel EPYC servers.
    pub const HOST_MEMORY_EFFICIENCY: f64 = 0.75;
    /// NVMe drives are rated at their sequential large-block throughput, which large reads
    /// and writes reach: 1.
    pub const SSD_EFFICIENCY: f64 = 1.0;
}

/// The fabric between nodes.
#[derive(Clone, Debug, PartialEq)]
pub struct NetworkSpec {
    pub nics_per_node: u32,
    pub nic: LinkSpec,
    pub switch_latency: Nanos,
    pub switch_hops: u32,
    /// How a load from another node's host memory reaches a GPU, unless a policy says
    /// otherwise (`hardware.network.remote_kv_path`).
    pub remote_kv_path: RemoteKvPath,
}

/// How a load from another node's host memory (or SSDs) reaches a GPU
/// (`hardware.network.remote_kv_path`, and a store policy's `remote_kv_path`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RemoteKvPath {
    /// GPUDirect RDMA: the owner's DRAM, both NICs, the reader's PCIe, as one transfer.
    #[default]
    Gpudirect,
    /// Staged through the reader's host memory hop after hop: the owner's DRAM and both NICs
    /// into the reader's DRAM, and once that has arrived, the reader's DRAM and PCIe into the
    /// GPU (a connector that receives a chunk into a host buffer, then copies it in).
    HostStaged,
    /// Staged through the reader's host memory and pipelined (chunk by chunk, so the two
    /// hops overlap): one transfer over the owner's DRAM, both NICs, the reader's DRAM
    /// twice (written, then read) and its PCIe.
    HostPipelined,
}

/// A whole cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct HardwareSpec {
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub gpu: GpuSpec,
    pub host: HostSpec,
    pub ssd: SsdSpec,
    pub pcie: LinkSpec,
    pub nvlink: LinkSpec,
    pub network: NetworkSpec,
}

impl HardwareSpec {
    pub fn total_gpus(&self) -> u32 {
        self.nodes * self.gpus_per_node
    }

    /// One-way latency of a message between two different nodes: leave a NIC, cross
    /// `switch_hops` switches, enter a NIC.
    pub fn inter_node_latency(&self) -> Nanos {
        let n = &self.network;
        Nanos(2 * n.nic.latency.0 + n.switch_hops as u64 * n.switch_latency.0)
    }
}

/// Where an actor runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Place {
    /// The frontend host that runs clients and the router.
    Frontend,
    /// The host CPU of a node.
    Host { node: u32 },
    /// A GPU (the first of a tensor-parallel group).
    Gpu { node: u32, gpu: u32 },
}

impl Place {
    pub fn node(self) -> Option<u32> {
        match self {
            Place::Frontend => None,
            Place::Host { node } | Place::Gpu { node, .. } => Some(node),
        }
    }
}
