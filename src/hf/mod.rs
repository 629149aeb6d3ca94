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
mod repos;

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt as _;
use serde_json::{Value, json};

pub(crate) use self::error::HubError;
use self::repos::{HubRoute, TreeEntry};
use crate::access::{Access, Tokens, Verdict};
use crate::api::routes;
use crate::catalog::{Catalog, Model};
use crate::config::Config;
use crate::format::Manifest;
use crate::service::{DigestOf, PublishedFile, Service};
use crate::transport::Refusals;
use crate::transport::respond::{Representation, bytes_response};

/// Entries per page of a tree listing, as the Hub pages them.
const TREE_PAGE: usize = 1000;

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
    let state = Arc::new(HubState { service, tokens, namespace, limits });
    let router = Router::new().fallback(dispatch).with_state(state);
    let refusals = Refusals {
        panicked: || HubError::Internal("a handler panicked".into()).into_response(),
        timed_out: || HubError::RequestTimeout.into_response(),
    };
    let labels = crate::transport::RouteLabels { routes: &[], unmatched: route_label };
    crate::transport::with_common_layers(router, config, labels, refusals)
}

/// The label of a request below the prefix (its path without it): the JSON API, a file, or
/// anything else.
fn route_label(uri: &Uri) -> &'static str {
    let segments: Vec<&str> = uri.path().trim_start_matches('/').split('/').collect();
    match segments[..] {
        ["api", ..] => routes::HUB_API,
        [_, "resolve", _, _, ..] | [_, _, "resolve", _, _, ..] => routes::HUB_FILE,
        _ => routes::HUB,
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

async fn dispatch(
    State(state): State<Arc<HubState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    identity: Option<axum::Extension<Arc<crate::transport::ClientIdentity>>>,
    body: axum::body::Bytes,
) -> Response {
    let client = identity.as_ref().map(|identity| identity.names.as_slice());
    match answer(&state, &method, &uri, (&headers, client), &body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn answer(
    state: &Arc<HubState>,
    method: &Method,
    uri: &Uri,
    (headers, client): (&HeaderMap, Option<&[String]>),
    body: &[u8],
) -> Result<Response, HubError> {
    let segments = uri
        .path()
        .trim_start_matches('/')
        .split('/')
        .map(|s| percent_encoding::percent_decode_str(s).decode_utf8().map(|s| s.into_owned()))
        .collect::<Result<Vec<String>, _>>()
        .map_err(|e| HubError::BadRequest(format!("path is not valid percent-encoded UTF-8: {e}")))?;
    let catalog = state.service.catalog();
    let route = repos::route(&segments, |repo| state.model_id_of(&catalog, repo).is_some());
    let query = Query::of(uri);
    let caller = Caller::of(&state.tokens, headers, client)?;
    let only = |allowed: &'static str| {
        if allowed.split(", ").any(|m| m == method.as_str()) {
            Ok(())
        } else {
            Err(HubError::MethodNotAllowed { method: method.to_string(), allowed })
        }
    };
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
            paths_info(state, &at, headers, body).await
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
    catalog: Arc<Catalog>,
    /// The models whose files it holds ([`Catalog::members_of`]): one, or a directory's.
    members: Vec<(Arc<Model>, Arc<Manifest>)>,
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
        &self.members[0].0
    }
}

impl HubState {
    /// The model id of repository `repo` in `catalog`, if a model or a directory's models are
    /// published under it: the first of its readings ([`repos::model_ids_of`]) that is.
    fn model_id_of(&self, catalog: &Catalog, repo: &str) -> Option<String> {
        repos::model_ids_of(repo, &self.namespace)
            .into_iter()
            .find(|id| catalog.get(id).is_some() || !catalog.members_of(id, |_| true).is_empty())
    }

    /// Repository `repo` at `revision` (`None`: `main`), for `caller`.
    async fn repo_at(&self, caller: &Caller, repo: &str, revision: Option<&str>) -> Result<RepoAt, HubError> {
        let missing = || HubError::RepoNotFound { repo: repo.to_owned(), anonymous: caller.is_anonymous() };
        let access = caller.access().map_err(|_| missing())?;
        let catalog = self.service.catalog();
        let id = self
            .model_id_of(&catalog, repo)
            .or_else(|| repos::model_ids_of(repo, &self.namespace).into_iter().next())
            .ok_or_else(missing)?;
        let mut ids = catalog.members_of(&id, |m| access.allows(m));
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
            let (model, manifest, status) = self.service.servable_model(member).await?;
            signature.get_or_insert(status);
            let files = if catalog.shows_published_files(&id, &model) {
                self.service.publication().repository_files(&catalog, &model, &manifest)
            } else {
                self.service.publication().files_as_stored(&catalog, &model, &manifest)
            };
            listed.extend(files.into_iter().map(|f| (f, members.len())));
            members.push((model, manifest));
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
        Ok(RepoAt { repo: repo.to_owned(), catalog, members, files, owners, commit, pinned, signature })
    }

    /// The first `len` bytes (at most) of file `index` of `at`.
    async fn published_prefix(&self, at: &RepoAt, index: usize, len: u64) -> Result<Vec<u8>, HubError> {
        let (model, manifest) = &at.members[at.owners[index]];
        let file = &at.files[index];
        let bytes = self.service.publication().published_bytes(&at.catalog, model, manifest, &file.what).await?;
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
        let wait = self.service.hashing().wait(false);
        let (model, manifest) = &at.members[at.owners[index]];
        Ok(self.service.hashing().published_sha256(&at.catalog, model, manifest, &at.files[index], wait).await?)
    }

    /// The SHA-256 of each of the files `indices` of `at`, for a listing: waiting
    /// `digests.listing_wait_secs` at most.
    async fn sha256s(&self, at: &RepoAt, indices: &[usize]) -> Result<Vec<[u8; 32]>, HubError> {
        let wait = self.service.hashing().wait(true);
        let mut digests = vec![[0u8; 32]; indices.len()];
        for (member, (model, manifest)) in at.members.iter().enumerate() {
            let mine: Vec<usize> = (0..indices.len()).filter(|&i| at.owners[indices[i]] == member).collect();
            if mine.is_empty() {
                continue;
            }
            let files: Vec<&PublishedFile> = mine.iter().map(|&i| &at.files[indices[i]]).collect();
            let found = self
                .service
                .hashing()
                .published_sha256s(&at.catalog, model, manifest, &files, DigestOf::File, wait)
                .await?;
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

/// `GET /api/models/{repo}[/revision/{revision}]`: the repository's info; with `blobs`, each
/// file's size and LFS digest.
async fn model_info(state: &HubState, at: &RepoAt, blobs: bool) -> Result<Response, HubError> {
    let date = hub_date(at.model().found_at);
    let siblings: Vec<Value> = if blobs {
        let all: Vec<usize> = (0..at.files.len()).collect();
        let digests = state.sha256s(at, &all).await?;
        at.files
            .iter()
            .zip(digests)
            .map(|(file, digest)| {
                let (oid, pointer_size) = repos::lfs_pointer_oid(&digest, file.size);
                json!({
                    "rfilename": file.path,
                    "size": file.size,
                    "blobId": oid,
                    "lfs": { "sha256": hex::encode(digest), "size": file.size, "pointerSize": pointer_size },
                })
            })
            .collect()
    } else {
        at.files.iter().map(|f| json!({ "rfilename": f.path })).collect()
    };
    let mut info = json!({
        "_id": at.commit,
        "id": at.repo,
        "modelId": at.repo,
        "author": at.repo.split_once('/').map(|(namespace, _)| namespace),
        "sha": at.commit,
        "lastModified": date,
        "createdAt": date,
        "private": state.tokens.required(),
        "gated": false,
        "disabled": false,
        "downloads": 0,
        "likes": 0,
        "tags": repo_tags(at.model()),
        "library_name": Value::Null,
        "siblings": siblings,
        "usedStorage": at.files.iter().map(|f| f.size).sum::<u64>(),
    });
    if let Some(signature) = at.signature.as_ref().and_then(|s| s.to_json()) {
        info["signature"] = signature;
    }
    Ok(json_response(&info, &at.commit))
}

/// One file's entry in a tree or paths-info listing.
fn file_entry(at: &RepoAt, file: &PublishedFile, digest: &[u8; 32], expand: bool) -> Value {
    let (oid, pointer_size) = repos::lfs_pointer_oid(digest, file.size);
    let mut entry = json!({
        "type": "file",
        "oid": oid,
        "size": file.size,
        "path": file.path,
        "lfs": { "oid": hex::encode(digest), "size": file.size, "pointerSize": pointer_size },
    });
    if expand {
        entry["lastCommit"] = last_commit(at);
    }
    entry
}

fn directory_entry(at: &RepoAt, path: &str, expand: bool) -> Value {
    let mut entry =
        json!({ "type": "directory", "oid": repos::directory_oid(&at.commit, path), "size": 0, "path": path });
    if expand {
        entry["lastCommit"] = last_commit(at);
    }
    entry
}

fn last_commit(at: &RepoAt) -> Value {
    json!({
        "id": at.commit,
        "title": format!("model version {}", crate::service::version_token(at.model())),
        "date": hub_date(at.model().found_at),
    })
}

/// The entries of `entries` (of `at`) as JSON, computing the digests of their files.
async fn entries_json(
    state: &HubState,
    at: &RepoAt,
    entries: &[TreeEntry],
    expand: bool,
) -> Result<Vec<Value>, HubError> {
    let files: Vec<usize> = entries
        .iter()
        .filter_map(|e| match e {
            TreeEntry::File(index) => Some(*index),
            TreeEntry::Directory(_) => None,
        })
        .collect();
    let mut digests = state.sha256s(at, &files).await?.into_iter();
    Ok(entries
        .iter()
        .map(|entry| match entry {
            TreeEntry::File(index) => {
                let digest = digests.next().expect("one digest per file");
                file_entry(at, &at.files[*index], &digest, expand)
            }
            TreeEntry::Directory(path) => directory_entry(at, path, expand),
        })
        .collect())
}

/// `GET /api/models/{repo}/tree/{revision}[/{path}]`: the files and directories below `path`
/// (every one below it when `recursive`), a page of [`TREE_PAGE`] at a time with a `Link` to the
/// next page.
async fn tree(
    state: &HubState,
    at: &RepoAt,
    path: &str,
    query: &Query,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<Response, HubError> {
    let entries =
        repos::tree(at.files.iter().map(|f| f.path.as_str()), path, query.flag("recursive")).ok_or_else(|| {
            HubError::EntryNotFound { repo: at.repo.clone(), path: path.to_owned(), commit: at.commit.clone() }
        })?;
    let start = match query.get("cursor") {
        None | Some("") => 0,
        Some(cursor) => cursor_start(cursor, &at.commit).ok_or_else(|| {
            HubError::BadRequest(format!("cursor {cursor:?} is not one this listing gave, or its revision has changed"))
        })?,
    };
    let end = (start + TREE_PAGE).min(entries.len());
    let page = entries.get(start..end).unwrap_or_default();
    let listed = entries_json(state, at, page, query.flag("expand")).await?;
    let mut response = json_response(&Value::Array(listed), &at.commit);
    if end < entries.len() {
        let link = next_page_link(headers, uri, query, &format!("{}.{end}", at.commit));
        response.headers_mut().insert(header::LINK, link);
    }
    Ok(response)
}

/// The `Link` header of a listing's next page: the same request with `cursor` set, as an
/// absolute URL (clients follow it as it is).
fn next_page_link(headers: &HeaderMap, uri: &Uri, query: &Query, cursor: &str) -> HeaderValue {
    let mut next = form_urlencoded::Serializer::new(String::new());
    for (key, value) in query.0.iter().filter(|(k, _)| k != "cursor") {
        next.append_pair(key, value);
    }
    next.append_pair("cursor", cursor);
    header_value(&format!("<{}{}?{}>; rel=\"next\"", origin(headers), original_path(uri), next.finish()))
}

/// Repositories per page of the model list, the Hub's largest `limit`.
const MODELS_PAGE: usize = 1000;

/// `GET /api/models`: every repository the caller may read, as `HfApi.list_models` asks:
/// `author` (the namespace), `search` (a substring of the repo id, any case), `filter` (tags,
/// all of which must match), `sort` (`lastModified` or `createdAt` by date; the Hub's counts,
/// `downloads`, `likes` and `trendingScore`, are 0 here, so by id) with `direction=-1` for
/// descending, `limit` per page (at most [`MODELS_PAGE`]) and `cursor` from the previous page's
/// `Link`. `full` (or `expand`) adds each repository's files and commit.
async fn list_models(
    state: &HubState,
    caller: &Caller,
    query: &Query,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<Response, HubError> {
    let access = caller.access().map_err(|_| HubError::TokenRequired)?;
    if !state.service.is_ready() {
        return Err(crate::service::ServiceError::NotReady.into());
    }
    let limit = match query.get("limit") {
        None => MODELS_PAGE,
        Some(limit) => limit
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .map(|n| n.min(MODELS_PAGE))
            .ok_or_else(|| HubError::BadRequest(format!("limit {limit:?} is not a positive whole number")))?,
    };
    let start = match query.get("cursor") {
        None | Some("") => 0,
        Some(cursor) => cursor
            .parse::<usize>()
            .map_err(|_| HubError::BadRequest(format!("cursor {cursor:?} is not one this listing gave")))?,
    };
    let author = query.get("author");
    let search = query.get("search").map(str::to_lowercase);
    let tags: Vec<&str> = query.0.iter().filter(|(k, _)| k == "filter").map(|(_, v)| v.as_str()).collect();
    let catalog = state.service.catalog();
    let mut listed: Vec<(String, Arc<Model>)> = catalog
        .models()
        .filter(|m| m.state.is_ok() && access.allows(&m.id))
        // Not listed until its signature lets it be served: refused, or still being checked.
        .filter(|m| state.service.signatures().refusal(&catalog, m).is_none())
        .filter(|m| !state.service.signatures().status(&catalog, m).is_pending())
        .filter_map(|m| Some((repos::repo_id_of(&catalog.repository_of(m), &state.namespace)?, Arc::clone(m))))
        .filter(|(repo, _)| author.is_none_or(|a| repo.split_once('/').is_some_and(|(namespace, _)| namespace == a)))
        .filter(|(repo, _)| search.as_ref().is_none_or(|s| repo.to_lowercase().contains(s.as_str())))
        .filter(|(_, model)| tags.iter().all(|t| repo_tags(model).contains(t)))
        .collect();
    // A repository of several models is listed once: as the model named after it, else as its
    // earliest (a directory of models published as their stored files).
    let joins_another = |model: &Model| catalog.repository_of(model) != model.id;
    listed.sort_by(|a, b| {
        a.0.cmp(&b.0)
            .then_with(|| joins_another(&a.1).cmp(&joins_another(&b.1)))
            .then_with(|| a.1.found_at.cmp(&b.1.found_at))
    });
    listed.dedup_by(|later, first| later.0 == first.0);
    match query.get("sort") {
        Some("lastModified" | "last_modified" | "createdAt" | "created_at") => {
            listed.sort_by(|a, b| a.1.found_at.cmp(&b.1.found_at).then_with(|| a.0.cmp(&b.0)))
        }
        _ => listed.sort_by(|a, b| a.0.cmp(&b.0)),
    }
    if query.get("direction") == Some("-1") {
        listed.reverse();
    }
    let full = query.flag("full") || query.get("expand").is_some();
    let end = (start + limit).min(listed.len());
    let mut page = Vec::with_capacity(end.saturating_sub(start));
    for (repo, model) in listed.get(start..end).unwrap_or_default() {
        let date = hub_date(model.found_at);
        let mut entry = json!({
            "_id": repo,
            "id": repo,
            "modelId": repo,
            "author": repo.split_once('/').map(|(namespace, _)| namespace),
            "private": state.tokens.required(),
            "downloads": 0,
            "likes": 0,
            "tags": repo_tags(model),
            "library_name": Value::Null,
            "createdAt": date,
            "lastModified": date,
        });
        if full {
            let at = state.repo_at(caller, repo, None).await?;
            entry["sha"] = json!(at.commit);
            entry["siblings"] = at.files.iter().map(|f| json!({ "rfilename": f.path })).collect();
        }
        page.push(entry);
    }
    let mut response = axum::Json(Value::Array(page)).into_response();
    if end < listed.len() {
        response.headers_mut().insert(header::LINK, next_page_link(headers, uri, query, &end.to_string()));
    }
    Ok(response)
}

/// The tags of the repository of `model`: the format of the weights it holds, as the Hub tags
/// them.
fn repo_tags(model: &Model) -> [&'static str; 1] {
    [model.container.map_or("safetensors", crate::format::Container::published_weights_format)]
}

/// Where the next page starts, from a cursor this listing gave (`{commit}.{offset}`) for the
/// same commit.
fn cursor_start(cursor: &str, commit: &str) -> Option<usize> {
    let (of, offset) = cursor.split_once('.')?;
    (of == commit).then(|| offset.parse().ok()).flatten()
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

/// `POST /api/models/{repo}/paths-info/{revision}`: the entries of the paths asked for that
/// exist (form or JSON: `paths`, `expand`).
async fn paths_info(state: &HubState, at: &RepoAt, headers: &HeaderMap, body: &[u8]) -> Result<Response, HubError> {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/json"));
    let (paths, expand) = if is_json {
        #[derive(serde::Deserialize)]
        struct Asked {
            paths: Vec<String>,
            #[serde(default)]
            expand: bool,
        }
        let asked: Asked = serde_json::from_slice(body).map_err(|e| {
            HubError::BadRequest(format!("paths-info takes {{\"paths\": [...], \"expand\": bool}}: {e}"))
        })?;
        (asked.paths, asked.expand)
    } else {
        let pairs: Vec<(String, String)> = form_urlencoded::parse(body).into_owned().collect();
        let paths = pairs.iter().filter(|(k, _)| k == "paths").map(|(_, v)| v.clone()).collect();
        (paths, pairs.iter().any(|(k, v)| k == "expand" && is_true(v)))
    };
    let all = repos::tree(at.files.iter().map(|f| f.path.as_str()), "", true).unwrap_or_default();
    let entry_path = |entry: &TreeEntry| match entry {
        TreeEntry::File(index) => at.files[*index].path.clone(),
        TreeEntry::Directory(path) => path.clone(),
    };
    let mut found: Vec<TreeEntry> = Vec::new();
    for path in paths.iter().map(|p| p.trim_matches('/')) {
        if let Some(entry) = all.iter().find(|e| entry_path(e) == path) {
            if !found.contains(entry) {
                found.push(entry.clone());
            }
        }
    }
    let listed = entries_json(state, at, &found, expand).await?;
    Ok(json_response(&Value::Array(listed), &at.commit))
}

/// `GET /api/models/{repo}/refs`: the one branch, `main`, at the repository's commit, and no
/// tags or conversions (`include_prs` adds the empty list of pull requests). llama.cpp's `-hf`
/// asks it first, for the commit whose tree it then lists.
fn refs(at: &RepoAt, include_prs: bool) -> Response {
    let mut refs = json!({
        "branches": [{ "name": "main", "ref": "refs/heads/main", "targetCommit": at.commit }],
        "converts": [],
        "tags": [],
    });
    if include_prs {
        refs["pullRequests"] = json!([]);
    }
    json_response(&refs, &at.commit)
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
    let (model, manifest) = &at.members[at.owners[index]];
    let bytes = state.service.hashing().published_file_bytes(&at.catalog, model, manifest, file).await?;
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
