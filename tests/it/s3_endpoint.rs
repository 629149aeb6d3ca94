//! The S3-compatible endpoint, read by the loaders GPU workers run (tests/interop/s3_loaders.py:
//! the Run:ai streamer as vLLM sets it up, boto3, s3fs, safetensors): an official 1.2.3 file
//! with zstd components, official 2.1.2 files (canonical, and seekable zstd with a 64 MiB part),
//! the safetensors peers' checkpoints (one sharded by `huggingface_hub`) and 600 small models (so
//! the listing pages past 1,000 keys) are served from a local directory, and every tensor each
//! loader reads is the bytes the official reader returns from the local file. Signed access
//! (tokens as S3 keys, object_store as the signing client) and the key space's rules are
//! checked here too.

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};

use common::corpus::write_loader_models;
use common::{request_async, run_interop_script, serve_with_s3};
use serde_json::{Value, json};
use ztserve::config::Config;
use ztserve::format::DType;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loaders_read_every_model_through_the_s3_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (work, models) = (dir.path().join("work"), dir.path().join("models"));
    let expected = write_loader_models(&work, &models);
    let config = Config::serving(vec![ztserve::config::SourceSpec::try_from(models.display().to_string()).unwrap()]);
    let (address, s3_address, _state) = serve_with_s3(config).await;

    // Every key the bucket must list: each model's view files, and its stored files besides.
    let mut keys = Vec::new();
    let mut plan_models = serde_json::Map::new();
    for model in request_async(&address, "/models", &[]).await.json()["models"].as_array().unwrap() {
        let id = model["id"].as_str().unwrap();
        assert_eq!(model["status"], "ok", "{model}");
        let manifest = request_async(&address, model["url"].as_str().unwrap(), &[]).await.json();
        let view: Vec<&str> = manifest["safetensors_view"]["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap())
            .collect();
        // What loaders need, as the Hub API lists it: no stored .zt beside the safetensors.
        keys.extend(view.iter().map(|name| format!("{id}/{name}")));
        if let Some(tensors) = expected.get(id) {
            let excluded: Vec<&str> = manifest["safetensors_view"]["excluded"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["object"].as_str().unwrap())
                .collect();
            let held: serde_json::Map<String, Value> = tensors
                .iter()
                .filter(|(name, _)| !excluded.contains(&name.as_str()))
                .map(|(name, path)| (name.clone(), json!(path)))
                .collect();
            plan_models.insert(id.to_owned(), json!({ "files": view, "tensors": held }));
        }
    }
    let companions = json!({
        "hf/llama": {
            "config.json": models.join("hf/llama/config.json"),
            "tokenizer.json": models.join("hf/llama/tokenizer.json"),
            "tokenizer/vocab.txt": models.join("hf/llama/tokenizer/vocab.txt"),
        },
        "zt12/official": { "generation_config.json": models.join("zt12/generation_config.json") },
    });
    for (id, files) in companions.as_object().unwrap() {
        keys.extend(files.as_object().unwrap().keys().map(|name| format!("{id}/{name}")));
    }
    keys.sort();
    assert!(keys.len() > 600, "{} keys", keys.len());
    assert_eq!(plan_models.len(), expected.len(), "every model the loaders read is listed");
    let plan = json!({
        "endpoint": format!("http://{s3_address}"),
        "http": format!("http://{address}"),
        "bucket": "models",
        "keys": keys,
        "models": plan_models,
        "companions": companions,
    });
    let plan_path = dir.path().join("plan.json");
    fs::write(&plan_path, serde_json::to_vec(&plan).unwrap()).unwrap();
    let plan_path_for_script = plan_path.clone();
    let summary = tokio::task::spawn_blocking(move || {
        run_interop_script("client", "s3_loaders.py", &[Path::new("check"), &plan_path_for_script])
    })
    .await
    .unwrap();
    let counts: Value = serde_json::from_str(summary.trim().lines().last().unwrap()).unwrap();
    eprintln!("loaders compared: {counts}");
    let tensors: u64 = plan_models.values().map(|m| m["tensors"].as_object().unwrap().len() as u64).sum();
    for loader in ["s3fs", "safe_open"] {
        assert_eq!(counts[loader], tensors, "{loader} compared every tensor: {counts}");
    }
    // `safetensors.torch.load` (of bytes) lacks F8_E8M0, which `safe_open` reads.
    let torch_refused = counts["torch_load_refused"].as_array().unwrap();
    let torch_refused_tensors: u64 = torch_refused.iter().map(|r| r["tensors"].as_u64().unwrap()).sum();
    assert_eq!(counts["torch_load"].as_u64().unwrap() + torch_refused_tensors, tensors, "{counts}");
    assert!(torch_refused.iter().all(|r| r["dtypes"] == json!(["F8_E8M0"])), "{counts}");
    // The streamer has no torch type for some safetensors dtypes and refuses whole files that
    // hold one; every other model it reads in full.
    let refused = counts["runai_refused"].as_array().unwrap();
    let refused_tensors: u64 = refused.iter().map(|r| r["tensors"].as_u64().unwrap()).sum();
    assert_eq!(counts["runai"].as_u64().unwrap() + refused_tensors, tensors, "{counts}");
    for entry in refused {
        for dtype in entry["dtypes"].as_array().unwrap() {
            let dtype = dtype.as_str().unwrap();
            let lacking = ["F8_E4M3FNUZ", "F8_E5M2FNUZ", "F4", "F6_E2M3", "F6_E3M2"];
            assert!(lacking.contains(&dtype), "the Run:ai streamer refused a dtype it defines: {entry}");
        }
        let model = entry["model"].as_str().unwrap();
        assert!(!["zt12/official", "v2/demo-seekable", "hf/llama"].contains(&model), "{entry}");
    }
    assert_eq!(counts["listed"], keys.len() as u64, "{counts}");
    // Four files beside the models and hf/llama's index, which vLLM's patterns do not leave out.
    assert_eq!(counts["pulled"], 5, "every file but the weights, by the streamer's pull_files: {counts}");
}

/// A request written as it is (any method, any path) on a new connection: the status and body.
fn raw(address: &str, method: &str, path: &str, headers: &str) -> (u16, String) {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
    // One write of the whole request, and its failure tolerated: a server that refuses an
    // oversized head answers and closes before reading the rest, and a write after that
    // would fail however fast the machine; the answer is still there to read.
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\n{headers}Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    let _ = stream.write_all(request.as_bytes());
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text)
}

async fn raw_async(address: &str, method: &str, path: &str, headers: &str) -> (u16, String) {
    let (address, method, path, headers) = (address.to_owned(), method.to_owned(), path.to_owned(), headers.to_owned());
    tokio::task::spawn_blocking(move || raw(&address, &method, &path, &headers)).await.unwrap()
}

/// The S3 error code of an XML error body.
fn s3_code(body: &str) -> &str {
    body.split("<Code>").nth(1).and_then(|rest| rest.split("</Code>").next()).unwrap_or("")
}

const TOKEN_A: &str = "team-a-token-0123456789";
const TOKEN_ALL: &str = "every-model-token-0123456789";

fn access_key_id(token: &str) -> String {
    use sha2::Digest as _;
    hex::encode(&sha2::Sha256::digest(token.as_bytes())[..10])
}

fn signed_client(s3_address: &str, key_id: &str, secret: &str) -> object_store::aws::AmazonS3 {
    signed_bucket_client(s3_address, "models", key_id, secret)
}

/// [`signed_client`] of bucket `bucket`.
fn signed_bucket_client(s3_address: &str, bucket: &str, key_id: &str, secret: &str) -> object_store::aws::AmazonS3 {
    object_store::aws::AmazonS3Builder::new()
        .with_endpoint(format!("http://{s3_address}"))
        .with_region("us-east-1")
        .with_bucket_name(bucket)
        .with_allow_http(true)
        .with_access_key_id(key_id)
        .with_secret_access_key(secret)
        .with_retry(object_store::RetryConfig { max_retries: 0, ..Default::default() })
        .build()
        .unwrap()
}

/// With tokens, each is an S3 key (id: its SHA-256's first 20 hex digits, secret: itself):
/// SigV4-signed requests (object_store signs them) list and read exactly what the token may;
/// unsigned requests, unknown keys, wrong secrets and stale dates are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_requests_read_what_their_token_may() {
    use futures_util::TryStreamExt as _;
    use object_store::{ObjectStore as _, ObjectStoreExt as _};

    let dir = tempfile::tempdir().unwrap();
    for team in ["team-a", "team-b"] {
        fs::create_dir_all(dir.path().join(team)).unwrap();
        let model = common::model(&[("w", DType::F32, &[1, 2, 3, 4, 5, 6, 7, 8], true)]);
        fs::write(dir.path().join(format!("{team}/m.zt")), model).unwrap();
    }
    let config = Config {
        sources: ztserve::config::Sources {
            paths: vec![ztserve::config::SourceSpec::try_from(dir.path().display().to_string()).unwrap()],
            ..Default::default()
        },
        auth: ztserve::config::Auth {
            tokens: common::tokens(vec![format!("{TOKEN_A} team-a"), TOKEN_ALL.to_owned()]),
            ..Default::default()
        },
        ..Config::default()
    };
    let (address, s3_address, _state) = serve_with_s3(config).await;

    let team_a = signed_client(&s3_address, &access_key_id(TOKEN_A), TOKEN_A);
    let listed: Vec<String> = team_a.list(None).map_ok(|m| m.location.to_string()).try_collect().await.unwrap();
    assert_eq!(listed, ["team-a/m/model.safetensors"], "only the token's models, as loaders need them");
    let stored = signed_bucket_client(&s3_address, "models-stored", &access_key_id(TOKEN_A), TOKEN_A);
    let listed: Vec<String> = stored.list(None).map_ok(|m| m.location.to_string()).try_collect().await.unwrap();
    assert_eq!(listed, ["team-a/m/m.zt"], "only the token's models, as stored");
    let view = team_a.get(&"team-a/m/model.safetensors".into()).await.unwrap().bytes().await.unwrap();
    let bearer = format!("Bearer {TOKEN_A}");
    let over_http = request_async(&address, "/models/team-a/m/model.safetensors", &[("authorization", &bearer)]).await;
    assert!(over_http.status == 200 && view[..] == over_http.body[..], "the same bytes as the HTTP route");
    let ranged = team_a.get_range(&"team-a/m/model.safetensors".into(), 3..20).await.unwrap();
    assert_eq!(ranged[..], over_http.body[3..20]);
    let other = team_a.get(&"team-b/m/model.safetensors".into()).await.unwrap_err();
    assert!(matches!(other, object_store::Error::NotFound { .. }), "another team's model is absent: {other}");

    let everything = signed_client(&s3_address, &access_key_id(TOKEN_ALL), TOKEN_ALL);
    let listed: Vec<String> = everything.list(None).map_ok(|m| m.location.to_string()).try_collect().await.unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");

    for (id, secret, code) in [
        (access_key_id(TOKEN_A), "not-the-token-0123456789", "SignatureDoesNotMatch"),
        ("0123456789abcdef0123".to_owned(), TOKEN_A, "InvalidAccessKeyId"),
    ] {
        let refused = signed_client(&s3_address, &id, secret).get(&"team-a/m/model.safetensors".into()).await;
        let error = refused.unwrap_err().to_string();
        assert!(error.contains(code), "{code}: {error}");
    }
    let (status, body) = raw_async(&s3_address, "GET", "/models/team-a/m/model.safetensors", "").await;
    assert_eq!((status, s3_code(&body)), (403, "AccessDenied"), "unsigned: {body}");
    let stale = format!(
        "x-amz-date: 20200101T000000Z\r\nx-amz-content-sha256: UNSIGNED-PAYLOAD\r\nAuthorization: AWS4-HMAC-SHA256 \
         Credential={}/20200101/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date, \
         Signature={}\r\n",
        access_key_id(TOKEN_A),
        "0".repeat(64)
    );
    let (status, body) = raw_async(&s3_address, "GET", "/models/team-a/m/model.safetensors", &stale).await;
    assert_eq!(status, 403, "a stale date: {body}");
    assert!(["RequestTimeTooSkewed", "SignatureDoesNotMatch"].contains(&s3_code(&body)), "{body}");
}

/// Hostile requests get a precise S3 error, never a 500 nor a byte outside a source, and the
/// endpoint serves others throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_get_precise_s3_errors() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    fs::create_dir_all(models.join("org")).unwrap();
    fs::write(models.join("org/m.zt"), common::model(&[("w", DType::U8, b"12345678", false)])).unwrap();
    fs::write(dir.path().join("secret.txt"), "outside the source").unwrap();
    fs::write(models.join("org/notes.txt"), "not a model file").unwrap();
    let config = Config::serving(vec![ztserve::config::SourceSpec::try_from(models.display().to_string()).unwrap()]);
    let (_address, s3, _state) = serve_with_s3(config).await;
    let good = "/models/org/m/model.safetensors";
    let long_prefix = format!("/models?list-type=2&prefix={}", "a".repeat(8000));
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("GET", "/models/../secret.txt".into(), 404, "NoSuchKey"),
        ("GET", "/models/org/..%2F..%2Fsecret.txt".into(), 404, "NoSuchKey"),
        ("GET", "/models/org%5C..%5C..%5Csecret.txt".into(), 404, "NoSuchKey"),
        ("GET", "/models/%2E%2E/secret.txt".into(), 404, "NoSuchKey"),
        ("GET", "/models/org/notes.txt".into(), 404, "NoSuchKey"),
        ("GET", "/models/org/m".into(), 404, "NoSuchKey"),
        ("GET", "/other/org/m/model.safetensors".into(), 404, "NoSuchBucket"),
        // The stored file is in the stored files' bucket only; the view, in the loaders' only.
        ("GET", "/models/org/m/m.zt".into(), 404, "NoSuchKey"),
        ("GET", "/models-stored/org/m/model.safetensors".into(), 404, "NoSuchKey"),
        ("HEAD", "/models-stored/org/m/m.zt".into(), 200, ""),
        ("GET", "/models?list-type=2&max-keys=-1".into(), 400, "InvalidArgument"),
        ("GET", "/models?list-type=2&max-keys=abc".into(), 400, "InvalidArgument"),
        ("GET", "/models?list-type=2&max-keys=99999999999999999999".into(), 400, "InvalidArgument"),
        ("GET", "/models?list-type=2&continuation-token=bm90LW91cnM".into(), 400, "InvalidArgument"),
        ("GET", long_prefix, 200, ""),
        ("PUT", "/models/org/m/model.safetensors".into(), 501, "NotImplemented"),
        ("DELETE", "/models/org/m/model.safetensors".into(), 501, "NotImplemented"),
        ("POST", "/models?delete".into(), 400, "MissingRequestBodyError"),
        ("PUT", "/models".into(), 501, "NotImplemented"),
        ("GET", "/models?acl".into(), 501, "NotImplemented"),
    ];
    for (method, path, status, code) in cases {
        let (got, body) = raw_async(&s3, method, &path, "").await;
        let shown = &path[..path.len().min(80)];
        assert_eq!((got, s3_code(&body)), (status, code), "{method} {shown}: {body}");
        assert!(!body.contains("outside the source"), "{method} {shown} read outside the source");
        let (still, _) = raw_async(&s3, "GET", good, "").await;
        assert_eq!(still, 200, "the endpoint serves others after {method} {shown}");
    }
    // Ranges: unsatisfiable is InvalidRange; conditionals answer 304 and 412.
    let (status, body) = raw_async(&s3, "GET", good, "Range: bytes=999999-\r\n").await;
    assert_eq!((status, s3_code(&body)), (416, "InvalidRange"), "{body}");
    let (_, head) = raw_async(&s3, "HEAD", good, "").await;
    let etag = head.lines().find_map(|l| l.strip_prefix("etag: ")).unwrap().trim().to_owned();
    let (status, _) = raw_async(&s3, "GET", good, &format!("If-None-Match: {etag}\r\n")).await;
    assert_eq!(status, 304);
    let (status, body) = raw_async(&s3, "GET", good, "If-Match: \"other\"\r\n").await;
    assert_eq!((status, s3_code(&body)), (412, "PreconditionFailed"), "{body}");
    let (status, _) = raw_async(&s3, "GET", good, &format!("If-Match: {etag}\r\nRange: bytes=0-7\r\n")).await;
    assert_eq!(status, 206);
    // An oversized head is refused by the connection layer, as on the HTTP listener.
    let (status, _) = raw_async(&s3, "GET", good, &format!("x-big: {}\r\n", "b".repeat(20_000))).await;
    assert_eq!(status, 431);
}

/// Models stored on S3 are served by the endpoint as local ones are: the view (decoded from
/// zstd), the stored file and the files beside the model, each the bytes the HTTP routes give.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_serves_models_stored_on_s3() {
    use futures_util::TryStreamExt as _;
    use object_store::{ObjectStore as _, ObjectStoreExt as _};

    let source = common::ModelSource::s3();
    let weights: Vec<u8> = (0..1u32 << 18).flat_map(|i| (i / 7).to_le_bytes()).collect();
    source.put("org/llama/model.zt", &common::model(&[("w", DType::U32, &weights, true)])).await;
    source.put("org/llama/config.json", b"{\"layers\": 2}").await;
    let (address, s3_address, _state) = serve_with_s3(source.config(Config::default())).await;

    // A `model.zt` is its directory's model: `org/llama`, whose config sits beside it.
    let client = signed_client(&s3_address, "any", "any");
    let listed: Vec<String> = client.list(None).map_ok(|m| m.location.to_string()).try_collect().await.unwrap();
    assert_eq!(listed, ["org/llama/config.json", "org/llama/model.safetensors"], "what loaders need, once");
    let stored = signed_bucket_client(&s3_address, "models-stored", "any", "any");
    let listed: Vec<String> = stored.list(None).map_ok(|m| m.location.to_string()).try_collect().await.unwrap();
    assert_eq!(listed, ["org/llama/config.json", "org/llama/model.zt"], "the model as stored");
    for (bucket, key, route) in [
        (&client, "org/llama/model.safetensors", "/models/org/llama/model.safetensors"),
        (&stored, "org/llama/model.zt", "/models/org/llama/file"),
    ] {
        let over_s3 = bucket.get(&key.into()).await.unwrap().bytes().await.unwrap();
        let over_http = request_async(&address, route, &[]).await;
        assert!(over_http.status == 200 && over_s3[..] == over_http.body[..], "{key}");
    }
    let config = client.get(&"org/llama/config.json".into()).await.unwrap().bytes().await.unwrap();
    assert_eq!(&config[..], b"{\"layers\": 2}");
}

/// Runs `program ARGS` with `envs` (and no `AWS_CA_BUNDLE`) off the runtime; returns its
/// standard output, failing the test with its standard error when it exits non-zero.
async fn run_tool(program: &str, args: Vec<String>, envs: Vec<(String, String)>) -> String {
    common::external(program);
    let program = program.to_owned();
    tokio::task::spawn_blocking(move || {
        let output = std::process::Command::new(&program)
            .args(&args)
            // A machine's CA bundle for AWS (this one sets it) means nothing to a plain-HTTP
            // endpoint, and rclone's AWS SDK refuses to start with one on its HTTP transport.
            .env_remove("AWS_CA_BUNDLE")
            .envs(envs)
            .output()
            .unwrap_or_else(|e| panic!("{program} does not run ({e}): scripts/test installs it"));
        assert!(
            output.status.success(),
            "{program} {args:?} failed:\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    })
    .await
    .unwrap()
}

/// Clients that list with ListObjects version 1 (Debian's rclone with provider `Other` and its
/// default settings, `aws s3api list-objects`) see exactly the keys ListObjectsV2 lists, page
/// after page (past 1,000 keys, and one common prefix a page with a delimiter), and rclone
/// copies either bucket whole: `rclone check` finds every file identical; the loaders' bucket
/// holds each model's companions and safetensors files (the bytes of their HTTP routes), the
/// stored files' bucket each model's files as stored (the bytes of its source files).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rclone_and_the_aws_cli_list_and_copy_the_bucket_with_list_objects_v1() {
    use futures_util::TryStreamExt as _;
    use object_store::ObjectStore as _;

    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    let weights: Vec<u8> = (0..1u32 << 16).flat_map(|i| (i / 5).to_le_bytes()).collect();
    // Each source file, the key it is listed under, and its bytes.
    // A `model.zt` is its directory's model: `org/llama/model.zt` is `org/llama`.
    let llama = |name: &str| (format!("org/llama/{name}"), format!("org/llama/{name}"));
    let files: Vec<(String, String, Vec<u8>)> = [
        (llama("model.zt"), common::model(&[("w", DType::U32, &weights, true)])),
        (llama("config.json"), b"{\"layers\": 2}".to_vec()),
        (llama("tokenizer/vocab.txt"), b"a\nb\n".to_vec()),
    ]
    .into_iter()
    .chain((0..520u32).flat_map(|i| {
        // A model and its config beside it, named after it: two keys in either bucket.
        let model = (format!("many/m{i:03}.zt"), format!("many/m{i:03}/m{i:03}.zt"));
        let config = (format!("many/m{i:03}.config.json"), format!("many/m{i:03}/m{i:03}.config.json"));
        [(model, common::model(&[("w", DType::U32, &i.to_le_bytes(), false)])), (config, i.to_string().into_bytes())]
    }))
    .map(|((name, key), bytes)| (name, key, bytes))
    .collect();
    for (name, _, bytes) in &files {
        let path = models.join(name);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, bytes).unwrap();
    }
    let config = Config::serving(vec![ztserve::config::SourceSpec::try_from(models.display().to_string()).unwrap()]);
    let (address, s3_address, _state) = serve_with_s3(config).await;
    let endpoint = format!("http://{s3_address}");

    let listed_v2: Vec<String> = signed_client(&s3_address, "any", "any")
        .list(None)
        .map_ok(|meta| meta.location.to_string())
        .try_collect()
        .await
        .unwrap();
    assert!(listed_v2.len() > 1040, "{} keys: enough to page", listed_v2.len());

    // The aws CLI from Debian (not a pip-installed one earlier on PATH), unsigned.
    let aws_envs: Vec<(String, String)> = [
        ("AWS_DEFAULT_REGION", "us-east-1"),
        ("AWS_CONFIG_FILE", "/dev/null"),
        ("AWS_SHARED_CREDENTIALS_FILE", "/dev/null"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let aws = |extra: &[&str]| {
        let mut args: Vec<String> =
            ["s3api", "list-objects", "--bucket", "models", "--no-sign-request", "--output", "json", "--endpoint-url"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        args.push(endpoint.clone());
        args.extend(extra.iter().map(|s| s.to_string()));
        run_tool("/usr/bin/aws", args, aws_envs.clone())
    };
    let listing: Value = serde_json::from_str(&aws(&[]).await).unwrap();
    let listed_v1: Vec<String> =
        listing["Contents"].as_array().unwrap().iter().map(|o| o["Key"].as_str().unwrap().to_owned()).collect();
    assert_eq!(listed_v1, listed_v2, "list-objects (v1, paged by markers) lists what ListObjectsV2 lists");
    let listing: Value = serde_json::from_str(&aws(&["--delimiter", "/", "--page-size", "1"]).await).unwrap();
    let prefixes: Vec<&str> =
        listing["CommonPrefixes"].as_array().unwrap().iter().map(|p| p["Prefix"].as_str().unwrap()).collect();
    assert_eq!(prefixes, ["many/", "org/"], "one common prefix a page, each once: {listing}");
    assert!(listing.get("Contents").is_none_or(Value::is_null), "no key sits at the top: {listing}");
    let listing: Value =
        serde_json::from_str(&aws(&["--prefix", "org/llama/", "--delimiter", "/", "--page-size", "2"]).await).unwrap();
    let keys: Vec<&str> = listing["Contents"].as_array().unwrap().iter().map(|o| o["Key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["org/llama/config.json", "org/llama/model.safetensors"], "{listing}");
    assert_eq!(listing["CommonPrefixes"], json!([{ "Prefix": "org/llama/tokenizer/" }]), "{listing}");

    // rclone with provider Other and nothing else set: anonymous, path-style, ListObjects v1.
    let config_file = dir.path().join("rclone.conf");
    fs::write(&config_file, "").unwrap();
    let rclone_envs: Vec<(String, String)> = [
        ("RCLONE_CONFIG", config_file.to_str().unwrap()),
        ("RCLONE_CONFIG_ZT_TYPE", "s3"),
        ("RCLONE_CONFIG_ZT_PROVIDER", "Other"),
        ("RCLONE_CONFIG_ZT_ENDPOINT", &endpoint),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let args = |words: &[&str]| words.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let rclone_copy = |bucket: &str| {
        let (copy, envs) = (dir.path().join(format!("copy-{bucket}")), rclone_envs.clone());
        let (from, to) = (format!("zt:{bucket}"), copy.to_str().unwrap().to_owned());
        async move {
            run_tool("rclone", args(&["copy", &from, &to]), envs.clone()).await;
            run_tool("rclone", args(&["check", "--download", &from, &to]), envs).await;
            let mut copied: Vec<String> =
                walk(&copy).iter().map(|e| e.strip_prefix(&copy).unwrap().to_str().unwrap().to_owned()).collect();
            copied.sort();
            (copy, copied)
        }
    };
    let (stored, copied) = rclone_copy("models-stored").await;
    let mut expected: Vec<&str> = files.iter().map(|(_, key, _)| key.as_str()).collect();
    expected.sort();
    assert_eq!(copied, expected, "rclone copied every stored file");
    for (name, key, bytes) in &files {
        assert!(fs::read(stored.join(key)).unwrap() == *bytes, "{key}: rclone's copy differs from the source {name}");
    }
    let (copy, copied) = rclone_copy("models").await;
    assert_eq!(copied, listed_v2, "rclone copied every key");
    assert!(!copied.iter().any(|k| k.ends_with(".zt")), "no stored .zt among what loaders list");
    for (name, key, bytes) in files.iter().filter(|(_, key, _)| !key.ends_with(".zt")) {
        assert!(fs::read(copy.join(key)).unwrap() == *bytes, "{key}: rclone's copy differs from the source {name}");
    }
    for key in listed_v2.iter().filter(|k| k.ends_with(".safetensors")) {
        let id = key.trim_end_matches("/model.safetensors");
        let served = request_async(&address, &format!("/models/{id}/model.safetensors"), &[]).await;
        assert_eq!(served.status, 200, "{key}");
        assert!(fs::read(copy.join(key)).unwrap() == served.body, "{key}: rclone's copy differs from the view");
    }

    // `aws s3 sync` of one model from either bucket: as stored, and as loaders read it.
    for (bucket, expected) in [
        ("models-stored", vec!["config.json", "model.zt", "tokenizer/vocab.txt"]),
        ("models", vec!["config.json", "model.safetensors", "tokenizer/vocab.txt"]),
    ] {
        let synced = dir.path().join(format!("sync-{bucket}"));
        let args: Vec<String> = ["s3", "sync", &format!("s3://{bucket}/org/llama/"), synced.to_str().unwrap()]
            .into_iter()
            .map(str::to_owned)
            .chain(["--no-sign-request".to_owned(), "--endpoint-url".to_owned(), endpoint.clone()])
            .collect();
        run_tool("/usr/bin/aws", args, aws_envs.clone()).await;
        let mut got: Vec<String> =
            walk(&synced).iter().map(|p| p.strip_prefix(&synced).unwrap().to_str().unwrap().to_owned()).collect();
        got.sort();
        assert_eq!(got, expected, "aws s3 sync of {bucket}");
        for name in expected {
            let copied = if bucket == "models" {
                copy.join("org/llama").join(name)
            } else {
                stored.join("org/llama").join(name)
            };
            assert!(fs::read(synced.join(name)).unwrap() == fs::read(copied).unwrap(), "{bucket}: {name} differs");
        }
    }
}

/// Every file below `dir`, recursively.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() { found.extend(walk(&path)) } else { found.push(path) }
    }
    found
}

/// A directory holding one model gives it every file beside it; a directory holding several
/// gives each file to the model whose file stem the file is named after (the longest), and a
/// file named after none to none, so no model lists a sibling's files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_beside_several_models_belong_to_the_model_they_are_named_after() {
    use futures_util::TryStreamExt as _;
    use object_store::ObjectStore as _;

    let dir = tempfile::tempdir().unwrap();
    let model = common::model(&[("w", DType::U8, b"12345678", false)]);
    for name in ["solo/m.zt", "multi/llama.zt", "multi/llama-2.zt", "multi/mistral.safetensors"] {
        let path = dir.path().join(name);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        if name.ends_with(".safetensors") {
            fs::write(path, common::safetensors_file(&[("w", safetensors::Dtype::U8, vec![2], &[1, 2])])).unwrap();
        } else {
            fs::write(path, &model).unwrap();
        }
    }
    for name in [
        "solo/config.json",
        "solo/tokenizer/vocab.txt",
        "multi/llama.config.json",
        "multi/llama-tokenizer.json",
        "multi/llama/vocab.txt",
        "multi/llama-2.expect.json",
        "multi/mistral_generation_config.json",
        "multi/notes.txt",
        "multi/llamas.json",
    ] {
        let path = dir.path().join(name);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, name).unwrap();
    }
    let config =
        Config::serving(vec![ztserve::config::SourceSpec::try_from(dir.path().display().to_string()).unwrap()]);
    let (_address, s3_address, _state) = serve_with_s3(config).await;
    let mut keys: Vec<String> = signed_client(&s3_address, "any", "any")
        .list(None)
        .map_ok(|meta| meta.location.to_string())
        .try_collect()
        .await
        .unwrap();
    keys.retain(|k| !k.ends_with(".safetensors"));
    assert_eq!(
        keys,
        [
            "multi/llama-2/llama-2.expect.json",
            "multi/llama/llama-tokenizer.json",
            "multi/llama/llama.config.json",
            "multi/llama/llama/vocab.txt",
            "multi/mistral/mistral_generation_config.json",
            "solo/m/config.json",
            "solo/m/tokenizer/vocab.txt",
        ],
        "each file under the model it is named after; notes.txt and llamas.json under none"
    );
}

/// The loaders' bucket holds, for every repository the Hub API lists, exactly the paths its
/// tree lists, below the repository's id: a folder's GGUF file beside its checkpoint and a
/// folder of GGUF quantizations keep the paths they have in the folder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_models_bucket_lists_each_hub_repository_under_its_own_paths() {
    use futures_util::TryStreamExt as _;
    use object_store::ObjectStore as _;

    let dir = tempfile::tempdir().unwrap();
    let gguf = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/gguf/tiny");
    let checkpoint = common::safetensors_file(&[("w", safetensors::Dtype::U8, vec![2], &[1, 2])]);
    for (name, bytes) in [
        ("org/x/model.safetensors", checkpoint.clone()),
        ("org/x/config.json", b"{}".to_vec()),
        ("org/x/model.gguf", fs::read(gguf.join("tiny-Q8_0.gguf")).unwrap()),
        ("org/quants/tiny-Q8_0.gguf", fs::read(gguf.join("tiny-Q8_0.gguf")).unwrap()),
        ("org/quants/tiny-F16.gguf", fs::read(gguf.join("tiny-F16.gguf")).unwrap()),
        ("org/quants/README.md", b"# quants".to_vec()),
        ("org/solo.safetensors", checkpoint),
    ] {
        let path = dir.path().join(name);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, bytes).unwrap();
    }
    let config =
        Config::serving(vec![ztserve::config::SourceSpec::try_from(dir.path().display().to_string()).unwrap()]);
    let (address, s3_address, _state) = serve_with_s3(config).await;

    let mut hub_keys = Vec::new();
    for repo in request_async(&address, "/hf/api/models", &[]).await.json().as_array().unwrap() {
        let repo = repo["id"].as_str().unwrap();
        let tree = request_async(&address, &format!("/hf/api/models/{repo}/tree/main?recursive=true"), &[]).await;
        for entry in tree.json().as_array().unwrap().iter().filter(|e| e["type"] == "file") {
            hub_keys.push(format!("{repo}/{}", entry["path"].as_str().unwrap()));
        }
    }
    hub_keys.sort();
    let keys: Vec<String> = signed_client(&s3_address, "any", "any")
        .list(None)
        .map_ok(|meta| meta.location.to_string())
        .try_collect()
        .await
        .unwrap();
    assert_eq!(keys, hub_keys, "the bucket lists what the Hub lists");
    for key in ["org/x/model.gguf", "org/x/config.json", "org/quants/tiny-F16.gguf", "org/quants/README.md"] {
        assert!(keys.iter().any(|k| k == key), "{key} in {keys:?}");
    }
}
