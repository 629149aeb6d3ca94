//! The node's disk cache for remote sources: [`CachedStorage`] wraps a remote backend (S3) so
//! that every byte read from it is kept on local disk in blocks of `block_bytes`, keyed by the
//! source, the key, the object's version (an S3 ETag) and the block size, so a replaced object
//! never serves old bytes. A block is filled once however many readers want it (one fill task,
//! shared; a read of many missing blocks fetches them in one request), written to a temporary
//! file and renamed into place, so a crash or a full disk mid-fill leaves nothing visible; it holds its bytes and a CRC-32C of them, checked on every
//! read, so a block damaged on disk is dropped and fetched again, never served. Each source's
//! last listing is kept too, so a server started while the source cannot be listed serves what
//! the cache holds (its manifests are blocks like any other). On start the
//! directory is scanned: temporaries and anything that is not a block are removed, and the
//! eviction order (least recently used, by bytes) is rebuilt from the blocks' modification
//! times. Eviction unlinks a block's file (a read that already opened it keeps its bytes), and
//! never takes a pinned object's blocks.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read as _, Write as _};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::future::{BoxFuture, Shared};
use futures_util::{FutureExt as _, StreamExt as _};
use sha2::Digest as _;

use super::{ByteRange, Listed, Payload, Read, Storage, StorageError};
use crate::telemetry::names;

/// What ends every block file: the CRC-32C of the bytes before it (little-endian), then this.
const MAGIC: &[u8; 4] = b"ztc1";
const TRAILER: u64 = 8;

/// The most bytes one fill fetches from the source in one ranged read: a read of many missing
/// blocks is one request to the store, not one per block (moto answered 256 MiB in 1 MiB
/// blocks in 43 s, one request per block, against 0.5 s for one request).
const MAX_FILL_BYTES: u64 = 256 << 20;

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

/// A block being fetched: its bytes, for the readers waiting on it (kept on disk as well when
/// the disk takes them).
type Fill = Shared<BoxFuture<'static, Result<Bytes, StorageError>>>;

/// The cache directory, its bound and what it holds; shared by every cached source.
pub struct DiskCache {
    blocks_dir: PathBuf,
    temporary_dir: PathBuf,
    /// Each cached source's last listing, for a start while the source cannot be listed.
    listings_dir: PathBuf,
    max_bytes: u64,
    block_bytes: u64,
    index: Mutex<Index>,
    /// Fills under way, so each block is fetched once however many readers want it.
    fills: Mutex<HashMap<BlockId, Fill>>,
    /// Objects whose blocks are never evicted, by source.
    pinned: Mutex<HashMap<String, HashSet<[u8; 16]>>>,
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
        let (blocks_dir, temporary_dir, listings_dir) = (dir.join("blocks"), dir.join("tmp"), dir.join("listings"));
        for made in [&blocks_dir, &temporary_dir, &listings_dir] {
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
            listings_dir,
            max_bytes,
            block_bytes,
            index: Mutex::new(index),
            fills: Mutex::new(HashMap::new()),
            pinned: Mutex::new(HashMap::new()),
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
        BlockId { object: self.object_id(source, key, version), index }
    }

    /// What names one object version's blocks (with this block size).
    fn object_id(&self, source: &str, key: &str, version: &str) -> [u8; 16] {
        let mut hasher = sha2::Sha256::new();
        for part in [source, key, version, &self.block_bytes.to_string()] {
            hasher.update(part.as_bytes());
            hasher.update([0]);
        }
        hasher.finalize()[..16].try_into().expect("16 of 32 bytes")
    }

    /// Makes `objects` (key, version) `source`'s pinned objects.
    fn pin(&self, source: &str, objects: &[(String, String)]) {
        let ids = objects.iter().map(|(key, version)| self.object_id(source, key, version)).collect();
        self.pinned.lock().expect("never poisoned").insert(source.to_owned(), ids);
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

    /// Removes the least recently used blocks (never `keep`, nor a pinned object's) while more
    /// than the bound is held.
    fn evict(&self, keep: Option<BlockId>) {
        let pinned: HashSet<[u8; 16]> =
            self.pinned.lock().expect("never poisoned").values().flatten().copied().collect();
        loop {
            let victim = {
                let mut index = self.index.lock().expect("never poisoned");
                if index.held <= self.max_bytes {
                    break;
                }
                let evictable = |id: &BlockId| Some(*id) != keep && !pinned.contains(&id.object);
                let Some(victim) = index.order.values().copied().find(evictable) else {
                    tracing::warn!(
                        held = index.held,
                        max_bytes = self.max_bytes,
                        "pinned models fill the disk cache past its bound"
                    );
                    break;
                };
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

    /// How many of the blocks of `key` at `version` (`size` bytes) are on disk, in bytes.
    fn held_of(&self, source: &str, key: &str, version: &str, size: u64) -> u64 {
        let object = self.object_id(source, key, version);
        let index = self.index.lock().expect("never poisoned");
        (0..size.div_ceil(self.block_bytes))
            .filter(|&i| index.blocks.contains_key(&BlockId { object, index: i }))
            .map(|i| ((i + 1) * self.block_bytes).min(size) - i * self.block_bytes)
            .sum()
    }

    fn listing_path(&self, source: &str) -> PathBuf {
        self.listings_dir.join(format!("{}.json", hex::encode(&sha2::Sha256::digest(source.as_bytes())[..16])))
    }

    /// Keeps `listed` as `source`'s last listing (blocking): written aside and renamed.
    fn keep_listing(&self, source: &str, listed: &[Listed]) {
        let path = self.listing_path(source);
        let temporary =
            self.temporary_dir.join(format!("listing.{}", self.temporaries.fetch_add(1, Ordering::Relaxed)));
        let kept = serde_json::to_vec(&(source, listed))
            .map_err(std::io::Error::other)
            .and_then(|body| std::fs::write(&temporary, body))
            .and_then(|()| std::fs::rename(&temporary, &path));
        if let Err(e) = kept {
            let _ = std::fs::remove_file(&temporary);
            tracing::warn!(error = %e, source, "cannot keep the listing in the disk cache");
        }
    }

    /// `source`'s last listing kept (blocking).
    fn kept_listing(&self, source: &str) -> Option<Vec<Listed>> {
        let body = std::fs::read(self.listing_path(source)).ok()?;
        match serde_json::from_slice::<(String, Vec<Listed>)>(&body) {
            Ok((of, listed)) if of == source => Some(listed),
            _ => {
                tracing::warn!(source, "the listing kept in the disk cache is unreadable; it is ignored");
                None
            }
        }
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

    fn is_cached(&self) -> bool {
        true
    }

    fn kept_listing(&self) -> BoxFuture<'_, Option<Vec<Listed>>> {
        async move {
            let (cache, source) = (Arc::clone(&self.cache), self.name().to_owned());
            let listed = tokio::task::spawn_blocking(move || cache.kept_listing(&source)).await.ok()??;
            self.remember(&listed);
            Some(listed)
        }
        .boxed()
    }

    fn cached_bytes(&self, key: &str, version: &str, size: u64) -> u64 {
        self.cache.held_of(self.name(), key, version, size)
    }

    fn pin(&self, objects: &[(String, String)]) {
        self.cache.pin(self.name(), objects);
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
    /// `range` of the object, block by block: each from disk, or fetched from the source by a
    /// fill that reads every missing block from this one on in one request.
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
        let reading = Reading {
            inner: Arc::clone(&self.inner),
            cache: Arc::clone(&self.cache),
            key,
            version,
            size,
            last: (range.end - 1) / block,
            range,
        };
        let first = reading.range.start / block;
        futures_util::stream::unfold((reading, first), |(reading, index)| async move {
            if index > reading.last {
                return None;
            }
            let bytes = reading.block(index).await.map(|bytes| {
                let start = index * reading.cache.block_bytes;
                let wanted =
                    reading.range.start.max(start) - start..reading.range.end.min(start + bytes.len() as u64) - start;
                bytes.slice(wanted.start as usize..wanted.end as usize)
            });
            Some((bytes, (reading, index + 1)))
        })
        .boxed()
    }
}

/// One read through the cache.
struct Reading {
    inner: Arc<dyn Storage>,
    cache: Arc<DiskCache>,
    key: String,
    version: String,
    size: u64,
    range: Range<u64>,
    /// The last block the read needs.
    last: u64,
}

impl Reading {
    fn id(&self, index: u64) -> BlockId {
        self.cache.block_id(self.inner.name(), &self.key, &self.version, index)
    }

    fn span(&self, index: u64) -> Range<u64> {
        let block = self.cache.block_bytes;
        index * block..((index + 1) * block).min(self.size)
    }

    fn failed(&self, message: String) -> StorageError {
        StorageError::Unavailable { source_name: self.inner.name().to_owned(), message }
    }

    /// Block `index`'s bytes: from disk, or from the fill that brings it.
    async fn block(&self, index: u64) -> Result<Bytes, StorageError> {
        let (id, span) = (self.id(index), self.span(index));
        let reader = Arc::clone(&self.cache);
        let len = span.end - span.start;
        let on_disk = tokio::task::spawn_blocking(move || reader.read_block(id, len))
            .await
            .map_err(|e| self.failed(format!("reading a cached block failed: {e}")))?;
        if let Some(bytes) = on_disk {
            metrics::counter!(names::DISK_CACHE_HITS).increment(1);
            metrics::counter!(names::DISK_CACHE_SERVED_BYTES).increment(len);
            return Ok(bytes);
        }
        self.fill(index).await
    }

    /// The fill that brings block `index`: one under way, or a new one for every block from
    /// `index` on that is neither on disk nor being filled (up to the read's last block and
    /// [`MAX_FILL_BYTES`]).
    fn fill(&self, index: u64) -> Fill {
        let cache = &self.cache;
        // Held while the fill's blocks are recorded and it starts: it removes each block's
        // entry when the block is kept, and must find it recorded.
        let mut fills = cache.fills.lock().expect("never poisoned");
        if let Some(fill) = fills.get(&self.id(index)) {
            return fill.clone();
        }
        let mut blocks = Vec::new();
        let mut end = index;
        while end <= self.last && (end - index) * cache.block_bytes < MAX_FILL_BYTES {
            let id = self.id(end);
            let busy = fills.contains_key(&id) || cache.index.lock().expect("never poisoned").blocks.contains_key(&id);
            if end > index && busy {
                break;
            }
            let (sender, receiver) = tokio::sync::oneshot::channel();
            let fill: Fill = async move {
                receiver.await.unwrap_or_else(|_| {
                    Err(StorageError::Unavailable {
                        source_name: String::new(),
                        message: "a cache fill ended early".into(),
                    })
                })
            }
            .boxed()
            .shared();
            fills.insert(id, fill);
            blocks.push((id, self.span(end), sender));
            end += 1;
        }
        metrics::counter!(names::DISK_CACHE_MISSES).increment(blocks.len() as u64);
        let first = fills.get(&self.id(index)).expect("recorded above").clone();
        let run = FillRun {
            inner: Arc::clone(&self.inner),
            cache: Arc::clone(cache),
            key: self.key.clone(),
            version: self.version.clone(),
        };
        tokio::spawn(run.fetch(blocks));
        first
    }
}

/// One fill: consecutive blocks of one object version, fetched in one ranged read.
struct FillRun {
    inner: Arc<dyn Storage>,
    cache: Arc<DiskCache>,
    key: String,
    version: String,
}

type Waiting = (BlockId, Range<u64>, tokio::sync::oneshot::Sender<Result<Bytes, StorageError>>);

impl FillRun {
    /// Reads `blocks` from the source in one request, keeps each as it completes and tells its
    /// readers; a failure is every remaining block's.
    async fn fetch(self, blocks: Vec<Waiting>) {
        let span = blocks[0].1.start..blocks[blocks.len() - 1].1.end;
        let mut waiting = blocks.into_iter().peekable();
        let outcome = async {
            let read = self.inner.read(&self.key, ByteRange::Bounded(span.clone()), &self.version).await?;
            let mut pieces = read.into_stream();
            let mut buffer = Vec::new();
            while let Some(piece) = pieces.next().await {
                let mut piece = piece?;
                metrics::counter!(names::DISK_CACHE_ORIGIN_BYTES).increment(piece.len() as u64);
                while !piece.is_empty() {
                    let Some((_, block, _)) = waiting.peek() else {
                        return Err(self.failed(format!(
                            "{}: more bytes came than the {} asked for",
                            self.key,
                            span.end - span.start
                        )));
                    };
                    let wanted = (block.end - block.start) as usize;
                    let take = (wanted - buffer.len()).min(piece.len());
                    buffer.extend_from_slice(&piece.split_to(take));
                    if buffer.len() == wanted {
                        let (id, _, sender) = waiting.next().expect("peeked");
                        let bytes = Bytes::from(std::mem::take(&mut buffer));
                        // Its readers first, so they send while it is written; then kept, and
                        // only then no longer a fill, so a reader finds it one way or the other.
                        let _ = sender.send(Ok(bytes.clone()));
                        self.keep(id, bytes).await;
                        self.cache.fills.lock().expect("never poisoned").remove(&id);
                    }
                }
            }
            match waiting.peek() {
                Some(_) => Err(self.failed(format!("{}: the read ended before its last block", self.key))),
                None => Ok(()),
            }
        }
        .await;
        if let Err(error) = outcome {
            let mut fills = self.cache.fills.lock().expect("never poisoned");
            for (id, _, sender) in waiting {
                fills.remove(&id);
                let _ = sender.send(Err(error.clone()));
            }
        }
    }

    fn failed(&self, message: String) -> StorageError {
        StorageError::Unavailable { source_name: self.inner.name().to_owned(), message }
    }

    /// Keeps block `id` on disk (where the disk takes it).
    async fn keep(&self, id: BlockId, bytes: Bytes) {
        let cache = Arc::clone(&self.cache);
        let _ = tokio::task::spawn_blocking(move || cache.store_block(id, &bytes)).await;
    }
}
