//! The `[hardware]` tables: the cluster of a serving scenario, and the GPU that pipeline
//! scenarios also describe.

use serde::Deserialize;

use super::{Check, ScenarioError, catalogue};
use crate::hardware::{
    GpuSpec, HardwareSpec, HostSpec, LinkSpec, NetworkSpec, RemoteKvPath, SsdSpec, defaults,
};
use crate::units::{GB, GIB, Nanos};

/// Largest cluster.
pub const MAX_GPUS: u32 = 65_536;

/// `[hardware]`. Every figure may come from a preset of the catalogue
/// ([`super::catalogue`]): `preset` names a node, `gpu.preset` a GPU; a key written here
/// replaces the preset's.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHardware {
    pub preset: Option<String>,
    pub nodes: Option<u32>,
    pub gpus_per_node: Option<u32>,
    pub gpu: Option<RawGpu>,
    pub host: Option<RawHost>,
    pub ssd: Option<RawSsd>,
    pub pcie: Option<RawLink>,
    pub nvlink: Option<RawLink>,
    pub network: Option<RawNetwork>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGpu {
    pub preset: Option<String>,
    pub name: Option<String>,
    pub memory_gib: Option<f64>,
    pub memory_bandwidth_gb_per_s: Option<f64>,
    pub peak_tflops: Option<f64>,
    pub compute_efficiency: Option<f64>,
    pub memory_efficiency: Option<f64>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHost {
    pub memory_gib: Option<f64>,
    pub memory_bandwidth_gb_per_s: Option<f64>,
    /// Default [`defaults::HOST_MEMORY_EFFICIENCY`].
    pub memory_efficiency: Option<f64>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSsd {
    pub drives: Option<u32>,
    pub capacity_gb_per_drive: Option<f64>,
    pub read_bandwidth_gb_per_s_per_drive: Option<f64>,
    pub write_bandwidth_gb_per_s_per_drive: Option<f64>,
    pub latency_us: Option<f64>,
    /// Default [`defaults::SSD_EFFICIENCY`].
    pub efficiency: Option<f64>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLink {
    pub bandwidth_gb_per_s: Option<f64>,
    pub latency_ns: Option<u64>,
    /// Default per kind of link: [`defaults::PCIE_EFFICIENCY`], [`defaults::NVLINK_EFFICIENCY`].
    pub efficiency: Option<f64>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNetwork {
    pub nics_per_node: Option<u32>,
    pub nic_bandwidth_gbit_per_s: Option<f64>,
    pub nic_latency_ns: Option<u64>,
    pub switch_latency_ns: Option<u64>,
    pub switch_hops: Option<u32>,
    /// Default [`defaults::NIC_EFFICIENCY`].
    pub nic_efficiency: Option<f64>,
    /// Default `"gpudirect"` (see [`crate::hardware::RemoteKvPath`]).
    pub remote_kv_path: Option<RemoteKvPath>,
}

/// A table whose keys, where missing, are taken from a base table (a preset's).
pub(crate) trait Overlay: Sized {
    fn over(self, base: Self) -> Self;
}

impl<T: Overlay> Overlay for Option<T> {
    fn over(self, base: Self) -> Self {
        match (self, base) {
            (Some(a), Some(b)) => Some(a.over(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Implements [`Overlay`] for a raw table: each key is its own, or the base's.
macro_rules! overlay {
    ($t:ident { $($plain:ident),* } $(tables { $($table:ident),* })?) => {
        impl Overlay for $t {
            fn over(self, base: Self) -> Self {
                $t {
                    $($plain: self.$plain.or(base.$plain),)*
                    $($($table: self.$table.over(base.$table),)*)?
                }
            }
        }
    };
}

overlay!(RawGpu {
    preset,
    name,
    memory_gib,
    memory_bandwidth_gb_per_s,
    peak_tflops,
    compute_efficiency,
    memory_efficiency
});
overlay!(RawHost {
    memory_gib,
    memory_bandwidth_gb_per_s,
    memory_efficiency
});
overlay!(RawSsd {
    drives,
    capacity_gb_per_drive,
    read_bandwidth_gb_per_s_per_drive,
    write_bandwidth_gb_per_s_per_drive,
    latency_us,
    efficiency
});
overlay!(RawLink {
    bandwidth_gb_per_s,
    latency_ns,
    efficiency
});
overlay!(RawNetwork {
    nics_per_node,
    nic_bandwidth_gbit_per_s,
    nic_latency_ns,
    switch_latency_ns,
    switch_hops,
    nic_efficiency,
    remote_kv_path
});
overlay!(RawHardware { preset, nodes, gpus_per_node } tables { gpu, host, ssd, pcie, nvlink,
    network });

/// The value of `key`, which must be given (by the scenario or a preset).
pub(crate) fn need<T>(c: &Check, key: &str, v: Option<T>) -> Result<T, ScenarioError> {
    v.ok_or_else(|| {
        c.err(
            key,
            "missing: give it, or name a preset that has it (hardware.preset, \
             hardware.gpu.preset; docs/scenarios.md lists them)",
        )
    })
}

/// A validated GPU from its raw table at `key` (its `preset`, if any, gives the keys it
/// leaves out).
pub(crate) fn gpu_spec(c: &Check, key: &str, g: &RawGpu) -> Result<GpuSpec, ScenarioError> {
    let g = match &g.preset {
        Some(name) => g
            .clone()
            .over(catalogue::gpu(c, &format!("{key}.preset"), name)?.gpu),
        None => g.clone(),
    };
    let k = |f: &str| format!("{key}.{f}");
    let f = |name: &str, v: Option<f64>| need(c, &k(name), v);
    Ok(GpuSpec {
        name: need(c, &k("name"), g.name)?,
        memory_bytes: (c.positive(&k("memory_gib"), f("memory_gib", g.memory_gib)?)? * GIB as f64)
            as u64,
        memory_bandwidth: c.positive(
            &k("memory_bandwidth_gb_per_s"),
            f("memory_bandwidth_gb_per_s", g.memory_bandwidth_gb_per_s)?,
        )? * GB,
        peak_flops: c.positive(&k("peak_tflops"), f("peak_tflops", g.peak_tflops)?)? * 1e12,
        compute_efficiency: c.fraction(
            &k("compute_efficiency"),
            f("compute_efficiency", g.compute_efficiency)?,
        )?,
        memory_efficiency: c.fraction(
            &k("memory_efficiency"),
            f("memory_efficiency", g.memory_efficiency)?,
        )?,
    })
}

/// `[hardware]` with the keys its presets give where it leaves them out: the scenario's own
/// keys over the GPU preset's (named by `gpu.preset`, or else by the node preset's GPU),
/// over the node preset's.
pub(crate) fn resolve(c: &Check, h: &RawHardware) -> Result<RawHardware, ScenarioError> {
    let own = h.clone();
    let node = match &h.preset {
        Some(name) => catalogue::node(c, "hardware.preset", name)?,
        None => RawHardware::default(),
    };
    let gpu_name = own
        .gpu
        .as_ref()
        .and_then(|g| g.preset.clone())
        .map(|n| (n, "hardware.gpu.preset"))
        .or_else(|| {
            let g = node.gpu.as_ref()?.preset.clone()?;
            Some((g, "hardware.preset"))
        });
    let gpu = match gpu_name {
        Some((name, key)) => {
            let e = catalogue::gpu(c, key, &name)?;
            RawHardware {
                gpu: Some(RawGpu {
                    preset: Some(name),
                    ..e.gpu
                }),
                pcie: e.pcie,
                nvlink: e.nvlink,
                ..RawHardware::default()
            }
        }
        None => RawHardware::default(),
    };
    let mut all = own.over(gpu.over(node));
    // The GPU's figures are in; `gpu_spec` need not look its preset up again.
    if let Some(g) = &mut all.gpu {
        g.preset = None;
    }
    Ok(all)
}

/// The validated cluster of a `[hardware]` table (its presets resolved by [`resolve`]).
pub(crate) fn hardware(c: &Check, h: &RawHardware) -> Result<HardwareSpec, ScenarioError> {
    let h = resolve(c, h)?;
    let nodes = need(c, "hardware.nodes", h.nodes)?;
    let gpus_per_node = need(c, "hardware.gpus_per_node", h.gpus_per_node)?;
    c.count("hardware.nodes", nodes, MAX_GPUS)?;
    c.count("hardware.gpus_per_node", gpus_per_node, 64)?;
    if nodes.saturating_mul(gpus_per_node) > MAX_GPUS {
        return Err(c.err(
            "hardware.nodes",
            format!("more than {MAX_GPUS} GPUs in all"),
        ));
    }
    let gpu = gpu_spec(c, "hardware.gpu", &need(c, "hardware.gpu", h.gpu)?)?;
    let hh = need(c, "hardware.host", h.host)?;
    let host = HostSpec {
        memory_bytes: (c.positive(
            "hardware.host.memory_gib",
            need(c, "hardware.host.memory_gib", hh.memory_gib)?,
        )? * GIB as f64) as u64,
        memory_bandwidth: c.positive(
            "hardware.host.memory_bandwidth_gb_per_s",
            need(
                c,
                "hardware.host.memory_bandwidth_gb_per_s",
                hh.memory_bandwidth_gb_per_s,
            )?,
        )? * GB,
        memory_efficiency: c.fraction(
            "hardware.host.memory_efficiency",
            hh.memory_efficiency
                .unwrap_or(defaults::HOST_MEMORY_EFFICIENCY),
        )?,
    };
    let ssd = ssd_spec(c, need(c, "hardware.ssd", h.ssd)?)?;
    let network = network_spec(c, need(c, "hardware.network", h.network)?)?;
    let pcie = need(c, "hardware.pcie", h.pcie)?;
    let nvlink = need(c, "hardware.nvlink", h.nvlink)?;
    Ok(HardwareSpec {
        nodes,
        gpus_per_node,
        gpu,
        host,
        ssd,
        pcie: c.link("hardware.pcie", &pcie, defaults::PCIE_EFFICIENCY)?,
        nvlink: c.link("hardware.nvlink", &nvlink, defaults::NVLINK_EFFICIENCY)?,
        network,
    })
}

/// `[hardware.ssd]`, validated.
fn ssd_spec(c: &Check, sd: RawSsd) -> Result<SsdSpec, ScenarioError> {
    let sf = |key: &str, v: Option<f64>| need(c, &format!("hardware.ssd.{key}"), v);
    Ok(SsdSpec {
        drives: c.count(
            "hardware.ssd.drives",
            need(c, "hardware.ssd.drives", sd.drives)?,
            64,
        )?,
        capacity_bytes_per_drive: (c.positive(
            "hardware.ssd.capacity_gb_per_drive",
            sf("capacity_gb_per_drive", sd.capacity_gb_per_drive)?,
        )? * GB) as u64,
        read_bandwidth_per_drive: c.positive(
            "hardware.ssd.read_bandwidth_gb_per_s_per_drive",
            sf(
                "read_bandwidth_gb_per_s_per_drive",
                sd.read_bandwidth_gb_per_s_per_drive,
            )?,
        )? * GB,
        write_bandwidth_per_drive: c.positive(
            "hardware.ssd.write_bandwidth_gb_per_s_per_drive",
            sf(
                "write_bandwidth_gb_per_s_per_drive",
                sd.write_bandwidth_gb_per_s_per_drive,
            )?,
        )? * GB,
        latency: Nanos::from_secs_f64(
            c.positive("hardware.ssd.latency_us", sf("latency_us", sd.latency_us)?)? / 1e6,
        ),
        efficiency: c.fraction(
            "hardware.ssd.efficiency",
            sd.efficiency.unwrap_or(defaults::SSD_EFFICIENCY),
        )?,
    })
}

/// `[hardware.network]`, validated.
fn network_spec(c: &Check, n: RawNetwork) -> Result<NetworkSpec, ScenarioError> {
    let nk = |key: &str| format!("hardware.network.{key}");
    let switch_hops = need(c, &nk("switch_hops"), n.switch_hops)?;
    Ok(NetworkSpec {
        nics_per_node: c.count(
            &nk("nics_per_node"),
            need(c, &nk("nics_per_node"), n.nics_per_node)?,
            64,
        )?,
        nic: LinkSpec {
            bandwidth: c.positive(
                &nk("nic_bandwidth_gbit_per_s"),
                need(
                    c,
                    &nk("nic_bandwidth_gbit_per_s"),
                    n.nic_bandwidth_gbit_per_s,
                )?,
            )? * GB
                / 8.0,
            latency: c.latency(
                &nk("nic_latency_ns"),
                need(c, &nk("nic_latency_ns"), n.nic_latency_ns)?,
            )?,
            efficiency: c.fraction(
                &nk("nic_efficiency"),
                n.nic_efficiency.unwrap_or(defaults::NIC_EFFICIENCY),
            )?,
        },
        switch_latency: c.latency(
            &nk("switch_latency_ns"),
            need(c, &nk("switch_latency_ns"), n.switch_latency_ns)?,
        )?,
        switch_hops: if switch_hops <= 64 {
            switch_hops
        } else {
            return Err(c.err(
                "hardware.network.switch_hops",
                format!("expected at most 64, found {switch_hops}"),
            ));
        },
        remote_kv_path: n.remote_kv_path.unwrap_or_default(),
    })
}
