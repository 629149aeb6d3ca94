//! Shared decodes in a least-recently-used cache bounded in bytes; an entry someone holds is
//! never evicted, so the bytes held never exceed the bound.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

use super::ComponentKey;
use super::shared::{Decoded, Hold};
use crate::telemetry::names;

/// The cache's view of one entry.
pub(super) struct Resident {
    pub(super) entry: Arc<Decoded>,
    pub(super) last_used: u64,
}

#[derive(Default)]
pub(super) struct Lru {
    pub(super) entries: HashMap<ComponentKey, Resident>,
    pub(super) held: u64,
    pub(super) clock: u64,
}

/// Shared decodes, bounded in bytes: each entry reserves its full decoded length.
pub(crate) struct DecodeCache {
    pub(super) capacity: u64,
    pub(super) decoders: Arc<Semaphore>,
    pub(super) lru: Mutex<Lru>,
}

impl DecodeCache {
    pub(crate) fn new(capacity: u64, decoders: usize) -> DecodeCache {
        DecodeCache { capacity, decoders: Arc::new(Semaphore::new(decoders)), lru: Mutex::default() }
    }

    /// The bound on decoders running at once, shared by shared and private decodes.
    pub(crate) fn decoders(&self) -> &Arc<Semaphore> {
        &self.decoders
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        self.lru.lock().expect("cache lock is never poisoned")
    }

    /// Bytes reserved by the entries held (the tests' view of the bound).
    #[cfg(test)]
    pub(crate) fn held(&self) -> u64 {
        self.lock().held
    }

    /// The shared decode of `key`, created with `make` when absent (or when the held one
    /// failed). `None` when the component cannot be held: larger than the cache, or no room
    /// left once every entry nobody is reading has been evicted.
    pub(crate) fn entry(
        &self,
        key: &ComponentKey,
        len: u64,
        make: impl FnOnce(Arc<Semaphore>) -> Decoded,
    ) -> Option<Hold> {
        let mut lru = self.lock();
        lru.clock += 1;
        let now = lru.clock;
        if let Some(resident) = lru.entries.get_mut(key) {
            if !resident.entry.failed() {
                resident.last_used = now;
                return Some(Hold::new(&resident.entry));
            }
            let failed = lru.entries.remove(key).expect("present");
            lru.held -= failed.entry.len();
        }
        if len > self.capacity {
            return None;
        }
        let needed = (lru.held + len).saturating_sub(self.capacity);
        if needed > 0 {
            // Holds on a resident entry are only taken under this lock (later ones by holders),
            // so an entry with none cannot gain one while eviction decides.
            let mut idle: Vec<(u64, u64, &ComponentKey)> = lru
                .entries
                .iter()
                .filter(|(_, r)| r.entry.holds.load(Ordering::SeqCst) == 0)
                .map(|(k, r)| (r.last_used, r.entry.len(), k))
                .collect();
            idle.sort_unstable_by_key(|&(last_used, _, _)| last_used);
            let mut freed = 0;
            let victims: Vec<ComponentKey> = idle
                .into_iter()
                .take_while(|&(_, size, _)| {
                    let take = freed < needed;
                    if take {
                        freed += size;
                    }
                    take
                })
                .map(|(_, _, k)| k.clone())
                .collect();
            if freed < needed {
                return None;
            }
            for victim in &victims {
                let evicted = lru.entries.remove(victim).expect("present");
                lru.held -= evicted.entry.len();
            }
            metrics::counter!(names::CACHE_EVICTIONS).increment(victims.len() as u64);
        }
        let entry = Arc::new(make(Arc::clone(&self.decoders)));
        let hold = Hold::new(&entry);
        lru.held += len;
        lru.entries.insert(key.clone(), Resident { entry, last_used: now });
        metrics::gauge!(names::CACHE_BYTES).set(lru.held as f64);
        Some(hold)
    }

    /// Drops every entry whose key `keep` refuses (files that changed or disappeared).
    pub(crate) fn retain(&self, keep: impl Fn(&ComponentKey) -> bool) {
        let mut lru = self.lock();
        let before = lru.entries.len();
        lru.entries.retain(|k, _| keep(k));
        if lru.entries.len() != before {
            lru.held = lru.entries.values().map(|r| r.entry.len()).sum();
            metrics::gauge!(names::CACHE_BYTES).set(lru.held as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::decode::Stored;
    use crate::format::{ByteOrder, Component, DType, Encoding};

    fn component(len: u64) -> Component {
        Component {
            role: "data".into(),
            dtype: DType::U8,
            logical_type: None,
            offset: 0,
            stored_length: len,
            encoding: Encoding::Raw,
            decoded_length: len,
            digest: None,
            digest_scope: crate::format::DigestScope::Stored,
            byte_order: ByteOrder::Big,
            file: 0,
        }
    }

    fn key(object: &str) -> ComponentKey {
        ComponentKey {
            model: "m".into(),
            version: "v1".into(),
            object: object.into(),
            role: "data".into(),
            frame: None,
        }
    }

    fn entry(cache: &DecodeCache, object: &str, len: u64) -> Option<Hold> {
        let c = component(len);
        cache.entry(&key(object), len, |decoders| {
            Decoded::new(object, &c, Stored::Whole(Bytes::from(vec![0; len as usize])), decoders, Arc::default())
        })
    }

    #[test]
    fn held_entries_are_never_evicted_and_the_bound_is_never_exceeded() {
        let cache = DecodeCache::new(100, 1);
        let a = entry(&cache, "a", 60).expect("fits");
        // `a` is held: `b` cannot make room, so it is not cached.
        assert!(entry(&cache, "b", 60).is_none());
        assert_eq!(cache.held(), 60);
        drop(a);
        // Now `a` is idle and evicted for `b`.
        let b = entry(&cache, "b", 60).expect("room made");
        assert_eq!(cache.held(), 60);
        drop(b);
        assert!(entry(&cache, "huge", 101).is_none(), "larger than the cache");
        assert!(entry(&cache, "b", 60).is_some(), "b is still resident");
    }

    #[test]
    fn eviction_takes_the_least_recently_used_idle_entries_first() {
        let cache = DecodeCache::new(100, 1);
        for name in ["a", "b", "c"] {
            drop(entry(&cache, name, 30));
        }
        drop(entry(&cache, "a", 30)); // a is now the most recent; b the least
        drop(entry(&cache, "d", 30));
        let resident: Vec<bool> =
            ["a", "b", "c", "d"].iter().map(|k| cache.lock().entries.contains_key(&key(k))).collect();
        assert_eq!(resident, [true, false, true, true]);
        cache.retain(|k| k.object != "c");
        assert_eq!(cache.held(), 60);
    }
}
