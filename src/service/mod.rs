//! The domain between the catalog and the wire protocols, as a facade (`Service`) over one
//! type per concern: the catalogs and their versions ([`catalogs`]), a model's bytes as each
//! request gets them (components, stored files and companions: [`components`], [`files`],
//! [`bytes`], decoded by [`decoded`] and [`seekable`]), slices ([`slices`]), many regions in one body ([`regions`]) and their deltas between
//! versions ([`deltas`], kept by [`delta_store`]), the safetensors
//! views ([`view`]), the files each model version publishes ([`published`]), their content
//! digests ([`hashing`], over `crate::digests`), signature admission ([`signatures`]) and
//! prefetches into the node's disk cache ([`prefetch`]). The facade keeps what they share:
//! what is learnt per model version ([`learnt`]) and a rescan's upkeep, and hands out none of
//! them: the protocols come in by one door ([`door`]), a `Listing` of one catalog snapshot
//! and the `OpenModel` a request opens from it (opening is admission), which they then ask.
//! Handlers of any protocol extract, ask, and set their own headers; nothing here knows HTTP.

mod bytes;
mod catalogs;
mod components;
mod decoded;
mod delta_store;
mod deltas;
mod deltas_ahead;
mod door;
mod error;
mod files;
#[cfg(test)]
mod fixture;
mod hashing;
mod image_layer;
mod learnt;
mod prefetch;
mod published;
mod regions;
mod representation;
mod seekable;
mod sha256;
mod signatures;
mod slices;
mod verdict;
mod view;

use std::sync::Arc;
use std::time::Duration;

pub(crate) use self::bytes::{StoredBytes, companion_etag, model_version, stored_file_etag, version_token};
pub(crate) use self::deltas::DeltasBody;
pub(crate) use self::door::{ListedFile, Listing, OpenModel};
pub(crate) use self::files::FoundFile;
pub(crate) use self::view::view_file_etag;
use catalogs::{component, object};
pub(crate) use components::{ComponentRequest, Cut};
pub(crate) use error::{ErrorKind, ServiceError, SetupError};
pub(crate) use hashing::{DigestOf, Hashing};
pub(crate) use image_layer::{LayerFraming, MODELS_DIR, TarLayer};
pub(crate) use learnt::Rendered;
pub(crate) use prefetch::Held;
pub(crate) use published::Publication;
pub(crate) use published::{Published, PublishedFile};
pub(crate) use regions::{RegionLimits, RegionRequest, RegionsBody};
pub(crate) use representation::{ByteStream, RangeSource};
pub(crate) use signatures::SignatureAdmission;
pub(crate) use signatures::SignatureStatus;
pub(crate) use slices::{ResolvedSlice, SliceRequest};

use crate::catalog::{Catalog, LineageRules, Model, ScanOptions, Source};
use crate::decode::DecodeCache;
use crate::format::{Limits, Manifest};
use crate::storage::Readahead;
use crate::storage::cache::DiskCache;

/// Models with at least this many objects have their manifest rendered ahead of need: about
/// 100 ms of work and 5 MB of JSON.
const RENDER_AHEAD_OBJECTS: usize = 10_000;

/// How a model's manifest is rendered as a document: given to the service by the composition
/// root, so the service keeps and renders ahead what it does not know how to write.
pub(crate) type RenderManifest = fn(&Model, &Manifest, &crate::format::view::View) -> Rendered;

/// The domain every wire protocol serves from: a facade over the catalogs, the
/// representations of a model's bytes, the published files, their digests, signature admission
/// and the prefetches, which keeps what they share (what is learnt per model version) and the
/// work that spans them (a rescan's upkeep, manifests rendered ahead).
pub(crate) struct Service {
    settings: Settings,
    catalogs: Arc<catalogs::Catalogs>,
    representations: Arc<components::Representations>,
    /// The files each model version publishes, with its safetensors view.
    publication: Arc<Publication>,
    /// How the manifest is rendered (by the HTTP contract, which serves it), once per version.
    render_manifest: RenderManifest,
    /// What has been learnt about each model version the catalog lists.
    learnt: Arc<learnt::LearntByVersion>,
    /// The digests of published files, and their hashing in the background.
    hashing: Arc<Hashing>,
    /// Models admitted under their sources' signing policies.
    signatures: Arc<SignatureAdmission>,
    /// Prefetches into the disk cache, by model version.
    prefetches: prefetch::Prefetches,
    /// The node's disk cache every remote source reads through, when there is one.
    disk_cache: Option<Arc<DiskCache>>,
    /// Set when shutdown begins: readiness answers 503 while requests in flight finish.
    draining: std::sync::atomic::AtomicBool,
    /// Deltas between model versions: their store, memory budget and computations under way.
    deltas: Arc<deltas::Deltas>,
    /// Deltas computed after a rescan lists a lineage's new version, of the regions asked.
    deltas_ahead: Arc<deltas_ahead::DeltasAhead>,
}

/// What a service is built from, by the composition root (`server`): each source (a remote
/// one's storage already behind the node's disk cache, the cache's handle set), that cache,
/// the digest store, and the
/// sections of the configuration its own components are built from. Nothing here reads the
/// environment or holds the whole configuration.
pub(crate) struct ServiceParts {
    pub built_sources: Vec<Arc<Source>>,
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
    pub refits: crate::config::Refits,
}

/// The settings the facade itself reads after it is built.
struct Settings {
    rescan_interval: Duration,
    /// How often the digests appended to the store are synced to disk.
    digest_sync_interval: Duration,
}

impl Service {
    /// A service with an empty catalog, not yet ready: nothing is contacted yet.
    pub(crate) fn new(parts: ServiceParts, render_manifest: RenderManifest) -> Result<Arc<Service>, SetupError> {
        // Installed before anything is recorded, so nothing is lost before the first scrape.
        crate::telemetry::metrics();
        let ServiceParts {
            built_sources,
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
            refits,
        } = parts;
        let decoders = match decode.max_concurrent {
            None => std::thread::available_parallelism().map_or(1, usize::from),
            Some(n) => n,
        };
        let decode_cache = DecodeCache::new(decode.cache_bytes, decoders);
        let readahead = readahead_of(&remote);
        let enforced = SignatureAdmission::any_enforced(&signing);
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
            lineages: LineageRules::new(&refits.lineages, refits.keep_versions, &refits.ready_marker),
        };
        let learnt = Arc::new(learnt::LearntByVersion::default());
        let representations = Arc::new(components::Representations::new(
            decode_cache,
            Duration::from_millis(decode.wait_ms),
            readahead,
            serving.verify,
            Arc::clone(&learnt),
        ));
        let views = view::Views::new(Arc::clone(&representations), Arc::clone(&learnt), serving.view_shard_bytes);
        let publication = Arc::new(Publication::new(views, Arc::clone(&representations)));
        let waits = hashing::DigestWaits {
            file: Duration::from_millis(digests.file_wait_ms),
            listing: Duration::from_secs(digests.listing_wait_secs),
            request_timeout: limits.request_timeout_secs.map(Duration::from_secs),
        };
        let settings = Settings {
            rescan_interval: Duration::from_secs(sources.rescan_interval_secs),
            digest_sync_interval: Duration::from_secs(digests.sync_interval_secs),
        };
        let hashing = Arc::new(Hashing::new(&digests, digest_store, Arc::clone(&publication), signing.clone(), waits));
        let catalogs = Arc::new(catalogs::Catalogs::new(built_sources, options));
        let admission = signatures::AdmissionParts {
            learnt: Arc::clone(&learnt),
            publication: Arc::clone(&publication),
            hashing: Arc::clone(&hashing),
            catalogs: Arc::clone(&catalogs),
        };
        let deltas = Arc::new(deltas::Deltas::new(&refits).map_err(SetupError::DeltaStore)?);
        let deltas_ahead = Arc::new(deltas_ahead::DeltasAhead::new(
            refits.deltas_ahead,
            RegionLimits { max_regions: limits.max_regions, max_bytes: limits.max_regions_bytes },
            Arc::clone(&deltas),
            Arc::clone(&representations),
            Arc::clone(&catalogs),
        ));
        Ok(Arc::new(Service {
            render_manifest,
            signatures: Arc::new(SignatureAdmission::new(signing, admission)?),
            hashing,
            prefetches: prefetch::Prefetches::new(cache),
            disk_cache,
            draining: std::sync::atomic::AtomicBool::new(false),
            deltas,
            deltas_ahead,
            catalogs,
            publication,
            representations,
            learnt,
            settings,
        }))
    }

    /// A source the last scan could not list and no listing kept by the disk cache stands in
    /// for, with why: its models are not served.
    pub(crate) fn unserved_source(&self) -> Option<(String, String)> {
        let catalog = self.catalogs.current();
        // A source read from the listing its disk cache kept serves what the cache holds.
        catalog.unreadable_sources.iter().find(|(name, _)| !catalog.from_kept_listings.contains(name)).cloned()
    }

    /// Rescans every source and swaps in the new catalog (the first makes the service ready),
    /// then keeps up what hangs on it: decoded bytes and what was learnt of versions no longer
    /// listed are dropped before the swap, and after it, prefetches, manifests rendered ahead
    /// and the digests to compute follow the new listing.
    pub(crate) async fn rescan(self: &Arc<Self>) {
        let mut stated = hashing::StatedByModel::new();
        let swapped = self
            .catalogs
            .rescan(async |catalog| {
                self.representations.retain_listed(catalog);
                self.learnt.retain_listed(catalog);
                stated = self.hashing.hand_down_statements(catalog).await;
            })
            .await;
        if let Some(catalog) = swapped {
            self.prefetches.upkeep(&catalog, self.sources());
            render_manifests_ahead(self, &catalog);
            self.hashing.schedule(&catalog, stated).await;
            self.signatures.verify_ahead(&catalog);
            self.deltas_ahead.upkeep(&catalog);
        }
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
        let mut interval = tokio::time::interval(self.settings.digest_sync_interval);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            let hashing = Arc::clone(&self.hashing);
            let _ = tokio::task::spawn_blocking(move || hashing.digests().sync()).await;
        }
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

    /// The decoders' permits (a test holds them all to make decoders busy).
    pub(crate) fn decoders(&self) -> &Arc<tokio::sync::Semaphore> {
        self.representations.decoders()
    }

    /// Syncs the digests appended to the store to disk now (blocking).
    pub(crate) fn sync_digests(&self) {
        self.hashing.digests().sync();
    }

    /// Regions of `model` (slices of dense tensors, whole components) in one body, each
    /// followed by its CRC32C: refused whole before any byte when `requests` asks what
    /// `limits` does not allow or names what cannot be cut (`regions`).
    async fn regions(
        &self,
        model: &Arc<Model>,
        manifest: &Arc<Manifest>,
        requests: Vec<RegionRequest>,
        limits: RegionLimits,
    ) -> Result<RegionsBody, ServiceError> {
        regions::regions(Arc::clone(&self.representations), model, manifest, requests, limits).await
    }

    /// The deltas from `base` to `target` of the regions `requests` asks of `target`, each
    /// followed by its CRC32C: refused whole before any byte as [`Service::regions`] refuses,
    /// and when a region's two versions need more than the delta memory budget.
    async fn deltas(
        &self,
        base: (Arc<Model>, Arc<Manifest>),
        target: (Arc<Model>, Arc<Manifest>),
        requests: Vec<RegionRequest>,
        limits: RegionLimits,
    ) -> Result<DeltasBody, ServiceError> {
        let representations = Arc::clone(&self.representations);
        let (base_id, target_id) = (base.0.id.clone(), target.0.id.clone());
        let asked = requests.clone();
        let body = self.deltas.deltas(representations, base, target, requests, limits).await?;
        // Planned and admitted: the regions a fleet will ask of the lineage's next version.
        self.deltas_ahead.remember(&base_id, &target_id, &asked);
        Ok(body)
    }

    /// The manifest of `model` as the service's renderer renders it (`http::manifest`), once
    /// per model version.
    fn rendered_manifest(&self, model: &Model, manifest: &Manifest) -> Rendered {
        let learnt = self.learnt.of(model);
        let rendered = learnt
            .manifest_json
            .get_or_init(|| (self.render_manifest)(model, manifest, &self.publication.view(model, manifest)));
        rendered.clone()
    }

    /// The manifest as rendered, if it has been already: a request for it then needs no trip
    /// to the blocking pool, which at thousands of requests a second costs more than the answer.
    fn rendered_manifest_if_ready(&self, model: &Model) -> Option<Rendered> {
        self.learnt.of(model).manifest_json.get().cloned()
    }
}

/// Renders the manifest JSON of every large model of `catalog` not rendered yet, on the
/// blocking pool in the background: a model of 100k tensors is tens of MB of JSON and seconds
/// of work, which no request should wait for. Small ones render in milliseconds when first
/// asked, and are not all held (a large rendering is kept in a temporary file).
fn render_manifests_ahead(service: &Arc<Service>, catalog: &Arc<Catalog>) {
    let (service, catalog) = (Arc::clone(service), Arc::clone(catalog));
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

/// How raw reads from remote sources are split, and the memory they may hold ahead.
fn readahead_of(remote: &crate::config::Remote) -> Readahead {
    Readahead {
        chunk: remote.range_chunk_bytes,
        concurrency: remote.range_concurrency,
        budget: Arc::new(tokio::sync::Semaphore::new(
            usize::try_from(remote.readahead_bytes / 1024)
                .unwrap_or(usize::MAX)
                .min(tokio::sync::Semaphore::MAX_PERMITS),
        )),
    }
}
