//! Tiers: where reused prefix tokens and loaded KV bytes come from. A dimension of the
//! results (`reused_<tier>_tokens`, `loaded_<tier>_bytes`), and the vocabulary policies and
//! stores use to say where they look.

/// Where reused prefix tokens come from. Columns of the results follow this order.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Tier {
    /// The serving instance's own GPU memory.
    Gpu = 0,
    /// Host memory of the instance's node.
    LocalHost = 1,
    /// NVMe SSD of the instance's node.
    LocalSsd = 2,
    /// Host memory of another node.
    RemoteHost = 3,
    /// NVMe SSD of another node.
    RemoteSsd = 4,
}

impl Tier {
    pub const ALL: [Tier; 5] = [
        Tier::Gpu,
        Tier::LocalHost,
        Tier::LocalSsd,
        Tier::RemoteHost,
        Tier::RemoteSsd,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Tier::Gpu => "gpu",
            Tier::LocalHost => "local_host",
            Tier::LocalSsd => "local_ssd",
            Tier::RemoteHost => "remote_host",
            Tier::RemoteSsd => "remote_ssd",
        }
    }
}
