//! Cache hints: asking the processor to load memory that is about to be read. The simulator's
//! host and event kernel use them; actors never do.
//!
//! At cluster scale the state of thousands of actors does not fit in the processor's caches,
//! so the first read of an actor's state at each of its events is a cache miss, and so is
//! each block of a cold KV pool. A prefetch starts such a load early, while other work runs,
//! so that the misses overlap. It is only a hint: it never faults, changes no memory and no
//! result; on processors without one it does nothing.

/// Most bytes that one call of [`bytes`] asks for.
pub const MAX_BYTES: usize = 1024;

/// Bytes of a cache line.
pub const LINE: usize = 64;

/// Asks for every cache line that the `bytes` bytes at `p` (at most [`MAX_BYTES`]) touch:
/// from the line that holds the first byte to the one that holds the last, so that a value
/// that straddles a line boundary is asked for whole (a 40-byte event slot starting late in a
/// line has its last bytes in the next one).
#[inline]
pub fn bytes(p: *const u8, bytes: usize) {
    each_line(p, bytes, line);
}

/// Asks for the `count` lines (at most `MAX_BYTES / LINE`) that hold the bytes at `p`,
/// `p + LINE`, and so on: `count` lines from `p`'s, where [`bytes`] would ask for one more
/// if `p` is not at the start of its line. For the first part of a large value (an actor's)
/// whose lines a hint rations.
#[inline]
pub fn lines(p: *const u8, count: usize) {
    let mut offset = 0;
    // Bounded: at most `MAX_BYTES / LINE` lines.
    while offset < count.min(MAX_BYTES / LINE) * LINE {
        line(p.wrapping_add(offset));
        offset += LINE;
    }
}

/// Calls `f` with the start of every line that the `bytes` bytes at `p` (at most
/// [`MAX_BYTES`]) touch, in address order.
#[inline(always)]
fn each_line(p: *const u8, bytes: usize, mut f: impl FnMut(*const u8)) {
    let n = bytes.min(MAX_BYTES);
    if n == 0 {
        return;
    }
    let skew = p.addr() % LINE;
    let start = p.wrapping_sub(skew);
    let end = skew + n;
    // A plain loop: the simulator asks for a few dozen lines an event, and a `step_by`
    // iterator costs several instructions a line.
    let mut offset = 0;
    // Bounded: at most `MAX_BYTES / LINE + 1` lines.
    while offset < end {
        f(start.wrapping_add(offset));
        offset += LINE;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines `bytes` asks for, as offsets from the line of `addr`.
    fn lines_of(addr: usize, bytes: usize) -> Vec<usize> {
        let mut got = Vec::new();
        each_line(addr as *const u8, bytes, |l| {
            got.push(l.addr() - addr / LINE * LINE)
        });
        got
    }

    #[test]
    fn every_line_a_value_touches_is_asked_for_and_none_past_it() {
        // Aligned: 64 bytes are one line, 65 two.
        assert_eq!(lines_of(0x1000, 64), vec![0]);
        assert_eq!(lines_of(0x1000, 65), vec![0, 64]);
        // A 40-byte value from byte 56 of a line ends in the next one.
        assert_eq!(lines_of(0x1038, 40), vec![0, 64]);
        // From byte 8, it stays in its line.
        assert_eq!(lines_of(0x1008, 40), vec![0]);
        // Nothing for no bytes; at most MAX_BYTES, whatever is asked.
        assert!(lines_of(0x1038, 0).is_empty());
        assert_eq!(lines_of(0x1001, usize::MAX).len(), MAX_BYTES / LINE + 1);
        // The hint itself runs on such addresses without reading them.
        bytes(std::ptr::null(), 100);
        bytes(0x1038 as *const u8, usize::MAX);
    }
}
