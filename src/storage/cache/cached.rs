//! The remote backend behind the disk cache, as a [`Storage`] wrapper: listings remembered
//! (and kept for a start while the source cannot be listed), digests stated beside the
//! source's, and each read turned into blocks, from disk or filled from the source, sequential
//! reads filled ahead; beside the trait, the cache's own interface (the kept listing, bytes
//! held, pins, stated digests, waiting for writes), which a cached source holds as a handle.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::{FutureExt as _, StreamExt as _};

use super::reading::Reading;
use super::{BLOCKS_AHEAD, DiskCache, MAX_FILL_BYTES};
use crate::storage::{ByteRange, Content, Listed, Payload, Read, ReadIntent, Storage, StorageError};

/// A remote backend whose reads go through the node's [`DiskCache`].
#[derive(Debug)]
pub struct CachedStorage {
    inner: Arc<dyn Storage>,
    cache: Arc<DiskCache>,
    /// Each listed object's version and size, so a read (a suffix read too) knows its blocks.
    listed: Mutex<HashMap<String, (String, u64)>>,
    /// Where the last read of each object ended, to tell sequential reads.
    read_to: Mutex<HashMap<String, u64>>,
    /// Digests stated for objects (key, version) beside what the source gives.
    stated: Mutex<HashMap<(String, String), [u8; 32]>>,
}

impl CachedStorage {
    pub fn new(inner: Arc<dyn Storage>, cache: Arc<DiskCache>) -> CachedStorage {
        CachedStorage {
            inner,
            cache,
            listed: Mutex::new(HashMap::new()),
            read_to: Mutex::new(HashMap::new()),
            stated: Mutex::new(HashMap::new()),
        }
    }

    /// The best digest known of `key` at `version`: the source's own, else one stated.
    fn expected_sha256(&self, key: &str, version: &str) -> Option<[u8; 32]> {
        self.inner
            .content(key, version)
            .sha256
            .or_else(|| self.stated.lock().expect("never poisoned").get(&(key.to_owned(), version.to_owned())).copied())
    }

    /// Remembers each object's version and size, so its reads know its blocks.
    fn remember(&self, listed: &[Listed]) {
        *self.listed.lock().expect("never poisoned") =
            listed.iter().map(|l| (l.key.clone(), (l.version.clone(), l.size))).collect();
    }
}

impl Storage for CachedStorage {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Listed>, StorageError>> {
        async move {
            let listed = self.inner.list().await?;
            self.remember(&listed);
            let (cache, source, kept) = (Arc::clone(&self.cache), self.name().to_owned(), listed.clone());
            let _ = tokio::task::spawn_blocking(move || cache.keep_listing(&source, &kept)).await;
            Ok(listed)
        }
        .boxed()
    }

    fn read(
        &self,
        key: &str,
        range: ByteRange,
        version: &str,
        intent: ReadIntent,
    ) -> BoxFuture<'_, Result<Read, StorageError>> {
        match intent {
            ReadIntent::Serve => self.read_to_serve(key, range, version),
            ReadIntent::Parse => self.read_to_parse(key, range, version),
        }
    }

    fn content(&self, key: &str, version: &str) -> Content {
        self.inner.content(key, version)
    }

    fn maps_files(&self) -> bool {
        false
    }
}

/// The disk cache's own interface, for what only a cached source does: the composition root
/// hands each cached source's handle to its `catalog::Source`, and the code that keeps,
/// pins, checks or reports cached bytes reaches it there.
impl CachedStorage {
    /// The last listing the disk cache kept, for a start while the source cannot be listed;
    /// `None` when none is kept.
    pub async fn kept_listing(&self) -> Option<Vec<Listed>> {
        let (cache, source) = (Arc::clone(&self.cache), self.name().to_owned());
        let listed = tokio::task::spawn_blocking(move || cache.kept_listing(&source)).await.ok()??;
        self.remember(&listed);
        Some(listed)
    }

    /// How many bytes of `key` at `version` (`size` bytes long) the disk cache holds.
    pub fn cached_bytes(&self, key: &str, version: &str, size: u64) -> u64 {
        let checked = self.expected_sha256(key, version).is_some();
        self.cache.held_of(self.name(), key, version, size, checked)
    }

    /// Keeps these objects (key and version) in the disk cache: eviction never takes their
    /// blocks. Replaces the objects pinned before.
    pub fn pin(&self, objects: &[(String, String)]) {
        self.cache.pin(self.name(), objects);
    }

    /// Says that the whole object at `version` has SHA-256 `digest` (a `SHA256SUMS` line): its
    /// bytes are kept only once they match. A digest the source gives itself prevails.
    pub fn expect_sha256(&self, key: &str, version: &str, digest: [u8; 32]) {
        if self.inner.content(key, version).sha256.is_none() {
            self.stated.lock().expect("never poisoned").insert((key.to_owned(), version.to_owned()), digest);
        }
    }

    /// Whether reads of the object at `version` are checked against a digest (its source's
    /// own, or one [`CachedStorage::expect_sha256`] handed down).
    pub fn expects_sha256(&self, key: &str, version: &str) -> bool {
        self.expected_sha256(key, version).is_some()
    }

    /// Waits until every byte read so far is kept on disk (blocks are written while readers
    /// already have them).
    pub async fn settled(&self) {
        self.cache.settled().await;
    }
}

/// Reads, as the trait's [`ReadIntent`]s ask for them.
impl CachedStorage {
    /// A read for the catalog's parsing. An object not yet whole on disk whose digest is
    /// known: a header is read from the origin and not kept (a block is kept only once the
    /// whole object is checked). One the parse reads whole (a checkpoint's index), or of a
    /// block at most, is brought onto disk checked as any read is: a node restarted while its
    /// origin is down parses it again.
    fn read_to_parse(&self, key: &str, range: ByteRange, version: &str) -> BoxFuture<'_, Result<Read, StorageError>> {
        let size = self.listed.lock().expect("never poisoned").get(key).filter(|(v, _)| v == version).map(|(_, s)| *s);
        let checked = self.expected_sha256(key, version).is_some();
        let whole = |size: u64| match &range {
            ByteRange::Bounded(r) => r.start == 0 && r.end >= size,
            ByteRange::Suffix(n) => *n >= size,
        };
        match size {
            Some(size)
                if checked
                    && !whole(size)
                    && size > self.cache.block_bytes
                    && self.cache.held_of(self.name(), key, version, size, true) < size =>
            {
                self.inner.read(key, range, version, ReadIntent::Parse)
            }
            _ => self.read_to_serve(key, range, version),
        }
    }

    /// A read of bytes that may reach a client: block by block, through the disk.
    fn read_to_serve(&self, key: &str, range: ByteRange, version: &str) -> BoxFuture<'_, Result<Read, StorageError>> {
        let size = match self.listed.lock().expect("never poisoned").get(key) {
            Some((listed, size)) if listed == version => Some(*size),
            _ => None,
        };
        let (key, version) = (key.to_owned(), version.to_owned());
        async move {
            // An object not listed in this version is read from the source as it is.
            let Some(size) = size else { return self.inner.read(&key, range, &version, ReadIntent::Serve).await };
            let range = match range {
                ByteRange::Suffix(n) => size - n.min(size)..size,
                ByteRange::Bounded(r) if r.start <= r.end && r.end <= size => r,
                ByteRange::Bounded(r) => {
                    return Err(StorageError::OutOfRange {
                        source_name: self.name().to_owned(),
                        start: r.start,
                        end: r.end,
                    });
                }
            };
            // Sequential: starting where the last read ended, or a little after (the padding
            // between a file's tensors), within a block.
            let previous_end = self.read_to.lock().expect("never poisoned").insert(key.clone(), range.end);
            let sequential =
                previous_end.is_some_and(|end| range.start >= end && range.start - end < self.cache.block_bytes);
            let fill_to = if sequential { (range.start + MAX_FILL_BYTES).min(size).max(range.end) } else { range.end };
            let blocks = self.blocks(key, version, size, range.clone(), fill_to);
            Ok(Read { size, range, payload: Payload::Stream(blocks) })
        }
        .boxed()
    }

    /// `range` of the object, block by block: each from disk, or fetched from the source by a
    /// fill that reads every missing block from this one on, up to `fill_to`, in one request.
    fn blocks(
        &self,
        key: String,
        version: String,
        size: u64,
        range: Range<u64>,
        fill_to: u64,
    ) -> futures_util::stream::BoxStream<'static, Result<Bytes, StorageError>> {
        if range.is_empty() {
            return futures_util::stream::empty().boxed();
        }
        let block = self.cache.block_bytes;
        let expected = self.expected_sha256(&key, &version);
        let reading = Reading {
            object: self.cache.object_id(self.inner.name(), &key, &version, expected.is_some()),
            expected,
            inner: Arc::clone(&self.inner),
            cache: Arc::clone(&self.cache),
            key,
            version,
            size,
            last: (range.end - 1) / block,
            fill_last: (fill_to.max(range.end) - 1) / block,
            range,
            streamed: Mutex::new(Vec::new()),
            joined: Mutex::new(None),
        };
        let (first, last) = (reading.range.start / block, reading.last);
        let reading = Arc::new(reading);
        let checking = Arc::clone(&reading);
        // The next block is read and checked while this one is sent.
        let blocks = futures_util::stream::iter(first..=last)
            .map(move |index| {
                let reading = Arc::clone(&reading);
                async move {
                    let bytes = reading.block(index).await?;
                    let start = index * reading.cache.block_bytes;
                    let wanted = reading.range.start.max(start) - start
                        ..reading.range.end.min(start + bytes.len() as u64) - start;
                    Ok(bytes.slice(wanted.start as usize..wanted.end as usize))
                }
            })
            .buffered(BLOCKS_AHEAD)
            .boxed();
        match checking.expected {
            Some(_) => crate::storage::last_held_until(blocks, async move { checking.streamed_blocks_matched().await }),
            None => blocks,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source that says the SHA-256 of `said` at any version, and of nothing else.
    #[derive(Debug)]
    struct Says;

    impl Storage for Says {
        fn name(&self) -> &str {
            "says"
        }
        fn backend(&self) -> &'static str {
            "test"
        }
        fn list(&self) -> BoxFuture<'_, Result<Vec<Listed>, StorageError>> {
            std::future::ready(Ok(Vec::new())).boxed()
        }
        fn read(&self, _: &str, _: ByteRange, _: &str, _: ReadIntent) -> BoxFuture<'_, Result<Read, StorageError>> {
            let unread = StorageError::Unavailable { source_name: "says".into(), message: "never read".into() };
            std::future::ready(Err(unread)).boxed()
        }
        fn content(&self, key: &str, version: &str) -> Content {
            Content { version: version.to_owned(), sha256: (key == "said").then_some([1; 32]) }
        }
        fn maps_files(&self) -> bool {
            false
        }
    }

    #[test]
    fn a_stated_digest_checks_one_version_and_never_overrides_the_sources_own() {
        let dir = tempfile::tempdir().unwrap();
        let cached = CachedStorage::new(Arc::new(Says), DiskCache::open(dir.path(), 1 << 20, 4096).unwrap());
        assert!(cached.expects_sha256("said", "v"), "the source's own digest checks its reads");
        assert!(!cached.expects_sha256("other", "v"));
        cached.expect_sha256("other", "v", [2; 32]);
        assert!(cached.expects_sha256("other", "v"));
        assert!(!cached.expects_sha256("other", "w"), "a stated digest is of one version");
        cached.expect_sha256("said", "v", [3; 32]);
        assert_eq!(cached.expected_sha256("said", "v"), Some([1; 32]));
        assert_eq!(cached.content("other", "v").sha256, None, "content is what the source says, not what was stated");
    }
}
