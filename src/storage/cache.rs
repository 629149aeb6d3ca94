//! The node's disk cache for remote sources: [`CachedStorage`] wraps a remote backend (S3) so
//! that every byte read from it is kept on local disk in blocks of `block_bytes`, keyed by the
//! source, the key, the object's version (an S3 ETag) and the block size, so a replaced object
//! never serves old bytes. A block is filled once however many readers want it (one fill task,
//! shared), written to a temporary file and renamed into place, so a crash or a full disk
//! mid-fill leaves nothing visible; it holds its bytes and a CRC-32C of them, checked on every
//! read, so a block damaged on disk is dropped and fetched again, never served. On start the
//! directory is scanned: temporaries and anything that is not a block are removed, and the
//! eviction order (least recently used, by bytes) is rebuilt from the blocks' modification
//! times. Eviction unlinks a block's file; a read that already opened it keeps its bytes.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read as _, Write as _};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::future::{BoxFuture, Shared};
use futures_util::{FutureExt as _, StreamExt as _, TryFutureExt as _};
use sha2::Digest as _;

use super::{ByteRange, Listed, Payload, Read, Storage, StorageError};
use crate::telemetry::names;

/// What ends every block file: the CRC-32C of the bytes before it (little-endian), then this.
const MAGIC: &[u8; 4] = b"ztc1";
const TRAILER: u64 = 8;

/// Blocks a read fetches ahead of the one it is sending.
const BLOCKS_AHEAD: usize = 4;

/// One block of one object version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct BlockId {
    object: [u8; 16],
    index: u64,
}

impl BlockId {
    fn file_name(&self) -> String {
        format!("{}-{:x}", hex::encode(self.object), self.index)
    }

    fn parse(name: &str) -> Option<BlockId> {
        let (object, index) = name.split_once('-')?;
        let mut id = BlockId { object: [0; 16], index: u64::from_str_radix(index, 16).ok()? };
        hex::decode_to_slice(object, &mut id.object).ok()?;
        (id.file_name() == name).then_some(id)
    }
}

/// A block on disk: its size (with its trailer) and when it was last used.
#[derive(Debug, Clone, Copy)]
struct Held {
    bytes: u64,
    used: u64,
}

/// What is on disk, in eviction order.
#[derive(Debug, Default)]
struct Index {
    blocks: HashMap<BlockId, Held>,
    /// By last use, oldest first.
    order: BTreeMap<u64, BlockId>,
    held: u64,
}

impl Index {
    fn insert(&mut self, id: BlockId, bytes: u64, used: u64) {
        self.remove(id);
        self.blocks.insert(id, Held { bytes, used });
        self.order.insert(used, id);
        self.held += bytes;
    }

    fn remove(&mut self, id: BlockId) -> Option<Held> {
        let held = self.blocks.remove(&id)?;
        self.order.remove(&held.used);
        self.held -= held.bytes;
        Some(held)
    }

    fn touch(&mut self, id: BlockId, now: u64) {
        if let Some(held) = self.blocks.get_mut(&id) {
            self.order.remove(&held.used);
            held.used = now;
            self.order.insert(now, id);
        }
    }
}

type Fill = Shared<BoxFuture<'static, Result<Bytes, StorageError>>>;

/// The cache directory, its bound and what it holds; shared by every cached source.
pub struct DiskCache {
    blocks_dir: PathBuf,
    temporary_dir: PathBuf,
    max_bytes: u64,
    block_bytes: u64,
    index: Mutex<Index>,
    /// Fills under way, so each block is fetched once however many readers want it.
    fills: Mutex<HashMap<BlockId, Fill>>,
    clock: AtomicU64,
    temporaries: AtomicU64,
}

impl std::fmt::Debug for DiskCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskCache")
            .field("blocks_dir", &self.blocks_dir)
            .field("max_bytes", &self.max_bytes)
            .field("block_bytes", &self.block_bytes)
            .finish_non_exhaustive()
    }
}

/// Why the cache directory cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("cache directory {dir}: {source}")]
pub struct CacheError {
    pub dir: PathBuf,
    pub source: std::io::Error,
}

impl DiskCache {
    /// The cache in `dir` (created when missing), holding at most `max_bytes` in blocks of
    /// `block_bytes`: temporaries and anything that is not a block are removed, the blocks
    /// found are kept in the order of their last use, and the oldest evicted while over the
    /// bound.
    pub fn open(dir: &Path, max_bytes: u64, block_bytes: u64) -> Result<Arc<DiskCache>, CacheError> {
        let failed = |source| CacheError { dir: dir.to_owned(), source };
        let (blocks_dir, temporary_dir) = (dir.join("blocks"), dir.join("tmp"));
        for made in [&blocks_dir, &temporary_dir] {
            std::fs::create_dir_all(made).map_err(failed)?;
        }
        for entry in std::fs::read_dir(&temporary_dir).map_err(failed)? {
            let _ = std::fs::remove_file(entry.map_err(failed)?.path());
        }
        let mut found = Vec::new();
        let mut removed = 0usize;
        for entry in std::fs::read_dir(&blocks_dir).map_err(failed)? {
            let entry = entry.map_err(failed)?;
            let metadata = entry.metadata().map_err(failed)?;
            let id = entry.file_name().to_str().and_then(BlockId::parse);
            match id {
                Some(id) if metadata.is_file() && metadata.len() > TRAILER => {
                    let modified = metadata.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
                    found.push((modified.map_or(0, |d| d.as_nanos()), id, metadata.len()));
                }
                _ => {
                    removed += 1;
                    let path = entry.path();
                    let _ = if metadata.is_dir() { std::fs::remove_dir_all(path) } else { std::fs::remove_file(path) };
                }
            }
        }
        found.sort();
        let mut index = Index::default();
        for (tick, (_, id, bytes)) in found.into_iter().enumerate() {
            index.insert(id, bytes, tick as u64);
        }
        let cache = DiskCache {
            clock: AtomicU64::new(index.blocks.len() as u64),
            blocks_dir,
            temporary_dir,
            max_bytes,
            block_bytes,
            index: Mutex::new(index),
            fills: Mutex::new(HashMap::new()),
            temporaries: AtomicU64::new(0),
        };
        cache.evict(None);
        let held = cache.held();
        tracing::info!(dir = %dir.display(), held, max_bytes, removed, "disk cache opened");
        metrics::gauge!(names::DISK_CACHE_BYTES).set(held as f64);
        Ok(Arc::new(cache))
    }

    /// Bytes on disk in blocks.
    pub fn held(&self) -> u64 {
        self.index.lock().expect("never poisoned").held
    }

    fn now(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    fn block_id(&self, source: &str, key: &str, version: &str, index: u64) -> BlockId {
        let mut hasher = sha2::Sha256::new();
        for part in [source, key, version, &self.block_bytes.to_string()] {
            hasher.update(part.as_bytes());
            hasher.update([0]);
        }
        BlockId { object: hasher.finalize()[..16].try_into().expect("16 of 32 bytes"), index }
    }

    fn path(&self, id: BlockId) -> PathBuf {
        self.blocks_dir.join(id.file_name())
    }

    /// The bytes of block `id`, `len` long, from disk (blocking); `None` when it is not there,
    /// or is damaged (then it is removed).
    fn read_block(&self, id: BlockId, len: u64) -> Option<Bytes> {
        if !self.index.lock().expect("never poisoned").blocks.contains_key(&id) {
            return None;
        }
        let path = self.path(id);
        let mut data = Vec::with_capacity((len + TRAILER) as usize);
        let read = std::fs::File::open(&path).and_then(|mut f| f.read_to_end(&mut data));
        let intact = read.is_ok() && data.len() as u64 == len + TRAILER && {
            let (bytes, trailer) = data.split_at(len as usize);
            trailer[4..] == MAGIC[..] && trailer[..4] == crc32c::crc32c(bytes).to_le_bytes()
        };
        if !intact {
            if read.is_ok() {
                metrics::counter!(names::DISK_CACHE_DAMAGED).increment(1);
                tracing::warn!(block = %path.display(), "a cached block is damaged; it is fetched again");
            }
            self.forget(id);
            return None;
        }
        data.truncate(len as usize);
        self.index.lock().expect("never poisoned").touch(id, self.now());
        Some(Bytes::from(data))
    }

    /// Writes block `id` (blocking): to a temporary file, then renamed into place; then evicts
    /// the least recently used blocks while over the bound. A failure (a full disk) leaves
    /// nothing behind and is counted; the bytes are served all the same.
    fn store_block(&self, id: BlockId, bytes: &[u8]) {
        let temporary =
            self.temporary_dir.join(format!("{}.{}", id.file_name(), self.temporaries.fetch_add(1, Ordering::Relaxed)));
        let written = (|| {
            let mut file = std::fs::OpenOptions::new().write(true).create_new(true).open(&temporary)?;
            file.write_all(bytes)?;
            file.write_all(&crc32c::crc32c(bytes).to_le_bytes())?;
            file.write_all(MAGIC)?;
            std::fs::rename(&temporary, self.path(id))
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&temporary);
            metrics::counter!(names::DISK_CACHE_FILL_FAILURES).increment(1);
            tracing::warn!(error = %e, dir = %self.blocks_dir.display(), "cannot keep a block in the disk cache");
            return;
        }
        self.index.lock().expect("never poisoned").insert(id, bytes.len() as u64 + TRAILER, self.now());
        self.evict(Some(id));
    }

    /// Removes the least recently used blocks (never `keep`) while more than the bound is held.
    fn evict(&self, keep: Option<BlockId>) {
        loop {
            let victim = {
                let mut index = self.index.lock().expect("never poisoned");
                if index.held <= self.max_bytes {
                    break;
                }
                let Some(victim) = index.order.values().copied().find(|id| Some(*id) != keep) else { break };
                index.remove(victim);
                metrics::gauge!(names::DISK_CACHE_BYTES).set(index.held as f64);
                victim
            };
            // Unlinked: a reader that opened it still reads its bytes.
            let _ = std::fs::remove_file(self.path(victim));
            metrics::counter!(names::DISK_CACHE_EVICTIONS).increment(1);
        }
        metrics::gauge!(names::DISK_CACHE_BYTES).set(self.held() as f64);
    }

    fn forget(&self, id: BlockId) {
        self.index.lock().expect("never poisoned").remove(id);
        let _ = std::fs::remove_file(self.path(id));
        metrics::gauge!(names::DISK_CACHE_BYTES).set(self.held() as f64);
    }
}

/// A remote backend whose reads go through the node's [`DiskCache`].
#[derive(Debug)]
pub struct CachedStorage {
    inner: Arc<dyn Storage>,
    cache: Arc<DiskCache>,
    /// Each listed object's version and size, so a read (a suffix read too) knows its blocks.
    listed: Mutex<HashMap<String, (String, u64)>>,
}

impl CachedStorage {
    pub fn new(inner: Arc<dyn Storage>, cache: Arc<DiskCache>) -> CachedStorage {
        CachedStorage { inner, cache, listed: Mutex::new(HashMap::new()) }
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
            *self.listed.lock().expect("never poisoned") =
                listed.iter().map(|l| (l.key.clone(), (l.version.clone(), l.size))).collect();
            Ok(listed)
        }
        .boxed()
    }

    fn read(&self, key: &str, range: ByteRange, version: &str) -> BoxFuture<'_, Result<Read, StorageError>> {
        let size = match self.listed.lock().expect("never poisoned").get(key) {
            Some((listed, size)) if listed == version => Some(*size),
            _ => None,
        };
        let (key, version) = (key.to_owned(), version.to_owned());
        async move {
            // An object not listed in this version is read from the source as it is.
            let Some(size) = size else { return self.inner.read(&key, range, &version).await };
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
            let blocks = self.blocks(key, version, size, range.clone());
            Ok(Read { size, range, payload: Payload::Stream(blocks) })
        }
        .boxed()
    }
}

impl CachedStorage {
    /// `range` of the object, block by block, a few blocks fetched ahead.
    fn blocks(
        &self,
        key: String,
        version: String,
        size: u64,
        range: Range<u64>,
    ) -> futures_util::stream::BoxStream<'static, Result<Bytes, StorageError>> {
        if range.is_empty() {
            return futures_util::stream::empty().boxed();
        }
        let block = self.cache.block_bytes;
        let indexes = range.start / block..=(range.end - 1) / block;
        let (inner, cache) = (Arc::clone(&self.inner), Arc::clone(&self.cache));
        futures_util::stream::iter(indexes)
            .map(move |index| {
                let span = index * block..((index + 1) * block).min(size);
                let wanted = span.start.max(range.start) - span.start..span.end.min(range.end) - span.start;
                let bytes =
                    block_bytes(Arc::clone(&inner), Arc::clone(&cache), key.clone(), version.clone(), index, span);
                bytes.map_ok(move |bytes| bytes.slice(wanted.start as usize..wanted.end as usize))
            })
            .buffered(BLOCKS_AHEAD)
            .boxed()
    }
}

/// The bytes of block `index` (`span` of the object): from disk, or fetched from the source
/// once and kept.
async fn block_bytes(
    inner: Arc<dyn Storage>,
    cache: Arc<DiskCache>,
    key: String,
    version: String,
    index: u64,
    span: Range<u64>,
) -> Result<Bytes, StorageError> {
    let id = cache.block_id(inner.name(), &key, &version, index);
    let len = span.end - span.start;
    let reader = Arc::clone(&cache);
    let on_disk = tokio::task::spawn_blocking(move || reader.read_block(id, len))
        .await
        .map_err(|e| StorageError::Unavailable { source_name: inner.name().to_owned(), message: e.to_string() })?;
    if let Some(bytes) = on_disk {
        metrics::counter!(names::DISK_CACHE_HITS).increment(1);
        metrics::counter!(names::DISK_CACHE_SERVED_BYTES).increment(len);
        return Ok(bytes);
    }
    let fill = {
        // Held while the fill is spawned and recorded: the fill removes itself when done, and
        // must find itself recorded.
        let mut fills = cache.fills.lock().expect("never poisoned");
        match fills.get(&id) {
            Some(fill) => fill.clone(),
            None => {
                metrics::counter!(names::DISK_CACHE_MISSES).increment(1);
                let filling = tokio::spawn(fill_block(inner, Arc::clone(&cache), key, version, id, span));
                let fill = async move {
                    filling.await.unwrap_or_else(|e| {
                        Err(StorageError::Unavailable {
                            source_name: String::new(),
                            message: format!("a cache fill failed: {e}"),
                        })
                    })
                }
                .boxed()
                .shared();
                fills.insert(id, fill.clone());
                fill
            }
        }
    };
    fill.await
}

/// Fetches block `id` (`span` of the object) from the source, checks its length and keeps it.
async fn fill_block(
    inner: Arc<dyn Storage>,
    cache: Arc<DiskCache>,
    key: String,
    version: String,
    id: BlockId,
    span: Range<u64>,
) -> Result<Bytes, StorageError> {
    let fetched = async {
        let read = inner.read(&key, ByteRange::Bounded(span.clone()), &version).await?;
        let bytes = super::collect(read.into_stream()).await?;
        if bytes.len() as u64 != span.end - span.start {
            return Err(StorageError::Unavailable {
                source_name: inner.name().to_owned(),
                message: format!("{key}: {} bytes came for a block of {}", bytes.len(), span.end - span.start),
            });
        }
        metrics::counter!(names::DISK_CACHE_ORIGIN_BYTES).increment(bytes.len() as u64);
        let keeper = Arc::clone(&cache);
        let kept = bytes.clone();
        let _ = tokio::task::spawn_blocking(move || keeper.store_block(id, &kept)).await;
        Ok(bytes)
    }
    .await;
    cache.fills.lock().expect("never poisoned").remove(&id);
    fetched
}
