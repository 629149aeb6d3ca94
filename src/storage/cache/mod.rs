//! The node's disk cache for remote sources: [`CachedStorage`] wraps a remote backend (an S3
//! prefix or a Hub repository) so that every byte read from it is kept on local disk in blocks
//! of `block_bytes`, keyed by the source, the key, the object's version (an S3 ETag, a Hub
//! file's content id) and the block size, so a replaced object never serves old bytes. A block
//! is filled once however many readers want it (one fill task, shared; a read of many missing
//! blocks fetches them in one request), written to a temporary file and renamed into place, so
//! a crash or a full disk mid-fill leaves nothing visible. It holds its bytes and a CRC-32C of
//! them, checked each time it is read (rot under the filesystem changes no stamp a shortcut
//! could trust) and by a background scrub at a set rate, so a block damaged on disk is
//! removed, counted and fetched again, never served; a checked block is sent from its file
//! with `sendfile`. An object whose digest is known is filled whole and kept only once it
//! matches ([`verify`]). Each source's last listing is kept too, so a server started while the
//! source cannot be listed serves what the cache holds (its manifests are blocks like any
//! other). On start the directory is scanned: temporaries and anything that is not a block are
//! removed, and the eviction order (least recently used, by bytes) is rebuilt from the blocks'
//! modification times. Eviction unlinks a block's file (a read that already opened it keeps
//! its bytes), and never takes a pinned object's blocks.

use std::collections::{HashMap, HashSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::future::{BoxFuture, Shared};
use sha2::Digest as _;

mod cached;
mod index;
mod reading;
mod verify;

pub use self::cached::CachedStorage;

use self::index::{BlockId, Eviction, Index};
use self::verify::Verification;
use super::mapped::MappedFile;
use super::{Listed, StorageError};
use crate::telemetry::names;

/// What ends every block file: the CRC-32C of the bytes before it (little-endian), then this.
const MAGIC: &[u8; 4] = b"ztc1";
const TRAILER: u64 = 8;

/// The most bytes one fill fetches from the source in one ranged read: a read of many missing
/// blocks is one request to the store, not one per block (moto answered 256 MiB in 1 MiB
/// blocks in 43 s, one request per block, against 0.5 s for one request). A read that starts
/// where the previous read of the same object ended (or within a block after) is taken as
/// sequential, and its fill goes
/// on this far past it, so a model loaded tensor by tensor costs a request or two, not one per
/// tensor (moto copies the whole object for every ranged GET: a 1 GiB model read as 8 tensors
/// took 8.3 s cold, one fill per tensor).
const MAX_FILL_BYTES: u64 = 1 << 30;

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
    /// Checked fills under way (objects whose digest is known), by object.
    verifications: Mutex<HashMap<[u8; 16], Verification>>,
    /// Objects whose blocks are never evicted, by source.
    pinned: Mutex<HashMap<String, HashSet<[u8; 16]>>>,
    /// Blocks handed to their readers and still being written, and a wake-up when one is done.
    writing: Mutex<usize>,
    written: tokio::sync::Notify,
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
            clock: AtomicU64::new(index.len() as u64),
            blocks_dir,
            temporary_dir,
            listings_dir,
            max_bytes,
            block_bytes,
            index: Mutex::new(index),
            fills: Mutex::new(HashMap::new()),
            verifications: Mutex::new(HashMap::new()),
            pinned: Mutex::new(HashMap::new()),
            writing: Mutex::new(0),
            written: tokio::sync::Notify::new(),
            temporaries: AtomicU64::new(0),
        };
        cache.evict(&|_| false);
        let held = cache.held();
        tracing::info!(dir = %dir.display(), held, max_bytes, removed, "disk cache opened");
        metrics::gauge!(names::DISK_CACHE_BYTES).set(held as f64);
        Ok(Arc::new(cache))
    }

    /// Counts a block about to be handed to its readers as being written.
    fn begin_write(&self) {
        *self.writing.lock().expect("never poisoned") += 1;
    }

    /// Ends [`DiskCache::begin_write`]'s count for a block written (or that failed to be).
    fn end_write(&self) {
        *self.writing.lock().expect("never poisoned") -= 1;
        self.written.notify_waiters();
    }

    /// Waits until every block handed to its readers so far is written (or failed to be).
    pub async fn settled(&self) {
        loop {
            let written = self.written.notified();
            if *self.writing.lock().expect("never poisoned") == 0 {
                return;
            }
            written.await;
        }
    }

    /// Bytes on disk in blocks.
    pub fn held(&self) -> u64 {
        self.index.lock().expect("never poisoned").held()
    }

    /// Removes this process's temporaries (fills cut short by a shutdown), so a drained
    /// server leaves nothing half-written behind; a killed one's go at the next start.
    pub fn discard_temporaries(&self) {
        let own = format!(".{}.", std::process::id());
        let Ok(entries) = std::fs::read_dir(&self.temporary_dir) else { return };
        for entry in entries.flatten() {
            if entry.file_name().to_str().is_some_and(|name| name.contains(&own)) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    /// A temporary file's suffix, unique to this process and file.
    fn temporary_suffix(&self) -> String {
        format!("{}.{}", std::process::id(), self.temporaries.fetch_add(1, Ordering::Relaxed))
    }

    fn now(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    /// What names one object version's blocks (with this block size): those of an object
    /// whose digest is known (`checked`) are named apart, so a block kept unchecked is never
    /// taken for one of them.
    fn object_id(&self, source: &str, key: &str, version: &str, checked: bool) -> [u8; 16] {
        let mut hasher = sha2::Sha256::new();
        let mut parts = vec![source, key, version];
        let block_bytes = self.block_bytes.to_string();
        parts.push(&block_bytes);
        parts.extend(checked.then_some("checked"));
        for part in parts {
            hasher.update(part.as_bytes());
            hasher.update([0]);
        }
        hasher.finalize()[..16].try_into().expect("16 of 32 bytes")
    }

    /// Makes `objects` (key, version) `source`'s pinned objects.
    fn pin(&self, source: &str, objects: &[(String, String)]) {
        // Both names: whether a digest is known of an object may change with a rescan.
        let ids = objects
            .iter()
            .flat_map(|(key, version)| [false, true].map(|checked| self.object_id(source, key, version, checked)))
            .collect();
        self.pinned.lock().expect("never poisoned").insert(source.to_owned(), ids);
    }

    fn path(&self, id: BlockId) -> PathBuf {
        self.blocks_dir.join(id.file_name())
    }

    /// The bytes of block `id`, `len` long, from disk (blocking); `None` when it is not there,
    /// or is damaged (then it is removed).
    fn read_block(&self, id: BlockId, len: u64) -> Option<Bytes> {
        if !self.index.lock().expect("never poisoned").contains(id) {
            return None;
        }
        let mapping = self.checked(id, len)?;
        self.index.lock().expect("never poisoned").used(id, self.now());
        Some(Bytes::from_owner(mapping).slice(0..len as usize))
    }

    /// Block `id`'s file, `len` bytes long, mapped once its bytes match their CRC (blocking);
    /// `None` when it is gone, unreadable or damaged, and then it is removed (a damaged block
    /// counted).
    fn checked(&self, id: BlockId, len: u64) -> Option<MappedFile> {
        let path = self.path(id);
        match checked_block(&path, len) {
            Ok(Some(mapping)) => return Some(mapping),
            Ok(None) => {
                metrics::counter!(names::DISK_CACHE_DAMAGED).increment(1);
                tracing::warn!(block = %path.display(), "a cached block is damaged; it is removed and fetched again");
            }
            // Gone (evicted by another process sharing the directory), or unreadable.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(block = %path.display(), error = %e, "a cached block cannot be read; it is fetched again");
            }
        }
        self.forget(id);
        None
    }

    /// Checks the block held after `after` (the first with `None`) against its CRC (blocking),
    /// removing it when damaged; says which block it was and its bytes on disk, `None` past
    /// the last.
    fn scrub_next(&self, after: Option<BlockId>) -> Option<(BlockId, u64)> {
        let (id, bytes) = self.index.lock().expect("never poisoned").next_after(after)?;
        let _ = self.checked(id, bytes - TRAILER);
        metrics::counter!(names::DISK_CACHE_SCRUBBED_BYTES).increment(bytes);
        Some((id, bytes))
    }

    /// Checks every block held, one after another, over and over, at about `bytes_per_second`
    /// (0: never), so a block damaged at rest is found before a reader needs it.
    pub async fn scrub_forever(self: Arc<Self>, bytes_per_second: u64) {
        if bytes_per_second == 0 {
            return;
        }
        let mut after = None;
        loop {
            let cache = Arc::clone(&self);
            let checked = tokio::task::spawn_blocking(move || cache.scrub_next(after)).await.ok().flatten();
            let pause = match checked {
                Some((id, bytes)) => {
                    after = Some(id);
                    std::time::Duration::from_secs_f64(bytes as f64 / bytes_per_second as f64)
                }
                // A pass is done (or nothing is held): the next starts a little later.
                None => {
                    after = None;
                    SCRUB_PASS_PAUSE
                }
            };
            tokio::time::sleep(pause).await;
        }
    }

    /// Writes block `id` (blocking): to a temporary file, then renamed into place; then evicts
    /// the least recently used blocks while over the bound. A failure (a full disk) leaves
    /// nothing behind and is counted; the bytes are served all the same.
    fn store_block(&self, id: BlockId, bytes: &[u8]) {
        let Some(temporary) = self.write_temporary(id, bytes) else { return };
        if self.publish(id, &temporary, bytes.len() as u64) {
            self.evict(&|held| *held == id);
        }
    }

    /// Writes block `id`'s bytes and trailer to a temporary file (blocking), not yet visible;
    /// `None` when the disk does not take them (counted, and nothing is left behind).
    fn write_temporary(&self, id: BlockId, bytes: &[u8]) -> Option<PathBuf> {
        let temporary = self.temporary_dir.join(format!("{}.{}", id.file_name(), self.temporary_suffix()));
        let written = (|| {
            let mut file = std::fs::OpenOptions::new().write(true).create_new(true).open(&temporary)?;
            file.write_all(bytes)?;
            file.write_all(&crc32c::crc32c(bytes).to_le_bytes())?;
            file.write_all(MAGIC)
        })();
        match written {
            Ok(()) => Some(temporary),
            Err(e) => {
                let _ = std::fs::remove_file(&temporary);
                metrics::counter!(names::DISK_CACHE_FILL_FAILURES).increment(1);
                tracing::warn!(error = %e, dir = %self.blocks_dir.display(), "cannot keep a block in the disk cache");
                None
            }
        }
    }

    /// Renames `temporary` (block `id`, `len` bytes) into place and records it (blocking);
    /// whether it is kept. Eviction is the caller's.
    fn publish(&self, id: BlockId, temporary: &Path, len: u64) -> bool {
        if let Err(e) = std::fs::rename(temporary, self.path(id)) {
            let _ = std::fs::remove_file(temporary);
            metrics::counter!(names::DISK_CACHE_FILL_FAILURES).increment(1);
            tracing::warn!(error = %e, dir = %self.blocks_dir.display(), "cannot keep a block in the disk cache");
            return false;
        }
        self.index.lock().expect("never poisoned").insert(id, len + TRAILER, self.now());
        true
    }

    /// The first `len` bytes of a block written aside (blocking); `None` when it is gone (kept
    /// into place, or removed) or cannot be read.
    fn aside_bytes(&self, path: &Path, len: u64) -> Option<Vec<u8>> {
        use std::os::unix::fs::FileExt as _;
        let file = std::fs::File::open(path).ok()?;
        let mut bytes = vec![0u8; len as usize];
        file.read_exact_at(&mut bytes, 0).ok()?;
        Some(bytes)
    }

    /// Block `id`'s bytes, `len` long, read with `pread` once they match their CRC (blocking),
    /// for a check that reads them in user space; `None` when the block is not held, or is
    /// damaged (then it is removed).
    fn block_bytes(&self, id: BlockId, len: u64) -> Option<Vec<u8>> {
        use std::os::unix::fs::FileExt as _;
        if !self.index.lock().expect("never poisoned").contains(id) {
            return None;
        }
        let mapping = self.checked(id, len)?;
        let mut bytes = vec![0u8; len as usize];
        match mapping.file().read_exact_at(&mut bytes, 0) {
            Ok(()) => Some(bytes),
            Err(_) => {
                self.forget(id);
                None
            }
        }
    }

    /// Removes the least recently used blocks (never one `keep` accepts, nor a pinned
    /// object's) while more than the bound is held.
    fn evict(&self, keep: &dyn Fn(&BlockId) -> bool) {
        let pinned: HashSet<[u8; 16]> =
            self.pinned.lock().expect("never poisoned").values().flatten().copied().collect();
        let evictable = |id: &BlockId| !keep(id) && !pinned.contains(&id.object);
        loop {
            let victim = {
                let mut index = self.index.lock().expect("never poisoned");
                match index.evict_next(self.max_bytes, evictable) {
                    Eviction::WithinBound => break,
                    Eviction::OnlyUnevictable => {
                        tracing::warn!(
                            held = index.held(),
                            max_bytes = self.max_bytes,
                            "pinned models fill the disk cache past its bound"
                        );
                        break;
                    }
                    Eviction::Evicted(victim) => {
                        metrics::gauge!(names::DISK_CACHE_BYTES).set(index.held() as f64);
                        victim
                    }
                }
            };
            // Unlinked: a reader that opened it still reads its bytes.
            let _ = std::fs::remove_file(self.path(victim));
            metrics::counter!(names::DISK_CACHE_EVICTIONS).increment(1);
        }
        metrics::gauge!(names::DISK_CACHE_BYTES).set(self.held() as f64);
    }

    /// How many of the blocks of `key` at `version` (`size` bytes) are on disk, in bytes.
    fn held_of(&self, source: &str, key: &str, version: &str, size: u64, checked: bool) -> u64 {
        let object = self.object_id(source, key, version, checked);
        self.index.lock().expect("never poisoned").held_of(object, size, self.block_bytes)
    }

    fn listing_path(&self, source: &str) -> PathBuf {
        self.listings_dir.join(format!("{}.json", hex::encode(&sha2::Sha256::digest(source.as_bytes())[..16])))
    }

    /// Keeps `listed` as `source`'s last listing (blocking): written aside and renamed.
    fn keep_listing(&self, source: &str, listed: &[Listed]) {
        let path = self.listing_path(source);
        let temporary = self.temporary_dir.join(format!("listing.{}", self.temporary_suffix()));
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

/// How long the scrub waits between one pass over every block and the next.
const SCRUB_PASS_PAUSE: std::time::Duration = std::time::Duration::from_secs(10);

/// Blocks a read prepares (reads from disk and checks, or waits for) ahead of the one it sends.
const BLOCKS_AHEAD: usize = 2;

/// Bytes of a block's file checked at a time, in a buffer each blocking thread keeps.
const CHECK_PIECE: usize = 128 << 10;

/// The block file at `path`, mapped, when it holds `len` bytes and a trailer whose CRC-32C
/// matches them (`None` when it does not). The bytes are checked with `pread`, never loaded
/// from the mapping, which is only ever sent (with `sendfile`, as local files are): the pages
/// just checked are the page cache's pages `sendfile` sends.
fn checked_block(path: &Path, len: u64) -> std::io::Result<Option<MappedFile>> {
    use std::os::unix::fs::FileExt as _;
    thread_local! {
        static BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let mapping = MappedFile::open(path)?;
    let file = mapping.file();
    if file.metadata()?.len() != len + TRAILER {
        return Ok(None);
    }
    let mut trailer = [0u8; TRAILER as usize];
    file.read_exact_at(&mut trailer, len)?;
    if trailer[4..] != MAGIC[..] {
        return Ok(None);
    }
    let crc = BUFFER.with_borrow_mut(|buffer| {
        buffer.resize(CHECK_PIECE, 0);
        let (mut crc, mut at) = (0u32, 0u64);
        while at < len {
            let piece = &mut buffer[..CHECK_PIECE.min((len - at) as usize)];
            file.read_exact_at(piece, at)?;
            crc = crc32c::crc32c_append(crc, piece);
            at += piece.len() as u64;
        }
        Ok::<_, std::io::Error>(crc)
    })?;
    Ok((trailer[..4] == crc.to_le_bytes()).then_some(mapping))
}
