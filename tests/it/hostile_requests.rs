//! Hostile requests over raw sockets: path traversal in model ids, object names and roles in
//! every spelling (raw, percent-encoded, double-encoded, backslashes, NUL, overlong UTF-8)
//! never reaches a file outside the source, on `/models`, the Hub API's `resolve`, tree and
//! model routes and the OCI registry's `/v2`; an anonymous `/metrics` scrape names no model;
//! malformed request lines and headers answer 4xx or
//! close the connection; none of it stops other clients being served. Ids are looked up in
//! the catalog, never joined onto a filesystem path, and these tests hold that in place.

use crate::common;

use std::fs;
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

use common::{model, request, serve};
use ztserve::config::{Config, SourceSpec};
use ztserve::format::DType;

/// Sends `raw` bytes as they are and returns the status line's code (None: closed without one).
fn send_raw(address: &str, raw: &[u8]) -> (Option<u16>, Vec<u8>) {
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(raw).unwrap();
    // Nothing more is coming: an incomplete request ends at EOF rather than at a timeout. (A
    // complete one keeps its write side open: hyper takes EOF for a client that went away.)
    if !raw.ends_with(b"\r\n\r\n") {
        stream.shutdown(std::net::Shutdown::Write).unwrap();
    }
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let status =
        response.starts_with(b"HTTP/1.1 ").then(|| String::from_utf8_lossy(&response[9..12]).parse().ok()).flatten();
    (status, response)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traversal_in_any_spelling_never_leaves_the_source() {
    let outside = tempfile::tempdir().unwrap();
    let secret = b"SECRET-BYTES-OUTSIDE-THE-SOURCE!";
    // A valid model beside the source, and a plain file: neither may ever be served.
    fs::write(outside.path().join("secret.zt"), model(&[("w", DType::U8, secret, false)])).unwrap();
    fs::write(outside.path().join("passwd"), secret).unwrap();
    let source = outside.path().join("source");
    fs::create_dir_all(source.join("org")).unwrap();
    fs::write(source.join("org/llama.zt"), model(&[("w", DType::U8, &[1; 16], false)])).unwrap();
    let config = Config::serving(vec![SourceSpec::local(source)]);
    let (address, _state) = serve(config).await;

    tokio::task::spawn_blocking(move || {
        let ids = [
            "..%2Fsecret",
            "%2E%2E%2Fsecret",
            "%2e%2e%2fsecret",
            "..%252Fsecret",
            "%252E%252E%252Fsecret",
            "..%5Csecret",
            "..%5C..%5Csecret",
            "org%2F..%2F..%2Fsecret",
            "%2Fetc%2Fpasswd",
            "..%2Fpasswd",
            "secret%00",
            "..%2Fsecret%00.zt",
            "%C0%AE%C0%AE%2Fsecret",
            "%C0%AE%C0%AE%C0%AFsecret",
            "%E0%80%AE%E0%80%AE%2Fsecret",
            "..",
            ".",
            "org%2F.",
            "org%2F..%2Forg%2Fllama",
            "org%2F.%2Fllama",
            "org%2F%2Fllama",
            "org%5Cllama",
            "%2Forg%2Fllama",
            "org%2Fllama.zt",
        ];
        for id in ids {
            for suffix in ["", "/file", "/objects/w", "/objects/w/components/data"] {
                let reply = request(&address, &format!("/models/{id}{suffix}"), &[]);
                assert!(matches!(reply.status, 400 | 404), "/models/{id}{suffix} answered {}", reply.status);
                assert!(
                    !reply.body.windows(secret.len()).any(|w| w == secret),
                    "/models/{id}{suffix} leaked the secret"
                );
            }
        }
        // Traversal in object names and roles of a real model.
        for name in ["..%2F..%2Fsecret", "..", "w%00", "%C0%AEw", "w%2F..%2Fw"] {
            for path in [
                format!("/models/org%2Fllama/objects/{name}"),
                format!("/models/org%2Fllama/objects/w/components/{name}"),
            ] {
                let reply = request(&address, &path, &[]);
                assert!(matches!(reply.status, 400 | 404), "{path} answered {}", reply.status);
            }
        }
        // Raw traversal in the request target, which no client library would send.
        for target in [
            "/models/../secret",
            "/models/../../passwd",
            "/models/..\\secret",
            "/models/org/../../secret/file",
            "/../../etc/passwd",
        ] {
            let (status, response) =
                send_raw(&address, format!("GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes());
            assert!(matches!(status, Some(400 | 404)), "{target} answered {status:?}");
            assert!(!response.windows(secret.len()).any(|w| w == secret), "{target} leaked the secret");
        }
        let served = request(&address, "/models/org%2Fllama/objects/w", &[]);
        assert_eq!((served.status, &served.body[..]), (200, &[1u8; 16][..]));
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_answer_4xx_or_close_and_others_are_still_served() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("m.zt"), model(&[("w", DType::U8, &[9; 16], false)])).unwrap();
    let config = Config::serving(vec![SourceSpec::local(dir.path())]);
    let (address, _state) = serve(config).await;
    tokio::task::spawn_blocking(move || {
        let cases: &[&[u8]] = &[
            b"GET /models HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\nConnection: close\r\n\r\n",
            b"GET /models HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
            b"GET /models\x00 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            b"GET /models HTTP/9.9\r\nHost: x\r\nConnection: close\r\n\r\n",
            b"GET  HTTP/1.1\r\n\r\n",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", // a TLS ClientHello on the plain port
            b"GET /models HTTP/1.1\r\nHost: x\r\nBad Header\r\nConnection: close\r\n\r\n",
            b"GET /models HTTP/1.1\r\nHost: x\r\nX: \xff\xfe\r\nConnection: close\r\n\r\n",
            b"GET /models/m%ZZ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            b"GET /models/%FF%FE HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            b"DELETE /models/m HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            b"GET /models/m/objects/w HTTP/1.1\r\nHost: x\r\nRange: bytes=0-0\r\nRange: bytes=1-1\r\nConnection: close\r\n\r\n",
        ];
        for raw in cases {
            let (status, _) = send_raw(&address, raw);
            // hyper answers 400 for what it cannot parse, or closes the connection.
            assert!(status.is_none_or(|s| (400..500).contains(&s) || s == 200 || s == 206), "{:?} answered {status:?}", String::from_utf8_lossy(raw));
            let served = request(&address, "/models/m/objects/w", &[]);
            assert_eq!((served.status, &served.body[..]), (200, &[9u8; 16][..]));
        }
        // A header that is not valid UTF-8 where we read it (Range) is ignored, not a crash.
        let (status, _) = send_raw(&address, b"GET /models/m/objects/w HTTP/1.1\r\nHost: x\r\nRange: bytes=\xff-\r\nConnection: close\r\n\r\n");
        assert_eq!(status, Some(200));
        let (status, _) = send_raw(&address, b"GET /models/m%ZZ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        assert!(matches!(status, Some(400 | 404)), "{status:?}");
        let (status, _) = send_raw(&address, b"DELETE /models/m HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        assert_eq!(status, Some(405));
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traversal_on_the_hub_and_registry_routes_never_leaves_the_source_and_metrics_name_no_model() {
    let outside = tempfile::tempdir().unwrap();
    let secret = b"SECRET-BYTES-OUTSIDE-THE-SOURCE!";
    fs::write(outside.path().join("secret.zt"), model(&[("w", DType::U8, secret, false)])).unwrap();
    fs::write(outside.path().join("passwd"), secret).unwrap();
    let source = outside.path().join("source");
    fs::create_dir_all(source.join("org")).unwrap();
    fs::write(source.join("org/llama.zt"), model(&[("w", DType::U8, &[1; 16], false)])).unwrap();
    let mut config = Config::serving(vec![SourceSpec::local(source)]);
    let token = "hostile-test-token-0123456789";
    config.auth.tokens = vec![ztserve::config::TokenEntry::parse(token).unwrap()];
    let (address, _state) = serve(config).await;

    tokio::task::spawn_blocking(move || {
        let auth = format!("Bearer {token}");
        let headers = [("Authorization", auth.as_str())];
        let names = [
            "..%2Fsecret",
            "%2E%2E%2Fsecret",
            "..%252Fsecret",
            "..%5Csecret",
            "org%2F..%2F..%2Fsecret",
            "%2Fetc%2Fpasswd",
            "secret%00",
            "%C0%AE%C0%AE%2Fsecret",
            "..",
            "org%2F.",
            "org/..",
            "org/../..",
        ];
        let files = ["..%2Fsecret.zt", "..%2F..%2Fpasswd", "%2E%2E%2Fsecret.zt", "..%5Csecret.zt", "llama.zt%00", ".."];
        let mut paths = Vec::new();
        for name in names {
            for rest in ["resolve/main/llama.zt", "resolve/main/model.safetensors"] {
                paths.push(format!("/hf/{name}/{rest}"));
            }
            paths.push(format!("/hf/api/models/{name}"));
            paths.push(format!("/hf/api/models/{name}/tree/main"));
            for rest in ["manifests/latest", "tags/list", &format!("blobs/sha256:{}", "0".repeat(64))] {
                paths.push(format!("/v2/{name}/{rest}"));
            }
        }
        for file in files {
            for revision in ["main", "..", "%2E%2E"] {
                paths.push(format!("/hf/org/resolve/{revision}/{file}"));
                paths.push(format!("/hf/org/llama/resolve/{revision}/{file}"));
            }
            paths.push(format!("/hf/api/models/org/tree/main/{file}"));
            paths.push(format!("/v2/org/llama/blobs/{file}"));
            paths.push(format!("/v2/org/llama/manifests/{file}"));
        }
        for path in &paths {
            let reply = request(&address, path, &headers);
            assert!(matches!(reply.status, 400 | 401 | 404), "{path} answered {}", reply.status);
            assert!(!reply.body.windows(secret.len()).any(|w| w == secret), "{path} leaked the secret");
        }
        // Raw traversal in the request target.
        for target in
            ["/hf/org/resolve/main/../../secret.zt", "/hf/../../passwd", "/v2/org/../../secret/manifests/latest"]
        {
            let (status, response) = send_raw(
                &address,
                format!("GET {target} HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            );
            assert!(matches!(status, Some(400 | 401 | 404)), "{target} answered {status:?}");
            assert!(!response.windows(secret.len()).any(|w| w == secret), "{target} leaked the secret");
        }
        // The model is served on every protocol; an anonymous scrape names none of it.
        for path in ["/models/org%2Fllama/objects/w", "/hf/api/models/org/llama", "/v2/org/llama/manifests/latest"] {
            let reply = request(&address, path, &headers);
            assert_eq!(reply.status, 200, "{path}: {}", String::from_utf8_lossy(&reply.body));
        }
        let scrape = request(&address, "/metrics", &[]);
        assert_eq!(scrape.status, 200);
        let text = String::from_utf8_lossy(&scrape.body);
        assert!(text.contains("ztserve_http_requests_total"), "{text}");
        for leaked in ["llama", "org/", "secret"] {
            assert!(!text.contains(leaked), "an anonymous scrape holds {leaked:?}");
        }
    })
    .await
    .unwrap();
}
