//! The Hub API's listings of repositories and their files: model info, the model list with
//! its filters and pages, trees, paths-info and refs, each file with its LFS oid (its SHA-256)
//! and each directory with its tree oid.

use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::repos::{self, TreeEntry};
use super::{
    Caller, HubError, HubState, Query, RepoAt, TREE_PAGE, header_value, hub_date, is_true, json_response, origin,
    original_path,
};
use crate::access::Access;
use crate::catalog::Model;
use crate::service::{Listing, PublishedFile};

/// `GET /api/models/{repo}[/revision/{revision}]`: the repository's info; with `blobs`, each
/// file's size and LFS digest.
pub(super) async fn model_info(state: &HubState, at: &RepoAt, blobs: bool) -> Result<Response, HubError> {
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
pub(super) async fn tree(
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
pub(super) async fn list_models(
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
    let listing = state.service.listing();
    let listed = repositories_listed(state, &listing, &access, query);
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

/// The repositories `access` may read that `query` asks for (`author`, `search`, `filter`
/// tags), each once, in the order `sort` and `direction` ask.
fn repositories_listed(
    state: &HubState,
    listing: &Listing,
    access: &Access,
    query: &Query,
) -> Vec<(String, Arc<Model>)> {
    let author = query.get("author");
    let search = query.get("search").map(str::to_lowercase);
    let tags: Vec<&str> = query.0.iter().filter(|(k, _)| k == "filter").map(|(_, v)| v.as_str()).collect();
    let mut listed: Vec<(String, Arc<Model>)> = listing
        .models()
        .filter(|m| m.state.is_ok() && access.allows(&m.id))
        // Not listed until its signature lets it be served: refused, or still being checked.
        .filter(|m| listing.refusal(m).is_none())
        .filter(|m| !listing.signature(m).is_pending())
        .filter_map(|m| Some((repos::repo_id_of(&listing.repository_of(m), &state.namespace)?, Arc::clone(m))))
        .filter(|(repo, _)| author.is_none_or(|a| repo.split_once('/').is_some_and(|(namespace, _)| namespace == a)))
        .filter(|(repo, _)| search.as_ref().is_none_or(|s| repo.to_lowercase().contains(s.as_str())))
        .filter(|(_, model)| tags.iter().all(|t| repo_tags(model).contains(t)))
        .collect();
    // A repository of several models is listed once: as the model named after it, else as its
    // earliest (a directory of models published as their stored files).
    let joins_another = |model: &Model| listing.repository_of(model) != model.id;
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
    listed
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

/// `POST /api/models/{repo}/paths-info/{revision}`: the entries of the paths asked for that
/// exist (form or JSON: `paths`, `expand`).
pub(super) async fn paths_info(
    state: &HubState,
    at: &RepoAt,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, HubError> {
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
pub(super) fn refs(at: &RepoAt, include_prs: bool) -> Response {
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
