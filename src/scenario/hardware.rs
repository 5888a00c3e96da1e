//! The `[hardware]` tables: the cluster of a serving scenario, and the GPU that pipeline
//! scenarios also describe.

use serde::Deserialize;

use super::{Check, ScenarioError};
use crate::hardware::{
    GpuSpec, HardwareSpec, HostSpec, LinkSpec, NetworkSpec, RemoteKvPath, SsdSpec, defaults,
};
use crate::units::{GB, GIB, Nanos};

/// Largest cluster.
pub const MAX_GPUS: u32 = 65_536;
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHardware {
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub gpu: RawGpu,
    pub host: RawHost,
    pub ssd: RawSsd,
    pub pcie: RawLink,
    pub nvlink: RawLink,
    pub network: RawNetwork,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGpu {
    pub name: String,
    pub memory_gib: f64,
    pub memory_bandwidth_gb_per_s: f64,
    pub peak_tflops: f64,
    pub compute_efficiency: f64,
    pub memory_efficiency: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHost {
    pub memory_gib: f64,
    pub memory_bandwidth_gb_per_s: f64,
    /// Default [`defaults::HOST_MEMORY_EFFICIENCY`].
    pub memory_efficiency: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSsd {
    pub drives: u32,
    pub capacity_gb_per_drive: f64,
    pub read_bandwidth_gb_per_s_per_drive: f64,
    pub write_bandwidth_gb_per_s_per_drive: f64,
    pub latency_us: f64,
    /// Default [`defaults::SSD_EFFICIENCY`].
    pub efficiency: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLink {
    pub bandwidth_gb_per_s: f64,
    pub latency_ns: u64,
    /// Default per kind of link: [`defaults::PCIE_EFFICIENCY`], [`defaults::NVLINK_EFFICIENCY`].
    pub efficiency: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNetwork {
    pub nics_per_node: u32,
    pub nic_bandwidth_gbit_per_s: f64,
    pub nic_latency_ns: u64,
    pub switch_latency_ns: u64,
    pub switch_hops: u32,
    /// Default [`defaults::NIC_EFFICIENCY`].
    pub nic_efficiency: Option<f64>,
    /// Default `"gpudirect"` (see [`crate::hardware::RemoteKvPath`]).
    #[serde(default)]
    pub remote_kv_path: RemoteKvPath,
}

/// A validated GPU from its raw table at `key`.
pub(crate) fn gpu_spec(c: &Check, key: &str, g: &RawGpu) -> Result<GpuSpec, ScenarioError> {
    let k = |f: &str| format!("{key}.{f}");
    Ok(GpuSpec {
        name: g.name.clone(),
        memory_bytes: (c.positive(&k("memory_gib"), g.memory_gib)? * GIB as f64) as u64,
        memory_bandwidth: c
            .positive(&k("memory_bandwidth_gb_per_s"), g.memory_bandwidth_gb_per_s)?
            * GB,
        peak_flops: c.positive(&k("peak_tflops"), g.peak_tflops)? * 1e12,
        compute_efficiency: c.fraction(&k("compute_efficiency"), g.compute_efficiency)?,
        memory_efficiency: c.fraction(&k("memory_efficiency"), g.memory_efficiency)?,
    })
}

/// The validated cluster of a `[hardware]` table.
pub(crate) fn hardware(c: &Check, h: &RawHardware) -> Result<HardwareSpec, ScenarioError> {
    c.count("hardware.nodes", h.nodes, MAX_GPUS)?;
    c.count("hardware.gpus_per_node", h.gpus_per_node, 64)?;
    if h.nodes.saturating_mul(h.gpus_per_node) > MAX_GPUS {
        return Err(c.err(
            "hardware.nodes",
            format!("more than {MAX_GPUS} GPUs in all"),
        ));
    }
    let gpu = gpu_spec(c, "hardware.gpu", &h.gpu)?;
    let host = HostSpec {
        memory_bytes: (c.positive("hardware.host.memory_gib", h.host.memory_gib)? * GIB as f64)
            as u64,
        memory_bandwidth: c.positive(
            "hardware.host.memory_bandwidth_gb_per_s",
            h.host.memory_bandwidth_gb_per_s,
        )? * GB,
        memory_efficiency: c.fraction(
            "hardware.host.memory_efficiency",
            h.host
                .memory_efficiency
                .unwrap_or(defaults::HOST_MEMORY_EFFICIENCY),
        )?,
    };
    let ssd = SsdSpec {
        drives: c.count("hardware.ssd.drives", h.ssd.drives, 64)?,
        capacity_bytes_per_drive: (c.positive(
            "hardware.ssd.capacity_gb_per_drive",
            h.ssd.capacity_gb_per_drive,
        )? * GB) as u64,
        read_bandwidth_per_drive: c.positive(
            "hardware.ssd.read_bandwidth_gb_per_s_per_drive",
            h.ssd.read_bandwidth_gb_per_s_per_drive,
        )? * GB,
        write_bandwidth_per_drive: c.positive(
            "hardware.ssd.write_bandwidth_gb_per_s_per_drive",
            h.ssd.write_bandwidth_gb_per_s_per_drive,
        )? * GB,
        latency: Nanos::from_secs_f64(
            c.positive("hardware.ssd.latency_us", h.ssd.latency_us)? / 1e6,
        ),
        efficiency: c.fraction(
            "hardware.ssd.efficiency",
            h.ssd.efficiency.unwrap_or(defaults::SSD_EFFICIENCY),
        )?,
    };
    let network = NetworkSpec {
        nics_per_node: c.count(
            "hardware.network.nics_per_node",
            h.network.nics_per_node,
            64,
        )?,
        nic: LinkSpec {
            bandwidth: c.positive(
                "hardware.network.nic_bandwidth_gbit_per_s",
                h.network.nic_bandwidth_gbit_per_s,
            )? * GB
                / 8.0,
            latency: c.latency("hardware.network.nic_latency_ns", h.network.nic_latency_ns)?,
            efficiency: c.fraction(
                "hardware.network.nic_efficiency",
                h.network.nic_efficiency.unwrap_or(defaults::NIC_EFFICIENCY),
            )?,
        },
        switch_latency: c.latency(
            "hardware.network.switch_latency_ns",
            h.network.switch_latency_ns,
        )?,
        switch_hops: if h.network.switch_hops <= 64 {
            h.network.switch_hops
        } else {
            return Err(c.err(
                "hardware.network.switch_hops",
                format!("expected at most 64, found {}", h.network.switch_hops),
            ));
        },
        remote_kv_path: h.network.remote_kv_path,
    };
    Ok(HardwareSpec {
        nodes: h.nodes,
        gpus_per_node: h.gpus_per_node,
        gpu,
        host,
        ssd,
        pcie: c.link("hardware.pcie", &h.pcie, defaults::PCIE_EFFICIENCY)?,
        nvlink: c.link("hardware.nvlink", &h.nvlink, defaults::NVLINK_EFFICIENCY)?,
        network,
    })
}
