//! Interop with the safetensors peers, over HTTP: checkpoints written by the `safetensors`
//! Python package (numpy and torch: bf16, every fp8, bool, complex, scalars, empty tensors), a
//! checkpoint sharded by `huggingface_hub.save_torch_state_dict` as `save_pretrained` shards,
//! and a file the Rust `safetensors` crate writes (BF16, F8) are served from a local directory
//! and from S3, and every tensor ztserve sends is the bytes `safetensors.safe_open` returns,
//! which `ztensor==2.1.2`'s `ztensor.open` returns too.

use crate::common;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use common::{ModelSource, request_async, run_interop_script, serve};
use ztserve::api;
use ztserve::config::Config;

/// The Rust crate's file: its tensors, and their dtypes as torch names them.
fn rust_checkpoint(dir: &Path, expect: &mut serde_json::Value) {
    use safetensors::Dtype;
    let bf16: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37)).collect();
    let e4m3: Vec<u8> = (0..24u8).map(|i| i.wrapping_mul(11)).collect();
    let e5m2: Vec<u8> = (0..10u8).map(|i| i.wrapping_mul(23)).collect();
    let big = common::noise(1 << 20, 7);
    let tensors: [common::StTensor<'_>; 4] = [
        ("w.bf16", Dtype::BF16, vec![4, 8], &bf16),
        ("w.e4m3", Dtype::F8_E4M3, vec![2, 3, 4], &e4m3),
        ("w.e5m2", Dtype::F8_E5M2, vec![10], &e5m2),
        ("w.big", Dtype::BF16, vec![512, 1024], &big),
    ];
    fs::create_dir_all(dir.join("rust")).unwrap();
    fs::write(dir.join("rust/fp8.safetensors"), common::safetensors_file(&tensors)).unwrap();
    let mut listed = serde_json::Map::new();
    for (name, dtype, shape, bytes) in &tensors {
        let bin = format!("rust-{name}.bin");
        fs::write(dir.join(&bin), bytes).unwrap();
        listed.insert(name.to_string(), serde_json::json!({"bin": bin, "dtype": dtype.to_string(), "shape": shape}));
    }
    expect["rust/fp8"] =
        serde_json::json!({"files": ["rust/fp8.safetensors"], "tensors": listed, "ztensor_refuses": null});
}

/// What the peers wrote, read back by safe_open and checked against ztensor.open: by model id.
fn peers_checkpoints(dir: &Path) -> BTreeMap<String, serde_json::Value> {
    run_interop_script("client", "safetensors_peers.py", &[Path::new("write"), dir]);
    let path = dir.join("expect.json");
    let mut expect: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    rust_checkpoint(dir, &mut expect);
    fs::write(&path, serde_json::to_vec(&expect).unwrap()).unwrap();
    let checked = run_interop_script("ztensor-2.1.2", "safetensors_peers.py", &[Path::new("ztensor"), dir]);
    assert!(checked.contains("\"checked\""), "{checked}");
    serde_json::from_value(expect).unwrap()
}

async fn every_tensor_is_served_as_the_peers_read_it(source: ModelSource) {
    let dir = tempfile::tempdir().unwrap();
    let models = peers_checkpoints(dir.path());
    for entry in models.values() {
        for file in entry["files"].as_array().unwrap() {
            let file = file.as_str().unwrap();
            source.put(file, &fs::read(dir.path().join(file)).unwrap()).await;
        }
    }
    // With sendfile on, its counter shows a tensor leave without a copy through the process.
    let mut config = source.config(Config::default());
    config.server.sendfile = true;
    let (address, _state) = serve(config).await;
    let kind = source.kind();

    let listing = request_async(&address, "/models", &[]).await.json();
    let listed: BTreeMap<&str, &serde_json::Value> =
        listing["models"].as_array().unwrap().iter().map(|m| (m["id"].as_str().unwrap(), m)).collect();
    assert_eq!(listed.keys().copied().collect::<Vec<_>>(), models.keys().map(String::as_str).collect::<Vec<_>>());
    for (id, entry) in &models {
        let model = listed[id.as_str()];
        assert_eq!(model["status"], "ok", "{kind}: {model}");
        assert_eq!(model["container"], "safetensors", "{kind}: {id}");
        assert_eq!(model["files"], entry["files"].as_array().unwrap().len(), "{kind}: {id}");
    }

    let mut compared = 0;
    for (id, entry) in &models {
        for (name, tensor) in entry["tensors"].as_object().unwrap() {
            let expected = fs::read(dir.path().join(tensor["bin"].as_str().unwrap())).unwrap();
            let reply = request_async(&address, &api::object_url(id, name), &[]).await;
            assert_eq!(reply.status, 200, "{kind}: {id}/{name}: {}", String::from_utf8_lossy(&reply.body));
            assert!(reply.body == expected, "{kind}: {id}/{name}: bytes differ from safe_open's");
            let shape: Vec<String> =
                tensor["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap().to_string()).collect();
            assert_eq!(reply.header(api::headers::SHAPE), Some(shape.join(",").as_str()), "{kind}: {id}/{name}");
            assert!(reply.header(api::headers::REPR_DIGEST).is_none(), "safetensors declares no digest");
            compared += 1;
        }
        // Every stored file, the index included, byte for byte.
        for file in entry["files"].as_array().unwrap() {
            let file = file.as_str().unwrap();
            let name = file.rsplit('/').next().unwrap();
            let reply = request_async(&address, &api::stored_file_url(id, name), &[]).await;
            assert!(reply.body == fs::read(dir.path().join(file)).unwrap(), "{kind}: {id}: {name} differs");
        }
    }
    assert_eq!(compared, 44, "tensors compared");

    // HEAD, conditionals and zero-copy as for every model: a tensor of a local file leaves by
    // sendfile, without a copy.
    let url = api::object_url("rust/fp8", "w.big");
    let sent_before = common::metric("ztserve_sendfile_bytes_total", &[]);
    let full = request_async(&address, &url, &[]).await;
    if kind == "local" {
        let sent = common::metric("ztserve_sendfile_bytes_total", &[]) - sent_before;
        assert!(sent >= 0.9 * f64::from(1u32 << 20), "{sent} bytes of a 1 MiB tensor were sent by sendfile");
    }
    let etag = full.header("etag").unwrap().to_owned();
    let head = {
        let (address, url) = (address.clone(), url.clone());
        tokio::task::spawn_blocking(move || common::head_request(&address, &url)).await.unwrap()
    };
    assert!(head.starts_with("HTTP/1.1 200") && head.contains("content-length: 1048576\r\n"), "{kind}: {head}");
    assert!(head.ends_with("\r\n\r\n"), "{kind}: HEAD sends no body");
    let cached = request_async(&address, &url, &[("if-none-match", &etag)]).await;
    assert_eq!(cached.status, 304, "{kind}");
    let ranged = request_async(&address, &url, &[("range", "bytes=10-19"), ("if-range", &etag)]).await;
    assert_eq!((ranged.status, &ranged.body[..]), (206, &full.body[10..20]), "{kind}");

    // What the dtypes say, and ranges inside a sharded checkpoint's tensor.
    let q = request_async(&address, &api::object_url("pt/weights", "attn.q.weight"), &[]).await;
    assert_eq!((q.header(api::headers::DTYPE), q.header(api::headers::TYPE)), (Some("u8"), Some("f8_e4m3fn")));
    let scale = request_async(&address, &api::object_url("pt/weights", "attn.scale"), &[]).await;
    assert_eq!(scale.header(api::headers::TYPE), Some("f8_e8m0"));
    let embed = &models["hf/llama"]["tensors"]["model.embed_tokens.weight"];
    let bytes = fs::read(dir.path().join(embed["bin"].as_str().unwrap())).unwrap();
    let url = api::object_url("hf/llama", "model.embed_tokens.weight");
    for (start, end) in [(0, 0), (1000, 9999), (bytes.len() - 7, bytes.len() - 1)] {
        let reply = request_async(&address, &url, &[("range", &format!("bytes={start}-{end}"))]).await;
        assert_eq!(reply.status, 206, "{kind}: bytes={start}-{end}");
        assert!(reply.body == bytes[start..=end], "{kind}: bytes={start}-{end} differ");
    }
    let manifest = request_async(&address, &api::model_url("hf/llama"), &[]).await.json();
    let files: Vec<&str> = manifest["files"].as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap()).collect();
    assert_eq!(files[0], "model.safetensors.index.json");
    assert_eq!(manifest["attributes"]["format"], "pt", "the shards' metadata joins the index's");
    assert!(manifest["attributes"]["total_size"].is_u64());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_of_the_safetensors_peers_are_served_from_a_local_directory_as_they_read_them() {
    every_tensor_is_served_as_the_peers_read_it(ModelSource::local()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_of_the_safetensors_peers_are_served_from_s3_as_they_read_them() {
    every_tensor_is_served_as_the_peers_read_it(ModelSource::s3()).await;
}
