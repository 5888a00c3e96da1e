use super::*;
use crate::units::Nanos;
use crate::workload::{Request, TokenArena};

/// A trace of one request per prompt (a list of segments of `arena`).
fn trace_of(arena: TokenArena, prompts: Vec<Vec<SegId>>) -> Arc<Trace> {
    let requests = prompts
        .into_iter()
        .map(|segs| Request {
            arrival: Nanos::ZERO,
            prompt_tokens: segs.iter().map(|&s| arena.len(s) as u32).sum(),
            segments: segs,
            output_tokens: 1,
            context: 0,
        })
        .collect();
    Arc::new(Trace {
        requests,
        arena,
        contexts: 2,
    })
}

#[test]
fn lists_under_the_same_key_get_numbers_of_their_own_and_their_own_chains() {
    // Three prompts, [a, q], [b, q], [a, q], every list under one key (as colliding
    // lists' keys would have them): [a] and [b] must get numbers of their own, and each
    // prompt its own chain.
    let mut arena = TokenArena::default();
    let a = arena.push(0..40);
    let b = arena.push(500..540);
    let q = arena.push(900..910);
    let trace = trace_of(arena, vec![vec![a, q], vec![b, q], vec![a, q], vec![q]]);
    let leads = Leads::with_key(&trace, |_| 7);
    assert_eq!(leads.of, [0, 1, 0, NO_LEAD]);
    assert_eq!(leads.lists, 2);
    let memo = PromptHashes::with_leads(leads, trace.clone());
    let (mut want, mut got) = (Vec::new(), Vec::new());
    for id in trace.ids() {
        memo.block_hashes(id, 16, &mut got);
        trace.block_hashes(id, 16, &mut want);
        assert_eq!(got, want, "request {}", id.0);
    }
    // [a]'s 2 full blocks and [b]'s.
    assert_eq!(memo.memo.lock().unwrap().hashes, 4);
}

#[test]
fn a_chain_of_another_block_size_is_replaced() {
    let mut arena = TokenArena::default();
    let a = arena.push(0..40);
    let q = arena.push(900..910);
    let trace = trace_of(arena, vec![vec![a, q]]);
    let memo = PromptHashes::new(trace.clone());
    let (mut want, mut got) = (Vec::new(), Vec::new());
    for block_size in [16, 8, 16] {
        memo.block_hashes(ReqId(0), block_size, &mut got);
        trace.block_hashes(ReqId(0), block_size, &mut want);
        assert_eq!(got, want, "blocks of {block_size}");
        let m = memo.memo.lock().unwrap();
        assert_eq!(m.chains[0].as_ref().unwrap().block_size, block_size);
        assert_eq!(
            m.hashes,
            40 / block_size,
            "the replaced chain's hashes not counted"
        );
    }
}

#[test]
fn prompts_with_the_same_leading_segments_share_one_array_of_their_hashes() {
    let mut arena = TokenArena::default();
    let ctx = arena.push(0..100);
    let other = arena.push(200..300);
    let (q1, q2) = (arena.push(900..920), arena.push(950..990));
    let trace = trace_of(
        arena,
        vec![vec![ctx, q1], vec![ctx, q2], vec![other, q1], vec![q1]],
    );
    let memo = PromptHashes::new(trace.clone());
    let c: Vec<ChainHashes> = trace.ids().map(|id| memo.chain_hashes(id, 16)).collect();
    // 100 tokens: 6 full blocks in the shared array; the question's blocks are the
    // prompt's own (the partial block's 4 tokens go on into them).
    assert_eq!((c[0].lead().len(), c[0].tail.as_slice().len()), (6, 1));
    assert_eq!((c[1].lead().len(), c[1].tail.as_slice().len()), (6, 2));
    let lead = |c: &ChainHashes| c.lead.clone().expect("a shared array");
    assert!(
        Arc::ptr_eq(&lead(&c[0]), &lead(&c[1])),
        "one array for [ctx]"
    );
    assert!(!Arc::ptr_eq(&lead(&c[0]), &lead(&c[2])));
    assert!(c[3].lead.is_none(), "no leading segments: all its own");
    let mut want = Vec::new();
    for (id, chain) in trace.ids().zip(&c) {
        trace.block_hashes(id, 16, &mut want);
        assert_eq!(chain.to_vec(), want);
        assert_eq!(chain.len(), want.len());
        assert!((0..want.len()).all(|i| chain.get(i) == want[i]));
    }
    // Emptying the memo leaves the arrays to those who hold them.
    memo.memo
        .lock()
        .unwrap()
        .chains
        .iter_mut()
        .for_each(|c| *c = None);
    trace.block_hashes(ReqId(0), 16, &mut want);
    assert_eq!(c[0].to_vec(), want);
}

#[test]
fn a_missing_chain_is_hashed_with_the_next_missing_ones() {
    // Six prompts: contexts a, b, a, c, d, e (each after a system prompt), one question.
    let mut arena = TokenArena::default();
    let system = arena.push(0..32);
    let ctx: Vec<SegId> = (0..5).map(|i| arena.push(100 * i..100 * i + 70)).collect();
    let q = arena.push(900..920);
    let order = [0, 1, 0, 2, 3, 4];
    let trace = trace_of(
        arena,
        order.iter().map(|&c| vec![system, ctx[c], q]).collect(),
    );
    let memo = PromptHashes::new(trace.clone());
    let first = memo.chain_hashes(ReqId(0), 16);
    // The first miss hashed a, b, c and d together (a's repeat is not hashed twice), and
    // counts their hashes: 102 tokens, 6 full blocks each.
    {
        let m = memo.memo.lock().unwrap();
        // Lists are numbered in order of first appearance: a 0, b 1, c 2, d 3, e 4.
        assert_eq!(memo.leads().of, [0, 1, 0, 2, 3, 4]);
        let held: Vec<bool> = m.chains.iter().map(Option::is_some).collect();
        assert_eq!(held, [true, true, true, true, false]);
        assert_eq!(m.hashes, 24);
    }
    // Every chain is the trace's; the later requests share the arrays made early.
    let mut want = Vec::new();
    for id in trace.ids() {
        let got = memo.chain_hashes(id, 16);
        trace.block_hashes(id, 16, &mut want);
        assert_eq!(got.to_vec(), want, "request {}", id.0);
    }
    let again = memo.chain_hashes(ReqId(2), 16);
    assert!(Arc::ptr_eq(
        first.lead.as_ref().unwrap(),
        again.lead.as_ref().unwrap()
    ));
    let m = memo.memo.lock().unwrap();
    assert!(m.chains.iter().all(Option::is_some));
}

#[test]
fn memoised_hashes_are_the_traces_for_every_block_size_and_segment_split() {
    let mut arena = TokenArena::default();
    let system = arena.push(0..5);
    let ctx_a = arena.push(100..137);
    let ctx_b = arena.push(200..216);
    let questions: Vec<SegId> = (0..4)
        .map(|i| arena.push(1000 * i..1000 * i + 9 * i))
        .collect();
    let mut prompts = Vec::new();
    for &q in &questions {
        prompts.extend([
            vec![system, ctx_a, q],
            vec![system, ctx_b, ctx_a, q],
            vec![q],
            vec![ctx_b, q],
        ]);
    }
    let trace = trace_of(arena, prompts);
    let memo = PromptHashes::new(trace.clone());
    let (mut want, mut got) = (Vec::new(), Vec::new());
    for block_size in [1, 4, 5, 16, 64] {
        for round in 0..2 {
            for id in trace.ids() {
                trace.block_hashes(id, block_size, &mut want);
                got.push(round as u64);
                memo.block_hashes(id, block_size, &mut got);
                assert_eq!(got, want, "request {} blocks of {block_size}", id.0);
            }
        }
    }
}
