//! Model files changed underneath a running server. A file truncated in place while it is
//! mapped must never raise SIGBUS (which would kill this very test process): before a
//! response, every route answers 503 for that model; during one, the response ends short.
//! Whatever happens to one model, the others keep serving byte-exact.

use crate::common;

use std::fs;
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use common::{model, noise, request, serve, victim_and_other};
use ztserve::config::{Config, SourceSpec, VerifyPolicy};
use ztserve::format::DType;

const MIB: usize = 1 << 20;

fn truncate(path: &Path, len: u64) {
    fs::OpenOptions::new().write(true).open(path).unwrap().set_len(len).unwrap();
}

fn config(dir: &Path) -> Config {
    Config {
        sources: ztserve::config::Sources {
            paths: vec![SourceSpec::local(dir)],
            rescan_interval_secs: 3600,
            ..Default::default()
        },
        ..Config::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_truncated_in_place_answers_503_on_every_route_and_the_others_keep_serving() {
    let dir = tempfile::tempdir().unwrap();
    let raw = noise(4 * MIB, 1);
    let flags: Vec<u8> = (0..4096).map(|i| (i % 3 == 0) as u8).collect();
    let victim = dir.path().join("victim.zt");
    fs::write(
        &victim,
        model(&[
            ("raw", DType::U8, &raw, false),
            ("packed", DType::U8, &raw, true),
            ("flags", DType::Bool, &flags, false),
        ]),
    )
    .unwrap();
    fs::write(dir.path().join("other.zt"), model(&[("raw", DType::U8, &raw, true)])).unwrap();
    let (address, _state) = serve(config(dir.path())).await;
    tokio::task::spawn_blocking(move || {
        // Mapped by a first response; nothing else read yet (no digest checked, nothing decoded).
        assert_eq!(request(&address, "/models/victim/file", &[("Range", "bytes=0-0")]).status, 206);
        truncate(&victim, MIB as u64);
        for path in [
            "/models/victim/objects/raw",
            "/models/victim/objects/packed",
            "/models/victim/objects/flags",
            "/models/victim/objects/raw/components/data",
            "/models/victim/file",
        ] {
            for range in [None, Some("bytes=3000000-3000099")] {
                let headers: Vec<(&str, &str)> = range.iter().map(|r| ("Range", *r)).collect();
                let reply = request(&address, path, &headers);
                assert_eq!(reply.status, 503, "{path} {range:?}: {}", String::from_utf8_lossy(&reply.body));
                assert_eq!(reply.json()["error"]["code"], "changed_on_disk", "{path}");
                assert_eq!(reply.header("retry-after"), Some("1"));
            }
        }
        let other = request(&address, "/models/other/objects/raw", &[]);
        assert_eq!(other.status, 200);
        assert!(other.body == raw, "the other model's bytes differ");
    })
    .await
    .unwrap();
}

/// Sends `path`, reads `first` bytes of the response, truncates `victim` to `keep` bytes,
/// then reads the rest: everything the connection delivered.
fn truncate_mid_response(address: &str, path: &str, first: usize, victim: &Path, keep: u64) -> Vec<u8> {
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut received = vec![0; first];
    stream.read_exact(&mut received).unwrap();
    truncate(victim, keep);
    let _ = stream.read_to_end(&mut received);
    let head_end = received.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert!(received.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&received[..head_end]));
    received.split_off(head_end)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_truncated_while_its_zstd_component_is_decoded_ends_that_response_short() {
    let raw = noise(48 * MIB, 2);
    let (dir, victim) = victim_and_other("packed", &raw, true);
    // A cache too small for the component: it is decoded for this response only, reading its
    // stored bytes as the client takes the decoded ones.
    let (address, _state) = serve(Config {
        decode: ztserve::config::Decode { cache_bytes: MIB as u64, ..Default::default() },
        ..config(dir.path())
    })
    .await;
    tokio::task::spawn_blocking(move || {
        let body = truncate_mid_response(&address, "/models/victim/objects/packed", MIB, &victim, 2 * MIB as u64);
        assert!(body.len() < raw.len(), "the whole body arrived from a truncated file");
        assert!(body[..] == raw[..body.len()], "the bytes that arrived are not the component's");
        let other = request(&address, "/models/other/objects/small", &[]);
        assert_eq!((other.status, &other.body[..]), (200, &raw[..4096]));
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_truncated_while_its_digest_is_checked_on_every_read_ends_that_response_short() {
    let raw = noise(48 * MIB, 3);
    let (dir, victim) = victim_and_other("raw", &raw, false);
    let (address, _state) = serve(Config {
        serving: ztserve::config::Serving { verify: VerifyPolicy::Always, ..Default::default() },
        ..config(dir.path())
    })
    .await;
    tokio::task::spawn_blocking(move || {
        let body = truncate_mid_response(&address, "/models/victim/objects/raw", 64 << 10, &victim, MIB as u64);
        assert!(body.len() < raw.len(), "the whole body arrived from a truncated file");
        let other = request(&address, "/models/other/objects/small", &[]);
        assert_eq!((other.status, &other.body[..]), (200, &raw[..4096]));
    })
    .await
    .unwrap();
}

/// Writes `bytes` at `at` of `path` in place, then sets its modification time back: size and
/// mtime are what they were (only the change time, which no one can set, tells).
fn rewrite_in_place(path: &Path, at: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt as _;
    let modified = fs::metadata(path).unwrap().modified().unwrap();
    let file = fs::OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(bytes, at).unwrap();
    file.set_times(fs::FileTimes::new().set_modified(modified)).unwrap();
    assert_eq!(fs::metadata(path).unwrap().modified().unwrap(), modified);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_rewritten_in_place_with_size_and_mtime_restored_is_never_served_whole_under_its_old_etag() {
    // Safetensors: no digest inside the file to catch the rewrite, only the file's identity.
    let raw = noise(48 * MIB, 4);
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim.safetensors");
    fs::write(&victim, common::safetensors_file(&[("raw", safetensors::Dtype::U8, vec![raw.len()], &raw)])).unwrap();
    let (address, server) = serve(config(dir.path())).await;
    let path = "/models/victim/objects/raw";
    let first = common::request_async(&address, path, &[]).await;
    assert!(first.complete && first.body == raw);
    let old_etag = first.header("etag").unwrap().to_owned();
    let position = fs::read(&victim).unwrap().windows(64).position(|w| w == &raw[..64]).unwrap() as u64;

    // Rewritten while a response is under way: the response ends short.
    let (sent_from, victim_path) = (address.clone(), victim.clone());
    let (body, raw) = tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(&sent_from).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut received = vec![0; 64 << 10];
        stream.read_exact(&mut received).unwrap();
        rewrite_in_place(&victim_path, position + (40 * MIB) as u64, &[0xA5; 4096]);
        let _ = stream.read_to_end(&mut received);
        let head_end = received.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        (received.split_off(head_end), raw)
    })
    .await
    .unwrap();
    assert!(body.len() < raw.len(), "a body was completed under the ETag of the bytes before the rewrite");

    // Before a response: 503, until a rescan lists the new version under a new ETag.
    let refused = common::request_async(&address, path, &[]).await;
    assert_eq!(refused.status, 503, "{}", refused.head);
    server.rescan().await;
    let mut expected = raw.clone();
    expected[40 * MIB..40 * MIB + 4096].fill(0xA5);
    let now = common::request_async(&address, path, &[]).await;
    assert!(now.complete && now.body == expected, "{}", now.head);
    assert_ne!(now.header("etag").unwrap(), old_etag);
}
