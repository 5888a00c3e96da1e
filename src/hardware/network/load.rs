//! What the links carried over a run: the bytes that crossed each kind of link, by purpose,
//! and how busy each kind was ([`LinkLoad`]).
//!
//! **Bytes.** A transfer adds its bytes to each link of its path, counted by the link's kind:
//! the NIC once per transfer (at the sending NIC: every byte sent is received by another
//! NIC), NVLink once (at the sending port), host DRAM once per crossing (a load staged
//! through the reader's host memory writes it there and reads it again: twice), PCIe by
//! direction (to the GPU, to the host), SSD reads and writes apart. Each transfer has one
//! [`Purpose`], said by whoever starts it; [`LinkLoad::moved`] counts its bytes once, whatever
//! it crosses (a load staged hop after hop is one load).
//!
//! **Busy time.** A link is busy while at least one transfer is on it: a flow of the fair
//! share from its start to its last byte, a small message for its own transmission time at
//! its share (overlapping messages on an idle link counted once). A busy link need not run
//! at full speed (its flows may be held back elsewhere on their paths); the mean rate says
//! how much it carried. Both are over the run's span, from time 0 to its last event. The
//! frontend's NIC is not a node's, and is left out of the NIC kind's busy fractions (its
//! bytes count).

use crate::units::Nanos;

/// What a transfer is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// Reading stored K/V into a GPU (from host memory or SSD, local or remote).
    Load,
    /// Writing computed K/V into a store.
    Store,
    /// Writing a replica of K/V a node read from another.
    Replication,
    /// Moving stored K/V from host memory down to SSD.
    Demotion,
    /// Everything else: requests, tokens, lookups, control messages, activations.
    Message,
}

impl Purpose {
    pub const ALL: [Purpose; 5] = [
        Purpose::Load,
        Purpose::Store,
        Purpose::Replication,
        Purpose::Demotion,
        Purpose::Message,
    ];

    /// Its name in column names.
    pub fn name(self) -> &'static str {
        match self {
            Purpose::Load => "load",
            Purpose::Store => "store",
            Purpose::Replication => "replication",
            Purpose::Demotion => "demotion",
            Purpose::Message => "message",
        }
    }
}

/// The kinds of link (see the module doc of [`super`] for what each is).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkKind {
    Nic,
    PcieToGpu,
    PcieToHost,
    Dram,
    SsdRead,
    SsdWrite,
    Nvlink,
}

impl LinkKind {
    pub const ALL: [LinkKind; 7] = [
        LinkKind::Nic,
        LinkKind::PcieToGpu,
        LinkKind::PcieToHost,
        LinkKind::Dram,
        LinkKind::SsdRead,
        LinkKind::SsdWrite,
        LinkKind::Nvlink,
    ];

    /// Its name in column names.
    pub fn name(self) -> &'static str {
        match self {
            LinkKind::Nic => "nic",
            LinkKind::PcieToGpu => "pcie_to_gpu",
            LinkKind::PcieToHost => "pcie_to_host",
            LinkKind::Dram => "dram",
            LinkKind::SsdRead => "ssd_read",
            LinkKind::SsdWrite => "ssd_write",
            LinkKind::Nvlink => "nvlink",
        }
    }

    /// Its name for readers.
    pub fn label(self) -> &'static str {
        match self {
            LinkKind::Nic => "NIC",
            LinkKind::PcieToGpu => "PCIe to GPU",
            LinkKind::PcieToHost => "PCIe to host",
            LinkKind::Dram => "host DRAM",
            LinkKind::SsdRead => "SSD read",
            LinkKind::SsdWrite => "SSD write",
            LinkKind::Nvlink => "NVLink",
        }
    }
}

/// What the links of a cluster carried over a run.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LinkLoad {
    /// Bytes that crossed links of each kind ([`LinkKind::ALL`] order), by purpose
    /// ([`Purpose::ALL`] order).
    pub bytes: [[u64; 5]; 7],
    /// Bytes of the transfers of each purpose, once per transfer.
    pub moved: [u64; 5],
    /// Per kind, the mean over its links of the fraction of the span they were busy, and the
    /// largest fraction of one link.
    pub busy: [f64; 7],
    pub busiest: [f64; 7],
    /// Links of each kind: NICs of the nodes, GPUs (PCIe, NVLink), nodes (DRAM, SSD).
    pub links: [u32; 7],
    /// The span the fractions and rates are over: time 0 to the run's last event.
    pub span: Nanos,
}

impl LinkLoad {
    /// Bytes that crossed links of `kind`, whatever their purpose.
    pub fn kind_bytes(&self, kind: LinkKind) -> u64 {
        self.bytes[kind as usize].iter().sum()
    }

    /// Bytes that crossed links of `kind` for `purpose`.
    pub fn of(&self, kind: LinkKind, purpose: Purpose) -> u64 {
        self.bytes[kind as usize][purpose as usize]
    }

    /// The mean rate of one link of `kind` over the span, bytes/s (0 without links or span).
    pub fn rate_per_link(&self, kind: LinkKind) -> f64 {
        let (links, secs) = (self.links[kind as usize], self.span.as_secs_f64());
        if links == 0 || secs <= 0.0 {
            return 0.0;
        }
        self.kind_bytes(kind) as f64 / secs / links as f64
    }
}

/// Where a link's bytes and busy time go: its kind, whether a transfer crossing it counts
/// its bytes there (the receiving sides of NICs and NVLink do not: the sending side did),
/// and whether its busy time counts toward the kind's (the frontend's NIC does not).
#[derive(Clone, Copy, Debug)]
pub(super) struct LinkRole {
    pub(super) kind: LinkKind,
    pub(super) counts_bytes: bool,
    pub(super) counts_busy: bool,
}

/// Busy time of one link: closed intervals so far, the open one's start while transfers
/// are on it, and the end of the last small message counted on it while it was idle.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Busy {
    closed: u64,
    since: Nanos,
    mice_until: Nanos,
}

impl Busy {
    /// The first transfer of the fair share came onto the idle link at `now`: small
    /// messages counted past `now` overlap the interval that opens.
    pub(super) fn open(&mut self, now: Nanos) {
        if self.mice_until > now {
            self.closed = self.closed.saturating_sub((self.mice_until - now).0);
            self.mice_until = now;
        }
        self.since = now;
    }

    /// The last flow left the link at `now`.
    pub(super) fn close(&mut self, now: Nanos) {
        self.closed += (now - self.since).0;
    }

    /// A small message crossed the idle link from `start` to `end` (messages start in time
    /// order, so overlapping ones extend the last).
    pub(super) fn mouse(&mut self, start: Nanos, end: Nanos) {
        let from = start.max(self.mice_until);
        if end > from {
            self.closed += (end - from).0;
            self.mice_until = end;
        }
    }

    /// Busy nanoseconds up to `end`, with the open interval when `open`.
    pub(super) fn until(&self, end: Nanos, open: bool) -> u64 {
        let open = if open && end > self.since {
            (end - self.since).0
        } else {
            0
        };
        (self.closed + open).min(end.0)
    }
}
