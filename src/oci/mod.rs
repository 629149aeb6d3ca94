//! The OCI distribution API's read side at `/v2`, so registries' clients (`oras`, `skopeo`,
//! `podman`, Dragonfly, registry mirrors, Kubernetes image volumes, KServe's `oci://`) pull
//! models. Each model is a repository ([`names`]: ids map to lowercase repository names
//! without collisions) with two things under its tags: `latest` and its version token name a
//! ModelPack artifact ([`artifact`]: one raw layer per file the model publishes to every
//! protocol, the same files the Hub API lists, each layer's digest the file's SHA-256), and
//! `latest-image` and `VERSION-image` name an image index for linux/amd64 and linux/arm64
//! ([`image`]: the same files under `/models/`, one uncompressed tar layer each, their digests
//! computed in the same read as the files' own). Blobs are served by digest with ranges.
//! Access takes the existing tokens as bearer tokens, or as the password of HTTP basic
//! credentials, and through the token flow registry clients implement (a
//! `WWW-Authenticate: Bearer realm=…` challenge answered by `/v2/_token`). Pushes and deletes
//! are refused; errors are [`error`]'s.

mod artifact;
mod error;
mod image;
mod names;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::{Value, json};

use self::artifact::{Artifact, LayerFile};
pub(crate) use self::error::OciError;
use self::image::{IMAGE_TAG_SUFFIX, Image, ImageLayer};
use self::names::OciRoute;
use crate::access::{Access, Tokens};
use crate::api::routes;
use crate::config::Config;
use crate::service::{DigestOf, LayerFraming, OpenModel, PublishedFile, Service, TarLayer, version_token};
use crate::transport::prefixed::{self, Grammar, PrefixedRequest};
use crate::transport::respond::{Representation, bytes_response};

/// The header every answer carries, as registries send it.
pub(crate) const API_VERSION: (HeaderName, &str) =
    (HeaderName::from_static("docker-distribution-api-version"), "registry/2.0");

/// Repositories per catalog page when the client names no `n`, and the most it may ask for.
const CATALOG_PAGE: usize = 1000;

/// Seconds a token from `/v2/_token` is said to last (it is the configured token itself, which
/// lasts as long as the configuration keeps it).
const TOKEN_SECONDS: u64 = 3600;

struct OciState {
    service: Arc<Service>,
    tokens: Arc<Tokens>,
    max_ranges: usize,
}

/// The registry's router (mounted at [`routes::OCI`] by the server), over `service`, checking
/// `tokens`, as `config` says.
pub(crate) fn app(service: Arc<Service>, tokens: Arc<Tokens>, config: &Config) -> Router {
    prefixed::app(Arc::new(OciState { service, tokens, max_ranges: config.limits.max_ranges }), config)
}

impl Grammar for OciState {
    type Error = OciError;

    /// The registry takes no bodies: pushes are refused unread.
    async fn answer(self: Arc<Self>, request: PrefixedRequest, _body: Body) -> Result<Response, OciError> {
        answer(&self, &request).await
    }

    /// A manifest, a blob, or anything else.
    fn route_label(uri: &Uri) -> &'static str {
        let path = percent_encoding::percent_decode_str(uri.path()).decode_utf8_lossy();
        match names::route(&path) {
            OciRoute::Manifest { .. } => routes::OCI_MANIFEST,
            OciRoute::Blob { .. } => routes::OCI_BLOB,
            _ => routes::OCI,
        }
    }

    fn panicked() -> Response {
        OciError::Internal("a handler panicked".into()).into_response()
    }

    fn timed_out() -> Response {
        OciError::RequestTimeout.into_response()
    }

    fn finish(response: &mut Response) {
        response.headers_mut().insert(API_VERSION.0, HeaderValue::from_static(API_VERSION.1));
    }
}

/// Refuses `request` unless its method is one of `allowed` (a push or a delete, on a read-only
/// registry).
fn only(request: &PrefixedRequest, allowed: &'static str) -> Result<(), OciError> {
    request.only(allowed, |method, allowed| OciError::Unsupported { method, allowed })
}

async fn answer(state: &OciState, request: &PrefixedRequest) -> Result<Response, OciError> {
    let (method, uri, headers) = (&request.method, &request.uri, &request.headers);
    // Repository names, tags and digests hold no `%`: a client that escapes a digest's `:`
    // means the digest.
    let path = percent_encoding::percent_decode_str(uri.path())
        .decode_utf8()
        .map_err(|e| OciError::BadRequest(format!("path is not valid percent-encoded UTF-8: {e}")))?;
    let route = names::route(&path);
    if let OciRoute::Token = route {
        only(request, "GET")?;
        return token(state, headers);
    }
    let scope = match &route {
        OciRoute::Tags { name }
        | OciRoute::Manifest { name, .. }
        | OciRoute::Blob { name, .. }
        | OciRoute::Referrers { name, .. } => {
            // A name the grammar refuses is named in no challenge (it could break its quotes).
            names::is_repository_name(name).then(|| format!("repository:{name}:pull"))
        }
        OciRoute::Catalog => Some("registry:catalog:*".into()),
        _ => None,
    };
    let access = caller(state, (headers, request.client_names()), scope.as_deref())?;
    let query: Vec<(String, String)> =
        form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()).into_owned().collect();
    match route {
        OciRoute::Base => {
            only(request, "GET, HEAD")?;
            Ok(json_response(&json!({}), method == Method::HEAD))
        }
        OciRoute::Catalog => {
            only(request, "GET")?;
            catalog(state, &access, &query)
        }
        OciRoute::Tags { name } => {
            only(request, "GET")?;
            let at = state.repository(&access, &name).await?;
            tags_list(&at, &name, &query)
        }
        OciRoute::Manifest { name, reference } => {
            only(request, "GET, HEAD")?;
            let at = state.repository(&access, &name).await?;
            manifest(state, &at, (&name, reference), method == Method::HEAD, headers).await
        }
        OciRoute::Blob { name, digest } => {
            only(request, "GET, HEAD")?;
            if names::sha256_hex(&digest).is_none() {
                return Err(OciError::DigestInvalid(digest));
            }
            let at = state.repository(&access, &name).await?;
            blob(state, &at, &name, &digest, method == Method::HEAD, headers).await
        }
        OciRoute::Referrers { name, digest } => {
            only(request, "GET")?;
            if names::sha256_hex(&digest).is_none() {
                return Err(OciError::DigestInvalid(digest));
            }
            state.repository(&access, &name).await?;
            let index = json!({ "schemaVersion": 2, "mediaType": artifact::INDEX_MEDIA_TYPE, "manifests": [] });
            let mut response = json_response(&index, false);
            response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(artifact::INDEX_MEDIA_TYPE));
            Ok(response)
        }
        OciRoute::Upload => Err(OciError::Unsupported { method: method.to_string(), allowed: "GET, HEAD" }),
        OciRoute::Token => unreachable!("answered above"),
        OciRoute::Unknown => Err(OciError::RouteUnknown(uri.path().to_owned())),
    }
}

/// `GET /v2/{name}/tags/list` of repository `at`: the artifact's and the image's tags, `latest`
/// and the version's, a page at a time.
fn tags_list(at: &RepositoryAt, name: &str, query: &[(String, String)]) -> Result<Response, OciError> {
    let version = version_token(at.open.model());
    let tags =
        vec!["latest".to_owned(), format!("latest{IMAGE_TAG_SUFFIX}"), format!("{version}{IMAGE_TAG_SUFFIX}"), version];
    let (page, next) = page(tags, query)?;
    let mut response = json_response(&json!({ "name": name, "tags": page }), false);
    link_next(&mut response, &format!("/{name}/tags/list"), next);
    Ok(response)
}

/// `GET|HEAD /v2/{name}/manifests/{reference}` of repository `at`: the artifact by `latest`, its
/// version or its digest; the image index by `latest-image` (and the version's image tag) or
/// its digest; a platform's image manifest by its digest.
async fn manifest(
    state: &OciState,
    at: &RepositoryAt,
    (name, reference): (&str, String),
    head: bool,
    headers: &HeaderMap,
) -> Result<Response, OciError> {
    let version = version_token(at.open.model());
    let image_tag = reference.strip_suffix(IMAGE_TAG_SUFFIX);
    if reference == "latest" || reference == version {
        let artifact = state.artifact(at).await?;
        return manifest_response(headers, Served::artifact(&artifact), head, name);
    }
    if image_tag == Some("latest") || image_tag == Some(version.as_str()) {
        let image = state.image(at).await?;
        return manifest_response(headers, Served::index(&image), head, name);
    }
    if names::sha256_hex(&reference).is_none() {
        return Err(OciError::ManifestUnknown { name: name.to_owned(), reference });
    }
    let artifact = state.artifact(at).await?;
    if reference == artifact.manifest_digest {
        return manifest_response(headers, Served::artifact(&artifact), head, name);
    }
    let image = state.image(at).await?;
    if reference == image.index_digest {
        return manifest_response(headers, Served::index(&image), head, name);
    }
    match image.manifest(&reference) {
        Some(platform) => manifest_response(headers, Served::platform(platform), head, name),
        None => Err(OciError::ManifestUnknown { name: name.to_owned(), reference }),
    }
}

/// The token a request carries: a bearer token, or the password of basic credentials.
fn presented_token(headers: &HeaderMap) -> Option<String> {
    if let Some(token) = crate::access::bearer(headers) {
        return Some(token.to_owned());
    }
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).ok()?;
    let (_user, password) = std::str::from_utf8(&decoded).ok()?.split_once(':')?;
    Some(password.to_owned())
}

/// What the caller may read; without a valid token where tokens are needed, the challenge
/// that sends the client to the token endpoint (for `scope`).
fn caller(
    state: &OciState,
    (headers, client): (&HeaderMap, Option<&[String]>),
    scope: Option<&str>,
) -> Result<Access, OciError> {
    if let Ok(access) = state.tokens.verdict(presented_token(headers).as_deref(), client).access() {
        return Ok(access);
    }
    // Only what can stand inside the challenge's quoted string.
    let plain = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\'))
            .map(str::to_owned)
    };
    let host = plain(header::HOST.as_str()).unwrap_or_else(|| "localhost".into());
    let scheme = plain("x-forwarded-proto").filter(|s| s == "https").unwrap_or_else(|| "http".into());
    let mut challenge = format!(r#"Bearer realm="{scheme}://{host}{}/_token",service="ztserve""#, routes::OCI);
    if let Some(scope) = scope {
        challenge.push_str(&format!(r#",scope="{scope}""#));
    }
    Err(OciError::Unauthorized { challenge })
}

/// `GET /v2/_token`: the token flow's token for HTTP basic credentials whose password is a
/// configured token (the token itself, which the client then sends as a bearer token).
fn token(state: &OciState, headers: &HeaderMap) -> Result<Response, OciError> {
    let token = if state.tokens.required() {
        let presented = presented_token(headers);
        if state.tokens.verdict(presented.as_deref(), None).access().is_err() {
            let challenge = r#"Basic realm="ztserve""#.to_owned();
            return Err(OciError::Unauthorized { challenge });
        }
        presented.expect("an accepted token was presented")
    } else {
        // Nothing is needed: any token serves, and this one says so.
        "anonymous".to_owned()
    };
    let body = json!({ "token": token, "access_token": token, "expires_in": TOKEN_SECONDS });
    let mut response = json_response(&body, false);
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

/// `GET /v2/_catalog?n=&last=`: the repositories the caller may read, in name order, a page at
/// a time with a `Link` to the next.
fn catalog(state: &OciState, access: &Access, query: &[(String, String)]) -> Result<Response, OciError> {
    let repositories: Vec<String> = state
        .service
        .listing()
        .models()
        .filter(|m| access.allows(&m.id))
        .map(|m| names::repository_of(&m.id))
        .collect();
    let (page, next) = page(repositories, query)?;
    let mut response = json_response(&json!({ "repositories": page }), false);
    link_next(&mut response, "/_catalog", next);
    Ok(response)
}

/// One page of `items` (sorted here) as the query's `n` and `last` ask: the items after `last`,
/// at most `n` of them (at most [`CATALOG_PAGE`]); and, when more follow, the next page's query.
fn page(mut items: Vec<String>, query: &[(String, String)]) -> Result<(Vec<String>, Option<String>), OciError> {
    let param = |key: &str| query.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
    let n = match param("n") {
        None => CATALOG_PAGE,
        // A count past any page is a whole page.
        Some(n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
            n.parse::<usize>().unwrap_or(CATALOG_PAGE).min(CATALOG_PAGE)
        }
        Some(n) => return Err(OciError::BadRequest(format!("n={n:?} is not a count"))),
    };
    items.sort();
    let start = items.partition_point(|item| item.as_str() <= param("last").unwrap_or(""));
    let rest = items.len() - start;
    let page: Vec<String> = items.into_iter().skip(start).take(n).collect();
    let next = (page.len() < rest).then(|| page.last().map(|last| format!("n={n}&last={last}"))).flatten();
    Ok((page, next))
}

/// Adds the `Link` to the next page (`path` below the prefix, with `query`), when there is one.
fn link_next(response: &mut Response, path: &str, query: Option<String>) {
    let Some(query) = query else { return };
    if let Ok(value) = HeaderValue::from_str(&format!("<{}{path}?{query}>; rel=\"next\"", routes::OCI)) {
        response.headers_mut().insert(header::LINK, value);
    }
}

fn json_response(value: &Value, head: bool) -> Response {
    let body = serde_json::to_vec(value).expect("JSON values serialize");
    let len = body.len();
    let mut response = if head { StatusCode::OK.into_response() } else { (StatusCode::OK, body).into_response() };
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    response
}

/// A repository at its current version.
struct RepositoryAt {
    /// The model, opened (so admitted) for the request.
    open: OpenModel,
    files: Vec<PublishedFile>,
}

/// The annotations of a model's signature on its artifact: its state and signer, not when it
/// was checked, so checking the same files again leaves the manifest's digest as it was.
fn signature_annotations(signature: &crate::service::SignatureStatus) -> Vec<(&'static str, String)> {
    let mut annotations = Vec::new();
    if signature.to_json().is_some() {
        annotations.push((artifact::SIGNATURE_STATE, signature.state().to_owned()));
    }
    if let Some(signer) = signature.signer() {
        annotations.push((artifact::SIGNATURE_SIGNER, signer.to_owned()));
    }
    annotations
}

impl OciState {
    /// The model whose repository is `name`, for a caller with `access`: a name outside the
    /// caller's prefixes is denied whether or not it exists, so nothing is learnt of models
    /// the token may not read.
    async fn repository(&self, access: &Access, name: &str) -> Result<RepositoryAt, OciError> {
        let unknown = || OciError::NameUnknown { name: name.to_owned() };
        if !names::is_repository_name(name) {
            return Err(unknown());
        }
        let listing = self.service.listing();
        let model = if names::is_hashed(name) {
            listing.models().find(|m| names::names(name, &m.id)).cloned()
        } else {
            listing.get(name).cloned()
        };
        let Some(model) = model else {
            return match access {
                Access::Everything => Err(unknown()),
                // A hashed name cannot be checked against prefixes without its model.
                _ if names::is_hashed(name) => Err(unknown()),
                _ if access.allows(name) => Err(unknown()),
                _ => Err(OciError::Denied { name: name.to_owned() }),
            };
        };
        if !access.allows(&model.id) {
            return Err(OciError::Denied { name: name.to_owned() });
        }
        tracing::Span::current().record("model", model.id.as_str());
        let open = listing.open(&model.id).await?;
        let files = open.repository_files();
        Ok(RepositoryAt { open, files })
    }

    /// The repository's artifact: its config and manifest, with every file's SHA-256.
    async fn artifact(&self, at: &RepositoryAt) -> Result<Artifact, OciError> {
        Ok(self.artifact_and_layers(at).await?.0)
    }

    /// The digests `of` every file of the repository (in the order of `at.files`), waiting for
    /// those being computed as a listing does.
    async fn digests(&self, at: &RepositoryAt, of: DigestOf) -> Result<Vec<[u8; 32]>, OciError> {
        let files: Vec<&PublishedFile> = at.files.iter().collect();
        Ok(at.open.sha256s(&files, of).await?)
    }

    /// The artifact, and its layers (in the order of `at.files`).
    async fn artifact_and_layers(&self, at: &RepositoryAt) -> Result<(Artifact, Vec<LayerFile>), OciError> {
        let layers: Vec<LayerFile> = at
            .files
            .iter()
            .zip(self.digests(at, DigestOf::File).await?)
            .map(|(file, sha256)| LayerFile { path: file.path.clone(), size: file.size, sha256 })
            .collect();
        let (model, manifest) = (at.open.model(), at.open.manifest());
        let annotations = signature_annotations(at.open.signature());
        Ok((artifact::build(&model.id, &version_token(model), manifest, &layers, &annotations), layers))
    }

    /// The repository's image.
    async fn image(&self, at: &RepositoryAt) -> Result<Image, OciError> {
        Ok(self.image_and_layers(at).await?.0)
    }

    /// The image, and its layers (in the order of `at.files`), whose digests are computed once
    /// per file version, as the files' own are.
    async fn image_and_layers(&self, at: &RepositoryAt) -> Result<(Image, Vec<ImageLayer>), OciError> {
        let layers: Vec<ImageLayer> = at
            .files
            .iter()
            .zip(self.digests(at, DigestOf::ImageLayer).await?)
            .map(|(file, sha256)| {
                let framing = LayerFraming::of(&file.path, file.size).expect("framed when its digest was computed");
                ImageLayer { path: file.path.clone(), size: framing.len(), sha256 }
            })
            .collect();
        let model = at.open.model();
        Ok((image::build(&model.id, &version_token(model), &layers), layers))
    }
}

/// A manifest or index as served: its bytes, digest and media type.
struct Served<'a> {
    bytes: &'a [u8],
    digest: &'a str,
    media_type: &'static str,
}

impl<'a> Served<'a> {
    fn artifact(artifact: &'a Artifact) -> Served<'a> {
        Served {
            bytes: &artifact.manifest,
            digest: &artifact.manifest_digest,
            media_type: artifact::MANIFEST_MEDIA_TYPE,
        }
    }

    fn index(image: &'a Image) -> Served<'a> {
        Served { bytes: &image.index, digest: &image.index_digest, media_type: artifact::INDEX_MEDIA_TYPE }
    }

    fn platform(platform: &'a image::PlatformImage) -> Served<'a> {
        Served {
            bytes: &platform.manifest,
            digest: &platform.manifest_digest,
            media_type: artifact::MANIFEST_MEDIA_TYPE,
        }
    }
}

/// Whether `accept` (absent: anything) takes `media_type`.
fn accepts(accept: Option<&str>, media_type: &str) -> bool {
    let Some(accept) = accept else { return true };
    accept
        .split(',')
        .map(|t| t.split(';').next().unwrap_or("").trim())
        .any(|t| t.is_empty() || t == "*/*" || t == "application/*" || t == media_type)
}

fn manifest_response(headers: &HeaderMap, served: Served<'_>, head: bool, name: &str) -> Result<Response, OciError> {
    let accept: Option<String> = {
        let values: Vec<&str> = headers.get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok()).collect();
        (!values.is_empty()).then(|| values.join(","))
    };
    if !accepts(accept.as_deref(), served.media_type) {
        return Err(OciError::ManifestUnknown {
            name: name.to_owned(),
            reference: format!("as {} (the manifest is {})", accept.unwrap_or_default(), served.media_type),
        });
    }
    let digest = HeaderValue::from_str(served.digest).expect("sha256 digests are ASCII");
    let etag = HeaderValue::from_str(&format!("\"{}\"", served.digest)).expect("ASCII");
    let mut response = if head || headers.get(header::IF_NONE_MATCH) == Some(&etag) {
        let status = if head { StatusCode::OK } else { StatusCode::NOT_MODIFIED };
        status.into_response()
    } else {
        (StatusCode::OK, served.bytes.to_vec()).into_response()
    };
    let out = response.headers_mut();
    out.insert(header::CONTENT_TYPE, HeaderValue::from_static(served.media_type));
    out.insert(header::CONTENT_LENGTH, HeaderValue::from(served.bytes.len()));
    out.insert(HeaderName::from_static("docker-content-digest"), digest);
    out.insert(header::ETAG, etag);
    out.insert(header::CACHE_CONTROL, crate::transport::respond::REVALIDATE);
    Ok(response)
}

/// `GET|HEAD /v2/{name}/blobs/{digest}`: the config, or the layer (a published file) with that
/// digest, with ranges.
async fn blob(
    state: &OciState,
    at: &RepositoryAt,
    name: &str,
    digest: &str,
    head: bool,
    headers: &HeaderMap,
) -> Result<Response, OciError> {
    let (artifact, layers) = state.artifact_and_layers(at).await?;
    let digest_header = (HeaderName::from_static("docker-content-digest"), HeaderValue::from_str(digest).expect("hex"));
    let immutable = (header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=31536000, immutable"));
    let etag = format!("\"{digest}\"");
    let hex = names::sha256_hex(digest).expect("checked by the caller");
    let (source, content_type): (Arc<dyn crate::service::RangeSource>, _) = if digest == artifact.config_digest {
        (Arc::new(bytes::Bytes::from(artifact.config)), artifact::CONFIG_MEDIA_TYPE)
    } else if let Some(index) = layers.iter().position(|layer| hex::encode(layer.sha256) == hex) {
        let file = &at.files[index];
        (at.open.file_bytes(file).await?.source, "application/octet-stream")
    } else {
        // Not the artifact's: the image's config or one of its layers.
        let (image, image_layers) = state.image_and_layers(at).await?;
        if let Some(config) = image.config(digest) {
            (Arc::new(bytes::Bytes::copy_from_slice(config)), image::IMAGE_CONFIG_MEDIA_TYPE)
        } else {
            let index = image_layers
                .iter()
                .position(|layer| hex::encode(layer.sha256) == hex)
                .ok_or_else(|| OciError::BlobUnknown { name: name.to_owned(), digest: digest.to_owned() })?;
            let file = &at.files[index];
            let bytes = at.open.file_bytes(file).await?;
            let framing = LayerFraming::of(&file.path, file.size).expect("framed when its digest was computed");
            (Arc::new(TarLayer { framing, file: bytes.source }), image::LAYER_MEDIA_TYPE)
        }
    };
    let representation =
        Representation { source, etag, content_type, headers: vec![digest_header, immutable], guard: None };
    Ok(bytes_response(headers, head, representation, state.max_ranges).await?)
}
