//! zTensor v2 models that span files, written and read by the official `ztensor` crate (2.1.1,
//! the Rust twin of the 2.1.2 Python package): a root whose shard table names two shards (each
//! an ordinary `.zt`, one digested with xxh3, one with sha256) and a data shard (no manifest),
//! served from a local directory and from S3. Every component equals what the official reader
//! returns; each stored file is served by name; shards are found by the positional name or, once
//! renamed, by size and digest; a missing, resized or altered shard makes the model broken with
//! its own reason; and the model's version covers every file.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{ModelSource, request_async, serve};
use ztensor::read::shard_identity;
use ztensor::{DType, DigestAlgorithm, Source, Writer};
use ztserve::api;
use ztserve::config::Config;

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 13) as u8).collect()
}

/// A data shard (spec §7.2) as another producer would write it: magic, `payload` at `offset`,
/// and a footer whose manifest fields are zero. The official writer reads these but never
/// writes one.
fn data_shard(offset: u64, payload: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0u8; offset as usize + payload.len()];
    bytes[..8].copy_from_slice(ztserve::format::V2_MAGIC);
    bytes[offset as usize..].copy_from_slice(payload);
    let mut footer = [0u8; 40];
    footer[24..28].copy_from_slice(&2u32.to_le_bytes());
    footer[32..40].copy_from_slice(ztserve::format::V2_MAGIC);
    bytes.extend_from_slice(&footer);
    bytes
}

/// The files of a sharded model `llama` (root and shards, by name) and, for each object, the
/// bytes the official reader returns for its `data` part.
struct Sharded {
    files: BTreeMap<String, Vec<u8>>,
    expected: BTreeMap<String, Vec<u8>>,
}

fn write_sharded(dir: &Path) -> Sharded {
    let one = dir.join("llama-00001-of-00002.zt");
    let mut w = Writer::options().canonical(false).create(&one).unwrap();
    w.add("layers.0.weight", [64u64, 64], DType::F32, &pattern(64 * 64 * 4, 1)).unwrap();
    w.add("layers.0.bias", [64u64], DType::BF16, &pattern(128, 2)).unwrap();
    w.finish().unwrap();
    let two = dir.join("llama-00002-of-00002.zt");
    let mut w = Writer::options().canonical(false).create(&two).unwrap();
    w.add("layers.1.weight", [32u64, 100], DType::F16, &pattern(32 * 100 * 2, 3)).unwrap();
    w.finish().unwrap();
    let tail = pattern(5000, 4);
    std::fs::write(dir.join("llama-tail.zt"), data_shard(4096, &tail)).unwrap();

    let root = dir.join("llama.zt");
    let mut w = Writer::options().canonical(false).align(4096).create(&root).unwrap();
    w.add_shard("00001-of-00002", &shard_identity(&one, DigestAlgorithm::Xxh3).unwrap()).unwrap();
    w.add_shard("00002-of-00002", &shard_identity(&two, DigestAlgorithm::Sha256).unwrap()).unwrap();
    w.add_shard("tail", &shard_identity(dir.join("llama-tail.zt"), DigestAlgorithm::Xxh3).unwrap()).unwrap();
    for (path, shard) in [(&one, "00001-of-00002"), (&two, "00002-of-00002")] {
        let source = Source::open(path).unwrap();
        let manifest = source.provenance().as_root().unwrap().clone();
        for (name, object) in &manifest.objects {
            w.link(name.clone(), object, shard).unwrap();
        }
    }
    w.object("tail", |o| o.shape([5000u64]).part("data", |p| p.dtype(DType::U8).external("tail", 4096..9096))).unwrap();
    w.add("embed", [16u64, 8], DType::F32, &pattern(16 * 8 * 4, 5)).unwrap();
    w.finish().unwrap();

    // The official reader's view, resolving the shards beside the root by their names.
    let model = Source::open(&root).unwrap();
    let expected =
        model.tensors().map(|t| (t.name().to_owned(), t.data().unwrap().bytes().unwrap().into_owned())).collect();
    let files = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect();
    Sharded { files, expected }
}

async fn a_sharded_model_is_served_whole(source: ModelSource) {
    let dir = tempfile::tempdir().unwrap();
    let sharded = write_sharded(dir.path());
    assert_eq!(sharded.expected.len(), 5, "three linked objects, one in the data shard, one local");
    for (name, bytes) in &sharded.files {
        source.put(name, bytes).await;
    }
    let (address, _state) = serve(source.config(Config::default())).await;
    let kind = source.kind();

    let listing = request_async(&address, "/models", &[]).await.json();
    let models: BTreeMap<&str, &serde_json::Value> =
        listing["models"].as_array().unwrap().iter().map(|m| (m["id"].as_str().unwrap(), m)).collect();
    // The shards with manifests are models of their own too; the data shard is not.
    let ids: Vec<&str> = models.keys().copied().collect();
    assert_eq!(ids, ["llama", "llama-00001-of-00002", "llama-00002-of-00002"], "{kind}");
    let llama = models["llama"];
    assert_eq!(
        (llama["status"].as_str(), llama["container"].as_str(), llama["files"].as_u64()),
        (Some("ok"), Some("zt-2"), Some(4)),
        "{kind}: {llama}"
    );
    let total: usize = sharded.files.values().map(Vec::len).sum();
    assert_eq!(llama["size"].as_u64(), Some(total as u64), "the model's size is its files'");

    for (name, expected) in &sharded.expected {
        let reply = request_async(&address, &api::component_url("llama", name, "data"), &[]).await;
        assert_eq!(reply.status, 200, "{kind}: {name}: {}", String::from_utf8_lossy(&reply.body));
        assert!(&reply.body == expected, "{kind}: {name}: bytes differ from the official reader's");
    }
    let manifest = request_async(&address, &api::model_url("llama"), &[]).await.json();
    let listed: Vec<&str> = manifest["files"].as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap()).collect();
    // The root, then the shards in the table's (deterministic CBOR) order: shorter names first.
    assert_eq!(listed, ["llama.zt", "llama-tail.zt", "llama-00001-of-00002.zt", "llama-00002-of-00002.zt"]);
    let version =
        request_async(&address, &api::model_url("llama"), &[]).await.header("x-zt-model-version").map(str::to_owned);
    for name in listed {
        let reply = request_async(&address, &api::stored_file_url("llama", name), &[]).await;
        assert_eq!(reply.status, 200, "{kind}: {name}");
        assert!(reply.body == sharded.files[name], "{kind}: {name} is served byte for byte");
        assert_eq!(reply.header("x-zt-model-version").map(str::to_owned), version, "one version for every file");
    }
    let reply = request_async(&address, &api::file_url("llama"), &[]).await;
    assert_eq!((reply.status, reply.json()["error"]["code"].as_str()), (404, Some("several_files")));
    let reply = request_async(&address, &api::stored_file_url("llama", "other.zt"), &[]).await;
    assert_eq!((reply.status, reply.json()["error"]["code"].as_str()), (404, Some("file_not_found")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_model_is_served_whole_from_a_local_directory() {
    a_sharded_model_is_served_whole(ModelSource::local()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_model_is_served_whole_from_s3() {
    a_sharded_model_is_served_whole(ModelSource::s3()).await;
}

/// The broken reason of `llama` in a server started on `files`.
async fn reason_with(files: &BTreeMap<String, Vec<u8>>) -> (Option<String>, serde_json::Value) {
    let source = ModelSource::local();
    for (name, bytes) in files {
        source.put(name, bytes).await;
    }
    let (address, _state) = serve(source.config(Config::default())).await;
    let listing = request_async(&address, "/models", &[]).await.json();
    let llama = listing["models"].as_array().unwrap().iter().find(|m| m["id"] == "llama").unwrap().clone();
    (llama["reason"]["code"].as_str().map(str::to_owned), llama)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_are_found_by_identity_once_renamed_and_a_missing_or_altered_one_breaks_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let sharded = write_sharded(dir.path());

    // Renamed: no longer at its positional name, found by size and digest.
    let mut renamed = sharded.files.clone();
    let shard = renamed.remove("llama-00002-of-00002.zt").unwrap();
    renamed.insert("weights-b.zt".into(), shard);
    let (code, llama) = reason_with(&renamed).await;
    assert_eq!(code, None, "{llama}");
    assert_eq!(llama["files"], 4);

    let mut missing = sharded.files.clone();
    missing.remove("llama-00001-of-00002.zt");
    assert_eq!(reason_with(&missing).await.0.as_deref(), Some("shard_missing"));

    let mut resized = sharded.files.clone();
    resized.get_mut("llama-tail.zt").unwrap().extend_from_slice(&[0; 8]);
    assert_eq!(reason_with(&resized).await.0.as_deref(), Some("shard_size_mismatch"));

    // Same size, one byte changed: the digest (sha256 for this shard) tells.
    let mut altered = sharded.files.clone();
    let bytes = altered.get_mut("llama-00002-of-00002.zt").unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 1;
    assert_eq!(reason_with(&altered).await.0.as_deref(), Some("shard_digest_mismatch"));
}

fn ztserve(args: &[&std::ffi::OsStr]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_ztserve")).args(args).output().unwrap()
}

/// `verify`, `cat` and `inspect` find a root's shards beside it as the server does.
#[test]
fn the_file_tools_read_a_sharded_model_from_its_root() {
    let dir = tempfile::tempdir().unwrap();
    let sharded = write_sharded(dir.path());
    let root = dir.path().join("llama.zt");
    let out = ztserve(&["verify".as_ref(), root.as_os_str()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    for (name, expected) in &sharded.expected {
        let out = ztserve(&["cat".as_ref(), root.as_os_str(), name.as_ref()]);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(&out.stdout == expected, "{name}: cat gives other bytes");
    }
    let out = ztserve(&["inspect".as_ref(), root.as_os_str()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("shard:      00001-of-00002") && text.contains("found at"), "{text}");

    // Renamed, it is found by size and digest; altered, verify says which shard and why.
    std::fs::rename(dir.path().join("llama-00002-of-00002.zt"), dir.path().join("b.zt")).unwrap();
    assert!(ztserve(&["verify".as_ref(), root.as_os_str()]).status.success());
    let mut bytes = std::fs::read(dir.path().join("b.zt")).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 1;
    std::fs::write(dir.path().join("b.zt"), bytes).unwrap();
    let out = ztserve(&["verify".as_ref(), root.as_os_str()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("[shard_missing]"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
