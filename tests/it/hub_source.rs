//! Hub repositories as a source, with real parts: a ztserve is the Hub (its `/hf` over a local
//! directory of the loader corpus), and a second ztserve serves each of its repositories
//! through an `hf://` source and a disk cache. Eight clients load every file of every model
//! from the second, which is restarted and loaded from again; the origin's own metric of file
//! bytes sent shows each file sent once. Then the origin stops, and the models still load from
//! the cache, before and after another restart; so does a sharded checkpoint whose tensors alone
//! were read, its index parsed again from the cache. `huggingface_hub` loads the second's own `/hf`,
//! every tensor compared with the official readers' bytes. A fake Hub answers rate limits,
//! 5xx, missing and gated repositories: what is worth retrying is retried with backoff, the
//! rest refuses the source with the Hub's own code and message; when `main` moves, the model
//! version changes only if a file did, and a source pinned to a commit keeps its bytes.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;

use common::corpus::{hub_clients, hub_repos, only_viewable, write_hub_corpus};
use common::{RunningServer, last_line, prefetch, request_async, start_binary, stop_gracefully};
use futures_util::future::join_all;
use serde_json::{Value, json};

/// The sum of a series of the server at `address`'s `/metrics` whose labels include `labels`.
async fn scraped(address: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let text = String::from_utf8(request_async(address, "/metrics", &[]).await.body).unwrap();
    text.lines()
        .filter(|line| line.starts_with(&format!("{name}{{")) || line.starts_with(&format!("{name} ")))
        .filter(|line| labels.iter().all(|(k, v)| line.contains(&format!("{k}=\"{v}\""))))
        .map(|line| line.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// File bytes the origin has sent (bodies of `resolve`).
async fn origin_file_bytes(origin: &str) -> f64 {
    scraped(origin, "ztserve_http_response_body_bytes_total", &[("route", ztserve::api::routes::HUB_FILE)]).await
}

/// Every file of each repository at the origin (`/hf` tree at `main`): path and bytes.
/// `plan_repos` gives each repository's model id.
async fn origin_files(origin: &str, plan_repos: &Value) -> BTreeMap<String, BTreeMap<String, Vec<u8>>> {
    let mut files = BTreeMap::new();
    for (repo, planned) in plan_repos.as_object().unwrap() {
        let tree = request_async(origin, &format!("/hf/api/models/{repo}/tree/main?recursive=true"), &[]).await;
        assert_eq!(tree.status, 200, "{repo}: {}", tree.head);
        let mut held = BTreeMap::new();
        for entry in tree.json().as_array().unwrap().iter().filter(|e| e["type"] == "file") {
            let path = entry["path"].as_str().unwrap().to_owned();
            // The origin's own file route for its stored files and companions; the view for the
            // rest (a `.zt` model's `model.safetensors`). Neither is counted as a Hub file.
            let model = planned["id"].as_str().unwrap().replace('/', "%2F");
            let own = request_async(origin, &format!("/models/{model}/files/{}", path.replace('/', "%2F")), &[]).await;
            let bytes = if own.status == 200 {
                own.body
            } else {
                let view = request_async(origin, &format!("/models/{model}/{path}"), &[]).await;
                assert_eq!(view.status, 200, "{repo}/{path}: {}", view.head);
                view.body
            };
            assert_eq!(bytes.len() as u64, entry["size"].as_u64().unwrap(), "{repo}/{path}");
            held.insert(path, bytes);
        }
        files.insert(repo.clone(), held);
    }
    files
}

/// Eight clients at once, each fetching every file of every repository from `address`'s `/hf`
/// (at `main`, following the redirect to the commit as clients do), compared byte for byte.
async fn eight_clients_load(address: &str, files: &BTreeMap<String, BTreeMap<String, Vec<u8>>>) {
    let client = reqwest::Client::new();
    let loads = (0..8).map(|client_no| {
        let client = client.clone();
        async move {
            // Each client in its own order, so their requests overlap on different files.
            let mut all: Vec<(&String, &String, &Vec<u8>)> = files
                .iter()
                .flat_map(|(repo, held)| held.iter().map(move |(path, bytes)| (repo, path, bytes)))
                .collect();
            let first = client_no * all.len() / 8;
            all.rotate_left(first);
            for (repo, path, bytes) in all {
                let url = format!("http://{address}/hf/{repo}/resolve/main/{path}");
                let response = client.get(&url).send().await.unwrap();
                assert_eq!(response.status(), 200, "{url}");
                assert!(response.bytes().await.unwrap() == bytes[..], "{url}: bytes differ");
            }
        }
    });
    join_all(loads).await;
}

/// The second server, a process of its own: one `hf://` source per repository at `origin`, a
/// disk cache in `cache` of 1 MiB blocks; returned once it has listed its sources.
async fn start_hub_sourced(origin: &str, repos: &[String], cache: &Path) -> RunningServer {
    let mut args = vec!["serve".to_owned(), "--listen".into(), "127.0.0.1:0".into()];
    for repo in repos {
        args.extend(["--source".to_owned(), format!("hf://{repo}")]);
    }
    args.extend(["--cache-dir".to_owned(), cache.to_str().unwrap().to_owned()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let endpoint = format!("http://{origin}/hf");
    let envs = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("ZTSERVE_CACHE__BLOCK_BYTES", "1048576"),
        ("ZTSERVE_HUB_SOURCE__RETRIES", "1"),
    ];
    let server = start_binary(&args, &envs);
    // Listed once /readyz says more than "starting" (the listener opens before the first scan).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while request_async(&server.address, "/readyz", &[]).await.json()["status"] == "starting" {
        assert!(std::time::Instant::now() < deadline, "the second server never finished its first scan");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    server
}

/// Waits until every block the server at `address` has read is written to its disk cache (a
/// prefetch of each model ends when they are), and checks that each model is whole there.
async fn settle(address: &str, repos: &[String]) {
    for repo in repos {
        let reply = prefetch(address, &repo.replace('/', "%2F")).await;
        assert_eq!(reply.status, 200, "{repo}: {}", reply.head);
        let last = last_line(&reply.body);
        assert_eq!((last["done"].as_bool(), last["complete"].as_bool()), (Some(true), Some(true)), "{repo}: {last}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_repositories_load_through_the_cache_once_and_survive_their_origin() {
    let dir = tempfile::tempdir().unwrap();
    let (work, models) = (dir.path().join("work"), dir.path().join("models"));
    let expected = write_hub_corpus(&work, &models);
    let (mut plan_repos, _) = hub_repos(&models, &expected);
    let models_arg = models.to_str().unwrap().to_owned();
    let mut origin: RunningServer = start_binary(&["serve", "--source", &models_arg, "--listen", "127.0.0.1:0"], &[]);
    let origin_address = origin.address.clone();
    let tensors = only_viewable(&origin_address, &mut plan_repos).await;
    let repos: Vec<String> = plan_repos.as_object().unwrap().keys().cloned().collect();
    assert_eq!(repos.len(), 9, "{repos:?}");
    let files = origin_files(&origin_address, &plan_repos).await;
    let file_bytes: usize = files.values().flat_map(|held| held.values()).map(Vec::len).sum();

    // The second server: each repository is the model of its repo id, with its companions.
    let cache = dir.path().join("cache");
    let sent_before = origin_file_bytes(&origin_address).await;
    let mut second = start_hub_sourced(&origin_address, &repos, &cache).await;
    let listed = request_async(&second.address, "/models", &[]).await.json();
    let ids: Vec<&str> = listed["models"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, repos.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(listed["models"].as_array().unwrap().iter().all(|m| m["status"] == "ok"), "{listed}");

    eight_clients_load(&second.address, &files).await;
    // A real client on the second's own Hub API: every tensor as the official readers read it.
    let plan = json!({
        "endpoint": format!("http://{}/hf", second.address),
        "cache": dir.path().join("hub-cache"),
        "repos": plan_repos,
    });
    let plan_path = dir.path().join("plan.json");
    std::fs::write(&plan_path, serde_json::to_vec(&plan).unwrap()).unwrap();
    let loaded: Value = hub_clients("hub-2.4.0", "snapshot", &plan_path).await;
    assert_eq!(loaded["tensors"], tensors, "{loaded}");
    // The second's Hub API gives each file the digest the origin listed, and hashed nothing to
    // know it (so a model from a Hub is listed without fetching all its bytes first).
    for (repo, held) in &files {
        let tree =
            request_async(&second.address, &format!("/hf/api/models/{repo}/tree/main?recursive=true"), &[]).await;
        for entry in tree.json().as_array().unwrap().iter().filter(|e| e["type"] == "file") {
            let bytes = &held[entry["path"].as_str().unwrap()];
            let sha256 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(bytes));
            assert_eq!(entry["lfs"]["oid"], sha256, "{repo}: {entry}");
        }
    }
    assert_eq!(scraped(&second.address, "ztserve_file_digest_bytes_total", &[]).await, 0.0, "the second hashed files");
    settle(&second.address, &repos).await;
    let sent = origin_file_bytes(&origin_address).await - sent_before;
    // Each file once, and the headers the first scan parsed: those of files whose digest is
    // known are read from the origin and not kept, since the cache keeps only a whole file
    // checked against its digest.
    let parsed = scraped(&second.address, "ztserve_storage_read_bytes_total", &[("purpose", "manifest")]).await;
    assert!(
        sent >= file_bytes as f64 && sent <= file_bytes as f64 + parsed,
        "each file's bytes sent by the origin once: {sent} sent, {file_bytes} in files, {parsed} parsed"
    );

    // Restarted: everything from the cache, nothing from the origin but its listings.
    stop_gracefully(&mut second.child);
    let mut second = start_hub_sourced(&origin_address, &repos, &cache).await;
    eight_clients_load(&second.address, &files).await;
    let sent_again = origin_file_bytes(&origin_address).await - sent_before;
    assert_eq!(sent_again, sent, "sent again after a restart");

    // The origin stops: the cached models still load, before and after another restart.
    stop_gracefully(&mut origin.child);
    eight_clients_load(&second.address, &files).await;
    stop_gracefully(&mut second.child);
    let second = start_hub_sourced(&origin_address, &repos, &cache).await;
    eight_clients_load(&second.address, &files).await;
    let ready = request_async(&second.address, "/readyz", &[]).await;
    assert_eq!(ready.status, 200, "{}", ready.head);
    let ready = ready.json();
    assert_eq!(ready["status"], "degraded", "{ready}");
    for source in ready["sources"].as_array().unwrap() {
        assert_eq!(
            (source["status"].as_str(), source["serving_from"].as_str()),
            (Some("unavailable"), Some("disk_cache"))
        );
        assert!(source["reason"].as_str().is_some_and(|e| e.contains("/hf/api/models/")), "{source}");
    }
}

/// A Hub that answers its queued faults first: one repository `org/m` at commit [`COMMIT`]
/// holding one safetensors file; `org/gated` refuses anonymous callers.
mod fake_hub {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use axum::http::{HeaderMap, StatusCode, Uri, header};
    use axum::response::{IntoResponse, Response};
    use sha2::Digest as _;

    #[derive(Default)]
    pub(super) struct Hub {
        /// Each commit of `org/m` and its `model.safetensors`; the last is `main`.
        pub(super) commits: Mutex<Vec<(String, Vec<u8>)>>,
        /// Answered, in order, to the next API requests for `org/m` instead of the real answer.
        pub(super) faults: Mutex<VecDeque<(StatusCode, Option<&'static str>)>>,
        /// API requests for `org/m`.
        pub(super) api_requests: Mutex<u32>,
        /// Requests for what `main` names.
        pub(super) revision_requests: std::sync::atomic::AtomicU32,
    }

    fn hub_error(status: StatusCode, code: &str, message: &str) -> Response {
        (status, [("x-error-code", code), ("x-error-message", message)], "{}").into_response()
    }

    async fn answer(hub: Arc<Hub>, uri: Uri, headers: HeaderMap) -> Response {
        let path = uri.path();
        if path.starts_with("/api/models/org/m/") {
            *hub.api_requests.lock().unwrap() += 1;
            if let Some((status, retry_after)) = hub.faults.lock().unwrap().pop_front() {
                let mut response = (status, "busy").into_response();
                if let Some(after) = retry_after {
                    response.headers_mut().insert(header::RETRY_AFTER, after.parse().unwrap());
                }
                return response;
            }
        }
        let commits = hub.commits.lock().unwrap().clone();
        let at = |prefix: &str, suffix: &str| {
            let commit = path.strip_prefix(prefix)?.strip_suffix(suffix)?;
            commits.iter().find(|(c, _)| c == commit).map(|(_, file)| file.clone())
        };
        let (tree, resolved) = (at("/api/models/org/m/tree/", ""), at("/org/m/resolve/", "/model.safetensors"));
        match (path, tree, resolved) {
            ("/api/models/org/m/revision/main", ..) => {
                hub.revision_requests.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let main = &commits.last().unwrap().0;
                axum::Json(serde_json::json!({ "id": "org/m", "sha": main })).into_response()
            }
            (_, Some(file), _) => {
                let lfs = hex::encode(sha2::Sha256::digest(&file));
                axum::Json(serde_json::json!([
                    { "type": "file", "path": ".gitattributes", "size": 10, "oid": "aa" },
                    { "type": "directory", "path": "sub", "size": 0, "oid": "bb" },
                    { "type": "file", "path": "model.safetensors", "size": file.len(), "oid": "cc",
                      "lfs": { "oid": lfs, "size": file.len(), "pointerSize": 130 } },
                ]))
                .into_response()
            }
            (_, _, Some(file)) => {
                let range =
                    headers.get(header::RANGE).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("bytes="));
                let (first, last) = range.and_then(|r| r.split_once('-')).unwrap();
                let (first, last): (usize, usize) = (first.parse().unwrap(), last.parse().unwrap());
                let content_range = format!("bytes {first}-{last}/{}", file.len());
                (StatusCode::PARTIAL_CONTENT, [(header::CONTENT_RANGE, content_range)], file[first..=last].to_vec())
                    .into_response()
            }
            ("/api/models/org/gated/revision/main", ..) => {
                hub_error(StatusCode::UNAUTHORIZED, "GatedRepo", "Access to model org/gated is restricted.")
            }
            _ => hub_error(StatusCode::NOT_FOUND, "RepoNotFound", "Repository not found"),
        }
    }

    /// Serves `hub` on 127.0.0.1; its address.
    pub(super) async fn start(hub: Arc<Hub>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let app =
            axum::Router::new().fallback(move |uri: Uri, headers: HeaderMap| answer(Arc::clone(&hub), uri, headers));
        tokio::spawn(async move { axum::serve(listener, app).await });
        address
    }
}

/// The commit id numbered `n`.
fn commit(n: u8) -> String {
    format!("{n:02x}").repeat(20)
}

/// What `/readyz` at `address` says of source `name`.
async fn readiness_of(address: &str, name: &str) -> Value {
    let ready = request_async(address, "/readyz", &[]).await.json();
    ready["sources"].as_array().unwrap().iter().find(|s| s["source"] == name).unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_errors_are_retried_when_worth_it_and_otherwise_refuse_the_source_precisely() {
    use axum::http::StatusCode;
    use ztserve::config::{Config, OnUnreadableSource, SourceSpec};

    let weights = common::noise(3000, 3);
    let file = common::safetensors_file(&[("w", safetensors::Dtype::U8, vec![3000], &weights)]);
    let hub = std::sync::Arc::new(fake_hub::Hub::default());
    hub.commits.lock().unwrap().push((commit(1), file.clone()));
    // A rate limit with Retry-After, then a 503: both retried, and the start succeeds.
    hub.faults
        .lock()
        .unwrap()
        .extend([(StatusCode::TOO_MANY_REQUESTS, Some("1")), (StatusCode::SERVICE_UNAVAILABLE, None)]);
    let endpoint = format!("http://{}", fake_hub::start(std::sync::Arc::clone(&hub)).await);
    let spec = |repo: &str| SourceSpec::Hub { repo: repo.into(), revision: None };
    let mut config = Config::serving(vec![spec("org/m"), spec("org/missing"), spec("org/gated")]);
    config.sources.on_unreadable = OnUnreadableSource::Degrade;
    config.hub_source.endpoint = Some(endpoint);
    config.hub_source.retries = 2;
    let config_hub = config.hub_source.clone();
    let (address, server) = common::serve(config).await;
    assert!(*hub.api_requests.lock().unwrap() >= 4, "the 429 and the 503 were retried");
    let bytes = request_async(&address, "/models/org/m/file", &[]).await;
    assert_eq!((bytes.status, bytes.body == file), (200, true), "{}", bytes.head);

    assert_eq!(readiness_of(&address, "hf://org/m").await["status"], "ok");
    let missing = readiness_of(&address, "hf://org/missing").await;
    assert_eq!(missing["status"], "refused", "{missing}");
    assert!(
        missing["reason"].as_str().unwrap().contains("404 Not Found, RepoNotFound, Repository not found"),
        "{missing}"
    );
    let gated = readiness_of(&address, "hf://org/gated").await;
    assert_eq!(gated["status"], "refused", "{gated}");
    assert!(
        gated["reason"].as_str().unwrap().contains("GatedRepo")
            && gated["reason"].as_str().unwrap().contains("HF_TOKEN"),
        "{gated}"
    );

    // 5xx past the retries: unavailable, the model kept from the last listing and served.
    hub.faults.lock().unwrap().extend([(StatusCode::BAD_GATEWAY, None); 3]);
    server.rescan().await;
    let m = readiness_of(&address, "hf://org/m").await;
    assert_eq!(m["status"], "unavailable", "{m}");
    assert!(m["reason"].as_str().unwrap().contains("502 Bad Gateway"), "{m}");
    assert_eq!(request_async(&address, "/models/org/m/file", &[]).await.body, file);
    // And back.
    server.rescan().await;
    assert_eq!(readiness_of(&address, "hf://org/m").await["status"], "ok");

    // `main` moves: a commit that leaves the file alone leaves the model version; one that
    // changes it makes a new version, with the new bytes.
    let version = |manifest: Value| manifest["model_version"].as_str().unwrap().to_owned();
    let first = version(request_async(&address, "/models/org/m", &[]).await.json());
    hub.commits.lock().unwrap().push((commit(2), file.clone()));
    server.rescan().await;
    assert_eq!(version(request_async(&address, "/models/org/m", &[]).await.json()), first);
    let weights = common::noise(3000, 4);
    let changed = common::safetensors_file(&[("w", safetensors::Dtype::U8, vec![3000], &weights)]);
    hub.commits.lock().unwrap().push((commit(3), changed.clone()));
    server.rescan().await;
    assert_ne!(version(request_async(&address, "/models/org/m", &[]).await.json()), first);
    assert_eq!(request_async(&address, "/models/org/m/file", &[]).await.body, changed);

    // A source pinned to a commit keeps serving that commit's bytes, and never asks what a
    // branch names.
    let revisions = hub.revision_requests.load(std::sync::atomic::Ordering::SeqCst);
    let mut pinned = Config::serving(vec![SourceSpec::Hub { repo: "org/m".into(), revision: Some(commit(1)) }]);
    pinned.hub_source = config_hub.clone();
    let (pinned_address, pinned_server) = common::serve(pinned).await;
    pinned_server.rescan().await;
    assert_eq!(request_async(&pinned_address, "/models/org/m/file", &[]).await.body, file);
    assert_eq!(hub.revision_requests.load(std::sync::atomic::Ordering::SeqCst), revisions);

    // A Retry-After longer than a request may wait: the source is unavailable at once, and
    // the Hub is not called again before it has passed, by rescans either.
    hub.faults.lock().unwrap().push_back((StatusCode::TOO_MANY_REQUESTS, Some("3600")));
    server.rescan().await;
    let m = readiness_of(&address, "hf://org/m").await;
    assert!(m["reason"].as_str().unwrap().contains("Retry-After 3600 s"), "{m}");
    let calls = *hub.api_requests.lock().unwrap();
    server.rescan().await;
    assert_eq!(*hub.api_requests.lock().unwrap(), calls, "a rescan called the Hub during its Retry-After");
    let m = readiness_of(&address, "hf://org/m").await;
    assert!(m["reason"].as_str().unwrap().contains("asked for") && m["status"] == "unavailable", "{m}");
}

/// A node restarted while its origin is down serves every model it holds whole, exactly: a
/// sharded checkpoint whose tensors were all read through the node, its index read only by the
/// node's scan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_with_its_origin_down_serves_the_sharded_model_it_holds() {
    use safetensors::Dtype;

    let dir = tempfile::tempdir().unwrap();
    let (models, cache) = (dir.path().join("models"), dir.path().join("cache"));
    let repo = models.join("org/llama");
    std::fs::create_dir_all(&repo).unwrap();
    let first: Vec<u8> = (0..=255u8).cycle().take(3 << 20).collect();
    let second: Vec<u8> = (0..=250u8).rev().cycle().take(2 << 20).collect();
    let shards: [&[common::StTensor<'_>]; 2] = [
        &[("model.layers.0.weight", Dtype::U8, vec![3 << 20], &first)],
        &[("model.layers.1.weight", Dtype::U8, vec![2 << 20], &second)],
    ];
    for (name, bytes) in common::safetensors_checkpoint(&shards) {
        std::fs::write(repo.join(name), bytes).unwrap();
    }
    let mut origin = start_binary(&["serve", "--source", models.to_str().unwrap(), "--listen", "127.0.0.1:0"], &[]);
    let repos = vec!["org/llama".to_owned()];
    let read_every_tensor = |address: String| {
        let (first, second) = (first.clone(), second.clone());
        async move {
            for (name, bytes) in [("model.layers.0.weight", first), ("model.layers.1.weight", second)] {
                let reply = request_async(&address, &format!("/models/org%2Fllama/objects/{name}"), &[]).await;
                assert_eq!(reply.status, 200, "{name}: {}", reply.head);
                assert!(reply.body == bytes, "{name}: bytes differ");
            }
        }
    };
    let mut node = start_hub_sourced(&origin.address, &repos, &cache).await;
    read_every_tensor(node.address.clone()).await;
    stop_gracefully(&mut node.child);
    stop_gracefully(&mut origin.child);

    let mut node = start_hub_sourced(&origin.address, &repos, &cache).await;
    let listed = request_async(&node.address, "/models", &[]).await.json();
    assert_eq!(listed["models"][0]["status"], "ok", "{listed}");
    read_every_tensor(node.address.clone()).await;
    stop_gracefully(&mut node.child);
}
