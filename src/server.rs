//! The composition root: builds the storage backends (from the config and the `AWS_*` and
//! `HF_*` environment), the node's disk cache, the digest store, the service over them and the
//! tokens, and every wire protocol's router over those, each given its own settings (HTTP with the Hub API at `/hf` and the registry at `/v2` on the
//! main listener, and the S3 endpoint when `s3_endpoint.listen` is set), binds their listeners,
//! runs the background tasks (rescans, the token file watch, metrics upkeep), and when the
//! shutdown future it is given completes (SIGTERM or SIGINT, for the binary) drains every
//! listener together. The protocols never name each other; only this module knows them all.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;

use crate::access::Tokens;
use crate::artifacts::{ArtifactStore, Bucket, SharedStore};
use crate::catalog::Source;
use crate::config::{Config, OnUnreadableSource, SourceSpec};
use crate::service::{Service, ServiceParts};
use crate::signing::Trust;
use crate::storage::Storage;
use crate::storage::cache::DiskCache;
use crate::storage::hub::{HubOptions, HubStorage};
use crate::storage::local::LocalStorage;
use crate::storage::s3::{S3Options, S3Storage};
use crate::transport::{ConnectionSettings, Tls, TlsSettings};

/// What every protocol serves from: the domain, the tokens every protocol checks, and TLS
/// for every listener when configured.
pub struct Server {
    config: Arc<Config>,
    service: Arc<Service>,
    tokens: Arc<Tokens>,
    tls: Option<Tls>,
    /// The artifact store, with `[artifacts] dir`.
    artifacts: Option<crate::http::artifacts::ArtifactAccess>,
}

impl Server {
    /// A server over a new service (empty catalog, not yet ready).
    pub fn new(config: Config) -> anyhow::Result<Arc<Server>> {
        // Installed before anything is recorded, so nothing is lost before the first scrape.
        crate::telemetry::metrics();
        crate::telemetry::register_routes(crate::api::routes::ALL);
        if !crate::hf::is_namespace(&config.serving.hub_namespace) {
            anyhow::bail!(
                "serving.hub_namespace {:?} is no Hub namespace: 1 to 96 of A-Z a-z 0-9 - _ ., starting and \
                 ending with a letter, digit or _, without -- or ..",
                config.serving.hub_namespace
            );
        }
        let keep_s3_secrets = config.s3_endpoint.listen.is_some();
        let tokens = Arc::new(Tokens::new(
            &config.auth.tokens,
            config.auth.token_file.as_deref(),
            keep_s3_secrets,
            &config.auth.client_identities,
        )?);
        // Read and checked now: a missing, mismatched or expired certificate stops the start.
        let tls = TlsSettings::from_config(&config).map(|settings| Tls::new(&settings)).transpose()?;
        let service = Service::new(service_parts(&config)?, crate::http::render_manifest)?;
        let artifacts = match &config.artifacts.dir {
            Some(dir) => {
                let settings = &config.artifacts;
                let bucket = match &settings.s3 {
                    Some(spec @ SourceSpec::S3 { bucket, prefix }) => {
                        let env: std::collections::BTreeMap<String, String> = std::env::vars().collect();
                        let options = S3Options::from_config(&config.s3_source, &env);
                        let client = crate::storage::s3::bucket_client(bucket, &options)
                            .map_err(|e| anyhow::anyhow!("artifacts.s3 {spec}: {e}"))?;
                        Some(Bucket { client: Arc::new(client), name: spec.to_string(), prefix: prefix.clone() })
                    }
                    _ => None,
                };
                let local = Arc::new(ArtifactStore::open(dir, settings.max_bytes)?);
                let store = Arc::new(SharedStore { local, bucket });
                let granted = !settings.writers.is_empty() || !settings.writer_identities.is_empty();
                let writers =
                    granted.then(|| Arc::new(Tokens::writers(&settings.writers, &settings.writer_identities)));
                let signers = settings
                    .require_signature
                    .then(|| Trust::load(&config.signing.public_keys, config.signing.ca_file.as_deref()))
                    .transpose()?
                    .map(Arc::new);
                Some(crate::http::artifacts::ArtifactAccess { store, writers, signers })
            }
            None => None,
        };
        Ok(Arc::new(Server { config: Arc::new(config), service, tokens, tls, artifacts }))
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Whether the first scan has completed (`/readyz` answers 200 from then on).
    pub fn is_ready(&self) -> bool {
        self.service.is_ready()
    }

    /// Rescans every source now, as the periodic rescan does.
    pub async fn rescan(&self) {
        self.service.rescan().await;
    }

    /// The decoders' permits: a test holds them all to make decoders busy.
    pub fn decoders(&self) -> &Arc<tokio::sync::Semaphore> {
        self.service.decoders()
    }

    /// The main listener's routes (a test may hand a request to them with `oneshot`): the Hub
    /// API below `/hf`, the OCI registry below `/v2`, the artifact store below `/artifacts`
    /// when there is one, every other path the HTTP contract's.
    pub fn http_app(&self) -> Router {
        let (service, tokens, config) = (&self.service, &self.tokens, &self.config);
        let hub = crate::hf::app(Arc::clone(service), Arc::clone(tokens), config);
        let registry = crate::oci::app(Arc::clone(service), Arc::clone(tokens), config);
        let mut router =
            Router::new().nest_service(crate::api::routes::HUB, hub).nest_service(crate::api::routes::OCI, registry);
        if let Some(access) = &self.artifacts {
            let store = crate::http::artifacts::app(access.clone(), Arc::clone(tokens), config);
            router = router.merge(store);
        }
        router.fallback_service(crate::http::app(Arc::clone(service), Arc::clone(tokens), Arc::clone(config)))
    }

    /// The S3-compatible endpoint's router.
    pub fn s3_app(&self) -> Router {
        crate::s3::app(Arc::clone(&self.service), Arc::clone(&self.tokens), &self.config)
    }
}

/// What the service is built from: every source's storage backend (S3 from the config and the
/// `AWS_*` environment, the Hub from the config, `HF_ENDPOINT` and `HF_TOKEN`), a remote one
/// read through the node's disk cache when there is one; the digest store; and the sections
/// of the configuration the service's components read. Nothing is contacted yet.
fn service_parts(config: &Config) -> anyhow::Result<ServiceParts> {
    let env: std::collections::BTreeMap<String, String> =
        std::env::vars().filter(|(k, _)| k.starts_with("AWS_")).collect();
    let s3 = S3Options::from_config(&config.s3_source, &env);
    let hub = HubOptions::from_config(&config.hub_source, |var| std::env::var(var).ok());
    let disk_cache = match &config.cache.dir {
        Some(dir) => Some(DiskCache::open(dir, config.cache.max_bytes, config.cache.block_bytes)?),
        None => None,
    };
    // A remote source read through the disk cache holds the cache's handle beside its storage.
    let cached = |remote: Arc<dyn Storage>| -> Arc<Source> {
        match &disk_cache {
            Some(cache) => Source::cached(remote, Arc::clone(cache)),
            None => Source::new(remote),
        }
    };
    let mut built_sources = Vec::new();
    for spec in &config.sources.paths {
        let name = spec.to_string();
        built_sources.push(match spec {
            SourceSpec::S3 { bucket, prefix } => cached(Arc::new(S3Storage::new(&name, bucket, prefix, &s3)?)),
            SourceSpec::Hub { repo, revision } => {
                cached(Arc::new(HubStorage::new(&name, repo, revision.as_deref(), &hub)?))
            }
            SourceSpec::Local(path) => Source::new(Arc::new(LocalStorage::new(&name, path))),
        });
    }
    Ok(ServiceParts {
        built_sources,
        disk_cache,
        digest_store: crate::digests::FileDigests::open(config.digests.store.as_deref())?,
        sources: config.sources.clone(),
        remote: config.remote.clone(),
        limits: config.limits.clone(),
        decode: config.decode.clone(),
        serving: config.serving.clone(),
        digests: config.digests.clone(),
        cache: config.cache.clone(),
        signing: config.signing.clone(),
        refits: config.refits.clone(),
    })
}

/// The sockets a server answers on: the main listener (the HTTP contract, the Hub API, the
/// registry) and the S3 endpoint's, when it is on.
pub struct Listeners {
    pub http: TcpListener,
    pub s3: Option<TcpListener>,
}

impl Listeners {
    /// Binds the addresses `config` names (`server.listen`, and `s3_endpoint.listen` when set),
    /// and logs each.
    pub async fn bind(config: &Config) -> anyhow::Result<Listeners> {
        let addr = config.server.listen;
        let http = TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
        let scheme = if config.tls.cert_file.is_some() { "https" } else { "http" };
        tracing::info!(address = %http.local_addr()?, scheme, sources = ?config.sources.paths, "listening");
        if scheme == "http" && !addr.ip().is_loopback() {
            tracing::warn!(
                address = %addr,
                "serving plain HTTP beyond loopback: tokens and weights cross the network in clear text; set \
                 tls.cert_file and tls.key_file"
            );
        }
        let s3 = match config.s3_endpoint.listen {
            Some(addr) => {
                let s3 = TcpListener::bind(addr)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot listen on {addr} for the S3 endpoint: {e}"))?;
                let (bucket, stored_bucket) = (&config.s3_endpoint.bucket, config.s3_endpoint.stored_bucket());
                tracing::info!(address = %s3.local_addr()?, bucket = %bucket, stored_bucket = %stored_bucket, "S3 endpoint listening");
                Some(s3)
            }
            None => None,
        };
        Ok(Listeners { http, s3 })
    }
}

/// Serves `server` on `listeners` until `shutdown` completes, then gives in-flight requests
/// the drain time (`server.shutdown_drain_secs`) and returns. The one way to run a server: the
/// binary passes [`shutdown_signals`], a test its own future.
pub async fn serve(
    server: Arc<Server>,
    listeners: Listeners,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let service = &server.service;
    service.rescan().await;
    if server.config().sources.on_unreadable == OnUnreadableSource::Fail {
        if let Some((source, reason)) = service.unserved_source() {
            anyhow::bail!(
                "source {source} cannot be listed: {reason} (set on_unreadable_source = \"degrade\" to start without it)"
            );
        }
    }
    let rescans = tokio::spawn(Arc::clone(service).rescan_forever());
    let digest_syncs = tokio::spawn(Arc::clone(service).sync_digests_forever());
    let scrub = service
        .disk_cache()
        .map(|cache| tokio::spawn(Arc::clone(cache).scrub_forever(server.config().cache.scrub_bytes_per_second)));
    let token_file = tokio::spawn(Arc::clone(&server.tokens).watch());
    let certificate = server.tls.clone().map(|tls| tokio::spawn(tls.watch()));
    let upkeep = tokio::spawn(async {
        // Folds recorded histogram samples into their buckets, so they do not pile up between scrapes.
        let mut interval = tokio::time::interval(Duration::from_secs(5));
        loop {
            interval.tick().await;
            crate::telemetry::metrics().run_upkeep();
        }
    });
    let drain = Duration::from_secs(server.config().server.shutdown_drain_secs);
    let limits = ConnectionSettings::from_config(server.config());
    let draining = Arc::clone(service);
    let shutdown = futures_util::FutureExt::shared(Box::pin(async move {
        shutdown.await;
        draining.begin_drain();
    }));
    let s3 = listeners.s3.map(|s3| {
        let (app, tls) = (server.s3_app(), server.tls.clone());
        tokio::spawn(crate::transport::serve(s3, app, limits.clone(), tls, shutdown.clone(), drain))
    });
    crate::transport::serve(listeners.http, server.http_app(), limits, server.tls.clone(), shutdown, drain).await;
    if let Some(s3) = s3 {
        let _ = s3.await;
    }
    rescans.abort();
    upkeep.abort();
    digest_syncs.abort();
    if let Some(scrub) = scrub {
        scrub.abort();
    }
    token_file.abort();
    if let Some(certificate) = certificate {
        certificate.abort();
    }
    // Nothing half-written is left: fills cut short by the drain leave no temporaries, and
    // every digest appended is on disk.
    let service = Arc::clone(service);
    let _ = tokio::task::spawn_blocking(move || {
        if let Some(cache) = service.disk_cache() {
            cache.discard_temporaries();
        }
        service.sync_digests();
    })
    .await;
    Ok(())
}

/// A future that completes at the first SIGTERM or SIGINT after this call. Call it first:
/// until a handler is installed a signal keeps its default action, and SIGTERM would kill the
/// process outright rather than drain it.
pub fn shutdown_signals() -> anyhow::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    Ok(ShutdownSignals::install()?.received())
}

/// SIGTERM and SIGINT, listened for from the moment they are installed.
struct ShutdownSignals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    fn install() -> anyhow::Result<ShutdownSignals> {
        use tokio::signal::unix::{SignalKind, signal};
        let listen =
            |kind: SignalKind, name: &str| signal(kind).map_err(|e| anyhow::anyhow!("cannot listen for {name}: {e}"));
        Ok(ShutdownSignals {
            terminate: listen(SignalKind::terminate(), "SIGTERM")?,
            interrupt: listen(SignalKind::interrupt(), "SIGINT")?,
        })
    }

    async fn received(mut self) {
        tokio::select! {
            _ = self.terminate.recv() => {}
            _ = self.interrupt.recv() => {}
        }
    }
}
