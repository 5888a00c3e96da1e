//! The event queue: a 4-ary min-heap of 128-bit keys, one cache line of children a node
//! (see [`Heap`]). The kernel ([`super::kernel`]) keeps the events' messages in slots and
//! orders them by these keys.

/// Bits of a key that name the slot of its event's message.
pub(super) const SLOT_BITS: u32 = 24;
pub(super) const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;

/// A pending event's place in the heap: ordered by time, then by sequence number. One
/// 128-bit number: the time in the high 64 bits, then the sequence number (40 bits), then
/// the slot (no two keys share a sequence number). So two keys compare in one comparison
/// without a branch, and the heap picks the earliest of four children without mispredicted
/// jumps (a pop sifts at every event, and which child is earliest is unpredictable).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Key(pub(super) u128);

impl Key {
    pub(super) fn new(time: u64, tag: u64) -> Key {
        Key(u128::from(time) << 64 | u128::from(tag))
    }
    pub(super) fn time(self) -> u64 {
        (self.0 >> 64) as u64
    }
    pub(super) fn tag(self) -> u64 {
        self.0 as u64
    }
    pub(super) fn seq(self) -> u64 {
        self.tag() >> SLOT_BITS
    }
    pub(super) fn slot(self) -> usize {
        (self.tag() & SLOT_MASK) as usize
    }
}

/// Children of a heap node.
pub(super) const ARITY: usize = 4;

/// The children of one heap node: one cache line.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
pub(super) struct Line([Key; ARITY]);

/// Keys past the last, so that a node's missing children are never the earliest.
pub(super) const NO_KEY: Key = Key(u128::MAX);

/// A 4-ary min-heap of keys whose node `i` sits at position `i + ARITY - 1` of an array of
/// 64-byte lines: the root is the last key of line 0, and the children of node `i` (`4i + 1`
/// to `4i + 4`) are the whole of line `i + 1`. Every position from the last key on holds
/// [`NO_KEY`].
#[derive(Debug, Default)]
pub(super) struct Heap {
    pub(super) lines: Vec<Line>,
    len: usize,
}

impl Heap {
    pub(super) const PAD: usize = ARITY - 1;

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(super) fn get(&self, i: usize) -> Key {
        let p = i + Self::PAD;
        self.lines[p / ARITY].0[p % ARITY]
    }

    pub(super) fn set(&mut self, i: usize, k: Key) {
        let p = i + Self::PAD;
        self.lines[p / ARITY].0[p % ARITY] = k;
    }

    pub(super) fn first(&self) -> Option<Key> {
        (self.len > 0).then(|| self.get(0))
    }

    /// Appends `k` as the last node (the caller sifts it up).
    pub(super) fn push_last(&mut self, k: Key) {
        let p = self.len + Self::PAD;
        if p / ARITY == self.lines.len() {
            self.lines.push(Line([NO_KEY; ARITY]));
        }
        self.len += 1;
        self.set(self.len - 1, k);
    }

    /// Removes the last node and returns its key.
    pub(super) fn pop_last(&mut self) -> Option<Key> {
        let i = self.len.checked_sub(1)?;
        let k = self.get(i);
        self.set(i, NO_KEY);
        self.len = i;
        Some(k)
    }

    /// The children of node `i`: [`NO_KEY`] where there is none.
    pub(super) fn children(&self, i: usize) -> &[Key; ARITY] {
        &self.lines[i + 1].0
    }
}
