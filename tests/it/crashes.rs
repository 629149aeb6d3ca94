//! Crashes: a server filling its disk cache from a Hub source (another ztserve's `/hf`) and
//! hashing new local files into its digest store is killed with SIGKILL at 24 seeded random
//! moments; after each restart it starts, its cache holds no temporaries, every body is
//! byte-exact, and every digest it publishes (its store's, for local files) is the SHA-256 of
//! the file's bytes.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{RunningServer, hub_origin, noise, one_tensor_safetensors, request_async, start_binary};

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// The victim: both Hub repositories of `origin` through a cache too small to hold them (so
/// every load fills), and the local directory `local`, rescanned every second.
fn start_victim(origin: &str, local: &Path, cache: &Path) -> RunningServer {
    let endpoint = format!("http://{origin}/hf");
    let (local, cache) = (local.to_str().unwrap(), cache.to_str().unwrap());
    let args = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--source",
        "hf://org/a",
        "--source",
        "hf://org/b",
        "--source",
        local,
        "--cache-dir",
        cache,
    ];
    let envs = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("ZTSERVE_CACHE__BLOCK_BYTES", "65536"),
        ("ZTSERVE_CACHE__MAX_BYTES", "1048576"),
        ("ZTSERVE_SOURCES__RESCAN_INTERVAL_SECS", "1"),
        ("ZTSERVE_DIGESTS__SYNC_INTERVAL_SECS", "1"),
    ];
    start_binary(&args, &envs)
}

/// Every file the victim publishes, by Hub repository: its bytes as they must be.
fn expected_files(hub: &[(&str, Vec<u8>)], local: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> =
        hub.iter().map(|(repo, bytes)| ((*repo).to_owned(), bytes.clone())).collect();
    for entry in std::fs::read_dir(local.join("team")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
        files.push((format!("team/{name}"), std::fs::read(&path).unwrap()));
    }
    files
}

/// What must hold after every restart: no temporary of the killed process `killed` in the
/// cache (a temporary's name ends with its writer's pid and a count), every body exact, and
/// every digest published (once all are known) the SHA-256 of its file.
async fn check_after_restart(
    victim: &RunningServer,
    killed: u32,
    cache: &Path,
    files: &[(String, Vec<u8>)],
    point: &str,
) {
    let left: Vec<_> = std::fs::read_dir(cache.join("tmp"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.rsplit('.').nth(1) == Some(killed.to_string().as_str()))
        .collect();
    assert!(left.is_empty(), "{point}: the killed server's temporaries are left: {left:?}");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ready = request_async(&victim.address, "/readyz", &[]).await.json();
        let listed = ready["models"].as_u64().unwrap_or(0) as usize >= files.len();
        if listed && ready["digests"]["complete"] == true {
            break;
        }
        assert!(Instant::now() < deadline, "{point}: never listed every model with its digests: {ready}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (repo, bytes) in files {
        let body = request_async(&victim.address, &format!("/hf/{repo}/resolve/main/model.safetensors"), &[]).await;
        let body = if body.status == 302 || body.status == 307 {
            let location = body.header("location").unwrap().to_owned();
            let path = location
                .split_once("://")
                .map_or(location.clone(), |(_, rest)| rest[rest.find('/').unwrap()..].to_owned());
            request_async(&victim.address, &path, &[]).await
        } else {
            body
        };
        assert_eq!(body.status, 200, "{point}: {repo}: {}", body.head);
        assert!(body.complete && body.body == *bytes, "{point}: {repo}: the body differs");
        let tree = request_async(&victim.address, &format!("/hf/api/models/{repo}/tree/main"), &[]).await.json();
        let oid =
            tree.as_array().unwrap().iter().find(|e| e["path"] == "model.safetensors").unwrap()["lfs"]["oid"].clone();
        assert_eq!(oid.as_str(), Some(sha256_hex(bytes).as_str()), "{point}: {repo}: a published digest is wrong");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_killed_at_24_seeded_moments_of_fills_and_digest_writes_restarts_whole() {
    let work = tempfile::tempdir().unwrap();
    let (origin_dir, local, cache) = (work.path().join("origin"), work.path().join("local"), work.path().join("cache"));
    std::fs::create_dir_all(local.join("team")).unwrap();
    let hub: Vec<(&str, Vec<u8>)> = vec![
        ("org/a", one_tensor_safetensors(&noise(2 << 20, 1))),
        ("org/b", one_tensor_safetensors(&noise(2 << 20, 2))),
    ];
    let repos: Vec<_> = hub.iter().map(|(repo, bytes)| (repo.to_string(), bytes.as_slice())).collect();
    let (origin, _origin_server) = hub_origin(&origin_dir, &repos).await;

    // The moments, in milliseconds after a new local file appears: a fixed seed, so a failure
    // names a point that can be run again.
    let mut seed = 0x5eed_u64;
    let mut moments = Vec::new();
    for _ in 0..24 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        moments.push((seed >> 33) % 1500);
    }
    let mut victim = start_victim(&origin, &local, &cache);
    for (point, moment) in moments.iter().enumerate() {
        let label = format!("point {point} ({moment} ms)");
        // Loads that fill the cache, and a new local file to hash and store, while it dies.
        let address = victim.address.clone();
        let loads = tokio::spawn(async move {
            for repo in ["org/a", "org/b", "org/a"] {
                let _ = request_async(&address, &format!("/hf/{repo}/resolve/main/model.safetensors"), &[]).await;
            }
        });
        std::fs::write(
            local.join(format!("team/m{point}.safetensors")),
            one_tensor_safetensors(&noise(1 << 20, 100 + point as u64)),
        )
        .unwrap();
        tokio::time::sleep(Duration::from_millis(*moment)).await;
        let killed = victim.child.id();
        victim.child.kill().unwrap();
        victim.child.wait().unwrap();
        loads.abort();
        victim = start_victim(&origin, &local, &cache);
        check_after_restart(&victim, killed, &cache, &expected_files(&hub, &local), &label).await;
    }
}
