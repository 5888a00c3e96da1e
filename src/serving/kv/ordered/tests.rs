use super::reference::Reference;
use super::*;
use crate::hash::mix64;
use crate::rng::Stream;

/// A chain of its own.
fn ch(hashes: &[u64]) -> ChainHashes {
    ChainHashes::from(hashes.to_vec())
}

/// A sequence that allocates `hashes.len()` blocks, registers them all and releases them.
fn fill(pool: &mut OrderedPool, hashes: &[u64]) {
    let mut a = Blocks::default();
    assert!(pool.allocate(hashes.len() as u32, &mut a));
    pool.register_all(&mut a, &ch(hashes), hashes.len(), 0);
    pool.release(&mut a);
}

/// A lookup that takes its hits and releases them at once.
fn hit(pool: &mut OrderedPool, hashes: &[u64]) -> u32 {
    let (n, _) = pool.longest_cached_prefix(&ch(hashes), hashes.len());
    let mut a = Blocks::default();
    pool.take_cached(&ch(hashes), n as usize, &mut a);
    pool.release(&mut a);
    n
}

#[test]
fn lfu_evicts_the_least_hit_block_and_of_equals_the_least_recently_released() {
    let mut pool = OrderedPool::new(4, GpuEviction::Lfu);
    fill(&mut pool, &[10, 11]);
    fill(&mut pool, &[20, 21]);
    // 20 is hit twice, 10 once: counts 10 -> 2, 11 -> 1, 20 -> 3, 21 -> 1.
    assert_eq!(hit(&mut pool, &[20, 99]), 1);
    assert_eq!(hit(&mut pool, &[20, 99]), 1);
    assert_eq!(hit(&mut pool, &[10, 99]), 1);
    // 11 and 21 have one access each; 11 was released first (sequence 10, 11 releases 11
    // then 10): it goes first, then 21, then 10.
    let mut a = Blocks::default();
    assert!(pool.allocate(1, &mut a));
    assert_eq!(pool.cached_hashes(), [10, 20, 21]);
    assert!(pool.allocate(1, &mut a));
    assert_eq!(pool.cached_hashes(), [10, 20]);
    assert!(pool.allocate(1, &mut a));
    assert_eq!(pool.cached_hashes(), [20]);
    assert_eq!(pool.stats.evictions, 3);
    pool.check().unwrap();
    // Hashless free blocks go before any registered one.
    pool.release(&mut a);
    assert!(pool.allocate(3, &mut a));
    assert_eq!(pool.cached_hashes(), [20]);
    pool.check().unwrap();
}

#[test]
fn s3fifo_keeps_a_twice_hit_prefix_that_lru_would_lose_to_a_scan() {
    // Ten blocks: a small FIFO of 1 and a main FIFO of 9.
    let mut pool = OrderedPool::new(10, GpuEviction::S3Fifo);
    fill(&mut pool, &[1, 2]);
    assert_eq!(hit(&mut pool, &[1, 2]), 2);
    assert_eq!(hit(&mut pool, &[1, 2]), 2);
    // A scan of one-off prompts: 1 and 2 (counter 2) move to the main FIFO, the scan's blocks
    // go through the small one.
    for k in 0..20 {
        fill(
            &mut pool,
            &[100 + 4 * k, 101 + 4 * k, 102 + 4 * k, 103 + 4 * k],
        );
        pool.check().unwrap();
    }
    assert_eq!(hit(&mut pool, &[1, 2]), 2);
    pool.check().unwrap();
}

#[test]
fn blocks_in_use_are_never_evicted_and_a_lookup_stops_at_the_first_missing_block() {
    for order in [GpuEviction::Lfu, GpuEviction::S3Fifo] {
        let mut pool = OrderedPool::new(3, order);
        let mut a = Blocks::default();
        assert!(pool.allocate(3, &mut a));
        pool.register_all(&mut a, &ch(&[1, 2, 3]), 3, 0);
        pool.release(&mut a);
        let mut held = Blocks::default();
        pool.take_cached(&ch(&[1, 2]), 2, &mut held);
        assert_eq!((held.len(), held.own()), (2, 0));
        // One free block (3): the only one an allocation can take.
        assert!(!pool.allocate(2, &mut a));
        assert!(pool.allocate(1, &mut a));
        assert_eq!(pool.cached_hashes(), [1, 2], "{order:?}");
        assert_eq!(pool.longest_cached_prefix(&ch(&[1, 2, 3]), 3), (2, 0));
        assert_eq!(pool.held_registered(), 2);
        pool.release(&mut held);
        pool.release(&mut a);
        // The hashless block first, then one eviction. LFU: 1 and 2 have two accesses each,
        // and 2 was released first (last block first): 2 goes, and 1 is still a hit.
        // S3-FIFO (a small FIFO of 0 blocks: all wait there for eviction): 1, read once, is
        // the oldest: it goes, and 2 stays registered but no lookup reaches it.
        assert!(pool.allocate(2, &mut a));
        let (left, hits) = match order {
            GpuEviction::S3Fifo => ([2], 0),
            _ => ([1], 1),
        };
        assert_eq!(pool.cached_hashes(), left, "{order:?}");
        assert_eq!(pool.longest_cached_prefix(&ch(&[1, 2]), 2), (hits, hits));
        pool.release(&mut a);
        pool.check().unwrap();
    }
}

#[test]
fn the_check_finds_each_kind_of_broken_pool() {
    for order in [GpuEviction::Lfu, GpuEviction::S3Fifo] {
        let mut pool = OrderedPool::new(8, order);
        let mut a = Blocks::default();
        assert!(pool.allocate(4, &mut a));
        pool.register_all(&mut a, &ch(&[1, 2, 3]), 3, 0);
        let mut b = Blocks::default();
        pool.take_cached(&ch(&[1]), 1, &mut b);
        pool.release(&mut a);
        pool.check().unwrap();
        type Break = (&'static str, fn(&mut OrderedPool));
        let breaks: [Break; 5] = [
            ("free counter", |p| p.free_cached += 1),
            ("stack", |p| p.plain.push(0)),
            ("index", |p| {
                p.index.remove(&2);
            }),
            ("holders", |p| p.blocks[1].refs += 1),
            ("order", |p| {
                let h = 3;
                match &mut p.order {
                    Order::Lfu(set) => {
                        set.pop_first();
                    }
                    Order::S3Fifo(q) => q.set_hidden(h, true),
                }
            }),
        ];
        for (what, f) in breaks {
            // The pool is not `Clone` (the store's queue is not): rebuild it each time.
            let mut broken = OrderedPool::new(8, order);
            let mut a = Blocks::default();
            assert!(broken.allocate(4, &mut a));
            broken.register_all(&mut a, &ch(&[1, 2, 3]), 3, 0);
            let mut b = Blocks::default();
            broken.take_cached(&ch(&[1]), 1, &mut b);
            broken.release(&mut a);
            f(&mut broken);
            assert!(broken.check().is_err(), "{what} ({order:?})");
        }
    }
}

/// Random serving through the pool and the reference in lockstep: new sequences (a lookup,
/// its hits taken, the rest allocated), registrations as prompts are computed, releases.
/// Every answer is compared: hit lengths, allocations (and the block ids handed out), which
/// hashes stay cached, the counters. Returns the reference, for what it counts.
fn lockstep(order: GpuEviction, seed: u64, n: u32, steps: usize) -> Reference {
    let mut rng = Stream::new(seed, 11);
    let mut pool = OrderedPool::new(n, order);
    let mut model = Reference::new(n, order);
    // Running sequences: their hashes, blocks, and blocks registered so far.
    let mut running: Vec<(Vec<u64>, Blocks, usize)> = Vec::new();
    // Prompts up to the pool's size and somewhat beyond (some never fit).
    let longest = (n as u64 + n as u64 / 2).clamp(2, 30);
    for step in 0..steps {
        let at = format!("{order:?}, seed {seed}, {n} blocks, step {step}");
        match rng.below(4) {
            0 | 1 => {
                let context = rng.below(4);
                let shared = rng.below(longest) as usize;
                let len = 1 + rng.below(longest) as usize;
                let own = rng.next_u64();
                let hashes: Vec<u64> = (0..len)
                    .map(|i| {
                        let root = if i < shared { context } else { own };
                        mix64(root ^ mix64(i as u64 + 1))
                    })
                    .collect();
                let chain = ch(&hashes);
                let (hits, free) = pool.longest_cached_prefix(&chain, len);
                assert_eq!((hits, free), model.longest_cached_prefix(&hashes), "{at}");
                let (mut a, mut b) = (Blocks::default(), Vec::new());
                pool.take_cached(&chain, hits as usize, &mut a);
                model.take_cached(&hashes[..hits as usize], &mut b);
                let rest = len as u32 - hits;
                let ok = pool.allocate(rest, &mut a);
                assert_eq!(ok, model.allocate(rest, &mut b), "{at}");
                assert_eq!(a.ids(), b, "{at}: blocks handed out");
                if ok {
                    running.push((hashes, a, hits as usize));
                } else {
                    pool.release(&mut a);
                    model.release(&b);
                }
            }
            2 if !running.is_empty() => {
                let i = rng.below(running.len() as u64) as usize;
                let (hashes, blocks, done) = &mut running[i];
                let upto = *done + rng.range_inclusive(0, (hashes.len() - *done) as u64) as usize;
                pool.register_all(blocks, &ch(hashes), upto, *done);
                let ids = &blocks.ids()[*done..upto];
                for (&b, &h) in ids.iter().zip(&hashes[*done..upto]) {
                    model.register(b, h);
                }
                *done = upto;
            }
            _ if !running.is_empty() => {
                let i = rng.below(running.len() as u64) as usize;
                let (_, mut blocks, _) = running.swap_remove(i);
                let ids = blocks.ids().to_vec();
                pool.release(&mut blocks);
                model.release(&ids);
            }
            _ => {}
        }
        assert_eq!(pool.free_blocks() as usize, model.free(), "{at}");
        assert_eq!(pool.cached_hashes(), model.cached_hashes(), "{at}");
        assert_eq!(pool.stats.evictions, model.evictions, "{at}");
        assert_eq!(pool.stats.hit_blocks, model.hit_blocks, "{at}");
        // What the instance counts: each sequence's own blocks and the registered ones held.
        let own: u32 = running.iter().map(|(_, b, _)| b.own()).sum();
        let in_use = n - pool.free_blocks();
        let distinct: std::collections::BTreeSet<BlockId> = running
            .iter()
            .flat_map(|(_, b, _)| b.ids().iter().copied())
            .collect();
        assert_eq!(distinct.len() as u32, in_use, "{at}");
        assert_eq!(own + pool.held_registered(), in_use, "{at}");
        pool.check().unwrap_or_else(|e| panic!("{at}: {e}"));
    }
    model
}

/// Pools of 1 and 2 blocks for the first seeds, then 3 to 62.
fn blocks_of(seed: u64) -> u32 {
    match seed {
        0..10 => 1,
        10..20 => 2,
        _ => 3 + Stream::new(seed, 12).below(60) as u32,
    }
}

#[test]
fn the_lfu_pool_agrees_with_the_obvious_lfu_pool_through_random_serving() {
    let (mut evictions, mut hits) = (0, 0);
    for seed in 0..120u64 {
        let m = lockstep(GpuEviction::Lfu, seed, blocks_of(seed), 500);
        (evictions, hits) = (evictions + m.evictions, hits + m.hit_blocks);
    }
    assert!(
        evictions > 1000 && hits > 1000,
        "{evictions} evictions, {hits} hits"
    );
}

#[test]
fn the_s3fifo_pool_agrees_with_plain_s3fifo_queues_through_random_serving() {
    let mut seen = [0u64; 5];
    for seed in 0..120u64 {
        let m = lockstep(GpuEviction::S3Fifo, seed, blocks_of(seed), 500);
        let now = [
            m.evictions,
            m.ghost_hits,
            m.promotions,
            m.reinsertions,
            m.passed_over,
        ];
        for (s, n) in seen.iter_mut().zip(now) {
            *s += n;
        }
    }
    // Every path of the algorithm was taken, many times.
    assert!(seen.iter().all(|&n| n > 100), "{seen:?}");
}
