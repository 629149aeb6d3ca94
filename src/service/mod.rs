//! The domain between the catalog and the wire protocols: the sources, the catalog swap and
//! rescans, model lookup, a model's bytes and versions, what is learnt per model version
//! (digest verdicts, seek tables, view plans, the rendered manifest: [`learnt`]), the digest
//! policy, content checks, decoder admission, and the typed representations a request gets
//! (component bytes cut whole, by ranges or as a slice, with their length, digests and
//! version; a stored file; a view file; the manifest rendered once), and the files each model
//! version publishes to the protocols that list files ([`published`]) with their content
//! digests ([`digests`], computed ahead of need by [`hashing`]), and prefetches into the node's disk cache ([`prefetch`]). Handlers
//! of any protocol extract, ask, and set their own headers; nothing here knows HTTP.

mod bytes;
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
mod slices;
mod view;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

pub(crate) use self::bytes::{FileKind, StoredBytes, companion_etag, model_version, stored_file_etag, version_token};
pub(crate) use self::view::view_file_etag;
pub(crate) use components::{ComponentRequest, Cut};
pub(crate) use error::{ErrorKind, INTERNAL_MESSAGE, ServiceError, SetupError};
pub(crate) use hashing::DigestOf;
pub(crate) use image_layer::{LayerFraming, MODELS_DIR, TarLayer};
pub(crate) use learnt::Rendered;
pub(crate) use published::{Published, PublishedFile};
pub(crate) use representation::{ByteStream, Guard, RangeSource, guarded};
pub(crate) use slices::{ResolvedSlice, SliceRequest};

use crate::catalog::{Catalog, Model, ScanOptions, Source};
use crate::config::{Config, SourceSpec};
use crate::decode::DecodeCache;
use crate::format::{Component, Limits, Manifest, Object};
use crate::storage::cache::{CachedStorage, DiskCache};
use crate::storage::hub::{HubOptions, HubStorage};
use crate::storage::local::LocalStorage;
use crate::storage::s3::{S3Options, S3Storage};
use crate::storage::{Readahead, Storage};
use crate::telemetry::names;

/// Models with at least this many objects have their manifest rendered ahead of need: about
/// 100 ms of work and 5 MB of JSON.
const RENDER_AHEAD_OBJECTS: usize = 10_000;

/// How a model's manifest is rendered as a document: given to the service by the composition
/// root, so the service keeps and renders ahead what it does not know how to write.
pub(crate) type RenderManifest = fn(&Model, &Manifest, &crate::format::view::View) -> Rendered;

/// The domain every wire protocol serves from.
pub(crate) struct Service {
    config: Config,
    /// Shared decodes of components that are not stored verbatim.
    cache: DecodeCache,
    /// The configured sources, in order, with their health.
    sources: Vec<Arc<Source>>,
    /// How long raw reads from remote sources are split, and the memory they may hold.
    readahead: Readahead,
    /// How the manifest is rendered (by the HTTP contract, which serves it), once per version.
    render_manifest: RenderManifest,
    catalog: RwLock<Arc<Catalog>>,
    /// What has been learnt about each model version the catalog lists.
    learnt: learnt::LearntByVersion,
    /// The SHA-256 of each published file version, once known.
    digests: crate::digests::FileDigests,
    /// The background hashing of published files whose digests are not known.
    hashing: hashing::Hashing,
    /// Prefetches into the disk cache, by model version.
    prefetches: prefetch::Prefetches,
    /// Held for a whole rescan: two rescans at once could finish out of order and swap in the
    /// older listing last.
    rescanning: tokio::sync::Mutex<()>,
    ready: AtomicBool,
}

impl Service {
    /// A service with an empty catalog, not yet ready. S3 sources are set up (from the config
    /// and the `AWS_*` environment), read through the disk cache when one is configured, but
    /// not contacted.
    pub(crate) fn new(config: Config, render_manifest: RenderManifest) -> Result<Arc<Service>, SetupError> {
        // Installed before anything is recorded, so nothing is lost before the first scrape.
        crate::telemetry::metrics();
        let env: std::collections::BTreeMap<String, String> =
            std::env::vars().filter(|(k, _)| k.starts_with("AWS_")).collect();
        let s3 = S3Options::from_config(&config.s3_source, &env);
        let hub = HubOptions::from_config(&config.hub_source, |var| std::env::var(var).ok());
        let disk_cache = match &config.cache.dir {
            Some(dir) => Some(DiskCache::open(dir, config.cache.max_bytes, config.cache.block_bytes)?),
            None => None,
        };
        // A remote source is read through the disk cache when there is one.
        let cached = |remote: Arc<dyn Storage>| -> Arc<dyn Storage> {
            match &disk_cache {
                Some(cache) => Arc::new(CachedStorage::new(remote, Arc::clone(cache))),
                None => remote,
            }
        };
        let mut sources = Vec::new();
        for spec in &config.sources.paths {
            let name = spec.to_string();
            let storage: Arc<dyn Storage> = match spec {
                SourceSpec::S3 { bucket, prefix } => cached(Arc::new(S3Storage::new(&name, bucket, prefix, &s3)?)),
                SourceSpec::Hub { repo, revision } => {
                    cached(Arc::new(HubStorage::new(&name, repo, revision.as_deref(), &hub)?))
                }
                SourceSpec::Local(path) => Arc::new(LocalStorage::new(&name, path)),
            };
            sources.push(Source::new(storage));
        }
        let decoders = match config.decode.max_concurrent {
            None => std::thread::available_parallelism().map_or(1, usize::from),
            Some(n) => n,
        };
        let cache = DecodeCache::new(config.decode.cache_bytes, decoders);
        let readahead = Readahead {
            chunk: config.remote.range_chunk_bytes,
            concurrency: config.remote.range_concurrency,
            budget: Arc::new(tokio::sync::Semaphore::new(
                usize::try_from(config.remote.readahead_bytes / 1024)
                    .unwrap_or(usize::MAX)
                    .min(tokio::sync::Semaphore::MAX_PERMITS),
            )),
        };
        let digests = crate::digests::FileDigests::open(config.digests.store.as_deref())?;
        Ok(Arc::new(Service {
            render_manifest,
            digests,
            hashing: hashing::Hashing::new(&config.digests),
            prefetches: prefetch::Prefetches::default(),
            config,
            cache,
            sources,
            readahead,
            catalog: RwLock::new(Arc::new(Catalog::default())),
            learnt: learnt::LearntByVersion::default(),
            rescanning: tokio::sync::Mutex::new(()),
            ready: AtomicBool::new(false),
        }))
    }

    /// The current catalog snapshot.
    pub(crate) fn catalog(&self) -> Arc<Catalog> {
        Arc::clone(&self.catalog.read().expect("catalog lock is never poisoned"))
    }

    /// Rescans every source and swaps in the new catalog; the first completed rescan makes
    /// the service ready.
    pub(crate) async fn rescan(self: &Arc<Self>) {
        let _one_at_a_time = self.rescanning.lock().await;
        let state = Arc::clone(self);
        let previous = self.catalog();
        let options = ScanOptions {
            limits: Limits {
                max_manifest_bytes: self.config.limits.max_manifest_bytes,
                max_decoded_bytes: self.config.limits.max_decoded_bytes,
                ..Limits::default()
            },
            manifest_suffix_bytes: self.config.sources.manifest_suffix_bytes,
            concurrent_reads: self.config.sources.scan_concurrency,
            check_shard_digests: self.config.serving.verify != crate::config::VerifyPolicy::Never,
        };
        // In its own task, so a panic in a scan is contained like one in a handler.
        let built = tokio::spawn(async move { Catalog::build(&state.sources, &previous, &options).await }).await;
        match built {
            Ok(catalog) => {
                for (source, reason) in &catalog.unreadable_sources {
                    tracing::warn!(source, reason, "source cannot be scanned");
                }
                let total = catalog.models().count();
                let broken = catalog.models().filter(|m| m.state.is_err()).count();
                tracing::debug!(models = total, broken, "catalog rescanned");
                metrics::gauge!(names::MODELS, "status" => "ok").set((total - broken) as f64);
                metrics::gauge!(names::MODELS, "status" => "broken").set(broken as f64);
                // Decoded bytes of files that changed or went away are never served again.
                self.cache.retain(|key| catalog.get(&key.model).is_some_and(|m| m.version == key.version));
                self.learnt.retain_listed(&catalog);
                let catalog = Arc::new(catalog);
                *self.catalog.write().expect("catalog lock is never poisoned") = Arc::clone(&catalog);
                self.upkeep_prefetches(&catalog);
                self.ready.store(true, Ordering::Release);
                self.render_manifests_ahead(&catalog);
                self.schedule_digests(&catalog).await;
            }
            Err(e) => tracing::error!(error = %e, "rescan task failed"),
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
        let mut interval = tokio::time::interval(Duration::from_secs(self.config.sources.rescan_interval_secs));
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            self.rescan().await;
        }
    }

    pub(crate) fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// The configured sources, in order, with their health.
    pub(crate) fn sources(&self) -> &[Arc<Source>] {
        &self.sources
    }

    /// The decoders' permits.
    pub(crate) fn decoders(&self) -> &Arc<tokio::sync::Semaphore> {
        self.cache.decoders()
    }

    /// The model `id` and its manifest: refused when the catalog is not ready, the model is
    /// unknown or it is broken. Whoever asks has already checked that the caller may read it.
    pub(crate) fn model(&self, id: &str) -> Result<(Arc<Model>, Arc<Manifest>), ServiceError> {
        if !self.is_ready() {
            return Err(ServiceError::NotReady);
        }
        let model = self.catalog().get(id).cloned().ok_or_else(|| ServiceError::ModelNotFound(id.to_owned()))?;
        let manifest = match &model.state {
            Ok(manifest) => Arc::clone(manifest),
            Err(e) => return Err(ServiceError::BrokenModel { model: id.to_owned(), source: Box::new(e.clone()) }),
        };
        Ok((model, manifest))
    }

    /// `name` of `model`'s manifest.
    pub(crate) fn object<'m>(
        &self,
        model: &Model,
        manifest: &'m Manifest,
        name: &str,
    ) -> Result<&'m Object, ServiceError> {
        manifest
            .object(name)
            .ok_or_else(|| ServiceError::ObjectNotFound { model: model.id.clone(), object: name.to_owned() })
    }

    /// Component `role` of `object`.
    pub(crate) fn component<'o>(
        &self,
        model: &Model,
        object: &'o Object,
        role: &str,
    ) -> Result<&'o Component, ServiceError> {
        object.component(role).ok_or_else(|| ServiceError::ComponentNotFound {
            model: model.id.clone(),
            object: object.name.clone(),
            role: role.to_owned(),
            available: object.components.iter().map(|c| format!("{:?}", c.role)).collect::<Vec<_>>().join(", "),
        })
    }
}
