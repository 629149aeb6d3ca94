//! The artifact store over real sockets: no writes at all without `[artifacts]`; with it,
//! blobs kept only when they hash to their name, bundles published once and whole (of eight
//! racing publishes one wins), writes only by the tokens `[artifacts] writers` grants and
//! within their prefixes, reads by `[auth]`'s tokens within theirs, and ranges on blobs; and
//! `ztserve artifacts` publishing a directory signed and restoring it for its publisher's key only.

use crate::common;

use common::{Reply, send, serve};
use serde_json::json;
use sha2::Digest as _;
use ztserve::config::{Config, SourceSpec};

const READER: &str = "reader-0123456789abcdef";
const TEAM_A_READER: &str = "team-a-reader-0123456789";
const WRITER: &str = "writer-0123456789abcdef";
const TEAM_A_WRITER: &str = "team-a-writer-0123456789";

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

fn call(address: &str, method: &str, path: &str, token: Option<&str>, body: &[u8]) -> Reply {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers: Vec<(&str, &str)> = bearer.iter().map(|b| ("Authorization", b.as_str())).collect();
    if method == "PUT" && path.starts_with("/artifacts/bundles/") {
        headers.push(("Content-Type", "application/json"));
    }
    send(address, method, path, &headers, body)
}

fn code(reply: &Reply) -> String {
    reply.json()["error"]["code"].as_str().unwrap_or_default().to_owned()
}

fn bundle_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let files: Vec<_> = files
        .iter()
        .map(|(path, bytes)| json!({ "path": path, "sha256": &digest(bytes)[7..], "size": bytes.len() }))
        .collect();
    serde_json::to_vec(&json!({ "files": files })).unwrap()
}

async fn store(dir: &std::path::Path) -> (String, std::sync::Arc<ztserve::server::Server>, tempfile::TempDir) {
    let models = tempfile::tempdir().unwrap();
    let mut config = Config::serving(vec![SourceSpec::local(models.path())]);
    config.auth.tokens = common::tokens(vec![READER.into(), format!("{TEAM_A_READER} team-a")]);
    config.artifacts.dir = Some(dir.to_owned());
    config.artifacts.writers = common::tokens(vec![WRITER.into(), format!("{TEAM_A_WRITER} team-a")]);
    config.artifacts.allow_unsigned = true;
    let (address, server) = serve(config).await;
    (address, server, models)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_artifact_store_the_server_takes_no_writes() {
    let models = tempfile::tempdir().unwrap();
    let (address, _server) = serve(Config::serving(vec![SourceSpec::local(models.path())])).await;
    tokio::task::spawn_blocking(move || {
        let blob = b"compiled";
        let put = call(&address, "PUT", &format!("/artifacts/blobs/{}", digest(blob)), None, blob);
        assert_eq!((put.status, code(&put).as_str()), (404, "route_not_found"));
        let listed = call(&address, "GET", "/artifacts/bundles", None, b"");
        assert_eq!(listed.status, 404);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blobs_are_kept_only_from_writers_and_only_when_they_hash_to_their_name() {
    let dir = tempfile::tempdir().unwrap();
    let (address, _server, _models) = store(dir.path()).await;
    let blobs = dir.path().join("blobs/sha256");
    tokio::task::spawn_blocking(move || {
        let blob: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
        let path = format!("/artifacts/blobs/{}", digest(&blob));
        let anonymous = call(&address, "PUT", &path, None, &blob);
        assert_eq!((anonymous.status, code(&anonymous).as_str()), (401, "unauthorized"));
        let reader = call(&address, "PUT", &path, Some(READER), &blob);
        assert_eq!((reader.status, code(&reader).as_str()), (403, "write_not_granted"));
        let wrong = call(&address, "PUT", &path, Some(WRITER), b"other bytes");
        assert_eq!((wrong.status, code(&wrong).as_str()), (422, "digest_mismatch"));
        let bad = call(&address, "PUT", "/artifacts/blobs/md5:abc", Some(WRITER), b"x");
        assert_eq!((bad.status, code(&bad).as_str()), (400, "bad_digest"));
        assert_eq!(call(&address, "GET", &path, Some(READER), b"").status, 404, "nothing refused was kept");

        assert_eq!(call(&address, "PUT", &path, Some(WRITER), &blob).status, 201);
        assert_eq!(call(&address, "PUT", &path, Some(TEAM_A_WRITER), &blob).status, 200, "already held");
        let read = call(&address, "GET", &path, Some(TEAM_A_READER), b"");
        assert!(read.status == 200 && read.body == blob, "{}", read.status);
        let headers = [("Authorization", format!("Bearer {READER}")), ("Range", "bytes=10-19".into())];
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let range = send(&address, "GET", &path, &headers, b"");
        assert_eq!((range.status, range.body.as_slice()), (206, &blob[10..20]));
        assert_eq!(call(&address, "GET", &path, None, b"").status, 401, "reads follow [auth]");

        // A byte rotted on disk: the blob no longer hashes to its name, is not served, and is
        // dropped (with no bucket to fetch it from again).
        let file = blobs.join(&digest(&blob)["sha256:".len()..]);
        let mut rotted = std::fs::read(&file).unwrap();
        rotted[50_000] ^= 1;
        std::fs::write(&file, rotted).unwrap();
        let damaged = common::metric("ztserve_artifact_blobs_damaged_total", &[]);
        let read = call(&address, "GET", &path, Some(READER), b"");
        assert_eq!((read.status, code(&read).as_str()), (404, "no_such_blob"));
        assert!(!file.exists(), "the damaged blob is dropped");
        assert_eq!(common::metric("ztserve_artifact_blobs_damaged_total", &[]) - damaged, 1.0);
        assert_eq!(call(&address, "PUT", &path, Some(WRITER), &blob).status, 201, "and may be published again");
    })
    .await
    .unwrap();
    let tmp = std::fs::read_dir(dir.path().join("tmp")).unwrap().count();
    assert_eq!(tmp, 0, "no temporary is left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_is_published_once_whole_and_within_its_writers_prefixes() {
    let dir = tempfile::tempdir().unwrap();
    let (address, _server, _models) = store(dir.path()).await;
    tokio::task::spawn_blocking(move || {
        let (graph, kernel): (&[u8], &[u8]) = (b"def forward(x): ...", b"\x7fELF kernel");
        let bundle = bundle_of(&[("rank_0_0/backbone/graph.py", graph), ("inductor/kernel.so", kernel)]);
        let put_bundle =
            |name: &str, token, body: &[u8]| call(&address, "PUT", &format!("/artifacts/bundles/{name}"), token, body);
        let missing = put_bundle("team-a/vllm/abc", Some(WRITER), &bundle);
        assert_eq!((missing.status, code(&missing).as_str()), (409, "missing_blob"));
        for blob in [graph, kernel] {
            assert_eq!(
                call(&address, "PUT", &format!("/artifacts/blobs/{}", digest(blob)), Some(WRITER), blob).status,
                201
            );
        }
        let outside = put_bundle("team-b/vllm/abc", Some(TEAM_A_WRITER), &bundle);
        assert_eq!((outside.status, code(&outside).as_str()), (403, "write_not_granted"));
        let leaving = put_bundle("team-a/x", Some(WRITER), &bundle_of(&[("../../etc/cron.d/x", graph)]));
        assert_eq!((leaving.status, code(&leaving).as_str()), (400, "bad_bundle"));
        let not_json = put_bundle("team-a/x", Some(WRITER), b"{");
        assert_eq!((not_json.status, code(&not_json).as_str()), (400, "bad_bundle"));

        assert_eq!(put_bundle("team-a/vllm/abc", Some(TEAM_A_WRITER), &bundle).status, 201);
        let again = put_bundle("team-a/vllm/abc", Some(WRITER), &bundle_of(&[("other", graph)]));
        assert_eq!((again.status, code(&again).as_str()), (409, "bundle_exists"));
        let read = call(&address, "GET", "/artifacts/bundles/team-a/vllm/abc", Some(TEAM_A_READER), b"");
        assert_eq!(read.status, 200);
        assert_eq!(
            read.json(),
            serde_json::from_slice::<serde_json::Value>(&bundle).unwrap(),
            "the first publish stands"
        );

        assert_eq!(put_bundle("shared/x", Some(WRITER), &bundle_of(&[("g", graph)])).status, 201);
        let listed = call(&address, "GET", "/artifacts/bundles", Some(READER), b"").json();
        assert_eq!(listed["bundles"], json!(["shared/x", "team-a/vllm/abc"]));
        let team = call(&address, "GET", "/artifacts/bundles", Some(TEAM_A_READER), b"").json();
        assert_eq!(team["bundles"], json!(["team-a/vllm/abc"]), "a reader lists only what it may read");
        let prefixed = call(&address, "GET", "/artifacts/bundles?prefix=shared/", Some(READER), b"").json();
        assert_eq!(prefixed["bundles"], json!(["shared/x"]));
        let hidden = call(&address, "GET", "/artifacts/bundles/shared/x", Some(TEAM_A_READER), b"");
        assert_eq!((hidden.status, code(&hidden).as_str()), (404, "no_such_bundle"));
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_eight_nodes_publishing_one_name_at_once_one_wins_and_the_bundle_is_never_torn() {
    let dir = tempfile::tempdir().unwrap();
    let (address, _server, _models) = store(dir.path()).await;
    let blobs: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i; 4096]).collect();
    let racers: Vec<_> = blobs
        .iter()
        .enumerate()
        .map(|(i, blob)| {
            let (address, blob) = (address.clone(), blob.clone());
            tokio::task::spawn_blocking(move || {
                let put = call(&address, "PUT", &format!("/artifacts/blobs/{}", digest(&blob)), Some(WRITER), &blob);
                assert_eq!(put.status, 201);
                let body = bundle_of(&[(&format!("rank_{i}/cache"), &blob)]);
                call(&address, "PUT", "/artifacts/bundles/race/key", Some(WRITER), &body).status
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for racer in racers {
        statuses.push(racer.await.unwrap());
    }
    statuses.sort();
    assert_eq!(statuses, [201, 409, 409, 409, 409, 409, 409, 409]);
    let read =
        tokio::task::spawn_blocking(move || call(&address, "GET", "/artifacts/bundles/race/key", Some(READER), b""))
            .await
            .unwrap()
            .json();
    let files = read["files"].as_array().unwrap();
    assert_eq!(files.len(), 1);
    let path = files[0]["path"].as_str().unwrap();
    let rank: usize = path.strip_prefix("rank_").unwrap().split('/').next().unwrap().parse().unwrap();
    assert_eq!(files[0]["sha256"], json!(&digest(&blobs[rank])[7..]), "the winner's own files, whole");
}

/// A P-256 key pair written as PEM files in `dir`: (private key, public key).
fn key_pair(dir: &std::path::Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let (private, public) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}.pub")));
    std::fs::write(&private, key.serialize_pem()).unwrap();
    std::fs::write(&public, key.public_key_pem()).unwrap();
    (private, public)
}

/// `ztserve artifacts ARGS` as a writer: its exit code and standard error.
fn artifacts_command(args: &[&std::ffi::OsStr]) -> (i32, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ztserve"))
        .arg("artifacts")
        .args(args)
        .env("ZTSERVE_TOKEN", WRITER)
        .env_remove("ZTSERVE_ARTIFACTS_SIGNING_KEY")
        .output()
        .unwrap();
    (output.status.code().unwrap(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_published_signed_is_restored_whole_only_for_its_publishers_key() {
    let (dir, keys, work) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (publisher, publisher_pub) = key_pair(keys.path(), "publisher");
    let (other, other_pub) = key_pair(keys.path(), "other");
    let models = tempfile::tempdir().unwrap();
    let mut config = Config::serving(vec![SourceSpec::local(models.path())]);
    config.artifacts.dir = Some(dir.path().to_owned());
    config.artifacts.writers = common::tokens(vec![WRITER.into()]);
    config.artifacts.require_signature = true;
    config.signing.public_keys = vec![publisher_pub.clone()];
    let (address, _server) = serve(config).await;
    let cache = work.path().join("cache");
    std::fs::create_dir_all(cache.join("rank_0_0")).unwrap();
    std::fs::write(cache.join("rank_0_0/model"), vec![7u8; 300_000]).unwrap();
    std::fs::write(cache.join(".hidden"), b"kept too").unwrap();
    tokio::task::spawn_blocking(move || {
        let server = format!("http://{address}");
        let os = |s: &str| std::ffi::OsString::from(s);
        let publish = |key: Option<&std::path::Path>| {
            let mut args = vec![os("publish"), os(&server), os("triton/h100"), cache.clone().into_os_string()];
            if let Some(key) = key {
                args.extend([os("--signing-key"), key.as_os_str().to_owned()]);
            }
            artifacts_command(&args.iter().map(|a| a.as_os_str()).collect::<Vec<_>>())
        };
        // An untrusted writer's bundles (unsigned, or signed by another key) are refused, so the
        // name stays free for the trusted publisher: no writer can squat it.
        let (status, stderr) = publish(None);
        assert!(status == 1 && stderr.contains("unsigned"), "{status} {stderr}");
        let (status, stderr) = publish(Some(&other));
        assert!(status == 1 && stderr.contains("not trusted"), "{status} {stderr}");
        let (status, stderr) = publish(Some(&publisher));
        assert!(status == 0 && stderr.contains("published triton/h100: 2 files"), "{status} {stderr}");
        let (status, stderr) = publish(Some(&publisher));
        assert!(status == 0 && stderr.contains("published already"), "{status} {stderr}");

        let restore = |name: &str, into: &std::path::Path, key: &std::path::Path| {
            let args = [os("restore"), os(&server), os(name), into.as_os_str().to_owned(), os("--public-key")];
            let mut args: Vec<std::ffi::OsString> = args.into();
            args.push(key.as_os_str().to_owned());
            artifacts_command(&args.iter().map(|a| a.as_os_str()).collect::<Vec<_>>())
        };
        let restored = work.path().join("restored");
        let (status, stderr) = restore("triton/h100", &restored, &other_pub);
        assert!(status == 1 && stderr.contains("not trusted") && !restored.exists(), "{status} {stderr}");
        let (status, stderr) = restore("triton/h100", &restored, &publisher_pub);
        assert!(status == 0 && stderr.contains("signed by key publisher.pub"), "{status} {stderr}");
        assert_eq!(std::fs::read(restored.join("rank_0_0/model")).unwrap(), vec![7u8; 300_000]);
        assert_eq!(std::fs::read(restored.join(".hidden")).unwrap(), b"kept too");
        let leftovers: Vec<_> = std::fs::read_dir(work.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(leftovers.len(), 2, "no staging directory is left: {leftovers:?}");
        let (status, stderr) = restore("triton/h100", &restored, &publisher_pub);
        assert!(status == 1 && stderr.contains("not empty"), "{status} {stderr}");
        let (status, _) = restore("triton/none", &work.path().join("none"), &publisher_pub);
        assert_eq!(status, 3);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_sharing_a_bucket_read_each_others_bundles_and_one_publish_of_a_name_wins() {
    let s3 = common::start_s3();
    s3.create_bucket("artifacts");
    let mut replicas = Vec::new();
    let mut dirs = Vec::new();
    for _ in 0..2 {
        let (dir, models) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut config = Config::serving(vec![SourceSpec::local(models.path())]);
        config.artifacts.dir = Some(dir.path().to_owned());
        config.artifacts.writers = common::tokens(vec![WRITER.into()]);
        config.artifacts.allow_unsigned = true;
        config.artifacts.s3 = Some(SourceSpec::S3 { bucket: "artifacts".into(), prefix: "shared".into() });
        config.s3_source.endpoint = Some(s3.endpoint.clone());
        config.s3_source.region = Some("us-east-1".into());
        config.s3_source.allow_http = true;
        config.s3_source.access_key_id = Some("testing".into());
        config.s3_source.secret_access_key = Some("testing".into());
        let (address, server) = serve(config).await;
        replicas.push((address, server));
        dirs.push((dir, models));
    }
    let (a, b) = (replicas[0].0.clone(), replicas[1].0.clone());
    let b_blobs = dirs[1].0.path().join("blobs/sha256");
    tokio::task::spawn_blocking(move || {
        let (graph, model): (&[u8], Vec<u8>) = (b"graph", (0..50_000u32).map(|i| (i % 251) as u8).collect());
        for blob in [graph, &model[..]] {
            let put = call(&a, "PUT", &format!("/artifacts/blobs/{}", digest(blob)), Some(WRITER), blob);
            assert_eq!(put.status, 201, "{}", String::from_utf8_lossy(&put.body));
        }
        // The blobs went to replica A, the bundle to replica B: B takes them from the bucket.
        let bundle = bundle_of(&[("inductor_cache/graph", graph), ("rank_0_0/model", &model)]);
        let published = call(&b, "PUT", "/artifacts/bundles/vllm/shared", Some(WRITER), &bundle);
        assert_eq!(published.status, 201, "{}", String::from_utf8_lossy(&published.body));
        // A holds neither the bundle nor its record, and serves it from the bucket.
        let read = call(&a, "GET", "/artifacts/bundles/vllm/shared", None, b"");
        assert_eq!(read.status, 200, "{}", String::from_utf8_lossy(&read.body));
        assert_eq!(read.json()["files"][1]["path"], "rank_0_0/model");
        let listed = call(&a, "GET", "/artifacts/bundles?prefix=vllm/", None, b"");
        assert_eq!(listed.json()["bundles"], json!(["vllm/shared"]));
        // The name is published once among replicas: A may not publish it again.
        let again = call(&a, "PUT", "/artifacts/bundles/vllm/shared", Some(WRITER), &bundle_of(&[("x", graph)]));
        assert_eq!((again.status, code(&again).as_str()), (409, "bundle_exists"));
        // A third name published on A only is read from B, blob bytes and all.
        let only_a = bundle_of(&[("only", &model)]);
        assert_eq!(call(&a, "PUT", "/artifacts/bundles/vllm/a-only", Some(WRITER), &only_a).status, 201);
        assert_eq!(call(&b, "GET", "/artifacts/bundles/vllm/a-only", None, b"").status, 200);
        let bytes = call(&b, "GET", &format!("/artifacts/blobs/{}", digest(&model)), None, b"");
        assert_eq!(bytes.body, model);
        // Rotted on B's disk, the blob is dropped there and fetched again from the bucket.
        let on_b = b_blobs.join(&digest(&model)["sha256:".len()..]);
        let mut rotted = std::fs::read(&on_b).unwrap();
        rotted[100] ^= 1;
        std::fs::write(&on_b, rotted).unwrap();
        let again = call(&b, "GET", &format!("/artifacts/blobs/{}", digest(&model)), None, b"");
        assert!(again.status == 200 && again.body == model, "{}", again.status);
        // Eight publishes of one new name at once, four on each replica: one wins.
        let racers: Vec<_> = (0..8)
            .map(|i| {
                let (address, bundle) = (if i % 2 == 0 { a.clone() } else { b.clone() }, bundle_of(&[("r", graph)]));
                std::thread::spawn(move || call(&address, "PUT", "/artifacts/bundles/vllm/race", Some(WRITER), &bundle))
            })
            .collect();
        let statuses: Vec<u16> = racers.into_iter().map(|r| r.join().unwrap().status).collect();
        assert_eq!(statuses.iter().filter(|s| **s == 201).count(), 1, "{statuses:?}");
        assert!(statuses.iter().all(|s| *s == 201 || *s == 409), "{statuses:?}");
    })
    .await
    .unwrap();

    // A blob A holds whose upload to the bucket was lost (removed from the bucket here): a
    // bundle naming it is created in the bucket only once A has put it there again, so B
    // restores that bundle whole.
    let lost: Vec<u8> = (0..70_000u32).map(|i| (i % 239) as u8).collect();
    let a = replicas[0].0.clone();
    let put = {
        let (a, lost) = (a.clone(), lost.clone());
        tokio::task::spawn_blocking(move || {
            call(&a, "PUT", &format!("/artifacts/blobs/{}", digest(&lost)), Some(WRITER), &lost)
        })
    };
    assert_eq!(put.await.unwrap().status, 201);
    let key = format!("shared/blobs/sha256/{}", &digest(&lost)["sha256:".len()..]);
    object_store::ObjectStoreExt::delete(&s3.client("artifacts"), &key.as_str().into()).await.unwrap();
    let b = replicas[1].0.clone();
    tokio::task::spawn_blocking(move || {
        let bundle = bundle_of(&[("lost", &lost)]);
        assert_eq!(call(&a, "PUT", "/artifacts/bundles/vllm/lost", Some(WRITER), &bundle).status, 201);
        let read = call(&b, "GET", "/artifacts/bundles/vllm/lost", None, b"");
        assert_eq!(read.status, 200, "{}", String::from_utf8_lossy(&read.body));
        let blob = call(&b, "GET", &format!("/artifacts/blobs/{}", digest(&lost)), None, b"");
        assert!(blob.status == 200 && blob.body == lost, "{}", blob.status);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_signatures_required_a_bundle_kept_from_before_is_checked_as_it_is_served() {
    let (dir, keys, models) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_, publisher_pub) = key_pair(keys.path(), "publisher");
    let mut unsigned = Config::serving(vec![SourceSpec::local(models.path())]);
    unsigned.artifacts.dir = Some(dir.path().to_owned());
    unsigned.artifacts.writers = common::tokens(vec![WRITER.into()]);
    unsigned.artifacts.allow_unsigned = true;
    let mut checking = unsigned.clone();
    checking.artifacts.allow_unsigned = false;
    checking.artifacts.require_signature = true;
    checking.signing.public_keys = vec![publisher_pub];
    let (before, _first) = serve(unsigned).await;
    tokio::task::spawn_blocking(move || {
        let kernel: &[u8] = b"\x7fELF kernel";
        assert_eq!(
            call(&before, "PUT", &format!("/artifacts/blobs/{}", digest(kernel)), Some(WRITER), kernel).status,
            201
        );
        let bundle = bundle_of(&[("k.so", kernel)]);
        assert_eq!(call(&before, "PUT", "/artifacts/bundles/vllm/abc", Some(WRITER), &bundle).status, 201);
    })
    .await
    .unwrap();
    // The same store opened again under signatures required: what it kept unchecked is not served.
    let (after, _second) = serve(checking).await;
    tokio::task::spawn_blocking(move || {
        let read = call(&after, "GET", "/artifacts/bundles/vllm/abc", None, b"");
        assert_eq!((read.status, code(&read).as_str()), (422, "signature_required"));
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_full_disk_a_publish_is_refused_as_a_full_store_and_reads_go_on() {
    // A disk of 1 MiB under a bound of 50 GB: the disk fills first.
    let disk = common::SmallDisk::mount(1 << 20);
    let (address, _server, _models) = store(disk.dir.path()).await;
    let tmp = disk.dir.path().join("tmp");
    tokio::task::spawn_blocking(move || {
        let kernel: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
        let path = format!("/artifacts/blobs/{}", digest(&kernel));
        assert_eq!(call(&address, "PUT", &path, Some(WRITER), &kernel).status, 201);
        assert_eq!(
            call(&address, "PUT", "/artifacts/bundles/vllm/kept", Some(WRITER), &bundle_of(&[("k", &kernel)])).status,
            201
        );
        let large: Vec<u8> = (0..2_000_000u32).map(|i| (i % 241) as u8).collect();
        let full = call(&address, "PUT", &format!("/artifacts/blobs/{}", digest(&large)), Some(WRITER), &large);
        assert_eq!((full.status, code(&full).as_str()), (507, "store_full"), "{}", String::from_utf8_lossy(&full.body));
        assert!(full.json()["error"]["message"].as_str().unwrap().contains("disk is full"), "{}", full.json());
        assert_eq!(std::fs::read_dir(&tmp).unwrap().count(), 0, "nothing torn is left behind");
        // What was published before still reads, whole.
        assert_eq!(call(&address, "GET", "/artifacts/bundles/vllm/kept", Some(READER), b"").status, 200);
        let read = call(&address, "GET", &path, Some(READER), b"");
        assert!(read.status == 200 && read.body == kernel, "{}", read.status);
    })
    .await
    .unwrap();
}
