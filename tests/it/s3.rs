//! What only a remote source has: manifests found with suffix reads and cached by ETag, long
//! reads split into ranged GETs, decoding from streamed bytes, and the store failing, refusing
//! or changing underneath a running server. Every test runs a real moto S3 server on 127.0.0.1.

use crate::common;

use std::io::{Read as _, Write as _};
use std::time::{Duration, Instant};

use common::{ModelSource, metric, model, noise, one_tensor_safetensors, request, request_async as ask, serve};
use ztserve::config::Config;
use ztserve::format::DType;

/// Runs a blocking client off the test's runtime.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

/// Ranged reads started against S3 for `purpose`.
fn s3_reads(purpose: &str) -> f64 {
    metric("ztserve_storage_read_duration_seconds_count", &[("backend", "s3"), ("kind", purpose)])
}

/// Each listed model's id and status.
fn statuses(list: &serde_json::Value) -> Vec<(&str, &str)> {
    list["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["id"].as_str().unwrap(), m["status"].as_str().unwrap()))
        .collect()
}

fn s3_bytes(purpose: &str) -> f64 {
    metric("ztserve_storage_read_bytes_total", &[("backend", "s3"), ("purpose", purpose)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_take_one_suffix_read_when_they_fit_and_are_read_again_only_when_the_etag_changes() {
    let source = ModelSource::s3();
    let payload = noise(200 << 10, 1);
    // Fits in the 64 KiB suffix with its manifest: the suffix is the whole object.
    source.put("small.zt", &model(&[("w", DType::U8, &payload[..1000], false)])).await;
    // Larger than the suffix, manifest inside it: the suffix, and the 8-byte header beside it.
    source.put("large.zt", &model(&[("w", DType::U8, &payload, false)])).await;
    // A manifest larger than the suffix: one more read for the rest of it.
    let names: Vec<String> = (0..1500).map(|i| format!("tensor.{i:05}.with.a.long.descriptive.name")).collect();
    let many: Vec<(&str, DType, &[u8], bool)> =
        names.iter().map(|n| (n.as_str(), DType::U8, &payload[..4], false)).collect();
    let wide = model(&many);
    source.put("wide.zt", &wide).await;

    let (address, state) = serve(source.config(Config::default())).await;
    assert_eq!(s3_reads("manifest"), 6.0, "1 + 2 + 3 reads");
    let list = ask(&address, "/models", &[]).await.json();
    let statuses = statuses(&list);
    assert_eq!(statuses, [("large", "ok"), ("small", "ok"), ("wide", "ok")]);
    assert_eq!(list["models"][2]["objects"], 1500);

    // Unchanged objects are not read again; a replaced one is, once.
    state.rescan().await;
    state.rescan().await;
    assert_eq!(s3_reads("manifest"), 6.0, "nothing re-read while ETags are unchanged");
    source.put("small.zt", &model(&[("w", DType::U8, &payload[..2000], false)])).await;
    state.rescan().await;
    assert_eq!(s3_reads("manifest"), 7.0);
    let body = ask(&address, "/models/small/objects/w", &[]).await.body;
    assert_eq!(body, payload[..2000]);
}

/// A safetensors header is read with the file's first 64 KiB, and a second ranged read only when
/// it is longer; a checkpoint's index is read whole, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn safetensors_headers_take_one_read_when_they_fit_and_two_when_they_do_not() {
    let source = ModelSource::s3();
    let small: &[common::StTensor<'_>] = &[("w", safetensors::Dtype::U8, vec![4], &[1, 2, 3, 4])];
    source.put("small.safetensors", &common::safetensors_file(small)).await;
    let names: Vec<String> = (0..1500).map(|i| format!("tensor.{i:05}.with.a.long.descriptive.name")).collect();
    let wide: Vec<common::StTensor<'_>> =
        names.iter().map(|n| (n.as_str(), safetensors::Dtype::U8, vec![2], &[7u8, 8][..])).collect();
    let wide = common::safetensors_file(&wide);
    assert!(u64::from_le_bytes(wide[..8].try_into().unwrap()) > 64 << 10, "the header is longer than the first read");
    source.put("wide.safetensors", &wide).await;
    for (name, bytes) in common::safetensors_checkpoint(&[small]) {
        source.put(&format!("ckpt/{name}"), &bytes).await;
    }

    let (address, state) = serve(source.config(Config::default())).await;
    assert_eq!(s3_reads("manifest"), 5.0, "1 (small) + 2 (wide) + 1 (index) + 1 (its shard)");
    let list = ask(&address, "/models", &[]).await.json();
    let statuses = statuses(&list);
    assert_eq!(statuses, [("ckpt", "ok"), ("small", "ok"), ("wide", "ok")]);
    assert_eq!(list["models"][2]["objects"], 1500);
    state.rescan().await;
    assert_eq!(s3_reads("manifest"), 5.0, "nothing re-read while ETags are unchanged");
    let body = ask(&address, &ztserve::api::object_url("wide", "tensor.01499.with.a.long.descriptive.name"), &[]).await;
    assert_eq!(body.body, [7, 8]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_ranges_read_only_their_bytes_and_long_reads_split_into_parallel_gets() {
    let source = ModelSource::s3();
    let raw = noise(24 << 20, 2);
    let file = model(&[("raw", DType::U8, &raw, false)]);
    source.put("m.zt", &file).await;
    let config = source.config(Config {
        remote: ztserve::config::Remote { range_chunk_bytes: 1 << 20, range_concurrency: 4, ..Default::default() },
        ..Config::default()
    });
    let (address, _state) = serve(config).await;

    // A 1000-byte range is one GET of 1000 bytes.
    let (reads, bytes) = (s3_reads("serve"), s3_bytes("serve"));
    let reply = ask(&address, "/models/m/objects/raw", &[("range", "bytes=5000000-5000999")]).await;
    assert_eq!(reply.status, 206);
    assert_eq!(reply.body, raw[5_000_000..5_001_000]);
    assert_eq!((s3_reads("serve") - reads, s3_bytes("serve") - bytes), (1.0, 1000.0));

    // The whole component: 24 GETs of 1 MiB, in order, no byte more.
    let (reads, bytes) = (s3_reads("serve"), s3_bytes("serve"));
    let reply = ask(&address, "/models/m/objects/raw", &[]).await;
    assert_eq!(reply.status, 200);
    assert!(reply.body == raw, "the whole component differs");
    assert_eq!((s3_reads("serve") - reads, s3_bytes("serve") - bytes), (24.0, (24 << 20) as f64));

    // The stored file, byte for byte, and a range of it across chunk boundaries.
    let whole = ask(&address, "/models/m/file", &[]).await;
    assert!(whole.body == file, "the stored file differs");
    let part = ask(&address, "/models/m/file", &[("range", "bytes=1048000-7340100")]).await;
    assert!(part.body == file[1_048_000..=7_340_100], "a long range of the file differs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zstd_components_decode_from_streamed_s3_bytes_cached_or_not() {
    let source = ModelSource::s3();
    // Compressible: 32 MiB of u32 counters.
    let counters: Vec<u8> = (0..(8u32 << 20)).flat_map(u32::to_le_bytes).collect();
    source.put("z.zt", &model(&[("counters", DType::U32, &counters, true)])).await;
    for cache in [1 << 20, 64 << 20] {
        let config = Config {
            decode: ztserve::config::Decode { cache_bytes: cache, ..Default::default() },
            ..source.config(Config::default())
        };
        let (address, _state) = serve(config).await;
        let whole = ask(&address, "/models/z/objects/counters", &[]).await;
        assert_eq!(whole.status, 200, "cache {cache}");
        assert!(whole.body == counters, "cache {cache}: decoded bytes differ");
        let range = ask(&address, "/models/z/objects/counters", &[("range", "bytes=20000000-20000099")]).await;
        assert_eq!(range.body, counters[20_000_000..20_000_100], "cache {cache}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_s3_answers_503_with_retry_after_readyz_degrades_and_service_resumes_by_itself() {
    let mut source = ModelSource::s3();
    let raw = noise(1 << 20, 3);
    let file = model(&[("raw", DType::U8, &raw, false)]);
    source.put("remote.zt", &file).await;
    let local = tempfile::tempdir().unwrap();
    std::fs::write(local.path().join("here.zt"), &file).unwrap();
    let mut config = source.config(Config::default());
    config.sources.paths.push(ztserve::config::SourceSpec::local(local.path()));
    let (address, state) = serve(config).await;
    let get = |path: &'static str| ask(&address, path, &[]);
    assert!(get("/models/remote/objects/raw").await.body == raw);
    assert_eq!(get("/readyz").await.json()["status"], "ready");

    let ModelSource::S3 { server, .. } = &mut source else { unreachable!() };
    server.stop();
    let started = Instant::now();
    let down = get("/models/remote/objects/raw").await;
    assert_eq!(down.status, 503);
    assert_eq!(down.header("retry-after"), Some("5"));
    assert_eq!(down.json()["error"]["code"], "source_unavailable");
    assert!(started.elapsed() < Duration::from_secs(15), "answered after {:?}", started.elapsed());
    let ready = get("/readyz").await;
    assert_eq!(ready.status, 200);
    let ready = ready.json();
    assert_eq!(ready["status"], "degraded");
    assert_eq!(ready["sources"][0]["status"], "unavailable");
    assert_eq!(ready["sources"][1]["status"], "ok");
    assert!(get("/models/here/objects/raw").await.body == raw, "the local source keeps serving");
    // A rescan while S3 is down keeps the S3 models listed.
    state.rescan().await;
    assert_eq!(get("/models").await.json()["models"].as_array().unwrap().len(), 2);

    // S3 comes back (moto keeps nothing, so the same bytes are uploaded again: same ETag).
    let ModelSource::S3 { server, .. } = &mut source else { unreachable!() };
    server.start();
    server.create_bucket("models");
    source.put("remote.zt", &file).await;
    let back = get("/models/remote/objects/raw").await;
    assert_eq!(back.status, 200);
    assert!(back.body == raw);
    assert_eq!(get("/readyz").await.json()["status"], "ready");
}

/// Runs `ztserve serve` with `envs` until it exits (or 30 s pass) and returns its status and log.
fn run_to_exit(envs: &[(String, String)]) -> (Option<i32>, String) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ztserve"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .envs(envs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut log = String::new();
    child.stderr.take().unwrap().read_to_string(&mut log).unwrap();
    (status, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_bucket_or_wrong_credentials_stop_the_start_with_a_clear_error_or_degrade_by_config() {
    let source = ModelSource::s3();
    let mut envs = source.envs();
    envs[0].1 = "s3://no-such-bucket/models".into();
    let (status, log) = blocking({
        let envs = envs.clone();
        move || run_to_exit(&envs)
    })
    .await;
    assert_eq!(status, Some(1), "{log}");
    assert!(log.contains("s3://no-such-bucket/models") && log.contains("bucket does not exist"), "{log}");

    // Credentials moto does not know (it checks them when told to).
    let checking = common::start_s3_with(&[("INITIAL_NO_AUTH_ACTION_COUNT", "0")]);
    let mut envs = source.envs();
    envs[1].1 = checking.endpoint.clone();
    let (status, log) = blocking({
        let envs = envs.clone();
        move || run_to_exit(&envs)
    })
    .await;
    assert_eq!(status, Some(1), "{log}");
    assert!(log.contains("s3://models/prod") && log.contains("refuses access"), "{log}");

    // Told to degrade, it starts, and says why the source is not served.
    envs.push(("ZTSERVE_SOURCES__ON_UNREADABLE".into(), "degrade".into()));
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let server = common::start_binary(&["serve", "--listen", "127.0.0.1:0"], &envs);
    let address = server.address.clone();
    let ready = blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let reply = request(&address, "/readyz", &[]);
            if reply.json()["status"] != "starting" || Instant::now() > deadline {
                return reply;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .await;
    assert_eq!(ready.status, 503);
    let ready = ready.json();
    assert_eq!(ready["status"], "unavailable");
    assert_eq!(ready["sources"][0]["status"], "refused", "{ready}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_replaced_during_a_long_download_gives_the_old_bytes_or_an_error_never_a_mix() {
    let source = ModelSource::s3();
    let old = noise(32 << 20, 4);
    let new = noise(32 << 20, 5);
    source.put("m.zt", &model(&[("raw", DType::U8, &old, false)])).await;
    let config = source.config(Config {
        remote: ztserve::config::Remote { range_chunk_bytes: 1 << 20, range_concurrency: 2, ..Default::default() },
        ..Config::default()
    });
    let (address, state) = serve(config).await;

    let mut stream = std::net::TcpStream::connect(&address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    // A small receive buffer keeps the server from running far ahead of the reader.
    write!(stream, "GET /models/m/objects/raw HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut received = vec![0u8; 2 << 20];
    stream.read_exact(&mut received).unwrap();
    source.put("m.zt", &model(&[("raw", DType::U8, &new, false)])).await;
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    received.extend_from_slice(&rest);
    let head_end = received.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    assert!(received.starts_with(b"HTTP/1.1 200"));
    let body = &received[head_end + 4..];
    assert!(body.len() <= old.len());
    assert!(body == &old[..body.len()], "the body mixes versions");
    // Either all of the old bytes, or a cut-off body the client can tell is incomplete.
    eprintln!("received {} of {} bytes", body.len(), old.len());

    // After a rescan the new version is served.
    state.rescan().await;
    let reply = ask(&address, "/models/m/objects/raw", &[("range", "bytes=0-99")]).await;
    assert_eq!(reply.status, 206, "{}", String::from_utf8_lossy(&reply.body));
    assert_eq!(reply.body, new[..100]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_is_asked_for_checksums_only_when_ask_checksums_is_on() {
    use common::fault_proxy::FaultProxy;

    let source = ModelSource::s3();
    let ModelSource::S3 { server, .. } = &source else { unreachable!() };
    let file = one_tensor_safetensors(&noise(64 << 10, 5));
    put_with_sha256(server, "prod/checksummed.safetensors", &file).await;
    let proxy = FaultProxy::start(server.endpoint.trim_start_matches("http://")).await;
    for ask_checksums in [false, true] {
        let mut config = source.config(Config::default());
        config.s3_source.endpoint = Some(format!("http://{}", proxy.address));
        config.s3_source.ask_checksums = ask_checksums;
        let asked = proxy.checksum_requests();
        let (address, _server) = serve(config).await;
        let reply = ask(&address, "/models/checksummed/file", &[]).await;
        assert!(reply.complete && reply.body == file, "ask_checksums = {ask_checksums}: {}", reply.head);
        let sent = proxy.checksum_requests() - asked;
        assert_eq!(sent > 0, ask_checksums, "ask_checksums = {ask_checksums}: {sent} checksum requests");
    }
}

/// Uploads `bytes` to `key` of bucket `models` with their SHA-256 as the object's checksum, as
/// the AWS SDKs do (`x-amz-sdk-checksum-algorithm`, which moto needs to keep it).
async fn put_with_sha256(server: &common::S3Server, key: &str, bytes: &[u8]) {
    use base64::Engine as _;
    use object_store::signer::{HeaderName, HeaderValue, Method, SignedUrlOptions, Signer as _};
    use sha2::Digest as _;
    let digest = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(bytes));
    let headers = [("x-amz-sdk-checksum-algorithm", "SHA256".to_owned()), ("x-amz-checksum-sha256", digest)];
    let mut options = SignedUrlOptions::new();
    for (name, value) in &headers {
        options = options.with_signed_header(HeaderName::from_static(name), HeaderValue::from_str(value).unwrap());
    }
    let path = object_store::path::Path::from(key);
    let url =
        server.client("models").signed_url_opts(Method::PUT, &path, Duration::from_secs(60), &options).await.unwrap();
    let mut put = reqwest::Client::new().put(url).body(bytes.to_vec());
    for (name, value) in headers {
        put = put.header(name, value);
    }
    let answer = put.send().await.unwrap();
    assert!(answer.status().is_success(), "{answer:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_between_s3_and_the_cache_never_reach_a_client_as_wrong_bytes() {
    use common::fault_proxy::{Fault, FaultProxy};
    use sha2::Digest as _;

    let source = ModelSource::s3();
    let ModelSource::S3 { server, .. } = &source else { unreachable!() };
    // One object uploaded with its SHA-256 (the store keeps it), one covered by a SHA256SUMS
    // beside it, and one per fault with no digest anywhere.
    let checksummed = one_tensor_safetensors(&noise(1 << 20, 1));
    put_with_sha256(server, "prod/checksummed.safetensors", &checksummed).await;
    let summed = one_tensor_safetensors(&noise(1 << 20, 2));
    source.put("summed/model.safetensors", &summed).await;
    let sums = format!("{}  model.safetensors\n", hex::encode(sha2::Sha256::digest(&summed)));
    source.put("summed/SHA256SUMS", sums.as_bytes()).await;
    let faults = [
        Fault::Status(500),
        Fault::Status(503),
        Fault::StallAfter(100 << 10),
        Fault::ResetAfter(100 << 10),
        Fault::CloseAfter(100 << 10),
        Fault::DropRange,
    ];
    let plain: Vec<Vec<u8>> =
        (0..faults.len()).map(|i| one_tensor_safetensors(&noise(1 << 20, 10 + i as u64))).collect();
    for (i, file) in plain.iter().enumerate() {
        source.put(&format!("plain{i}.safetensors"), file).await;
    }
    source.put("spare.safetensors", &plain[0]).await;

    let proxy = FaultProxy::start(server.endpoint.trim_start_matches("http://")).await;
    let cache = tempfile::tempdir().unwrap();
    let configure = || {
        let mut config = source.config(Config::default());
        config.s3_source.endpoint = Some(format!("http://{}", proxy.address));
        config.s3_source.retries = 2;
        config.s3_source.read_timeout_secs = 3;
        config.cache.dir = Some(cache.path().to_owned());
        config.cache.block_bytes = 64 << 10;
        config
    };
    let (address, server) = serve(configure()).await;
    let read = |path: &'static str| ask(&address, path, &[]);

    // Damage on the wire is caught by the store's checksum and the SHA256SUMS line alike.
    let mismatches = metric("ztserve_disk_cache_checked_fills_total", &[("outcome", "mismatch")]);
    proxy.flip_body_byte(300 << 10);
    for path in ["/models/checksummed/file", "/models/summed/file"] {
        let reply = read(path).await;
        assert!(!reply.complete || reply.status == 503, "{path}: damaged bytes were sent whole: {}", reply.head);
    }
    // Each object's damage is caught and counted: a read's blocks all come from the one checked
    // fill it joined, so twice when both its attempts read the object whole; once when, on a
    // loaded machine, the second attempt ends on the 3 s read timeout first.
    let counted = metric("ztserve_disk_cache_checked_fills_total", &[("outcome", "mismatch")]) - mismatches;
    assert!((2.0..=4.0).contains(&counted), "{counted} mismatches counted for two damaged objects");
    proxy.heal();
    server.rescan().await;
    assert!(read("/models/checksummed/file").await.body == checksummed);
    assert!(read("/models/summed/file").await.body == summed);

    // Each fault once on the next ranged GET of an object with no digest: retried, or an error
    // or a body cut short; never wrong bytes whole, and exact once healed.
    for (i, fault) in faults.iter().enumerate() {
        let path: &'static str = format!("/models/plain{i}/file").leak();
        proxy.inject(fault.clone());
        let ranged = proxy.ranged_requests();
        let reply = read(path).await;
        let sent = proxy.ranged_requests() - ranged;
        if reply.complete && reply.status == 200 {
            assert!(reply.body == plain[i], "{fault:?}: a whole body with wrong bytes");
        } else {
            assert!(matches!(reply.status, 0 | 200 | 503), "{fault:?}: {}", reply.head);
        }
        // 16 blocks, each read retried at most `retries` (2) times.
        assert!(sent <= 16 + 2, "{fault:?}: {sent} ranged requests");
        proxy.heal();
        server.rescan().await;
        let again = read(path).await;
        assert!(again.complete && again.body == plain[i], "{fault:?}: after healing: {}", again.head);
    }
    // Errors past the retries: a bounded number of requests, then 503; what is cached is
    // served without asking the origin.
    for _ in 0..50 {
        proxy.inject(Fault::Status(500));
    }
    let ranged = proxy.ranged_requests();
    // A range within one block not cached yet: one fill, so a count that no fill still under
    // way can change (a whole read's next block may start a fill that goes on after the reply).
    let reply = ask(&address, "/models/spare/file", &[("Range", "bytes=70000-70010")]).await;
    assert_eq!(reply.status, 503, "{}", reply.head);
    let sent = proxy.ranged_requests() - ranged;
    assert_eq!(sent, 3, "one GET and 2 retries");
    let ranged = proxy.ranged_requests();
    let reply = ask(&address, "/models/plain0/file", &[("Range", "bytes=0-10")]).await;
    assert!(reply.status == 206 && reply.body == plain[0][..11], "cached: {}", reply.head);
    assert!(read("/models/plain1/file").await.body == plain[1], "cached");
    assert_eq!(proxy.ranged_requests(), ranged, "cached bytes went to the origin");
    proxy.heal();
    drop(server);

    // After a restart the SHA256SUMS line is handed to the cache again: a fill (the cache
    // emptied) is still checked.
    std::fs::remove_dir_all(cache.path()).unwrap();
    let (address, _server) = serve(configure()).await;
    proxy.flip_body_byte(300 << 10);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let reply = ask(&address, "/models/summed/file", &[]).await;
        assert!(!(reply.complete && reply.status == 200 && reply.body != summed), "damaged bytes were sent whole");
        if !reply.complete || reply.status == 503 {
            break;
        }
        assert!(Instant::now() < deadline, "the restarted server never checked the fill");
    }
}
