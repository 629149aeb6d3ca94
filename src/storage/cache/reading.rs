//! One read through the disk cache, block by block: each from disk, from the checked fill of
//! its object when the object's digest is known, or from a fill that fetches every missing block
//! from it on in one ranged read and keeps each as it arrives.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::{FutureExt as _, StreamExt as _};

use super::index::BlockId;
use super::verify::{Verification, Verify};
use super::{DiskCache, Fill, MAX_FILL_BYTES};
use crate::storage::{ByteRange, ReadIntent, Storage, StorageError};
use crate::telemetry::names;

/// One read through the cache.
pub(super) struct Reading {
    /// What names the object version's blocks, hashed once per read rather than per block.
    pub(super) object: [u8; 16],
    /// The SHA-256 of the object's bytes, when known: then its blocks come only from a
    /// checked fill of the whole object.
    pub(super) expected: Option<[u8; 32]>,
    /// The checked fills this read took blocks from before they were done, and the attempt
    /// of each block taken.
    pub(super) streamed: Mutex<Vec<(Verification, usize)>>,
    /// The checked fill this read joined: every block of the read comes from it, so its
    /// failure is the read's, unless it matched and a block was evicted since.
    pub(super) joined: Mutex<Option<Verification>>,
    pub(super) inner: Arc<dyn Storage>,
    pub(super) cache: Arc<DiskCache>,
    pub(super) key: String,
    pub(super) version: String,
    pub(super) size: u64,
    pub(super) range: Range<u64>,
    /// The last block the read needs.
    pub(super) last: u64,
    /// The last block a fill for it may bring (past `last` for a sequential read).
    pub(super) fill_last: u64,
}

impl Reading {
    fn id(&self, index: u64) -> BlockId {
        BlockId { object: self.object, index }
    }

    fn span(&self, index: u64) -> Range<u64> {
        let block = self.cache.block_bytes;
        index * block..((index + 1) * block).min(self.size)
    }

    fn failed(&self, message: String) -> StorageError {
        StorageError::Unavailable { source_name: self.inner.name().to_owned(), message }
    }

    /// Block `index`'s bytes: from disk, or from the fill that brings it.
    pub(super) async fn block(&self, index: u64) -> Result<Bytes, StorageError> {
        let (id, span) = (self.id(index), self.span(index));
        let len = span.end - span.start;
        // A block kept between the look on disk and the look for its fill is read from disk
        // again; twice in a row (evicted again at once), it is fetched anew.
        for turn in 0..3 {
            let reader = Arc::clone(&self.cache);
            let on_disk = tokio::task::spawn_blocking(move || reader.read_block(id, len))
                .await
                .map_err(|e| self.failed(format!("reading a cached block failed: {e}")))?;
            if let Some(bytes) = on_disk {
                metrics::counter!(names::DISK_CACHE_HITS).increment(1);
                metrics::counter!(names::DISK_CACHE_SERVED_BYTES).increment(len);
                return Ok(bytes);
            }
            if let Some(expected) = self.expected {
                let run = self.verification(expected);
                if let Some((bytes, attempt)) = run.block(&self.cache, index, len).await {
                    self.streamed.lock().expect("never poisoned").push((run, attempt));
                    return Ok(bytes);
                }
                run.done().await?;
                continue;
            }
            if let Some(fill) = self.fill(index, turn == 2) {
                return fill.await;
            }
        }
        match self.expected {
            // Checked and kept three times, and evicted each time before it could be read.
            Some(_) => Err(self.failed(format!("{}: the disk cache cannot hold it while it is read", self.key))),
            None => unreachable!("the last turn always fills"),
        }
    }

    /// Whether every block this read took from a checked fill before it was done came from
    /// the attempt that matched (waiting for those fills to end).
    pub(super) async fn streamed_blocks_matched(&self) -> Result<(), StorageError> {
        let streamed = std::mem::take(&mut *self.streamed.lock().expect("never poisoned"));
        for (run, attempt) in streamed {
            if run.done().await? != attempt {
                return Err(self.failed(format!(
                    "{}: its bytes were sent from an attempt that did not match its digest",
                    self.key
                )));
            }
        }
        Ok(())
    }

    /// The checked fill of the whole object: the one this read joined, unless it matched (a
    /// block it kept was evicted since); else one under way, or a new one.
    fn verification(&self, expected: [u8; 32]) -> Verification {
        let mut joined = self.joined.lock().expect("never poisoned");
        if let Some(run) = joined.as_ref().filter(|run| !run.matched()) {
            return Arc::clone(run);
        }
        let run = Verify {
            inner: Arc::clone(&self.inner),
            cache: Arc::clone(&self.cache),
            object: self.object,
            key: self.key.clone(),
            version: self.version.clone(),
            size: self.size,
            expected,
        }
        .run();
        *joined = Some(Arc::clone(&run));
        run
    }

    /// The fill that brings block `index`: one under way, or a new one for every block from
    /// `index` on that is neither on disk nor being filled (up to `fill_last` and
    /// [`MAX_FILL_BYTES`]); `None` when the block is on disk by now (unless `even_if_kept`).
    fn fill(&self, index: u64, even_if_kept: bool) -> Option<Fill> {
        let cache = &self.cache;
        // Held while the fill's blocks are recorded and it starts: it removes each block's
        // entry when the block is kept, and must find it recorded.
        let mut fills = cache.fills.lock().expect("never poisoned");
        if let Some(fill) = fills.get(&self.id(index)) {
            return Some(fill.clone());
        }
        if !even_if_kept && cache.index.lock().expect("never poisoned").contains(self.id(index)) {
            return None;
        }
        let mut blocks = Vec::new();
        let mut end = index;
        while end <= self.fill_last && (end - index) * cache.block_bytes < MAX_FILL_BYTES {
            let id = self.id(end);
            let busy = fills.contains_key(&id) || cache.index.lock().expect("never poisoned").contains(id);
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
            writes: Arc::new(tokio::sync::Semaphore::new(WRITES_AHEAD)),
        };
        tokio::spawn(run.fetch(blocks));
        Some(first)
    }
}

/// Blocks one fill writes to disk at once, while it reads the next ones.
const WRITES_AHEAD: usize = 4;

/// One fill: consecutive blocks of one object version, fetched in one ranged read.
struct FillRun {
    inner: Arc<dyn Storage>,
    cache: Arc<DiskCache>,
    key: String,
    version: String,
    writes: Arc<tokio::sync::Semaphore>,
}

type Waiting = (BlockId, Range<u64>, tokio::sync::oneshot::Sender<Result<Bytes, StorageError>>);

impl FillRun {
    /// Reads `blocks` from the source in one request, keeps each as it completes and tells its
    /// readers; a failure is every remaining block's.
    async fn fetch(self, blocks: Vec<Waiting>) {
        let span = blocks[0].1.start..blocks[blocks.len() - 1].1.end;
        let started = std::time::Instant::now();
        tracing::debug!(key = %self.key, start = span.start, end = span.end, "filling blocks from the source");
        let mut waiting = blocks.into_iter().peekable();
        let outcome = async {
            let read =
                self.inner.read(&self.key, ByteRange::Bounded(span.clone()), &self.version, ReadIntent::Serve).await?;
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
                        // Its readers first, so they send while it is written; it is written
                        // while the next blocks arrive. Counted as being written before any
                        // reader has it, so a reader's `settled` cannot miss it.
                        self.cache.begin_write();
                        let _ = sender.send(Ok(bytes.clone()));
                        self.keep(id, bytes).await;
                    }
                }
            }
            match waiting.peek() {
                Some(_) => Err(self.failed(format!("{}: the read ended before its last block", self.key))),
                None => Ok(()),
            }
        }
        .await;
        tracing::debug!(key = %self.key, start = span.start, end = span.end, ms = started.elapsed().as_millis() as u64, ok = outcome.is_ok(), "fill done");
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

    /// Keeps block `id` on disk (where the disk takes it), on the blocking pool, while the fill
    /// goes on (up to [`WRITES_AHEAD`] blocks being written at once); only once it is kept is
    /// it no longer a fill, so a reader finds it one way or the other.
    /// The block was counted by [`DiskCache::begin_write`]; this ends the count when written.
    async fn keep(&self, id: BlockId, bytes: Bytes) {
        let Ok(permit) = Arc::clone(&self.writes).acquire_owned().await else {
            self.cache.end_write();
            return;
        };
        let cache = Arc::clone(&self.cache);
        tokio::task::spawn_blocking(move || {
            cache.store_block(id, &bytes);
            cache.fills.lock().expect("never poisoned").remove(&id);
            drop(permit);
            cache.end_write();
        });
    }
}
