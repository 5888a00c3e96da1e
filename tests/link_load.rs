//! What the links carried in a whole serving run agrees with what the run's requests and store
//! say they moved: every loaded byte crossed a PCIe link into a GPU once, a remote load a NIC
//! once, replicas are the store's replication bytes, demotions its demoted bytes; policies
//! that keep nothing outside the GPU move only messages; `network_bytes` is every NIC byte.

mod common;

use meshsim::hardware::network::{LinkKind, LinkLoad, Purpose};
use meshsim::metrics::{Summary, Tier};

fn links(s: &Summary) -> LinkLoad {
    s.links.expect("a simulation counts its links")
}

#[test]
fn a_runs_link_bytes_agree_with_what_its_requests_and_store_moved() {
    // Small host memory, so that the store demotes to SSD and reads some of it back.
    let text = std::fs::read_to_string(common::data("small.toml")).unwrap();
    let text = format!("{text}\n[store]\nhost_capacity_gib = 1.0\n");
    let s = meshsim::Scenario::parse("small.toml", "small", &text).unwrap();
    let runs = common::run(&s, 2);
    for run in &runs {
        let sum = &run.summary;
        let l = links(sum);
        let name = &sum.policy;
        assert_eq!(sum.network_bytes, l.kind_bytes(LinkKind::Nic), "{name}");
        assert!(l.moved[Purpose::Message as usize] > 0, "{name}");
        for k in LinkKind::ALL {
            let (busy, busiest) = (l.busy[k as usize], l.busiest[k as usize]);
            assert!((0.0..=1.0).contains(&busy), "{name} {k:?} {busy}");
            assert!(busy <= busiest && busiest <= 1.0, "{name} {k:?} {busiest}");
            assert_eq!(busiest > 0.0, l.kind_bytes(k) > 0, "{name} {k:?}");
        }
        let loaded: u64 = sum.loaded_bytes.iter().sum();
        let remote = sum.loaded_bytes[Tier::RemoteHost as usize]
            + sum.loaded_bytes[Tier::RemoteSsd as usize];
        let ssd =
            sum.loaded_bytes[Tier::LocalSsd as usize] + sum.loaded_bytes[Tier::RemoteSsd as usize];
        let store = sum.store.unwrap_or_default();
        assert_eq!(l.moved[Purpose::Load as usize], loaded, "{name}");
        assert_eq!(l.of(LinkKind::PcieToGpu, Purpose::Load), loaded, "{name}");
        assert_eq!(l.of(LinkKind::Nic, Purpose::Load), remote, "{name}");
        assert_eq!(l.of(LinkKind::SsdRead, Purpose::Load), ssd, "{name}");
        let replicas = l.moved[Purpose::Replication as usize];
        assert_eq!(replicas, store.replication_bytes, "{name}");
        assert_eq!(l.of(LinkKind::PcieToHost, Purpose::Replication), replicas);
        assert_eq!(l.moved[Purpose::Demotion as usize], store.demoted_bytes);
        assert_eq!(
            l.of(LinkKind::SsdWrite, Purpose::Demotion),
            store.demoted_bytes
        );
        match name.as_str() {
            "vanilla" | "local-prefix" => {
                assert_eq!(loaded + l.moved[Purpose::Store as usize], 0, "{name}");
            }
            _ => {
                assert!(remote > 0 && l.moved[Purpose::Store as usize] > 0, "{name}");
                // Every store write crosses the writer's PCIe to its host, then DRAM.
                assert_eq!(
                    l.of(LinkKind::PcieToHost, Purpose::Store),
                    l.moved[Purpose::Store as usize]
                );
            }
        }
        if name == "ptstore" {
            assert!(replicas > 0);
        }
    }
    let demoted: u64 = runs.iter().map(|r| links(&r.summary).moved[3]).sum();
    assert!(demoted > 0, "some run demoted to SSD");
    let ssd_read: u64 = runs
        .iter()
        .map(|r| links(&r.summary).kind_bytes(LinkKind::SsdRead))
        .sum();
    assert!(ssd_read > 0, "some run loaded from SSD");
}
