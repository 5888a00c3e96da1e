//! The router's KV-event index: bounded sets, removals, clears, and the tier credits' part
//! in the pick.

use super::*;

fn gpu(instance: u32, events: Vec<KvEvent>) -> KvEvents {
    KvEvents {
        instance: Some(instance),
        events,
    }
}

fn store(changes: Vec<Change>) -> KvEvents {
    KvEvents {
        instance: None,
        events: changes.into_iter().map(KvEvent::Store).collect(),
    }
}

const CREDITS: Credits = Credits {
    overlap_weight: 1.0,
    host: 0.8,
    disk: 0.5,
};

#[test]
fn an_instances_set_holds_at_most_its_kv_blocks_and_forgets_the_oldest_report() {
    let mut kv = KvIndex::new(1, 3, 16, CREDITS, None);
    kv.apply(&gpu(0, (1..=5).map(KvEvent::Stored).collect()));
    assert_eq!(kv.gpu[0].len(), 3);
    assert_eq!(kv.gpu_hit(0, &[3, 4, 5]), 3);
    assert_eq!(kv.gpu_hit(0, &[1, 2, 3]), 0);
}

#[test]
fn a_removed_block_ends_the_match_and_a_clear_forgets_everything() {
    let mut kv = KvIndex::new(2, 100, 16, CREDITS, None);
    kv.apply(&gpu(1, (1..=4).map(KvEvent::Stored).collect()));
    assert_eq!(kv.gpu_hit(1, &[1, 2, 3, 4]), 4);
    assert_eq!(kv.gpu_hit(0, &[1, 2, 3, 4]), 0, "another instance's report");
    // Removals last to first, as the pool publishes them: the head still matches.
    kv.apply(&gpu(1, vec![KvEvent::Removed(4), KvEvent::Removed(3)]));
    assert_eq!(kv.gpu_hit(1, &[1, 2, 3, 4]), 2);
    kv.apply(&gpu(1, vec![KvEvent::Stored(9), KvEvent::Cleared]));
    assert_eq!(kv.gpu_hit(1, &[1, 2]), 0);
    assert_eq!(kv.gpu_hit(1, &[9]), 0);
    // An event about an instance the index does not have is ignored.
    kv.apply(&gpu(7, vec![KvEvent::Stored(1)]));
    kv.lost(1);
    assert_eq!(kv.gpu.len(), 2);
}

#[test]
fn the_gpu_hit_wins_until_the_load_outweighs_it() {
    let mut kv = KvIndex::new(2, 100, 16, CREDITS, None);
    let alive = [true, true];
    let p: Vec<u64> = (1..=10).collect();
    assert_eq!(
        kv.pick(p.clone(), &alive),
        Some(0),
        "a tie: the lowest index"
    );
    kv.apply(&gpu(1, p.iter().copied().map(KvEvent::Stored).collect()));
    assert_eq!(kv.pick(p.clone(), &alive), Some(1));
    assert_eq!(kv.last_gpu_hit(), 10);
    // 0 + 11 against 10 + 0.
    kv.sent(1, 11);
    assert_eq!(kv.pick(p.clone(), &alive), Some(0));
    assert_eq!(kv.last_gpu_hit(), 0);
    kv.ended(1, 11);
    assert_eq!(kv.pick(p, &[true, false]), Some(0), "only live instances");
}

/// Instances 0 and 1 on nodes 0 and 1 under a node-scoped store of 2-block chunks.
fn node_scoped(credits: Credits) -> KvIndex {
    let view = StoreView::new(2, vec![Some(0), Some(1)], 100);
    KvIndex::new(2, 100, 16, credits, Some(view))
}

#[test]
fn blocks_the_store_can_load_are_credited_by_tier_and_change_the_pick() {
    let p: Vec<u64> = vec![11, 12, 13, 14];
    let id = |h: u64, node: u64| crate::hash::mix(h, node);
    let held = store(vec![
        Change::Stored {
            node: 0,
            id: id(12, 0),
        },
        Change::Stored {
            node: 0,
            id: id(14, 0),
        },
    ]);
    let alive = [true, true];
    // Instance 0 carries 2 active blocks. Host credit 0.8: 4 - 3.2 + 2 = 2.8 against 4.
    let mut kv = node_scoped(CREDITS);
    kv.apply(&held);
    kv.sent(0, 2);
    assert_eq!(kv.pick(p.clone(), &alive), Some(0));
    assert_eq!(kv.last_gpu_hit(), 0, "a store hit is not a GPU hit");
    // Host credit 0.4: 4 - 1.6 + 2 = 4.4 against 4.
    let mut kv = node_scoped(Credits {
        host: 0.4,
        ..CREDITS
    });
    kv.apply(&held);
    kv.sent(0, 2);
    assert_eq!(kv.pick(p.clone(), &alive), Some(1));
    // Demoted to SSD (credit 0.5): 4 - 2 + 2 = 4 against 4, a tie: the lowest index; with
    // the second chunk dropped, only 2 blocks are credited: 4 - 1 + 2 = 5 against 4.
    let mut kv = node_scoped(CREDITS);
    kv.apply(&held);
    kv.sent(0, 2);
    let to_ssd = |x| Change::Demoted { node: 0, id: x };
    kv.apply(&store(vec![to_ssd(id(12, 0)), to_ssd(id(14, 0))]));
    assert_eq!(kv.pick(p.clone(), &alive), Some(0));
    kv.apply(&store(vec![Change::Dropped {
        node: 0,
        id: id(14, 0),
    }]));
    assert_eq!(kv.pick(p.clone(), &alive), Some(1));
    // A store that lost everything credits nothing.
    kv.apply(&KvEvents {
        instance: None,
        events: vec![KvEvent::StoreCleared(0)],
    });
    assert_eq!(kv.store.as_ref().map(|s| s.entries), Some(0));
}

#[test]
fn the_store_credits_only_blocks_past_the_gpu_hit_and_only_a_continuing_run() {
    let mut kv = node_scoped(CREDITS);
    let id = |h: u64| crate::hash::mix(h, 0);
    kv.apply(&gpu(0, vec![KvEvent::Stored(11)]));
    // Chunk 0 (blocks 0-1) and chunk 2 (blocks 4-5), not chunk 1.
    kv.apply(&store(vec![
        Change::Stored {
            node: 0,
            id: id(12),
        },
        Change::Replicated {
            node: 0,
            id: id(16),
        },
    ]));
    let p: Vec<u64> = (11..=16).collect();
    let h = kv.gpu_hit(0, &p);
    assert_eq!(h, 1);
    // Block 1 of chunk 0 (block 0 is a GPU hit); chunk 2 is past a gap.
    assert_eq!(kv.credited(0, &p, h), 0.8);
    // Instance 1's namespace is another: nothing for it.
    assert_eq!(kv.credited(1, &p, 0), 0.0);
}

#[test]
fn the_store_index_is_bounded() {
    let mut view = StoreView::new(1, vec![None], 2);
    for id in 0..10 {
        view.apply(Change::Stored { node: 0, id });
    }
    assert_eq!(view.entries, view.max_entries);
    assert_eq!(view.max_entries, 4);
    view.apply(Change::Dropped { node: 0, id: 0 });
    assert_eq!(view.entries, 3);
}
