//! The domain between the catalog and the wire protocols, as a facade (`Service`) over one
//! type per concern: the catalogs and their versions ([`catalogs`]), a model's bytes as each
//! request gets them (stored files, companions and components: [`components`], [`bytes`]),
//! slices ([`slices`]), the safetensors views ([`view`]), prefetches into the node's disk
//! cache ([`prefetch`]), and the files each model version publishes ([`published`]) with their
//! content digests (`crate::digests`, computed ahead of need by [`hashing`]). The facade keeps
//! what they share: what is learnt per model version ([`learnt`]) and a rescan's upkeep.
//! Handlers of any protocol extract, ask, and set their own headers; nothing here knows HTTP.

mod bytes;
mod catalogs;
mod components;
mod error;
mod hashing;
mod image_layer;
mod learnt;
mod prefetch;
mod published;
mod representation;
mod seekable;
mod sha256;
mod signatures;
mod slices;
mod view;

use std::sync::Arc;
use std::time::Duration;

pub(crate) use self::bytes::{FileKind, StoredBytes, companion_etag, model_version, stored_file_etag, version_token};
pub(crate) use self::view::view_file_etag;
pub(crate) use catalogs::{component, object};
pub(crate) use components::{ComponentRequest, Cut};
pub(crate) use error::{ErrorKind, INTERNAL_MESSAGE, ServiceError, SetupError};
pub(crate) use hashing::DigestOf;
pub(crate) use image_layer::{LayerFraming, MODELS_DIR, TarLayer};
pub(crate) use learnt::Rendered;
pub(crate) use published::{Published, PublishedFile};
pub(crate) use representation::{ByteStream, Guard, RangeSource, guarded};
pub(crate) use signatures::SignatureStatus;
pub(crate) use slices::{ResolvedSlice, SliceRequest};

use crate::catalog::{Catalog, Model, ScanOptions, Source};
use crate::decode::DecodeCache;
use crate::format::{Limits, Manifest};
use crate::storage::cache::DiskCache;
use crate::storage::{Readahead, Storage};

/// Models with at least this many objects have their manifest rendered ahead of need: about
/// 100 ms of work and 5 MB of JSON.
const RENDER_AHEAD_OBJECTS: usize = 10_000;

/// How a model's manifest is rendered as a document: given to the service by the composition
/// root, so the service keeps and renders ahead what it does not know how to write.
pub(crate) type RenderManifest = fn(&Model, &Manifest, &crate::format::view::View) -> Rendered;

/// The domain every wire protocol serves from: a facade over the catalogs, the
/// representations of a model's bytes, the safetensors views, the digests and the prefetches,
/// which keeps what they share (what is learnt per model version) and the work that spans them
/// (a rescan's upkeep, manifests rendered ahead).
pub(crate) struct Service {
    settings: Settings,
    catalogs: Arc<catalogs::Catalogs>,
    representations: Arc<components::Representations>,
    views: view::Views,
    /// How the manifest is rendered (by the HTTP contract, which serves it), once per version.
    render_manifest: RenderManifest,
    /// What has been learnt about each model version the catalog lists.
    learnt: Arc<learnt::LearntByVersion>,
    /// The SHA-256 of each published file version, once known.
    digests: crate::digests::FileDigests,
    /// The background hashing of published files whose digests are not known.
    hashing: hashing::Hashing,
    /// Prefetches into the disk cache, by model version.
    prefetches: prefetch::Prefetches,
    /// The node's disk cache every remote source reads through, when there is one.
    disk_cache: Option<Arc<DiskCache>>,
    /// The trust model signatures are checked against, when any source reads them.
    signatures: Option<signatures::Signatures>,
    /// Set when shutdown begins: readiness answers 503 while requests in flight finish.
    draining: std::sync::atomic::AtomicBool,
}

/// What a service is built from, by the composition root (`server`): each source's storage
/// (a remote one already behind the node's disk cache), that cache, the digest store, and the
/// sections of the configuration its own components are built from. Nothing here reads the
/// environment or holds the whole configuration.
pub(crate) struct ServiceParts {
    pub storages: Vec<Arc<dyn Storage>>,
    pub disk_cache: Option<Arc<DiskCache>>,
    pub digest_store: crate::digests::FileDigests,
    pub sources: crate::config::Sources,
    pub remote: crate::config::Remote,
    pub limits: crate::config::Limits,
    pub decode: crate::config::Decode,
    pub serving: crate::config::Serving,
    pub digests: crate::config::Digests,
    pub cache: crate::config::Cache,
    pub signing: crate::config::Signing,
}

/// The settings the facade itself reads after it is built.
struct Settings {
    rescan_interval: Duration,
    request_timeout_secs: Option<u64>,
    digests: crate::config::Digests,
    /// Models fetched whole into the disk cache, and those kept there.
    prefetch: Vec<String>,
    pinned: Vec<String>,
    signing: crate::config::Signing,
}

impl Service {
    /// A service with an empty catalog, not yet ready: nothing is contacted yet.
    pub(crate) fn new(parts: ServiceParts, render_manifest: RenderManifest) -> Result<Arc<Service>, SetupError> {
        // Installed before anything is recorded, so nothing is lost before the first scrape.
        crate::telemetry::metrics();
        let ServiceParts {
            storages,
            disk_cache,
            digest_store,
            sources,
            remote,
            limits,
            decode,
            serving,
            digests,
            cache,
            signing,
        } = parts;
        let decoders = match decode.max_concurrent {
            None => std::thread::available_parallelism().map_or(1, usize::from),
            Some(n) => n,
        };
        let decode_cache = DecodeCache::new(decode.cache_bytes, decoders);
        let readahead = Readahead {
            chunk: remote.range_chunk_bytes,
            concurrency: remote.range_concurrency,
            budget: Arc::new(tokio::sync::Semaphore::new(
                usize::try_from(remote.readahead_bytes / 1024)
                    .unwrap_or(usize::MAX)
                    .min(tokio::sync::Semaphore::MAX_PERMITS),
            )),
        };
        let enforced = signatures::Signatures::any_enforced(&signing);
        let options = ScanOptions {
            limits: Limits {
                max_manifest_bytes: limits.max_manifest_bytes,
                max_decoded_bytes: limits.max_decoded_bytes,
                ..Limits::default()
            },
            manifest_suffix_bytes: sources.manifest_suffix_bytes,
            concurrent_reads: sources.scan_concurrency,
            check_shard_digests: serving.verify != crate::config::VerifyPolicy::Never,
            signature_file: enforced.then(|| signing.signature_file.clone()),
        };
        let signatures = if enforced { Some(signatures::Signatures::new(&signing)?) } else { None };
        let learnt = Arc::new(learnt::LearntByVersion::default());
        let representations = Arc::new(components::Representations::new(
            decode_cache,
            Duration::from_millis(decode.wait_ms),
            readahead,
            serving.verify,
            Arc::clone(&learnt),
        ));
        let rescan_interval = Duration::from_secs(sources.rescan_interval_secs);
        let sources = storages.into_iter().map(Source::new).collect();
        Ok(Arc::new(Service {
            render_manifest,
            digests: digest_store,
            hashing: hashing::Hashing::new(&digests),
            prefetches: prefetch::Prefetches::default(),
            disk_cache,
            signatures,
            draining: std::sync::atomic::AtomicBool::new(false),
            catalogs: Arc::new(catalogs::Catalogs::new(sources, options)),
            views: view::Views::new(Arc::clone(&representations), Arc::clone(&learnt), serving.view_shard_bytes),
            representations,
            learnt,
            settings: Settings {
                rescan_interval,
                request_timeout_secs: limits.request_timeout_secs,
                digests,
                prefetch: cache.prefetch,
                pinned: cache.pinned,
                signing,
            },
        }))
    }

    /// The current catalog snapshot.
    pub(crate) fn catalog(&self) -> Arc<Catalog> {
        self.catalogs.current()
    }

    /// Rescans every source and swaps in the new catalog (the first makes the service ready),
    /// then keeps up what hangs on it: decoded bytes and what was learnt of versions no longer
    /// listed are dropped before the swap, and after it, prefetches, manifests rendered ahead
    /// and the digests to compute follow the new listing.
    pub(crate) async fn rescan(self: &Arc<Self>) {
        let swapped = self
            .catalogs
            .rescan(async |catalog| {
                self.representations.retain_listed(catalog);
                self.learnt.retain_listed(catalog);
                self.hand_down_statements(catalog).await;
            })
            .await;
        if let Some(catalog) = swapped {
            self.upkeep_prefetches(&catalog);
            self.render_manifests_ahead(&catalog);
            self.schedule_digests(&catalog).await;
            self.verify_signatures_ahead(&catalog);
        }
    }

    /// Renders the manifest JSON of every large model of `catalog` not rendered yet, on the
    /// blocking pool in the background: a model of 100k tensors is tens of MB of JSON and
    /// seconds of work, which no request should wait for. Small ones render in milliseconds
    /// when first asked, and are not all held (a large rendering is kept in a temporary file).
    fn render_manifests_ahead(self: &Arc<Self>, catalog: &Arc<Catalog>) {
        let (service, catalog) = (Arc::clone(self), Arc::clone(catalog));
        tokio::task::spawn_blocking(move || {
            for model in catalog.models() {
                if let Ok(manifest) = &model.state {
                    if manifest.objects.len() >= RENDER_AHEAD_OBJECTS {
                        service.rendered_manifest(model, manifest);
                    }
                }
            }
        });
    }

    /// Rescans on the configured interval, forever.
    pub(crate) async fn rescan_forever(self: Arc<Self>) {
        let mut interval = tokio::time::interval(self.settings.rescan_interval);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            self.rescan().await;
        }
    }

    /// Syncs the digests appended to the store to disk every `digests.sync_interval_secs`.
    pub(crate) async fn sync_digests_forever(self: Arc<Self>) {
        let mut interval = tokio::time::interval(Duration::from_secs(self.settings.digests.sync_interval_secs));
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            let service = Arc::clone(&self);
            let _ = tokio::task::spawn_blocking(move || service.sync_digests()).await;
        }
    }

    /// Syncs the digests appended since the last sync (blocking): on a schedule, and once
    /// more as the server stops.
    pub(crate) fn sync_digests(&self) {
        self.digests.sync();
    }

    /// The node's disk cache, when there is one (the server runs its scrub).
    pub(crate) fn disk_cache(&self) -> Option<&Arc<DiskCache>> {
        self.disk_cache.as_ref()
    }

    pub(crate) fn is_ready(&self) -> bool {
        self.catalogs.is_ready()
    }

    /// Marks the service as shutting down: `/readyz` answers 503 `draining` from now on.
    pub(crate) fn begin_drain(&self) {
        self.draining.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The configured sources, in order, with their health.
    pub(crate) fn sources(&self) -> &[Arc<Source>] {
        self.catalogs.sources()
    }

    /// The representations of every model's bytes.
    pub(crate) fn representations(&self) -> &components::Representations {
        &self.representations
    }

    /// The decoders' permits.
    pub(crate) fn decoders(&self) -> &Arc<tokio::sync::Semaphore> {
        self.representations.decoders()
    }

    /// The model `id` and its manifest: refused when the catalog is not ready, the model is
    /// unknown or it is broken. Whoever asks has already checked that the caller may read it.
    pub(crate) fn model(&self, id: &str) -> Result<(Arc<Model>, Arc<Manifest>), ServiceError> {
        self.catalogs.model(id)
    }

    /// The model's safetensors view, planned on first use and kept for its version.
    pub(crate) fn view(&self, model: &Model, manifest: &Manifest) -> Arc<crate::format::view::View> {
        self.views.view(model, manifest)
    }

    /// The view file `name` of the model (`model.safetensors`, or the index and shards).
    pub(crate) async fn view_file(
        &self,
        model: &Arc<Model>,
        manifest: &Arc<Manifest>,
        name: &str,
    ) -> Result<StoredBytes, ServiceError> {
        self.views.view_file(model, manifest, name).await
    }

    /// The model's file `name`: one of its stored files, or else a file beside it by its path
    /// below the model's directory (`config.json`, `tokenizer/vocab.txt`).
    pub(crate) async fn file_named(
        &self,
        model: &Arc<Model>,
        manifest: &Manifest,
        name: &str,
    ) -> Result<(StoredBytes, FileKind), ServiceError> {
        let catalog = self.catalog();
        self.representations.file_named(model, manifest, catalog.companions(&model.id), name).await
    }

    /// The manifest of `model` as the service's renderer renders it (`http::manifest`), once
    /// per model version.
    pub(crate) fn rendered_manifest(&self, model: &Model, manifest: &Manifest) -> Rendered {
        let learnt = self.learnt.of(model);
        let rendered =
            learnt.manifest_json.get_or_init(|| (self.render_manifest)(model, manifest, &self.view(model, manifest)));
        rendered.clone()
    }

    /// The manifest as rendered, if it has been already: a request for it then needs no trip
    /// to the blocking pool, which at thousands of requests a second costs more than the answer.
    pub(crate) fn rendered_manifest_if_ready(&self, model: &Model) -> Option<Rendered> {
        self.learnt.of(model).manifest_json.get().cloned()
    }
}
