//! Fills checked against the object's digest: when the SHA-256 of an object's bytes is known
//! (a Hub file's LFS id, a `SHA256SUMS` line beside it), its blocks are never
//! kept one by one as they arrive. One run per object, shared by every reader, brings all of
//! them onto disk: each block already held is read back (its CRC checked) and each missing run
//! of blocks is fetched in one ranged read and written aside, every byte hashed in order. Only
//! when the whole object's SHA-256 matches are the new blocks renamed into place; on a
//! mismatch nothing is kept, the run is tried once more, and then the read fails with
//! [`StorageError::Corrupt`] (counted). Nothing is remembered of a failure: the next read tries
//! the origin again. Readers are not kept waiting for the whole object: each block is theirs
//! as soon as the run has hashed it (from disk, or from the file it was written aside to),
//! except the last block of each read, held until the digest matches, so a response ends
//! short, never complete, when it does not, or when the attempt that matched is not the one
//! its earlier blocks came from.

use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::future::{BoxFuture, Shared};
use futures_util::{FutureExt as _, StreamExt as _};
use sha2::Digest as _;

use super::index::BlockId;
use super::{DiskCache, MAX_FILL_BYTES};
use crate::storage::{ByteRange, ReadIntent, Storage, StorageError};
use crate::telemetry::names;

/// A run bringing one object onto disk, checked, for every reader waiting on it.
pub(super) type Verification = Arc<Run>;

/// What a run's readers see of it.
pub(super) struct Run {
    /// The outcome: `Ok` with the attempt (from 1) whose bytes matched.
    done: Shared<BoxFuture<'static, Result<usize, StorageError>>>,
    /// The attempt under way and how many blocks from the first it has hashed.
    reached: tokio::sync::watch::Receiver<(usize, u64)>,
    /// The blocks the attempt under way fetched and wrote aside, by index.
    aside: Mutex<HashMap<u64, PathBuf>>,
}

impl Run {
    /// The attempt whose bytes matched, once the run is done.
    pub(super) async fn done(&self) -> Result<usize, StorageError> {
        self.done.clone().await
    }

    /// Whether the run is known to have matched (a reader has seen its outcome).
    pub(super) fn matched(&self) -> bool {
        matches!(self.done.peek(), Some(Ok(_)))
    }

    /// Block `index` (`len` bytes) as soon as the run has hashed it, and the attempt it came
    /// from; `None` once it is on disk for good (the run is done) or the attempt it was in
    /// failed: the caller looks on disk again.
    pub(super) async fn block(&self, cache: &Arc<DiskCache>, index: u64, len: u64) -> Option<(Bytes, usize)> {
        let mut reached = self.reached.clone();
        let attempt = loop {
            let (attempt, hashed) = *reached.borrow_and_update();
            if hashed > index {
                break attempt;
            }
            if reached.changed().await.is_err() {
                return None;
            }
        };
        let aside = self.aside.lock().expect("never poisoned").get(&index).cloned()?;
        let cache = Arc::clone(cache);
        let bytes = tokio::task::spawn_blocking(move || cache.aside_bytes(&aside, len)).await.ok()??;
        Some((bytes.into(), attempt))
    }
}

/// One object version whose digest is known.
pub(super) struct Verify {
    pub(super) inner: Arc<dyn Storage>,
    pub(super) cache: Arc<DiskCache>,
    pub(super) object: [u8; 16],
    pub(super) key: String,
    pub(super) version: String,
    pub(super) size: u64,
    pub(super) expected: [u8; 32],
}

/// Why one attempt failed.
enum Failure {
    /// The bytes read hash to this, not the digest expected.
    Mismatch([u8; 32]),
    Storage(StorageError),
}

impl From<StorageError> for Failure {
    fn from(error: StorageError) -> Failure {
        Failure::Storage(error)
    }
}

/// Attempts one run makes before the read fails: a fault on the way is retried once.
const ATTEMPTS: usize = 2;

impl Verify {
    /// The run for this object: one under way, or a new one (on its own task, so a reader
    /// that goes away never wastes it).
    pub(super) fn run(self) -> Verification {
        let cache = Arc::clone(&self.cache);
        let mut runs = cache.verifications.lock().expect("never poisoned");
        if let Some(run) = runs.get(&self.object) {
            return run.clone();
        }
        let object = self.object;
        let (finished, outcome) = tokio::sync::oneshot::channel();
        let (progress, reached) = tokio::sync::watch::channel((1, 0));
        let done = async move {
            outcome.await.unwrap_or_else(|_| {
                Err(StorageError::Unavailable {
                    source_name: String::new(),
                    message: "a checked fill ended early".into(),
                })
            })
        };
        let run = Arc::new(Run { done: done.boxed().shared(), reached, aside: Mutex::new(HashMap::new()) });
        let (forget, running) = (Arc::clone(&self.cache), Arc::clone(&run));
        tokio::spawn(async move {
            let result = self.attempts(&running, &progress).await;
            // Told before it is forgotten: a reader that finds the run until then sees its
            // outcome, and only a read after that starts another.
            let _ = finished.send(result);
            forget.verifications.lock().expect("never poisoned").remove(&object);
        });
        runs.insert(object, Arc::clone(&run));
        run
    }

    async fn attempts(
        &self,
        run: &Run,
        progress: &tokio::sync::watch::Sender<(usize, u64)>,
    ) -> Result<usize, StorageError> {
        for attempt in 1..=ATTEMPTS {
            run.aside.lock().expect("never poisoned").clear();
            progress.send_replace((attempt, 0));
            let hashed = |blocks| {
                progress.send_replace((attempt, blocks));
            };
            match self.attempt(run, hashed).await {
                Ok(()) => {
                    metrics::counter!(names::DISK_CACHE_CHECKED_FILLS, "outcome" => "ok").increment(1);
                    return Ok(attempt);
                }
                Err(Failure::Mismatch(actual)) => {
                    metrics::counter!(names::DISK_CACHE_CHECKED_FILLS, "outcome" => "mismatch").increment(1);
                    tracing::warn!(
                        source = self.inner.name(),
                        key = %self.key,
                        expected = %hex::encode(self.expected),
                        actual = %hex::encode(actual),
                        attempt,
                        "the bytes the origin sent do not match the object's digest; nothing was kept"
                    );
                }
                Err(Failure::Storage(error)) => {
                    metrics::counter!(names::DISK_CACHE_CHECKED_FILLS, "outcome" => "failed").increment(1);
                    return Err(error);
                }
            }
        }
        Err(StorageError::Corrupt {
            source_name: self.inner.name().to_owned(),
            key: self.key.clone(),
            message: format!("its bytes did not match SHA-256 {} in {ATTEMPTS} reads", hex::encode(self.expected)),
        })
    }

    fn id(&self, index: u64) -> BlockId {
        BlockId { object: self.object, index }
    }

    fn span(&self, index: u64) -> Range<u64> {
        let block = self.cache.block_bytes;
        index * block..((index + 1) * block).min(self.size)
    }

    /// Hashes every block in order, from disk or from the origin (written aside), and renames
    /// the new ones into place only when the digest matches; removes them otherwise.
    async fn attempt(&self, run: &Run, hashed: impl Fn(u64)) -> Result<(), Failure> {
        let mut written = Vec::new();
        let outcome = self.hash_all(run, &hashed, &mut written).await;
        let cache = Arc::clone(&self.cache);
        let matched = matches!(outcome, Ok(actual) if actual == self.expected);
        let object = self.object;
        let _ = tokio::task::spawn_blocking(move || {
            for (id, temporary, len) in written {
                if !matched {
                    let _ = std::fs::remove_file(&temporary);
                } else {
                    cache.publish(id, &temporary, len);
                }
            }
            // Its own blocks stay while it is read, even past the bound.
            cache.evict(&|held| held.object == object);
        })
        .await;
        match outcome {
            Ok(actual) if actual == self.expected => Ok(()),
            Ok(actual) => Err(Failure::Mismatch(actual)),
            Err(failure) => Err(failure),
        }
    }

    /// The SHA-256 of the object's bytes; each block fetched is written aside into `written`.
    async fn hash_all(
        &self,
        run: &Run,
        hashed_to: &impl Fn(u64),
        written: &mut Vec<(BlockId, PathBuf, u64)>,
    ) -> Result<[u8; 32], Failure> {
        let blocks = self.size.div_ceil(self.cache.block_bytes);
        let mut hasher = sha2::Sha256::new();
        let mut index = 0;
        while index < blocks {
            let (cache, id, len) =
                (Arc::clone(&self.cache), self.id(index), self.span(index).end - self.span(index).start);
            if let Some(bytes) = tokio::task::spawn_blocking(move || cache.block_bytes(id, len)).await.ok().flatten() {
                hasher = hashed(hasher, bytes.into()).await?;
                index += 1;
                hashed_to(index);
                continue;
            }
            // The run of missing blocks from here, fetched in one read.
            let mut end = index + 1;
            while end < blocks
                && (end - index) * self.cache.block_bytes < MAX_FILL_BYTES
                && !self.cache.index.lock().expect("never poisoned").contains(self.id(end))
            {
                end += 1;
            }
            hasher = self.fetch(index..end, hasher, run, hashed_to, written).await?;
            index = end;
        }
        Ok(hasher.finalize().into())
    }

    /// Fetches `blocks` in one ranged read: each block hashed and written aside as it completes.
    async fn fetch(
        &self,
        blocks: Range<u64>,
        hasher: sha2::Sha256,
        run: &Run,
        hashed_to: &impl Fn(u64),
        written: &mut Vec<(BlockId, PathBuf, u64)>,
    ) -> Result<sha2::Sha256, Failure> {
        // The block being hashed and written while the next one arrives.
        let mut pending: Option<(u64, Job)> = None;
        let mut hasher = Some(hasher);
        let outcome = self.fetch_into(blocks, &mut hasher, &mut pending, run, hashed_to, written).await;
        if let Some((index, job)) = pending.take() {
            let finished = self.finish(index, job, run, hashed_to, written).await;
            if outcome.is_ok() {
                hasher = Some(finished?);
            }
        }
        outcome?;
        Ok(hasher.expect("handed back by the last block's job"))
    }

    async fn fetch_into(
        &self,
        blocks: Range<u64>,
        hasher: &mut Option<sha2::Sha256>,
        pending: &mut Option<(u64, Job)>,
        run: &Run,
        hashed_to: &impl Fn(u64),
        written: &mut Vec<(BlockId, PathBuf, u64)>,
    ) -> Result<(), Failure> {
        let span = self.span(blocks.start).start..self.span(blocks.end - 1).end;
        let read =
            self.inner.read(&self.key, ByteRange::Bounded(span.clone()), &self.version, ReadIntent::Serve).await?;
        let mut pieces = read.into_stream();
        let (mut index, mut buffer) = (blocks.start, Vec::new());
        while let Some(piece) = pieces.next().await {
            let mut piece = piece?;
            metrics::counter!(names::DISK_CACHE_ORIGIN_BYTES).increment(piece.len() as u64);
            while !piece.is_empty() {
                if index == blocks.end {
                    let asked = span.end - span.start;
                    return Err(self
                        .failed(format!("{}: more bytes came than the {asked} asked for", self.key))
                        .into());
                }
                let wanted = (self.span(index).end - self.span(index).start) as usize;
                let take = (wanted - buffer.len()).min(piece.len());
                buffer.extend_from_slice(&piece.split_to(take));
                if buffer.len() == wanted {
                    if let Some((done, job)) = pending.take() {
                        *hasher = Some(self.finish(done, job, run, hashed_to, written).await?);
                    }
                    let (cache, id, bytes) = (Arc::clone(&self.cache), self.id(index), std::mem::take(&mut buffer));
                    let mut taking = hasher.take().expect("handed back by the previous block's job");
                    let job = tokio::task::spawn_blocking(move || {
                        taking.update(&bytes);
                        (cache.write_temporary(id, &bytes), taking)
                    });
                    *pending = Some((index, job));
                    index += 1;
                }
            }
        }
        if index != blocks.end {
            return Err(self.failed(format!("{}: the read ended before its last block", self.key)).into());
        }
        Ok(())
    }

    /// Block `index`'s job done: its file aside is recorded, and readers told it is there.
    async fn finish(
        &self,
        index: u64,
        job: Job,
        run: &Run,
        hashed_to: &impl Fn(u64),
        written: &mut Vec<(BlockId, PathBuf, u64)>,
    ) -> Result<sha2::Sha256, Failure> {
        let (kept, hasher) = job.await.map_err(|e| self.failed(format!("a checked fill failed: {e}")))?;
        let Some(temporary) = kept else {
            return Err(self
                .failed(format!("{}: the disk cache cannot keep its blocks to check them", self.key))
                .into());
        };
        let len = self.span(index).end - self.span(index).start;
        run.aside.lock().expect("never poisoned").insert(index, temporary.clone());
        written.push((self.id(index), temporary, len));
        hashed_to(index + 1);
        Ok(hasher)
    }

    fn failed(&self, message: String) -> StorageError {
        StorageError::Unavailable { source_name: self.inner.name().to_owned(), message }
    }
}

/// A block being hashed and written aside: the file it was written to (`None`: the disk did
/// not take it), and the hasher having taken it.
type Job = tokio::task::JoinHandle<(Option<PathBuf>, sha2::Sha256)>;

/// `hasher` having taken `bytes`, on the blocking pool.
async fn hashed(mut hasher: sha2::Sha256, bytes: bytes::Bytes) -> Result<sha2::Sha256, Failure> {
    tokio::task::spawn_blocking(move || {
        hasher.update(&bytes);
        hasher
    })
    .await
    .map_err(|e| Failure::Storage(StorageError::Unavailable { source_name: String::new(), message: e.to_string() }))
}
