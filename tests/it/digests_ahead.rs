//! Content digests ahead of need, with the clients that ask them: a sparse DeepSeek-V3-shaped
//! checkpoint (tens of GB apparent, a few MB on disk) is served from a fresh start while
//! `huggingface_hub` 2.4 (`snapshot_download(dry_run=True)`, then every file's HEAD with 8
//! workers, and the tree), 0.36 (every file's HEAD with 8 workers, and the tree) and oras-py
//! (the manifest) ask at once, each with its default timeouts and retries. Every one
//! completes with no error; every file's digest is the same in all three answers and is its
//! true SHA-256 (a sample hashed here); each file was hashed once. A restart over the digest
//! store answers the tree without hashing a byte; a replaced file is hashed again and answered
//! with its new digest, never its old one.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{request_async, run_interop_script, start_binary};
use serde_json::Value;
use sha2::Digest as _;

const REPO: &str = "deepseek/small";

/// The sum of a series of the server at `address`'s `/metrics`.
async fn scraped(address: &str, name: &str) -> f64 {
    scraped_with(address, name, "").await
}

/// The sum of the series `name` of the server at `address` whose labels include `label`.
async fn scraped_with(address: &str, name: &str, label: &str) -> f64 {
    let text = String::from_utf8(request_async(address, "/metrics", &[]).await.body).unwrap();
    text.lines()
        .filter(|line| line.starts_with(&format!("{name} ")) || line.starts_with(&format!("{name}{{")))
        .filter(|line| line.contains(label))
        .map(|line| line.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// Runs `digest_clients.py MODE ADDRESS REPO` in `venv`; its JSON answer.
async fn client(venv: &'static str, mode: &'static str, address: String) -> Value {
    let out = tokio::task::spawn_blocking(move || {
        run_interop_script(venv, "digest_clients.py", &[Path::new(mode), Path::new(&address), Path::new(REPO)])
    })
    .await
    .unwrap();
    serde_json::from_str(out.trim().lines().last().unwrap()).unwrap()
}

fn sha256_of_file(path: &Path) -> String {
    use std::io::Read as _;
    let (mut hasher, mut file) = (sha2::Sha256::new(), std::fs::File::open(path).unwrap());
    let mut buffer = vec![0u8; 4 << 20];
    loop {
        let n = file.read(&mut buffer).unwrap();
        if n == 0 {
            return hex::encode(hasher.finalize());
        }
        hasher.update(&buffer[..n]);
    }
}

/// The ETag of `file`'s HEAD at the current commit (following `main`'s redirect).
async fn head_etag(address: &str, file: &str) -> Option<String> {
    let response =
        reqwest::Client::new().head(format!("http://{address}/hf/{REPO}/resolve/main/{file}")).send().await.unwrap();
    response.headers().get("etag").map(|v| v.to_str().unwrap().trim_matches('"').to_owned())
}

/// A sparse DeepSeek-V3-shaped checkpoint of `shape` (bench/scale/generate.py's options) at
/// `REPO` in a directory of models: the scratch directory, the models' and the checkpoint's.
fn sparse_checkpoint(shape: &[&str]) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let work = tempfile::tempdir().unwrap();
    let models = work.path().join("models");
    let checkpoint = models.join(REPO);
    common::external("python3");
    let generated = std::process::Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/scale/generate.py"))
        .args(["checkpoint", checkpoint.to_str().unwrap()])
        .args(shape)
        .output()
        .unwrap();
    assert!(generated.status.success(), "{}", String::from_utf8_lossy(&generated.stderr));
    (work, models, checkpoint)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_load_a_large_checkpoints_digests_from_a_fresh_start_and_a_restart_hashes_nothing() {
    let (work, models, checkpoint) =
        sparse_checkpoint(&["--layers", "14", "--experts", "128", "--scale", "2", "--shards", "32"]);
    let store = work.path().join("digests");
    let envs = [("ZTSERVE_DIGESTS__STORE", store.to_str().unwrap()), ("ZTSERVE_SOURCES__RESCAN_INTERVAL_SECS", "1")];
    let args = ["serve", "--source", models.to_str().unwrap(), "--listen", "127.0.0.1:0"];
    let server = start_binary(&args, &envs);
    let address = server.address.clone();

    // From a fresh start, all three clients at once.
    let (hub_24, hub_036, oras) = tokio::join!(
        client("hub-2.4.0", "hub", format!("http://{address}/hf")),
        client("hub-0.36.2", "hub", format!("http://{address}/hf")),
        client("oras", "oci", address.clone()),
    );
    for answer in [&hub_24, &hub_036, &oras] {
        assert_eq!(answer["errors"], serde_json::json!([]), "{answer}");
    }
    assert_eq!(hub_24["version"], "2.4.0");
    assert_eq!(hub_24["dry_run"], true, "2.4 made the metadata pass of snapshot_download itself");
    let files: Vec<String> = serde_json::from_value(hub_036["files"].clone()).unwrap();
    assert_eq!(files.len(), 34, "32 shards, the index and the config: {files:?}");
    let mut total = 0u64;
    for file in &files {
        let size = std::fs::metadata(checkpoint.join(file)).unwrap().len();
        total += size;
        let oci = oras["layers"][file]["digest"].as_str().unwrap().strip_prefix("sha256:").unwrap().to_owned();
        for answer in [&hub_24, &hub_036] {
            assert_eq!(answer["heads"][file]["etag"].as_str(), Some(oci.as_str()), "{file}: HEAD");
            assert_eq!(answer["heads"][file]["size"].as_u64(), Some(size), "{file}: HEAD");
            assert_eq!(answer["tree"][file]["sha256"].as_str(), Some(oci.as_str()), "{file}: tree");
        }
    }
    for sample in ["config.json", "model.safetensors.index.json", "model-00001-of-00032.safetensors", &files[20]] {
        let digest = oras["layers"][sample]["digest"].as_str().unwrap();
        assert_eq!(digest, format!("sha256:{}", sha256_of_file(&checkpoint.join(sample))), "{sample}");
    }
    // Each file version hashed once, however many asked and retried.
    let readyz = request_async(&address, "/readyz", &[]).await.json();
    assert_eq!(readyz["digests"]["complete"], true, "{readyz}");
    assert_eq!(readyz["digests"]["bytes"].as_u64(), Some(total), "{readyz}");
    // Image layers are hashed after every file's own digest, in a pass of their own.
    let file_bytes = scraped_with(&address, "ztserve_file_digest_bytes_total", r#"digest="file""#).await;
    assert_eq!(file_bytes, total as f64);
    assert_eq!(scraped(&address, "ztserve_http_idle_timeouts_total").await, 0.0);
    let listed = request_async(&address, "/models", &[]).await.json();
    assert_eq!(listed["models"][0]["digests"]["hashed_bytes"].as_u64(), Some(total), "{listed}");
    drop(server);

    // A restart over the store: the tree at once, nothing hashed.
    let server = start_binary(&args, &envs);
    let address = server.address.clone();
    let tree = request_async(&address, &format!("/hf/api/models/{REPO}/tree/main?recursive=true"), &[]).await;
    assert_eq!(tree.status, 200, "{}", tree.head);
    let tree = tree.json();
    let digest_of = |tree: &Value, path: &str| {
        tree.as_array().unwrap().iter().find(|e| e["path"] == path).unwrap()["lfs"]["oid"].as_str().unwrap().to_owned()
    };
    let old = digest_of(&tree, "config.json");
    assert_eq!(format!("sha256:{old}"), oras["layers"]["config.json"]["digest"].as_str().unwrap());
    // (Image layers the first server had not hashed before it stopped are hashed now.)
    assert_eq!(scraped_with(&address, "ztserve_file_digest_bytes_total", r#"digest="file""#).await, 0.0);

    // A replaced file is hashed again, and its old digest is never its answer.
    let config = checkpoint.join("config.json");
    let replacement = work.path().join("config.json.new");
    std::fs::write(&replacement, br#"{"model_type": "deepseek_v3", "replaced": true}"#).unwrap();
    std::fs::rename(&replacement, &config).unwrap();
    let new = sha256_of_file(&config);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        // Before the rescan that sees the new file, the old version (and its digest) is served;
        // after it, only the new digest.
        match head_etag(&address, "config.json").await {
            Some(etag) if etag == new => break,
            Some(etag) => assert_eq!(etag, old, "neither the old nor the new digest"),
            None => {}
        }
        assert!(Instant::now() < deadline, "the replaced config.json was not hashed again");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let hashed = scraped(&address, "ztserve_file_digest_bytes_total").await;
    assert!(hashed >= 45.0, "the new config.json was hashed: {hashed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sha256sums_beside_a_model_spares_its_hashing_and_a_wrong_line_is_refused_on_the_first_whole_read() {
    let (_work, models, checkpoint) =
        sparse_checkpoint(&["--layers", "4", "--experts", "8", "--scale", "8", "--shards", "3"]);
    // `ztserve digest` writes what `sha256sum -c` checks.
    let digest = std::process::Command::new(env!("CARGO_BIN_EXE_ztserve"))
        .args(["digest", checkpoint.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(digest.status.success(), "{}", String::from_utf8_lossy(&digest.stderr));
    let check = std::process::Command::new("sha256sum")
        .args(["-c", "--quiet", "SHA256SUMS"])
        .current_dir(&checkpoint)
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stdout));
    // One line made wrong, as a list gone stale would be.
    let sums_path = checkpoint.join("SHA256SUMS");
    let sums = std::fs::read_to_string(&sums_path).unwrap();
    let (good, bad) = ("model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors");
    let stated_wrong = "ab".repeat(32);
    let edited: String = sums
        .lines()
        .map(|line| if line.ends_with(bad) { format!("{stated_wrong}  {bad}\n") } else { format!("{line}\n") })
        .collect();
    std::fs::write(&sums_path, edited).unwrap();

    let server = start_binary(&["serve", "--source", models.to_str().unwrap(), "--listen", "127.0.0.1:0"], &[]);
    let address = server.address.clone();
    let tree = request_async(&address, &format!("/hf/api/models/{REPO}/tree/main?recursive=true"), &[]).await;
    assert_eq!(tree.status, 200, "{}", tree.head);
    let tree = tree.json();
    let oid = |tree: &Value, path: &str| {
        tree.as_array().unwrap().iter().find(|e| e["path"] == path).unwrap()["lfs"]["oid"].as_str().unwrap().to_owned()
    };
    assert_eq!(oid(&tree, good), sha256_of_file(&checkpoint.join(good)));
    assert_eq!(oid(&tree, bad), stated_wrong, "a stated digest is trusted for listing");
    // Only the SHA256SUMS itself (a file of the repository, and no line of its own) is hashed.
    let sums_len = std::fs::metadata(&sums_path).unwrap().len();
    let deadline = Instant::now() + Duration::from_secs(60);
    while request_async(&address, "/readyz", &[]).await.json()["digests"]["complete"] != true {
        assert!(Instant::now() < deadline, "the SHA256SUMS was not hashed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(scraped_with(&address, "ztserve_file_digest_bytes_total", r#"digest="file""#).await, sums_len as f64);
    // Image layers ahead spare the files a SHA256SUMS states too: only its own is read again.
    let deadline = Instant::now() + Duration::from_secs(60);
    while scraped_with(&address, "ztserve_file_digest_bytes_total", r#"digest="image_layer""#).await < sums_len as f64 {
        assert!(Instant::now() < deadline, "the SHA256SUMS's image layer was not hashed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        scraped_with(&address, "ztserve_file_digest_bytes_total", r#"digest="image_layer""#).await,
        sums_len as f64
    );

    let client = reqwest::Client::new();
    let commit = request_async(&address, &format!("/hf/api/models/{REPO}"), &[]).await.json()["sha"]
        .as_str()
        .unwrap()
        .to_owned();
    let url = |file: &str| format!("http://{address}/hf/{REPO}/resolve/{commit}/{file}");
    // A whole read of a file whose stated digest is right: every byte, checked.
    let body = client.get(url(good)).send().await.unwrap().bytes().await.unwrap();
    assert_eq!(body.len() as u64, std::fs::metadata(checkpoint.join(good)).unwrap().len());
    assert_eq!(scraped(&address, "ztserve_digest_failures_total").await, 0.0);
    // A whole read of the file whose stated digest is wrong: its last bytes are held back and
    // the body is cut, as for a declared digest that does not match; logged and counted.
    let wrong = client.get(url(bad)).send().await.unwrap();
    assert_eq!(wrong.status(), 200);
    let expected_len = std::fs::metadata(checkpoint.join(bad)).unwrap().len();
    // The body is cut: an error reading it, or fewer bytes than the file holds.
    if let Ok(body) = wrong.bytes().await {
        assert!((body.len() as u64) < expected_len, "the whole body was sent");
    }
    assert_eq!(scraped(&address, "ztserve_digest_failures_total").await, 1.0);
    // The log reaches the test through a thread reading the server's stderr: wait for the line.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !server.log.lock().unwrap().iter().any(|line| line.contains("a stated digest does not match the file")) {
        assert!(Instant::now() < deadline, "the mismatch is logged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // From then on the file's computed digest is its digest.
    let tree = request_async(&address, &format!("/hf/api/models/{REPO}/tree/main?recursive=true"), &[]).await.json();
    assert_eq!(oid(&tree, bad), sha256_of_file(&checkpoint.join(bad)));
}
