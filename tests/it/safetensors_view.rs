//! The safetensors view (`GET /models/{m}/model.safetensors`, or its index and shards), from a
//! local directory and from S3: for a `.zt` 1.2 model with raw and zstd tensors, the demo's v2
//! models (seekable zstd, and a root with shards) and its structured model (objects a
//! safetensors file cannot hold), the view parses as a valid safetensors file whose every
//! tensor is the bytes its object route serves; ranges from the header into any tensor equal
//! the whole body's bytes; HEAD, conditionals and the model version hold; a larger model's
//! view is an index and shards; a model stored as safetensors is its own files.

use crate::common;

use std::collections::BTreeMap;

use common::{ModelSource, Reply, request_async, serve};
use ztserve::api;
use ztserve::config::Config;
use ztserve::format::DType;
use ztserve::format::safetensors::{Header, parse_file, parse_index};

const DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/models");

/// The models every case serves: `zt12/mixed` written here, and the demo's v2, structured
/// and safetensors models.
async fn put_models(source: &ModelSource) {
    let raw_big = common::noise(3 << 20, 1);
    let zstd_big: Vec<u8> = (0..3u32 << 20).map(|i| (i / 4096) as u8).collect();
    let small: Vec<u8> = (0..96u8).collect();
    let model = common::model(&[
        ("raw.big", DType::F32, &raw_big, false),
        ("zstd.big", DType::BF16, &zstd_big, true),
        ("small.i64", DType::I64, &small, true),
        ("small.u8", DType::U8, &small[..5], false),
    ]);
    source.put("zt12/mixed.zt", &model).await;
    for file in [
        "v2/seekable.zt",
        "v2/sharded.zt",
        "v2/sharded-00001-of-00002.zt",
        "v2/sharded-00002-of-00002.zt",
        "demo/structured.zt",
        "hf/tiny-llama/model.safetensors.index.json",
        "hf/tiny-llama/model-00001-of-00002.safetensors",
        "hf/tiny-llama/model-00002-of-00002.safetensors",
    ] {
        source.put(file, &std::fs::read(format!("{DEMO}/{file}")).unwrap()).await;
    }
}

async fn get(address: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    request_async(address, path, headers).await
}

/// The view of `id` as one file, checked tensor by tensor against the object routes.
async fn single_file_view(address: &str, kind: &str, id: &str) -> (Reply, Header) {
    let manifest = get(address, &api::model_url(id), &[]).await.json();
    let view = &manifest["safetensors_view"];
    assert_eq!(view["files"][0]["name"], "model.safetensors", "{kind}: {id}");
    let url = view["files"][0]["url"].as_str().unwrap();
    assert_eq!(url, format!("/models/{id}/model.safetensors"), "natural URLs in the manifest");
    let reply = get(address, url, &[]).await;
    assert_eq!(reply.status, 200, "{kind}: {id}: {}", String::from_utf8_lossy(&reply.body));
    assert_eq!(reply.body.len() as u64, view["files"][0]["size"].as_u64().unwrap(), "{kind}: {id}");
    let header = parse_file(&reply.body).unwrap_or_else(|e| panic!("{kind}: {id}: not a safetensors file: {e}"));
    let excluded: Vec<&str> =
        view["excluded"].as_array().unwrap().iter().map(|e| e["object"].as_str().unwrap()).collect();
    let mut held: Vec<&str> = header.tensors.iter().map(|t| t.name.as_str()).collect();
    held.sort();
    let mut objects: Vec<&str> = manifest["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .filter(|name| !excluded.contains(name))
        .collect();
    objects.sort();
    assert_eq!(held, objects, "{kind}: {id}: every object but those excluded");
    for tensor in &header.tensors {
        let object = get(address, &api::object_url(id, &tensor.name), &[]).await;
        assert_eq!(object.status, 200, "{kind}: {id}/{}", tensor.name);
        let range = tensor.range.start as usize..tensor.range.end as usize;
        assert!(reply.body[range] == object.body[..], "{kind}: {id}/{}: bytes differ from its route's", tensor.name);
        let dtype = object.header(api::headers::DTYPE).unwrap();
        let logical = object.header(api::headers::TYPE);
        let expected = ztserve::format::safetensors::DTYPES
            .iter()
            .find(|m| m.dtype.name() == dtype && m.logical_type == logical)
            .map_or("BOOL", |m| m.name);
        assert_eq!(tensor.dtype.name, expected, "{kind}: {id}/{}", tensor.name);
    }
    (reply, header)
}

async fn views_of_every_model(source: ModelSource) {
    put_models(&source).await;
    let kind = source.kind();
    // With sendfile on, its counter shows which bytes leave without a copy through the process.
    let mut config = source.config(Config::default());
    config.server.sendfile = true;
    let (address, _state) = serve(config).await;

    let sent_before = common::metric("ztserve_sendfile_bytes_total", &[]);
    let (mixed, header) = single_file_view(&address, kind, "zt12/mixed").await;
    if kind == "local" {
        let sent = common::metric("ztserve_sendfile_bytes_total", &[]) - sent_before;
        assert!(sent >= f64::from(3u32 << 20), "{kind}: the raw tensor leaves by sendfile ({sent} bytes did)");
    }
    let names: Vec<(&str, &str)> = header.tensors.iter().map(|t| (t.name.as_str(), t.dtype.name)).collect();
    assert_eq!(names, [("small.i64", "I64"), ("raw.big", "F32"), ("zstd.big", "BF16"), ("small.u8", "U8")]);
    for id in ["v2/seekable", "v2/sharded"] {
        single_file_view(&address, kind, id).await;
    }
    let (_, structured) = single_file_view(&address, kind, "demo/structured").await;
    assert!(structured.tensors.is_empty(), "the structured demo has no dense tensor");
    let manifest = get(&address, &api::model_url("demo/structured"), &[]).await.json();
    let reason = &manifest["safetensors_view"]["excluded"][0]["reason"];
    assert!(reason.as_str().unwrap().contains("only dense tensors"), "{kind}: {reason}");

    // Ranges from the header into any tensor, and several at once, equal the whole body's bytes.
    let url = "/models/zt12/mixed/model.safetensors";
    let data_start = header.span.end as usize;
    let end = mixed.body.len();
    let etag = mixed.header("etag").unwrap().to_owned();
    for (first, last) in
        [(0, 7), (3, data_start + 10), (data_start - 4, end - 1), ((4 << 20) - 3, (4 << 20) + 5), (end - 2, end - 1)]
    {
        let reply = get(&address, url, &[("range", &format!("bytes={first}-{last}")), ("if-range", &etag)]).await;
        assert_eq!(reply.status, 206, "{kind}: bytes={first}-{last}");
        assert!(reply.body == mixed.body[first..=last], "{kind}: bytes={first}-{last} differ");
    }
    let several = get(&address, url, &[("range", "bytes=0-3,5000000-5000009")]).await;
    assert_eq!(several.status, 206);
    let text = String::from_utf8_lossy(&several.body);
    assert!(text.contains(&format!("Content-Range: bytes 5000000-5000009/{end}")), "{kind}: {text}");

    // The contract's headers, HEAD and conditionals, as for every model route.
    let file_version = get(&address, &api::file_url("zt12/mixed"), &[("range", "bytes=0-0")]).await;
    assert_eq!(mixed.header("x-zt-model-version"), file_version.header("x-zt-model-version"));
    assert_eq!(mixed.header("cache-control"), Some("public, no-cache"));
    assert_eq!(mixed.header("content-type"), Some("application/octet-stream"));
    let head = {
        let address = address.clone();
        tokio::task::spawn_blocking(move || common::head_request(&address, url)).await.unwrap()
    };
    assert!(head.starts_with("HTTP/1.1 200") && head.contains(&format!("content-length: {end}\r\n")), "{head}");
    assert!(head.contains(&format!("etag: {etag}\r\n")), "{kind}: {head}");
    assert_eq!(get(&address, url, &[("if-none-match", &etag)]).await.status, 304, "{kind}");
    let encoded = get(&address, "/models/zt12%2Fmixed/model.safetensors", &[("range", "bytes=0-0")]).await;
    assert_eq!(encoded.header("etag"), Some(etag.as_str()), "{kind}: the %2F form is the same resource");

    // A model stored as safetensors is its own files, not a view rebuilt.
    let stored = get(&address, &api::model_url("hf/tiny-llama"), &[]).await.json();
    let files: Vec<&str> =
        stored["safetensors_view"]["files"].as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap()).collect();
    assert_eq!(
        files,
        ["model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    );
    for name in files {
        let view = get(&address, &api::view_file_url("hf/tiny-llama", name), &[]).await;
        let on_disk = std::fs::read(format!("{DEMO}/hf/tiny-llama/{name}")).unwrap();
        assert!(view.status == 200 && view.body == on_disk, "{kind}: {name} is the stored file");
    }
    let missing = get(&address, "/models/hf/tiny-llama/model.safetensors", &[]).await;
    assert_eq!((missing.status, &missing.json()["error"]["code"]), (404, &"view_file_not_found".into()), "{kind}");
    let not_a_view = get(&address, "/models/zt12%2Fmixed/weights.bin", &[]).await;
    assert_eq!(not_a_view.status, 404, "{kind}: only view file names are files of a model");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_of_every_model_from_a_local_directory() {
    views_of_every_model(ModelSource::local()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_of_every_model_from_s3() {
    views_of_every_model(ModelSource::s3()).await;
}

/// A view larger than `view_shard_bytes` is an index and shards that together hold every
/// tensor with the bytes of the single file a larger limit gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_view_is_an_index_and_shards() {
    let source = ModelSource::local();
    put_models(&source).await;
    let (whole_address, _whole) = serve(source.config(Config::default())).await;
    let (whole, whole_header) = single_file_view(&whole_address, "local", "zt12/mixed").await;
    let config = Config {
        serving: ztserve::config::Serving { view_shard_bytes: 2 << 20, ..Default::default() },
        ..source.config(Config::default())
    };
    let (address, _state) = serve(config).await;

    let manifest = get(&address, &api::model_url("zt12/mixed"), &[]).await.json();
    let files: Vec<(String, u64)> = manifest["safetensors_view"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["name"].as_str().unwrap().to_owned(), f["size"].as_u64().unwrap()))
        .collect();
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "model.safetensors.index.json",
            "model-00001-of-00004.safetensors",
            "model-00002-of-00004.safetensors",
            "model-00003-of-00004.safetensors",
            "model-00004-of-00004.safetensors"
        ],
        "a tensor larger than a shard has one to itself"
    );
    let index_reply = get(&address, "/models/zt12/mixed/model.safetensors.index.json", &[]).await;
    assert_eq!(index_reply.header("content-type"), Some("application/json"));
    let index = parse_index(&index_reply.body).unwrap();
    let mut tensors = BTreeMap::new();
    for (name, size) in &files[1..] {
        let reply = get(&address, &format!("/models/zt12/mixed/{name}"), &[]).await;
        assert_eq!(reply.body.len() as u64, *size);
        let header = parse_file(&reply.body).unwrap();
        for tensor in header.tensors {
            assert!(index.weight_map.contains(&(tensor.name.clone(), name.clone())), "{} in {name}", tensor.name);
            tensors.insert(tensor.name, reply.body[tensor.range.start as usize..tensor.range.end as usize].to_vec());
        }
    }
    assert_eq!(tensors.len(), whole_header.tensors.len());
    for tensor in &whole_header.tensors {
        let range = tensor.range.start as usize..tensor.range.end as usize;
        assert!(tensors[&tensor.name] == whole.body[range], "{}: shards and the single file agree", tensor.name);
    }
    let single = get(&address, "/models/zt12/mixed/model.safetensors", &[]).await;
    assert_eq!(single.json()["error"]["code"], "view_file_not_found", "a sharded view has no single file");
}
