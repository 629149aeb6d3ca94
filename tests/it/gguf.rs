//! GGUF models as users have them: files written by ggml's own `gguf` package (dense tensors of
//! every dense GGML type, blocks from its quantizers, K-quant and IQ blocks, a repository of
//! one file per quantization beside a README, a model split in three parts), served from a
//! local directory and from S3. Every tensor is the bytes the `gguf` reader returns, its
//! layout the one `ztensor` 2.1.2's GGUF reader names; block-quantized tensors split by rows for
//! tensor-parallel ranks; the safetensors view holds the dense tensors and says why it leaves
//! the others out; stored files go byte for byte over HTTP, the S3 endpoint and the OCI
//! registry (a ModelPack artifact of config format `gguf`); and over the
//! Hub API a quantization is picked from its repository's file list and downloaded as
//! llama-cpp-python's `from_pretrained` does and as llama.cpp's `-hf REPO:TAG` does (refs, the
//! tree at the commit, the file or split parts by tag), a split model's repository snapshot-downloaded,
//! each file then read by the `gguf` reader; `ztserve pull` copies a split model's parts and
//! rebuilds a model as zTensor v2, which ztensor 2.1.2 reads with the same layouts. A broken
//! GGUF file beside them is listed with its reason and stops nothing.

use crate::common;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use common::{ModelSource, request_async, run_interop_script, serve_with_s3};
use serde_json::Value;
use ztserve::api;
use ztserve::config::Config;
use ztserve::format::gguf::FileBuilder;

/// What the `gguf` package wrote below `dir`, as its reader reads it, by model id; and each
/// single-file model's tensor layouts as `ztensor` 2.1.2 reads them (it checked their bytes).
fn written(dir: &Path) -> (BTreeMap<String, Value>, Value) {
    run_interop_script("gguf", "gguf_peers.py", &[Path::new("write"), dir]);
    let expect: BTreeMap<String, Value> = serde_json::from_slice(&fs::read(dir.join("expect.json")).unwrap()).unwrap();
    let ztensor = run_interop_script("ztensor-2.1.2", "gguf_peers.py", &[Path::new("ztensor"), dir]);
    let ztensor: Value = serde_json::from_str(&ztensor).unwrap();
    (expect, ztensor)
}

/// A file breaking one rule: a tensor offset that is not a multiple of the alignment.
fn broken_file() -> Vec<u8> {
    let mut builder = FileBuilder::new("llama").tensor("a", &[8], 0).tensor("b", &[8], 0);
    builder.tensors[1].3 += 4;
    builder.build()
}

async fn gguf_models_are_served_as_their_readers_read_them(source: ModelSource) {
    let dir = tempfile::tempdir().unwrap();
    let (models, ztensor) = written(dir.path());
    for entry in models.values() {
        for file in entry["files"].as_array().unwrap() {
            let file = file.as_str().unwrap();
            source.put(file, &fs::read(dir.path().join(file)).unwrap()).await;
        }
    }
    source.put("org/tiny-quants/README.md", &fs::read(dir.path().join("org/tiny-quants/README.md")).unwrap()).await;
    source.put("org/broken/model.gguf", &broken_file()).await;
    let (address, s3_address, _state) = serve_with_s3(source.config(Config::default())).await;
    let kind = source.kind();

    let listing = request_async(&address, "/models", &[]).await.json();
    let listed: BTreeMap<&str, &Value> =
        listing["models"].as_array().unwrap().iter().map(|m| (m["id"].as_str().unwrap(), m)).collect();
    let mut ids: Vec<&str> = models.keys().map(String::as_str).collect();
    ids.push("org/broken");
    ids.sort();
    assert_eq!(listed.keys().copied().collect::<Vec<_>>(), ids, "{kind}: one model per file or split set");
    let broken = request_async(&address, &api::model_url("org/broken"), &[]).await;
    assert_eq!(broken.status, 422, "{kind}");
    assert_eq!(broken.json()["error"]["reason"], "gguf_misaligned", "{kind}: {}", broken.json());

    let refused = &ztensor["refused"];
    let mut compared = 0;
    for (id, entry) in &models {
        let model = listed[id.as_str()];
        assert_eq!((model["status"].as_str(), model["container"].as_str()), (Some("ok"), Some("gguf")), "{kind}: {id}");
        assert_eq!(model["files"], entry["files"].as_array().unwrap().len(), "{kind}: {id}");
        let manifest = request_async(&address, &api::model_url(id), &[]).await.json();
        assert_eq!(manifest["attributes"]["general.architecture"], "llama", "{kind}: {id}");
        assert_eq!(
            manifest["attributes"]["tokenizer.ggml.tokens"],
            serde_json::json!({"array_of": "STRING", "length": 300}),
            "{kind}: {id}: a vocabulary is summarised"
        );
        let objects: BTreeMap<&str, &Value> =
            manifest["objects"].as_array().unwrap().iter().map(|o| (o["name"].as_str().unwrap(), o)).collect();
        for (name, tensor) in entry["tensors"].as_object().unwrap() {
            let expected = fs::read(dir.path().join(tensor["bin"].as_str().unwrap())).unwrap();
            let reply = request_async(&address, &api::object_url(id, name), &[]).await;
            assert_eq!(reply.status, 200, "{kind}: {id}/{name}: {}", String::from_utf8_lossy(&reply.body));
            assert!(reply.body == expected, "{kind}: {id}/{name}: bytes differ from the gguf reader's");
            let object = objects[name.as_str()];
            assert_eq!(object["shape"], tensor["shape"], "{kind}: {id}/{name}");
            let ggml_type = tensor["type"].as_str().unwrap();
            assert_eq!(object["attributes"]["ggml_type"], ggml_type, "{kind}: {id}/{name}");
            let dense = ["F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"].contains(&ggml_type);
            let layout = if dense { "dense".to_owned() } else { format!("gguf.{}/1", ggml_type.to_lowercase()) };
            assert_eq!(object["format"], layout.as_str(), "{kind}: {id}/{name}");
            match ztensor["layouts"][id.as_str()][name.as_str()].as_str() {
                Some(theirs) => assert_eq!(theirs, layout, "{kind}: {id}/{name}: ztensor names it so"),
                None => assert!(
                    entry["files"].as_array().unwrap().len() > 1 || refused[id.as_str()].is_string(),
                    "{kind}: {id}/{name}: ztensor read every other file"
                ),
            }
            if !dense {
                assert!(object["attributes"]["block_bytes"].as_u64().unwrap() > 0);
                rows_are_split_at_whole_blocks(&address, id, name, tensor, &expected, kind).await;
            }
            compared += 1;
        }
        for file in entry["files"].as_array().unwrap() {
            let file = file.as_str().unwrap();
            let name = file.rsplit('/').next().unwrap();
            let reply = request_async(&address, &api::stored_file_url(id, name), &[]).await;
            assert!(reply.body == fs::read(dir.path().join(file)).unwrap(), "{kind}: {id}: {name} differs");
        }
    }
    assert_eq!(compared, 9 + 17 * 3 + 6, "{kind}: tensors compared");
    assert_eq!(
        refused.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["org/tiny-quants/tiny-TQ1_0", "org/tiny-quants/tiny-TQ2_0"]
    );

    // The safetensors view: the dense tensors, and why the blocks are left out.
    let manifest = request_async(&address, &api::model_url("org/tiny-gguf"), &[]).await.json();
    let excluded = &manifest["safetensors_view"]["excluded"];
    assert_eq!(excluded.as_array().unwrap().len(), 1, "{kind}: {excluded}");
    assert_eq!(excluded[0]["object"], "blk.0.attn_q.weight");
    assert!(excluded[0]["reason"].as_str().unwrap().contains("GGML Q8_0 blocks"), "{kind}: {excluded}");
    let view = request_async(&address, &api::view_file_url("org/tiny-gguf", "model.safetensors"), &[]).await;
    let view = safetensors::SafeTensors::deserialize(&view.body).unwrap();
    assert_eq!(view.len(), 8, "{kind}: every dense tensor");
    let f16 = &models["org/tiny-gguf"]["tensors"]["dense.f16"];
    let f16_bytes = fs::read(dir.path().join(f16["bin"].as_str().unwrap())).unwrap();
    assert_eq!(view.tensor("dense.f16").unwrap().data(), &f16_bytes[..], "{kind}");

    // `ztserve pull`: a split model's parts byte for byte, and a model rebuilt as zTensor v2,
    // which ztensor 2.1.2 reads with the same layouts and bytes.
    let pulled = tempfile::tempdir().unwrap();
    let (from, out) = (format!("http://{address}/models/"), pulled.path().to_owned());
    tokio::task::spawn_blocking(move || {
        for (id, target, raw) in [("org/tiny-split/tiny-Q8_0", "split", true), ("org/tiny-gguf", "tiny.zt", false)] {
            let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_ztserve"));
            command.args(["pull", "--progress", "none"]).args(raw.then_some("--raw"));
            let output = command.arg(format!("{from}{id}")).arg(out.join(target)).output().unwrap();
            assert!(output.status.success(), "pull {id}: {}", String::from_utf8_lossy(&output.stderr));
        }
    })
    .await
    .unwrap();
    for file in models["org/tiny-split/tiny-Q8_0"]["files"].as_array().unwrap() {
        let file = file.as_str().unwrap();
        let name = file.rsplit('/').next().unwrap();
        assert!(fs::read(pulled.path().join("split").join(name)).unwrap() == fs::read(dir.path().join(file)).unwrap());
    }
    let rebuilt = pulled.path().join("tiny.zt");
    let args = [Path::new("pulled"), dir.path(), &rebuilt, Path::new("org/tiny-gguf")];
    assert!(run_interop_script("ztensor-2.1.2", "gguf_peers.py", &args).contains("\"pulled\": 9"), "{kind}");

    // The OCI registry: a ModelPack artifact whose weight layer is the stored GGUF file.
    let accept = [("accept", "application/vnd.oci.image.manifest.v1+json")];
    let artifact = request_async(&address, "/v2/org/tiny-gguf/manifests/latest", &accept).await.json();
    let layers = artifact["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "{kind}: {artifact}");
    assert_eq!(layers[0]["mediaType"], "application/vnd.cncf.model.weight.v1.raw", "{kind}");
    assert_eq!(layers[0]["annotations"]["org.cncf.model.filepath"], "model.gguf", "{kind}");
    let config_url = format!("/v2/org/tiny-gguf/blobs/{}", artifact["config"]["digest"].as_str().unwrap());
    let config = request_async(&address, &config_url, &[]).await.json();
    assert_eq!(config["config"]["format"], "gguf", "{kind}: {config}");
    assert_eq!(config["config"]["precision"], "q8_0", "{kind}: {config}");
    let layer_url = format!("/v2/org/tiny-gguf/blobs/{}", layers[0]["digest"].as_str().unwrap());
    let layer = request_async(&address, &layer_url, &[]).await;
    assert!(layer.body == fs::read(dir.path().join("org/tiny-gguf/model.gguf")).unwrap(), "{kind}");

    // The S3 endpoint: the stored files byte for byte, under each model.
    stored_files_over_s3(&s3_address, dir.path(), kind).await;

    // The Hub API: a directory of GGUF files is one repository; llama-cpp-python's download
    // path and a snapshot of the split model, each file read back by the gguf reader.
    let hub = format!("http://{address}/hf");
    let checked = run_interop_script("gguf", "gguf_peers.py", &[Path::new("hub"), Path::new(&hub), dir.path()]);
    assert!(checked.contains("\"tiny-Q4_0.gguf\": 3"), "{kind}: {checked}");
    for (repo, tag, files) in [
        ("org/tiny-quants", "Q4_K", vec!["org/tiny-quants/tiny-Q4_K.gguf"]),
        ("org/tiny-quants", "iq4_xs", vec!["org/tiny-quants/tiny-IQ4_XS.gguf"]),
        (
            "org/tiny-split",
            "Q8_0",
            models["org/tiny-split/tiny-Q8_0"]["files"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f.as_str().unwrap())
                .collect(),
        ),
    ] {
        let fetched = llama_cpp_hf_download(&address, repo, tag).await;
        let expected: Vec<Vec<u8>> = files.iter().map(|f| fs::read(dir.path().join(f)).unwrap()).collect();
        assert!(fetched == expected, "{kind}: llama.cpp's -hf {repo}:{tag}");
    }
    // Earlier llama.cpp releases ask the Hub for the file of a tag instead.
    let llama_cpp = [("accept", "application/json"), ("user-agent", "llama-cpp")];
    for (repo, tag, file) in [
        ("org/tiny-quants", "Q5_K", Some("tiny-Q5_K.gguf")),
        ("org/tiny-quants", "latest", Some("tiny-Q8_0.gguf")),
        ("org/tiny-split", "q8_0", Some("tiny-Q8_0-00001-of-00003.gguf")),
        ("org/tiny-quants", "Q4_K_M", None),
    ] {
        let reply = request_async(&address, &format!("/hf/v2/{repo}/manifests/{tag}"), &llama_cpp).await;
        match file {
            Some(file) => assert_eq!(reply.json()["ggufFile"]["rfilename"], file, "{kind}: {repo}:{tag}"),
            None => assert_eq!(reply.status, 404, "{kind}: {repo}:{tag}"),
        }
    }
    let repos = request_async(&address, "/hf/api/models?search=tiny-", &[]).await.json();
    let repos: Vec<&str> = repos.as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(repos, ["org/tiny-gguf", "org/tiny-quants", "org/tiny-split"], "{kind}: one repository per directory");
    let tagged = request_async(&address, "/hf/api/models?filter=gguf", &[]).await.json();
    assert_eq!(tagged.as_array().unwrap().len(), 3, "{kind}: the GGUF repositories are tagged gguf: {tagged}");
    let info = request_async(&address, "/hf/api/models/org/tiny-quants", &[]).await.json();
    assert_eq!(info["tags"], serde_json::json!(["gguf"]), "{kind}");
    let siblings: Vec<&str> =
        info["siblings"].as_array().unwrap().iter().map(|s| s["rfilename"].as_str().unwrap()).collect();
    assert_eq!(siblings.len(), 18, "{kind}: every quantization and the README: {siblings:?}");
    assert!(siblings.contains(&"README.md") && siblings.contains(&"tiny-Q4_K.gguf"), "{kind}: {siblings:?}");
}

/// What llama.cpp's `-hf REPO:TAG` fetches (`common/hf-cache.cpp`, `common/download.cpp`): the
/// refs for `main`'s commit, the recursive tree at that commit, the first GGUF file whose path
/// matches `TAG[.-]` (any case; of a split model, its first part, then every part of it), each
/// resolved at the commit after a HEAD that gives its ETag and length.
async fn llama_cpp_hf_download(address: &str, repo: &str, tag: &str) -> Vec<Vec<u8>> {
    let refs = request_async(address, &format!("/hf/api/models/{repo}/refs"), &[]).await.json();
    let main = &refs["branches"][0];
    assert_eq!(main["name"], "main", "{refs}");
    let commit = main["targetCommit"].as_str().unwrap().to_owned();
    let tree = request_async(address, &format!("/hf/api/models/{repo}/tree/{commit}?recursive=true"), &[]).await.json();
    let paths: Vec<String> = tree
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "file" && e["lfs"]["oid"].as_str().is_some_and(|oid| oid.len() == 64))
        .map(|e| e["path"].as_str().unwrap().to_owned())
        .collect();
    let split =
        |path: &str| ztserve::format::gguf::split_name(path).map(|(prefix, _, count)| (prefix.to_owned(), count));
    let pattern = tag.to_uppercase();
    let primary = paths
        .iter()
        .find(|p| {
            let upper = p.to_uppercase();
            p.ends_with(".gguf")
                && (upper.contains(&format!("{pattern}.")) || upper.contains(&format!("{pattern}-")))
                && split(p).is_none_or(|_| p.contains("-00001-of-"))
        })
        .unwrap_or_else(|| panic!("no {tag} file in {paths:?}"));
    let parts: Vec<&String> = match split(primary) {
        Some(of) => paths.iter().filter(|p| split(p).as_ref() == Some(&of)).collect(),
        None => vec![primary],
    };
    let mut files = Vec::new();
    for path in parts {
        let url = format!("/hf/{repo}/resolve/{commit}/{path}");
        let head = {
            let (address, url) = (address.to_owned(), url.clone());
            tokio::task::spawn_blocking(move || common::head_request(&address, &url)).await.unwrap()
        };
        assert!(head.starts_with("HTTP/1.1 200") && head.to_lowercase().contains("etag: "), "{head}");
        let reply = request_async(address, &url, &[]).await;
        assert_eq!(reply.status, 200, "{url}");
        files.push(reply.body);
    }
    files
}

/// Rank 0 and rank 1 of 2 along the rows of a block-quantized tensor are its first and last
/// rows' blocks; a cut inside a block is refused with its reason.
async fn rows_are_split_at_whole_blocks(address: &str, id: &str, name: &str, tensor: &Value, bytes: &[u8], kind: &str) {
    let rows = tensor["shape"][0].as_u64().unwrap() as usize;
    let row = bytes.len() / rows;
    let url = api::object_url(id, name);
    let first = request_async(address, &format!("{url}?shard=0/2&dim=0"), &[]).await;
    assert!(first.status == 200 && first.body == bytes[..rows / 2 * row], "{kind}: {id}/{name} rank 0");
    let second = request_async(address, &format!("{url}?shard=1/2&dim=0"), &[]).await;
    assert!(second.body == bytes[rows / 2 * row..], "{kind}: {id}/{name} rank 1");
    let partial = request_async(address, &format!("{url}?slice=:,0:8"), &[]).await;
    assert_eq!(partial.json()["error"]["code"], "slice_partial_block", "{kind}: {id}/{name}");
    assert!((400..500).contains(&partial.status), "{kind}: {}", partial.status);
}

async fn stored_files_over_s3(s3_address: &str, dir: &Path, kind: &str) {
    use object_store::ObjectStoreExt as _;
    let stored = object_store::aws::AmazonS3Builder::new()
        .with_endpoint(format!("http://{s3_address}"))
        .with_region("us-east-1")
        .with_bucket_name("models-stored")
        .with_allow_http(true)
        .with_access_key_id("any")
        .with_secret_access_key("any")
        .with_retry(object_store::RetryConfig { max_retries: 0, ..Default::default() })
        .build()
        .unwrap();
    // A folder's GGUF files are one repository: each key is the file's own path.
    for key in [
        "org/tiny-split/tiny-Q8_0-00002-of-00003.gguf",
        "org/tiny-quants/tiny-Q4_K.gguf",
        "org/tiny-quants/README.md",
        "org/tiny-gguf/model.gguf",
    ] {
        let over_s3 = stored.get(&key.into()).await.unwrap().bytes().await.unwrap();
        assert!(over_s3[..] == fs::read(dir.join(key)).unwrap()[..], "{kind}: {key}");
    }
}

/// The demo's GGUF files (`ztserve write-demo`, committed in `models/gguf/tiny/`) are what the
/// `gguf` package reads, and the Q8_0 file's blocks what its quantizer makes of the F16 file.
#[test]
fn the_demo_gguf_files_are_what_the_gguf_package_reads_and_quantizes() {
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/gguf/tiny");
    let checked = run_interop_script("gguf", "gguf_peers.py", &[Path::new("demo"), &demo]);
    assert!(checked.contains("\"quantized\": 2"), "{checked}");
}

/// `ztserve convert` writes a GGUF model as zTensor (v2 and 1.2): its block-quantized tensors
/// keep their layout, which alone names their bytes (as ztensor 2.x reads GGUF), so the
/// converted files serve the same bytes, cut at the same whole blocks, as the GGUF file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn converted_gguf_models_serve_the_same_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/gguf/tiny/tiny-Q8_0.gguf");
    fs::copy(&gguf, dir.path().join("tiny.gguf")).unwrap();
    for (format, out) in [("v2", "tiny-v2.zt"), ("1.2", "tiny-12.zt")] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_ztserve"))
            .args(["convert", gguf.to_str().unwrap(), dir.path().join(out).to_str().unwrap(), "--format", format])
            .output()
            .unwrap();
        assert!(output.status.success(), "{format}: {}", String::from_utf8_lossy(&output.stderr));
    }
    let config = Config::serving(vec![ztserve::config::SourceSpec::local(dir.path().to_owned())]);
    let (address, _state) = common::serve(config).await;
    for url in
        ["/objects/token_embd.weight", "/objects/token_embd.weight?shard=1/2&dim=0", "/objects/output_norm.weight"]
    {
        let expected = request_async(&address, &format!("/models/tiny{url}"), &[]).await;
        assert_eq!(expected.status, 200, "{url}");
        for id in ["tiny-v2", "tiny-12"] {
            let converted = request_async(&address, &format!("/models/{id}{url}"), &[]).await;
            assert!(converted.status == 200 && converted.body == expected.body, "{id}{url}");
        }
    }
    let manifest = request_async(&address, &api::model_url("tiny-v2"), &[]).await.json();
    let embed = manifest["objects"].as_array().unwrap().iter().find(|o| o["name"] == "token_embd.weight").unwrap();
    assert_eq!(
        (embed["format"].as_str(), embed["attributes"]["ggml_type"].as_str()),
        (Some("gguf.q8_0/1"), Some("Q8_0"))
    );
    let partial = request_async(&address, "/models/tiny-v2/objects/token_embd.weight?slice=:,0:16", &[]).await;
    assert_eq!(partial.json()["error"]["code"], "slice_partial_block");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gguf_models_from_a_local_directory_are_served_as_their_readers_read_them() {
    gguf_models_are_served_as_their_readers_read_them(ModelSource::local()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gguf_models_from_s3_are_served_as_their_readers_read_them() {
    gguf_models_are_served_as_their_readers_read_them(ModelSource::s3()).await;
}
