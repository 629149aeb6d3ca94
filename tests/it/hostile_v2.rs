//! Hostile zTensor v2 files in a served directory: each is listed broken with the precise code
//! of the rule it breaks (or, for a seek table or frame found wrong when read, answers 422 with
//! that code), never a panic, hang or 5xx, and the valid model beside them keeps serving. Built
//! by hand: a deterministic-CBOR manifest in a v2 container (`format::v2::file_around`), and
//! seekable streams of real zstd frames with hand-made seek tables.

use crate::common;

use std::collections::BTreeMap;

use common::{deterministic_cbor, map, request_async, serve, text, uint};
use ztserve::api;
use ztserve::config::Config;
use ztserve::format::Value;
use ztserve::format::seekable::encode_table;
use ztserve::format::v2::file_around;

/// A dense part: `dtype`, blob `[offset, length]`, and extra fields.
fn part(dtype: &str, offset: u64, length: u64, extra: Vec<(&str, Value)>) -> Value {
    let mut fields = vec![("dtype", text(dtype)), ("blob", Value::Array(vec![uint(offset), uint(length)]))];
    fields.extend(extra);
    map(fields)
}

fn object(shape: &[u64], parts: Vec<(&str, Value)>) -> Value {
    map(vec![
        ("shape", Value::Array(shape.iter().map(|&d| uint(d)).collect())),
        ("layout", text("dense")),
        ("parts", map(parts)),
    ])
}

/// A v2 file of `objects` (name → object) over `heap`, which starts at offset 4096.
fn v2(heap: &[u8], objects: Vec<(&str, Value)>, extra: Vec<(&str, Value)>) -> Vec<u8> {
    let mut root = vec![("objects", map(objects))];
    root.extend(extra);
    file_around(heap, &deterministic_cbor(&map(root)))
}

/// A valid single-tensor file: 16 u8 at 4096.
fn valid() -> Vec<u8> {
    v2(&[7u8; 16], vec![("w", object(&[16], vec![("data", part("u8", 4096, 16, vec![]))]))], vec![])
}

/// A seekable stream of `frames` (bytes to compress, and the decoded size its table entry
/// declares), with each compressed size as declared unless `stored` overrides it.
fn seekable(frames: &[(&[u8], u32)], stored: Option<&[u32]>) -> Vec<u8> {
    seekable_with_checksums(frames, stored, true)
}

/// [`seekable`], with the frames' content checksums on or off (the profile requires them).
fn seekable_with_checksums(frames: &[(&[u8], u32)], stored: Option<&[u32]>, checksums: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut entries = Vec::new();
    for (i, (bytes, declared)) in frames.iter().enumerate() {
        let mut encoder = zstd::stream::Encoder::new(Vec::new(), 3).unwrap();
        encoder.include_checksum(checksums).unwrap();
        std::io::Write::write_all(&mut encoder, bytes).unwrap();
        let frame = encoder.finish().unwrap();
        let compressed = stored.map_or(frame.len() as u32, |s| s[i]);
        entries.push((compressed, *declared));
        out.extend_from_slice(&frame);
    }
    out.extend(encode_table(&entries));
    out
}

/// A file whose one part `z` is `stream`, declared to decode to `decoded` bytes of u8.
fn with_stream(stream: &[u8], decoded: u64) -> Vec<u8> {
    let encoded = vec![("encoding", text("zt.zstd-seekable/1")), ("decoded_length", uint(decoded))];
    v2(stream, vec![("z", object(&[decoded], vec![("data", part("u8", 4096, stream.len() as u64, encoded))]))], vec![])
}

fn patched(mut file: Vec<u8>, from_end: usize, bytes: &[u8]) -> Vec<u8> {
    let at = file.len() - from_end;
    file[at..at + bytes.len()].copy_from_slice(bytes);
    file
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_v2_files_get_their_precise_reason_and_never_stop_the_others() {
    let a = vec![1u8; 100];
    let short = vec![2u8; 90];
    let long_name = "n".repeat(1025);
    let broken_at_scan: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated", valid()[..4200].to_vec(), "bad_footer_magic"),
        ("tiny", valid()[..40].to_vec(), "truncated"),
        ("footer-magic", patched(valid(), 1, &[0]), "bad_footer_magic"),
        ("footer-version", patched(valid(), 16, &3u32.to_le_bytes()), "unsupported_container_version"),
        ("hash", patched(valid(), 24, &[0x55]), "manifest_hash_mismatch"),
        ("manifest-outside", patched(valid(), 40, &(1u64 << 40).to_le_bytes()), "manifest_out_of_bounds"),
        ("manifest-misaligned", patched(valid(), 40, &4100u64.to_le_bytes()), "manifest_misaligned"),
        ("manifest-beyond", patched(valid(), 40, &(1u64 << 24).to_le_bytes()), "manifest_out_of_bounds"),
        (
            "misaligned",
            v2(&[0; 8192], vec![("w", object(&[4], vec![("data", part("u8", 4100, 4, vec![]))]))], vec![]),
            "misaligned",
        ),
        (
            "overlap",
            v2(
                &[0; 8192],
                vec![
                    ("a", object(&[8192], vec![("data", part("u8", 4096, 8192, vec![]))])),
                    ("b", object(&[8], vec![("data", part("u8", 8192, 8, vec![]))])),
                ],
                vec![],
            ),
            "overlap",
        ),
        (
            "over-footer",
            v2(&[0; 16], vec![("w", object(&[1 << 20], vec![("data", part("u8", 4096, 1 << 20, vec![]))]))], vec![]),
            "range_into_footer",
        ),
        (
            "name-nul",
            v2(&[0; 4], vec![("a\0b", object(&[4], vec![("data", part("u8", 4096, 4, vec![]))]))], vec![]),
            "bad_name",
        ),
        (
            "name-long",
            v2(&[0; 4], vec![(long_name.as_str(), object(&[4], vec![("data", part("u8", 4096, 4, vec![]))]))], vec![]),
            "bad_name",
        ),
        (
            "rank",
            v2(&[0; 4], vec![("w", object(&[1; 65], vec![("data", part("u8", 4096, 1, vec![]))]))], vec![]),
            "rank_too_large",
        ),
        (
            "missing-shard",
            v2(
                &[],
                vec![("w", object(&[4], vec![("data", part("u8", 4096, 4, vec![("shard", text("00001"))]))]))],
                vec![(
                    "shards",
                    map(vec![("00001", map(vec![("size", uint(8192)), ("digest", text("xxh3:0000000000000001"))]))]),
                )],
            ),
            "shard_missing",
        ),
    ];
    let broken_when_read: Vec<(&str, Vec<u8>, &str)> = vec![
        ("seek-total", with_stream(&seekable(&[(&a, 100), (&a, 100)], None), 150), "seek_table_total"),
        ("seek-frame-size", with_stream(&seekable(&[(&a, (16 << 20) + 1)], None), (16 << 20) + 1), "seek_frame_size"),
        ("seek-coverage", with_stream(&seekable(&[(&a, 100), (&a, 100)], Some(&[5, 5])), 200), "seek_table_coverage"),
        (
            "seek-unequal",
            with_stream(&seekable(&[(&a, 100), (&short, 90), (&a, 100)], None), 290),
            "seek_frames_unequal",
        ),
        ("seek-short", with_stream(&seekable(&[(&short, 100), (&a, 100)], None), 200), "zstd_too_short"),
        (
            "seek-no-checksum",
            with_stream(&seekable_with_checksums(&[(&a, 100), (&a, 100)], None, false), 200),
            "seek_frame_no_checksum",
        ),
    ];
    // A frame found short only after earlier frames were sent: a range of it alone is refused
    // cleanly; a whole body ends short of its length, which no client takes as complete.
    let short_later = with_stream(&seekable(&[(&a, 100), (&short, 100)], None), 200);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("good.zt"), valid()).unwrap();
    std::fs::write(dir.path().join("data-shard.zt"), file_around(&[1, 2, 3], &[])).unwrap();
    for (name, bytes, _) in broken_at_scan.iter().chain(&broken_when_read) {
        std::fs::write(dir.path().join(format!("{name}.zt")), bytes).unwrap();
    }
    std::fs::write(dir.path().join("seek-short-later.zt"), short_later).unwrap();
    let config = Config::serving(vec![dir.path().display().to_string().try_into().unwrap()]);
    let (address, _state) = serve(config).await;

    let listing = request_async(&address, "/models", &[]).await.json();
    let models: BTreeMap<&str, &serde_json::Value> =
        listing["models"].as_array().unwrap().iter().map(|m| (m["id"].as_str().unwrap(), m)).collect();
    assert!(!models.contains_key("data-shard"), "a data shard is not a model");
    assert_eq!(models["good"]["status"], "ok");
    assert_eq!(request_async(&address, &api::component_url("good", "w", "data"), &[]).await.body, [7u8; 16]);
    for (name, _, code) in &broken_at_scan {
        assert_eq!(models[name]["status"], "broken", "{name}");
        assert_eq!(models[name]["reason"]["code"], *code, "{name}: {}", models[name]["reason"]["message"]);
        let reply = request_async(&address, &api::model_url(name), &[]).await;
        assert_eq!((reply.status, reply.json()["error"]["reason"].as_str()), (422, Some(*code)), "{name}");
    }
    for (name, _, code) in &broken_when_read {
        assert_eq!(models[name]["status"], "ok", "{name}: its manifest is fine");
        let reply = request_async(&address, &api::component_url(name, "z", "data"), &[]).await;
        assert_eq!(reply.status, 422, "{name}: {}", String::from_utf8_lossy(&reply.body));
        assert_eq!(reply.json()["error"]["reason"], *code, "{name}: {}", reply.json()["error"]["message"]);
    }
    let url = api::component_url("seek-short-later", "z", "data");
    let reply = request_async(&address, &url, &[("range", "bytes=150-199")]).await;
    assert_eq!((reply.status, reply.json()["error"]["reason"].as_str()), (422, Some("zstd_too_short")));
    let received = tokio::task::spawn_blocking(move || {
        use std::io::{Read as _, Write as _};
        let mut stream = std::net::TcpStream::connect(&address).unwrap();
        write!(stream, "GET {url} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut received = Vec::new();
        let _ = stream.read_to_end(&mut received);
        received
    })
    .await
    .unwrap();
    let head_end = received.windows(4).position(|w| w == b"\r\n\r\n").map_or(received.len(), |at| at + 4);
    assert!(received.len() - head_end < 200, "a body with a short frame is never sent whole");
}
