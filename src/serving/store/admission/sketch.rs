//! TinyLFU's frequency sketch (see the module doc of [`super`]).

use super::MAX_ENTRIES;

/// The largest value of a 4-bit counter.
const MAX_COUNT: u64 = 15;
/// Rows of the sketch.
const DEPTH: usize = 4;

/// A count-min sketch of 4-bit counters, 16 to a word, halved every `sample` additions.
#[derive(Debug)]
pub struct FrequencySketch {
    /// Row r's counters are words `r x words .. (r + 1) x words`.
    table: Vec<u64>,
    /// Counters per row (a power of two).
    width: u64,
    /// Additions since the last halving (as Caffeine counts them).
    size: u64,
    sample: u64,
}

/// SplitMix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl FrequencySketch {
    /// A sketch for caches of `entries` tensors in all.
    pub fn new(entries: u64) -> FrequencySketch {
        let n = entries.clamp(1, MAX_ENTRIES);
        // At least one word (16 counters) a row.
        let width = 4 * n.next_power_of_two().max(4);
        FrequencySketch {
            table: vec![0; DEPTH * (width / 16) as usize],
            width,
            size: 0,
            sample: 10 * n,
        }
    }

    /// Counters per row.
    pub fn width(&self) -> u64 {
        self.width
    }

    /// Additions before the counters are halved.
    pub fn sample(&self) -> u64 {
        self.sample
    }

    /// The index of `id`'s counter in row `row`.
    pub fn index(&self, id: u64, row: usize) -> u64 {
        let seed = (row as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        mix(id.wrapping_add(seed)) & (self.width - 1)
    }

    /// (word, shift) of counter `i` of row `row`.
    fn slot(&self, row: usize, i: u64) -> (usize, u64) {
        (
            row * (self.width / 16) as usize + (i / 16) as usize,
            (i % 16) * 4,
        )
    }

    fn counter(&self, row: usize, i: u64) -> u64 {
        let (w, shift) = self.slot(row, i);
        (self.table[w] >> shift) & 0xf
    }

    /// The estimate of `id`: the least of its counters.
    pub fn frequency(&self, id: u64) -> u64 {
        (0..DEPTH)
            .map(|r| self.counter(r, self.index(id, r)))
            .min()
            .expect("rows")
    }

    /// Counts one more `id`; halves every counter after `sample` additions.
    pub fn increment(&mut self, id: u64) {
        let mut added = false;
        for r in 0..DEPTH {
            let i = self.index(id, r);
            if self.counter(r, i) < MAX_COUNT {
                let (w, shift) = self.slot(r, i);
                self.table[w] += 1 << shift;
                added = true;
            }
        }
        if added {
            self.size += 1;
            if self.size == self.sample {
                self.reset();
            }
        }
    }

    /// Halves every counter; the count of additions is halved too, less a quarter of the odd
    /// counters (whose halves were rounded down).
    fn reset(&mut self) {
        let mut odd = 0;
        for w in &mut self.table {
            odd += (*w & 0x1111_1111_1111_1111).count_ones() as u64;
            *w = (*w >> 1) & 0x7777_7777_7777_7777;
        }
        self.size = self.size.saturating_sub(odd / 4) / 2;
    }
}
