//! The Hugging Face Hub's read API over the service, so `huggingface_hub` (and through it
//! transformers, vLLM, SGLang, `hf download`) loads models from ztserve with
//! `HF_ENDPOINT=http://HOST:PORT/hf`: the model list, model info, refs, trees, paths-info and
//! `resolve`, llama.cpp's model file of a quantization tag (and the empty agent-harness registry
//! clients ask for). Each model is a repository ([`repos`]: ids map to repo ids without
//! collisions) holding its companions and its weights as safetensors (stored `.zt` files are
//! not listed, so a snapshot does not fetch the weights twice), except models published as
//! their stored files: a directory of those is one repository
//! ([`Catalog::repository_of`]), as the Hub holds a model's quantizations. A revision is a model version: `main` is the current one,
//! its commit id is derived from every file's version, and a `resolve` of `main` redirects to
//! the commit, so a download never mixes versions. Every file is an LFS file whose oid and
//! ETag are the SHA-256 of its bytes. Access uses the existing tokens as bearer tokens, with
//! the Hub's 401/404 meanings; errors are [`error`]'s.

mod error;
mod listings;
mod repos;

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt as _;
use serde_json::{Value, json};

pub(crate) use self::error::HubError;
use self::listings::{list_models, model_info, paths_info, refs, tree};
use self::repos::HubRoute;
use crate::access::{Access, Tokens, Verdict};
use crate::api::routes;
use crate::catalog::Model;
use crate::config::Config;
use crate::service::{DigestOf, Listing, OpenModel, PublishedFile, Service};
use crate::transport::prefixed::{self, Grammar, PrefixedRequest};
use crate::transport::respond::{Representation, bytes_response};

/// Entries per page of a tree listing, as the Hub pages them.
const TREE_PAGE: usize = 1000;

/// The largest paths-info body read (axum's default body limit, which bounded it before).
const PATHS_INFO_MAX_BYTES: usize = 2 << 20;

pub(crate) use repos::is_namespace;

/// What every handler shares.
struct HubState {
    service: Arc<Service>,
    tokens: Arc<Tokens>,
    /// The namespace of the repositories of models at the top of a source.
    namespace: String,
    limits: crate::config::Limits,
}

/// The Hub API's router (mounted at [`routes::HUB`] by the server), over `service`, checking
/// `tokens`, as `config` says.
pub(crate) fn app(service: Arc<Service>, tokens: Arc<Tokens>, config: &Config) -> Router {
    let namespace = config.serving.hub_namespace.clone();
    let limits = config.limits.clone();
    prefixed::app(Arc::new(HubState { service, tokens, namespace, limits }), config)
}

impl Grammar for HubState {
    type Error = HubError;

    async fn answer(self: Arc<Self>, request: PrefixedRequest, body: Body) -> Result<Response, HubError> {
        answer(&self, &request, body).await
    }

    /// The JSON API, a file, or anything else.
    fn route_label(uri: &Uri) -> &'static str {
        let segments: Vec<&str> = uri.path().trim_start_matches('/').split('/').collect();
        match segments[..] {
            ["api", ..] => routes::HUB_API,
            [_, "resolve", _, _, ..] | [_, _, "resolve", _, _, ..] => routes::HUB_FILE,
            _ => routes::HUB,
        }
    }

    fn panicked() -> Response {
        HubError::Internal("a handler panicked".into()).into_response()
    }

    fn timed_out() -> Response {
        HubError::RequestTimeout.into_response()
    }
}

/// Who is asking: the verdict on its token. One without a token, where tokens are needed, is
/// refused only where it asks for a repository (every one answers as a missing one, 401) or a
/// listing; a token not accepted is refused at once.
struct Caller(Verdict);

impl Caller {
    fn of(tokens: &Tokens, headers: &HeaderMap, client: Option<&[String]>) -> Result<Caller, HubError> {
        let verdict = tokens.verdict(crate::access::bearer(headers), client);
        if let Verdict::Invalid = verdict {
            verdict.access().map_err(|_| HubError::InvalidCredentials)?;
        }
        Ok(Caller(verdict))
    }

    /// What it may read, or the refusal (counted).
    fn access(&self) -> Result<Access, crate::access::Refused> {
        self.0.access()
    }

    fn is_anonymous(&self) -> bool {
        matches!(self.0, Verdict::Missing)
    }
}

async fn answer(state: &Arc<HubState>, request: &PrefixedRequest, body: Body) -> Result<Response, HubError> {
    let (method, uri, headers) = (&request.method, &request.uri, &request.headers);
    let segments = uri
        .path()
        .trim_start_matches('/')
        .split('/')
        .map(|s| percent_encoding::percent_decode_str(s).decode_utf8().map(|s| s.into_owned()))
        .collect::<Result<Vec<String>, _>>()
        .map_err(|e| HubError::BadRequest(format!("path is not valid percent-encoded UTF-8: {e}")))?;
    let listing = state.service.listing();
    let route = repos::route(&segments, |repo| state.model_id_of(&listing, repo).is_some());
    let query = Query::of(uri);
    let caller = Caller::of(&state.tokens, headers, request.client_names())?;
    let only = |allowed| request.only(allowed, |method, allowed| HubError::MethodNotAllowed { method, allowed });
    match route {
        HubRoute::Info { repo, revision } => {
            only("GET")?;
            let at = state.repo_at(&caller, &repo, revision.as_deref()).await?;
            model_info(state, &at, query.flag("blobs")).await
        }
        HubRoute::Tree { repo, revision, path } => {
            only("GET")?;
            let at = state.repo_at(&caller, &repo, Some(&revision)).await?;
            tree(state, &at, &path, &query, uri, headers).await
        }
        HubRoute::PathsInfo { repo, revision } => {
            only("POST")?;
            let at = state.repo_at(&caller, &repo, Some(&revision)).await?;
            let body = axum::body::to_bytes(body, PATHS_INFO_MAX_BYTES)
                .await
                .map_err(|e| HubError::BadRequest(format!("paths-info takes a body of at most 2 MiB: {e}")))?;
            paths_info(state, &at, headers, &body).await
        }
        HubRoute::QuantizationManifest { repo, tag } => {
            only("GET")?;
            let at = state.repo_at(&caller, &repo, None).await?;
            quantization_manifest(&at, &tag)
        }
        HubRoute::SafetensorsMetadata { repo, path } => {
            only("GET")?;
            let at = state.repo_at(&caller, &repo, None).await?;
            safetensors_metadata(state, &at, &path).await
        }
        HubRoute::Refs { repo } => {
            only("GET")?;
            let at = state.repo_at(&caller, &repo, None).await?;
            Ok(refs(&at, query.flag("include_prs")))
        }
        HubRoute::Resolve { repo, revision, path } => {
            only("GET, HEAD")?;
            let at = state.repo_at(&caller, &repo, Some(&revision)).await?;
            resolve(state, &at, &path, method == Method::HEAD, headers).await
        }
        HubRoute::ListModels => {
            only("GET")?;
            list_models(state, &caller, &query, uri, headers).await
        }
        HubRoute::AgentHarnesses => {
            only("GET")?;
            // What a Hub that knows no harnesses answers: the client then detects no agent,
            // and keeps the answer a day.
            Ok(axum::Json(json!({ "standardEnvVars": [], "harnesses": {} })).into_response())
        }
        HubRoute::OtherRepoType { repo } => Err(HubError::RepoNotFound { repo, anonymous: caller.is_anonymous() }),
        HubRoute::NotServed(what) => Err(HubError::NotServed(what)),
        HubRoute::Unknown => Err(HubError::RouteNotFound(uri.path().to_owned())),
    }
}

/// A repository at the revision a request names.
struct RepoAt {
    repo: String,
    /// The models whose files it holds ([`Listing::members_of`]): one, or a directory's, each
    /// opened for the request.
    members: Vec<OpenModel>,
    /// Its files, sorted by path.
    files: Vec<PublishedFile>,
    /// The member each file is of.
    owners: Vec<usize>,
    commit: String,
    /// Whether the request named the commit (rather than `main`).
    pinned: bool,
    /// The signature of its first member, as its source's policy checked it.
    signature: Option<crate::service::SignatureStatus>,
}

impl RepoAt {
    /// The index of the file at `path`.
    fn file(&self, path: &str) -> Result<usize, HubError> {
        self.files.binary_search_by(|f| f.path.as_str().cmp(path)).map_err(|_| HubError::EntryNotFound {
            repo: self.repo.clone(),
            path: path.to_owned(),
            commit: self.commit.clone(),
        })
    }

    /// The model the repository is named after, or the first model of its directory.
    fn model(&self) -> &Arc<Model> {
        self.members[0].model()
    }
}

impl HubState {
    /// The model id of repository `repo` in `catalog`, if a model or a directory's models are
    /// published under it: the first of its readings ([`repos::model_ids_of`]) that is.
    fn model_id_of(&self, listing: &Listing, repo: &str) -> Option<String> {
        repos::model_ids_of(repo, &self.namespace)
            .into_iter()
            .find(|id| listing.get(id).is_some() || !listing.members_of(id, |_| true).is_empty())
    }

    /// Repository `repo` at `revision` (`None`: `main`), for `caller`.
    async fn repo_at(&self, caller: &Caller, repo: &str, revision: Option<&str>) -> Result<RepoAt, HubError> {
        let missing = || HubError::RepoNotFound { repo: repo.to_owned(), anonymous: caller.is_anonymous() };
        let access = caller.access().map_err(|_| missing())?;
        let listing = self.service.listing();
        let id = self
            .model_id_of(&listing, repo)
            .or_else(|| repos::model_ids_of(repo, &self.namespace).into_iter().next())
            .ok_or_else(missing)?;
        let mut ids = listing.members_of(&id, |m| access.allows(m));
        if ids.is_empty() {
            if self.service.is_ready() || !access.allows(&id) {
                return Err(missing());
            }
            // Not ready yet: the model named answers why.
            ids.push(id.clone());
        }
        tracing::Span::current().record("model", id.as_str());
        let mut members = Vec::with_capacity(ids.len());
        let mut signature = None;
        let mut listed: Vec<(PublishedFile, usize)> = Vec::new();
        for member in &ids {
            let open = listing.open(member).await?;
            signature.get_or_insert_with(|| open.signature().clone());
            let files = if listing.shows_published_files(&id, open.model()) {
                open.repository_files()
            } else {
                open.files_as_stored()
            };
            listed.extend(files.into_iter().map(|f| (f, members.len())));
            members.push(open);
        }
        // A file beside several models (a README) is listed once, as the first member's (the
        // model named after the directory, when there is one).
        listed.sort_by(|a, b| a.0.path.cmp(&b.0.path));
        listed.dedup_by(|later, first| later.0.path == first.0.path);
        let (files, owners): (Vec<PublishedFile>, Vec<usize>) = listed.into_iter().unzip();
        let commit = repos::commit_of(files.iter().map(|f| (f.path.as_str(), f.etag.as_str())));
        let pinned = match revision {
            None | Some("main") => false,
            Some(named) if named == commit => true,
            Some(other) => {
                return Err(HubError::RevisionNotFound { repo: repo.to_owned(), revision: other.to_owned() });
            }
        };
        Ok(RepoAt { repo: repo.to_owned(), members, files, owners, commit, pinned, signature })
    }

    /// The first `len` bytes (at most) of file `index` of `at`.
    async fn published_prefix(&self, at: &RepoAt, index: usize, len: u64) -> Result<Vec<u8>, HubError> {
        let bytes = at.members[at.owners[index]].published_bytes(&at.files[index]).await?;
        let end = len.min(bytes.source.len());
        let mut read = Vec::with_capacity(end as usize);
        let mut stream = bytes.source.open(0..end);
        while let Some(piece) = stream.next().await {
            read.extend_from_slice(&piece?);
        }
        Ok(read)
    }

    /// The SHA-256 of file `index` of `at`, waiting `digests.file_wait_ms` at most.
    async fn sha256(&self, at: &RepoAt, index: usize) -> Result<[u8; 32], HubError> {
        Ok(at.members[at.owners[index]].sha256(&at.files[index]).await?)
    }

    /// The SHA-256 of each of the files `indices` of `at`, for a listing: waiting
    /// `digests.listing_wait_secs` at most.
    async fn sha256s(&self, at: &RepoAt, indices: &[usize]) -> Result<Vec<[u8; 32]>, HubError> {
        let mut digests = vec![[0u8; 32]; indices.len()];
        for (member, open) in at.members.iter().enumerate() {
            let mine: Vec<usize> = (0..indices.len()).filter(|&i| at.owners[indices[i]] == member).collect();
            if mine.is_empty() {
                continue;
            }
            let files: Vec<&PublishedFile> = mine.iter().map(|&i| &at.files[indices[i]]).collect();
            let found = open.sha256s(&files, DigestOf::File).await?;
            for (i, digest) in mine.into_iter().zip(found) {
                digests[i] = digest;
            }
        }
        Ok(digests)
    }
}

/// The query's parameters.
struct Query(Vec<(String, String)>);

impl Query {
    fn of(uri: &Uri) -> Query {
        Query(form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()).into_owned().collect())
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// A boolean parameter, as Python writes one (`True`) or as JavaScript does (`true`).
    fn flag(&self, name: &str) -> bool {
        self.get(name).is_some_and(is_true)
    }
}

fn is_true(value: &str) -> bool {
    matches!(value, "1" | "true" | "True")
}

/// A time as the Hub writes one (`2024-05-01T12:00:00.000Z`).
fn hub_date(at: std::time::SystemTime) -> String {
    let t = time::OffsetDateTime::from(at);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

fn json_response(value: &Value, commit: &str) -> Response {
    let mut response = axum::Json(value).into_response();
    response.headers_mut().insert(HeaderName::from_static("x-repo-commit"), header_value(commit));
    response
}

fn header_value(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// The scheme and host a client reached the server at (a proxy's `X-Forwarded-Proto` honoured),
/// for links it must follow as they are.
fn origin(headers: &HeaderMap) -> String {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let scheme = text("x-forwarded-proto").filter(|p| matches!(*p, "http" | "https")).unwrap_or("http");
    format!("{scheme}://{}", text("host").unwrap_or("localhost"))
}

/// The path as the client sent it, the API's prefix included.
fn original_path(uri: &Uri) -> String {
    format!("{}{}", routes::HUB, uri.path())
}

/// `GET /v2/{repo}/manifests/{tag}`: the model file of quantization `tag` (`latest`: llama.cpp's
/// default choice) as `ggufFile`, and the repository's multimodal projector as `mmprojFile`,
/// which llama.cpp releases before its tree listing ask for (the Hub's answer to the
/// `llama-cpp` user agent); 404 `EntryNotFound` when no model file has that tag.
fn quantization_manifest(at: &RepoAt, tag: &str) -> Result<Response, HubError> {
    let paths: Vec<&str> = at.files.iter().map(|f| f.path.as_str()).collect();
    let entry = |index: usize| json!({ "rfilename": at.files[index].path, "size": at.files[index].size });
    let Some(model) = crate::format::file_of_quantization_tag(&paths, tag) else {
        let path = format!("a model file of quantization tag {tag}");
        return Err(HubError::EntryNotFound { repo: at.repo.clone(), path, commit: at.commit.clone() });
    };
    let mut manifest = json!({ "ggufFile": entry(model) });
    if let Some(mmproj) = crate::format::projector_file(&paths) {
        manifest["mmprojFile"] = entry(mmproj);
    }
    Ok(json_response(&manifest, &at.commit))
}

/// The most bytes of a checkpoint's index read to answer its metadata (an index of a million
/// tensors is about 100 MB).
const MAX_INDEX_BYTES: u64 = 256 << 20;

/// `GET /api/models/{repo}/safetensors-metadata/{path}`, as `HfApi.get_sharded_safetensors_metadata`
/// reads it: `index`, the index at `path` without its `weight_map` (which repeats the headers'
/// tensor names), and `headers`, each shard's header JSON by the name the weight map gives it.
async fn safetensors_metadata(state: &HubState, at: &RepoAt, path: &str) -> Result<Response, HubError> {
    // The Hub answers a path that holds no index as one that holds no file.
    let not_an_index =
        || HubError::EntryNotFound { repo: at.repo.clone(), path: path.to_owned(), commit: at.commit.clone() };
    if !path.ends_with(crate::format::FileKind::SAFETENSORS_INDEX_SUFFIX) {
        return Err(not_an_index());
    }
    let index_bytes = state.published_prefix(at, at.file(path)?, MAX_INDEX_BYTES).await?;
    let mut index: serde_json::Map<String, Value> = serde_json::from_slice(&index_bytes).map_err(|_| not_an_index())?;
    let shards: BTreeSet<String> = match index.remove("weight_map") {
        Some(Value::Object(map)) => map.values().filter_map(|v| v.as_str().map(str::to_owned)).collect(),
        _ => return Err(not_an_index()),
    };
    let directory = path.rfind('/').map_or("", |slash| &path[..=slash]);
    let max_header = state.limits.max_manifest_bytes;
    let mut headers = serde_json::Map::with_capacity(shards.len());
    let mut reads = futures_util::stream::iter(shards.into_iter().map(|shard| async move {
        let file = at.file(&format!("{directory}{shard}"))?;
        let length = state.published_prefix(at, file, 8).await?;
        let length = <[u8; 8]>::try_from(&length[..])
            .map(u64::from_le_bytes)
            .map_err(|_| HubError::Internal(format!("shard {shard:?} is shorter than a safetensors header")))?;
        // Every published safetensors file was parsed or built by the server: a header that
        // does not read is the server's fault.
        if length > max_header || 8 + length > at.files[file].size {
            return Err(HubError::Internal(format!("shard {shard:?} declares a header of {length} bytes")));
        }
        let header = state.published_prefix(at, file, 8 + length).await?;
        let header: Value = serde_json::from_slice(&header[8..])
            .map_err(|e| HubError::Internal(format!("shard {shard:?} has no JSON header: {e}")))?;
        Ok::<_, HubError>((shard, header))
    }))
    .buffer_unordered(8);
    while let Some(read) = reads.next().await {
        let (shard, header) = read?;
        headers.insert(shard, header);
    }
    Ok(json_response(&json!({ "index": index, "headers": headers }), &at.commit))
}

/// `GET|HEAD /{repo}/resolve/{revision}/{path}`: at `main`, a redirect to the same file at the
/// commit (so the bytes of one download all come from one version); at the commit, the file's
/// bytes with ranges, its SHA-256 as `ETag` and `X-Linked-Etag`, `X-Linked-Size` and
/// `X-Repo-Commit`.
async fn resolve(
    state: &HubState,
    at: &RepoAt,
    path: &str,
    head: bool,
    headers: &HeaderMap,
) -> Result<Response, HubError> {
    let index = at.file(path)?;
    let file = &at.files[index];
    let commit = (HeaderName::from_static("x-repo-commit"), header_value(&at.commit));
    if !at.pinned {
        let encoded: Vec<String> = path.split('/').map(crate::api::segment).collect();
        let location = format!("{}/{}/resolve/{}/{}", routes::HUB, at.repo, at.commit, encoded.join("/"));
        return Ok((
            StatusCode::FOUND,
            [
                (header::LOCATION, header_value(&location)),
                commit,
                (header::CACHE_CONTROL, crate::transport::respond::REVALIDATE),
            ],
        )
            .into_response());
    }
    let digest = state.sha256(at, index).await?;
    let bytes = at.members[at.owners[index]].file_bytes(file).await?;
    let etag = format!("\"{}\"", hex::encode(digest));
    let representation = Representation {
        source: bytes.source,
        etag: etag.clone(),
        content_type: crate::format::view::media_type(path),
        headers: vec![
            commit,
            (HeaderName::from_static("x-linked-etag"), header_value(&etag)),
            (HeaderName::from_static("x-linked-size"), HeaderValue::from(file.size)),
            (header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=31536000, immutable")),
        ],
        guard: None,
    };
    Ok(bytes_response(headers, head, representation, state.limits.max_ranges).await?)
}
