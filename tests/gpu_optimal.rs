//! The GPU cache's best possible hit ratio beside the one a run reached: never below it, and,
//! with a memory that holds everything, every block an instance saw before.

mod common;

use std::collections::HashSet;

use meshsim::serving::optimal::gpu_optimal_hit_ratio;
use meshsim::workload::ReqId;

#[test]
fn the_optimum_bounds_every_policys_gpu_hits_and_counts_every_repeat_when_memory_is_unbounded() {
    let s = common::small();
    let trace = meshsim::serving::build::trace(&s).unwrap();
    let runs = common::run(&s, 2);
    let cfg = &s.serving.instance;
    let mut cached = 0;
    for run in &runs {
        let sum = &run.summary;
        let optimum = sum.gpu_optimal_hit_ratio.expect("computed for a small run");
        assert!(optimum >= sum.gpu_hit_ratio(), "{}: {optimum}", sum.policy);
        if sum.gpu_hit_ratio() > 0.0 {
            cached += 1;
        }
        // Unbounded memory: a block hits when its instance saw it before, in admission order.
        let records = &run.report.records;
        let unbounded =
            gpu_optimal_hit_ratio(&trace, records, s.instances(), cfg.block_size, u64::MAX / 2)
                .unwrap();
        let mut order: Vec<_> = records.iter().filter(|r| r.end.is_some()).collect();
        order.sort_by_key(|r| (r.admitted, r.id));
        let mut seen: Vec<HashSet<u64>> = vec![HashSet::new(); s.instances() as usize];
        let (mut hit, mut prompt) = (0u64, 0u64);
        let mut hashes = Vec::new();
        for r in order {
            prompt += r.prompt_tokens as u64;
            trace.block_hashes(ReqId(r.id), cfg.block_size as usize, &mut hashes);
            for &h in &hashes {
                if !seen[r.instance as usize].insert(h) {
                    hit += cfg.block_size as u64;
                }
            }
        }
        assert_eq!(unbounded, hit as f64 / prompt as f64, "{}", sum.policy);
        assert!(unbounded >= optimum);
        // No memory at all: nothing hits.
        let none = gpu_optimal_hit_ratio(&trace, records, s.instances(), cfg.block_size, 1);
        assert_eq!(none, Some(0.0));
    }
    assert!(
        cached >= 2,
        "local-prefix and the stores keep prefixes on GPUs"
    );
}
