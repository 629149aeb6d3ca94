//! Component bytes: which representation a request gets (the decoded bytes, from the shared
//! decode or a private one, or the stored zstd frame passed through), the digest policy and
//! its checks, the content checks made once per object, and admission to the decoders.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::TryStreamExt as _;
use futures_util::future::{BoxFuture, Shared};
use futures_util::{FutureExt as _, StreamExt as _};

use super::ServiceError;
use super::bytes::{ModelBytes, etag, model_bytes, storage_failed};
use super::decoded::{CacheOutcome, DecodedSource, Decoding};
use super::learnt::LearntByVersion;
use super::learnt::{ComponentFacts, Learnt};
use super::representation::{Guard, RangeSource, guard};
use super::seekable::SeekableSource;
use super::slices::ResolvedSlice;
use crate::catalog::{Catalog, Model};
use crate::config::VerifyPolicy;
use crate::decode::{ComponentKey, DecodeCache, Stored};
use crate::format::{Component, Digest, FormatError, Manifest, Object};
use crate::storage::Readahead;
use crate::telemetry::names;

/// Runs the format's content checks (bool bytes are 0 or 1, sparse indices consistent and in
/// range) before any component of the object is served as valid; once per object and file
/// version, off the async runtime.
async fn check_content_once(
    model: &Arc<Model>,
    learnt: &Learnt,
    manifest: &Manifest,
    object: &Object,
) -> Result<(), ServiceError> {
    if !crate::format::validate::has_content_rules(object) {
        return Ok(());
    }
    let cached = learnt.content_checks.lock().expect("never poisoned").get(&object.name).cloned();
    let result = match cached {
        Some(result) => result,
        None => {
            // Fetched whole (the checks need every byte, within the manifest's limits).
            let mut stored = Vec::with_capacity(object.components.len());
            for component in &object.components {
                let bytes = model_bytes(model, manifest, component.file).await?;
                stored.push(bytes.fetch(&model.source, &model.id, component.stored_range()).await?);
            }
            let object_owned = object.clone();
            let result = tokio::task::spawn_blocking(move || {
                crate::format::validate::check_content(&object_owned, |c| {
                    let index = object_owned
                        .components
                        .iter()
                        .position(|x| x.role == c.role)
                        .expect("a component of the object");
                    crate::format::decode::decode_component(&object_owned.name, c, &stored[index])
                })
            })
            .await
            .map_err(|e| ServiceError::Internal(e.to_string()))?;
            learnt.content_checks.lock().expect("never poisoned").insert(object.name.clone(), result.clone());
            result
        }
    };
    result.map_err(|source| ServiceError::invalid(&model.id, source))
}

/// How a component's stored bytes stand against their declared digest for this request.
enum DigestCheck {
    /// No digest, `verify = never`, or a HEAD that sends no bytes.
    Skipped,
    Known(Result<(), FormatError>),
    /// Running: shared by every request that waits on it.
    Running(Shared<BoxFuture<'static, Result<(), CheckError>>>),
}

/// Why a digest check ended without a verdict, or with a negative one.
#[derive(Debug, Clone)]
enum CheckError {
    Mismatch(FormatError),
    Storage(crate::storage::StorageError),
    /// The decoded bytes a digest covers could not be produced.
    Decode(ServiceError),
    Crashed(String),
}

impl CheckError {
    fn into_service(self, model: &Model) -> ServiceError {
        match self {
            CheckError::Mismatch(source) => ServiceError::invalid(&model.id, source),
            CheckError::Storage(e) => storage_failed(&model.source, &model.id, e),
            CheckError::Decode(e) => e,
            CheckError::Crashed(reason) => ServiceError::Internal(reason),
        }
    }
}

/// The bytes a component's digest covers: its stored bytes, or (a v2 digest of an encoded
/// part) its decoded bytes.
enum Covered {
    Stored(Stored),
    Decoded(Arc<dyn RangeSource>),
}

/// Hashes the bytes a component's digest covers off the async runtime and compares. Bytes
/// not in memory stream through the hasher as they arrive, never held whole.
async fn hash_covered(
    object: String,
    component: Component,
    covered: Covered,
) -> Result<Result<(), FormatError>, CheckError> {
    let Some(expected) = &component.digest else { return Ok(Ok(())) };
    let hasher = crate::format::decode::Hasher::for_digest(expected);
    let mut reading = match covered {
        Covered::Stored(Stored::Whole(bytes)) => futures_util::stream::iter([Ok(bytes)]).boxed(),
        Covered::Stored(stored) => stored.stream(0, "verify").map_err(CheckError::Storage).boxed(),
        Covered::Decoded(source) => source.open(0..source.len()).map_err(CheckError::Decode).boxed(),
    };
    let (pieces, mut receiver) = tokio::sync::mpsc::channel::<Bytes>(4);
    let hashing = tokio::task::spawn_blocking(move || {
        let mut hasher = hasher;
        while let Some(piece) = receiver.blocking_recv() {
            hasher.update(&piece);
        }
        hasher.finish()
    });
    while let Some(piece) = reading.next().await {
        if pieces.send(piece?).await.is_err() {
            break;
        }
    }
    drop(pieces);
    let hashed = hashing.await.map_err(|e| CheckError::Crashed(e.to_string()))?;
    let verdict = crate::format::decode::check_digest(&object, &component, hashed);
    {
        let outcome = if verdict.is_ok() { "ok" } else { "mismatch" };
        metrics::counter!(names::DIGEST_CHECKS, "outcome" => outcome).increment(1);
        if let Err(e) = &verdict {
            metrics::counter!(names::DIGEST_FAILURES).increment(1);
            tracing::warn!(error = %e, "stored bytes do not match their digest");
        }
    }
    Ok(verdict)
}

/// Starts (or finds) the digest check this request needs under the configured policy; `None`
/// for a request that sends no bytes.
fn digest_check(
    policy: VerifyPolicy,
    facts: &Arc<ComponentFacts>,
    object: &Object,
    component: &Component,
    covered: Covered,
    wait: Option<DigestWait>,
) -> DigestCheck {
    if !component.digest.as_ref().is_some_and(|d| d.is_verifiable()) || policy == VerifyPolicy::Never {
        return DigestCheck::Skipped;
    }
    if let (VerifyPolicy::FirstRead, Some(verdict)) = (policy, facts.verdict.get()) {
        return DigestCheck::Known(verdict.clone());
    }
    // A range of a remote component, or of a part whose digest covers its decoded bytes, is
    // never held up by (nor pays for) reading or decoding the whole part: the check is made
    // by the first full read.
    let costly = matches!(covered, Covered::Stored(Stored::Remote { .. }) | Covered::Decoded(_));
    match wait {
        None => return DigestCheck::Skipped,
        Some(DigestWait::BeforeAnswering) if costly => return DigestCheck::Skipped,
        Some(_) => {}
    }
    let (facts, name, component) = (Arc::clone(facts), object.name.clone(), component.clone());
    let check = async move {
        let verdict = match policy {
            VerifyPolicy::FirstRead => {
                facts.verdict.get_or_try_init(|| hash_covered(name, component, covered)).await?.clone()
            }
            _ => hash_covered(name, component, covered).await?,
        };
        verdict.map_err(CheckError::Mismatch)
    }
    .boxed()
    .shared();
    // Driven to the end by its own task, whether or not the body waits on it.
    tokio::spawn(check.clone());
    DigestCheck::Running(check)
}

/// How much of a component a request takes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Cut<'a> {
    /// All of its bytes: the stored zstd frame may pass through to a client that accepts zstd.
    Whole,
    /// Byte ranges of its decoded bytes (a `Range` header), settled over the whole by the caller.
    Ranges,
    /// A slice of a dense tensor ([`ResolvedSlice::resolve`]): its own representation, with its
    /// own ETag and no digest of its own.
    Slice(&'a ResolvedSlice),
}

impl Cut<'_> {
    /// How a body of this cut waits for a digest check that is still running.
    fn digest_wait(self) -> DigestWait {
        match self {
            Cut::Whole => DigestWait::HoldingLastPiece,
            Cut::Ranges | Cut::Slice(_) => DigestWait::BeforeAnswering,
        }
    }
}

/// How a body waits for a digest check that is still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DigestWait {
    /// A whole body streams while the check runs; its last piece waits for the verdict, so a
    /// mismatch ends it short of its length.
    HoldingLastPiece,
    /// Part of the bytes, small next to the check: the verdict comes before the answer, and a
    /// mismatch is a clean error. A check that needs the whole remote or decoded part is left
    /// to the first full read instead.
    BeforeAnswering,
}

/// What a request for a component's bytes asks of it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ComponentRequest<'a> {
    pub cut: Cut<'a>,
    /// HEAD: no bytes are sent, so no digest check is started.
    pub head: bool,
    /// The client accepts the `zstd` content coding.
    pub accepts_zstd: bool,
}

/// How the verify policy decided for a request, for its log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DigestOutcome {
    /// The bytes were found to match their digest (now or before).
    Verified,
    Mismatch,
    /// The body streams while the check runs, its last piece held back for the verdict.
    Streamed,
}

impl DigestOutcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DigestOutcome::Verified => "verified",
            DigestOutcome::Mismatch => "mismatch",
            DigestOutcome::Streamed => "streamed",
        }
    }

    fn of<T, E>(verdict: &Result<T, E>) -> DigestOutcome {
        if verdict.is_ok() { DigestOutcome::Verified } else { DigestOutcome::Mismatch }
    }
}

/// A component's bytes (or a slice of them) as a request gets them.
pub(crate) struct ComponentBytes {
    pub source: Arc<dyn RangeSource>,
    pub etag: String,
    /// SHA-256 of exactly the bytes served, when known (`Repr-Digest`).
    pub sha256: Option<[u8; 32]>,
    /// The stored zstd frame is sent as it is (`Content-Encoding: zstd`).
    pub zstd_passthrough: bool,
    /// The answer depends on `Accept-Encoding` (`Vary`).
    pub varies_with_encoding: bool,
    /// Holds the body's last piece back until a running digest check passes.
    pub guard: Option<Guard>,
    /// How the verify policy decided for this request, when a digest was considered.
    pub digest: Option<DigestOutcome>,
    /// Whether the decoded bytes come from the cache, when known before the body opens.
    pub cache: Option<CacheOutcome>,
}

/// A model's bytes as each request gets them: its stored files and the files beside it
/// ([`super::bytes`]), and its components, whole, by ranges or as a slice, decoded or passed
/// through, checked as the verify policy says.
pub(crate) struct Representations {
    decoding: Arc<Decoding>,
    /// How long raw reads from remote sources are split, and the memory they may hold.
    pub(super) readahead: Readahead,
    verify: VerifyPolicy,
    pub(super) learnt: Arc<LearntByVersion>,
}

impl Representations {
    pub(super) fn new(
        cache: DecodeCache,
        decode_wait: std::time::Duration,
        readahead: Readahead,
        verify: VerifyPolicy,
        learnt: Arc<LearntByVersion>,
    ) -> Representations {
        Representations { decoding: Arc::new(Decoding { cache, wait: decode_wait }), readahead, verify, learnt }
    }

    /// The decoders' permits.
    pub(crate) fn decoders(&self) -> &Arc<tokio::sync::Semaphore> {
        self.decoding.cache.decoders()
    }

    /// Forgets the decoded bytes of every model version `catalog` no longer lists: a file that
    /// changed or went away is never served from them again.
    pub(super) fn retain_listed(&self, catalog: &Catalog) {
        self.decoding.cache.retain(|key| catalog.get(&key.model).is_some_and(|m| m.version == key.version));
    }

    /// Refuses at once what a request for `component` would be refused for before its first
    /// byte on its own (a content check that fails, an unregistered encoding), so a request
    /// for many regions is refused whole rather than cut short at the region that fails.
    pub(crate) async fn admit(
        &self,
        model: &Arc<Model>,
        manifest: &Manifest,
        object: &Object,
        component: &Component,
    ) -> Result<(), ServiceError> {
        check_content_once(model, &self.learnt.of(model), manifest, object).await?;
        refuse_unregistered(model, object, component)
    }

    /// `object`'s component `component` of `model`, cut as `request` asks: its decoded
    /// little-endian bytes (or its stored zstd frame, whole, for a client that accepts zstd), or
    /// a slice of them, checked against its digest as the verify policy says. In three steps:
    /// the decoded source ([`Representations::decoded_source`]), the digest guard ([`digest_guard`]),
    /// and the cut ([`Representations::cut`]).
    pub(crate) async fn component_bytes(
        &self,
        model: &Arc<Model>,
        manifest: &Manifest,
        object: &Object,
        component: &Component,
        request: ComponentRequest<'_>,
    ) -> Result<ComponentBytes, ServiceError> {
        let learnt = self.learnt.of(model);
        check_content_once(model, &learnt, manifest, object).await?;
        refuse_unregistered(model, object, component)?;
        let part = Part {
            model,
            object,
            component,
            bytes: model_bytes(model, manifest, component.file).await?,
            facts: learnt.facts(&object.name, &component.role),
        };
        let stored = part.bytes.stored(component.stored_range());
        let decoded = self.decoded_source(&part, &stored);
        let covered = match (component.digest_scope, &decoded) {
            (crate::format::DigestScope::Decoded, Some(decoded)) => Covered::Decoded(Arc::clone(decoded)),
            _ => Covered::Stored(stored),
        };
        let checked = digest_guard(self.verify, &part, covered, &request).await?;
        Ok(self.cut(&part, decoded, request, checked))
    }

    /// The component's decoded bytes as a source of ranges, when it is not stored verbatim:
    /// a seekable frame decoded by the blocks a range needs, any other encoding by the shared,
    /// cached decode. Nothing is decoded until a range is opened.
    fn decoded_source(&self, part: &Part<'_>, stored: &Stored) -> Option<Arc<dyn RangeSource>> {
        let (model, component) = (part.model, part.component);
        let key = ComponentKey {
            model: model.id.clone(),
            version: model.version.clone(),
            object: part.object.name.clone(),
            role: component.role.clone(),
            frame: None,
        };
        match component.encoding {
            _ if component.is_verbatim() => None,
            crate::format::Encoding::ZstdSeekable => Some(Arc::new(SeekableSource {
                decoding: Arc::clone(&self.decoding),
                source: Arc::clone(&model.source),
                key,
                component: component.clone(),
                stored: stored.clone(),
                facts: Arc::clone(&part.facts),
            })),
            _ => Some(Arc::new(DecodedSource {
                decoding: Arc::clone(&self.decoding),
                source: Arc::clone(&model.source),
                key,
                component: component.clone(),
                stored: stored.clone(),
                sha256: Arc::clone(&part.facts.decoded_sha256),
            })),
        }
    }

    /// The bytes the request asked for: a slice of the decoded (or verbatim) bytes; the stored
    /// zstd frame as it is, for a whole read by a client that accepts zstd; or the whole
    /// decoded bytes or a range of them, each with its ETag and, where known, its SHA-256.
    fn cut(
        &self,
        part: &Part<'_>,
        decoded: Option<Arc<dyn RangeSource>>,
        request: ComponentRequest<'_>,
        checked: Checked,
    ) -> ComponentBytes {
        let (model, component) = (part.model, part.component);
        let Checked { guard, digest } = checked;
        let range = component.stored_range();
        let name = format!("{}\0{}", part.object.name, component.role);
        let declared_sha256 = match &component.digest {
            Some(Digest::Sha256(sha256)) => Some(*sha256),
            _ => None,
        };
        let stored_bytes = || part.bytes.served(&self.readahead, &model.id, range.clone());
        if let Cut::Slice(slice) = request.cut {
            let whole = decoded.unwrap_or_else(stored_bytes);
            return ComponentBytes {
                source: slice.source(model, component, &part.bytes, whole),
                etag: etag(model, &format!("{name}\0slice\0{}", slice.slice)),
                sha256: None,
                zstd_passthrough: false,
                varies_with_encoding: false,
                guard,
                digest,
                cache: None,
            };
        }
        let varies_with_encoding = component.is_zstd_of_served_bytes();
        let zstd_passthrough = varies_with_encoding && matches!(request.cut, Cut::Whole) && request.accepts_zstd;
        let declared_for = |scope| declared_sha256.filter(|_| component.digest_scope == scope);
        let (source, etag, sha256, cache) = match decoded {
            // The stored frame as it is: its digest, when SHA-256, is the representation's.
            Some(_) if zstd_passthrough => (
                stored_bytes(),
                etag(model, &format!("{name}\0zstd")),
                declared_for(crate::format::DigestScope::Stored),
                Some(CacheOutcome::Passthrough),
            ),
            // SHA-256 of decoded bytes: declared (v2), or learnt by a whole decode of a frame.
            Some(decoded) => {
                let sha256 =
                    part.facts.decoded_sha256.get().copied().or(declared_for(crate::format::DigestScope::Decoded));
                (decoded, etag(model, &name), sha256, None)
            }
            None => (stored_bytes(), etag(model, &name), declared_sha256, None),
        };
        ComponentBytes { source, etag, sha256, zstd_passthrough, varies_with_encoding, guard, digest, cache }
    }
}

/// What the steps of [`Representations::component_bytes`] share: the component and where it is.
struct Part<'a> {
    model: &'a Arc<Model>,
    object: &'a Object,
    component: &'a Component,
    /// The bytes of the model file that holds the component.
    bytes: ModelBytes,
    /// What is learnt about the component in this model version.
    facts: Arc<ComponentFacts>,
}

/// A component whose encoding is not registered is never decoded by guess: its stored bytes
/// are in the model's file, at the offsets the manifest gives.
fn refuse_unregistered(model: &Model, object: &Object, component: &Component) -> Result<(), ServiceError> {
    match &component.encoding {
        crate::format::Encoding::Unregistered(name) => {
            let at = crate::format::Location::component(&object.name, &component.role);
            Err(ServiceError::invalid(&model.id, FormatError::UnknownEncoding { at, encoding: name.to_string() }))
        }
        _ => Ok(()),
    }
}

/// What the digest guard decided for a request: the guard holding the body's last piece back
/// while a check runs, and how the verify policy decided.
struct Checked {
    guard: Option<Guard>,
    digest: Option<DigestOutcome>,
}

/// Checks the component against its digest as `policy` says: a known verdict answers at once
/// (a mismatch refuses the request); a running check is awaited when the request wants the
/// verdict before its answer, or else guards the body, which is cut short if the check fails.
async fn digest_guard(
    policy: VerifyPolicy,
    part: &Part<'_>,
    covered: Covered,
    request: &ComponentRequest<'_>,
) -> Result<Checked, ServiceError> {
    let model = part.model;
    let wait = (!request.head).then(|| request.cut.digest_wait());
    Ok(match digest_check(policy, &part.facts, part.object, part.component, covered, wait) {
        DigestCheck::Skipped => Checked { guard: None, digest: None },
        DigestCheck::Known(verdict) => {
            let digest = Some(DigestOutcome::of(&verdict));
            verdict.map_err(|source| ServiceError::invalid(&model.id, source))?;
            Checked { guard: None, digest }
        }
        DigestCheck::Running(check) if wait == Some(DigestWait::BeforeAnswering) => {
            let verdict = check.await;
            let digest = Some(DigestOutcome::of(&verdict));
            verdict.map_err(|e| e.into_service(model))?;
            Checked { guard: None, digest }
        }
        DigestCheck::Running(check) => {
            let failed = |e: CheckError| match e {
                CheckError::Mismatch(e) => e.to_string(),
                CheckError::Storage(e) => e.to_string(),
                CheckError::Decode(e) => e.to_string(),
                CheckError::Crashed(reason) => reason,
            };
            let guard = guard(check.map(move |verdict| verdict.map_err(failed)));
            Checked { guard: Some(guard), digest: Some(DigestOutcome::Streamed) }
        }
    })
}
