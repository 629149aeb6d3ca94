//! Fan-out with real parts: what the origin pays when a fleet pulls a 64 MiB model through
//! the engines made to spare it, measured by ztserve's own metric of blob body bytes sent.
//! The distribution project's registry as a pull-through mirror (`proxy.remoteurl` at
//! ztserve): a first pull fills it (a preheat) at the mirror's own price, four pulls at once
//! after it cost nothing, and with ztserve stopped the mirror still serves what it holds. What
//! the mirror fetches while it fills (its proxy blob store fetches each blob once to stream and
//! once to store: 2x for the preheat, about 5x for four pulls at once into it empty) is printed,
//! not bounded: a client that times out on a busy machine asks again, and the mirror fetches
//! again for it; only that each blob reached the origin is asserted. nginx with `proxy_cache` and
//! `proxy_cache_lock` in front of `/v2`: four pulls at once into an empty cache cost the origin
//! one copy. Every pull is oras-py's, every file compared with the model's.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::nginx::start_nginx;
use common::registry::{ReferenceRegistry, oci, start_reference_registry};
use common::{InProcess, run_interop_script};
use serde_json::{Value, json};
use ztserve::config::{Config, SourceSpec};

/// The model: one 64 MiB U8 tensor of noise in a safetensors file, and a config beside it.
const NAME: &str = "org/big";
const WEIGHTS: usize = 64 << 20;

/// Body bytes ztserve has sent from its blob route (this process's servers).
fn origin_blob_bytes() -> u64 {
    common::metric("ztserve_http_response_body_bytes_total", &[("route", "/v2/{name}/blobs/{digest}")]) as u64
}

/// Writes the model under `models` and the plan oci_clients.py checks pulls against.
fn write_model(dir: &Path) -> Value {
    let models = dir.join("models").join(NAME);
    std::fs::create_dir_all(&models).unwrap();
    let weights = common::noise(WEIGHTS, 41);
    let mut header =
        serde_json::to_vec(&json!({ "w": { "dtype": "U8", "shape": [WEIGHTS], "data_offsets": [0, WEIGHTS] } }))
            .unwrap();
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&header);
    file.extend_from_slice(&weights);
    std::fs::write(models.join("model.safetensors"), file).unwrap();
    std::fs::write(models.join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
    let bin = dir.join("w.bin");
    std::fs::write(&bin, &weights).unwrap();
    json!({ NAME: { "tensors": { "w": bin }, "companions": { "config.json": models.join("config.json") } } })
}

/// `clients` oras pulls at once of every repository of `repos` from `registry`, each checked.
async fn pull(registry: &str, repos: &Value, clients: usize, out: &Path) {
    let plan = json!({ "registry": registry, "repos": repos, "clients": clients, "out": out });
    let path = out.with_extension("json");
    std::fs::write(&path, serde_json::to_vec(&plan).unwrap()).unwrap();
    let summary = tokio::task::spawn_blocking(move || {
        run_interop_script("oras", "oci_clients.py", &[Path::new("clients"), &path])
    })
    .await
    .unwrap();
    let summary: Value = serde_json::from_str(summary.trim().lines().last().unwrap()).unwrap();
    assert_eq!(summary, json!({ "clients": clients, "tensors": clients }), "{registry}");
}

/// A mirror of `origin` storing under `dir`.
async fn start_mirror(dir: &Path, origin: &str) -> ReferenceRegistry {
    start_reference_registry(dir, &format!("proxy:\n  remoteurl: http://{origin}\n")).await
}

/// Waits until the mirror's store holds every blob of `digests` (the distribution registry's
/// filesystem layout): its proxy commits a blob after the pull that fetched it has ended.
async fn mirror_holds(dir: &Path, digests: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let data = |digest: &str| {
        let hex = digest.strip_prefix("sha256:").unwrap();
        dir.join("registry-data/docker/registry/v2/blobs/sha256").join(&hex[..2]).join(hex).join("data")
    };
    while !digests.iter().all(|digest| data(digest).exists()) {
        assert!(Instant::now() < deadline, "the mirror did not store every blob");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_mirror_and_an_http_cache_spare_the_origin() {
    let dir = tempfile::tempdir().unwrap();
    let repos = write_model(dir.path());
    let config = Config::serving(vec![SourceSpec::local(dir.path().join("models"))]);
    let origin = InProcess::start(config.clone(), false).await;
    let manifest = oci(&origin.address, "GET", &format!("/v2/{NAME}/manifests/latest"), &[]).await;
    assert_eq!(manifest.status, 200, "{}", manifest.head);
    let manifest = manifest.json();
    // oras fetches the layers (not the config): what one pull of the model costs, from ztserve.
    let layers = manifest["layers"].as_array().unwrap();
    let digests: Vec<String> = layers.iter().map(|l| l["digest"].as_str().unwrap().to_owned()).collect();
    let model_bytes: u64 = layers.iter().map(|l| l["size"].as_u64().unwrap()).sum();
    assert!(model_bytes > WEIGHTS as u64);
    let ratio = |bytes: u64| bytes as f64 / model_bytes as f64;

    // A mirror, preheated by one pull: its proxy blob store fetches each blob to stream it and
    // again to store it, and nothing more once it holds them.
    let mirror_dir = dir.path().join("mirror");
    std::fs::create_dir_all(&mirror_dir).unwrap();
    let mirror = start_mirror(&mirror_dir, &origin.address).await;
    let before = origin_blob_bytes();
    pull(&mirror.address, &repos, 1, &dir.path().join("preheat")).await;
    mirror_holds(&mirror_dir, &digests).await;
    let preheat = origin_blob_bytes() - before;
    println!("registry mirror, first pull: the origin sent {preheat} bytes, {:.2}x the model", ratio(preheat));
    assert!(preheat >= model_bytes, "the preheat cost only {:.2}x", ratio(preheat));
    let before = origin_blob_bytes();
    pull(&mirror.address, &repos, 4, &dir.path().join("after-preheat")).await;
    let after = origin_blob_bytes() - before;
    println!("registry mirror, four pulls after the preheat: the origin sent {after} bytes");
    assert_eq!(after, 0, "pulls from a filled mirror reached the origin");

    // Four pulls at once into an empty mirror: one fetch to store each blob, one per client (and
    // one per request a client repeats).
    let empty_dir = dir.path().join("empty-mirror");
    std::fs::create_dir_all(&empty_dir).unwrap();
    let empty = start_mirror(&empty_dir, &origin.address).await;
    let before = origin_blob_bytes();
    pull(&empty.address, &repos, 4, &dir.path().join("empty")).await;
    mirror_holds(&empty_dir, &digests).await;
    let cold = origin_blob_bytes() - before;
    println!("registry mirror, four pulls at once into it empty: {:.2}x the model", ratio(cold));
    assert!(cold >= model_bytes, "four cold pulls cost only {:.2}x", ratio(cold));
    drop(empty);

    // An HTTP cache in front of /v2 that coalesces misses: the origin sends the model once.
    let (nginx, cache) = {
        let (work, origin) = (dir.path().join("nginx"), origin.address.clone());
        tokio::task::spawn_blocking(move || start_nginx(&work, &origin)).await.unwrap()
    };
    let before = origin_blob_bytes();
    pull(&cache, &repos, 4, &dir.path().join("cached")).await;
    let through_cache = origin_blob_bytes() - before;
    println!("nginx proxy_cache, four pulls at once into it empty: {:.2}x the model", ratio(through_cache));
    assert!(ratio(through_cache) <= 1.05, "four pulls through the cache cost {:.2}x", ratio(through_cache));
    drop(nginx);

    // With ztserve stopped, the preheated mirror still serves the model whole.
    origin.stop().await.unwrap();
    pull(&mirror.address, &repos, 1, &dir.path().join("origin-stopped")).await;
    drop(mirror);
}
