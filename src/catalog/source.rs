//! One configured source: its storage, the handle on the node's disk cache when its reads go
//! through it, and how it has been answering (a source that cannot be listed is reported
//! degraded, with the failure, until it answers again).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::storage::cache::{CachedStorage, DiskCache};
use crate::storage::{Storage, StorageError};

/// One configured source and how it has been answering.
#[derive(Debug)]
pub(crate) struct Source {
    /// As configured: `models`, `s3://bucket/prefix`.
    pub name: String,
    pub storage: Arc<dyn Storage>,
    /// The disk cache `storage` reads through, when it does (then it is `storage` itself):
    /// what only a cached source does (kept listings, pins, stated digests) is asked of it.
    cache: Option<Arc<CachedStorage>>,
    degraded: AtomicBool,
    /// The last failure to list or read, while it lasts.
    failure: Mutex<Option<StorageError>>,
}

impl Source {
    /// A source whose reads go straight to `storage`.
    pub(crate) fn new(storage: Arc<dyn Storage>) -> Arc<Source> {
        Source::with(storage, None)
    }

    /// A source whose reads of `remote` go through the node's disk cache, `cache`. Built here,
    /// so a cached source always holds the cache's handle beside it.
    pub(crate) fn cached(remote: Arc<dyn Storage>, cache: Arc<DiskCache>) -> Arc<Source> {
        let storage = Arc::new(CachedStorage::new(remote, cache));
        Source::with(Arc::clone(&storage) as Arc<dyn Storage>, Some(storage))
    }

    fn with(storage: Arc<dyn Storage>, cache: Option<Arc<CachedStorage>>) -> Arc<Source> {
        let name = storage.name().to_owned();
        Arc::new(Source { name, storage, cache, degraded: AtomicBool::new(false), failure: Mutex::new(None) })
    }

    /// The disk cache the source's reads go through; `None` when they go to the source.
    pub(crate) fn cache(&self) -> Option<&Arc<CachedStorage>> {
        self.cache.as_ref()
    }

    /// Whether the source's reads go through the node's disk cache (what a protocol may ask;
    /// the cache's own calls are the service's).
    pub(crate) fn is_cached(&self) -> bool {
        self.cache.is_some()
    }

    /// The backend's name (`local`, `s3`).
    pub(crate) fn kind(&self) -> &'static str {
        self.storage.backend()
    }

    /// Records a failure of the source itself (unreachable, refusing); a changed or missing
    /// object says nothing about the source and is not recorded.
    pub(crate) fn report_failure(&self, error: &StorageError) {
        if matches!(error, StorageError::Unavailable { .. } | StorageError::Refused { .. }) {
            if !self.degraded.swap(true, Ordering::SeqCst) {
                tracing::warn!(source = %self.name, error = %error, "source degraded");
            }
            *self.failure.lock().expect("never poisoned") = Some(error.clone());
        }
    }

    /// Records that the source answered.
    pub(crate) fn report_success(&self) {
        if self.degraded.load(Ordering::Relaxed) && self.degraded.swap(false, Ordering::SeqCst) {
            tracing::info!(source = %self.name, "source answers again");
            *self.failure.lock().expect("never poisoned") = None;
        }
    }

    /// The failure the source is degraded by, if it is.
    pub(crate) fn failure(&self) -> Option<StorageError> {
        self.failure.lock().expect("never poisoned").clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_cached_source_holds_the_cache_and_reads_through_it() {
        let dir = tempfile::tempdir().unwrap();
        let local: Arc<dyn Storage> = Arc::new(crate::storage::local::LocalStorage::new("models", dir.path()));
        assert!(Source::new(Arc::clone(&local)).cache().is_none());
        let cache = crate::storage::cache::DiskCache::open(&dir.path().join("cache"), 1 << 20, 4096).unwrap();
        let source = Source::cached(local, cache);
        let handle = source.cache().expect("a cached source holds its cache");
        assert!(std::ptr::addr_eq(Arc::as_ptr(handle), Arc::as_ptr(&source.storage)), "its reads go through it");
        assert_eq!(source.name, "models");
    }
}
