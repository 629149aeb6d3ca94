//! Content digests ahead of need: after every scan, each file a model version publishes to
//! the protocols that list files with their digests (the Hub API, the OCI registry) and whose
//! digest is not known is hashed in the background, once per file version, a few files at a
//! time (`digests.hash_concurrency`), never on a request's path. A local file is read with
//! `pread` into one reused buffer (`digests.read_buffer_bytes`), sparing the page cache when
//! configured; anything else (companions, remote objects, built view files) is hashed as its
//! bytes stream. A digest the source gives (a Hub file's LFS id) is kept unread; one a
//! `SHA256SUMS` in the model's directory states is taken for listings and checked on the
//! file's first whole read ([`Hashing::published_file_bytes`]). A request that needs a digest
//! not yet known moves its file to the front of the queue and waits a bounded time; every
//! asker of a file shares its one computation, which goes on when they go away. Progress
//! (bytes hashed of bytes to hash, per model) and an estimate of the time left are what a
//! refused asker is told. The queue, the store and the estimate are [`crate::digests`]'s; this
//! module decides what to hash and hashes it.

mod asks;
mod schedule;
mod stated;
#[cfg(test)]
mod tests;

pub(crate) use schedule::StatedByModel;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::bytes::{ModelBytes, model_bytes};
use super::image_layer::{LayerFraming, layer_identity};
use super::published::Publication;
use super::representation::Guard;
use super::sha256::{FileHasher, FileSha256s, sha256_of};
use super::{Published, PublishedFile, ServiceError};
use crate::catalog::{Catalog, Model};
use crate::digests::{FileDigests, FileIdentity, Queue, QueuedJob, Throughput};
use crate::format::Manifest;
use crate::format::view::ViewBytes;
use crate::storage::FileRegion;
use crate::telemetry::names;

/// Which digest of a published file is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DigestOf {
    /// Of the file's bytes.
    File,
    /// Of the file's image layer ([`super::image_layer`]).
    ImageLayer,
    /// Of the file's bytes, computed here: never one a `SHA256SUMS` states or a source gives
    /// (what a signature's check needs).
    ComputedFile,
}

impl DigestOf {
    /// Whether only a digest this server computed will do.
    fn computed_only(self) -> bool {
        self == DigestOf::ComputedFile
    }
}

/// What hashing one file needs: the snapshot it was listed in.
#[derive(Clone)]
struct Input {
    catalog: Arc<Catalog>,
    model: Arc<Model>,
    manifest: Arc<Manifest>,
    file: PublishedFile,
}

/// How a computation ended, as every asker of it sees it.
#[derive(Clone)]
enum Outcome {
    Running,
    /// Its digests are kept in the store.
    Known,
    Failed(ServiceError),
}

/// One digest not known yet (a file version's, or its image layer's): queued, being hashed,
/// or failed.
struct Job {
    /// Which digest of the file this job computes.
    of: DigestOf,
    /// The file's own identity (the job's key for [`DigestOf::File`]).
    file: FileIdentity,
    /// Whether a job for the file's own digest hashes its image layer in the same read.
    with_layer: bool,
    model: String,
    size: u64,
    /// Whether the file is built rather than stored (a `.zt` model's safetensors view): its
    /// bytes may need decoding, which takes decoders that requests need too.
    built: bool,
    input: Mutex<Input>,
    /// Bytes hashed so far by the computation running now.
    hashed: Arc<AtomicU64>,
    outcome: tokio::sync::watch::Sender<Outcome>,
}

impl Job {
    fn new(of: DigestOf, file: FileIdentity, input: Input, built: bool, outcome: Outcome) -> Job {
        let hashed = if matches!(outcome, Outcome::Known) { input.file.size } else { 0 };
        Job {
            of,
            file,
            with_layer: false,
            model: input.model.id.clone(),
            size: input.file.size,
            built,
            input: Mutex::new(input),
            hashed: Arc::new(AtomicU64::new(hashed)),
            outcome: tokio::sync::watch::Sender::new(outcome),
        }
    }
}

/// The digests of published files, and their hashing in the background.
pub(crate) struct Hashing {
    /// The SHA-256 of each published file version, once known.
    digests: FileDigests,
    /// The files hashed and their bytes.
    publication: Arc<Publication>,
    /// Which models' signed directories need digests computed here.
    signing: crate::config::Signing,
    /// How long requests wait for digests.
    waits: DigestWaits,
    queue: Mutex<Queue<Job>>,
    /// Which sources' files scans queue; the others' only requests do.
    ahead: crate::config::HashAhead,
    workers: usize,
    read_buffer: usize,
    spare_page_cache: bool,
    /// Bytes per second one worker hashes, from the files hashed so far.
    rate: Throughput,
    /// Checks of stated digests running, by file: concurrent whole reads share one.
    checks: Mutex<HashMap<FileIdentity, Guard>>,
}

/// How long a request waits for digests being computed.
pub(crate) struct DigestWaits {
    /// For one file (`digests.file_wait_ms`).
    pub(crate) file: Duration,
    /// For a listing (`digests.listing_wait_secs`).
    pub(crate) listing: Duration,
    /// `limits.request_timeout_secs`, which every wait stays a second under.
    pub(crate) request_timeout: Option<Duration>,
}

impl Hashing {
    pub(crate) fn new(
        config: &crate::config::Digests,
        digests: FileDigests,
        publication: Arc<Publication>,
        signing: crate::config::Signing,
        waits: DigestWaits,
    ) -> Hashing {
        let workers =
            config.hash_concurrency.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, usize::from));
        Hashing {
            digests,
            publication,
            signing,
            waits,
            queue: Mutex::new(Queue::default()),
            ahead: config.ahead,
            workers,
            read_buffer: config.read_buffer_bytes as usize,
            spare_page_cache: config.spare_page_cache,
            rate: Throughput::default(),
            checks: Mutex::default(),
        }
    }

    /// Every digest known, and their store (the server syncs it).
    pub(crate) fn digests(&self) -> &FileDigests {
        &self.digests
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue<Job>> {
        self.queue.lock().expect("never poisoned")
    }
}

impl QueuedJob for Job {
    fn size(&self) -> u64 {
        self.size
    }

    fn hashed(&self) -> u64 {
        self.hashed.load(Ordering::Relaxed)
    }

    fn built(&self) -> bool {
        self.built
    }

    fn retried(&self) {
        self.outcome.send_replace(Outcome::Running);
    }
}

/// The gauges of the queue, set from it whole.
fn publish_gauges(queue: &Queue<Job>) {
    let counts = queue.counts();
    for (state, count) in
        [("queued", counts.queued), ("hashing", counts.hashing), ("failed", counts.failed), ("known", counts.known)]
    {
        metrics::gauge!(names::DIGEST_FILES, "state" => state).set(count as f64);
    }
    metrics::gauge!(names::DIGEST_PENDING_BYTES).set(counts.pending_bytes as f64);
}

impl Hashing {
    /// The digest kept under `key` that will do for a digest `of` that kind: any known one, or
    /// for [`DigestOf::ComputedFile`] only one this server computed.
    fn digest_known(&self, key: FileIdentity, of: DigestOf) -> Option<[u8; 32]> {
        if of.computed_only() { self.digests.computed(key) } else { self.digests.known(key) }
    }

    /// The SHA-256 of `file`'s bytes said by its source without reading them (a Hub file's
    /// LFS id), for a file served as stored.
    fn source_sha256(
        &self,
        catalog: &Catalog,
        model: &Arc<Model>,
        manifest: &Arc<Manifest>,
        file: &PublishedFile,
    ) -> Option<[u8; 32]> {
        self.publication.object_behind(catalog, model, manifest, file).and_then(|object| object.content().sha256)
    }

    /// Starts workers while files are queued and fewer than `hash_concurrency` run. A worker
    /// takes the next queued file when it finishes one, and ends when none is left.
    fn start_hashing(self: &Arc<Self>) {
        loop {
            let first = {
                let mut queue = self.lock();
                if queue.running >= self.workers {
                    return;
                }
                let Some(first) = self.pop_unknown(&mut queue) else { return };
                queue.running += 1;
                publish_gauges(&queue);
                first
            };
            let hashing = Arc::clone(self);
            tokio::spawn(async move {
                let (mut identity, mut job) = first;
                loop {
                    hashing.hash(identity, &job).await;
                    let mut queue = hashing.lock();
                    queue.finished(&job);
                    match hashing.pop_unknown(&mut queue) {
                        Some(next) => {
                            publish_gauges(&queue);
                            (identity, job) = next;
                        }
                        None => {
                            queue.running -= 1;
                            return;
                        }
                    }
                }
            });
        }
    }

    /// The next queued job whose digest is still unknown, now marked hashing; each one passed
    /// over (learnt since it was queued: by another job, a `SHA256SUMS`, the source) is done,
    /// under the same lock, so no count ever shows it running.
    fn pop_unknown(&self, queue: &mut Queue<Job>) -> Option<(FileIdentity, Arc<Job>)> {
        while let Some((key, job)) = queue.pop() {
            if self.digest_known(key, job.of).is_none() {
                return Some((key, job));
            }
            queue.finished(&job);
            queue.known(key, false);
            job.outcome.send_replace(Outcome::Known);
        }
        None
    }

    /// Computes `job`'s digest (the one kept under `key`), keeps it, and tells its askers.
    async fn hash(self: &Arc<Self>, key: FileIdentity, job: &Arc<Job>) {
        let input = job.input.lock().expect("never poisoned").clone();
        // Stated (a SHA256SUMS read by a scan) or computed since the file was queued.
        if self.digest_known(key, job.of).is_some() {
            let mut queue = self.lock();
            queue.known(key, false);
            job.outcome.send_replace(Outcome::Known);
            publish_gauges(&queue);
            return;
        }
        job.hashed.store(0, Ordering::Relaxed);
        let started = Instant::now();
        // In a task of its own, so a panic in it fails this file, not the worker.
        let hashing = Arc::clone(self);
        let hashed = Arc::clone(&job.hashed);
        let (of, file, with_layer) = (job.of, job.file, job.with_layer);
        let computed = tokio::spawn(async move {
            // A layer's job reads the file once for both digests when its own is not known yet.
            let framing = || {
                LayerFraming::of(&input.file.path, input.file.size)
                    .map_err(|reason| ServiceError::NoImageLayer { model: input.model.id.clone(), reason })
            };
            let (own, layer) = match of {
                DigestOf::File if with_layer => (true, Some(framing()?)),
                DigestOf::File | DigestOf::ComputedFile => (true, None),
                // Its own digest too, unless it is known or a job of its own computes it.
                DigestOf::ImageLayer => {
                    let own = hashing.digests.known(file).is_none() && !hashing.lock().holds(file);
                    (own, Some(framing()?))
                }
            };
            let layer_key = layer_identity(file, &input.file.path);
            let digests = hashing.compute_sha256(&input, hashed, own, layer).await?;
            let digests = [digests.file.map(|digest| (file, digest)), digests.layer.map(|digest| (layer_key, digest))];
            // Kept across restarts (a blocking write) before anyone is told, off the lock.
            tokio::task::spawn_blocking(move || {
                for &(identity, digest) in digests.iter().flatten() {
                    if hashing.digests.computed(identity) != Some(digest) {
                        hashing.digests.append(identity, digest);
                    }
                }
                digests
            })
            .await
            .map_err(|e| ServiceError::Internal(format!("keeping a digest failed: {e}")))
        })
        .await
        .unwrap_or_else(|e| Err(ServiceError::Internal(format!("hashing a file failed: {e}"))));
        let mut queue = self.lock();
        match computed {
            Ok(digests) => {
                // Known and the job done in one step under the queue's lock: an ask, a
                // schedule or a count finds one or the other, never a file to hash again
                // nor a job still running for a digest known.
                for (identity, digest) in digests.into_iter().flatten() {
                    self.digests.remember(identity, digest);
                }
                self.rate.learn(job.size, started.elapsed());
                // The gauge counts files; a layer is a second digest of one.
                queue.known(key, job.of != DigestOf::ImageLayer);
                job.outcome.send_replace(Outcome::Known);
            }
            Err(e) => {
                tracing::warn!(model = %job.model, error = %e, "cannot compute a file's digest; it is tried again after the next scan or when asked");
                queue.failed(key);
                job.outcome.send_replace(Outcome::Failed(e));
            }
        }
        publish_gauges(&queue);
    }

    /// The SHA-256 of `input`'s file when `own`, and of its image layer when `layer` frames it,
    /// in one read; `hashed` counts its bytes as they are.
    async fn compute_sha256(
        self: &Arc<Self>,
        input: &Input,
        hashed: Arc<AtomicU64>,
        own: bool,
        layer: Option<LayerFraming>,
    ) -> Result<FileSha256s, ServiceError> {
        let Input { catalog, model, manifest, file } = input;
        let stored = match &file.what {
            Published::View(name) => match self.publication.view(model, manifest).file(name).map(|f| f.bytes.clone()) {
                Some(ViewBytes::Stored { file }) => Some(file),
                _ => None,
            },
            Published::Stored(name) => model.files.iter().position(|f| f.name == *name),
            Published::Companion(_) => None,
            // A signed file that is one of the model's stored files is read as they are.
            Published::Signed(index) => catalog.signed_directory(&model.id).and_then(|dir| {
                let key = &dir.files.get(*index)?.object.key;
                model.files.iter().position(|f| f.object.key == *key)
            }),
        };
        if let Some(index) = stored {
            if let ModelBytes::Mapped { file: stored_file, .. } = model_bytes(model, manifest, index).await? {
                let len = model.file_len(manifest, index);
                let (buffer, spare) = (self.read_buffer, self.spare_page_cache);
                let model_id = model.id.clone();
                return tokio::task::spawn_blocking(move || {
                    let hasher = FileHasher::new(own, layer.as_ref());
                    hash_local_file(hasher, &stored_file.slice(0..len), buffer, spare, &hashed)
                        .map_err(|source| ServiceError::Storage { model: model_id, source })
                })
                .await
                .map_err(|e| ServiceError::Internal(format!("hashing a file failed: {e}")))?;
            }
        }
        let bytes = self.publication.published_bytes(catalog, model, manifest, &file.what).await?;
        tracing::debug!(model = %model.id, file = %file.path, size = file.size, "hashing a published file");
        sha256_of(bytes.source.open(0..bytes.source.len()), FileHasher::new(own, layer.as_ref()), hashed, &model.id)
            .await
    }
}

/// The SHA-256 of `file`'s bytes, read a piece of `buffer` bytes at a time (blocking). With
/// `spare_page_cache`, the pages read are dropped from the page cache behind the reads, so
/// hashing a model larger than memory does not evict what is being served.
fn hash_local_file(
    mut hasher: FileHasher,
    file: &FileRegion,
    buffer: usize,
    spare_page_cache: bool,
    hashed: &AtomicU64,
) -> Result<FileSha256s, crate::storage::StorageError> {
    let counter = metrics::counter!(names::FILE_DIGEST_BYTES, "digest" => hasher.purpose());
    let pending = metrics::gauge!(names::DIGEST_PENDING_BYTES);
    file.read_in_pieces(buffer, spare_page_cache, |piece| {
        hasher.update(piece);
        let n = piece.len() as u64;
        hashed.fetch_add(n, Ordering::Relaxed);
        counter.increment(n);
        pending.decrement(n as f64);
    })?;
    Ok(hasher.finish())
}
