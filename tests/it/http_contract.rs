//! The HTTP contract (`openapi.yaml`), over files from our writer and the official packages.
//! Every test runs twice: against a local directory and against an S3 prefix on a moto server
//! started on 127.0.0.1 (see `both_sources!` at the end).

use crate::common;

use common::ModelSource;

use std::fs;
use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use tower::ServiceExt;
use ztserve::config::Config;
use ztserve::format::DType;
use ztserve::format::write::{ComponentInput, DigestAlgorithm, ObjectInput, WriteOptions, Writer};
use ztserve::server::Server;

struct Reply {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> &str {
        self.headers.get(name).map_or("", |v| v.to_str().unwrap())
    }
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }
    fn error_code(&self) -> String {
        self.json()["error"]["code"].as_str().unwrap().to_owned()
    }
}

async fn send(state: &Arc<Server>, method: Method, uri: &str, headers: &[(&str, &str)]) -> Reply {
    let mut request = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = state.http_app().oneshot(request.body(Body::empty()).unwrap()).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap().to_vec();
    Reply { status, headers, body }
}

async fn get(state: &Arc<Server>, uri: &str, headers: &[(&str, &str)]) -> Reply {
    send(state, Method::GET, uri, headers).await
}

fn f32_bytes(n: usize) -> Vec<u8> {
    (0..n).flat_map(|i| (i as f32 * 0.25).to_le_bytes()).collect()
}

/// Our own file: f32 weights (sha256), u64 ids (zstd), an odd name and a three-component object.
fn llama() -> Vec<u8> {
    let weights = f32_bytes(1000);
    let ids: Vec<u8> = (0..4096u32).flat_map(|i| u64::from(i / 3).to_le_bytes()).collect();
    let mut w = Writer::new(Vec::new()).unwrap();
    let dense = |name: &'static str, shape: &'static [u64], dtype, bytes: &'static [u8]| ObjectInput {
        name,
        shape,
        format: "dense",
        attributes: None,
        components: vec![ComponentInput { role: "data", dtype, logical_type: None, bytes }],
    };
    let weights: &'static [u8] = weights.leak();
    let ids: &'static [u8] = ids.leak();
    w.add(
        &dense("weights", &[10, 100], DType::F32, weights),
        &WriteOptions { zstd_level: None, digest: Some(DigestAlgorithm::Sha256) },
    )
    .unwrap();
    w.add(&dense("ids.zstd", &[4096], DType::U64, ids), &WriteOptions { zstd_level: Some(3), digest: None }).unwrap();
    w.add(&dense("a/b c%?#ü", &[4], DType::F32, &weights[..16]), &WriteOptions::default()).unwrap();
    w.add(
        &ObjectInput {
            name: "q",
            shape: &[8],
            format: "quantized_group",
            attributes: None,
            components: vec![
                ComponentInput { role: "packed_weight", dtype: DType::I32, logical_type: None, bytes: &weights[..16] },
                ComponentInput { role: "scales", dtype: DType::F16, logical_type: None, bytes: &weights[16..20] },
                ComponentInput { role: "zeros", dtype: DType::F16, logical_type: None, bytes: &weights[20..24] },
            ],
        },
        &WriteOptions::default(),
    )
    .unwrap();
    w.finish(None).unwrap()
}

/// Fills a source with `org/llama` and a broken file.
async fn populate(source: &ModelSource) {
    source.put("org/llama.zt", &llama()).await;
    source.put("broken.zt", b"ZTEN1000 this is not a finished zTensor file at all").await;
}

async fn state_for(source: &ModelSource) -> Arc<Server> {
    let state = Server::new(source.config(Config {
        limits: ztserve::config::Limits { max_ranges: 8, ..Default::default() },
        ..Config::default()
    }))
    .unwrap();
    state.rescan().await;
    state
}

/// A source filled by [`populate`] and a state serving it.
async fn populated_state(source: &ModelSource) -> Arc<Server> {
    populate(source).await;
    state_for(source).await
}

const WEIGHTS: &str = "/models/org%2Fllama/objects/weights";

async fn readyz_is_503_until_the_first_index_then_200_and_healthz_is_always_200(source: ModelSource) {
    populate(&source).await;
    let state = Server::new(source.config(Config::default())).unwrap();
    assert_eq!(get(&state, "/readyz", &[]).await.status, StatusCode::SERVICE_UNAVAILABLE);
    let not_ready = get(&state, "/models", &[]).await;
    assert_eq!((not_ready.status, not_ready.error_code().as_str()), (StatusCode::SERVICE_UNAVAILABLE, "not_ready"));
    assert_eq!(get(&state, "/healthz", &[]).await.status, StatusCode::OK);
    state.rescan().await;
    let ready = get(&state, "/readyz", &[]).await;
    assert_eq!(ready.status, StatusCode::OK);
    assert_eq!(ready.json()["broken"], 1);
}

async fn the_model_list_shows_good_and_broken_files_with_reasons(source: ModelSource) {
    let state = populated_state(&source).await;
    let list = get(&state, "/models", &[]).await.json();
    let models = list["models"].as_array().unwrap();
    assert_eq!(models.len(), 2);
    assert_eq!(models[0]["id"], "broken");
    assert_eq!(models[0]["status"], "broken");
    assert_eq!(models[0]["reason"]["code"], "bad_footer_magic");
    assert_eq!(models[1]["id"], "org/llama");
    assert_eq!(models[1]["status"], "ok");
    assert_eq!(models[1]["objects"], 4);
    assert_eq!(models[1]["source"], source.name().as_str(), "served from the {} source", source.kind());
    let broken = get(&state, "/models/broken", &[]).await;
    assert_eq!((broken.status, broken.error_code().as_str()), (StatusCode::UNPROCESSABLE_ENTITY, "broken_model"));
    assert_eq!(get(&state, "/models/broken/objects/x", &[]).await.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        get(&state, "/models/org%2Fllama", &[]).await.status,
        StatusCode::OK,
        "a broken file never stops the others"
    );
}

async fn the_manifest_lists_every_object_with_component_urls(source: ModelSource) {
    let state = populated_state(&source).await;
    let reply = get(&state, "/models/org%2Fllama", &[]).await;
    assert_eq!(reply.header("content-type"), "application/json");
    let manifest = reply.json();
    assert_eq!(manifest["version"], "1.2.0");
    let odd = manifest["objects"].as_array().unwrap().iter().find(|o| o["name"] == "a/b c%?#ü").unwrap();
    let url = odd["components"][0]["url"].as_str().unwrap();
    assert_eq!(url, "/models/org/llama/objects/a%2Fb%20c%25%3F%23%C3%BC/components/data", "the id written naturally");
    let bytes = get(&state, url, &[]).await;
    assert_eq!(bytes.body, f32_bytes(4));
    for object in manifest["objects"].as_array().unwrap() {
        for component in object["components"].as_array().unwrap() {
            assert_eq!(component["file"], "llama.zt", "every component names the file its bytes live in");
        }
    }
}

async fn a_dense_object_answers_its_bytes_with_every_contract_header(source: ModelSource) {
    let state = populated_state(&source).await;
    let reply = get(&state, WEIGHTS, &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body, f32_bytes(1000));
    assert_eq!(reply.header("content-type"), "application/octet-stream");
    assert_eq!(reply.header("content-length"), "4000");
    assert_eq!(reply.header("accept-ranges"), "bytes");
    assert_eq!(reply.header("x-zt-dtype"), "f32");
    assert_eq!(reply.header("x-zt-shape"), "10,100");
    assert_eq!(reply.header("x-zt-format"), "dense");
    assert!(reply.header("etag").starts_with('"'));
    let component = get(&state, &format!("{WEIGHTS}/components/data"), &[]).await;
    assert_eq!(component.body, reply.body);
    assert_eq!(component.header("etag"), reply.header("etag"));
}

async fn zstd_components_are_served_decoded(source: ModelSource) {
    let state = populated_state(&source).await;
    let reply = get(&state, "/models/org%2Fllama/objects/ids.zstd", &[("range", "bytes=8-15")]).await;
    assert_eq!(reply.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(reply.body, 0u64.to_le_bytes());
    let full = get(&state, "/models/org%2Fllama/objects/ids.zstd", &[]).await;
    assert_eq!(full.body.len(), 4096 * 8);
    assert_eq!(&full.body[8 * 4095..], &(4095u64 / 3).to_le_bytes());
}

async fn ranges_single_suffix_open_and_multiple(source: ModelSource) {
    let state = populated_state(&source).await;
    let all = f32_bytes(1000);
    for (range, slice, content_range) in [
        ("bytes=0-99", 0..100, "bytes 0-99/4000"),
        ("bytes=-10", 3990..4000, "bytes 3990-3999/4000"),
        ("bytes=3000-", 3000..4000, "bytes 3000-3999/4000"),
        ("bytes=3999-99999", 3999..4000, "bytes 3999-3999/4000"),
    ] {
        let reply = get(&state, WEIGHTS, &[("range", range)]).await;
        assert_eq!(reply.status, StatusCode::PARTIAL_CONTENT, "{range}");
        assert_eq!(reply.header("content-range"), content_range);
        assert_eq!(reply.body, all[slice]);
    }
    let multi = get(&state, WEIGHTS, &[("range", "bytes=0-3,-4")]).await;
    assert_eq!(multi.status, StatusCode::PARTIAL_CONTENT);
    let content_type = multi.header("content-type").to_owned();
    let boundary = content_type.strip_prefix("multipart/byteranges; boundary=").unwrap();
    let text = multi.body.clone();
    assert_eq!(multi.header("content-length"), text.len().to_string());
    let parts: Vec<&[u8]> = split(&text, format!("--{boundary}").as_bytes());
    assert_eq!(parts.len(), 4, "preamble, two parts, epilogue");
    for (part, (range, bytes)) in
        parts[1..3].iter().zip([("bytes 0-3/4000", &all[0..4]), ("bytes 3996-3999/4000", &all[3996..])])
    {
        let head_end = part.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        let head = String::from_utf8_lossy(&part[..head_end]);
        assert!(head.contains(&format!("Content-Range: {range}")), "{head}");
        assert_eq!(&part[head_end + 4..part.len() - 2], bytes);
    }
}

fn split<'a>(haystack: &'a [u8], needle: &[u8]) -> Vec<&'a [u8]> {
    let mut parts = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i + needle.len() <= haystack.len() {
        if &haystack[i..i + needle.len()] == needle {
            parts.push(&haystack[start..i]);
            i += needle.len();
            start = i;
        } else {
            i += 1;
        }
    }
    parts.push(&haystack[start..]);
    parts
}

async fn unsatisfiable_ranges_answer_416_with_the_length_and_invalid_ones_are_ignored(source: ModelSource) {
    let state = populated_state(&source).await;
    let reply = get(&state, WEIGHTS, &[("range", "bytes=4000-")]).await;
    assert_eq!(reply.status, StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(reply.header("content-range"), "bytes */4000");
    assert_eq!(reply.error_code(), "range_not_satisfiable");
    let invalid = get(&state, WEIGHTS, &[("range", "bytes=9-1")]).await;
    assert_eq!((invalid.status, invalid.body.len()), (StatusCode::OK, 4000));
    let too_many = get(&state, WEIGHTS, &[("range", "bytes=0-0,1-1,2-2,3-3,4-4,5-5,6-6,7-7,8-8")]).await;
    assert_eq!(
        (too_many.status, too_many.error_code().as_str()),
        (StatusCode::RANGE_NOT_SATISFIABLE, "too_many_ranges")
    );
}

async fn conditional_requests_follow_rfc_9110(source: ModelSource) {
    let state = populated_state(&source).await;
    let etag = get(&state, WEIGHTS, &[]).await.header("etag").to_owned();
    let not_modified = get(&state, WEIGHTS, &[("if-none-match", &etag)]).await;
    assert_eq!(not_modified.status, StatusCode::NOT_MODIFIED);
    assert!(not_modified.body.is_empty());
    assert_eq!(not_modified.header("etag"), etag);
    assert_eq!(get(&state, WEIGHTS, &[("if-none-match", "\"other\"")]).await.status, StatusCode::OK);
    let matching = get(&state, WEIGHTS, &[("range", "bytes=0-1"), ("if-range", &etag)]).await;
    assert_eq!(matching.status, StatusCode::PARTIAL_CONTENT);
    let stale = get(&state, WEIGHTS, &[("range", "bytes=0-1"), ("if-range", "\"stale\"")]).await;
    assert_eq!((stale.status, stale.body.len()), (StatusCode::OK, 4000));
}

async fn the_manifest_has_an_etag_and_answers_304_when_it_matches(source: ModelSource) {
    let state = populated_state(&source).await;
    let first = get(&state, "/models/org%2Fllama", &[]).await;
    let etag = first.header("etag").to_owned();
    assert!(etag.starts_with('"') && etag.len() > 2, "{etag:?}");
    assert_eq!(get(&state, "/models/org%2Fllama", &[]).await.header("etag"), etag, "stable per version");
    let not_modified = get(&state, "/models/org%2Fllama", &[("if-none-match", &etag)]).await;
    assert_eq!(not_modified.status, StatusCode::NOT_MODIFIED);
    assert!(not_modified.body.is_empty());
    assert_eq!(not_modified.header("etag"), etag);
    assert_eq!(not_modified.header("x-zt-model-version"), first.header("x-zt-model-version"));
    assert_eq!(get(&state, "/models/org%2Fllama", &[("if-none-match", "\"other\"")]).await.status, StatusCode::OK);
}

async fn head_sends_the_get_headers_without_a_body(source: ModelSource) {
    let state = populated_state(&source).await;
    let reply = send(&state, Method::HEAD, WEIGHTS, &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("content-length"), "4000");
    assert_eq!(reply.header("x-zt-dtype"), "f32");
    assert!(reply.body.is_empty());
}

async fn the_file_route_serves_the_stored_file_byte_for_byte_with_ranges(source: ModelSource) {
    let state = populated_state(&source).await;
    let stored = llama();
    assert_eq!(get(&state, "/models/org%2Fllama/file", &[]).await.body, stored);
    let tail = get(&state, "/models/org%2Fllama/file", &[("range", "bytes=-16")]).await;
    assert_eq!(tail.body, &stored[stored.len() - 16..]);
}

async fn objects_with_several_components_answer_their_description(source: ModelSource) {
    let state = populated_state(&source).await;
    let reply = get(&state, "/models/org%2Fllama/objects/q", &[]).await;
    let description = reply.json();
    assert_eq!(description["format"], "quantized_group");
    assert_eq!(description["components"].as_array().unwrap().len(), 3);
    let scales = get(&state, description["components"][1]["url"].as_str().unwrap(), &[]).await;
    assert_eq!(scales.body, f32_bytes(1000)[16..20]);
}

async fn every_response_drawn_from_a_model_names_its_version(source: ModelSource) {
    let state = populated_state(&source).await;
    let version = get(&state, "/models/org%2Fllama/file", &[("range", "bytes=0-7")]).await.header("etag").to_owned();
    let responses = [
        get(&state, "/models/org%2Fllama", &[]).await,
        get(&state, WEIGHTS, &[]).await,
        get(&state, WEIGHTS, &[("range", "bytes=4-7")]).await,
        get(&state, &format!("{WEIGHTS}/components/data"), &[]).await,
        get(&state, "/models/org%2Fllama/objects/q", &[]).await,
        send(&state, Method::HEAD, "/models/org%2Fllama/file", &[]).await,
    ];
    for reply in &responses {
        assert_eq!(reply.header("x-zt-model-version"), version);
    }
    // Parts have ETags of their own; only the model version is shared.
    assert_ne!(responses[1].header("etag"), version);
}

async fn every_error_status_has_a_json_body(source: ModelSource) {
    let state = populated_state(&source).await;
    for (method, uri, status, code) in [
        (Method::GET, "/models/missing", StatusCode::NOT_FOUND, "model_not_found"),
        (Method::GET, "/models/org%2Fllama/objects/missing", StatusCode::NOT_FOUND, "object_not_found"),
        (Method::GET, "/models/org%2Fllama/objects/q/components/nope", StatusCode::NOT_FOUND, "component_not_found"),
        (Method::GET, "/nowhere", StatusCode::NOT_FOUND, "route_not_found"),
        (Method::GET, "/models/%FF%FE", StatusCode::BAD_REQUEST, "bad_request"),
        (Method::DELETE, WEIGHTS, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
        (Method::GET, "/models/broken", StatusCode::UNPROCESSABLE_ENTITY, "broken_model"),
    ] {
        let reply = send(&state, method.clone(), uri, &[]).await;
        assert_eq!(reply.status, status, "{method} {uri}");
        assert_eq!(reply.error_code(), code, "{method} {uri}");
        assert!(!reply.json()["error"]["message"].as_str().unwrap().is_empty());
    }
}

async fn ids_and_names_cannot_reach_outside_the_source(source: ModelSource) {
    populate(&source).await;
    // Something just outside the source: beside the directory, or outside the prefix.
    match &source {
        ModelSource::Local(dir) => fs::write(dir.path().parent().unwrap().join("secret.zt"), b"secret").unwrap(),
        ModelSource::S3 { client, .. } => {
            use object_store::ObjectStoreExt as _;
            client
                .put(&object_store::path::Path::from("secret.zt"), object_store::PutPayload::from_static(b"secret"))
                .await
                .unwrap();
        }
    }
    let state = state_for(&source).await;
    for uri in
        ["/models/..%2Fsecret", "/models/%2Fetc%2Fpasswd", "/models/org%2F..%2F..%2Fsecret", "/models/..%252Fsecret"]
    {
        let reply = get(&state, uri, &[]).await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{uri}");
    }
}

/// A model whose one object is `weights`, two f32.
fn small_weights() -> Vec<u8> {
    let mut w = Writer::new(Vec::new()).unwrap();
    let small = f32_bytes(2);
    w.add(
        &ObjectInput {
            name: "weights",
            shape: &[2],
            format: "dense",
            attributes: None,
            components: vec![ComponentInput { role: "data", dtype: DType::F32, logical_type: None, bytes: &small }],
        },
        &WriteOptions::default(),
    )
    .unwrap();
    w.finish(None).unwrap()
}

async fn a_rescan_picks_up_added_replaced_and_removed_files(source: ModelSource) {
    let state = populated_state(&source).await;
    let before = get(&state, WEIGHTS, &[]).await;
    // Replace org/llama atomically with a different file, add one, remove the broken one.
    let small = f32_bytes(2);
    let bytes = small_weights();
    source.put("org/llama.zt", &bytes).await;
    source.put("new.zt", &bytes).await;
    source.remove("broken.zt").await;
    state.rescan().await;
    let after = get(&state, WEIGHTS, &[]).await;
    assert_eq!(after.body, small);
    assert_ne!(after.header("etag"), before.header("etag"));
    assert_ne!(after.header("x-zt-model-version"), before.header("x-zt-model-version"));
    let ids: Vec<String> = get(&state, "/models", &[]).await.json()["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, ["new", "org/llama"]);
}

/// A real server on 127.0.0.1:0 and a plain HTTP/1.1 client over TCP.
/// A GET over a real connection (the one test client, `common::request`).
async fn raw_get(addr: std::net::SocketAddr, path: &str, range: &str) -> (u16, Vec<u8>) {
    let (address, path, range) = (addr.to_string(), path.to_owned(), range.to_owned());
    let reply =
        tokio::task::spawn_blocking(move || common::request(&address, &path, &[("Range", &range)])).await.unwrap();
    (reply.status, reply.body)
}

async fn start_server(source: &ModelSource) -> std::net::SocketAddr {
    common::serve(source.config(Config::default())).await.0.parse().unwrap()
}

async fn sixty_four_concurrent_range_requests_return_correct_bytes(source: ModelSource) {
    populate(&source).await;
    let addr = start_server(&source).await;
    let all = Arc::new(f32_bytes(1000));
    let tasks: Vec<_> = (0..64u64)
        .map(|i| {
            let all = Arc::clone(&all);
            tokio::spawn(async move {
                let (start, end) = (i * 50, i * 50 + 99);
                let (status, body) = raw_get(addr, WEIGHTS, &format!("bytes={start}-{end}")).await;
                assert_eq!(status, 206);
                assert_eq!(body, all[start as usize..=end as usize]);
                let (status, body) =
                    raw_get(addr, "/models/org%2Fllama/objects/ids.zstd", &format!("bytes={}-{}", i * 8, i * 8 + 7))
                        .await;
                assert_eq!(status, 206);
                assert_eq!(body, (i / 3).to_le_bytes());
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

async fn files_from_the_official_writers_are_served_byte_exact(source: ModelSource) {
    let root = tempfile::tempdir().unwrap();
    let mut expectations = Vec::new();
    for version in ["0.1.4", "1.1.1", "1.2.3"] {
        let dir = root.path().join(version);
        common::run_official(version, &[Path::new("write"), &dir]);
        let expect: serde_json::Value = serde_json::from_slice(&fs::read(dir.join("expect.json")).unwrap()).unwrap();
        source.put(&format!("{version}/official.zt"), &fs::read(dir.join("official.zt")).unwrap()).await;
        expectations.push((version, dir, expect));
    }
    let addr = start_server(&source).await;
    let encode = |s: &str| percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string();
    let mut compared = 0;
    for (version, dir, expect) in &expectations {
        let model = encode(&format!("{version}/official"));
        // Every component is fetched at the URL the manifest gives it, whatever its name.
        let (status, manifest) = raw_get(addr, &format!("/models/{model}"), "").await;
        assert_eq!(status, 200, "{version} manifest");
        let manifest: serde_json::Value = serde_json::from_slice(&manifest).unwrap();
        let url_of = |object: &str, role: &str| -> String {
            let rendered = manifest["objects"].as_array().unwrap().iter().find(|o| o["name"] == object);
            let component = rendered.and_then(|o| o["components"].as_array()?.iter().find(|c| c["role"] == role));
            component
                .and_then(|c| c["url"].as_str())
                .unwrap_or_else(|| panic!("{version} {object:?}.{role} unlisted"))
                .into()
        };
        // Every object answers at its own URL too, the object named "" (1.2.3 writes one) at
        // `/objects/`.
        for object in manifest["objects"].as_array().unwrap() {
            let url = object["url"].as_str().unwrap();
            let reply = common::request_async(&addr.to_string(), url, &[]).await;
            assert_eq!(reply.status, 200, "{version} {:?} at {url}", object["name"]);
        }
        assert!(manifest["objects"].as_array().unwrap().iter().any(|o| o["name"] == "") || *version != "1.2.3");
        for (object, roles) in expect["objects"].as_object().unwrap() {
            for (role, bin) in roles.as_object().unwrap() {
                let expected = fs::read(dir.join(bin.as_str().unwrap())).unwrap();
                let path = url_of(object, role);
                let (status, body) = raw_get(addr, &path, "bytes=0-").await;
                let expected_status = if expected.is_empty() { 416 } else { 206 };
                assert_eq!(status, expected_status, "{version} {object}.{role}");
                if !expected.is_empty() {
                    assert!(body == expected, "{version} {object}.{role}: served bytes differ");
                }
                compared += 1;
            }
        }
    }
    assert!(compared > 90, "{compared}");
}

async fn components_failing_content_checks_answer_422_and_valid_ones_still_serve(source: ModelSource) {
    let u64s = |v: &[u64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (values, indices, bad_indptr) = (f32_bytes(2), u64s(&[0, 1]), u64s(&[0, 2, 1]));
    let mut w = Writer::new(Vec::new()).unwrap();
    let c = |role, dtype, bytes| ComponentInput { role, dtype, logical_type: None, bytes };
    let dense = |name, dtype, bytes| ObjectInput {
        name,
        shape: &[3],
        format: "dense",
        attributes: None,
        components: vec![c("data", dtype, bytes)],
    };
    w.add(&dense("flags", DType::Bool, &[0, 2, 1]), &WriteOptions::default()).unwrap();
    w.add(&dense("fine", DType::U8, &[7, 8, 9]), &WriteOptions::default()).unwrap();
    w.add(
        &ObjectInput {
            name: "csr",
            shape: &[2, 2],
            format: "sparse_csr",
            attributes: None,
            components: vec![
                c("values", DType::F32, &values),
                c("indices", DType::U64, &indices),
                c("indptr", DType::U64, &bad_indptr),
            ],
        },
        &WriteOptions::default(),
    )
    .unwrap();
    source.put("m.zt", &w.finish(None).unwrap()).await;
    let state = state_for(&source).await;
    for (uri, reason) in
        [("/models/m/objects/flags", "bool_byte"), ("/models/m/objects/csr/components/values", "sparse_structure")]
    {
        for _ in 0..2 {
            let reply = get(&state, uri, &[]).await;
            assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{uri}");
            assert_eq!(reply.error_code(), "invalid_component");
            assert_eq!(reply.json()["error"]["reason"], reason);
        }
    }
    assert_eq!(get(&state, "/models/m/objects/fine", &[]).await.body, [7, 8, 9]);
}

/// Runs each contract test once per kind of source, as `local::NAME` and `s3::NAME`.
macro_rules! both_sources {
    ($($name:ident),* $(,)?) => {
        mod local {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::ModelSource::local()).await
                }
            )*
        }
        mod s3 {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::ModelSource::s3()).await
                }
            )*
        }
    };
}

/// `/models/org/llama/...` names `org/llama` as `/models/org%2Fllama/...` does, on every model
/// route, with the same bytes and headers; with models `org` and `org/llama`, each path means the
/// longest id whose rest is a model route.
async fn natural_ids_with_slashes_name_the_same_model_as_the_encoded_form(source: ModelSource) {
    populate(&source).await;
    source.put("org.zt", &llama()).await;
    let state = state_for(&source).await;
    for (natural, encoded) in [
        ("/models/org/llama", "/models/org%2Fllama"),
        ("/models/org/llama/objects/weights", WEIGHTS),
        ("/models/org/llama/objects/weights/components/data", "/models/org%2Fllama/objects/weights/components/data"),
        ("/models/org/llama/file", "/models/org%2Fllama/file"),
        ("/models/org/llama/files/llama.zt", "/models/org%2Fllama/files/llama.zt"),
    ] {
        let (a, b) = (get(&state, natural, &[]).await, get(&state, encoded, &[]).await);
        assert_eq!((a.status, &a.body), (StatusCode::OK, &b.body), "{natural}");
        assert_eq!(a.header("etag"), b.header("etag"), "{natural}");
    }
    let ranged = get(&state, "/models/org/llama/objects/weights", &[("range", "bytes=4-7")]).await;
    assert_eq!((ranged.status, ranged.body.as_slice()), (StatusCode::PARTIAL_CONTENT, &0.25f32.to_le_bytes()[..]));
    // `org` is a model too: its own routes are its own, and `org/llama` is not an object of it.
    assert_eq!(get(&state, "/models/org/file", &[]).await.body, llama());
    assert_eq!(get(&state, "/models/org", &[]).await.json()["id"], "org");
    assert_eq!(get(&state, "/models/org/llama", &[]).await.json()["id"], "org/llama");
    // An unknown id answers as in the encoded form: that model does not exist.
    let missing = get(&state, "/models/org/nothing/objects/weights", &[]).await;
    let encoded = get(&state, "/models/org%2Fnothing/objects/weights", &[]).await;
    assert_eq!((missing.status, missing.body), (StatusCode::NOT_FOUND, encoded.body));
}

/// Every model response a shared cache may store says so, and that it must revalidate by ETag:
/// bytes whole, ranged and unmodified, the stored file, and the manifest and its 304.
async fn model_responses_let_a_shared_cache_store_them_and_revalidate_by_etag(source: ModelSource) {
    let state = populated_state(&source).await;
    let whole = get(&state, WEIGHTS, &[]).await;
    let manifest = get(&state, "/models/org%2Fllama", &[]).await;
    let replies = [
        get(&state, WEIGHTS, &[("range", "bytes=0-3")]).await,
        get(&state, WEIGHTS, &[("if-none-match", whole.header("etag"))]).await,
        get(&state, "/models/org%2Fllama/file", &[]).await,
        get(&state, "/models/org%2Fllama", &[("if-none-match", manifest.header("etag"))]).await,
    ];
    let statuses: Vec<u16> = replies.iter().map(|r| r.status.as_u16()).collect();
    assert_eq!(statuses, [206, 304, 200, 304]);
    for reply in [&whole, &manifest].into_iter().chain(&replies) {
        assert_eq!(reply.header("cache-control"), "public, no-cache", "{}", reply.status);
    }
}

/// JSON over 1 KiB is compressed for a client that accepts gzip or zstd (to the same JSON);
/// smaller JSON and tensor bytes never are.
async fn json_is_compressed_when_the_client_accepts_it_and_tensor_bytes_never_are(source: ModelSource) {
    let state = populated_state(&source).await;
    let small = get(&state, "/models", &[("accept-encoding", "gzip")]).await;
    assert!(small.body.len() < 1024 && small.header("content-encoding").is_empty());
    for path in ["/models/org%2Fllama"] {
        let plain = get(&state, path, &[]).await;
        assert_eq!(plain.header("content-encoding"), "", "{path}");
        let gzip = get(&state, path, &[("accept-encoding", "gzip")]).await;
        assert_eq!(gzip.header("content-encoding"), "gzip", "{path}");
        let mut unzipped = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gzip.body[..]), &mut unzipped).unwrap();
        assert_eq!(unzipped, plain.body, "{path}");
        let zstd = get(&state, path, &[("accept-encoding", "zstd")]).await;
        assert_eq!(zstd.header("content-encoding"), "zstd", "{path}");
        // Each coding is a representation of its own, with its own strong ETag.
        let tag = plain.header("etag").trim_end_matches('"');
        assert_eq!(gzip.header("etag"), format!("{tag}-gzip\""), "{path}");
        assert_eq!(zstd.header("etag"), format!("{tag}-zstd\""), "{path}");
        let unchanged = get(&state, path, &[("accept-encoding", "gzip"), ("if-none-match", gzip.header("etag"))]).await;
        assert_eq!((unchanged.status, unchanged.header("etag")), (StatusCode::NOT_MODIFIED, gzip.header("etag")));
        let plain_again = get(&state, path, &[("if-none-match", plain.header("etag"))]).await;
        assert_eq!((plain_again.status, plain_again.header("etag")), (StatusCode::NOT_MODIFIED, plain.header("etag")));
        assert_eq!(zstd::decode_all(&zstd.body[..]).unwrap(), plain.body, "{path}");
        assert!(zstd.body.len() < plain.body.len() / 2, "{path}: {} of {} bytes", zstd.body.len(), plain.body.len());
    }
    let bytes = get(&state, WEIGHTS, &[("accept-encoding", "gzip, zstd")]).await;
    assert_eq!((bytes.status, bytes.header("content-encoding")), (StatusCode::OK, ""));
    assert_eq!(bytes.body, f32_bytes(1000));
}

/// `/models/{id}@{version}/...` (the version as the manifest's `model_version` gives it) serves
/// that version, naturally or encoded, with a year-long immutable `Cache-Control`; once the
/// model changes, the pinned URL answers 404 `version_gone` and the unpinned one the new bytes.
async fn version_pinned_urls_are_immutable_until_the_version_is_gone(source: ModelSource) {
    let state = populated_state(&source).await;
    let manifest = get(&state, "/models/org/llama", &[]).await.json();
    let version = manifest["model_version"].as_str().unwrap().to_owned();
    assert_eq!(manifest["pinned_url"], format!("/models/org/llama@{version}"));
    let unpinned = get(&state, WEIGHTS, &[]).await;
    assert_eq!(unpinned.header("x-zt-model-version"), format!("\"{version}\""));
    let immutable = "public, max-age=31536000, immutable";
    for path in [
        format!("/models/org/llama@{version}/objects/weights"),
        format!("/models/org%2Fllama@{version}/objects/weights"),
        format!("/models/org%2Fllama%40{version}/objects/weights"),
    ] {
        let pinned = get(&state, &path, &[]).await;
        assert_eq!(
            (pinned.status, pinned.header("cache-control")),
            (StatusCode::OK, immutable),
            "{path}: {}",
            String::from_utf8_lossy(&pinned.body)
        );
        assert_eq!(pinned.body, unpinned.body, "{path}");
        assert_eq!(pinned.header("etag"), unpinned.header("etag"), "{path}: the same representation");
    }
    for path in ["", "/file", "/model.safetensors", "/objects/ids.zstd", "/objects/q"] {
        let pinned = get(&state, &format!("/models/org/llama@{version}{path}"), &[]).await;
        assert_eq!((pinned.status, pinned.header("cache-control")), (StatusCode::OK, immutable), "{path}");
    }

    source.put("org/llama.zt", &small_weights()).await;
    state.rescan().await;
    let gone = get(&state, &format!("/models/org/llama@{version}/objects/weights"), &[]).await;
    assert_eq!((gone.status, gone.error_code()), (StatusCode::NOT_FOUND, "version_gone".to_owned()));
    let current = get(&state, WEIGHTS, &[]).await;
    assert_eq!((current.status, current.header("cache-control")), (StatusCode::OK, "public, no-cache"));
    let other = get(&state, "/models/org/llama@0000/objects/weights", &[]).await;
    assert_eq!(other.error_code(), "version_gone");
}

/// A file beside a model (config, tokenizer) is served at `/files/{name}` by its path below the
/// model's directory (`/` written `%2F`), with ranges, as the S3 endpoint serves it. It is not
/// covered by the model version, so even under a pinned URL it is revalidated by its own ETag,
/// which changes when it does.
async fn files_beside_a_model_are_served_with_their_own_etag(source: ModelSource) {
    populate(&source).await;
    let config_json: &[u8] = br#"{"model_type": "llama", "hidden_size": 100}"#;
    source.put("org/config.json", config_json).await;
    source.put("org/tokenizer/vocab.txt", b"a\nb\nc\n").await;
    let state = state_for(&source).await;
    let config = get(&state, "/models/org/llama/files/config.json", &[]).await;
    assert_eq!((config.status, config.body.as_slice()), (StatusCode::OK, config_json));
    assert_eq!(config.header("cache-control"), "public, no-cache");
    assert_eq!(config.header("accept-ranges"), "bytes");
    let vocab = get(&state, "/models/org%2Fllama/files/tokenizer%2Fvocab.txt", &[("Range", "bytes=2-3")]).await;
    assert_eq!((vocab.status, vocab.body.as_slice()), (StatusCode::PARTIAL_CONTENT, &b"b\n"[..]));

    let version = get(&state, "/models/org/llama", &[]).await.json()["model_version"].as_str().unwrap().to_owned();
    let pinned = get(&state, &format!("/models/org/llama@{version}/files/config.json"), &[]).await;
    assert_eq!((pinned.status, pinned.header("cache-control")), (StatusCode::OK, "public, no-cache"));
    let stored = get(&state, &format!("/models/org/llama@{version}/files/llama.zt"), &[]).await;
    assert_eq!(
        (stored.status, stored.header("cache-control")),
        (StatusCode::OK, "public, max-age=31536000, immutable")
    );

    let missing = get(&state, "/models/org/llama/files/nothing.json", &[]).await;
    assert_eq!((missing.status, missing.error_code()), (StatusCode::NOT_FOUND, "file_not_found".to_owned()));
    let message = missing.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("config.json") && message.contains("llama.zt"), "{message}");

    source.put("org/config.json", br#"{"model_type": "llama", "hidden_size": 200}"#).await;
    state.rescan().await;
    let changed = get(&state, "/models/org/llama/files/config.json", &[]).await;
    assert_ne!(changed.header("etag"), config.header("etag"), "a changed file beside the model has a new ETag");
    assert_eq!(changed.header("x-zt-model-version"), config.header("x-zt-model-version"), "the model is the same");
}

both_sources!(
    version_pinned_urls_are_immutable_until_the_version_is_gone,
    files_beside_a_model_are_served_with_their_own_etag,
    json_is_compressed_when_the_client_accepts_it_and_tensor_bytes_never_are,
    model_responses_let_a_shared_cache_store_them_and_revalidate_by_etag,
    natural_ids_with_slashes_name_the_same_model_as_the_encoded_form,
    readyz_is_503_until_the_first_index_then_200_and_healthz_is_always_200,
    the_model_list_shows_good_and_broken_files_with_reasons,
    the_manifest_lists_every_object_with_component_urls,
    a_dense_object_answers_its_bytes_with_every_contract_header,
    zstd_components_are_served_decoded,
    ranges_single_suffix_open_and_multiple,
    unsatisfiable_ranges_answer_416_with_the_length_and_invalid_ones_are_ignored,
    conditional_requests_follow_rfc_9110,
    the_manifest_has_an_etag_and_answers_304_when_it_matches,
    head_sends_the_get_headers_without_a_body,
    the_file_route_serves_the_stored_file_byte_for_byte_with_ranges,
    objects_with_several_components_answer_their_description,
    every_response_drawn_from_a_model_names_its_version,
    every_error_status_has_a_json_body,
    ids_and_names_cannot_reach_outside_the_source,
    a_rescan_picks_up_added_replaced_and_removed_files,
    sixty_four_concurrent_range_requests_return_correct_bytes,
    files_from_the_official_writers_are_served_byte_exact,
    components_failing_content_checks_answer_422_and_valid_ones_still_serve,
);
