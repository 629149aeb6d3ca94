//! `POST /models/{m}/regions`: many regions of one model version in one body, each followed by
//! its CRC32C: the bytes against each region's own route (raw and zstd components, whole and
//! sliced, a sharded safetensors checkpoint), from a local directory and from S3; the version
//! pin; and every refusal of a request that asks too much, each before any byte.

use crate::common;

use common::{ModelSource, dense_f32_model, request_async, send, serve};
use ztserve::api;
use ztserve::config::Config;

/// A POST of `body` to `path`, off the test's runtime.
async fn post(address: &str, path: &str, body: &str) -> common::Reply {
    let (address, path, body) = (address.to_owned(), path.to_owned(), body.to_owned());
    tokio::task::spawn_blocking(move || {
        send(&address, "POST", &path, &[("Content-Type", "application/json")], body.as_bytes())
    })
    .await
    .unwrap()
}

/// The regions of a body: each `len` bytes, then their CRC32C (big-endian), which must match.
fn split_checked(body: &[u8], lens: &[usize]) -> Vec<Vec<u8>> {
    let mut at = 0;
    let mut out = Vec::new();
    for &len in lens {
        let bytes = &body[at..at + len];
        let crc = u32::from_be_bytes(body[at + len..at + len + 4].try_into().unwrap());
        assert_eq!(crc, crc32c::crc32c(bytes), "region {} of the body", out.len());
        out.push(bytes.to_vec());
        at += len + 4;
    }
    assert_eq!(at, body.len(), "the body holds exactly the regions asked for");
    out
}

async fn regions_are_each_as_their_own_route_sends_them(source: ModelSource) {
    source
        .put("m.zt", &dense_f32_model(1000, &[("w", &[300, 100], false), ("z", &[64, 32], true), ("v", &[7], false)]))
        .await;
    let (address, _state) = serve(source.config(Config::default())).await;
    let manifest = request_async(&address, "/models/m", &[]).await;
    let version = manifest.header("x-zt-model-version").unwrap().trim_matches('"').to_owned();
    // Rows and columns of a raw tensor, a slice of a zstd one and a whole small tensor.
    let asked = [
        ("w", Some("0:10")),
        ("w", Some("10:300,0:50")),
        ("w", Some("10:300,50:100")),
        ("z", Some("3:9,4:20")),
        ("v", None),
    ];
    let regions: Vec<String> = asked
        .iter()
        .map(|(object, slice)| match slice {
            Some(slice) => format!(r#"{{"object":"{object}","slice":"{slice}"}}"#),
            None => format!(r#"{{"object":"{object}"}}"#),
        })
        .collect();
    let body = format!(r#"{{"regions":[{}]}}"#, regions.join(","));
    for path in ["/models/m/regions".to_owned(), format!("/models/m@{version}/regions")] {
        let reply = post(&address, &path, &body).await;
        assert_eq!(reply.status, 200, "{}: {path}: {}", source.kind(), String::from_utf8_lossy(&reply.body));
        assert!(reply.complete);
        assert_eq!(reply.header("x-zt-regions"), Some("5"));
        assert_eq!(reply.header("content-type"), Some("application/vnd.ztserve.regions"));
        assert_eq!(reply.header("x-zt-model-version").map(|v| v.trim_matches('"')), Some(version.as_str()));
        let mut expected = Vec::new();
        for (object, slice) in asked {
            let url = api::object_url("m", object);
            let url = slice.map_or(url.clone(), |slice| format!("{url}?slice={slice}"));
            let single = request_async(&address, &url, &[]).await;
            assert_eq!(single.status, 200, "{url}");
            expected.push(single.body);
        }
        let lens: Vec<usize> = expected.iter().map(Vec::len).collect();
        assert_eq!(split_checked(&reply.body, &lens), expected, "{}: {path}", source.kind());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regions_from_a_local_directory_are_each_as_their_own_route_sends_them() {
    regions_are_each_as_their_own_route_sends_them(ModelSource::local()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regions_from_s3_are_each_as_their_own_route_sends_them() {
    regions_are_each_as_their_own_route_sends_them(ModelSource::s3()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_regions_body_spans_the_shards_of_a_checkpoint_and_long_runs_are_checked_as_well() {
    // Tensors of several checksum blocks (64 KiB) each, in two safetensors shards: their CRC32C
    // are combined from block sums the second time they are asked for.
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("org/big");
    std::fs::create_dir_all(&model).unwrap();
    let a: Vec<u8> = (0..300_000u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let b: Vec<u8> = (0..200_000u32).flat_map(|i| ((i * 7) as f32).to_le_bytes()).collect();
    let shard = |name: &str, bytes: &[u8], rows: usize| {
        let header = format!(
            r#"{{"{name}":{{"dtype":"F32","shape":[{rows},{}],"data_offsets":[0,{}]}}}}"#,
            bytes.len() / 4 / rows,
            bytes.len()
        );
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(header.as_bytes());
        file.extend_from_slice(bytes);
        file
    };
    std::fs::write(model.join("model-00001-of-00002.safetensors"), shard("a", &a, 1000)).unwrap();
    std::fs::write(model.join("model-00002-of-00002.safetensors"), shard("b", &b, 500)).unwrap();
    let index = r#"{"metadata":{},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}"#;
    std::fs::write(model.join("model.safetensors.index.json"), index).unwrap();
    let (address, _state) = serve(Config::serving(vec![ztserve::config::SourceSpec::local(dir.path())])).await;
    let body = r#"{"regions":[{"object":"b","slice":"1:499"},{"object":"a","slice":"0:1000,5:200"},{"object":"a","slice":"0:1000,0:5"}]}"#;
    let b_rows = &b[400 * 4..499 * 400 * 4];
    let a_columns = |range: std::ops::Range<usize>| -> Vec<u8> {
        (0..1000).flat_map(|row| a[(row * 300 + range.start) * 4..(row * 300 + range.end) * 4].to_vec()).collect()
    };
    for round in 0..2 {
        let reply = post(&address, "/models/org%2Fbig/regions", body).await;
        assert_eq!(reply.status, 200, "round {round}: {}", String::from_utf8_lossy(&reply.body));
        let found = split_checked(&reply.body, &[b_rows.len(), 1000 * 195 * 4, 1000 * 5 * 4]);
        assert_eq!(found, [b_rows.to_vec(), a_columns(5..200), a_columns(0..5)], "round {round}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_asks_too_much_or_names_what_is_not_there_is_refused_before_any_byte() {
    let source = ModelSource::local();
    source.put("m.zt", &dense_f32_model(1000, &[("w", &[300, 100], false), ("z", &[64, 32], true)])).await;
    let mut config = source.config(Config::default());
    config.limits.max_regions = 4;
    config.limits.max_regions_bytes = 100_000;
    let (address, _state) = serve(config).await;
    let version = request_async(&address, "/models/m", &[]).await.header("x-zt-model-version").unwrap().to_owned();
    let w = |slice: &str| format!(r#"{{"object":"w","slice":"{slice}"}}"#);
    let regions = |items: &[String]| format!(r#"{{"regions":[{}]}}"#, items.join(","));
    let cases: Vec<(String, String, u16, &str)> = vec![
        ("/models/m/regions".into(), regions(&[]), 400, "no_regions"),
        (
            "/models/m/regions".into(),
            regions(&[w("0:1"), w("1:2"), w("2:3"), w("3:4"), w("4:5")]),
            400,
            "too_many_regions",
        ),
        ("/models/m/regions".into(), regions(&[w("0:10"), w("5:15")]), 400, "regions_overlap"),
        ("/models/m/regions".into(), regions(&[w("0:10,0:50"), w("9:20,49:51")]), 400, "regions_overlap"),
        (
            "/models/m/regions".into(),
            regions(&[r#"{"object":"z"}"#.into(), r#"{"object":"z","slice":"63:64"}"#.into()]),
            400,
            "regions_overlap",
        ),
        (
            "/models/m/regions".into(),
            regions(&[r#"{"object":"z"}"#.into(), r#"{"object":"z"}"#.into()]),
            400,
            "regions_overlap",
        ),
        ("/models/m/regions".into(), regions(&[w("0:200"), w("200:300")]), 400, "regions_too_large"),
        ("/models/m/regions".into(), regions(&[w("0:301")]), 400, "slice_out_of_bounds"),
        ("/models/m/regions".into(), regions(&[w("5:2")]), 400, "slice_reversed"),
        ("/models/m/regions".into(), regions(&[r#"{"object":"nope"}"#.into()]), 404, "object_not_found"),
        (
            "/models/m/regions".into(),
            regions(&[r#"{"object":"w","component":"scales"}"#.into()]),
            404,
            "component_not_found",
        ),
        ("/models/m/regions".into(), r#"{"regions":[{"object":"w","step":2}]}"#.into(), 400, "bad_request"),
        ("/models/m/regions".into(), "not json".into(), 400, "bad_request"),
        ("/models/m/regions".into(), format!(r#"{{"regions":[{}]}}"#, " ".repeat(5000)), 413, "request_too_large"),
        ("/models/m@00000000-0000000000000000/regions".into(), regions(&[w("0:1")]), 404, "version_gone"),
        ("/models/none/regions".into(), regions(&[w("0:1")]), 404, "model_not_found"),
    ];
    for (path, body, status, code) in cases {
        let reply = post(&address, &path, &body).await;
        assert_eq!((reply.status, reply.json()["error"]["code"].as_str()), (status, Some(code)), "{path} {body}");
    }
    // Regions that only touch: none is asked twice.
    let reply = post(&address, "/models/m/regions", &regions(&[w("0:10,0:50"), w("0:10,50:100"), w("10:20")])).await;
    assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
    let get = request_async(&address, "/models/m/regions", &[]).await;
    assert_eq!((get.status, get.json()["error"]["code"].as_str()), (405, Some("method_not_allowed")));
    assert!(version.starts_with('"'));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regions_are_read_only_with_a_token_that_may_read_the_model() {
    let source = ModelSource::local();
    source.put("m.zt", &dense_f32_model(1000, &[("w", &[30, 10], false)])).await;
    let mut config = source.config(Config::default());
    config.auth.tokens = common::tokens(vec!["secret-token-0123456789abcdef".into()]);
    let (address, _state) = serve(config).await;
    let body = r#"{"regions":[{"object":"w","slice":"0:3"}]}"#;
    assert_eq!(post(&address, "/models/m/regions", body).await.status, 401);
    let (address2, path, body2) = (address.clone(), "/models/m/regions".to_owned(), body.to_owned());
    let reply = tokio::task::spawn_blocking(move || {
        send(&address2, "POST", &path, &[("Authorization", "Bearer secret-token-0123456789abcdef")], body2.as_bytes())
    })
    .await
    .unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body.len(), 3 * 10 * 4 + 4);
}
