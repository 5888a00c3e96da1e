//! The live host (DESIGN, "Architecture"): the same sans-IO actors as the simulator, hosted by
//! ractor actors on tokio, with real candle tensors and the real wall clock.
//!
//! [`host`] runs any set of [`crate::actor::Actor`]s: each inside one ractor actor, messages
//! through mailboxes, timers on tokio, `Work::Compute` performed for real by the model backend
//! inside the handler. Pipeline scenarios ([`crate::pipeline`]) use it with a
//! [`crate::backend::CandleBackend`] per shard (`meshsim run <scenario> --live`), so the
//! [`crate::pipeline::Head`] and [`crate::pipeline::ShardNode`] code that the simulator runs is
//! exactly the code that runs live.
//!
//! Addressing stays abstract: actors name each other by [`crate::actor::ActorId`], which
//! the host maps to a mailbox, so actors could later live in other processes under
//! `ractor_cluster` once each system's messages are serializable.

pub mod host;

use std::ops::Range;

/// What can go wrong on the live host.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("actor: {0}")]
    Actor(String),
    #[error("bad configuration: {0}")]
    Config(String),
}

/// Splits `layers` into `shards` contiguous ranges, the first ones one layer longer when the
/// split is uneven.
pub fn split_layers(layers: usize, shards: usize) -> Result<Vec<Range<usize>>, LiveError> {
    if shards == 0 || shards > layers {
        return Err(LiveError::Config(format!(
            "cannot split {layers} layers into {shards} shards"
        )));
    }
    let mut out = Vec::with_capacity(shards);
    let mut start = 0;
    for i in 0..shards {
        let len = layers / shards + usize::from(i < layers % shards);
        out.push(start..start + len);
        start += len;
    }
    Ok(out)
}

/// `n` seeded token ids below `vocab` for request `id` (ChaCha8 stream `id` of `seed`).
pub fn seeded_prompt(seed: u64, id: u32, n: usize, vocab: usize) -> Vec<u32> {
    let mut rng = crate::rng::Stream::new(seed, 0x11fe_0000 + id as u64);
    (0..n).map(|_| rng.below(vocab as u64) as u32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_split_evenly_with_the_rest_in_front() {
        assert_eq!(split_layers(8, 2).unwrap(), vec![0..4, 4..8]);
        assert_eq!(split_layers(8, 3).unwrap(), vec![0..3, 3..6, 6..8]);
        assert!(split_layers(4, 0).is_err());
        assert!(split_layers(4, 5).is_err());
    }

    #[test]
    fn seeded_prompts_are_reproducible_and_in_the_vocabulary() {
        let a = seeded_prompt(1, 0, 64, 4096);
        assert_eq!(a, seeded_prompt(1, 0, 64, 4096));
        assert_ne!(a, seeded_prompt(1, 1, 64, 4096));
        assert!(a.iter().all(|&t| t < 4096));
    }
}
