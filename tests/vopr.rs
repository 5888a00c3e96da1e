//! The VOPR in CI: a bounded number of random scenarios, every policy simulated twice with
//! every actor's invariants checked after every event (`meshsim vopr` runs more).

use meshsim::vopr::run_seed;

/// Seeds run in CI; `meshsim vopr --seeds N` runs as many as wanted.
const CI_SEEDS: u64 = 16;

#[test]
fn random_scenarios_keep_every_invariant_and_are_deterministic() {
    let (mut preemptions, mut rejected, mut dropped, mut replicated) = (0, 0, 0, 0);
    let (mut faults, mut failed, mut failovers) = (0, 0, 0);
    for seed in 0..CI_SEEDS {
        let o = run_seed(seed).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            o.simulations, 10,
            "seed {seed}: four presets and a random composition, twice each"
        );
        preemptions += o.preemptions;
        rejected += o.rejected;
        dropped += o.dropped;
        replicated += o.replicated;
        faults += o.faults;
        failed += o.failed;
        failovers += o.failovers;
    }
    // The seeds exercise what the invariants guard: without these, the checks prove little.
    assert!(preemptions > 0, "no seed preempted a sequence");
    assert!(rejected > 0, "no seed rejected a request");
    assert!(dropped > 0, "no seed dropped a stored tensor");
    assert!(replicated > 0, "no seed replicated a tensor");
    assert!(faults > 0, "no seed injected a fault");
    assert!(failed > 0, "no fault failed a request");
    assert!(failovers > 0, "no request failed over");
}

#[test]
fn a_failing_seed_names_itself_and_the_command_that_reproduces_it() {
    let e = meshsim::vopr::SeedFailure {
        seed: 7,
        what: "ptstore: broken".into(),
    };
    let msg = e.to_string();
    assert!(msg.contains("seed 7: ptstore: broken"), "{msg}");
    assert!(msg.contains("meshsim vopr --seed 7"), "{msg}");
}

/// A seed whose node crash lands while a load from the crashed node is in flight and ends
/// before the reader hears of the crash: the read fails (its source's memory is gone) and the
/// request recomputes its prompt, with every invariant kept. Found with `meshsim vopr
/// --seeds 400`.
#[test]
fn a_load_whose_source_crashes_before_the_notice_fails_instead_of_being_used() {
    let o = run_seed(255).unwrap_or_else(|e| panic!("{e}"));
    assert!(o.failed_loads > 0, "{o:?}");
}
