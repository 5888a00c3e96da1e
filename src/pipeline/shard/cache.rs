//! A shard's session cache: the cache state of each route session that passed through it.
//!
//! Entries are keyed by `(session id, start layer, end layer)`, so a shard whose layer range
//! changes (a route change) finds nothing under the new key rather than a state of other layers.
//! The map is bounded twice (DESIGN contract 6): by a number of sessions (default 16), beyond
//! which the least recently used entry is evicted, and by a time to live (default 600 s) since
//! an entry's last use, after which it is gone. Time is injected ([`Nanos`] from the caller),
//! never read from a clock. Both orders are deterministic: ties in last use cannot happen,
//! because every use takes a fresh sequence number.

use std::collections::BTreeMap;

use crate::units::Nanos;

/// A route session's stable id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionId(pub u64);

/// The key of one cache entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CacheKey {
    pub session: SessionId,
    pub start: usize,
    pub end: usize,
}

/// The bounds of a session cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLimits {
    pub max_sessions: usize,
    pub ttl: Nanos,
}

impl Default for CacheLimits {
    fn default() -> CacheLimits {
        CacheLimits {
            max_sessions: 16,
            ttl: Nanos::from_secs(600),
        }
    }
}

/// Why an entry left the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Eviction {
    /// Unused for longer than the TTL.
    Expired,
    /// The least recently used entry when a new one needed room.
    Lru,
}

#[derive(Debug)]
struct Entry<V> {
    value: V,
    last_used: Nanos,
    seq: u64,
}

/// An LRU map with a TTL, over values of any kind (opaque cache states).
#[derive(Debug)]
pub struct SessionCache<V> {
    limits: CacheLimits,
    entries: BTreeMap<CacheKey, Entry<V>>,
    /// Use order: sequence number of last use -> key. The first is the least recently used.
    order: BTreeMap<u64, CacheKey>,
    next_seq: u64,
    /// The most recent evictions (at most [`EVICTION_LOG`]), for [`Self::drain_evictions`].
    evicted: Vec<(CacheKey, Eviction)>,
    evictions: u64,
}

/// Most evictions [`SessionCache`] remembers between two drains; older ones are forgotten
/// (the counter [`SessionCache::evictions`] still counts them).
pub const EVICTION_LOG: usize = 1024;

impl<V> SessionCache<V> {
    /// An empty cache; `max_sessions` must be at least 1.
    pub fn new(limits: CacheLimits) -> SessionCache<V> {
        assert!(limits.max_sessions >= 1, "a session cache needs room");
        SessionCache {
            limits,
            entries: BTreeMap::new(),
            order: BTreeMap::new(),
            next_seq: 0,
            evicted: Vec::new(),
            evictions: 0,
        }
    }

    pub fn limits(&self) -> CacheLimits {
        self.limits
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn is_expired(&self, e: &Entry<V>, now: Nanos) -> bool {
        now.saturating_sub(e.last_used) >= self.limits.ttl
    }

    /// Drops every entry whose TTL has run out by `now`.
    pub fn expire(&mut self, now: Nanos) {
        let expired: Vec<(u64, CacheKey)> = self
            .order
            .iter()
            .filter(|(_, k)| self.is_expired(&self.entries[*k], now))
            .map(|(s, k)| (*s, *k))
            .collect();
        for (seq, key) in expired {
            self.order.remove(&seq);
            self.entries.remove(&key);
            self.log_eviction(key, Eviction::Expired);
        }
    }

    /// Whether `key` holds a live entry at `now` (without touching it).
    pub fn contains(&self, now: Nanos, key: &CacheKey) -> bool {
        self.entries
            .get(key)
            .is_some_and(|e| !self.is_expired(e, now))
    }

    /// The entry of `key`, marked as used at `now`; `None` if absent or expired.
    pub fn get(&mut self, now: Nanos, key: &CacheKey) -> Option<&V> {
        self.expire(now);
        let seq = self.next_seq;
        let e = self.entries.get_mut(key)?;
        self.next_seq += 1;
        self.order.remove(&e.seq);
        self.order.insert(seq, *key);
        e.seq = seq;
        e.last_used = now;
        Some(&e.value)
    }

    /// Removes and returns the entry of `key`; `None` if absent or expired.
    pub fn take(&mut self, now: Nanos, key: &CacheKey) -> Option<V> {
        self.expire(now);
        let e = self.entries.remove(key)?;
        self.order.remove(&e.seq);
        Some(e.value)
    }

    /// Stores `value` under `key` as used at `now`, replacing any earlier value; first drops
    /// expired entries, then the least recently used ones while the cache is full.
    pub fn insert(&mut self, now: Nanos, key: CacheKey, value: V) {
        self.expire(now);
        if let Some(old) = self.entries.remove(&key) {
            self.order.remove(&old.seq);
        }
        while self.entries.len() >= self.limits.max_sessions {
            // The loop runs at most max_sessions times; the map is non-empty here.
            let Some((_, victim)) = self.order.pop_first() else {
                break;
            };
            self.entries.remove(&victim);
            self.log_eviction(victim, Eviction::Lru);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.order.insert(seq, key);
        self.entries.insert(
            key,
            Entry {
                value,
                last_used: now,
                seq,
            },
        );
    }

    /// Removes the entry of `key` (an explicit eviction); whether there was one.
    pub fn remove(&mut self, key: &CacheKey) -> bool {
        match self.entries.remove(key) {
            Some(e) => {
                self.order.remove(&e.seq);
                true
            }
            None => false,
        }
    }

    /// Removes every entry of `session`.
    pub fn remove_session(&mut self, session: SessionId) {
        let keys: Vec<CacheKey> = self
            .entries
            .keys()
            .filter(|k| k.session == session)
            .copied()
            .collect();
        for k in keys {
            self.remove(&k);
        }
    }

    /// Drops everything (a restart).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.order.clear();
    }

    /// Keys from least to most recently used.
    pub fn keys_by_use(&self) -> Vec<CacheKey> {
        self.order.values().copied().collect()
    }

    /// Entries dropped by LRU or TTL since the cache was made.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    fn log_eviction(&mut self, key: CacheKey, why: Eviction) {
        self.evictions += 1;
        if self.evicted.len() == EVICTION_LOG {
            self.evicted.remove(0);
        }
        self.evicted.push((key, why));
    }

    /// The evictions since the last call (the latest [`EVICTION_LOG`]), in order.
    pub fn drain_evictions(&mut self) -> Vec<(CacheKey, Eviction)> {
        std::mem::take(&mut self.evicted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: u64) -> CacheKey {
        CacheKey {
            session: SessionId(s),
            start: 0,
            end: 2,
        }
    }

    fn limits(max_sessions: usize, ttl_s: u64) -> CacheLimits {
        CacheLimits {
            max_sessions,
            ttl: Nanos::from_secs(ttl_s),
        }
    }

    #[test]
    fn defaults_are_16_sessions_and_600_seconds() {
        assert_eq!(
            CacheLimits::default(),
            CacheLimits {
                max_sessions: 16,
                ttl: Nanos::from_secs(600)
            }
        );
    }

    #[test]
    fn the_least_recently_used_session_is_evicted_first() {
        let mut c = SessionCache::new(limits(3, 600));
        let t = Nanos::from_secs(1);
        c.insert(t, key(1), "a");
        c.insert(t, key(2), "b");
        c.insert(t, key(3), "c");
        // Using 1 makes 2 the least recently used.
        assert_eq!(c.get(t, &key(1)), Some(&"a"));
        c.insert(t, key(4), "d");
        assert_eq!(c.drain_evictions(), vec![(key(2), Eviction::Lru)]);
        assert_eq!(c.keys_by_use(), vec![key(3), key(1), key(4)]);
        c.insert(t, key(5), "e");
        c.insert(t, key(6), "f");
        assert_eq!(
            c.drain_evictions(),
            vec![(key(3), Eviction::Lru), (key(1), Eviction::Lru)]
        );
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn replacing_a_session_does_not_evict_another() {
        let mut c = SessionCache::new(limits(2, 600));
        c.insert(Nanos::ZERO, key(1), 1);
        c.insert(Nanos::ZERO, key(2), 2);
        c.insert(Nanos::ZERO, key(1), 10);
        assert!(c.drain_evictions().is_empty());
        assert_eq!(c.get(Nanos::ZERO, &key(1)), Some(&10));
        assert_eq!(c.keys_by_use(), vec![key(2), key(1)]);
    }

    #[test]
    fn entries_expire_a_ttl_after_their_last_use_oldest_first() {
        let mut c = SessionCache::new(limits(16, 10));
        c.insert(Nanos::from_secs(0), key(1), ());
        c.insert(Nanos::from_secs(5), key(2), ());
        // Used at 8 s: lives until 18 s.
        assert!(c.get(Nanos::from_secs(8), &key(1)).is_some());
        assert!(c.contains(Nanos::from_secs(14), &key(2)));
        assert!(!c.contains(Nanos::from_secs(15), &key(2)));
        assert!(c.get(Nanos::from_secs(15), &key(2)).is_none());
        assert_eq!(c.drain_evictions(), vec![(key(2), Eviction::Expired)]);
        assert!(c.take(Nanos::from_secs(17), &key(1)).is_some());
        assert!(c.is_empty());
    }

    #[test]
    fn expired_entries_go_before_any_live_one_is_evicted() {
        let mut c = SessionCache::new(limits(2, 10));
        c.insert(Nanos::from_secs(0), key(1), ());
        c.insert(Nanos::from_secs(9), key(2), ());
        // At 10 s key 1 has expired; inserting key 3 needs no LRU eviction of key 2.
        c.insert(Nanos::from_secs(10), key(3), ());
        assert_eq!(c.drain_evictions(), vec![(key(1), Eviction::Expired)]);
        assert_eq!(c.keys_by_use(), vec![key(2), key(3)]);
    }

    #[test]
    fn keys_differ_by_layer_range() {
        let mut c = SessionCache::new(CacheLimits::default());
        c.insert(Nanos::ZERO, key(1), ());
        let other = CacheKey { start: 1, ..key(1) };
        assert!(c.get(Nanos::ZERO, &other).is_none());
        c.remove_session(SessionId(1));
        assert!(c.is_empty());
    }
}
