//! The Hugging Face Hub API at `/hf`, read by the clients GPU workers load through
//! (tests/interop/hub_clients.py): `huggingface_hub` 2.x (`snapshot_download` online and then
//! offline, `hf_hub_download` pinned by commit, `hf download --local-dir`, `HfFileSystem`,
//! `hf cache verify`), 1.x and 0.36 (`snapshot_download`; 0.36 resuming a download cut off
//! midway with a range), and
//! transformers' `AutoConfig` and `AutoTokenizer`. The models are the loader corpus (an official
//! 1.2.3 file with zstd, official 2.1.2 files, seekable among them, the safetensors peers'
//! checkpoints, one sharded with its config and tokenizer), from a local directory and from S3;
//! every tensor is compared with what the official reader returned from the source file. The
//! Hub's statuses and error codes, paging, revisions and access are checked over plain HTTP.

use crate::common;

use std::fs;

use common::corpus::{hub_clients, only_viewable, put_hub_corpus};
use common::{ModelSource, Reply, metric, request_async, send, serve};
use serde_json::{Value, json};
use ztserve::config::Config;
use ztserve::format::DType;

/// Requests to the Hub API (every label below `/hf`), with `status` when given.
fn hub_requests(status: Option<&str>) -> f64 {
    let labels = [ztserve::api::routes::HUB, ztserve::api::routes::HUB_API, ztserve::api::routes::HUB_FILE];
    labels
        .into_iter()
        .map(|route| match status {
            Some(status) => metric("ztserve_http_requests_total", &[("route", route), ("status", status)]),
            None => metric("ztserve_http_requests_total", &[("route", route)]),
        })
        .sum()
}

async fn hub_clients_load_every_model(source: ModelSource) {
    let dir = tempfile::tempdir().unwrap();
    let (mut repos, _) = put_hub_corpus(dir.path(), &source).await;
    let mut config = source.config(Config::default());
    config.digests.store = Some(dir.path().join("digests"));
    let (address, _server) = serve(config.clone()).await;
    let tensors = only_viewable(&address, &mut repos).await;
    assert!(
        repos.as_object().unwrap().len() >= 8 && tensors > 50,
        "{} repos, {tensors} tensors",
        repos.as_object().unwrap().len()
    );

    // What the clients load: every repository, the view of a large model's file, the tokenizer.
    let resume_local = dir.path().join("resume.safetensors");
    let view = request_async(&address, "/models/zt12%2Fofficial/model.safetensors", &[]).await;
    assert_eq!(view.status, 200);
    fs::write(&resume_local, &view.body).unwrap();
    let plan = |cache: &str| {
        json!({
            "endpoint": format!("http://{address}/hf"),
            "cache": dir.path().join(cache),
            "repos": repos,
            "transformers_repo": "hf/llama",
            "resume": { "repo": "zt12/official", "path": "model.safetensors", "local": resume_local },
        })
    };
    let plan_path = dir.path().join("plan.json");
    fs::write(&plan_path, serde_json::to_vec(&plan("cache")).unwrap()).unwrap();

    let checked = hub_clients("hub-2.4.0", "check", &plan_path).await;
    eprintln!("huggingface_hub 2.4.0 and transformers: {checked}");
    assert_eq!(checked["tensors"], tensors, "{checked}");
    assert_eq!(checked["transformers"], "hf/llama");
    assert!(checked["sharded_metadata"].as_u64() >= Some(1), "no sharded checkpoint's metadata was read: {checked}");
    // Each file's digest was computed once (ahead of need for a local directory, when first
    // asked for in S3), however many clients and requests asked for it.
    let mut published = 0u64;
    for (repo, _) in repos.as_object().unwrap() {
        let tree = request_async(&address, &format!("/hf/api/models/{repo}/tree/main?recursive=true"), &[]).await;
        published += tree.json().as_array().unwrap().iter().map(|e| e["size"].as_u64().unwrap()).sum::<u64>();
    }
    assert_eq!(metric("ztserve_file_digest_bytes_total", &[("digest", "file")]), published as f64);

    // Offline, from the cache the online run filled: no request reaches the server.
    let requests = hub_requests(None);
    let offline = hub_clients("hub-2.4.0", "offline", &plan_path).await;
    assert_eq!(offline["tensors"], tensors, "{offline}");
    assert_eq!(hub_requests(None), requests, "HF_HUB_OFFLINE=1 sent requests to the server");

    // Earlier releases, each into a cache of its own.
    for venv in ["hub-1.33.0", "hub-0.36.2"] {
        let path = dir.path().join(format!("plan-{venv}.json"));
        fs::write(&path, serde_json::to_vec(&plan(&format!("cache-{venv}"))).unwrap()).unwrap();
        let loaded = hub_clients(venv, "snapshot", &path).await;
        assert_eq!(loaded["tensors"], tensors, "{venv}: {loaded}");
    }

    // A download cut off midway resumes with a range. (Releases from 1.x on download into a
    // file of their own per process and resume only within one, on a retry; 0.36 resumes the
    // `.incomplete` file a killed process left.)
    let partial = hub_requests(Some("206"));
    let resumed = hub_clients("hub-0.36.2", "resume", &plan_path).await;
    assert!(resumed["resumed"].as_u64().unwrap() > 0, "{resumed}");
    assert!(hub_requests(Some("206")) > partial, "the resumed download sent no range request");

    // Restarted over the same digest store, the server reads no file to list the digests.
    // (Files' own digests: the first server may still be hashing image layers.)
    let hashed = metric("ztserve_file_digest_bytes_total", &[("digest", "file")]);
    let (again, _restarted) = serve(config).await;
    for (repo, _) in repos.as_object().unwrap() {
        let tree = request_async(&again, &format!("/hf/api/models/{repo}/tree/main?recursive=true"), &[]).await;
        assert_eq!(tree.status, 200, "{repo}");
    }
    let again_hashed = metric("ztserve_file_digest_bytes_total", &[("digest", "file")]);
    assert_eq!(again_hashed, hashed, "digests were computed again after a restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_clients_load_every_model_from_a_local_directory() {
    hub_clients_load_every_model(ModelSource::local()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_clients_load_every_model_from_s3() {
    hub_clients_load_every_model(ModelSource::s3()).await;
}

const EVERYTHING: &str = "hub-token-everything-0123456789";
const TEAM: &str = "hub-token-team-only-0123456789";

/// Sends `method path` to the server with `token` (if any) off the test's runtime.
async fn hub(
    address: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    extra: &[(&str, &str)],
    body: &[u8],
) -> common::Reply {
    let (address, method, path, body) = (address.to_owned(), method.to_owned(), path.to_owned(), body.to_vec());
    let mut headers: Vec<(String, String)> = extra.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    if let Some(token) = token {
        headers.push(("Authorization".into(), format!("Bearer {token}")));
    }
    tokio::task::spawn_blocking(move || {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        send(&address, &method, &path, &headers, &body)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hub_api_answers_with_the_hubs_statuses_codes_paging_and_revisions() {
    let source = ModelSource::local();
    let weights: Vec<u8> = (0..64u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
    source.put("team/llama/model.zt", &common::model(&[("w", DType::F32, &weights, true)])).await;
    source.put("team/llama/config.json", b"{\"model_type\": \"llama\"}").await;
    for i in 0..1100 {
        source.put(&format!("team/llama/extra/f{i:04}.txt"), format!("{i}").as_bytes()).await;
    }
    // A `model.zt` is its directory's model, as a `model.safetensors` is (team/llama/model.zt is
    // team/llama, whose repository has the config beside it); ids deeper than namespace/name
    // are repositories with the rest joined by `__` (other/deep/er is other/deep__er).
    source.put("other/deep/er/model.zt", &common::model(&[("w", DType::U8, b"abc", false)])).await;
    let mut config = source.config(Config::default());
    config.auth.tokens = vec![
        ztserve::config::TokenEntry::parse(EVERYTHING).unwrap(),
        ztserve::config::TokenEntry::parse(&format!("{TEAM} team")).unwrap(),
    ];
    let (address, server) = serve(config).await;
    let a = address.as_str();
    let ok = Some(EVERYTHING);

    // Access: anonymous is 401 RepoNotFound whether or not the repo exists; a token that does
    // not reach a repo is 404 as for a missing one; a bad token is 401 without a code.
    for (path, token, status, code) in [
        ("/hf/api/models/team/llama", None, 401, Some("RepoNotFound")),
        ("/hf/api/models/team/missing", None, 401, Some("RepoNotFound")),
        ("/hf/api/models/other/deep__er", Some(TEAM), 404, Some("RepoNotFound")),
        ("/hf/api/models/team/missing", ok, 404, Some("RepoNotFound")),
        ("/hf/api/models/team/llama", Some("not-a-valid-token-0123456789"), 401, None),
        ("/hf/api/datasets/team/llama", ok, 404, Some("RepoNotFound")),
        ("/hf/datasets/team/llama/resolve/main/config.json", ok, 404, Some("RepoNotFound")),
        ("/hf/api/models/team/llama/revision/refs%2Fpr%2F1", ok, 404, Some("RevisionNotFound")),
        ("/hf/api/models/team/llama/tree/main/missing", ok, 404, Some("EntryNotFound")),
        ("/hf/team/llama/resolve/main/missing.json", ok, 404, Some("EntryNotFound")),
        ("/hf/api/whoami-v2", ok, 404, None),
        ("/hf/api/models", None, 401, None),
        ("/hf/api/models?limit=0", ok, 400, None),
        ("/hf/api/models?cursor=x", ok, 400, None),
        ("/hf/api/models/team/llama/discussions", ok, 404, None),
        ("/hf/team/llama/blob/main/config.json", ok, 404, None),
        ("/hf/", ok, 404, None),
    ] {
        let reply = hub(a, "GET", path, token, &[], b"").await;
        assert_eq!((reply.status, reply.header("x-error-code")), (status, code), "{path}: {}", reply.head);
        assert!(reply.json()["error"].is_string(), "{path}");
        if code == Some("EntryNotFound") {
            assert_eq!(reply.header("x-repo-commit").map(str::len), Some(40), "{path}");
        }
    }
    let refused = hub(a, "GET", "/hf/api/models/team/llama", Some("not-a-valid-token-0123456789"), &[], b"").await;
    assert_eq!(refused.header("x-error-message"), Some("Invalid credentials in Authorization header"));
    assert_eq!(hub(a, "POST", "/hf/team/llama/resolve/main/config.json", ok, &[], b"x").await.status, 405);

    // The model list: what the token reaches, filtered, sorted and paged as the Hub's.
    let ids = |reply: &Reply| -> Vec<String> {
        reply.json().as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_owned()).collect()
    };
    let everything = hub(a, "GET", "/hf/api/models", ok, &[], b"").await;
    assert_eq!(ids(&everything), ["other/deep__er", "team/llama"]);
    assert_eq!(everything.header("link"), None);
    assert_eq!(ids(&hub(a, "GET", "/hf/api/models", Some(TEAM), &[], b"").await), ["team/llama"]);
    for (query, expected) in [
        ("author=team", &["team/llama"][..]),
        ("author=tea", &[]),
        ("search=LLAMA", &["team/llama"]),
        ("filter=safetensors&search=deep", &["other/deep__er"]),
        ("filter=gguf", &[]),
        ("sort=id&direction=-1", &["team/llama", "other/deep__er"]),
    ] {
        let listed = hub(a, "GET", &format!("/hf/api/models?{query}"), ok, &[], b"").await;
        assert_eq!(ids(&listed), expected, "{query}");
    }
    let first = hub(a, "GET", "/hf/api/models?limit=1&full=True", ok, &[], b"").await;
    assert_eq!(ids(&first), ["other/deep__er"]);
    assert_eq!(first.json()[0]["siblings"], json!([{ "rfilename": "model.safetensors" }]));
    let next = first.header("link").expect("a next page");
    let next = next.strip_prefix('<').and_then(|l| l.split_once(">; rel=\"next\"")).unwrap().0;
    // An absolute URL at the host the request named.
    let path = next.strip_prefix("http://x").filter(|p| p.starts_with("/hf/api/models?")).expect(next);
    let second = hub(a, "GET", path, ok, &[], b"").await;
    assert_eq!(ids(&second), ["team/llama"]);
    assert_eq!(second.json()[0]["sha"].as_str().map(str::len), Some(40));
    assert_eq!(second.header("link"), None);

    // Info with and without a revision: main and the commit are the same version.
    let info = hub(a, "GET", "/hf/api/models/team/llama", Some(TEAM), &[], b"").await.json();
    let commit = info["sha"].as_str().unwrap().to_owned();
    assert_eq!(commit.len(), 40);
    assert_eq!(
        (info["id"].as_str(), info["private"].as_bool(), info["gated"].as_bool()),
        (Some("team/llama"), Some(true), Some(false))
    );
    assert_eq!(info["siblings"].as_array().unwrap().len(), 1102, "config, 1,100 extra files and the view");
    for revision in ["main", commit.as_str()] {
        let at = hub(a, "GET", &format!("/hf/api/models/team/llama/revision/{revision}"), ok, &[], b"").await.json();
        assert_eq!(at["sha"], commit.as_str());
    }
    let deep = hub(a, "GET", "/hf/api/models/other/deep__er", ok, &[], b"").await.json();
    assert_eq!(
        deep["siblings"],
        json!([{ "rfilename": "model.safetensors" }]),
        "the view; the stored .zt is not listed"
    );

    // The tree pages at 1,000 entries, the Link giving the next page with the same parameters.
    let first = hub(a, "GET", "/hf/api/models/team/llama/tree/main?recursive=true&expand=true", ok, &[], b"").await;
    let link = first.header("link").expect("a next page").to_owned();
    let next = link.trim_start_matches('<').split('>').next().unwrap();
    let next = &next[next.find("/hf/").unwrap()..];
    assert!(
        next.contains("recursive=true") && next.contains("expand=true") && link.ends_with("rel=\"next\""),
        "{link}"
    );
    let second = hub(a, "GET", next, ok, &[], b"").await;
    assert_eq!(second.header("link"), None);
    let entries: Vec<Value> =
        [first.json(), second.json()].into_iter().flat_map(|p| p.as_array().unwrap().clone()).collect();
    assert_eq!(first.json().as_array().unwrap().len(), 1000);
    let paths: Vec<&str> = entries.iter().map(|e| e["path"].as_str().unwrap()).collect();
    assert_eq!(paths.len(), 1103, "1,102 files and the directory extra");
    assert!(paths.contains(&"extra") && paths.contains(&"extra/f1099.txt") && paths.contains(&"model.safetensors"));
    assert!(entries.iter().all(|e| e["lastCommit"]["id"] == commit.as_str()));
    let top = hub(a, "GET", "/hf/api/models/team/llama/tree/main", ok, &[], b"").await.json();
    let top: Vec<&str> = top.as_array().unwrap().iter().map(|e| e["path"].as_str().unwrap()).collect();
    assert_eq!(top, ["config.json", "extra", "model.safetensors"]);

    // paths-info, as a form (huggingface_hub) and as JSON.
    let form = b"paths=config.json&paths=extra&paths=missing&expand=True";
    let content_type = [("Content-Type", "application/x-www-form-urlencoded")];
    let found =
        hub(a, "POST", &format!("/hf/api/models/team/llama/paths-info/{commit}"), ok, &content_type, form).await;
    let found = found.json();
    assert_eq!(found.as_array().unwrap().len(), 2, "{found}");
    let config_sha = found[0]["lfs"]["oid"].as_str().unwrap();
    let expected_sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b"{\"model_type\": \"llama\"}"));
    assert_eq!(config_sha, expected_sha);
    assert_eq!(found[1]["type"], "directory");
    let json_body = br#"{"paths": ["model.safetensors"]}"#;
    let by_json = hub(
        a,
        "POST",
        "/hf/api/models/team/llama/paths-info/main",
        ok,
        &[("Content-Type", "application/json")],
        json_body,
    )
    .await;
    assert_eq!(by_json.json()[0]["path"], "model.safetensors");

    // resolve: main redirects to the commit; the commit answers the bytes, their SHA-256 as
    // the ETag, the size, ranges.
    let moved = hub(a, "HEAD", "/hf/team/llama/resolve/main/config.json", ok, &[], b"").await;
    assert_eq!(moved.status, 302);
    assert_eq!(moved.header("location"), Some(format!("/hf/team/llama/resolve/{commit}/config.json").as_str()));
    let at_commit = format!("/hf/team/llama/resolve/{commit}/config.json");
    let head = hub(a, "HEAD", &at_commit, ok, &[], b"").await;
    assert_eq!(head.status, 200);
    assert_eq!(head.header("etag"), Some(format!("\"{expected_sha}\"").as_str()));
    assert_eq!(head.header("x-linked-etag"), head.header("etag"));
    assert_eq!((head.header("x-linked-size"), head.header("content-length")), (Some("23"), Some("23")));
    assert_eq!(head.header("x-repo-commit"), Some(commit.as_str()));
    let range = hub(a, "GET", &at_commit, ok, &[("Range", "bytes=2-11")], b"").await;
    assert_eq!((range.status, range.body.as_slice()), (206, &b"model_type"[..]));
    let beyond = hub(a, "GET", &at_commit, ok, &[("Range", "bytes=100-")], b"").await;
    assert_eq!((beyond.status, beyond.header("content-range")), (416, Some("bytes */23")));
    let cached = hub(a, "GET", &at_commit, ok, &[("If-None-Match", &format!("\"{expected_sha}\""))], b"").await;
    assert_eq!(cached.status, 304);

    // A new version: main moves to a new commit, and the old commit is gone, so a download
    // that straddles the change fails rather than mixing versions.
    source.put("team/llama/config.json", b"{\"model_type\": \"llama\", \"v\": 2}").await;
    server.rescan().await;
    let moved_on = hub(a, "GET", "/hf/api/models/team/llama", ok, &[], b"").await.json();
    assert_ne!(moved_on["sha"], commit.as_str());
    let gone = hub(a, "GET", &at_commit, ok, &[], b"").await;
    assert_eq!((gone.status, gone.header("x-error-code")), (404, Some("RevisionNotFound")));
    let new_commit = moved_on["sha"].as_str().unwrap();
    let plan = json!({
        "endpoint": format!("http://{address}/hf"),
        "cache": tempfile::tempdir().unwrap().path(),
        "paged": { "repo": "team/llama", "token": EVERYTHING },
        "errors": {
            "anonymous": { "repo": "team/llama", "raises": "RepositoryNotFoundError" },
            "not_allowed": { "repo": "other/deep__er", "token": TEAM, "raises": "RepositoryNotFoundError" },
            "missing": { "repo": "team/missing", "token": EVERYTHING, "raises": "RepositoryNotFoundError" },
            "bad_token": { "repo": "team/llama", "token": "not-a-valid-token-0123456789", "raises": "HfHubHTTPError" },
            "old_revision": { "repo": "team/llama", "token": EVERYTHING, "revision": commit, "raises": "RevisionNotFoundError" },
            "missing_file": { "repo": "team/llama", "token": EVERYTHING, "file": "missing.json", "raises": "EntryNotFoundError" },
            "old_revision_file": { "repo": "team/llama", "token": EVERYTHING, "file": "config.json", "revision": commit, "raises": "RevisionNotFoundError" },
            "file_at_commit": { "repo": "team/llama", "token": EVERYTHING, "file": "missing.json", "revision": new_commit, "raises": "EntryNotFoundError" },
        },
    });
    let dir = tempfile::tempdir().unwrap();
    let plan_path = dir.path().join("plan.json");
    fs::write(&plan_path, serde_json::to_vec(&plan).unwrap()).unwrap();
    let raised = hub_clients("hub-2.4.0", "errors", &plan_path).await;
    eprintln!("exceptions raised: {raised}");
    assert_eq!(raised.as_object().unwrap().len(), 9, "{raised}");
    assert_eq!(raised["paged_entries"], 1103, "huggingface_hub followed the Link to the second page");
    assert_eq!(hub_requests(Some("500")), 0.0, "no Hub API request is a 500");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_s3_endpoint_gives_the_sha256_the_hub_api_computed() {
    let source = ModelSource::local();
    source.put("org/tiny.zt", &common::model(&[("w", DType::U8, b"weights", false)])).await;
    let mut config = source.config(Config::default());
    // Computed when the Hub API first needs it, not ahead.
    config.digests.ahead = ztserve::config::HashAhead::None;
    let (address, s3, _server) = common::serve_with_s3(config).await;
    let checksum = || async {
        let head =
            hub(&s3, "HEAD", "/models/org/tiny/model.safetensors", None, &[("x-amz-checksum-mode", "ENABLED")], b"")
                .await;
        assert_eq!(head.status, 200, "{}", head.head);
        head.header("x-amz-checksum-sha256").map(str::to_owned)
    };
    // Never waited for: unknown until something computed it.
    assert_eq!(checksum().await, None);
    let tree = hub(&address, "GET", "/hf/api/models/org/tiny/tree/main", None, &[], b"").await.json();
    let sha256 = hex::decode(tree[0]["lfs"]["oid"].as_str().unwrap()).unwrap();
    let view = request_async(&address, "/models/org%2Ftiny/model.safetensors", &[]).await;
    assert_eq!(sha256, <sha2::Sha256 as sha2::Digest>::digest(&view.body).to_vec());
    let expected = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &sha256);
    assert_eq!(checksum().await, Some(expected));
    // Only for a whole object, and only when asked for.
    let ranged = hub(
        &s3,
        "GET",
        "/models/org/tiny/model.safetensors",
        None,
        &[("x-amz-checksum-mode", "ENABLED"), ("Range", "bytes=0-7")],
        b"",
    )
    .await;
    assert_eq!((ranged.status, ranged.header("x-amz-checksum-sha256")), (206, None));
    let unasked = hub(&s3, "HEAD", "/models/org/tiny/model.safetensors", None, &[], b"").await;
    assert_eq!(unasked.header("x-amz-checksum-sha256"), None);
}
