//! Bodies of mapped files leave by `writev` from the mapping, or by `sendfile` with
//! `server.sendfile` on (src/transport/zero_copy.rs; a large manifest by `sendfile` always):
//! either way large raw components, ranges,
//! multipart parts, the stored file and large manifests arrive byte-exact over one real
//! keep-alive connection, between bodies that are copied (decoded zstd, small JSON), and the
//! sendfile counter shows which way they left. A file truncated in place while its body is
//! being sent ends that response short (never complete), and the server goes on serving.

use crate::common;

use std::fs;
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

use common::{Connection, metric, model, noise, serve};
use ztserve::config::{Config, SourceSpec, VerifyPolicy};
use ztserve::format::DType;

const MIB: usize = 1 << 20;

fn sent_by_sendfile() -> f64 {
    metric("ztserve_sendfile_bytes_total", &[])
}

/// The parts of a `multipart/byteranges` body, in order.
fn parts(body: &[u8]) -> Vec<&[u8]> {
    let mut parts = Vec::new();
    let mut rest = body;
    while let Some(at) = rest.windows(15).position(|w| w == b"Content-Range: ") {
        let line_end = at + rest[at..].iter().position(|&b| b == b'\r').unwrap();
        let range = std::str::from_utf8(&rest[at + 21..line_end]).unwrap(); // after "bytes "
        let (start, end) = range.split_once('/').unwrap().0.split_once('-').unwrap();
        let len = end.parse::<usize>().unwrap() - start.parse::<usize>().unwrap() + 1;
        let data = line_end + 4;
        parts.push(&rest[data..data + len]);
        rest = &rest[data + len..];
    }
    parts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mapped_bodies_are_sent_by_writev_byte_exact_between_copied_ones() {
    mapped_bodies_are_sent_byte_exact_between_copied_ones(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mapped_bodies_are_sent_by_sendfile_byte_exact_between_copied_ones() {
    mapped_bodies_are_sent_byte_exact_between_copied_ones(true).await;
}

async fn mapped_bodies_are_sent_byte_exact_between_copied_ones(sendfile: bool) {
    let dir = tempfile::tempdir().unwrap();
    let raw = noise(12 * MIB + 5, 1);
    let packed = noise(6 * MIB, 2);
    let small = noise(1024, 3);
    let stored = model(&[
        ("raw", DType::U8, &raw, false),
        ("packed", DType::U8, &packed, true),
        ("small", DType::U8, &small, false),
    ]);
    fs::write(dir.path().join("big.zt"), &stored).unwrap();
    let names: Vec<String> = (0..2000).map(|i| format!("model.layers.{i}.mlp.up_proj.weight")).collect();
    let tiny: Vec<(&str, DType, &[u8], bool)> =
        names.iter().map(|n| (n.as_str(), DType::U8, &small[..16], false)).collect();
    fs::write(dir.path().join("many.zt"), model(&tiny)).unwrap();
    let mut config = Config::serving(vec![SourceSpec::local(dir.path())]);
    config.server.sendfile = sendfile;
    let (address, _state) = serve(config).await;

    let before = sent_by_sendfile();
    let (expected, rendered) = tokio::task::spawn_blocking(move || {
        let mut connection = Connection::open(&address);
        let mut from_files = 0;
        let full = connection.get("/models/big/objects/raw", &[]);
        assert_eq!(full.status, 200);
        assert!(full.body == raw, "the full raw body differs");
        from_files += raw.len();

        let decoded = connection.get("/models/big/objects/packed", &[]);
        assert!(decoded.body == packed, "the decoded body differs");

        let one = connection.get("/models/big/objects/raw", &[("Range", "bytes=1000-3146727")]);
        assert_eq!(one.status, 206);
        assert!(one.body == raw[1000..=3146727], "a range differs");
        from_files += one.body.len();

        let two = connection.get("/models/big/objects/raw", &[("Range", "bytes=0-99999,5000000-7097151")]);
        assert_eq!(two.status, 206);
        let got = parts(&two.body);
        assert_eq!(got.len(), 2);
        assert!(got[0] == &raw[..100_000] && got[1] == &raw[5_000_000..=7_097_151], "a multipart part differs");
        from_files += 100_000 + 2_097_152;

        let little = connection.get("/models/big/objects/small", &[]);
        assert_eq!(little.body, small);

        let file = connection.get("/models/big/file", &[]);
        assert!(file.body == stored, "the stored file differs");
        from_files += stored.len();

        let manifest = connection.get("/models/many", &[]);
        assert_eq!(manifest.json()["objects"].as_array().unwrap().len(), 2000);
        assert!(manifest.body.len() > 64 << 10, "the manifest is large enough to be kept in a file");
        let again = connection.get("/models/many", &[]);
        assert_eq!(again.body, manifest.body);
        let rendered = 2 * manifest.body.len();
        ((from_files + rendered) as f64, rendered as f64)
    })
    .await
    .unwrap();
    // Pieces under 64 KiB are copied (a partial sendfile can leave one at a slice's end), so
    // nearly, not exactly, every byte from a file is sent by sendfile.
    let sent = sent_by_sendfile() - before;
    if sendfile {
        assert!(sent >= 0.9 * expected, "{sent} of {expected} bytes from files were sent by sendfile");
    } else {
        // Off, model bytes are copied by `writev`; a rendered manifest still leaves by
        // `sendfile` (src/storage/mapped.rs, `MappedFile::temporary`).
        assert!(
            (0.9 * rendered..=rendered).contains(&sent),
            "{sent} bytes were sent by sendfile with it off, {rendered} of them manifests"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_truncated_while_its_body_is_written_ends_that_response_short_and_serving_goes_on() {
    a_file_truncated_while_its_body_is_sent_ends_that_response_short_and_serving_goes_on(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_truncated_while_its_body_is_sent_by_sendfile_ends_that_response_short_and_serving_goes_on() {
    a_file_truncated_while_its_body_is_sent_ends_that_response_short_and_serving_goes_on(true).await;
}

async fn a_file_truncated_while_its_body_is_sent_ends_that_response_short_and_serving_goes_on(sendfile: bool) {
    let raw = noise(32 * MIB, 4);
    let (dir, path) = common::victim_and_other("raw", &raw, false);
    // `never`: the digest check would read the file too (by pread, safely: tests/it/faults.rs).
    let config = Config {
        sources: ztserve::config::Sources { paths: vec![SourceSpec::local(dir.path())], ..Default::default() },
        serving: ztserve::config::Serving { verify: VerifyPolicy::Never, ..Default::default() },
        server: ztserve::config::Server { sendfile, ..Default::default() },
        ..Config::default()
    };
    let (address, _state) = serve(config).await;

    let (received, other) = tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(&address).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(stream, "GET /models/victim/objects/raw HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut received = vec![0; MIB];
        stream.read_exact(&mut received).unwrap();
        std::thread::sleep(Duration::from_millis(200)); // the server fills the socket's buffers
        fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(MIB as u64).unwrap();
        let _ = stream.read_to_end(&mut received);
        (received, common::request(&address, "/models/other/objects/small", &[]))
    })
    .await
    .unwrap();
    let head_end = received.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let body = &received[head_end..];
    assert!(body.len() < raw.len(), "the whole body arrived ({} bytes) from a truncated file", body.len());
    assert!(body.len() >= MIB - 64);
    // Up to the new end of the file the bytes are the component's. Past it they may not be:
    // pages already queued on the socket are read when they are sent, and the kernel zeroes
    // truncated ones. The response never completes, so no client can take them for the model.
    let kept = MIB - 64; // the component starts 64 bytes into the file
    assert!(body[..kept] == raw[..kept], "the bytes before the truncation differ");
    assert_eq!(other.status, 200);
    assert_eq!(other.body, raw[..4096]);
}
