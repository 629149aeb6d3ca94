//! Every limit in the config, enforced over real sockets while other clients keep being
//! served: request head size, clients that trickle headers or never read, idle keep-alive
//! connections, the connection limit, waiting for a decoder, the request timeout, ranges
//! per request (and overlapping ones), decoded size and manifest size.

use crate::common;

use std::fs;
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{metric, model, noise, request, serve};
use ztserve::config::{Config, SourceSpec};
use ztserve::format::DType;

const MIB: usize = 1 << 20;

fn config(dir: &Path) -> Config {
    let mut config = Config::serving(vec![SourceSpec::local(dir)]);
    // Decoders are kept busy here on purpose: none by digests hashed in the background.
    config.digests.ahead = ztserve::config::HashAhead::None;
    config
}

/// A directory with `small` (a 4 KiB raw object `w`) and `packed` (a 32 MiB zstd object `z`).
fn source() -> (tempfile::TempDir, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let bytes = noise(32 * MIB, 7);
    fs::write(dir.path().join("small.zt"), model(&[("w", DType::U8, &bytes[..4096], false)])).unwrap();
    fs::write(dir.path().join("packed.zt"), model(&[("z", DType::U8, &bytes, true)])).unwrap();
    (dir, bytes)
}

/// Reads until the server closes the connection (or `limit` passes: then panics).
fn closed_within(stream: &mut TcpStream, limit: Duration) -> Vec<u8> {
    let started = Instant::now();
    stream.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let mut received = Vec::new();
    let mut buffer = vec![0; 1 << 16];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return received,
            Ok(n) => received.extend_from_slice(&buffer[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return received, // reset: closed too
        }
        assert!(started.elapsed() < limit, "the connection is still open after {limit:?}");
    }
}

fn still_served(address: &str, bytes: &[u8]) {
    let reply = request(address, "/models/small/objects/w", &[]);
    assert_eq!((reply.status, &reply.body[..]), (200, &bytes[..4096]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_head_over_max_header_bytes_is_answered_431() {
    let (dir, bytes) = source();
    let (address, _state) = serve(Config {
        limits: ztserve::config::Limits { max_header_bytes: 2048, ..Default::default() },
        ..config(dir.path())
    })
    .await;
    tokio::task::spawn_blocking(move || {
        let fits = "x".repeat(1500);
        assert_eq!(request(&address, "/models/small/objects/w", &[("X-Pad", &fits)]).status, 200);
        let over = "x".repeat(3000);
        let refused = request(&address, "/models/small/objects/w", &[("X-Pad", &over)]);
        assert_eq!(refused.status, 431);
        // Thousands of tiny ranges cannot even be sent.
        let ranges: Vec<String> = (0..1000).map(|i| format!("{i}-{i}")).collect();
        let header = format!("bytes={}", ranges.join(","));
        assert_eq!(request(&address, "/models/small/objects/w", &[("Range", &header)]).status, 431);
        still_served(&address, &bytes);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trickling_its_headers_is_cut_off_after_header_timeout_secs() {
    let (dir, bytes) = source();
    let (address, _state) = serve(Config {
        limits: ztserve::config::Limits { header_timeout_secs: 1, ..Default::default() },
        ..config(dir.path())
    })
    .await;
    tokio::task::spawn_blocking(move || {
        let mut slow = TcpStream::connect(&address).unwrap();
        let started = Instant::now();
        let mut sent = 0;
        let request = b"GET /models/small/objects/w HTTP/1.1\r\nHost: x\r\nX-Slow: ".to_vec();
        // One byte every 100 ms: always progressing, never finishing.
        while slow.write_all(&request[sent % request.len()..][..1]).is_ok()
            && started.elapsed() < Duration::from_secs(5)
        {
            sent += 1;
            std::thread::sleep(Duration::from_millis(100));
            still_served_sometimes(&address, &bytes, sent);
            if sent > 5 && connection_closed(&mut slow) {
                break;
            }
        }
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(4), "cut off after {took:?}");

        // A kept-alive connection left idle is closed after the same time.
        let mut idle = TcpStream::connect(&address).unwrap();
        write!(idle, "GET /models/small/objects/w HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let response = closed_within(&mut idle, Duration::from_secs(4));
        assert!(response.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&response));
    })
    .await
    .unwrap();
}

fn still_served_sometimes(address: &str, bytes: &[u8], round: usize) {
    if round.is_multiple_of(5) {
        still_served(address, bytes);
    }
}

/// Whether the peer has closed `stream` (a read returns 0 or fails at once).
fn connection_closed(stream: &mut TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    let closed = match stream.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    };
    stream.set_nonblocking(false).unwrap();
    closed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_loses_its_connection_after_idle_timeout_secs() {
    let (dir, bytes) = source();
    let (address, _state) = serve(Config {
        limits: ztserve::config::Limits { idle_timeout_secs: 1, ..Default::default() },
        ..config(dir.path())
    })
    .await;
    let before = metric("ztserve_http_idle_timeouts_total", &[]);
    tokio::task::spawn_blocking(move || {
        let stuck = TcpStream::connect(&address).unwrap();
        // A small receive buffer, so the server's writes stall soon.
        rustix::net::sockopt::set_socket_recv_buffer_size(&stuck, 4096).unwrap();
        write!(&stuck, "GET /models/packed/objects/z HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let started = Instant::now();
        let mut timed_out = false;
        while started.elapsed() < Duration::from_secs(10) {
            still_served(&address, &bytes);
            if metric("ztserve_http_idle_timeouts_total", &[]) > before {
                timed_out = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(timed_out, "the stalled connection was not closed within 10 s");
        // The server let go of it (what it had queued may still trickle out to the client).
        let deadline = Instant::now() + Duration::from_secs(5);
        while metric("ztserve_http_connections", &[]) > 0.0 {
            assert!(Instant::now() < deadline, "the server still holds the connection");
            std::thread::sleep(Duration::from_millis(50));
        }
        still_served(&address, &bytes);
        drop(stuck);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_max_connections_wait_until_one_closes() {
    let (dir, bytes) = source();
    let (address, _state) = serve(Config {
        limits: ztserve::config::Limits { max_connections: 2, ..Default::default() },
        ..config(dir.path())
    })
    .await;
    tokio::task::spawn_blocking(move || {
        let get =
            |stream: &mut TcpStream| write!(stream, "GET /models/small/objects/w HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut first = TcpStream::connect(&address).unwrap();
        let mut second = TcpStream::connect(&address).unwrap();
        for held in [&mut first, &mut second] {
            get(held);
            held.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut head = [0u8; 12];
            held.read_exact(&mut head).unwrap();
            assert_eq!(&head, b"HTTP/1.1 200");
        }
        let mut third = TcpStream::connect(&address).unwrap(); // queued by the kernel
        get(&mut third);
        third.set_read_timeout(Some(Duration::from_millis(700))).unwrap();
        let mut head = [0u8; 12];
        assert!(third.read_exact(&mut head).is_err(), "a third connection was served while two were open");
        drop(first);
        third.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        third.read_exact(&mut head).unwrap();
        assert_eq!(&head, b"HTTP/1.1 200");
        drop((second, third));
        still_served(&address, &bytes);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_that_finds_every_decoder_busy_for_decode_wait_ms_is_answered_503() {
    let (dir, bytes) = source();
    let limits = Config {
        decode: ztserve::config::Decode { max_concurrent: Some(1), wait_ms: 300, ..Default::default() },
        ..config(dir.path())
    };
    let (address, state) = serve(limits).await;
    // The only decoder, taken as a long decode would hold it.
    let busy = Arc::clone(state.decoders()).acquire_owned().await.unwrap();
    let address2 = address.clone();
    let refused =
        tokio::task::spawn_blocking(move || request(&address2, "/models/packed/objects/z", &[("Range", "bytes=0-99")]))
            .await
            .unwrap();
    assert_eq!(refused.status, 503, "{}", String::from_utf8_lossy(&refused.body));
    assert_eq!(refused.json()["error"]["code"], "decoders_busy");
    assert_eq!(refused.header("retry-after"), Some("1"));
    drop(busy);
    tokio::task::spawn_blocking(move || {
        let served = request(&address, "/models/packed/objects/z", &[("Range", "bytes=0-99")]);
        assert_eq!((served.status, &served.body[..]), (206, &bytes[..100]));
        // Bytes already decoded never wait for a decoder.
        still_served(&address, &bytes);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_cannot_start_its_answer_within_request_timeout_secs_is_answered_503() {
    let (dir, bytes) = source();
    let limits = Config {
        limits: ztserve::config::Limits { request_timeout_secs: Some(1), ..Default::default() },
        decode: ztserve::config::Decode { max_concurrent: Some(1), wait_ms: 60_000, ..Default::default() },
        ..config(dir.path())
    };
    let (address, state) = serve(limits).await;
    let busy = Arc::clone(state.decoders()).acquire_owned().await.unwrap();
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let reply = request(&address, "/models/packed/objects/z", &[]);
        assert_eq!((reply.status, reply.json()["error"]["code"].as_str()), (503, Some("request_timeout")));
        assert_eq!(reply.header("retry-after"), Some("1"));
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(10), "{took:?}");
        still_served(&address, &bytes);
        drop(busy);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_over_max_ranges_are_refused_and_overlapping_ones_merged() {
    let (dir, bytes) = source();
    let (address, _state) =
        serve(Config { limits: ztserve::config::Limits { max_ranges: 4, ..Default::default() }, ..config(dir.path()) })
            .await;
    tokio::task::spawn_blocking(move || {
        let five = request(&address, "/models/small/objects/w", &[("Range", "bytes=0-0,2-2,4-4,6-6,8-8")]);
        assert_eq!((five.status, five.json()["error"]["code"].as_str()), (416, Some("too_many_ranges")));
        // Four copies of the whole object are one copy.
        let overlapping = request(&address, "/models/small/objects/w", &[("Range", "bytes=0-,0-,0-,-4096")]);
        assert_eq!(overlapping.status, 206);
        assert_eq!(overlapping.header("content-range"), Some("bytes 0-4095/4096"));
        assert_eq!(overlapping.body, bytes[..4096]);
        // Huge numbers are unsatisfiable, not an error; malformed headers are ignored.
        assert_eq!(
            request(&address, "/models/small/objects/w", &[("Range", "bytes=99999999999999999999999999-")]).status,
            416
        );
        assert_eq!(request(&address, "/models/small/objects/w", &[("Range", "bytes=--1,x")]).status, 200);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn components_and_manifests_over_their_size_limits_are_refused_and_the_rest_serves() {
    let (dir, bytes) = source();
    let many: Vec<(String, Vec<u8>)> = (0..400).map(|i| (format!("tensor.{i:04}"), vec![i as u8; 8])).collect();
    let objects: Vec<(&str, DType, &[u8], bool)> =
        many.iter().map(|(n, b)| (n.as_str(), DType::U8, &b[..], false)).collect();
    fs::write(dir.path().join("wide.zt"), model(&objects)).unwrap();
    let limits = Config {
        limits: ztserve::config::Limits {
            max_decoded_bytes: 16 * MIB as u64,
            max_manifest_bytes: 16 << 10,
            ..Default::default()
        },
        ..config(dir.path())
    };
    let (address, _state) = serve(limits).await;
    tokio::task::spawn_blocking(move || {
        let listed = request(&address, "/models", &[]).json();
        let status = |id: &str| listed["models"].as_array().unwrap().iter().find(|m| m["id"] == id).unwrap().clone();
        assert_eq!(status("wide")["status"], "broken");
        assert_eq!(status("wide")["reason"]["code"], "manifest_too_large", "{}", status("wide"));
        assert_eq!(status("packed")["status"], "broken");
        assert_eq!(status("packed")["reason"]["code"], "decoded_too_large", "{}", status("packed"));
        let refused = request(&address, "/models/packed/objects/z", &[]);
        assert_eq!((refused.status, refused.json()["error"]["code"].as_str()), (422, Some("broken_model")));
        still_served(&address, &bytes);
    })
    .await
    .unwrap();
}
