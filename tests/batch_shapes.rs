//! [`BatchShape::add_decoding`] is a closed form for the decode steps of many sequences at
//! once (the scheduler adds its steady decoders with it, without visiting each): it must give
//! exactly the shape that adding each sequence's one-token step with [`BatchShape::add`]
//! gives, field by field, for any number of sequences and any split of their cached tokens,
//! whatever the shape already holds.

use meshsim::model::cost::BatchShape;

/// Cached tokens of `count` decoding sequences, spread unevenly (some empty, some long).
fn contexts(count: u64, salt: u64) -> Vec<u64> {
    (0..count)
        .map(|i| match (i + salt) % 5 {
            0 => 0,
            1 => 1,
            k => (i * 7_919 + salt * 104_729) % (k * 3_000),
        })
        .collect()
}

/// Shapes that already hold other work: nothing, a prefill chunk after a cache, a decode
/// step, and a chunk that does not sample.
fn starts() -> Vec<BatchShape> {
    let mut chunk = BatchShape::default();
    chunk.add(512, 1_000, true);
    let mut mixed = chunk;
    mixed.add(1, 77, true);
    mixed.add(30, 0, false);
    vec![BatchShape::default(), chunk, mixed]
}

#[test]
fn decoding_in_one_call_equals_the_sum_of_the_per_sequence_steps() {
    for (s, start) in starts().into_iter().enumerate() {
        for count in [0, 1, 2, 3, 7, 64, 301] {
            let cached = contexts(count, s as u64 + count);
            let mut stepwise = start;
            for &c in &cached {
                stepwise.add(1, c, true);
            }
            let mut closed = start;
            closed.add_decoding(count, cached.iter().sum());
            assert_eq!(
                closed, stepwise,
                "{count} sequences with {cached:?} cached, after {start:?}"
            );
        }
    }
}

#[test]
fn one_decoding_sequence_attends_to_its_context_and_itself() {
    // By hand: 3 sequences with 0, 9 and 20 cached tokens attend 1 + 10 + 21 = 32 positions
    // and read as many K/V tokens.
    let mut b = BatchShape::default();
    b.add_decoding(3, 29);
    assert_eq!(
        b,
        BatchShape {
            seqs: 3,
            new_tokens: 3,
            sampling_seqs: 3,
            attention_pairs: 32,
            kv_read_tokens: 32,
            chunk_cached_tokens: 0,
            chunk_seqs: 0,
        }
    );
}
