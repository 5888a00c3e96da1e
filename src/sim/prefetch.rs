//! Cache hints: asking the processor to load memory that is about to be read.
//!
//! At cluster scale the state of thousands of actors does not fit in the processor's caches,
//! so the first read of an actor's state at each of its events is a cache miss, and so is
//! each block of a cold KV pool. A prefetch starts such a load early, while other work runs,
//! so that the misses overlap. It is only a hint: it never faults, changes no memory and no
//! result; on processors without one it does nothing.

/// Most bytes that one call of [`bytes`] asks for.
pub const MAX_BYTES: usize = 1024;

/// Asks for the cache lines of the `bytes` bytes at `p` (at most [`MAX_BYTES`]).
#[inline]
pub fn bytes(p: *const u8, bytes: usize) {
    let n = bytes.min(MAX_BYTES);
    // A plain loop: the simulator asks for a few dozen lines an event, and a `step_by`
    // iterator cost several instructions a line (1 % of a vanilla round's instructions at
    // 2,240 GPUs, counted with callgrind).
    let mut offset = 0;
    // Bounded: at most `MAX_BYTES / 64` lines.
    while offset < n {
        line(p.wrapping_add(offset));
        offset += 64;
    }
}

/// Asks for the cache line at `p`.
#[inline(always)]
pub fn line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint that never faults and reads or writes nothing the program
    // can observe, whatever the address.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Most lines of an actor's [`Hot`](crate::actor::Hot) region that [`hot`] asks for.
pub const MAX_HOT_LINES: u32 = 32;

/// Asks for the first line of each of the (at most [`MAX_HOT_LINES`]) elements of `h`, and
/// for its other values.
#[inline]
pub fn hot(h: crate::actor::Hot) {
    let stride = h.stride.max(1) as usize;
    for i in 0..u32::from(h.count).min(MAX_HOT_LINES) as usize {
        line(h.base.wrapping_add(i * stride) as *const u8);
    }
    for (at, n) in h.values.into_iter().zip(h.value_bytes) {
        bytes(at as *const u8, n as usize);
    }
}
