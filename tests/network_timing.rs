//! Exact timings of the network model ([`Network`]) on a bare fabric of 1 GB/s NICs (one byte
//! a nanosecond) with 1 µs of latency:
//!
//! * a message of at most [`MICE_BYTES`] is a small message: it arrives at once at its
//!   start plus its bytes at its fair share plus the latency, and one byte more makes it a
//!   flow, which ends through the share; both sides of the bound are checked at the byte;
//! * a small message sent while a flow holds its path crosses it at half the bandwidth;
//! * two flows that share a link each get half of it while both run, so each ends exactly
//!   as late as the bytes of both take at the full rate; flows on disjoint paths do not
//!   slow each other.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use meshsim::hardware::network::{MICE_BYTES, Network, Purpose, Transfer};
use meshsim::hardware::{LinkSpec, Place};
use meshsim::units::Nanos;

const LATENCY: u64 = 1_000;
const H0: Place = Place::Host { node: 0 };
const H1: Place = Place::Host { node: 1 };
const H2: Place = Place::Host { node: 2 };

fn fabric() -> Network {
    Network::fabric(3, LinkSpec::ideal(1e9, Nanos(LATENCY)))
}

/// Starts each transfer (start time, from, to, bytes) and runs the flows' finish events in
/// time order, as the simulation host does; returns each transfer's arrival.
fn run(net: &mut Network, transfers: &[(u64, Place, Place, u64)]) -> Vec<Nanos> {
    let mut arrivals = vec![Nanos::ZERO; transfers.len()];
    // (time, 0 = finish / 1 = start, sequence, flow or index, version)
    let mut events = BinaryHeap::new();
    for (i, &(at, ..)) in transfers.iter().enumerate() {
        events.push(Reverse((at, 1u8, i as u64, i as u32, 0u32)));
    }
    let mut seq = transfers.len() as u64;
    let mut owner = HashMap::new();
    while let Some(Reverse((at, kind, _, who, version))) = events.pop() {
        let now = Nanos(at);
        if kind == 1 {
            let (_, from, to, bytes) = transfers[who as usize];
            match net.transfer(now, from, to, bytes, Purpose::Message) {
                Transfer::At(t) => arrivals[who as usize] = t,
                Transfer::Flow(f) => {
                    owner.insert(f, who);
                }
            }
        } else if let Some(arrival) = net.finish(now, who, version) {
            arrivals[owner[&who] as usize] = arrival;
        }
        for r in net.reschedules() {
            events.push(Reverse((r.at.0, 0, seq, r.flow, r.version)));
            seq += 1;
        }
    }
    assert_eq!(net.active_flows(), 0, "every flow ended");
    arrivals
}

#[test]
fn a_message_of_the_bound_is_small_and_one_byte_more_is_a_flow() {
    let mut net = fabric();
    let t = net.transfer(Nanos(500), H0, H1, MICE_BYTES, Purpose::Message);
    assert_eq!(t, Transfer::At(Nanos(500 + MICE_BYTES + LATENCY)));
    assert_eq!(net.active_flows(), 0, "a small message joins no share");
    let t = net.transfer(Nanos(500), H0, H1, MICE_BYTES - 1, Purpose::Message);
    assert_eq!(t, Transfer::At(Nanos(500 + MICE_BYTES - 1 + LATENCY)));
    // One byte over: a flow, in the share until it ends, at the same rate (alone).
    let mut net = fabric();
    let Transfer::Flow(_) = net.transfer(Nanos(500), H0, H1, MICE_BYTES + 1, Purpose::Message)
    else {
        panic!("a message over {MICE_BYTES} bytes is a flow");
    };
    assert_eq!(net.active_flows(), 1);
    let mut net = fabric();
    let t = run(&mut net, &[(500, H0, H1, MICE_BYTES + 1)]);
    assert_eq!(t, [Nanos(500 + MICE_BYTES + 1 + LATENCY)]);
}

#[test]
fn a_small_message_beside_a_flow_crosses_at_half_the_bandwidth() {
    let mut net = fabric();
    let t = run(
        &mut net,
        &[(0, H0, H1, 1_000_000), (10_000, H0, H1, MICE_BYTES)],
    );
    // Its fair share is half the link: twice its bytes in ns. The flow is not slowed.
    assert_eq!(t[1], Nanos(10_000 + 2 * MICE_BYTES + LATENCY));
    assert_eq!(t[0], Nanos(1_000_000 + LATENCY));
}

#[test]
fn two_flows_on_one_link_end_as_late_as_their_bytes_together_take() {
    // Alone: 1 MB in 1 ms.
    let alone = run(&mut fabric(), &[(0, H0, H1, 1_000_000)]);
    assert_eq!(alone, [Nanos(1_000_000 + LATENCY)]);
    // Two flows into node 1 share its NIC's receive side: 0.5 GB/s each, 1 ms later.
    let shared = run(
        &mut fabric(),
        &[(0, H0, H1, 1_000_000), (0, H2, H1, 1_000_000)],
    );
    assert_eq!(shared, [Nanos(2_000_000 + LATENCY); 2]);
    assert_eq!(shared[0] - alone[0], Nanos(1_000_000));
    // A second flow that starts halfway: the first has 0.5 MB left, which takes 1 ms at half
    // the link; the second sends 0.5 MB in that ms and its last 0.5 MB alone.
    let late = run(
        &mut fabric(),
        &[(0, H0, H1, 1_000_000), (500_000, H2, H1, 1_000_000)],
    );
    assert_eq!(
        late,
        [Nanos(1_500_000 + LATENCY), Nanos(2_000_000 + LATENCY)]
    );
    // Into different nodes from different nodes: no link in common, no slowdown.
    let apart = run(
        &mut fabric(),
        &[(0, H0, H1, 1_000_000), (0, H1, H2, 1_000_000)],
    );
    assert_eq!(apart, [Nanos(1_000_000 + LATENCY); 2]);
}
