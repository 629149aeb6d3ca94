//! Lazy zstd decoding, the decode cache, zstd pass-through, digest checks and metrics, against
//! the real binary. Each test runs its own server process, so the metrics it reads are its own.

use crate::common;

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{RunningServer, request};
use sha2::Digest as _;
use ztserve::format::DType;
use ztserve::format::write::{ComponentInput, DigestAlgorithm, ObjectInput, WriteOptions, Writer};

/// The sum of every series of metric `name` (all label sets) in a `/metrics` scrape.
fn metric(server: &RunningServer, name: &str) -> f64 {
    let reply = request(&server.address, "/metrics", &[]);
    assert_eq!(reply.status, 200);
    let text = String::from_utf8(reply.body).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{')))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// Pseudo-random bytes that compress to about half: slow enough to decode that timing shows.
fn payload(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&(x & 0x0F0F_0F0F_0F0F_0F0F).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Writes `name.zt` in `dir` with one dense u8 object per entry.
fn write_model(dir: &Path, name: &str, objects: &[(&str, &[u8], WriteOptions)]) -> Vec<u8> {
    let mut w = Writer::new(Vec::new()).unwrap();
    for (object, bytes, options) in objects {
        let shape = [bytes.len() as u64];
        let input = ObjectInput {
            name: object,
            shape: &shape,
            format: "dense",
            attributes: None,
            components: vec![ComponentInput { role: "data", dtype: DType::U8, logical_type: None, bytes }],
        };
        w.add(&input, options).unwrap();
    }
    let file = w.finish(None).unwrap();
    std::fs::write(dir.join(format!("{name}.zt")), &file).unwrap();
    file
}

fn zstd(digest: Option<DigestAlgorithm>) -> WriteOptions {
    WriteOptions { zstd_level: Some(3), digest }
}

fn raw(digest: Option<DigestAlgorithm>) -> WriteOptions {
    WriteOptions { zstd_level: None, digest }
}

fn serve(dir: &Path, envs: &[(&str, &str)]) -> RunningServer {
    let source = dir.display().to_string();
    // Decodes are counted here: none may come from digests hashed in the background.
    let envs: Vec<(&str, &str)> =
        [("ZTSERVE_DIGESTS__AHEAD", "none")].into_iter().chain(envs.iter().copied()).collect();
    common::start_binary(&["serve", "--listen", "127.0.0.1:0", "--source", &source], &envs)
}

/// The stored bytes of `object`'s data component, located through the manifest JSON.
fn stored_frame(server: &RunningServer, file: &[u8], model: &str, object: &str) -> Vec<u8> {
    let reply = request(&server.address, &format!("/models/{model}"), &[]);
    let manifest: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
    let entry = manifest["objects"].as_array().unwrap().iter().find(|o| o["name"] == object).unwrap();
    let component = &entry["components"][0];
    let offset = component["offset"].as_u64().unwrap() as usize;
    let len = component["stored_length"].as_u64().unwrap() as usize;
    file[offset..offset + len].to_vec()
}

#[test]
fn the_first_bytes_of_a_64_mib_zstd_component_arrive_long_before_its_whole_decode() {
    let dir = tempfile::tempdir().unwrap();
    let bodies: Vec<Vec<u8>> = (0..3).map(|i| payload(64 << 20, i + 1)).collect();
    let names = ["a", "b", "c"];
    let objects: Vec<(&str, &[u8], WriteOptions)> =
        names.iter().zip(&bodies).map(|(n, b)| (*n, b.as_slice(), zstd(None))).collect();
    write_model(dir.path(), "big", &objects);
    let server = serve(dir.path(), &[]);
    // Each object is cold once: the ratio of time to first byte over the time to decode and
    // send all 64 MiB, on the same request, median of three.
    let mut ratios: Vec<f64> = names
        .iter()
        .zip(&bodies)
        .map(|(name, body)| {
            let reply = request(&server.address, &format!("/models/big/objects/{name}"), &[]);
            assert_eq!(reply.status, 200);
            assert!(reply.complete && reply.body == *body, "the streamed bytes are the object's bytes");
            reply.first_byte.as_secs_f64() / reply.total.as_secs_f64()
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    eprintln!("time to first byte / time to last byte, three cold 64 MiB components: {ratios:?}");
    assert!(
        ratios[1] < 0.25,
        "time to first byte is {:.0}% of the whole decode (ratios {ratios:?})",
        ratios[1] * 100.0
    );
    assert_eq!(metric(&server, "ztserve_decodes_started_total"), 3.0);
}

#[test]
fn sixty_four_concurrent_range_requests_to_a_cold_component_share_one_decode() {
    let dir = tempfile::tempdir().unwrap();
    let body = payload(8 << 20, 7);
    write_model(dir.path(), "m", &[("w", &body, zstd(Some(DigestAlgorithm::Crc32c)))]);
    let server = serve(dir.path(), &[]);
    assert_eq!(metric(&server, "ztserve_decodes_started_total"), 0.0);
    let threads: Vec<_> = (0..64u64)
        .map(|i| {
            let address = server.address.clone();
            let expected = body.clone();
            std::thread::spawn(move || {
                let start = (i * 130_003) % (8 << 20);
                let end = (start + 65_535).min((8 << 20) - 1);
                let reply = request(&address, "/models/m/objects/w", &[("Range", &format!("bytes={start}-{end}"))]);
                assert_eq!(reply.status, 206);
                assert!(reply.complete);
                assert_eq!(reply.body, expected[start as usize..=end as usize]);
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(metric(&server, "ztserve_decodes_started_total"), 1.0);
    assert_eq!(
        metric(&server, "ztserve_decode_cache_hits_total") + metric(&server, "ztserve_decode_cache_misses_total"),
        64.0
    );
    // The whole component, then ranges anywhere: no further decoding.
    let decoded = metric(&server, "ztserve_decoded_bytes_total");
    assert_eq!(request(&server.address, "/models/m/objects/w", &[]).body, body);
    let hits = metric(&server, "ztserve_decode_cache_hits_total");
    for start in [0u64, 4 << 20, (8 << 20) - 10] {
        let reply = request(&server.address, "/models/m/objects/w", &[("Range", &format!("bytes={start}-"))]);
        assert_eq!(reply.body, body[start as usize..]);
    }
    assert_eq!(metric(&server, "ztserve_decodes_started_total"), 1.0);
    assert_eq!(metric(&server, "ztserve_decode_cache_hits_total"), hits + 3.0);
    assert_eq!(metric(&server, "ztserve_decoded_bytes_total"), (8 << 20) as f64);
    assert!(decoded <= (8 << 20) as f64);
    assert_eq!(metric(&server, "ztserve_decode_cache_bytes"), (8 << 20) as f64);
}

#[test]
fn a_range_of_a_cold_component_decodes_only_up_to_the_range_end() {
    let dir = tempfile::tempdir().unwrap();
    let body = payload(32 << 20, 3);
    write_model(dir.path(), "m", &[("w", &body, zstd(None))]);
    let server = serve(dir.path(), &[]);
    let reply = request(&server.address, "/models/m/objects/w", &[("Range", "bytes=1000-1999")]);
    assert_eq!(reply.status, 206);
    assert_eq!(reply.body, body[1000..2000]);
    let decoded = metric(&server, "ztserve_decoded_bytes_total");
    assert!(decoded > 0.0 && decoded <= (1 << 20) as f64, "{decoded} bytes decoded for a 1000-byte range");
    // A later range further on continues the same decode rather than starting again.
    let reply = request(&server.address, "/models/m/objects/w", &[("Range", "bytes=20000000-20000099")]);
    assert_eq!(reply.body, body[20_000_000..20_000_100]);
    assert_eq!(metric(&server, "ztserve_decodes_started_total"), 1.0);
    assert!(metric(&server, "ztserve_decoded_bytes_total") < (21 << 20) as f64);
}

/// A v2 file with one u8 object "w" stored as zt.zstd-seekable/1 by the official writer
/// (1 MiB frames).
fn write_seekable(dir: &Path, name: &str, body: &[u8]) {
    let mut w = ztensor::Writer::options().canonical(false).create(dir.join(format!("{name}.zt"))).unwrap();
    w.object("w", |o| {
        o.shape([body.len() as u64])
            .part("data", |p| p.dtype(ztensor::DType::U8).encoding(ztserve::format::v2::ZSTD_SEEKABLE).bytes(body))
    })
    .unwrap();
    w.finish().unwrap();
}

#[test]
fn a_range_of_a_seekable_part_decodes_only_the_frames_it_covers_once_for_every_reader() {
    let dir = tempfile::tempdir().unwrap();
    let body = payload(40 << 20, 5);
    write_seekable(dir.path(), "m", &body);
    let server = serve(dir.path(), &[]);
    let path = "/models/m/objects/w";
    // Deep in the part: one frame (the 31st), not the 30 before it.
    let reply = request(&server.address, path, &[("Range", "bytes=31000000-31000099")]);
    assert_eq!(reply.status, 206);
    assert_eq!(reply.body, body[31_000_000..31_000_100]);
    assert_eq!(metric(&server, "ztserve_decodes_started_total"), 1.0);
    assert_eq!(metric(&server, "ztserve_decoded_bytes_total"), (1 << 20) as f64);
    let read = metric(&server, "ztserve_storage_read_bytes_total");
    assert!(read > 0.0 && read < (2 << 20) as f64, "{read} stored bytes read for one frame of a 20 MiB stream");
    // Across a frame boundary: the frame already decoded is shared, one more is decoded.
    let boundary = 30 << 20;
    let range = format!("bytes={}-{}", boundary - 10, boundary + 9);
    let reply = request(&server.address, path, &[("Range", &range)]);
    assert_eq!(reply.body, body[boundary - 10..boundary + 10]);
    assert_eq!(metric(&server, "ztserve_decodes_started_total"), 2.0);
    // Readers at once of the same frames (tensor-parallel ranks) share each frame's decode.
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let address = server.address.clone();
            std::thread::spawn(move || request(&address, path, &[("Range", "bytes=4194304-8388607")]))
        })
        .collect();
    for reader in readers {
        assert!(reader.join().unwrap().body == body[4 << 20..8 << 20]);
    }
    assert_eq!(metric(&server, "ztserve_decodes_started_total"), 6.0, "frames 4 to 7, once each");
    // The whole part: each remaining frame once, in order on the wire.
    let whole = request(&server.address, path, &[]);
    assert!(whole.complete && whole.body == body);
    assert_eq!(metric(&server, "ztserve_decodes_started_total"), 40.0);
    assert_eq!(metric(&server, "ztserve_decoded_bytes_total"), (40 << 20) as f64);
}

#[test]
fn a_cache_smaller_than_one_component_still_serves_correct_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let body = payload(4 << 20, 11);
    write_model(dir.path(), "m", &[("w", &body, zstd(Some(DigestAlgorithm::Sha256)))]);
    let server =
        serve(dir.path(), &[("ZTSERVE_DECODE__CACHE_BYTES", "1048576"), ("ZTSERVE_DECODE__MAX_CONCURRENT", "1")]);
    let path = "/models/m/objects/w";
    let whole = request(&server.address, path, &[]);
    assert!(whole.complete && whole.body == body);
    let tail = request(&server.address, path, &[("Range", "bytes=-300000")]);
    assert_eq!(tail.body, body[body.len() - 300_000..]);
    let middle = request(&server.address, path, &[("Range", "bytes=1000000-1000009")]);
    assert_eq!(middle.body, body[1_000_000..1_000_010]);
    let multi = request(&server.address, path, &[("Range", "bytes=0-1,3000000-3000001")]);
    assert_eq!(multi.status, 206);
    let text = String::from_utf8_lossy(&multi.body);
    assert!(
        text.contains("Content-Range: bytes 0-1/4194304")
            && text.contains("Content-Range: bytes 3000000-3000001/4194304")
    );
    // Nothing is held; every read decodes privately.
    assert_eq!(metric(&server, "ztserve_decode_cache_bytes"), 0.0);
    assert_eq!(metric(&server, "ztserve_decodes_started_total"), 5.0);
    assert_eq!(metric(&server, "ztserve_decode_cache_hits_total"), 0.0);
}

#[test]
fn the_least_recently_used_component_is_evicted_to_make_room() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c) = (payload(3 << 20, 1), payload(3 << 20, 2), payload(3 << 20, 3));
    write_model(dir.path(), "m", &[("a", &a, zstd(None)), ("b", &b, zstd(None)), ("c", &c, zstd(None))]);
    let server = serve(dir.path(), &[("ZTSERVE_DECODE__CACHE_BYTES", &(7u64 << 20).to_string())]);
    for (name, body) in [("a", &a), ("b", &b), ("a", &a), ("c", &c), ("a", &a)] {
        assert_eq!(request(&server.address, &format!("/models/m/objects/{name}"), &[]).body, *body);
    }
    // a, b cached; a used again; c evicts b (the least recently used); a is still a hit.
    assert_eq!(metric(&server, "ztserve_decodes_started_total"), 3.0);
    assert_eq!(metric(&server, "ztserve_decode_cache_evictions_total"), 1.0);
    assert_eq!(metric(&server, "ztserve_decode_cache_hits_total"), 2.0);
    assert_eq!(metric(&server, "ztserve_decode_cache_bytes"), (6u64 << 20) as f64);
}

#[test]
fn accept_encoding_zstd_returns_the_exact_stored_frame_without_decoding() {
    let dir = tempfile::tempdir().unwrap();
    let body = payload(1 << 20, 5);
    let file = write_model(
        dir.path(),
        "m",
        &[("w", &body, zstd(Some(DigestAlgorithm::Sha256))), ("r", &body[..100], raw(None))],
    );
    let server = serve(dir.path(), &[]);
    let frame = stored_frame(&server, &file, "m", "w");
    let path = "/models/m/objects/w";
    let encoded = request(&server.address, path, &[("Accept-Encoding", "gzip, zstd")]);
    assert_eq!(encoded.status, 200);
    assert_eq!(encoded.header("content-encoding"), Some("zstd"));
    assert_eq!(encoded.header("vary"), Some("accept-encoding"));
    assert!(encoded.complete);
    assert_eq!(encoded.body, frame);
    assert_eq!(zstd::decode_all(&encoded.body[..]).unwrap(), body);
    let expected_digest = {
        use base64::Engine as _;
        format!("sha-256=:{}:", base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(&frame)))
    };
    assert_eq!(encoded.header("repr-digest"), Some(expected_digest.as_str()));
    assert_eq!(metric(&server, "ztserve_decodes_started_total"), 0.0);

    // Identity: a different ETag, the same Vary; refused zstd, or a Range, get decoded bytes.
    let identity = request(&server.address, path, &[]);
    assert_eq!(identity.header("content-encoding"), None);
    assert_eq!(identity.header("vary"), Some("accept-encoding"));
    assert_ne!(identity.header("etag"), encoded.header("etag"));
    assert_eq!(identity.body, body);
    assert_eq!(request(&server.address, path, &[("Accept-Encoding", "zstd;q=0")]).body, body);
    let ranged = request(&server.address, path, &[("Accept-Encoding", "zstd"), ("Range", "bytes=0-9")]);
    assert_eq!((ranged.status, ranged.header("content-encoding")), (206, None));
    assert_eq!(ranged.body, body[..10]);
    // A conditional request on the encoded representation's ETag.
    let etag = encoded.header("etag").unwrap().to_owned();
    let unchanged = request(&server.address, path, &[("Accept-Encoding", "zstd"), ("If-None-Match", &etag)]);
    assert_eq!(unchanged.status, 304);
    // Raw components have nothing to pass through.
    let raw = request(&server.address, "/models/m/objects/r", &[("Accept-Encoding", "zstd")]);
    assert_eq!((raw.header("content-encoding"), raw.header("vary")), (None, None));
    assert_eq!(raw.body, body[..100]);
}

#[test]
fn repr_digest_is_sent_once_the_decoded_sha256_is_known() {
    let dir = tempfile::tempdir().unwrap();
    let body = payload(2 << 20, 9);
    write_model(
        dir.path(),
        "m",
        &[
            ("z", &body, zstd(None)),
            ("r", &body, raw(Some(DigestAlgorithm::Sha256))),
            ("c", &body, raw(Some(DigestAlgorithm::Crc32c))),
        ],
    );
    let server = serve(dir.path(), &[]);
    let expected = {
        use base64::Engine as _;
        format!("sha-256=:{}:", base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(&body)))
    };
    // Declared on a raw component: known at once.
    assert_eq!(request(&server.address, "/models/m/objects/r", &[]).header("repr-digest"), Some(expected.as_str()));
    assert_eq!(request(&server.address, "/models/m/objects/c", &[]).header("repr-digest"), None);
    // Computed by the first complete decode, then sent with every response, ranges included.
    assert_eq!(request(&server.address, "/models/m/objects/z", &[]).header("repr-digest"), None);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reply = request(&server.address, "/models/m/objects/z", &[("Range", "bytes=0-0")]);
        if reply.header("repr-digest") == Some(expected.as_str()) {
            break;
        }
        assert!(Instant::now() < deadline, "the decoded digest never appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A copy of `file` with the byte in the middle of `object`'s stored bytes flipped.
fn corrupt(server: &RunningServer, file: &[u8], model: &str, object: &str) -> Vec<u8> {
    let frame = stored_frame(server, file, model, object);
    let at = file.windows(frame.len()).position(|w| w == frame).unwrap() + frame.len() / 2;
    let mut copy = file.to_vec();
    copy[at] ^= 0x40;
    copy
}

#[test]
fn a_corrupted_component_is_never_served_complete_and_the_failure_shows_in_metrics() {
    let good = tempfile::tempdir().unwrap();
    let body = payload(6 << 20, 13);
    let objects: [(&str, &[u8], WriteOptions); 3] = [
        ("raw", &body, raw(Some(DigestAlgorithm::Sha256))),
        ("zstd", &body, zstd(Some(DigestAlgorithm::Crc32c))),
        ("fine", &body[..4096], raw(Some(DigestAlgorithm::Crc32c))),
    ];
    let file = write_model(good.path(), "m", &objects);
    let locate = serve(good.path(), &[]);
    let mut bad = corrupt(&locate, &file, "m", "raw");
    let zstd_flipped = corrupt(&locate, &file, "m", "zstd");
    let zstd_at = file.iter().zip(&zstd_flipped).position(|(a, b)| a != b).unwrap();
    bad[zstd_at] = zstd_flipped[zstd_at];
    drop(locate);

    for verify in ["first-read", "always"] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("m.zt"), &bad).unwrap();
        let server = serve(dir.path(), &[("ZTSERVE_SERVING__VERIFY", verify)]);
        for object in ["raw", "zstd"] {
            let path = format!("/models/m/objects/{object}");
            // A whole body streams while its digest is checked: it never ends cleanly.
            let whole = request(&server.address, &path, &[]);
            assert!(whole.status != 200 || !whole.complete, "{verify}: {object} was served complete");
            assert!(whole.body.len() < body.len(), "{verify}: {object} delivered every byte");
            // A range waits for the check (or its remembered outcome): a clean 422.
            let range = request(&server.address, &path, &[("Range", "bytes=0-99")]);
            assert_eq!(range.status, 422, "{verify}: {object}");
            let error: serde_json::Value = serde_json::from_slice(&range.body).unwrap();
            assert_eq!(error["error"]["reason"], "digest_mismatch");
        }
        // Under first-read the verdict is remembered: the whole body is refused up front.
        if verify == "first-read" {
            let again = request(&server.address, "/models/m/objects/raw", &[]);
            assert_eq!(again.status, 422);
        }
        assert_eq!(request(&server.address, "/models/m/objects/fine", &[]).body, body[..4096]);
        assert!(metric(&server, "ztserve_digest_failures_total") >= 2.0);
        assert!(metric(&server, "ztserve_digest_checks_total") >= 3.0);
    }

    // Without checks, a flipped byte in a frame with a checksum still stops the decode.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("m.zt"), &bad).unwrap();
    let server = serve(dir.path(), &[("ZTSERVE_SERVING__VERIFY", "never")]);
    let whole = request(&server.address, "/models/m/objects/zstd", &[]);
    assert!(whole.status != 200 || !whole.complete);
    assert!(metric(&server, "ztserve_decode_failures_total") >= 1.0);
    assert_eq!(metric(&server, "ztserve_digest_checks_total"), 0.0);
}

#[test]
fn the_metrics_endpoint_parses_as_prometheus_text_and_counts_what_happened() {
    let dir = tempfile::tempdir().unwrap();
    let body = payload(1 << 20, 21);
    write_model(dir.path(), "m", &[("w", &body, zstd(Some(DigestAlgorithm::Crc32c)))]);
    std::fs::write(dir.path().join("broken.zt"), b"ZTEN1000 nothing").unwrap();
    let server = serve(dir.path(), &[]);
    assert_eq!(request(&server.address, "/models/m/objects/w", &[]).body, body);
    assert_eq!(request(&server.address, "/models/m/objects/nope", &[]).status, 404);
    let scrape = request(&server.address, "/metrics", &[]);
    assert!(scrape.header("content-type").unwrap().starts_with("text/plain; version=0.0.4"));
    let text = String::from_utf8(scrape.body).unwrap();
    // The reference parser, from the Prometheus project's Python client.
    let parser = "import sys, json\nfrom prometheus_client.parser import text_string_to_metric_families as parse\n\
                  print(json.dumps([[s.name, s.labels, s.value] for f in parse(sys.stdin.read()) for s in f.samples]))";
    let mut child = std::process::Command::new(common::venv_root().join("tools/bin/python"))
        .args(["-c", parser])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "the Prometheus parser refused the scrape:\n{text}");
    let samples: Vec<(String, serde_json::Value, f64)> = serde_json::from_slice(&output.stdout).unwrap();
    let value = |name: &str, labels: &[(&str, &str)]| -> f64 {
        samples.iter().filter(|(n, l, _)| n == name && labels.iter().all(|(k, v)| l[*k] == *v)).map(|(_, _, v)| v).sum()
    };
    let object_route = "/models/{model}/objects/{object}";
    assert_eq!(value("ztserve_http_requests_total", &[("route", object_route), ("status", "200")]), 1.0);
    assert_eq!(value("ztserve_http_requests_total", &[("route", object_route), ("status", "404")]), 1.0);
    assert!(value("ztserve_http_response_body_bytes_total", &[("route", object_route)]) >= body.len() as f64);
    assert_eq!(value("ztserve_http_request_duration_seconds_count", &[("route", object_route)]), 2.0);
    assert_eq!(value("ztserve_decodes_started_total", &[("encoding", "zstd")]), 1.0);
    assert_eq!(value("ztserve_decoded_bytes_total", &[]), body.len() as f64);
    assert_eq!(value("ztserve_decode_cache_misses_total", &[]), 1.0);
    assert_eq!(value("ztserve_digest_checks_total", &[("outcome", "ok")]), 1.0);
    assert_eq!(value("ztserve_models", &[("status", "ok")]), 1.0);
    assert_eq!(value("ztserve_models", &[("status", "broken")]), 1.0);
    assert!(value("ztserve_storage_read_duration_seconds_count", &[("kind", "manifest")]) >= 2.0);
    assert!(value("ztserve_storage_read_bytes_total", &[("purpose", "decode")]) > 0.0);
}

#[test]
fn every_metric_the_manual_lists_is_exported_from_the_first_scrape() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md")).unwrap();
    // The Metrics table's rows: | `name` (or `name`, `_suffix`) | labels | meaning |. A metric
    // whose labels come from the configuration (one series per listed identity) has no series
    // on a server configured without them: it must be one the server defines.
    let mut listed = Vec::new();
    let mut described_only = Vec::new();
    for row in readme.lines().filter(|l| l.starts_with("| `ztserve_")) {
        let names = row.split('|').nth(1).unwrap();
        if row.split('|').nth(2).unwrap().contains("from the configuration") {
            described_only.push(names.trim().trim_matches('`').to_owned());
            continue;
        }
        let mut base = String::new();
        for name in names.split(',').map(|n| n.trim().trim_matches('`')) {
            // A suffix such as `_misses_total` replaces as many trailing words of the name before.
            let name = match name.strip_prefix('_') {
                Some(suffix) => {
                    let words: Vec<&str> = base.split('_').collect();
                    format!("{}_{suffix}", words[..words.len() - suffix.split('_').count()].join("_"))
                }
                None => name.to_owned(),
            };
            base = name.clone();
            listed.push(name);
        }
    }
    assert!(listed.len() >= 20, "docs/operations.md's metric table was not found: {listed:?}");
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path(), "m", &[("w", &payload(1024, 1), zstd(None))]);
    let server = serve(dir.path(), &[]);
    let scrape = String::from_utf8(request(&server.address, "/metrics", &[]).body).unwrap();
    let exported = |name: &str| {
        scrape.lines().filter(|l| !l.starts_with('#')).any(|l| {
            let series = l.split(['{', ' ']).next().unwrap();
            series == name || series.strip_prefix(name).is_some_and(|s| ["_bucket", "_count", "_sum"].contains(&s))
        })
    };
    let mut missing: Vec<&String> = listed.iter().filter(|n| !exported(n)).collect();
    let defined = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/telemetry.rs")).unwrap();
    missing.extend(described_only.iter().filter(|n| !defined.contains(&format!("\"{n}\""))));
    assert!(missing.is_empty(), "not exported before any request needed them: {missing:?}\n{scrape}");
}

#[test]
fn head_and_not_modified_answers_never_start_a_decode() {
    let dir = tempfile::tempdir().unwrap();
    let body = payload(1 << 20, 17);
    write_model(dir.path(), "m", &[("w", &body, zstd(None))]);
    let server = serve(dir.path(), &[]);
    let path = "/models/m/objects/w";
    let head = common::head_request(&server.address, path);
    assert!(
        head.starts_with("HTTP/1.1 200") && head.to_ascii_lowercase().contains("content-length: 1048576"),
        "{head}"
    );
    let tag = head.lines().find_map(|l| l.strip_prefix("etag: ")).unwrap().trim().to_owned();
    assert_eq!(request(&server.address, path, &[("If-None-Match", &tag)]).status, 304);
    assert_eq!(request(&server.address, "/models/m", &[]).status, 200);
    assert_eq!(metric(&server, "ztserve_decodes_started_total"), 0.0);
    assert_eq!(
        metric(&server, "ztserve_decode_cache_hits_total") + metric(&server, "ztserve_decode_cache_misses_total"),
        0.0
    );
    assert_eq!(request(&server.address, path, &[("Range", "bytes=0-0")]).body, body[..1]);
    assert_eq!(metric(&server, "ztserve_decodes_started_total"), 1.0);
}
