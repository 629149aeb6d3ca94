//! `POST /models/{B}/deltas`: region deltas from another version, each followed by its CRC32C.
//! Two versions of a model (B is A with about 2% of its bf16 elements changed, one tensor
//! reshaped, one added, a non-dense object's components touched): every delta applied to A's
//! region gives B's region as its own route sends it; the second request is answered from the
//! store, byte for byte; a damaged kept file is found and computed again; the store stays under
//! its bound; concurrent requests share one computation; and every refusal is a clear 4xx.

use crate::common;

use common::{metric, request_async, send, serve};
use ztserve::config::{Config, SourceSpec};
use ztserve::format::DType;
use ztserve::format::delta;
use ztserve::format::write::{ComponentInput, DigestAlgorithm, ObjectInput, WriteOptions, Writer};

/// One object of a test model: name, shape, format, zstd, and its components (role, dtype,
/// bytes).
type Object<'a> = (&'a str, &'a [u64], &'a str, bool, Vec<(&'a str, DType, Vec<u8>)>);

fn model(objects: &[Object<'_>]) -> Vec<u8> {
    let mut w = Writer::new(Vec::new()).unwrap();
    for (name, shape, format, zstd, components) in objects {
        let components = components
            .iter()
            .map(|(role, dtype, bytes)| ComponentInput { role, dtype: *dtype, logical_type: None, bytes })
            .collect();
        let input = ObjectInput { name, shape, format, attributes: None, components };
        let options = WriteOptions { zstd_level: zstd.then_some(1), digest: Some(DigestAlgorithm::Sha256) };
        w.add(&input, &options).unwrap();
    }
    w.finish(None).unwrap()
}

/// `bytes` with every 50th `width`-byte element changed (about 2%).
fn stepped(bytes: &[u8], width: usize) -> Vec<u8> {
    let mut out = bytes.to_vec();
    for element in (7..bytes.len() / width).step_by(50) {
        out[element * width] ^= 0x01;
    }
    out
}

/// A directory holding `a.zt` and `b.zt`, two versions of one model.
fn two_versions() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let w = common::noise(256 * 64 * 2, 1);
    let z = common::noise(128 * 32 * 2, 2);
    let s = common::noise(40 * 4, 3);
    let values = common::noise(512, 4);
    let scales = common::noise(64 * 2, 5);
    let a = model(&[
        ("w", &[256, 64], "dense", false, vec![("data", DType::BF16, w.clone())]),
        ("z", &[128, 32], "dense", true, vec![("data", DType::BF16, z.clone())]),
        ("s", &[40], "dense", false, vec![("data", DType::F32, s.clone())]),
        (
            "q",
            &[1024],
            "blocked",
            false,
            vec![("values", DType::U8, values.clone()), ("scales", DType::F16, scales.clone())],
        ),
    ]);
    let b = model(&[
        ("w", &[256, 64], "dense", false, vec![("data", DType::BF16, stepped(&w, 2))]),
        ("z", &[128, 32], "dense", true, vec![("data", DType::BF16, stepped(&z, 2))]),
        ("s", &[10, 4], "dense", false, vec![("data", DType::F32, s)]),
        ("n", &[16], "dense", false, vec![("data", DType::F32, common::noise(64, 6))]),
        (
            "q",
            &[1024],
            "blocked",
            false,
            vec![("values", DType::U8, stepped(&values, 1)), ("scales", DType::F16, stepped(&scales, 2))],
        ),
    ]);
    std::fs::write(dir.path().join("a.zt"), a).unwrap();
    std::fs::write(dir.path().join("b.zt"), b).unwrap();
    dir
}

/// A POST of `body` to `path`, off the test's runtime; a chunked body comes back decoded, and
/// `complete` when it ended with its last chunk.
pub(crate) async fn post(address: &str, path: &str, body: &str) -> common::Reply {
    let (address, path, body) = (address.to_owned(), path.to_owned(), body.to_owned());
    let mut reply = tokio::task::spawn_blocking(move || {
        send(&address, "POST", &path, &[("Content-Type", "application/json")], body.as_bytes())
    })
    .await
    .unwrap();
    if reply.header("transfer-encoding") == Some("chunked") {
        let (body, complete) = dechunked(&reply.body);
        (reply.body, reply.complete) = (body, complete);
    }
    reply
}

/// A chunked body decoded, and whether it ended with its last (empty) chunk.
fn dechunked(mut raw: &[u8]) -> (Vec<u8>, bool) {
    let mut body = Vec::new();
    loop {
        let Some(line_end) = raw.windows(2).position(|w| w == b"\r\n") else { return (body, false) };
        let size = std::str::from_utf8(&raw[..line_end]).unwrap().split(';').next().unwrap().trim();
        let size = usize::from_str_radix(size, 16).unwrap();
        raw = &raw[line_end + 2..];
        if size == 0 {
            return (body, true);
        }
        if raw.len() < size + 2 {
            body.extend_from_slice(&raw[..size.min(raw.len())]);
            return (body, false);
        }
        body.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

/// The deltas of a body, each checked against its CRC32C and its header; the body holds exactly
/// them.
pub(crate) fn split_deltas(body: &[u8]) -> Vec<Vec<u8>> {
    let mut at = 0;
    let mut out = Vec::new();
    while at < body.len() {
        let payload = u64::from_le_bytes(body[at + 32..at + 40].try_into().unwrap()) as usize;
        let end = at + delta::HEADER_LEN + payload;
        let bytes = &body[at..end];
        delta::parse_header(bytes).unwrap();
        let crc = u32::from_be_bytes(body[end..end + 4].try_into().unwrap());
        assert_eq!(crc, crc32c::crc32c(bytes), "the CRC32C of delta {}", out.len());
        out.push(bytes.to_vec());
        at = end + 4;
    }
    assert_eq!(at, body.len());
    out
}

/// The regions asked for: (object, component, slice).
const ASKED: &[(&str, Option<&str>, Option<&str>)] = &[
    ("w", None, Some("0:100")),
    ("w", None, Some("100:256,0:32")),
    ("w", None, Some("100:256,32:64")),
    ("z", None, None),
    ("s", None, None),
    ("n", None, None),
    ("q", Some("values"), None),
    ("q", Some("scales"), None),
];

fn regions_json(asked: &[(&str, Option<&str>, Option<&str>)]) -> String {
    let regions: Vec<String> = asked
        .iter()
        .map(|(object, component, slice)| {
            let mut fields = vec![format!(r#""object":"{object}""#)];
            fields.extend(component.map(|c| format!(r#""component":"{c}""#)));
            fields.extend(slice.map(|s| format!(r#""slice":"{s}""#)));
            format!("{{{}}}", fields.join(","))
        })
        .collect();
    regions.join(",")
}

/// A region's bytes from `model` as its own route sends them (`None`: the model lacks it).
async fn region_of(
    address: &str,
    model: &str,
    (object, component, slice): (&str, Option<&str>, Option<&str>),
) -> Option<Vec<u8>> {
    let mut url = match component {
        Some(role) => format!("/models/{model}/objects/{object}/components/{role}"),
        None => format!("/models/{model}/objects/{object}"),
    };
    if let Some(slice) = slice {
        url = format!("{url}?slice={slice}");
    }
    let reply = request_async(address, &url, &[]).await;
    (reply.status == 200).then_some(reply.body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_delta_applied_to_the_base_region_gives_the_new_region_and_the_second_is_kept() {
    let dir = two_versions();
    let store = tempfile::tempdir().unwrap();
    let mut config = Config::serving(vec![SourceSpec::local(dir.path())]);
    config.refits.delta_dir = Some(store.path().to_path_buf());
    let (address, _server) = serve(config).await;
    let body = format!(r#"{{"from":"a","regions":[{}]}}"#, regions_json(ASKED));
    let reply = post(&address, "/models/b/deltas", &body).await;
    assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
    assert!(reply.complete);
    assert_eq!(reply.header("content-type"), Some("application/vnd.ztserve.deltas"));
    assert_eq!(reply.header("content-length"), None);
    assert_eq!(reply.header("x-zt-regions"), Some("8"));
    let b_version = request_async(&address, "/models/b", &[]).await.header("x-zt-model-version").unwrap().to_owned();
    let a_version = request_async(&address, "/models/a", &[]).await.header("x-zt-model-version").unwrap().to_owned();
    assert_eq!(reply.header("x-zt-model-version"), Some(b_version.as_str()));
    assert_eq!(reply.header("x-zt-from-version"), Some(a_version.trim_matches('"')));
    let deltas = split_deltas(&reply.body);
    assert_eq!(deltas.len(), ASKED.len());
    for (delta_bytes, &region) in deltas.iter().zip(ASKED) {
        let new = region_of(&address, "b", region).await.unwrap();
        let header = delta::parse_header(delta_bytes).unwrap();
        let mut target = match region_of(&address, "a", region).await {
            Some(old) if region.0 != "s" => {
                assert_eq!(header.kind, delta::Kind::Patch, "{region:?}");
                assert!(header.changed > 0, "{region:?}");
                old
            }
            _ => {
                assert_eq!(header.kind, delta::Kind::Whole, "{region:?} has no base of its shape: sent whole");
                vec![0; new.len()]
            }
        };
        delta::apply(delta_bytes, &mut target).unwrap();
        assert_eq!(target, new, "{region:?}");
    }
    assert_eq!(metric("ztserve_deltas_total", &[("outcome", "computed")]), 8.0);
    assert_eq!(std::fs::read_dir(store.path()).unwrap().count(), 8);

    // Asked again: every delta read from the store, byte for byte.
    let again = post(&address, "/models/b/deltas", &body).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.body, reply.body);
    assert_eq!(metric("ztserve_deltas_total", &[("outcome", "kept")]), 8.0);
    assert_eq!(metric("ztserve_deltas_total", &[("outcome", "computed")]), 8.0);
    assert!(metric("ztserve_delta_bytes_total", &[]) >= 2.0 * reply.body.len() as f64);

    // A kept file damaged on disk is found by its checksum, dropped and computed again.
    for entry in std::fs::read_dir(store.path()).unwrap() {
        let path = entry.unwrap().path();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[10] ^= 0xff;
        std::fs::write(&path, bytes).unwrap();
    }
    let repaired = post(&address, "/models/b/deltas", &body).await;
    assert_eq!(repaired.status, 200);
    assert_eq!(repaired.body, reply.body);
    assert_eq!(metric("ztserve_delta_store_damaged_total", &[]), 8.0);
    assert_eq!(metric("ztserve_deltas_total", &[("outcome", "computed")]), 16.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deltas_from_the_same_version_change_nothing_and_concurrent_requests_share_one_computation() {
    let dir = two_versions();
    let (address, _server) = serve(Config::serving(vec![SourceSpec::local(dir.path())])).await;
    let body = format!(r#"{{"from":"b","regions":[{}]}}"#, regions_json(ASKED));
    let replies = futures_util::future::join_all((0..4).map(|_| post(&address, "/models/b/deltas", &body))).await;
    for reply in &replies {
        assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
        assert_eq!(reply.body, replies[0].body);
    }
    for (delta_bytes, region) in split_deltas(&replies[0].body).iter().zip(ASKED) {
        let header = delta::parse_header(delta_bytes).unwrap();
        assert_eq!((header.kind, header.changed), (delta::Kind::Patch, 0), "{region:?}");
    }
    let served = metric("ztserve_deltas_total", &[]);
    assert_eq!((metric("ztserve_delta_compute_seconds_count", &[]), served), (8.0, 32.0), "each key computed once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_stays_under_its_bound() {
    let dir = two_versions();
    let store = tempfile::tempdir().unwrap();
    let mut config = Config::serving(vec![SourceSpec::local(dir.path())]);
    config.refits.delta_dir = Some(store.path().to_path_buf());
    // Room for three files: each counts at least a filesystem block (4096 bytes).
    config.refits.delta_cache_bytes = 3 * 4096;
    let (address, _server) = serve(config).await;
    for slice in ["0:16", "16:32", "32:48", "48:64", "64:80", "80:96", "96:112", "112:128"] {
        let body = format!(r#"{{"from":"a","regions":[{{"object":"w","slice":"{slice}"}}]}}"#);
        let reply = post(&address, "/models/b/deltas", &body).await;
        assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
        let files = std::fs::read_dir(store.path()).unwrap().count();
        assert!(files <= 3, "{files} files held after {slice}");
    }
    let files = std::fs::read_dir(store.path()).unwrap().count();
    assert_eq!(files, 3, "the newest three are kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deltas_request_that_asks_too_much_or_names_what_is_not_there_is_refused_before_any_byte() {
    let dir = two_versions();
    let mut config = Config::serving(vec![SourceSpec::local(dir.path())]);
    config.limits.max_regions = 4;
    config.refits.delta_memory_bytes = 40_000;
    let (address, _server) = serve(config).await;
    let w = |slice: &str| format!(r#"{{"object":"w","slice":"{slice}"}}"#);
    let asked = |from: &str, items: &[String]| format!(r#"{{"from":"{from}","regions":[{}]}}"#, items.join(","));
    let gone = "00000000-0000000000000000";
    let cases: Vec<(String, String, &[u16], &str)> = vec![
        ("/models/b/deltas".into(), "not json".into(), &[400], "bad_request"),
        ("/models/b/deltas".into(), r#"{"regions":[{"object":"w"}]}"#.into(), &[400], "bad_request"),
        ("/models/b/deltas".into(), r#"{"from":"a","regions":[],"to":"b"}"#.into(), &[400], "bad_request"),
        ("/models/b/deltas".into(), asked("a", &[]), &[400], "no_regions"),
        (
            "/models/b/deltas".into(),
            asked("a", &[w("0:1"), w("1:2"), w("2:3"), w("3:4"), w("4:5")]),
            &[400],
            "too_many_regions",
        ),
        ("/models/b/deltas".into(), asked("a", &[w("0:10"), w("5:15")]), &[400], "regions_overlap"),
        ("/models/b/deltas".into(), asked("a", &[r#"{"object":"nope"}"#.into()]), &[404], "object_not_found"),
        ("/models/b/deltas".into(), asked("nope", &[w("0:1")]), &[404], "model_not_found"),
        // 410 once version_gone has its own status (the refits contract); 404 before.
        ("/models/b/deltas".into(), asked(&format!("a@{gone}"), &[w("0:1")]), &[404, 410], "version_gone"),
        (format!("/models/b@{gone}/deltas"), asked("a", &[w("0:1")]), &[404, 410], "version_gone"),
        (
            "/models/b/deltas".into(),
            asked("a", &[r#"{"object":"z"}"#.into(), r#"{"object":"w"}"#.into()]),
            &[413],
            "delta_region_too_large",
        ),
        ("/models/b/deltas".into(), asked("a", &[w("0:200")]), &[413], "delta_region_too_large"),
    ];
    for (path, body, statuses, code) in cases {
        let reply = post(&address, &path, &body).await;
        assert!(
            statuses.contains(&reply.status),
            "{path} {body}: {} {}",
            reply.status,
            String::from_utf8_lossy(&reply.body)
        );
        assert_eq!(reply.json()["error"]["code"].as_str(), Some(code), "{path} {body}");
    }
    // Within the budget (both versions' rows 0:100 are 25.6 kB), and `from` pinned to its version.
    let a_version = request_async(&address, "/models/a", &[]).await.header("x-zt-model-version").unwrap().to_owned();
    let from = format!("a@{}", a_version.trim_matches('"'));
    let reply = post(&address, "/models/b/deltas", &asked(&from, &[w("0:100")])).await;
    assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
    assert_eq!(split_deltas(&reply.body).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_may_only_diff_from_a_model_it_may_read() {
    let dir = two_versions();
    let mut config = Config::serving(vec![SourceSpec::local(dir.path())]);
    const TOKEN: &str = "secret-token-0123456789abcdef";
    config.auth.tokens = common::tokens(vec![format!("{TOKEN} b")]);
    let (address, _server) = serve(config).await;
    let authorized = |body: &'static str| {
        let address = address.clone();
        tokio::task::spawn_blocking(move || {
            let auth = format!("Bearer {TOKEN}");
            send(&address, "POST", "/models/b/deltas", &[("Authorization", auth.as_str())], body.as_bytes())
        })
    };
    let from_a = authorized(r#"{"from":"a","regions":[{"object":"w","slice":"0:1"}]}"#).await.unwrap();
    assert_eq!((from_a.status, from_a.json()["error"]["code"].as_str()), (404, Some("model_not_found")));
    let from_b = authorized(r#"{"from":"b","regions":[{"object":"w","slice":"0:1"}]}"#).await.unwrap();
    assert_eq!(from_b.status, 200, "{}", String::from_utf8_lossy(&from_b.body));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_stops_the_deltas_its_body_has_not_reached() {
    // 16 regions of 4 MiB that the base lacks, each sent whole: far more than the socket holds.
    let dir = tempfile::tempdir().unwrap();
    let big = common::noise(16 << 22, 9);
    std::fs::write(
        dir.path().join("a.zt"),
        model(&[("w", &[4], "dense", false, vec![("data", DType::U8, vec![0; 4])])]),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("b.zt"),
        model(&[("big", &[16, 4 << 20], "dense", false, vec![("data", DType::U8, big)])]),
    )
    .unwrap();
    let (address, _server) = serve(Config::serving(vec![SourceSpec::local(dir.path())])).await;
    let regions: Vec<String> = (0..16).map(|i| format!(r#"{{"object":"big","slice":"{i}:{}"}}"#, i + 1)).collect();
    let body = format!(r#"{{"from":"a","regions":[{}]}}"#, regions.join(","));
    let request = format!(
        "POST /models/b/deltas HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tokio::task::spawn_blocking(move || {
        use std::io::{Read as _, Write as _};
        let mut stream = std::net::TcpStream::connect(&address).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut head = [0u8; 64];
        let n = stream.read(&mut head).unwrap();
        assert!(head[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head[..n]));
    })
    .await
    .unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let computed = metric("ztserve_delta_compute_seconds_count", &[]);
    assert!((1.0..16.0).contains(&computed), "{computed} of 16 deltas computed after the client left");
}
