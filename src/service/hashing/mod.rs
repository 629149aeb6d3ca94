//! Content digests ahead of need: after every scan, each file a model version publishes to
//! the protocols that list files with their digests (the Hub API, the OCI registry) and whose
//! digest is not known is hashed in the background, once per file version, a few files at a
//! time (`digests.hash_concurrency`), never on a request's path. A local file is read with
//! `pread` into one reused buffer (`digests.read_buffer_bytes`), sparing the page cache when
//! configured; anything else (companions, remote objects, built view files) is hashed as its
//! bytes stream. A digest the source gives (a Hub file's LFS id) is kept unread; one a
//! `SHA256SUMS` in the model's directory states is taken for listings and checked on the
//! file's first whole read ([`Service::published_file_bytes`]). A request that needs a digest
//! not yet known moves its file to the front of the queue and waits a bounded time; every
//! asker of a file shares its one computation, which goes on when they go away. Progress
//! (bytes hashed of bytes to hash, per model) and an estimate of the time left are what a
//! refused asker is told. The queue, the store and the estimate are [`crate::digests`]'s; this
//! module decides what to hash and hashes it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::bytes::{ModelBytes, StoredBytes, model_bytes};
use super::image_layer::{LayerFraming, layer_identity};
use super::representation::{ByteStream, Guard, RangeSource, guard, guarded};
use super::sha256::{FileHasher, FileSha256s, sha256_of};
use super::{Published, PublishedFile, Service, ServiceError};
use crate::catalog::{Catalog, Model};
use crate::digests::{DigestProgress, FileIdentity, ModelFiles, Queue, QueuedJob, Throughput, Urgency};
use crate::format::Manifest;
use crate::format::view::ViewBytes;
use crate::storage::ObjectVersion;
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

/// The background hashing of published files.
pub(crate) struct Hashing {
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

impl Hashing {
    pub(crate) fn new(config: &crate::config::Digests) -> Hashing {
        let workers =
            config.hash_concurrency.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, usize::from));
        Hashing {
            queue: Mutex::new(Queue::default()),
            ahead: config.ahead,
            workers,
            read_buffer: config.read_buffer_bytes as usize,
            spare_page_cache: config.spare_page_cache,
            rate: Throughput::default(),
            checks: Mutex::default(),
        }
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

impl Service {
    /// Tells the disk cache the digest a `SHA256SUMS` states for each file of `catalog`'s
    /// models read through it and not told yet, so that its fills are checked. Runs before the
    /// catalog is swapped in, so no read of a new version (or of any, after a restart) fills
    /// unchecked first.
    pub(crate) async fn hand_down_statements(&self, catalog: &Catalog) {
        for model in catalog.models() {
            // Every file of a model is of its source: only a cached source's are read checked,
            // and only a model with a SHA256SUMS has lines to hand down.
            let Ok(manifest) = &model.state else { continue };
            let has_sums = || catalog.companions(&model.id).iter().any(|c| c.name == crate::format::sums::SUMS_FILE);
            if !model.source.storage.is_cached() || !has_sums() {
                continue;
            }
            let untold: Vec<(String, ObjectVersion)> = self
                .repository_files(catalog, model, manifest)
                .into_iter()
                .filter_map(|file| Some((file.path.clone(), self.object_behind(catalog, model, manifest, &file)?)))
                .filter(|(_, o)| o.storage.is_cached() && !o.storage.expects_sha256(&o.key, &o.version))
                .collect();
            if untold.is_empty() {
                continue;
            }
            let sums = self.stated_sums(catalog, model).await;
            for (path, object) in untold {
                if let Some(digest) = sums.get(&path) {
                    object.storage.expect_sha256(&object.key, &object.version, *digest);
                }
            }
        }
    }

    /// Schedules the hashing of every file the models of `catalog` publish whose digest is
    /// not known, and drops what no listed model publishes any more. A digest the file's source
    /// gives (a Hub file's LFS id) is kept at once, unread; one a `SHA256SUMS` in the model's
    /// directory states is taken until a whole read checks it. Called after each scan.
    pub(crate) async fn schedule_digests(self: &Arc<Self>, catalog: &Arc<Catalog>) {
        let mut wanted: Vec<(FileIdentity, Job)> = Vec::new();
        let mut models = HashMap::new();
        let mut layers = std::collections::HashSet::new();
        let mut unknown_files = 0;
        for model in catalog.models() {
            let Ok(manifest) = &model.state else { continue };
            let files = self.repository_files(catalog, model, manifest);
            let mut listed = Vec::with_capacity(files.len());
            let mut unknown = Vec::new();
            let mut layer_candidates = Vec::new();
            let mut with_layer = std::collections::HashSet::new();
            let ahead = match self.hashing.ahead {
                crate::config::HashAhead::All => true,
                crate::config::HashAhead::Local => model.source.kind() == "local",
                crate::config::HashAhead::None => false,
            };
            let input = |file: &PublishedFile| Input {
                catalog: Arc::clone(catalog),
                model: Arc::clone(model),
                manifest: Arc::clone(manifest),
                file: file.clone(),
            };
            for file in files {
                let identity = self.digest_identity(catalog, model, manifest, &file);
                listed.push((identity, file.size));
                let layer = layer_identity(identity, &file.path);
                layers.insert(layer);
                let stated = self.source_sha256(catalog, model, manifest, &file);
                // A file whose own digest its source states is read for its layer only when
                // its image is asked for.
                if stated.is_none() && self.digests.known(layer).is_none() {
                    layer_candidates.push((layer, identity, file.clone()));
                }
                if self.digests.known(identity).is_some() {
                    continue;
                }
                if let Some(digest) = stated {
                    self.digests.insert_from_source(identity, digest);
                    continue;
                }
                unknown.push((identity, file));
            }
            if !unknown.is_empty() {
                let sums = self.stated_sums(catalog, model).await;
                for (identity, file) in unknown {
                    let built = self.object_behind(catalog, model, manifest, &file).is_none();
                    if let Some(digest) = sums.get(&file.path).filter(|_| !built) {
                        self.digests.state(identity, *digest);
                        continue;
                    }
                    unknown_files += 1;
                    if !ahead {
                        continue;
                    }
                    let mut job = Job::new(DigestOf::File, identity, input(&file), built, Outcome::Running);
                    // A built file (a `.zt` model's view) may need decoding to be read: its
                    // layer is hashed in the same read rather than decoded again.
                    job.with_layer = built && LayerFraming::of(&file.path, file.size).is_ok();
                    with_layer.extend(job.with_layer.then_some(identity));
                    wanted.push((identity, job));
                }
            }
            // Layers ahead too, after every file's own digest; not of files a SHA256SUMS
            // states, whose reading it spares (their layers are read when asked for).
            for (layer, identity, file) in layer_candidates {
                let framed = LayerFraming::of(&file.path, file.size).is_ok();
                if ahead && framed && self.digests.unverified(identity).is_none() && !with_layer.contains(&identity) {
                    let built = self.object_behind(catalog, model, manifest, &file).is_none();
                    let job = Job::new(DigestOf::ImageLayer, identity, input(&file), built, Outcome::Running);
                    wanted.push((layer, job));
                }
            }
            // A signed model's verdict needs the digest this server computes of every file of
            // its signed directory: one a SHA256SUMS states or its source gives will not do.
            if self.signing_policy(model) != crate::config::SigningPolicy::None {
                let mut seen: std::collections::HashSet<FileIdentity> = listed.iter().map(|(id, _)| *id).collect();
                seen.extend(wanted.iter().map(|(id, _)| *id));
                for file in self.signature_files(catalog, model) {
                    let identity = self.digest_identity(catalog, model, manifest, &file);
                    if !seen.insert(identity) || self.digests.computed(identity).is_some() {
                        continue;
                    }
                    listed.push((identity, file.size));
                    unknown_files += 1;
                    if ahead {
                        let job = Job::new(DigestOf::ComputedFile, identity, input(&file), false, Outcome::Running);
                        wanted.push((identity, job));
                    }
                }
            }
            models.insert(model.id.clone(), ModelFiles { version: model.version.clone(), files: listed });
        }
        // Small files first: every model's config and tokenizer are known within moments.
        wanted.sort_by_key(|(_, job)| job.size);
        let known_files = models.values().flat_map(|m| &m.files).count() - unknown_files;
        {
            let mut queue = self.hashing.lock();
            // What a listed model publishes stays (asked for, when scans queue nothing).
            let mut keep: std::collections::HashSet<FileIdentity> =
                models.values().flat_map(|m: &ModelFiles| m.files.iter().map(|(id, _)| *id)).collect();
            keep.extend(layers);
            // Known since the scan looked (a request had it hashed meanwhile): kept as is.
            let wanted: Vec<(FileIdentity, Job, Urgency)> = wanted
                .into_iter()
                .filter(|(key, job)| self.digest_known(*key, job.of).is_none())
                .map(|(key, job)| {
                    let urgency = match job.of {
                        DigestOf::File | DigestOf::ComputedFile => Urgency::Scheduled,
                        DigestOf::ImageLayer => Urgency::ScheduledImageLayers,
                    };
                    (key, job, urgency)
                })
                .collect();
            // A job entered already reads the file as this scan listed it; a failed one is
            // tried again after each scan.
            let refresh = |entered: &Job, listed: Job| {
                *entered.input.lock().expect("never poisoned") = listed.input.into_inner().expect("never poisoned");
            };
            queue.reschedule(&keep, wanted, refresh, models, known_files);
            publish_gauges(&queue);
        }
        self.start_hashing();
    }

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
        self.object_behind(catalog, model, manifest, file)
            .and_then(|object| object.storage.content_sha256(&object.key, &object.version))
    }

    /// The digests the `SHA256SUMS` beside `model` states, by path below the model's
    /// directory (none when there is no such file, or it cannot be read: then every file is
    /// hashed, and the reason logged).
    async fn stated_sums(&self, catalog: &Catalog, model: &Arc<Model>) -> std::collections::BTreeMap<String, [u8; 32]> {
        use crate::format::sums::{MAX_SUMS_BYTES, SUMS_FILE, parse_sums};
        let companions = catalog.companions(&model.id);
        let Some(sums) = companions.iter().find(|c| c.name == SUMS_FILE) else { return Default::default() };
        let failed = |reason: String| {
            tracing::warn!(model = %model.id, file = SUMS_FILE, reason, "cannot take the digests a SHA256SUMS states; hashing the files");
            Default::default()
        };
        if sums.object.size > MAX_SUMS_BYTES {
            return failed(format!("{} bytes, over the {MAX_SUMS_BYTES} bytes read", sums.object.size));
        }
        let read = match self.representations.companion_file(model, sums) {
            Ok(bytes) => {
                use futures_util::TryStreamExt as _;
                let pieces = bytes.source.open(0..bytes.source.len()).map_ok(|piece| piece.to_vec());
                pieces.try_concat().await
            }
            Err(e) => return failed(e.to_string()),
        };
        let text = match read.map(String::from_utf8) {
            Ok(Ok(text)) => text,
            Ok(Err(_)) => return failed("not UTF-8".into()),
            Err(e) => return failed(e.to_string()),
        };
        let (stated, unreadable) = parse_sums(&text);
        if unreadable > 0 {
            tracing::warn!(model = %model.id, file = SUMS_FILE, unreadable, "lines of a SHA256SUMS that are no digest line are ignored");
        }
        stated
    }

    /// Starts workers while files are queued and fewer than `hash_concurrency` run. A worker
    /// takes the next queued file when it finishes one, and ends when none is left.
    fn start_hashing(self: &Arc<Self>) {
        loop {
            let first = {
                let mut queue = self.hashing.lock();
                if queue.running >= self.hashing.workers {
                    return;
                }
                let Some(first) = queue.pop() else { return };
                queue.running += 1;
                publish_gauges(&queue);
                first
            };
            let service = Arc::clone(self);
            tokio::spawn(async move {
                let (mut identity, mut job) = first;
                loop {
                    service.hash(identity, &job).await;
                    let mut queue = service.hashing.lock();
                    queue.finished(&job);
                    match queue.pop() {
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

    /// Computes `job`'s digest (the one kept under `key`), keeps it, and tells its askers.
    async fn hash(self: &Arc<Self>, key: FileIdentity, job: &Arc<Job>) {
        let input = job.input.lock().expect("never poisoned").clone();
        // Stated (a SHA256SUMS read by a scan) or computed since the file was queued.
        if self.digest_known(key, job.of).is_some() {
            let mut queue = self.hashing.lock();
            queue.known(key, false);
            job.outcome.send_replace(Outcome::Known);
            publish_gauges(&queue);
            return;
        }
        job.hashed.store(0, Ordering::Relaxed);
        let started = Instant::now();
        // In a task of its own, so a panic in it fails this file, not the worker.
        let service = Arc::clone(self);
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
                    let own = service.digests.known(file).is_none() && !service.hashing.lock().holds(file);
                    (own, Some(framing()?))
                }
            };
            let layer_key = layer_identity(file, &input.file.path);
            let digests = service.compute_sha256(&input, hashed, own, layer).await?;
            // Kept (and appended to the store, a blocking write) before the job leaves the
            // queue: an ask between the two finds the digest, never a file to hash again.
            tokio::task::spawn_blocking(move || {
                if let Some(digest) = digests.file {
                    service.digests.insert(file, digest);
                }
                if let Some(digest) = digests.layer {
                    service.digests.insert(layer_key, digest);
                }
            })
            .await
            .map_err(|e| ServiceError::Internal(format!("keeping a digest failed: {e}")))?;
            Ok(())
        })
        .await
        .unwrap_or_else(|e| Err(ServiceError::Internal(format!("hashing a file failed: {e}"))));
        let mut queue = self.hashing.lock();
        match computed {
            Ok(()) => {
                self.hashing.rate.learn(job.size, started.elapsed());
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
            Published::View(name) => match self.view(model, manifest).file(name).map(|f| f.bytes.clone()) {
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
            if let ModelBytes::Mapped { mapping, source_name, key, .. } = model_bytes(model, manifest, index).await? {
                let len = model.file_len(manifest, index);
                let (buffer, spare) = (self.hashing.read_buffer, self.hashing.spare_page_cache);
                let model_id = model.id.clone();
                return tokio::task::spawn_blocking(move || {
                    let hasher = FileHasher::new(own, layer.as_ref());
                    hash_local_file(hasher, mapping.file(), len, buffer, spare, &hashed, (&source_name, &key))
                        .map_err(|source| ServiceError::Storage { model: model_id, source })
                })
                .await
                .map_err(|e| ServiceError::Internal(format!("hashing a file failed: {e}")))?;
            }
        }
        let bytes = self.published_bytes(catalog, model, manifest, &file.what).await?;
        tracing::debug!(model = %model.id, file = %file.path, size = file.size, "hashing a published file");
        sha256_of(bytes.source.open(0..bytes.source.len()), FileHasher::new(own, layer.as_ref()), hashed, &model.id)
            .await
    }

    /// How long a request waits for digests being computed: `digests.file_wait_ms` for one
    /// file, `digests.listing_wait_secs` for a listing; always a second under
    /// `limits.request_timeout_secs`, so that the client gets the refusal and its Retry-After,
    /// not the timeout's.
    pub(crate) fn digest_wait(&self, listing: bool) -> Duration {
        let digests = &self.settings.digests;
        let wait = if listing {
            Duration::from_secs(digests.listing_wait_secs)
        } else {
            Duration::from_millis(digests.file_wait_ms)
        };
        match self.settings.request_timeout_secs {
            Some(limit) => wait.min(Duration::from_secs(limit).saturating_sub(Duration::from_secs(1))),
            None => wait,
        }
    }

    /// The digest of `file` of `model`: known, stated by its source, or computed in the
    /// background, this file first. Waits at most `wait` for a computation, then refuses with
    /// how far the model's hashing is and when to ask again.
    pub(crate) async fn published_sha256(
        self: &Arc<Self>,
        catalog: &Arc<Catalog>,
        model: &Arc<Model>,
        manifest: &Arc<Manifest>,
        file: &PublishedFile,
        wait: Duration,
    ) -> Result<[u8; 32], ServiceError> {
        Ok(self.published_sha256s(catalog, model, manifest, &[file], DigestOf::File, wait).await?.remove(0))
    }

    /// The digests of `files` of `model` (or of their image layers), as
    /// [`Service::published_sha256`] gives one, waiting at most `wait` for them all. A layer's
    /// digest is computed in the same read as its file's: a file whose own digest its source
    /// states is read once when its layer is first asked for.
    pub(crate) async fn published_sha256s(
        self: &Arc<Self>,
        catalog: &Arc<Catalog>,
        model: &Arc<Model>,
        manifest: &Arc<Manifest>,
        files: &[&PublishedFile],
        of: DigestOf,
        wait: Duration,
    ) -> Result<Vec<[u8; 32]>, ServiceError> {
        let identities: Vec<FileIdentity> =
            files.iter().map(|f| self.digest_identity(catalog, model, manifest, f)).collect();
        let wanted: Vec<FileIdentity> = match of {
            DigestOf::File | DigestOf::ComputedFile => identities.clone(),
            DigestOf::ImageLayer => {
                for file in files {
                    LayerFraming::of(&file.path, file.size)
                        .map_err(|reason| ServiceError::NoImageLayer { model: model.id.clone(), reason })?;
                }
                identities.iter().zip(files).map(|(id, f)| layer_identity(*id, &f.path)).collect()
            }
        };
        let computed_only = of.computed_only();
        let lookup = |id: FileIdentity| self.digest_known(id, of);
        let mut digests: Vec<Option<[u8; 32]>> = wanted.iter().map(|id| lookup(*id)).collect();
        let mut waiting = Vec::new();
        for (((identity, key), file), digest) in identities.iter().zip(&wanted).zip(files).zip(&mut digests) {
            if digest.is_some() {
                continue;
            }
            if let (DigestOf::File, false, Some(stated)) =
                (of, computed_only, self.source_sha256(catalog, model, manifest, file))
            {
                self.digests.insert_from_source(*identity, stated);
                *digest = Some(stated);
                continue;
            }
            let urgency = if files.len() == 1 { Urgency::FileAsked } else { Urgency::ListingAsked };
            waiting.push(self.ask((*key, of, *identity), catalog, model, manifest, file, urgency));
        }
        if waiting.is_empty() {
            return Ok(digests.into_iter().map(|d| d.expect("every digest known")).collect());
        }
        self.start_hashing();
        let deadline = tokio::time::Instant::now() + wait;
        let mut pending = Vec::new();
        for (key, job) in waiting {
            let mut outcome = job.outcome.subscribe();
            let settled = tokio::time::timeout_at(deadline, outcome.wait_for(|o| !matches!(o, Outcome::Running))).await;
            match settled.map(|o| o.map(|o| o.clone())) {
                Ok(Ok(Outcome::Known)) => {
                    let at = wanted.iter().position(|id| *id == key).expect("asked for");
                    // Kept before its job said so; a job that found the digest stated meanwhile
                    // did not compute it, and the next ask for a computed one will.
                    match lookup(key) {
                        Some(known) => digests[at] = Some(known),
                        None if computed_only => pending.push((key, job)),
                        None => return Err(ServiceError::Internal("a digest said known is not".into())),
                    }
                }
                Ok(Ok(Outcome::Failed(e))) => return Err(e),
                // Timed out (or the job was replaced by a newer scan): still running.
                _ => pending.push((key, job)),
            }
        }
        if pending.is_empty() {
            return Ok(digests.into_iter().map(|d| d.expect("every digest known")).collect());
        }
        Err(self.digest_pending(model, &pending))
    }

    /// The job computing the digest kept under `key` (`of` the file whose identity is `file`),
    /// moved up the queue to `urgency` (or made, for a digest no scan scheduled yet).
    fn ask(
        &self,
        (key, of, identity): (FileIdentity, DigestOf, FileIdentity),
        catalog: &Arc<Catalog>,
        model: &Arc<Model>,
        manifest: &Arc<Manifest>,
        file: &PublishedFile,
        urgency: Urgency,
    ) -> (FileIdentity, Arc<Job>) {
        let input = || Input {
            catalog: Arc::clone(catalog),
            model: Arc::clone(model),
            manifest: Arc::clone(manifest),
            file: file.clone(),
        };
        let built = self.object_behind(catalog, model, manifest, file).is_none();
        let mut queue = self.hashing.lock();
        // Checked again under the queue's lock. A finished computation keeps its digest before
        // its job leaves the queue, so an ask that races its end finds one or the other, and
        // a file is never hashed twice.
        if self.digest_known(key, of).is_some() {
            return (key, Arc::new(Job::new(of, identity, input(), false, Outcome::Known)));
        }
        (key, queue.ask(key, urgency, || Job::new(of, identity, input(), built, Outcome::Running)))
    }

    /// The refusal of a request whose digests of `model` are still being computed: how far
    /// the model's hashing is, and when the last of those `pending` should be known (what is
    /// being hashed and what is queued ahead of it, shared among the workers).
    fn digest_pending(&self, model: &Model, pending: &[(FileIdentity, Arc<Job>)]) -> ServiceError {
        let progress = self.digest_progress(model);
        let (remaining, running) = {
            let queue = self.hashing.lock();
            (queue.remaining_through(pending), queue.running)
        };
        let workers = self.hashing.workers.min(pending.len().max(running));
        ServiceError::DigestPending {
            model: model.id.clone(),
            hashed: progress.hashed_bytes,
            total: progress.bytes,
            retry_after_secs: self.hashing.rate.seconds_for(remaining, workers),
        }
    }

    /// How far the hashing of `model`'s published files is (as of the last scan's listing of
    /// this version; nothing known of another).
    pub(crate) fn digest_progress(&self, model: &Model) -> DigestProgress {
        self.hashing.lock().progress(&model.id, &model.version, |key| self.digests.known(key).is_some())
    }

    /// How far the hashing of every listed model's files is, all together.
    pub(crate) fn digest_totals(&self) -> DigestProgress {
        let catalog = self.catalog();
        let listed = DigestProgress { listed: true, ..DigestProgress::default() };
        catalog.models().filter(|m| m.state.is_ok()).map(|m| self.digest_progress(m)).fold(listed, DigestProgress::and)
    }
}

impl Service {
    /// The bytes `file` of `model` serves to the protocols that publish files. A whole read of
    /// a file whose digest a `SHA256SUMS` stated checks it: the body's last piece is held back
    /// until the file's real digest (hashed alongside, once however many read) matches.
    pub(crate) async fn published_file_bytes(
        self: &Arc<Self>,
        catalog: &Arc<Catalog>,
        model: &Arc<Model>,
        manifest: &Arc<Manifest>,
        file: &PublishedFile,
    ) -> Result<StoredBytes, ServiceError> {
        let bytes = self.published_bytes(catalog, model, manifest, &file.what).await?;
        let identity = self.digest_identity(catalog, model, manifest, file);
        let Some(stated) = self.digests.unverified(identity) else { return Ok(bytes) };
        let input = Input {
            catalog: Arc::clone(catalog),
            model: Arc::clone(model),
            manifest: Arc::clone(manifest),
            file: file.clone(),
        };
        let checked = StatedCheck { inner: bytes.source, service: Arc::clone(self), identity, stated, input };
        Ok(StoredBytes { source: Arc::new(checked), etag: bytes.etag })
    }

    /// The check of `identity`'s stated digest against its bytes, started now or joined. A
    /// match makes the digest a computed one (kept in the store); a mismatch is logged and
    /// counted, and the digest computed takes the stated one's place.
    fn check_stated(self: &Arc<Self>, identity: FileIdentity, stated: [u8; 32], input: &Input) -> Guard {
        let mut checks = self.hashing.checks.lock().expect("never poisoned");
        if let Some(running) = checks.get(&identity) {
            return running.clone();
        }
        let (done, outcome) = tokio::sync::oneshot::channel();
        let service = Arc::clone(self);
        let input = input.clone();
        // A task of its own: the check runs while the body streams, not when its end is polled.
        tokio::spawn(async move {
            let (model, path) = (&input.model.id, &input.file.path);
            let computed = service.compute_sha256(&input, Arc::new(AtomicU64::new(0)), true, None).await;
            let computed = computed.and_then(|digests| {
                digests.file.ok_or_else(|| ServiceError::Internal("a file's digest was not computed".into()))
            });
            if let Ok(actual) = computed {
                // Computed, it is the file's digest from now on (a blocking append to the store).
                let keeping = Arc::clone(&service);
                let _ = tokio::task::spawn_blocking(move || keeping.digests.insert(identity, actual)).await;
            }
            let result = match computed {
                Ok(actual) if actual == stated => {
                    metrics::counter!(names::DIGEST_CHECKS, "outcome" => "ok").increment(1);
                    Ok(())
                }
                Ok(actual) => {
                    metrics::counter!(names::DIGEST_CHECKS, "outcome" => "mismatch").increment(1);
                    metrics::counter!(names::DIGEST_FAILURES).increment(1);
                    let reason = format!(
                        "file {path:?} of model {model:?} has SHA-256 {}, not the {} its SHA256SUMS states",
                        hex::encode(actual),
                        hex::encode(stated)
                    );
                    tracing::error!(model = %model, file = %path, reason, "a stated digest does not match the file; its computed digest is served from now on");
                    Err(reason)
                }
                Err(e) => Err(format!("cannot check the stated SHA-256 of {path:?} of model {model:?}: {e}")),
            };
            service.hashing.checks.lock().expect("never poisoned").remove(&identity);
            let _ = done.send(result);
        });
        let running =
            guard(async move { outcome.await.unwrap_or_else(|_| Err("the digest check ended early".into())) });
        checks.insert(identity, running.clone());
        running
    }
}

/// A published file whose digest was stated and not yet checked: a whole read checks it.
struct StatedCheck {
    inner: Arc<dyn RangeSource>,
    service: Arc<Service>,
    identity: FileIdentity,
    stated: [u8; 32],
    input: Input,
}

impl RangeSource for StatedCheck {
    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn open(&self, range: std::ops::Range<u64>) -> ByteStream {
        let whole = range == (0..self.inner.len());
        let body = self.inner.open(range);
        if !whole {
            return body;
        }
        guarded(body, self.service.check_stated(self.identity, self.stated, &self.input))
    }

    fn gap_worth_reading(&self) -> futures_util::future::BoxFuture<'_, Result<u64, ServiceError>> {
        self.inner.gap_worth_reading()
    }
}

/// The SHA-256 of the first `len` bytes of `file`, read with `pread` into one buffer of
/// `buffer` bytes (blocking). With `spare_page_cache`, the pages read are dropped from the
/// page cache behind the reads, so hashing a model larger than memory does not evict what is
/// being served.
fn hash_local_file(
    mut hasher: FileHasher,
    file: &std::fs::File,
    len: u64,
    buffer: usize,
    spare_page_cache: bool,
    hashed: &AtomicU64,
    (source_name, key): (&str, &str),
) -> Result<FileSha256s, crate::storage::StorageError> {
    let mut piece = vec![0u8; buffer.max(4096)];
    let counter = metrics::counter!(names::FILE_DIGEST_BYTES, "digest" => hasher.purpose());
    let pending = metrics::gauge!(names::DIGEST_PENDING_BYTES);
    let mut at = 0u64;
    while at < len {
        let n = (len - at).min(piece.len() as u64) as usize;
        crate::storage::local::pread_exact_into(file, at, &mut piece[..n], source_name, key)?;
        hasher.update(&piece[..n]);
        if spare_page_cache {
            let _ = rustix::fs::fadvise(file, at, std::num::NonZeroU64::new(n as u64), rustix::fs::Advice::DontNeed);
        }
        at += n as u64;
        hashed.fetch_add(n as u64, Ordering::Relaxed);
        counter.increment(n as u64);
        pending.decrement(n as f64);
    }
    Ok(hasher.finish())
}
