use super::*;
use crate::hardware::{LinkSpec, RemoteKvPath};

/// Ticks every microsecond; its invariant breaks at the `breaks_at`-th tick.
struct Ticker {
    ticks: u64,
    breaks_at: u64,
    limit: u64,
}

impl Actor<()> for Ticker {
    fn start(&mut self, ctx: &mut dyn Context<()>) {
        ctx.timer(Nanos(1_000), ());
    }
    fn handle(&mut self, _msg: (), ctx: &mut dyn Context<()>) {
        self.ticks += 1;
        if self.ticks < self.limit {
            ctx.timer(Nanos(1_000), ());
        }
    }
    fn check(&self) -> Result<(), String> {
        if self.ticks >= self.breaks_at {
            Err(format!("{} ticks", self.ticks))
        } else {
            Ok(())
        }
    }
    fn report(&mut self, _report: &mut Report) {}
}

fn host(check_every: u64, breaks_at: u64) -> SimHost<()> {
    let link = LinkSpec::ideal(1e9, Nanos::ZERO);
    let mut h = SimHost::new(Network::fabric(1, link), Limits::default(), 9);
    h.set_check_every(check_every);
    h.add(
        Box::new(Ticker {
            ticks: 0,
            breaks_at,
            limit: 100,
        }),
        Place::Host { node: 0 },
    );
    h
}

#[test]
fn a_broken_invariant_ends_the_run_at_the_event_that_broke_it() {
    // Event 1 starts the ticker; tick n is event n + 1, at n microseconds.
    let err = host(1, 10).run().unwrap_err();
    match err {
        SimError::Invariant { what, at, seed } => {
            assert!(what.contains("actor 0: 10 ticks"), "{what}");
            assert_eq!(at, Nanos(10_000));
            assert_eq!(seed, 9);
        }
        other => panic!("expected an invariant error, found {other:?}"),
    }
    // Checked every 8 events, it is caught at the first check after it broke.
    let SimError::Invariant { at, .. } = host(8, 10).run().unwrap_err() else {
        panic!("expected an invariant error");
    };
    assert_eq!(at, Nanos(15_000));
}

#[test]
fn checks_never_change_a_run_that_keeps_its_invariants() {
    let a = host(1, u64::MAX).run().unwrap();
    let b = host(0, u64::MAX).run().unwrap();
    assert_eq!((a.events, a.end), (b.events, b.end));
    assert_eq!(a.events, 101);
}

/// Fetches 1 MB from node 1's memory at `start_at` (its timer: `None`) and records which
/// message ended the read (`Some(done)`).
struct Reader {
    got: std::sync::Arc<std::sync::Mutex<Vec<(bool, Nanos)>>>,
    start_at: Nanos,
    epoch: u32,
    bytes: u64,
    staging: RemoteKvPath,
}

impl Reader {
    fn new(start_at: Nanos, epoch: u32, bytes: u64, staging: RemoteKvPath) -> Reader {
        Reader {
            got: Default::default(),
            start_at,
            epoch,
            bytes,
            staging,
        }
    }
}

impl Actor<Option<bool>> for Reader {
    fn start(&mut self, ctx: &mut dyn Context<Option<bool>>) {
        ctx.timer(self.start_at, None);
    }
    fn handle(&mut self, msg: Option<bool>, ctx: &mut dyn Context<Option<bool>>) {
        match msg {
            None => {
                let work = Work::Fetch {
                    from: Place::Host { node: 1 },
                    medium: Medium::Memory,
                    bytes: self.bytes,
                    segments: 1,
                    epoch: self.epoch,
                    staging: self.staging,
                };
                ctx.start_fetch(work, Some(true), Some(false));
            }
            Some(ok) => self.got.lock().unwrap().push((ok, ctx.now())),
        }
    }
    fn report(&mut self, _report: &mut Report) {}
}

/// (delivered `done`, at) of a 1 MB read at 1 GB/s (1 ms) started at `start_at`, with
/// `loss` applied to node 1.
fn read(start_at: Nanos, loss: Option<(Nanos, bool)>) -> (bool, Nanos) {
    read_knowing(start_at, loss, 0)
}

/// [`read`] by a reader whose plan knew of `epoch` losses of node 1.
fn read_knowing(start_at: Nanos, loss: Option<(Nanos, bool)>, epoch: u32) -> (bool, Nanos) {
    let link = LinkSpec::ideal(1e9, Nanos::ZERO);
    let losses: Vec<MemoryLoss> = loss
        .map(|(at, crash)| MemoryLoss { node: 1, at, crash })
        .into_iter()
        .collect();
    let reader = Reader::new(start_at, epoch, 1_000_000, Default::default());
    let v = run_reader(
        Network::fabric(2, link),
        Place::Host { node: 0 },
        reader,
        &losses,
    );
    assert_eq!(v.len(), 1, "{v:?}");
    v[0]
}

/// Runs `reader` at `place` on `net` with `losses`; returns how its reads ended.
fn run_reader(
    net: Network,
    place: Place,
    reader: Reader,
    losses: &[MemoryLoss],
) -> Vec<(bool, Nanos)> {
    let got = reader.got.clone();
    let mut h: SimHost<Option<bool>> = SimHost::new(net, Limits::default(), 1);
    h.add(Box::new(reader), place);
    for &loss in losses {
        h.lose_memory(loss);
    }
    h.run().unwrap();
    got.lock().unwrap().clone()
}

#[test]
fn a_read_fails_when_its_source_loses_the_memory_before_its_last_byte() {
    let ms = |x: u64| Nanos(x * 1_000_000);
    let (ok, end) = read(Nanos::ZERO, None);
    assert!(ok);
    assert!(end >= ms(1) && end < ms(2), "{end:?}");
    // A crash or a restart while the read is in flight: it fails, when it would have
    // ended (the reader learns from the read itself, whatever notice comes later).
    assert_eq!(
        read(Nanos::ZERO, Some((Nanos(500_000), true))),
        (false, end)
    );
    assert_eq!(
        read(Nanos::ZERO, Some((Nanos(500_000), false))),
        (false, end)
    );
    // A loss after the read ended changes nothing.
    assert_eq!(read(Nanos::ZERO, Some((ms(5), true))), (true, end));
    // A read started after a crash fails. After a restart, a read planned before the
    // restart was known (epoch 0) names tensors that are gone: it fails; one planned
    // knowing of it (epoch 1) reads the restarted store.
    let later = read(ms(2), None);
    assert!(later.0);
    assert_eq!(read(ms(2), Some((ms(1), true))), (false, later.1));
    assert_eq!(read(ms(2), Some((ms(1), false))), (false, later.1));
    assert_eq!(
        read_knowing(ms(2), Some((ms(1), false)), 1),
        (true, later.1)
    );
    assert!(!read_knowing(ms(2), Some((ms(1), true)), 1).0);
    // Another node's loss does not touch it.
    let link = LinkSpec::ideal(1e9, Nanos::ZERO);
    let loss = MemoryLoss {
        node: 2,
        at: Nanos(500_000),
        crash: true,
    };
    let reader = Reader::new(Nanos::ZERO, 0, 1_000_000, Default::default());
    let v = run_reader(
        Network::fabric(3, link),
        Place::Host { node: 0 },
        reader,
        &[loss],
    );
    assert!(v[0].0);
}

/// A 1 GB load from node 1's host memory into a GPU of node 0, on a cluster whose NIC gives
/// 1 GB/s, PCIe 10 GB/s and DRAM 100 GB/s (`cluster(2)` of the network's tests), with no
/// posting overheads: GPUDirect crosses DRAM, the NICs and PCIe at the NIC's 1 GB/s (1 s);
/// staged hop after hop it first reaches node 0's DRAM at the NIC's rate (1 s), then crosses
/// DRAM and PCIe at PCIe's 10 GB/s (0.1 s more); pipelined it crosses node 0's DRAM twice in
/// one transfer (50 GB/s each way, still above the NIC), so the NIC decides (1 s). Latency:
/// the NICs and switches (2.3 us), PCIe (1 us).
#[test]
fn a_remote_load_costs_its_slowest_link_on_each_path() {
    let gb = 1_000_000_000;
    let at = |staging| {
        let net = Network::new(&crate::hardware::network::tests::cluster(2));
        let reader = Reader::new(Nanos::ZERO, 0, gb, staging);
        let v = run_reader(net, Place::Gpu { node: 0, gpu: 0 }, reader, &[]);
        assert_eq!(v.len(), 1);
        assert!(v[0].0);
        v[0].1
    };
    let (net, pcie) = (2_300, 1_000);
    assert_eq!(
        at(RemoteKvPath::Gpudirect),
        Nanos(1_000_000_000 + net + pcie)
    );
    assert_eq!(
        at(RemoteKvPath::HostPipelined),
        Nanos(1_000_000_000 + net + pcie)
    );
    assert_eq!(
        at(RemoteKvPath::HostStaged),
        Nanos(1_000_000_000 + net + 100_000_000 + pcie)
    );
}
