use super::blocks::Blocks;
use super::index::BlockIndex;
use super::prompt_hashes::ChainHashes;
use super::reference::Reference;
use super::segments::{Run, Starts};
use super::*;

/// A chain of its own.
fn ch(hashes: &[u64]) -> ChainHashes {
    ChainHashes::from(hashes.to_vec())
}

#[test]
fn segment_start_bits_find_the_next_start_as_the_counts_do() {
    let mut rng = crate::rng::Stream::new(3, 1);
    for round in 0..200 {
        let mut starts = Starts::default();
        let span = 1 + rng.below(300) as usize;
        // Adds and removes at random positions, a position at most a few times.
        for _ in 0..rng.below(40) {
            let at = rng.below(span as u64) as usize;
            if starts.counts.get(at).is_some_and(|&n| n > 0) && rng.below(2) == 0 {
                starts.remove(at);
            } else {
                starts.add(at);
            }
        }
        starts.check().unwrap();
        for from in 0..span + 70 {
            for upto in [
                0,
                from,
                from + 1,
                from + 63,
                from + 64,
                from + 65,
                span,
                400,
            ] {
                let want = (from..upto)
                    .find(|&p| starts.counts.get(p).is_some_and(|&n| n > 0))
                    .unwrap_or(upto);
                assert_eq!(
                    starts.next(from, upto),
                    want,
                    "round {round}: {from}..{upto}"
                );
                assert_eq!(
                    starts.any_at(from),
                    starts.counts.get(from).is_some_and(|&n| n > 0)
                );
            }
        }
    }
}

#[test]
fn registered_blocks_are_found_after_release_until_evicted_lru_first() {
    let mut pool = BlockPool::new(4, true, true);
    let mut a = Blocks::default();
    assert!(pool.allocate(2, &mut a));
    pool.register_all(&mut a, &ch(&[10, 11]), 2, 0);
    let a_ids = a.ids().to_vec();
    pool.release(&mut a);
    assert!(a.is_empty());
    assert_eq!(pool.longest_cached_prefix(&ch(&[10, 11, 12]), 3), (2, 2));

    let mut b = Blocks::default();
    assert!(pool.allocate(2, &mut b));
    pool.register_all(&mut b, &ch(&[20, 21]), 2, 0);
    pool.release(&mut b);
    // Free queue, LRU first: [a1, a0, b1, b0] (each sequence releases last block first).
    let mut c = Blocks::default();
    assert!(pool.allocate(1, &mut c));
    assert_eq!(c.ids(), [a_ids[1]]);
    assert_eq!(pool.stats.evictions, 1);
    assert_eq!(pool.longest_cached_prefix(&ch(&[10, 11]), 2), (1, 1));
    assert_eq!(pool.longest_cached_prefix(&ch(&[20, 21]), 2), (2, 2));
    pool.check().unwrap();
}

#[test]
fn lookups_that_part_from_a_segment_find_where_whether_or_not_the_last_one_parted_there() {
    // One segment of ten blocks; the chains looked up share its first `k` hashes (a
    // system prompt), then go their own way. Hashes name their prefix: a chain that
    // parts at `k` differs at every position from `k` on.
    let mut pool = BlockPool::new(64, true, false);
    let mut a = Blocks::default();
    assert!(pool.allocate(10, &mut a));
    let own: Vec<u64> = (0..10).collect();
    pool.register_all(&mut a, &ch(&own), 10, 0);
    let parting = |k: u64, tag: u64| -> Vec<u64> {
        (0..12)
            .map(|p| if p < k { p } else { 1000 * tag + p })
            .collect()
    };
    // The first search finds 3 and leaves it as the hint; the next ones part at 3 (the
    // hint holds), at 6 and 1 (it does not: searched), at 3 again, and not at all (the
    // whole segment, and the lookup stops at its end).
    for (tag, k, want) in [
        (1, 3, 3),
        (2, 3, 3),
        (3, 6, 6),
        (4, 1, 1),
        (5, 3, 3),
        (6, 12, 10),
    ] {
        let chain = ch(&parting(k, tag));
        for upto in [12, 5, 2] {
            let got = pool.longest_cached_prefix(&chain, upto);
            let hits = want.min(upto as u32);
            assert_eq!(got, (hits, 0), "parting at {k}, up to {upto}");
        }
    }
    // Upto below the hint's place: the hint is out of range and not used.
    assert_eq!(pool.longest_cached_prefix(&ch(&parting(3, 7)), 3), (3, 0));
    pool.release(&mut a);
    assert_eq!(pool.longest_cached_prefix(&ch(&parting(3, 8)), 12), (3, 3));
    pool.check().unwrap();
}

#[test]
fn a_hit_takes_the_block_out_of_the_free_queue_and_makes_it_recent() {
    let mut pool = BlockPool::new(3, true, true);
    let mut a = Blocks::default();
    assert!(pool.allocate(3, &mut a));
    pool.register_all(&mut a, &ch(&[100, 101, 102]), 3, 0);
    let a = {
        let ids = a.ids().to_vec();
        pool.release(&mut a);
        ids
    };
    let mut held = Blocks::default();
    pool.take_cached(&ch(&[100]), 1, &mut held);
    assert_eq!(held.ids(), [a[0]]);
    assert_eq!(pool.free_blocks(), 2);
    pool.release(&mut held);
    // a0 is now the most recent: the next two allocations evict a2 then a1.
    let mut fresh = Blocks::default();
    assert!(pool.allocate(2, &mut fresh));
    assert_eq!(fresh.ids(), [a[2], a[1]]);
    assert_eq!(pool.longest_cached_prefix(&ch(&[100, 101]), 2), (1, 1));
    pool.check().unwrap();
}

#[test]
fn allocation_is_all_or_nothing_and_capacity_is_never_exceeded() {
    let mut pool = BlockPool::new(4, false, true);
    let mut a = Blocks::default();
    assert!(pool.allocate(3, &mut a));
    assert!(!pool.allocate(2, &mut a));
    assert_eq!(a.len(), 3);
    assert_eq!(pool.free_blocks(), 1);
    pool.register_all(&mut a, &ch(&[1]), 1, 0);
    assert_eq!(pool.cached_blocks(), 0, "caching off registers nothing");
    pool.release(&mut a);
    assert_eq!(pool.free_blocks(), 4);
    pool.check().unwrap();
}

#[test]
fn the_cache_hint_names_the_head_run_once_no_block_is_untouched() {
    use crate::actor::Hot;
    let mut pool = BlockPool::new(4, true, false);
    let mut a = Blocks::default();
    assert!(pool.allocate(2, &mut a));
    pool.release(&mut a);
    // Untouched blocks are taken first: no run is read by the next allocation.
    assert_eq!(pool.hint(Hot::default()), Hot::default());
    let mut b = Blocks::default();
    assert!(pool.allocate(2, &mut b));
    let head = &pool.runs[pool.head as usize];
    let h = pool.hint(Hot::default());
    assert_eq!(h.values[1], (head as *const Run).addr());
    assert_eq!(h.value_bytes[1] as usize, std::mem::size_of::<Run>());
    pool.release(&mut b);
}

#[test]
fn untouched_blocks_head_the_free_queue_in_id_order() {
    let mut pool = BlockPool::new(5, true, true);
    let mut a = Blocks::default();
    assert!(pool.allocate(2, &mut a));
    assert_eq!(a.ids(), [0, 1]);
    assert_eq!(pool.touched, 2);
    pool.release(&mut a);
    // Free queue: the untouched 2, 3, 4, then a1, a0 (released last block first).
    let mut b = Blocks::default();
    assert!(pool.allocate(5, &mut b));
    assert_eq!(b.ids(), [2, 3, 4, 1, 0]);
    pool.check().unwrap();
    pool.release(&mut b);
    assert_eq!(pool.free_blocks(), 5);
    pool.check().unwrap();
}

#[test]
fn without_caching_released_blocks_are_reused_first_and_untouched_ones_after() {
    let mut pool = BlockPool::new(4, false, true);
    let mut a = Blocks::default();
    assert!(pool.allocate(2, &mut a));
    pool.release(&mut a);
    let mut b = Blocks::default();
    assert!(pool.allocate(3, &mut b));
    assert_eq!(b.ids(), [0, 1, 2]);
    assert_eq!(pool.free_blocks(), 1);
    pool.check().unwrap();
    pool.release(&mut b);
    assert_eq!(pool.free_blocks(), 4);
    pool.check().unwrap();
}

#[test]
fn the_check_finds_each_kind_of_broken_pool() {
    for keep_ids in [true, false] {
        let mut pool = BlockPool::new(8, true, keep_ids);
        let mut a = Blocks::default();
        assert!(pool.allocate(4, &mut a));
        pool.register_all(&mut a, &ch(&[1, 2, 3, 4]), 4, 0);
        let mut b = Blocks::default();
        pool.take_cached(&ch(&[1, 2]), 2, &mut b);
        pool.release(&mut a);
        // Segment 0 holds 1..4, held to 2 by `b`; its positions 2 and 3 are one run.
        pool.check().unwrap();
        type Break = (&'static str, fn(&mut BlockPool));
        let breaks: [Break; 8] = [
            ("free counter", |p| p.free -= 1),
            ("start bits", |p| p.starts.any[0] = 0),
            ("free from", |p| p.segs[0].free_from = 1),
            ("holders", |p| p.segs[0].at_max = 0),
            ("a run's end", |p| p.runs[p.head as usize].lo += 1),
            ("starts", |p| p.starts.counts[0] += 1),
            ("index", |p| p.index = BlockIndex::new(8)),
            ("a hash held twice", |p| {
                let s = p.new_seg(3, 4);
                let id = p.segs[0].ids.last().copied();
                // Position 3 of segment 0's chain: its hash 4.
                p.segs[s as usize].chain = ch(&[1, 2, 3, 4]);
                p.segs[s as usize].len = 1;
                p.segs[s as usize].ids.extend(id);
                p.index_seg(s);
            }),
        ];
        for (what, f) in breaks {
            let mut broken = pool.clone();
            f(&mut broken);
            assert!(broken.check().is_err(), "{what} (ids: {keep_ids})");
        }
    }
}

#[test]
fn a_run_that_is_never_emptied_stays_as_small_as_its_blocks() {
    for keep_ids in [true, false] {
        let mut pool = BlockPool::new(4, true, keep_ids);
        let mut a = Blocks::default();
        assert!(pool.allocate(4, &mut a));
        pool.release(&mut a);
        // One unregistered block taken from the head of the only run and given back to
        // its tail, over and over: the run always holds blocks.
        for _ in 0..10_000 {
            assert!(pool.allocate(1, &mut a));
            pool.release(&mut a);
        }
        pool.check().unwrap();
        let run = &pool.runs[pool.head as usize];
        assert_eq!((pool.runs.len(), run.hi - run.lo), (1, 4));
        assert!(run.hi <= 8 && run.anon.len() <= 8, "{run:?}");
    }
}

#[test]
fn shared_blocks_are_freed_only_by_their_last_holder() {
    let mut pool = BlockPool::new(2, true, true);
    let mut a = Blocks::default();
    assert!(pool.allocate(1, &mut a));
    pool.register_all(&mut a, &ch(&[7]), 1, 0);
    let mut b = Blocks::default();
    pool.take_cached(&ch(&[7]), 1, &mut b);
    pool.release(&mut a);
    assert_eq!(pool.free_blocks(), 1);
    pool.release(&mut b);
    assert_eq!(pool.free_blocks(), 2);
    pool.check().unwrap();
}

#[test]
fn the_pool_agrees_with_the_obvious_lru_pool_through_random_serving() {
    use crate::hash::mix64;
    use crate::rng::Stream;
    for seed in 0..300u64 {
        let mut rng = Stream::new(seed, 7);
        let n = 8 + rng.below(100) as u32;
        // One run in four without caching: blocks come and go, nothing is found again.
        let caching = seed % 4 != 0;
        let mut pool = BlockPool::new(n, caching, true);
        // The same pool counting blocks only, as a simulation has it: it must agree on
        // everything but the ids.
        let mut count = BlockPool::new(n, caching, false);
        let mut model = Reference::new(n, caching);
        // Running sequences: their hash chain, blocks held, and blocks registered so far.
        let mut running: Vec<(ChainHashes, Blocks, Blocks, usize)> = Vec::new();
        let mut leads: std::collections::HashMap<(u64, usize), std::sync::Arc<[u64]>> =
            std::collections::HashMap::new();
        for step in 0..600 {
            let at = format!("seed {seed}, step {step}");
            match rng.below(4) {
                // A new sequence: a prompt of one of 4 contexts (shared leading blocks)
                // then blocks of its own; it takes its cached prefix and allocates the rest.
                0 | 1 => {
                    let context = rng.below(4);
                    let shared = rng.below(24) as usize;
                    let len = 1 + rng.below(30) as usize;
                    let own = rng.next_u64();
                    let hash = |i: usize| {
                        let root = if i < shared { context } else { own };
                        mix64(root ^ mix64(i as u64 + 1))
                    };
                    let hashes: Vec<u64> = (0..len).map(hash).collect();
                    // As the memo gives them: the leading blocks in an array shared by
                    // every prompt with the same leading part (one prompt in two), the
                    // rest its own; or all its own.
                    let chain = if rng.below(2) == 0 {
                        let lead = leads
                            .entry((context, shared.min(len)))
                            .or_insert_with(|| (0..shared.min(len)).map(hash).collect())
                            .clone();
                        ChainHashes::from_parts(lead, hashes[shared.min(len)..].to_vec())
                    } else {
                        ChainHashes::from(hashes.clone())
                    };
                    assert_eq!(chain.to_vec(), hashes);
                    let (hits, free) = pool.longest_cached_prefix(&chain, len);
                    assert_eq!((hits, free), model.longest_cached_prefix(&hashes), "{at}");
                    assert_eq!(
                        (hits, free),
                        count.longest_cached_prefix(&chain, len),
                        "{at}"
                    );
                    let (mut a, mut c, mut b) = (Blocks::default(), Blocks::default(), Vec::new());
                    pool.take_cached(&chain, hits as usize, &mut a);
                    count.take_cached(&chain, hits as usize, &mut c);
                    model.take_cached(&hashes[..hits as usize], &mut b);
                    let rest = len as u32 - hits;
                    let ok = pool.allocate(rest, &mut a);
                    assert_eq!(ok, model.allocate(rest, &mut b), "{at}");
                    assert_eq!(ok, count.allocate(rest, &mut c), "{at}");
                    assert_eq!(a.ids(), b, "{at}: blocks handed out");
                    assert_eq!((a.len(), c.len(), c.ids()), (b.len(), b.len(), &[][..]));
                    if ok {
                        running.push((chain, a, c, hits as usize));
                    } else {
                        // As an instance that cannot admit it: give the hits back.
                        pool.release(&mut a);
                        count.release(&mut c);
                        model.release(&b);
                    }
                }
                // A running sequence computes some more of its prompt: those blocks are
                // registered (a block whose hash another holds stays unregistered).
                2 if !running.is_empty() => {
                    let i = rng.below(running.len() as u64) as usize;
                    let (hashes, blocks, counted, done) = &mut running[i];
                    let upto =
                        *done + rng.range_inclusive(0, (hashes.len() - *done) as u64) as usize;
                    pool.register_all(blocks, hashes, upto, *done);
                    count.register_all(counted, hashes, upto, *done);
                    assert_eq!(blocks.own(), counted.own(), "{at}");
                    let ids = &blocks.ids()[*done..upto];
                    for (k, &b) in ids.iter().enumerate() {
                        model.register(b, hashes.get(*done + k));
                    }
                    *done = upto;
                }
                // A sequence finishes (or is preempted): it releases every block.
                _ if !running.is_empty() => {
                    let i = rng.below(running.len() as u64) as usize;
                    let (_, mut blocks, mut counted, _) = running.swap_remove(i);
                    let ids = blocks.ids().to_vec();
                    pool.release(&mut blocks);
                    count.release(&mut counted);
                    model.release(&ids);
                }
                _ => {}
            }
            let free = model.free.len() + model.stack.len();
            assert_eq!(pool.free_blocks() as usize, free, "{at}");
            assert_eq!(pool.stats.evictions, model.evictions, "{at}");
            assert_eq!(pool.stats.hit_blocks, model.hit_blocks, "{at}");
            assert_eq!(pool.cached_blocks(), model.index.len(), "{at}");
            pool.check().unwrap_or_else(|e| panic!("{at}: {e}"));
            let counted = (count.free_blocks(), count.stats, count.cached_blocks());
            assert_eq!(
                counted,
                (pool.free_blocks(), pool.stats, pool.cached_blocks())
            );
            assert_eq!(count.held_registered(), pool.held_registered(), "{at}");
            count
                .check()
                .unwrap_or_else(|e| panic!("{at}: counting: {e}"));
        }
    }
}
