//! The flows in the fair share, and max-min fair rates by progressive filling (see the module
//! doc of [`super`]).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::load::Busy;
use crate::units::Nanos;

/// A flow's slot; reused after the flow ends (versions tell its occupants apart).
pub type FlowId = u32;

/// A flow's new finish time: schedule a finish event for (`flow`, `version`) at `at`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reschedule {
    pub flow: FlowId,
    pub version: u32,
    pub at: Nanos,
}

/// A link's record.
#[derive(Clone, Debug)]
struct Link {
    /// Achievable bandwidth at full speed, bytes/s.
    capacity: f64,
    /// Fraction of `capacity` available now (a `link-slow` fault; 0 when cut).
    factor: f64,
    /// Small messages cross a cut link after this time.
    blocked_until: Nanos,
    /// The flows on this link, once per time their path crosses it.
    flows: Vec<FlowId>,
    /// When it had transfers on it.
    busy: Busy,
    // Scratch for progressive filling.
    left: f64,
    stamp: u32,
    unfixed: u32,
}

impl Link {
    fn bandwidth(&self) -> f64 {
        self.capacity * self.factor
    }

    /// Its share in progressive filling: what is left of its bandwidth over its unfixed
    /// flows.
    #[inline]
    fn share(&self) -> f64 {
        self.left.max(0.0) / self.unfixed as f64
    }
}

/// A flow's record: its path, its rates and its progress (bytes left, since when, latency).
#[derive(Clone, Debug)]
struct Flow {
    links: [u32; super::MAX_PATH],
    len: u8,
    live: bool,
    /// Scratch for progressive filling (with `new_rate`).
    stamp: u32,
    /// Bumped when it starts, when its rate changes and when it ends: a finish event of an
    /// older version is stale.
    version: u32,
    new_rate: f64,
    /// Bytes/s since `updated`.
    rate: f64,
    /// Bytes still to send at `updated`.
    remaining: f64,
    updated: Nanos,
    latency: Nanos,
}

/// Every link's bandwidth and the flows sharing them.
#[derive(Debug)]
pub(super) struct Flows {
    links: Vec<Link>,
    flows: Vec<Flow>,
    free: Vec<FlowId>,
    active: usize,
    stamp: u32,
    pending: Vec<Reschedule>,
    // Scratch: the component being reshared.
    comp_links: Vec<u32>,
    comp_flows: Vec<FlowId>,
    /// Scratch: links by share, then id ([`share_key`]).
    heap: BinaryHeap<Reverse<u128>>,
    /// Tests only: progressive filling pops every entry instead of stopping once every flow
    /// is fixed (the reference the early stop is checked against).
    #[cfg(test)]
    exhaustive: bool,
}

/// A link's place in the progressive filling's heap: its share (the bits of a non-negative
/// `f64` order like the number), then its id, in one number, so that two compare in one
/// comparison. A link has at most one entry in the heap at a time, so no two are equal.
fn share_key(share: f64, link: u32) -> u128 {
    u128::from(share.to_bits()) << 32 | u128::from(link)
}

/// Nanoseconds to send `bytes` at `rate` bytes/s, rounded up.
fn duration(bytes: f64, rate: f64) -> Nanos {
    // Bounded: a transfer longer than ~584 years is as good as never.
    Nanos(crate::units::ceil_u64(bytes.max(0.0) / rate * 1e9).unwrap_or(u64::MAX / 2))
}

impl Flows {
    pub(super) fn new(capacities: Vec<f64>) -> Flows {
        Flows {
            links: capacities
                .into_iter()
                .map(|capacity| Link {
                    capacity,
                    factor: 1.0,
                    blocked_until: Nanos::ZERO,
                    flows: Vec::new(),
                    busy: Busy::default(),
                    stamp: 0,
                    left: 0.0,
                    unfixed: 0,
                })
                .collect(),
            flows: Vec::new(),
            free: Vec::new(),
            active: 0,
            stamp: 0,
            pending: Vec::new(),
            comp_links: Vec::new(),
            comp_flows: Vec::new(),
            heap: BinaryHeap::new(),
            #[cfg(test)]
            exhaustive: false,
        }
    }

    /// Every live flow's rate and path, and every link's bandwidth now (for tests).
    #[cfg(test)]
    pub(super) fn snapshot(&self) -> (Vec<(f64, Vec<u32>)>, Vec<f64>) {
        let flows = self
            .flows
            .iter()
            .filter(|f| f.live)
            .map(|f| (f.rate, f.links[..f.len as usize].to_vec()))
            .collect();
        (flows, self.links.iter().map(Link::bandwidth).collect())
    }

    /// Makes progressive filling pop every entry of its heap (for tests: the reference of
    /// the early stop).
    #[cfg(test)]
    pub(super) fn set_exhaustive(&mut self) {
        self.exhaustive = true;
    }

    /// Sets the re-shares' mark (for tests: `u32::MAX` makes the next one wrap).
    #[cfg(test)]
    pub(super) fn set_stamp(&mut self, stamp: u32) {
        self.stamp = stamp;
    }

    pub(super) fn active(&self) -> usize {
        self.active
    }

    /// When a small message of `bytes` that starts at `now` has crossed `path` at the fair
    /// share it gets there: the bottleneck's `bandwidth / (flows + 1)`.
    pub(super) fn mouse(&self, now: Nanos, path: &[u32], bytes: u64) -> Nanos {
        self.mouse_span(now, path, bytes).1
    }

    /// When a small message of `bytes` that starts at `now` leaves (a cut link holds it) and
    /// when it has crossed `path`.
    fn mouse_span(&self, now: Nanos, path: &[u32], bytes: u64) -> (Nanos, Nanos) {
        let mut start = now;
        let mut rate = f64::INFINITY;
        for &l in path {
            let link = &self.links[l as usize];
            // A cut link carries the message once it is back, at its full bandwidth.
            start = start.max(link.blocked_until);
            let bw = if link.factor > 0.0 {
                link.bandwidth()
            } else {
                link.capacity
            };
            rate = rate.min(bw / (link.flows.len() + 1) as f64);
        }
        (start, start + duration(bytes as f64, rate))
    }

    /// Sends a small message as [`Self::mouse`] prices it, counting its transmission as busy
    /// time of the links on its path that carry no flow.
    pub(super) fn send_mouse(&mut self, now: Nanos, path: &[u32], bytes: u64) -> Nanos {
        let (start, end) = self.mouse_span(now, path, bytes);
        for &l in path {
            let link = &mut self.links[l as usize];
            if link.flows.is_empty() {
                link.busy.mouse(start, end);
            }
        }
        end
    }

    /// Nanoseconds link `l` was busy up to `end` (see [`super::load`]).
    pub(super) fn busy(&self, l: usize, end: Nanos) -> u64 {
        let link = &self.links[l];
        link.busy.until(end, !link.flows.is_empty())
    }

    /// Starts a flow of `bytes` over `path` (at most [`super::MAX_PATH`] links) at `now`.
    pub(super) fn start(&mut self, now: Nanos, path: &[u32], bytes: u64, latency: Nanos) -> FlowId {
        let mut links = [0; super::MAX_PATH];
        links[..path.len()].copy_from_slice(path);
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.flows.push(Flow {
                    links,
                    len: 0,
                    live: false,
                    remaining: 0.0,
                    rate: 0.0,
                    updated: now,
                    version: 0,
                    latency,
                    stamp: 0,
                    new_rate: 0.0,
                });
                (self.flows.len() - 1) as FlowId
            }
        };
        let f = &mut self.flows[id as usize];
        f.links = links;
        f.len = path.len() as u8;
        f.live = true;
        f.remaining = bytes as f64;
        // Rate 0 until the share gives it one; a new version so old events never match.
        f.rate = 0.0;
        f.updated = now;
        f.version = f.version.wrapping_add(1);
        f.latency = latency;
        self.active += 1;
        for &l in path {
            let link = &mut self.links[l as usize];
            if link.flows.is_empty() {
                link.busy.open(now);
            }
            link.flows.push(id);
        }
        self.reshare(now, path.iter().copied());
        id
    }

    pub(super) fn finish(&mut self, now: Nanos, id: FlowId, version: u32) -> Option<Nanos> {
        let f = self.flows.get_mut(id as usize)?;
        if !f.live || f.version != version {
            return None;
        }
        f.live = false;
        f.version = f.version.wrapping_add(1);
        let latency = f.latency;
        let (links, len) = (f.links, f.len as usize);
        self.active -= 1;
        for &l in &links[..len] {
            let link = &mut self.links[l as usize];
            let had = !link.flows.is_empty();
            link.flows.retain(|&g| g != id);
            if had && link.flows.is_empty() {
                link.busy.close(now);
            }
        }
        self.free.push(id);
        self.reshare(now, links[..len].iter().copied());
        Some(now + latency)
    }

    pub(super) fn reschedules(&mut self) -> std::vec::Drain<'_, Reschedule> {
        self.pending.drain(..)
    }

    pub(super) fn set_factor(&mut self, now: Nanos, l: usize, factor: f64, blocked_until: Nanos) {
        let link = &mut self.links[l];
        if link.factor == factor && link.blocked_until == blocked_until {
            return;
        }
        link.factor = factor;
        link.blocked_until = blocked_until;
        self.reshare(now, std::iter::once(l as u32));
    }

    /// Recomputes the max-min fair rates of every flow connected to `seeds` through shared
    /// links, and queues a new finish time for each flow whose rate changed.
    fn reshare(&mut self, now: Nanos, seeds: impl Iterator<Item = u32>) {
        let stamp = self.next_stamp();
        self.find_component(stamp, seeds);
        self.fill_component();
        self.reschedule_component(now);
    }

    /// The mark of a new re-share; after 2^32 of them it wraps, and every mark is cleared.
    #[inline]
    fn next_stamp(&mut self) -> u32 {
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            // Wrapped, after 2^32 re-shares: clear every mark, so that none equals a new one
            // (0 is every mark's start, so it is never a re-share's own).
            for link in &mut self.links {
                link.stamp = 0;
            }
            for f in &mut self.flows {
                f.stamp = 0;
            }
            self.stamp = 1;
        }
        self.stamp
    }

    /// Gathers into `comp_links` and `comp_flows` the links and flows connected to `seeds`
    /// through shared links, marking each with `stamp` and each flow as not yet fixed.
    #[inline]
    fn find_component(&mut self, stamp: u32, seeds: impl Iterator<Item = u32>) {
        self.comp_links.clear();
        self.comp_flows.clear();
        for l in seeds {
            let link = &mut self.links[l as usize];
            if link.stamp != stamp {
                link.stamp = stamp;
                self.comp_links.push(l);
            }
        }
        // Breadth first over links and flows; bounded by the links and flows that exist.
        let mut i = 0;
        while i < self.comp_links.len() {
            let l = self.comp_links[i] as usize;
            i += 1;
            for k in 0..self.links[l].flows.len() {
                let id = self.links[l].flows[k];
                let f = &mut self.flows[id as usize];
                if f.stamp == stamp {
                    continue;
                }
                f.stamp = stamp;
                f.new_rate = -1.0;
                self.comp_flows.push(id);
                for &m in &f.links[..f.len as usize] {
                    let link = &mut self.links[m as usize];
                    if link.stamp != stamp {
                        link.stamp = stamp;
                        self.comp_links.push(m);
                    }
                }
            }
        }
    }

    /// Progressive filling over the component: sets each of its flows' `new_rate` to its
    /// max-min fair share.
    #[inline]
    fn fill_component(&mut self) {
        for &l in &self.comp_links {
            let link = &mut self.links[l as usize];
            link.left = link.bandwidth();
            link.unfixed = link.flows.len() as u32;
        }
        // Progressive filling: the link with the smallest share fixes its unfixed flows at that
        // share. Fixing flows at the smallest share never lowers another link's share (it
        // takes at most that link's share from it), so a heap with stale entries finds each
        // next smallest: an entry whose share grew since it was pushed is pushed again.
        // Bounded: each pop fixes a link's flows or re-pushes a link whose share grew, at
        // most once per flow fixed on it.
        // Built whole and then ordered in one pass (linear), not pushed one by one: under
        // congestion a component holds most links of the cluster.
        let mut keys = std::mem::take(&mut self.heap).into_vec();
        keys.clear();
        keys.extend(self.comp_links.iter().filter_map(|&l| {
            let link = &self.links[l as usize];
            (link.unfixed > 0).then(|| Reverse(share_key(link.share(), l)))
        }));
        self.heap = BinaryHeap::from(keys);
        // Once every flow is fixed, every entry left has no unfixed flow and would only be
        // popped and skipped (a star of flows on one busy link leaves two or three entries a
        // flow): stop there.
        let mut unfixed = self.comp_flows.len();
        #[cfg(test)]
        let stop = !self.exhaustive;
        #[cfg(not(test))]
        let stop = true;
        while (unfixed > 0 || !stop)
            && let Some(Reverse(key)) = self.heap.pop()
        {
            let (bits, l) = ((key >> 32) as u64, key as u32);
            let link = &self.links[l as usize];
            if link.unfixed == 0 {
                continue;
            }
            let now_share = link.share();
            if now_share.to_bits() != bits {
                self.heap.push(Reverse(share_key(now_share, l)));
                continue;
            }
            unfixed -= self.fix_flows(l as usize, now_share);
        }
    }

    /// Fixes the unfixed flows of link `l` at `share`, taking it from every link of their
    /// paths; returns how many it fixed.
    #[inline]
    fn fix_flows(&mut self, l: usize, share: f64) -> usize {
        let mut fixed = 0;
        for k in 0..self.links[l].flows.len() {
            let id = self.links[l].flows[k];
            let f = &mut self.flows[id as usize];
            if f.new_rate >= 0.0 {
                continue;
            }
            f.new_rate = share;
            fixed += 1;
            for &m in &f.links[..f.len as usize] {
                let link = &mut self.links[m as usize];
                link.left -= share;
                link.unfixed -= 1;
            }
        }
        fixed
    }

    /// Moves each flow of the component whose rate changed to its new rate at `now`, and
    /// queues its new finish time.
    #[inline]
    fn reschedule_component(&mut self, now: Nanos) {
        for &id in &self.comp_flows {
            let f = &mut self.flows[id as usize];
            if f.new_rate == f.rate {
                continue;
            }
            let elapsed = (now - f.updated).as_secs_f64();
            f.remaining = (f.remaining - f.rate * elapsed).max(0.0);
            f.updated = now;
            f.rate = f.new_rate;
            f.version = f.version.wrapping_add(1);
            if f.rate > 0.0 {
                self.pending.push(Reschedule {
                    flow: id,
                    version: f.version,
                    at: now + duration(f.remaining, f.rate),
                });
            }
        }
    }
}
