//! The artifact store's routes (`crate::artifacts`), mounted at `/artifacts` only when
//! `[artifacts] dir` is set: without it the server takes no writes. Blobs are put and read by
//! their SHA-256, bundles published once and read by name, and their names listed. Reads follow
//! `[auth]` (a bundle outside a token's prefixes answers as one that does not exist); every
//! write needs a token of `[artifacts] writers` or a client certificate identity of
//! `writer_identities`, whose prefixes limit the bundle names it may publish; with
//! `require_signature`, a bundle is taken only when `[signing]`'s signers signed its files.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

use super::ApiError;
use crate::access::{Access, Tokens, bearer};
use crate::api::routes;
use crate::artifacts::{ArtifactError, BlobPut, Bundle, SharedStore, verify_bundle};
use crate::config::Config;
use crate::signing::Trust;
use crate::transport::respond::{Representation, bytes_response};
use crate::transport::{ClientIdentity, Refusals, RouteLabels, with_common_layers};

/// The store, who may write to it, and whose signatures it requires.
#[derive(Clone)]
pub(crate) struct ArtifactAccess {
    pub(crate) store: Arc<SharedStore>,
    /// Who may write: `[artifacts] writers` and `writer_identities`; none, and nobody may.
    pub(crate) writers: Option<Arc<Tokens>>,
    /// With `require_signature`, the signers `[signing]` trusts.
    pub(crate) signers: Option<Arc<Trust>>,
}

struct ArtifactsState {
    access: ArtifactAccess,
    /// Who may read: `[auth]`.
    readers: Arc<Tokens>,
    max_ranges: usize,
    max_signature_bytes: u64,
}

/// The largest bundle read (100,000 files at about 200 bytes each is 20 MB).
const MAX_BUNDLE_BYTES: usize = 64 << 20;

/// The routes over the store, reads checked against `readers` and writes as `access` says, to
/// be merged into the main listener's (other paths below `/artifacts` are the contract's 404).
pub(crate) fn app(access: ArtifactAccess, readers: Arc<Tokens>, config: &Config) -> Router {
    let state = Arc::new(ArtifactsState {
        access,
        readers,
        max_ranges: config.limits.max_ranges,
        max_signature_bytes: config.signing.max_signature_bytes,
    });
    let router = Router::new()
        .route(routes::ARTIFACT_BLOB, get(get_blob).put(put_blob))
        .route(routes::ARTIFACT_BUNDLES, get(list_bundles))
        .route(routes::ARTIFACT_BUNDLE, get(get_bundle).put(put_bundle))
        .with_state(state);
    let labels = RouteLabels { routes: ARTIFACT_ROUTES, unmatched: |_| routes::ARTIFACTS };
    let refusals = Refusals {
        panicked: || ApiError::Internal("a handler panicked".into()).into_response(),
        timed_out: || ApiError::RequestTimeout.into_response(),
    };
    with_common_layers(router, config, labels, refusals)
}

const ARTIFACT_ROUTES: &[&str] = &[routes::ARTIFACT_BLOB, routes::ARTIFACT_BUNDLES, routes::ARTIFACT_BUNDLE];

fn client(identity: &Option<axum::Extension<Arc<ClientIdentity>>>) -> Option<&[String]> {
    identity.as_ref().map(|identity| identity.names.as_slice())
}

impl ArtifactsState {
    fn reader(&self, headers: &HeaderMap, client: Option<&[String]>) -> Result<Access, ApiError> {
        self.readers
            .verdict(bearer(headers), client)
            .access()
            .map_err(|refused| ApiError::Unauthorized { invalid: refused == crate::access::Refused::Invalid })
    }

    /// What the request may write; a token or identity `[artifacts]` does not grant may not.
    fn writer(&self, headers: &HeaderMap, client: Option<&[String]>) -> Result<Access, ApiError> {
        let Some(writers) = &self.access.writers else {
            let reason = "nobody is granted writing ([artifacts] writers and writer_identities are empty)";
            return Err(ApiError::WriteNotGranted(reason.into()));
        };
        match writers.verdict(bearer(headers), client).access() {
            Ok(access) => Ok(access),
            Err(crate::access::Refused::Missing) if client.is_some_and(|names| !names.is_empty()) => {
                let reason = "the client certificate's identity is not granted writing ([artifacts] writer_identities)";
                Err(ApiError::WriteNotGranted(reason.into()))
            }
            Err(crate::access::Refused::Missing) => Err(ApiError::Unauthorized { invalid: false }),
            Err(crate::access::Refused::Invalid) => {
                Err(ApiError::WriteNotGranted("the bearer token is not granted writing ([artifacts] writers)".into()))
            }
        }
    }
}

/// The hex digits of a blob's `sha256:HEX` name.
fn blob_hex(digest: &str) -> Result<&str, ApiError> {
    crate::digests::sha256_hex(digest).ok_or_else(|| ApiError::Artifact(ArtifactError::BadDigest(digest.to_owned())))
}

/// `PUT /artifacts/blobs/sha256:HEX`: 201 when stored, 200 when the store held it already.
async fn put_blob(
    State(state): State<Arc<ArtifactsState>>,
    Path(digest): Path<String>,
    headers: HeaderMap,
    identity: Option<axum::Extension<Arc<ClientIdentity>>>,
    body: Body,
) -> Result<Response, ApiError> {
    state.writer(&headers, client(&identity))?;
    let hex = blob_hex(&digest)?;
    match state.access.store.put_blob(hex, body.into_data_stream()).await? {
        BlobPut::Created => Ok(StatusCode::CREATED.into_response()),
        BlobPut::AlreadyHeld => Ok(StatusCode::OK.into_response()),
    }
}

/// `GET|HEAD /artifacts/blobs/sha256:HEX`, with ranges and conditionals.
async fn get_blob(
    State(state): State<Arc<ArtifactsState>>,
    Path(digest): Path<String>,
    method: Method,
    headers: HeaderMap,
    identity: Option<axum::Extension<Arc<ClientIdentity>>>,
) -> Result<Response, ApiError> {
    state.reader(&headers, client(&identity))?;
    let hex = blob_hex(&digest)?.to_owned();
    let bytes = state.access.store.checked_blob(&hex).await?.ok_or_else(|| ApiError::NoSuchBlob(digest.clone()))?;
    let etag = format!("\"{digest}\"");
    let representation = Representation {
        source: Arc::new(bytes),
        etag,
        content_type: "application/octet-stream",
        headers: vec![],
        guard: None,
    };
    Ok(bytes_response(&headers, method == Method::HEAD, representation, state.max_ranges).await?)
}

/// `PUT /artifacts/bundles/{name}`: publishes the bundle once (409 when the name is taken).
async fn put_bundle(
    State(state): State<Arc<ArtifactsState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    identity: Option<axum::Extension<Arc<ClientIdentity>>>,
    body: Body,
) -> Result<Response, ApiError> {
    let access = state.writer(&headers, client(&identity))?;
    if !access.allows(&name) {
        return Err(ApiError::WriteNotGranted(format!("this writer's prefixes do not allow publishing {name:?}")));
    }
    let body = axum::body::to_bytes(body, MAX_BUNDLE_BYTES).await.map_err(|e| {
        let reason = format!("the bundle is not read whole (at most {MAX_BUNDLE_BYTES} bytes): {e}");
        ApiError::Artifact(ArtifactError::BadBundle { name: name.clone(), reason })
    })?;
    let bundle: Bundle = serde_json::from_slice(&body)
        .map_err(|e| ApiError::Artifact(ArtifactError::BadBundle { name: name.clone(), reason: e.to_string() }))?;
    if let Some(signers) = &state.access.signers {
        let signer = verify_bundle(signers, &name, &bundle, state.max_signature_bytes).map_err(ApiError::Artifact)?;
        tracing::info!(bundle = %name, %signer, "artifact bundle signature verified");
    }
    state.access.store.put_bundle(&name, bundle).await?;
    Ok(StatusCode::CREATED.into_response())
}

/// `GET /artifacts/bundles/{name}`: the bundle's files and signature.
async fn get_bundle(
    State(state): State<Arc<ArtifactsState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    identity: Option<axum::Extension<Arc<ClientIdentity>>>,
) -> Result<Response, ApiError> {
    if !state.reader(&headers, client(&identity))?.allows(&name) {
        return Err(ApiError::Artifact(ArtifactError::NoBundle(name)));
    }
    let bundle = state.access.store.bundle(&name).await?;
    // Checked as it is served too: a bundle read back from the bucket or kept from before a
    // restart (or the setting) was never checked by this server's publish.
    if let Some(signers) = &state.access.signers {
        verify_bundle(signers, &name, &bundle, state.max_signature_bytes).map_err(ApiError::Artifact)?;
    }
    Ok(axum::Json(bundle).into_response())
}

#[derive(serde::Deserialize)]
struct Listing {
    #[serde(default)]
    prefix: String,
}

/// `GET /artifacts/bundles?prefix=P`: the names of the bundles the caller may read.
async fn list_bundles(
    State(state): State<Arc<ArtifactsState>>,
    Query(listing): Query<Listing>,
    headers: HeaderMap,
    identity: Option<axum::Extension<Arc<ClientIdentity>>>,
) -> Result<Response, ApiError> {
    let access = state.reader(&headers, client(&identity))?;
    let names =
        state.access.store.bundle_names(|name| name.starts_with(&listing.prefix) && access.allows(name)).await?;
    Ok(axum::Json(json!({ "bundles": names })).into_response())
}
