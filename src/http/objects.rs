//! Object and component routes: a component's decoded little-endian bytes with ranges, or an
//! object's JSON description when it has several components.

use std::ops::Range;
use std::sync::Arc;

use axum::Json;
use axum::extract::{RawPathParams, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::TryStreamExt as _;
use futures_util::future::{BoxFuture, Shared};
use futures_util::{FutureExt as _, StreamExt as _};
use serde_json::json;

use super::models::{ModelBytes, etag, model_bytes, model_version, storage_failed};
use super::respond::{ByteStream, ExtraHeaders, RangeSource, Representation, bytes_response, guard};
use super::{ApiError, AppState, answer, header_value, param, path_params, ready_model};
use crate::api;
use crate::catalog::{ComponentFacts, Model};
use crate::config::VerifyPolicy;
use crate::decode::{ComponentKey, DecodeError, Decoded, Stored, stream_private};
use crate::format::json::object_json;
use crate::format::{Component, Digest, FormatError, Manifest, Object};
use crate::telemetry::names;

use super::auth::Access;
use axum::Extension;

type Params = Result<RawPathParams, axum::extract::rejection::RawPathParamsRejection>;

/// `GET /models/{m}/objects/{o}`: the only component's bytes, or the object's description.
pub async fn object(
    State(state): State<Arc<AppState>>,
    Extension(access): Extension<Access>,
    method: Method,
    headers: HeaderMap,
    params: Params,
) -> Response {
    answer(
        async {
            let params = path_params(params)?;
            let (model, manifest) = ready_model(&state, &access, param(&params, "model"))?;
            let object = find_object(&model, &manifest, param(&params, "object"))?;
            match &object.components[..] {
                [only] => {
                    component_bytes(&state, method == Method::HEAD, &headers, &model, &manifest, object, only).await
                }
                _ => {
                    let mut doc = object_json(object);
                    add_urls(&mut doc, &model.id, object);
                    Ok(([model_version(&model)], Json(doc)).into_response())
                }
            }
        }
        .await,
    )
}

/// `GET /models/{m}/objects/{o}/components/{role}`: that component's bytes.
pub async fn component(
    State(state): State<Arc<AppState>>,
    Extension(access): Extension<Access>,
    method: Method,
    headers: HeaderMap,
    params: Params,
) -> Response {
    answer(
        async {
            let params = path_params(params)?;
            let (model, manifest) = ready_model(&state, &access, param(&params, "model"))?;
            let object = find_object(&model, &manifest, param(&params, "object"))?;
            let role = param(&params, "role");
            let component = object.component(role).ok_or_else(|| ApiError::ComponentNotFound {
                model: model.id.clone(),
                object: object.name.clone(),
                role: role.to_owned(),
                available: object.components.iter().map(|c| format!("{:?}", c.role)).collect::<Vec<_>>().join(", "),
            })?;
            component_bytes(&state, method == Method::HEAD, &headers, &model, &manifest, object, component).await
        }
        .await,
    )
}

/// Adds the object's URL and each component's URL to its rendered JSON.
pub(crate) fn add_urls(rendered: &mut serde_json::Value, model: &str, object: &Object) {
    if let Some(components) = rendered["components"].as_array_mut() {
        for (component, rendered) in object.components.iter().zip(components) {
            rendered["url"] = json!(api::component_url(model, &object.name, &component.role));
        }
    }
    rendered["url"] = json!(api::object_url(model, &object.name));
}

fn find_object<'m>(model: &Model, manifest: &'m Manifest, name: &str) -> Result<&'m Object, ApiError> {
    tracing::Span::current().record("object", name);
    manifest.object(name).ok_or_else(|| ApiError::ObjectNotFound { model: model.id.clone(), object: name.to_owned() })
}

/// Whether an object has content the format can check beyond its manifest.
fn has_content_rules(object: &Object) -> bool {
    matches!(object.format.as_str(), "sparse_csr" | "sparse_coo")
        || object.components.iter().any(|c| c.dtype == crate::format::DType::Bool)
}

/// Runs the format's content checks (bool bytes are 0 or 1, sparse indices consistent and in
/// range) before any component of the object is served as valid; once per object and file
/// version, off the async runtime.
async fn check_content_once(model: &Arc<Model>, object: &Object, bytes: &ModelBytes) -> Result<(), ApiError> {
    if !has_content_rules(object) {
        return Ok(());
    }
    let cached = model.content_checks.lock().expect("never poisoned").get(&object.name).cloned();
    let result = match cached {
        Some(result) => result,
        None => {
            // Fetched whole (the checks need every byte, within the manifest's limits).
            let mut stored = Vec::with_capacity(object.components.len());
            for component in &object.components {
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
            .map_err(|e| ApiError::Internal(e.to_string()))?;
            model.content_checks.lock().expect("never poisoned").insert(object.name.clone(), result.clone());
            result
        }
    };
    result.map_err(|source| ApiError::InvalidComponent { model: model.id.clone(), source: source.into() })
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
    Crashed(String),
}

impl CheckError {
    fn into_api(self, model: &Model) -> ApiError {
        match self {
            CheckError::Mismatch(source) => {
                ApiError::InvalidComponent { model: model.id.clone(), source: source.into() }
            }
            CheckError::Storage(e) => storage_failed(&model.source, &model.id, e),
            CheckError::Crashed(reason) => ApiError::Internal(reason),
        }
    }
}

/// Hashes a component's stored bytes off the async runtime and compares with its digest.
/// Remote bytes stream through the hasher as they arrive, never held whole.
async fn hash_stored(
    object: String,
    component: Component,
    stored: Stored,
) -> Result<Result<(), FormatError>, CheckError> {
    let Some(expected) = component.digest else { return Ok(Ok(())) };
    let hasher = crate::format::decode::Hasher::for_digest(&expected);
    let hashed = match stored {
        Stored::Whole(bytes) => tokio::task::spawn_blocking(move || {
            let mut hasher = hasher;
            hasher.update(&bytes);
            hasher.finish()
        })
        .await
        .map_err(|e| CheckError::Crashed(e.to_string()))?,
        Stored::File { .. } | Stored::Remote { .. } => {
            let (pieces, mut receiver) = tokio::sync::mpsc::channel::<Bytes>(4);
            let hashing = tokio::task::spawn_blocking(move || {
                let mut hasher = hasher;
                while let Some(piece) = receiver.blocking_recv() {
                    hasher.update(&piece);
                }
                hasher.finish()
            });
            let mut reading = stored.stream(0, "verify");
            while let Some(piece) = reading.next().await {
                let piece = piece.map_err(CheckError::Storage)?;
                if pieces.send(piece).await.is_err() {
                    break;
                }
            }
            drop(pieces);
            hashing.await.map_err(|e| CheckError::Crashed(e.to_string()))?
        }
    };
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

/// Starts (or finds) the digest check this request needs under the configured policy.
fn digest_check(
    policy: VerifyPolicy,
    facts: &Arc<ComponentFacts>,
    object: &Object,
    component: &Component,
    stored: &Stored,
    head: bool,
    ranged: bool,
) -> DigestCheck {
    if component.digest.is_none() || policy == VerifyPolicy::Never {
        return DigestCheck::Skipped;
    }
    if let (VerifyPolicy::FirstRead, Some(verdict)) = (policy, facts.verdict.get()) {
        return DigestCheck::Known(verdict.clone());
    }
    // A range of a remote component is never held up by (nor pays for) reading the whole
    // component from the store: the check is made by the first full read.
    if head || (ranged && matches!(stored, Stored::Remote { .. })) {
        return DigestCheck::Skipped;
    }
    let (facts, name, component, stored) = (Arc::clone(facts), object.name.clone(), component.clone(), stored.clone());
    let check = async move {
        let verdict = match policy {
            VerifyPolicy::FirstRead => {
                facts.verdict.get_or_try_init(|| hash_stored(name, component, stored)).await?.clone()
            }
            _ => hash_stored(name, component, stored).await?,
        };
        verdict.map_err(CheckError::Mismatch)
    }
    .boxed()
    .shared();
    // Driven to the end by its own task, whether or not the body waits on it.
    tokio::spawn(check.clone());
    DigestCheck::Running(check)
}

/// Whether the request accepts the `zstd` content coding (listed with a non-zero weight).
fn accepts_zstd(headers: &HeaderMap) -> bool {
    headers.get_all(header::ACCEPT_ENCODING).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(
        |item| {
            let mut parts = item.split(';');
            let coding = parts.next().unwrap_or("").trim();
            coding.eq_ignore_ascii_case("zstd")
                && parts.all(|p| match p.trim().split_once('=') {
                    Some((name, weight)) if name.trim().eq_ignore_ascii_case("q") => {
                        weight.trim().parse::<f32>().is_ok_and(|q| q > 0.0)
                    }
                    _ => true,
                })
        },
    )
}

/// `sha-256=:<base64>:`, the RFC 9530 form.
fn repr_digest(sha256: &[u8; 32]) -> HeaderValue {
    use base64::Engine as _;
    let encoded = base64::engine::general_purpose::STANDARD.encode(sha256);
    HeaderValue::from_str(&format!("sha-256=:{encoded}:")).expect("base64 is a valid header value")
}

/// A component's decoded bytes: from the shared, cached decode when the cache can hold it,
/// otherwise from a private decode for this request only. Chosen when the body is opened, so
/// HEAD and 304 answers reserve nothing.
struct DecodedSource {
    state: Arc<AppState>,
    source: Arc<crate::catalog::Source>,
    key: ComponentKey,
    component: Component,
    stored: Stored,
    sha256: Arc<std::sync::OnceLock<[u8; 32]>>,
}

impl RangeSource for DecodedSource {
    fn len(&self) -> u64 {
        self.component.decoded_length
    }

    fn open(&self, range: Range<u64>) -> ByteStream {
        let cache = &self.state.cache;
        let make = |decoders| {
            Decoded::new(&self.key.object, &self.component, self.stored.clone(), decoders, Arc::clone(&self.sha256))
        };
        let (model, source) = (self.key.model.clone(), Arc::clone(&self.source));
        let failed = move |e: DecodeError| match e {
            DecodeError::Invalid(invalid) => {
                ApiError::InvalidComponent { model: model.clone(), source: invalid.into() }
            }
            DecodeError::Storage(e) => storage_failed(&source, &model, e),
            DecodeError::Aborted(reason) => ApiError::Internal(reason),
        };
        let span = tracing::Span::current();
        match cache.entry(&self.key, self.len(), make) {
            Some(entry) => {
                let hit = entry.covers(range.end);
                metrics::counter!(if hit { names::CACHE_HITS } else { names::CACHE_MISSES }).increment(1);
                span.record("cache", if hit { "hit" } else { "miss" });
                let body = Decoded::stream(entry, range).map(move |piece| piece.map_err(&failed)).boxed();
                if hit { body } else { self.admitted(body) }
            }
            None => {
                metrics::counter!(names::CACHE_MISSES).increment(1);
                span.record("cache", "bypass");
                let decoders = Arc::clone(cache.decoders());
                let body = stream_private(
                    self.key.object.clone(),
                    self.component.clone(),
                    self.stored.clone(),
                    range,
                    decoders,
                )
                .map(move |piece| piece.map_err(&failed))
                .boxed();
                self.admitted(body)
            }
        }
    }
}

impl DecodedSource {
    /// `body`, once a decoder has come free within `decode_wait_ms`; otherwise the error
    /// `DecodersBusy` (503 with Retry-After: the body's first piece is taken before any header
    /// is sent). Decoders are taken one piece at a time, in turn, so this wait is the queue a
    /// new decode would join: when it stays full that long, shedding the request beats
    /// letting every decode slow down.
    fn admitted(&self, body: ByteStream) -> ByteStream {
        let decoders = Arc::clone(self.state.cache.decoders());
        let wait = std::time::Duration::from_millis(self.state.config.decode_wait_ms);
        futures_util::stream::once(async move {
            match tokio::time::timeout(wait, decoders.acquire()).await {
                Ok(_free) => Ok(body),
                Err(_) => {
                    metrics::counter!(names::DECODE_REFUSALS).increment(1);
                    Err(ApiError::DecodersBusy)
                }
            }
        })
        .try_flatten()
        .boxed()
    }
}

/// A component's bytes, decoded little-endian (or its stored zstd frame for a client that
/// accepts zstd), checked against its digest as the verify policy says.
async fn component_bytes(
    state: &Arc<AppState>,
    head: bool,
    headers: &HeaderMap,
    model: &Arc<Model>,
    manifest: &Manifest,
    object: &Object,
    component: &Component,
) -> Result<Response, ApiError> {
    let bytes = model_bytes(model, manifest.file_len).await?;
    check_content_once(model, object, &bytes).await?;
    let range = component.stored_range();
    let stored = bytes.stored(range.clone());
    let facts = model.facts(&object.name, &component.role);
    let ranged = headers.contains_key(header::RANGE);
    let span = tracing::Span::current();
    let guard = match digest_check(state.config.verify, &facts, object, component, &stored, head, ranged) {
        DigestCheck::Skipped => None,
        DigestCheck::Known(verdict) => {
            span.record("digest", if verdict.is_ok() { "verified" } else { "mismatch" });
            verdict.map_err(|source| ApiError::InvalidComponent { model: model.id.clone(), source: source.into() })?;
            None
        }
        // A range is small next to the check: wait, and answer a clean error if it fails.
        DigestCheck::Running(check) if ranged => {
            let verdict = check.await;
            span.record("digest", if verdict.is_ok() { "verified" } else { "mismatch" });
            verdict.map_err(|e| e.into_api(model))?;
            None
        }
        // A whole body streams while the check runs; its last piece waits for the verdict.
        DigestCheck::Running(check) => {
            span.record("digest", "streamed");
            Some(guard(check.map(|verdict| {
                verdict.map_err(|e| match e {
                    CheckError::Mismatch(e) => e.to_string(),
                    CheckError::Storage(e) => e.to_string(),
                    CheckError::Crashed(reason) => reason,
                })
            })))
        }
    };

    let mut extra: ExtraHeaders = vec![
        model_version(model),
        (HeaderName::from_static(api::headers::DTYPE), header_value(component.dtype.name())),
        (HeaderName::from_static(api::headers::FORMAT), header_value(&api::segment(&object.format))),
        (
            HeaderName::from_static(api::headers::SHAPE),
            header_value(&object.shape.iter().map(u64::to_string).collect::<Vec<_>>().join(",")),
        ),
    ];
    if let Some(logical) = &component.logical_type {
        extra.push((HeaderName::from_static(api::headers::TYPE), header_value(&api::segment(logical))));
    }
    let part = format!("{}\0{}", object.name, component.role);
    let declared_sha256 = match &component.digest {
        Some(Digest::Sha256(sha256)) => Some(*sha256),
        _ => None,
    };
    let offers_zstd = component.is_zstd_of_served_bytes();
    if offers_zstd {
        extra.push((header::VARY, HeaderValue::from_static("accept-encoding")));
    }
    let (source, etag, sha256): (Arc<dyn RangeSource>, String, Option<[u8; 32]>) =
        if offers_zstd && !ranged && accepts_zstd(headers) {
            // The stored frame as it is: its digest, when SHA-256, is the representation's.
            extra.push((header::CONTENT_ENCODING, HeaderValue::from_static("zstd")));
            span.record("cache", "passthrough");
            (bytes.served(state, &model.id, range), etag(model, &format!("{part}\0zstd")), declared_sha256)
        } else if component.is_verbatim() {
            (bytes.served(state, &model.id, range), etag(model, &part), declared_sha256)
        } else {
            let key = ComponentKey {
                model: model.id.clone(),
                version: model.version.clone(),
                object: object.name.clone(),
                role: component.role.clone(),
            };
            let sha256 = facts.decoded_sha256.get().copied();
            let source = DecodedSource {
                state: Arc::clone(state),
                source: Arc::clone(&model.source),
                key,
                component: component.clone(),
                stored,
                sha256: Arc::clone(&facts.decoded_sha256),
            };
            (Arc::new(source), etag(model, &part), sha256)
        };
    if let Some(sha256) = &sha256 {
        extra.push((HeaderName::from_static(api::headers::REPR_DIGEST), repr_digest(sha256)));
    }
    let representation =
        Representation { source, etag, content_type: "application/octet-stream", headers: extra, guard };
    bytes_response(headers, head, representation, state.config.max_ranges).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepts(value: &str) -> bool {
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_str(value).unwrap());
        accepts_zstd(&headers)
    }

    #[test]
    fn zstd_is_accepted_only_when_listed_with_a_non_zero_weight() {
        assert!(accepts("zstd"));
        assert!(accepts("gzip, ZSTD;q=0.5, br"));
        assert!(accepts("zstd ; q=1.0"));
        assert!(!accepts("zstd;q=0"));
        assert!(!accepts("zstd;q=0.000"));
        assert!(!accepts("gzip, br"));
        assert!(!accepts("*"));
        assert!(!accepts("zstdx"));
        assert!(!accepts("zstd;q=abc"));
    }

    #[test]
    fn repr_digest_is_base64_between_colons() {
        let value = repr_digest(&[0u8; 32]);
        assert_eq!(value, "sha-256=:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=:");
    }
}
