//! Tests of the network model: paths, max-min fair sharing, small messages, SSD streaming,
//! cut links.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::*;
use crate::hardware::*;

pub(crate) fn cluster(nodes: u32) -> HardwareSpec {
    HardwareSpec {
        nodes,
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
            memory_efficiency: 1.0,
        },
        ssd: SsdSpec {
            drives: 1,
            capacity_bytes_per_drive: 1 << 40,
            read_bandwidth_per_drive: 1e9,
            write_bandwidth_per_drive: 1e9,
            latency: Nanos(10_000),
            efficiency: 1.0,
        },
        pcie: LinkSpec {
            bandwidth: 1e10,
            latency: Nanos(1_000),
            efficiency: 1.0,
        },
        nvlink: LinkSpec {
            bandwidth: 1e11,
            latency: Nanos(500),
            efficiency: 1.0,
        },
        network: NetworkSpec {
            nics_per_node: 1,
            nic: LinkSpec {
                bandwidth: 1e9,
                latency: Nanos(1_000),
                efficiency: 1.0,
            },
            switch_latency: Nanos(100),
            switch_hops: 3,
            remote_kv_path: RemoteKvPath::Gpudirect,
        },
    }
}

/// One transfer of a test: start time, from, to, bytes; or an SSD read from a node.
#[derive(Clone, Copy)]
enum T {
    Send(u64, Place, Place, u64),
    SsdRead(u64, u32, Place, u64),
    /// At this time, set node's NICs to this factor (blocked until the third value).
    Nics(u64, u32, f64, u64),
}

/// Runs `transfers` on `net` as the simulation host would: starts at their times, finish
/// events in time order (stale versions skipped); returns each transfer's arrival (0 for
/// NIC changes).
fn run(net: &mut Network, transfers: &[T]) -> Vec<Nanos> {
    let mut arrivals = vec![Nanos::ZERO; transfers.len()];
    // (time, kind 0 = finish / 1 = start, seq, flow or index, version)
    let mut heap = BinaryHeap::new();
    let mut seq = 0u64;
    for (i, t) in transfers.iter().enumerate() {
        let at = match *t {
            T::Send(at, ..) | T::SsdRead(at, ..) | T::Nics(at, ..) => at,
        };
        heap.push(Reverse((at, 1u8, seq, i as u32, 0u32)));
        seq += 1;
    }
    let mut owner = std::collections::HashMap::new();
    while let Some(Reverse((at, kind, _, who, version))) = heap.pop() {
        let now = Nanos(at);
        if kind == 1 {
            let started = match transfers[who as usize] {
                T::Send(_, from, to, bytes) => net.transfer(now, from, to, bytes, Purpose::Message),
                T::SsdRead(_, node, to, bytes) => net.ssd_read(now, node, to, bytes).unwrap(),
                T::Nics(_, node, factor, until) => {
                    net.set_nics(now, node, factor, Nanos(until));
                    Transfer::At(now)
                }
            };
            match started {
                Transfer::At(t) => arrivals[who as usize] = t,
                Transfer::Flow(f) => {
                    owner.insert(f, who);
                }
            }
        } else if let Some(arrival) = net.finish(now, who, version) {
            arrivals[owner[&who] as usize] = arrival;
        }
        for r in net.reschedules() {
            heap.push(Reverse((r.at.0, 0, seq, r.flow, r.version)));
            seq += 1;
        }
    }
    assert_eq!(net.active_flows(), 0, "every flow ended");
    arrivals
}

const MB: u64 = 1_000_000;
const H0: Place = Place::Host { node: 0 };
const H1: Place = Place::Host { node: 1 };
const G10: Place = Place::Gpu { node: 1, gpu: 0 };
/// Inter-node latency of `cluster`: 2 x 1 us + 3 x 100 ns.
const NET: u64 = 2_300;

#[test]
fn a_transfer_costs_bytes_over_its_bottleneck_plus_path_latency() {
    let mut net = Network::new(&cluster(2));
    // 1 MB at 1 GB/s (the NICs; DRAM is 100 GB/s) = 1 ms.
    let t = run(&mut net, &[T::Send(0, Place::Frontend, H1, MB)]);
    assert_eq!(t, [Nanos(1_000_000 + NET)]);
    // Into a GPU of another node: the reader's PCIe (10 GB/s) is crossed too, and its
    // latency (1 us) counts.
    let mut net = Network::new(&cluster(2));
    let t = run(&mut net, &[T::Send(0, H0, G10, MB)]);
    assert_eq!(t, [Nanos(1_000_000 + NET + 1_000)]);
    let load = net.link_load(Nanos(1));
    assert_eq!(load.kind_bytes(LinkKind::Nic), MB);
    assert_eq!(load.kind_bytes(LinkKind::PcieToGpu), MB);
    assert_eq!(load.kind_bytes(LinkKind::Dram), MB);
}

#[test]
fn efficiency_scales_a_links_bandwidth() {
    let mut spec = cluster(2);
    spec.network.nic.efficiency = 0.5;
    let mut net = Network::new(&spec);
    let t = run(&mut net, &[T::Send(0, H0, H1, MB)]);
    assert_eq!(t, [Nanos(2_000_000 + NET)]);
}

#[test]
fn flows_on_a_link_share_it_equally_and_speed_up_when_one_ends() {
    let mut net = Network::new(&cluster(2));
    // Same receiving NIC: 0.5 GB/s each while both run. A ends at 2 ms, having sent 1 MB;
    // B has sent 1 MB too, and its last 2 MB go at the full 1 GB/s: 4 ms.
    let t = run(
        &mut net,
        &[
            T::Send(0, H0, H1, MB),
            T::Send(0, Place::Frontend, H1, 3 * MB),
        ],
    );
    assert_eq!(t, [Nanos(2_000_000 + NET), Nanos(4_000_000 + NET)]);
    // Opposite directions share nothing.
    let mut net = Network::new(&cluster(2));
    let t = run(&mut net, &[T::Send(0, H0, H1, MB), T::Send(0, H1, H0, MB)]);
    assert_eq!(t, [Nanos(1_000_000 + NET); 2]);
}

#[test]
fn max_min_gives_what_a_slower_flow_leaves_to_the_others() {
    let mut spec = cluster(2);
    spec.pcie.bandwidth = 0.25e9;
    let mut net = Network::new(&spec);
    // Both cross node 0's NIC tx and node 1's NIC rx (1 GB/s); B also the reader's PCIe at
    // 0.25 GB/s. Max-min: B = 0.25, A = 0.75 GB/s (an equal split would waste 0.25).
    let t = run(
        &mut net,
        &[T::Send(0, H0, H1, 3 * MB), T::Send(0, H0, G10, MB)],
    );
    assert_eq!(t[0], Nanos(4_000_000 + NET));
    assert_eq!(t[1], Nanos(4_000_000 + NET + 1_000));
}

#[test]
fn a_small_message_is_not_stuck_behind_a_bulk_transfer() {
    let mut spec = cluster(2);
    spec.network.nic.bandwidth = 25e9;
    let mut net = Network::new(&spec);
    // A 1 GiB load holds the link for ~43 ms; a 4 KiB message sent 1 ms in arrives after
    // twice its own transmission time (its fair share is half the link) and the latency.
    let t = run(
        &mut net,
        &[
            T::Send(0, H0, H1, 1 << 30),
            T::Send(1_000_000, H0, H1, 4096),
        ],
    );
    let own = 4096.0 / 25e9 * 1e9;
    let late = t[1].0 - 1_000_000 - NET;
    assert!((late as f64) <= 2.0 * own + 1.0, "{late} ns");
    assert!(late as f64 + (NET as f64) < own + 50_000.0);
    // The bulk transfer is not slowed by it (small messages do not join the share).
    assert_eq!(
        t[0],
        Nanos(((1u64 << 30) as f64 / 25e9 * 1e9).ceil() as u64 + NET)
    );
}

#[test]
fn ssd_reads_stream_to_the_reader() {
    let mut net = Network::new(&cluster(2));
    // SSD 1 GB/s, DRAM 100 GB/s (crossed twice), NICs 1 GB/s, PCIe 10 GB/s: 10 MB in 10 ms
    // (store-and-forward would take 20 ms), plus SSD, network and PCIe latency.
    let t = run(&mut net, &[T::SsdRead(0, 0, G10, 10 * MB)]);
    assert_eq!(t, [Nanos(10_000_000 + 10_000 + NET + 1_000)]);
    let load = net.link_load(Nanos(1));
    assert_eq!(load.of(LinkKind::SsdRead, Purpose::Load), 10 * MB);
    assert_eq!(load.of(LinkKind::Nic, Purpose::Load), 10 * MB);
    // Written into the bounce buffer and read from it.
    assert_eq!(load.of(LinkKind::Dram, Purpose::Load), 20 * MB);
    // Into its own node's memory (a promotion) only the SSD and DRAM are crossed.
    let t = run(&mut net, &[T::SsdRead(0, 0, H0, MB)]);
    assert_eq!(t, [Nanos(1_000_000 + 10_000)]);
    // Writes cross DRAM and the SSD write channel.
    let w = net.ssd_write(Nanos(0), 0, MB).unwrap();
    assert!(matches!(w, Transfer::Flow(_)));
}

#[test]
fn a_cut_link_stops_its_flows_until_it_is_restored() {
    let mut net = Network::new(&cluster(2));
    // 2 MB at 1 GB/s; node 1's NICs are cut from 1 ms to 5 ms: 1 MB before, 1 MB after.
    let t = run(
        &mut net,
        &[
            T::Send(0, H0, H1, 2 * MB),
            T::Nics(1_000_000, 1, 0.0, 5_000_000),
            T::Nics(5_000_000, 1, 1.0, 0),
            // A small message during the cut waits for its end.
            T::Send(2_000_000, H0, H1, 1_000),
        ],
    );
    assert_eq!(t[0], Nanos(6_000_000 + NET));
    assert!(t[3] >= Nanos(5_000_000 + NET), "{:?}", t[3]);
    // At half speed, the rest takes twice as long.
    let mut net = Network::new(&cluster(2));
    let t = run(
        &mut net,
        &[T::Send(0, H0, H1, 2 * MB), T::Nics(1_000_000, 1, 0.5, 0)],
    );
    assert_eq!(t[0], Nanos(3_000_000 + NET));
}

#[test]
fn same_place_is_free_and_intra_node_uses_nvlink_or_pcie() {
    let mut net = Network::new(&cluster(2));
    let g0 = Place::Gpu { node: 0, gpu: 0 };
    let g1 = Place::Gpu { node: 0, gpu: 1 };
    assert_eq!(
        net.transfer(Nanos(5), g0, g0, 1 << 20, Purpose::Message),
        Transfer::At(Nanos(5))
    );
    let t = run(
        &mut net,
        &[T::Send(0, g0, g1, 100 * MB), T::Send(0, H0, g1, 10 * MB)],
    );
    // NVLink at 100 GB/s; host to GPU at PCIe's 10 GB/s (DRAM 100 GB/s).
    assert_eq!(t, [Nanos(1_000_000 + 500), Nanos(1_000_000 + 1_000)]);
    let load = net.link_load(Nanos(1));
    assert_eq!(load.kind_bytes(LinkKind::Nvlink), 100 * MB);
    assert_eq!(load.kind_bytes(LinkKind::PcieToGpu), 10 * MB);
    assert_eq!(load.kind_bytes(LinkKind::PcieToHost), 0);
}

#[test]
fn link_load_counts_bytes_by_kind_and_purpose_and_the_time_links_were_busy() {
    let mut net = Network::new(&cluster(2));
    // 1 MB from node 0's memory into a GPU of node 1, at the NICs' 1 GB/s: 1 ms of busy
    // time on node 0's transmit side and node 1's receive side and the reader's PCIe.
    let Transfer::Flow(f) = net.transfer(Nanos::ZERO, H0, G10, MB, Purpose::Load) else {
        panic!("a flow");
    };
    let r: Vec<Reschedule> = net.reschedules().collect();
    assert_eq!(r[0].at, Nanos(1_000_000));
    net.finish(r[0].at, f, r[0].version).unwrap();
    // Two small messages of 1,000 bytes (1 us each at 1 GB/s) overlapping by half: 1.5 us.
    net.transfer(Nanos(2_000_000), H0, H1, 1_000, Purpose::Message);
    net.transfer(Nanos(2_000_500), H0, H1, 1_000, Purpose::Message);
    // A store write of 2 MB, GPU to own host memory, and a demotion of 3 MB.
    net.transfer(Nanos(3_000_000), G10, H1, 2 * MB, Purpose::Store);
    net.ssd_write(Nanos(3_000_000), 1, 3 * MB);
    // Over 4 ms (the store write and demotion still on their links at the end).
    let end = Nanos(4_000_000);
    let l = net.link_load(end);
    assert_eq!(l.of(LinkKind::Nic, Purpose::Load), MB);
    assert_eq!(l.of(LinkKind::Nic, Purpose::Message), 2_000);
    assert_eq!(l.of(LinkKind::Dram, Purpose::Load), MB);
    assert_eq!(l.of(LinkKind::Dram, Purpose::Message), 4_000);
    assert_eq!(l.of(LinkKind::PcieToGpu, Purpose::Load), MB);
    assert_eq!(l.of(LinkKind::PcieToHost, Purpose::Store), 2 * MB);
    assert_eq!(l.of(LinkKind::Dram, Purpose::Store), 2 * MB);
    assert_eq!(l.of(LinkKind::Dram, Purpose::Demotion), 3 * MB);
    assert_eq!(l.of(LinkKind::SsdWrite, Purpose::Demotion), 3 * MB);
    assert_eq!(l.moved, [MB, 2 * MB, 0, 3 * MB, 2_000]);
    // Two nodes, one NIC each: 4 sides (the frontend's are left out), each of the two used
    // busy 1 ms + 1.5 us.
    assert_eq!(l.links[LinkKind::Nic as usize], 2);
    let side = 1_001_500.0 / 4e6;
    assert_eq!(l.busiest[LinkKind::Nic as usize], side);
    assert_eq!(l.busy[LinkKind::Nic as usize], 2.0 * side / 4.0);
    // Four GPUs: one PCIe link to the GPU busy 1 ms, one to the host busy 1 ms to the end.
    assert_eq!(l.links[LinkKind::PcieToGpu as usize], 4);
    assert_eq!(l.busy[LinkKind::PcieToGpu as usize], 0.25 / 4.0);
    assert_eq!(l.busiest[LinkKind::PcieToHost as usize], 0.25);
    // Node 1's SSD writes from 3 ms to the end; node 0's never.
    assert_eq!(l.busy[LinkKind::SsdWrite as usize], 0.125);
    assert_eq!(
        l.rate_per_link(LinkKind::Nic),
        (MB + 2_000) as f64 / 4e-3 / 2.0
    );
    assert_eq!(l.rate_per_link(LinkKind::SsdRead), 0.0);
}

#[test]
fn many_flows_conserve_bandwidth_and_end_in_time_order_of_size() {
    // 8 flows of 1..8 MB into one NIC at once: together they take 36 ms (the link is never
    // idle), and a smaller flow never ends after a larger one.
    let mut net = Network::new(&cluster(2));
    let transfers: Vec<T> = (1..=8)
        .map(|i| T::Send(0, Place::Frontend, H1, i * MB))
        .collect();
    let t = run(&mut net, &transfers);
    assert!(t.windows(2).all(|w| w[0] <= w[1]), "{t:?}");
    let last = t[7].0 - NET;
    assert!((36_000_000..=36_000_010).contains(&last), "{last}");
}

/// Checks that the rates now are max-min fair: no link carries more than its bandwidth, and
/// every flow has a bottleneck: a full link on which no flow goes faster than it.
fn assert_max_min(net: &Network) {
    let (flows, bw) = net.flows.snapshot();
    let mut load = vec![0.0; bw.len()];
    let mut fastest = vec![0.0f64; bw.len()];
    for (rate, links) in &flows {
        for &l in links {
            load[l as usize] += rate;
            fastest[l as usize] = fastest[l as usize].max(*rate);
        }
    }
    for (l, (&used, &cap)) in load.iter().zip(&bw).enumerate() {
        assert!(used <= cap * (1.0 + 1e-9), "link {l}: {used} > {cap}");
    }
    for (rate, links) in &flows {
        let bottleneck = links.iter().any(|&l| {
            let l = l as usize;
            load[l] >= bw[l] * (1.0 - 1e-9) && *rate >= fastest[l] * (1.0 - 1e-9)
        });
        assert!(
            bottleneck,
            "a flow at {rate} B/s has no bottleneck on {links:?}"
        );
    }
}

#[test]
fn random_flows_get_max_min_fair_rates() {
    random_flows(50, None);
}

/// The re-shares' mark wraps (after 2^32 re-shares in a long run): the rates stay max-min
/// fair through it, as they are without it.
#[test]
fn flows_stay_max_min_fair_when_the_reshare_mark_wraps() {
    for ahead in [1, 7, 30] {
        random_flows(6, Some(u32::MAX - ahead));
    }
}

/// Progressive filling stops once every flow of a component is fixed: the entries it leaves
/// in its heap would only have been skipped, so every rate, every finish time and their order
/// are bit for bit those of filling that pops every entry. Random loads from a few popular
/// owners to many readers (stars of flows on a busy NIC, and components that are not stars),
/// on two networks in lockstep.
#[test]
fn stopping_once_every_flow_is_fixed_changes_no_rate_and_no_reschedule() {
    let mut rng = crate::rng::Stream::new(11, 0);
    for case in 0..12 {
        let mut spec = cluster(8);
        spec.pcie.bandwidth = [0.5e9, 2e9, 1e10][case % 3];
        spec.host.memory_bandwidth = [1.5e9, 1e11][case % 2];
        let (mut early, mut every) = (Network::new(&spec), Network::new(&spec));
        every.flows.set_exhaustive();
        let mut now = Nanos::ZERO;
        let mut due = std::collections::BTreeMap::new();
        let mut most = 0;
        for step in 0..150 {
            now += Nanos(rng.below(500));
            if rng.below(3) == 0 {
                if let Some((&f, &(v, at))) = due.iter().min_by_key(|(_, (_, at))| *at) {
                    now = now.max(at);
                    assert_eq!(early.finish(now, f, v), every.finish(now, f, v));
                    due.remove(&f);
                }
            } else {
                // Two popular owners, any reader.
                let owner = rng.below(2) as u32;
                let reader = Place::Gpu {
                    node: rng.below(8) as u32,
                    gpu: rng.below(2) as u32,
                };
                let bytes = MB * (1 + rng.below(4));
                if rng.below(5) == 0 {
                    early.ssd_read(now, owner, reader, bytes).unwrap();
                    every.ssd_read(now, owner, reader, bytes).unwrap();
                } else {
                    let from = Place::Host { node: owner };
                    early.transfer(now, from, reader, bytes, Purpose::Load);
                    every.transfer(now, from, reader, bytes, Purpose::Load);
                }
            }
            let a: Vec<Reschedule> = early.reschedules().collect();
            let b: Vec<Reschedule> = every.reschedules().collect();
            assert_eq!(a, b, "case {case}, step {step}: the reschedules differ");
            let ((fa, _), (fb, _)) = (early.flows.snapshot(), every.flows.snapshot());
            let bits = |f: &[(f64, Vec<u32>)]| -> Vec<(u64, Vec<u32>)> {
                f.iter().map(|(r, l)| (r.to_bits(), l.clone())).collect()
            };
            assert_eq!(
                bits(&fa),
                bits(&fb),
                "case {case}, step {step}: the rates differ"
            );
            for r in a {
                due.insert(r.flow, (r.version, r.at));
            }
            most = most.max(early.flows.active());
        }
        // The loads overlapped: the owners' links carried many flows at once.
        assert!(most >= 10, "case {case}: at most {most} flows at once");
    }
}

/// Random flows starting and ending on a small cluster, checked max-min fair after each
/// change; `stamp` sets the re-shares' mark of each case's network first.
fn random_flows(cases: usize, stamp: Option<u32>) {
    let mut rng = crate::rng::Stream::new(7, 0);
    for case in 0..cases {
        let mut spec = cluster(4);
        spec.gpus_per_node = 2;
        spec.pcie.bandwidth = [0.3e9, 1e9, 3e9][case % 3];
        spec.host.memory_bandwidth = [0.8e9, 5e9][case % 2];
        let mut net = Network::new(&spec);
        if let Some(s) = stamp {
            net.flows.set_stamp(s);
        }
        let place = |r: &mut crate::rng::Stream| {
            let node = r.below(4) as u32;
            match r.below(3) {
                0 => Place::Host { node },
                1 => Place::Gpu {
                    node,
                    gpu: r.below(2) as u32,
                },
                _ => Place::Frontend,
            }
        };
        let mut now = Nanos::ZERO;
        // The latest finish time of each flow.
        let mut due = std::collections::BTreeMap::new();
        for _ in 0..60 {
            now += Nanos(rng.below(1_000));
            if rng.below(3) == 0 {
                // The flow due first ends (at its time, or now if that has passed).
                if let Some((&f, &(v, at))) = due.iter().min_by_key(|(_, (_, at))| *at) {
                    now = now.max(at);
                    assert!(net.finish(now, f, v).is_some());
                    due.remove(&f);
                }
            } else {
                let (from, to) = (place(&mut rng), place(&mut rng));
                if rng.below(4) == 0 {
                    net.ssd_read(now, rng.below(4) as u32, to, MB).unwrap();
                } else {
                    net.transfer(now, from, to, MB, Purpose::Message);
                }
            }
            for r in net.reschedules() {
                due.insert(r.flow, (r.version, r.at));
            }
            assert_max_min(&net);
        }
    }
}

/// An estimate is what a transfer started now would take at the share it gets now: alone,
/// exactly its time; beside one flow on the same NIC, twice the transfer time. It starts
/// nothing.
#[test]
fn an_estimate_is_the_transfer_at_the_share_it_would_get_now() {
    let mut net = Network::new(&cluster(2));
    let alone = net
        .estimate(Nanos::ZERO, H0, G10, false, MB, RemoteKvPath::Gpudirect)
        .unwrap();
    assert_eq!(alone, Nanos(1_000_000 + NET + 1_000));
    assert_eq!(run(&mut net, &[T::Send(0, H0, G10, MB)]), [alone]);
    let busy = net.transfer(Nanos::ZERO, H0, H1, 100 * MB, Purpose::Message);
    assert!(matches!(busy, Transfer::Flow(_)));
    let shared = net
        .estimate(Nanos::ZERO, H0, G10, false, MB, RemoteKvPath::Gpudirect)
        .unwrap();
    assert_eq!(shared, Nanos(2_000_000 + NET + 1_000));
    assert_eq!(net.active_flows(), 1, "an estimate starts nothing");
    // Staged hop after hop: beside the flow on node 0's NIC the first leg gets half of it
    // (2 ms), then the second crosses node 1's DRAM and PCIe alone (0.1 ms).
    let staged = net.estimate(Nanos::ZERO, H0, G10, false, MB, RemoteKvPath::HostStaged);
    assert_eq!(staged, Some(Nanos(2_000_000 + NET + 100_000 + 1_000)));
    // From the SSD: streamed through host memory, at the drive's 1 GB/s.
    let ssd = net
        .estimate(Nanos::ZERO, H0, G10, true, MB, RemoteKvPath::Gpudirect)
        .unwrap();
    assert!(ssd >= Nanos(2_000_000), "{ssd:?}");
    assert_eq!(
        net.estimate(
            Nanos::ZERO,
            Place::Host { node: 9 },
            G10,
            false,
            MB,
            RemoteKvPath::Gpudirect
        ),
        None
    );
}
