//! Server-side slices (`?slice=`, `?shard=&dim=`): the bytes against numpy's slicing of what the
//! official readers return (2.1.2 raw and seekable, 1.2.3 single-frame zstd; widths 1 to 16
//! bytes, fp8 and complex, rank 1 to 4, first, middle and last ranks with remainders) from a
//! local directory and from S3; the HTTP contract over a slice; the refusals, each with its
//! code; and how each source is cut (sent from the file, gathered, one shared decode, only the
//! seekable frames touched).

use crate::common;

use std::path::Path;

use common::{ModelSource, counting_f32, dense_f32_model, metric, request_async, run_interop_script, serve};
use ztserve::api;
use ztserve::config::Config;

/// `tests/interop/slices.py ARGS` in venv `venv`, off the runtime the server runs on.
async fn slices_py(venv: &'static str, args: Vec<String>) -> String {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&Path> = args.iter().map(Path::new).collect();
        run_interop_script(venv, "slices.py", &args)
    })
    .await
    .unwrap()
}

async fn official_tensors_are_sliced_as_numpy_slices_them(source: ModelSource) {
    let dir = tempfile::tempdir().unwrap();
    let (v2, v1) = (dir.path().join("v2"), dir.path().join("v1"));
    let (v2, v1) = (v2.to_str().unwrap().to_owned(), v1.to_str().unwrap().to_owned());
    slices_py("ztensor-2.1.2", vec!["write".into(), v2.clone()]).await;
    slices_py("ztensor-1.2.3", vec!["write".into(), v1.clone()]).await;
    for (dir, file) in [(&v2, "raw.zt"), (&v2, "seekable.zt"), (&v1, "zstd.zt")] {
        source.put(file, &std::fs::read(Path::new(dir).join(file)).unwrap()).await;
    }
    let (address, _state) = serve(source.config(Config::default())).await;
    let url = format!("http://{address}");
    let mut compared = 0;
    for (venv, dir, expected) in [("ztensor-2.1.2", v2, 538), ("ztensor-1.2.3", v1, 237)] {
        let report = slices_py(venv, vec!["check".into(), dir, url.clone()]).await;
        let report: serde_json::Value = serde_json::from_str(report.trim()).unwrap();
        assert_eq!(report["compared"], expected, "{}: {venv}: {report}", source.kind());
        compared += expected;
    }
    assert_eq!(compared, 775);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_tensors_from_a_local_directory_are_sliced_as_numpy_slices_them() {
    official_tensors_are_sliced_as_numpy_slices_them(ModelSource::local()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_tensors_from_s3_are_sliced_as_numpy_slices_them() {
    official_tensors_are_sliced_as_numpy_slices_them(ModelSource::s3()).await;
}

/// The f32 values a slice of a `counting_f32` tensor holds, as bytes.
fn expected(shape: &[u64], ranges: &[std::ops::Range<u64>]) -> Vec<u8> {
    let count: u64 = shape.iter().product();
    let mut out = Vec::new();
    for flat in 0..count {
        let (mut rest, mut inside) = (flat, true);
        for d in (0..shape.len()).rev() {
            inside &= ranges[d].contains(&(rest % shape[d]));
            rest /= shape[d];
        }
        if inside {
            out.extend((flat as f32).to_le_bytes());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slice_is_a_representation_of_its_own_with_ranges_conditionals_and_versions() {
    let source = ModelSource::local();
    source.put("m.zt", &dense_f32_model(0, &[("w", &[10, 6], false), ("z", &[10, 6], true)])).await;
    let (address, _state) = serve(source.config(Config::default())).await;
    let manifest = request_async(&address, "/models/m", &[]).await;
    let version = manifest.header("x-zt-model-version").unwrap().to_owned();
    for object in ["w", "z"] {
        let url = api::object_url("m", object);
        let rows = request_async(&address, &format!("{url}?shard=1/3&dim=0"), &[]).await;
        assert_eq!(rows.status, 200, "{object}: {}", String::from_utf8_lossy(&rows.body));
        assert_eq!(rows.body, expected(&[10, 6], &[3..6, 0..6]), "{object}");
        assert_eq!(rows.header("x-zt-shape"), Some("3,6"));
        assert_eq!(rows.header("x-zt-slice"), Some("3:6,0:6"));
        assert_eq!(rows.header("content-length"), Some("72"));
        assert_eq!(rows.header("x-zt-model-version"), Some(version.as_str()));
        assert_eq!(rows.header("content-encoding"), None, "{object}: a slice is never the stored frame");
        assert_eq!(rows.header("repr-digest"), None, "{object}: the declared digest is the whole tensor's");
        // The same slice asked for another way has the same tag; other slices and the whole
        // object have their own.
        let etag = rows.header("etag").unwrap().to_owned();
        let same = request_async(&address, &format!("{url}?slice=3:6"), &[]).await;
        assert_eq!(same.header("etag"), Some(etag.as_str()));
        let whole = request_async(&address, &url, &[]).await;
        let columns = request_async(&address, &format!("{url}?shard=2/3&dim=-1"), &[]).await;
        assert_eq!(columns.body, expected(&[10, 6], &[0..10, 4..6]), "{object}");
        for other in [&whole, &columns] {
            assert_ne!(other.header("etag"), Some(etag.as_str()), "{object}");
        }
        let component_url = format!("{}?slice=3:6", api::component_url("m", object, "data"));
        let component = request_async(&address, &component_url, &[]).await;
        assert_eq!(component.body, rows.body, "{object}: the component route cuts the same slice");
        // Conditionals, HEAD and ranges count the slice's bytes.
        let fresh = request_async(&address, &format!("{url}?slice=3:6"), &[("if-none-match", &etag)]).await;
        assert_eq!(fresh.status, 304, "{object}");
        let (at, path) = (address.clone(), format!("{url}?slice=3:6"));
        let head = tokio::task::spawn_blocking(move || common::head_request(&at, &path)).await.unwrap().to_lowercase();
        assert!(head.contains(&format!("etag: {}", etag.to_lowercase())), "{object}: {head}");
        assert!(
            head.contains("content-length: 72") && head.ends_with("\r\n\r\n"),
            "{object}: HEAD sends no body: {head}"
        );
        let range = request_async(&address, &format!("{url}?slice=3:6"), &[("range", "bytes=10-29")]).await;
        assert_eq!(range.status, 206, "{object}");
        assert_eq!(range.header("content-range"), Some("bytes 10-29/72"));
        assert_eq!(range.body, rows.body[10..30], "{object}");
        let past = request_async(&address, &format!("{url}?slice=3:6"), &[("range", "bytes=72-")]).await;
        assert_eq!(past.status, 416, "{object}");
        let several = request_async(&address, &format!("{url}?slice=:,1:3"), &[("range", "bytes=0-3,40-47")]).await;
        assert_eq!(several.status, 206, "{object}");
        let part = |at: usize, len: usize| expected(&[10, 6], &[0..10, 1..3])[at..at + len].to_vec();
        for piece in [part(0, 4), part(40, 8)] {
            assert!(several.body.windows(piece.len()).any(|w| w == piece), "{object}: a multipart piece");
        }
        // A pinned version is immutable; an empty slice is a slice.
        let token = version.trim_matches('"');
        let pinned = request_async(&address, &format!("/models/m@{token}/objects/{object}?slice=3:6"), &[]).await;
        assert_eq!(pinned.body, rows.body);
        assert!(pinned.header("cache-control").unwrap().contains("immutable"));
        let empty = request_async(&address, &format!("{url}?slice=4:4"), &[]).await;
        assert_eq!((empty.status, empty.body.len(), empty.header("x-zt-shape")), (200, 0, Some("0,6")));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_that_cannot_be_cut_answer_400_with_their_code() {
    let source = ModelSource::local();
    source.put("m.zt", &dense_f32_model(0, &[("w", &[10, 6], false)])).await;
    let dir = tempfile::tempdir().unwrap();
    // A packed f4_e2m1 tensor, and one of a logical type the server does not know, written
    // by the official crate; the demo's sparse objects.
    let path = dir.path().join("v2.zt");
    let mut w = ztensor::Writer::options().canonical(false).create(&path).unwrap();
    w.object("f4", |o| o.shape([8u64]).part("data", |p| p.dtype(ztensor::DType::U8).logical("f4_e2m1").bytes(&[0; 4])))
        .unwrap();
    w.object("custom", |o| {
        o.shape([4u64]).part("data", |p| p.dtype(ztensor::DType::U8).logical("x_mx9").bytes(&[0; 4]))
    })
    .unwrap();
    w.finish().unwrap();
    source.put("v2.zt", &std::fs::read(&path).unwrap()).await;
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/demo/structured.zt");
    source.put("structured.zt", &std::fs::read(demo).unwrap()).await;
    let (address, _state) = serve(source.config(Config::default())).await;
    let w = api::object_url("m", "w");
    for (url, code) in [
        (format!("{w}?slice=0:11"), "slice_out_of_bounds"),
        (format!("{w}?slice=-11:"), "slice_out_of_bounds"),
        (format!("{w}?slice=5:2"), "slice_reversed"),
        (format!("{w}?slice=:,:,:"), "slice_rank"),
        (format!("{w}?slice=1"), "slice_syntax"),
        (format!("{w}?slice=0:4:2"), "slice_syntax"),
        (format!("{w}?slice=0:1&slice=1:2"), "slice_syntax"),
        (format!("{w}?slice=0:1&shard=0/2&dim=0"), "slice_syntax"),
        (format!("{w}?shard=0/2"), "slice_syntax"),
        (format!("{w}?dim=0"), "slice_syntax"),
        (format!("{w}?shard=2/2&dim=0"), "slice_shard"),
        (format!("{w}?shard=0/0&dim=0"), "slice_shard"),
        (format!("{w}?shard=0/2&dim=2"), "slice_shard"),
        (format!("{}?slice=0:2", api::object_url("v2", "f4")), "slice_sub_byte"),
        (format!("{}?slice=0:2", api::object_url("v2", "custom")), "slice_unknown_type"),
        (format!("{}?shard=0/2&dim=0", api::object_url("structured", "adjacency")), "slice_not_dense"),
        (format!("{}?slice=0:1", api::component_url("structured", "adjacency", "values")), "slice_not_dense"),
    ] {
        let reply = request_async(&address, &url, &[]).await;
        assert_eq!(reply.status, 400, "{url}: {}", String::from_utf8_lossy(&reply.body));
        assert_eq!(reply.json()["error"]["code"], code, "{url}");
    }
    // Without a slice, the same objects answer as before.
    let whole = request_async(&address, &api::object_url("v2", "f4"), &[]).await;
    assert_eq!(whole.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_source_is_cut_where_the_bytes_are() {
    let source = ModelSource::local();
    // Rows of 512 KiB split in two: runs of 256 KiB, sent by sendfile. Rows of 16 KiB split in
    // four: runs of 4 KiB, sent from the mapping too. Rows of 512 bytes split in four: runs of
    // 128 bytes, gathered with pread. A single zstd frame, split among 4 ranks.
    let objects: [(&str, &[u64], bool); 4] = [
        ("long", &[8, 131_072], false),
        ("columns", &[64, 4096], false),
        ("narrow", &[256, 128], false),
        ("frame", &[256, 1024], true),
    ];
    source.put("m.zt", &dense_f32_model(0, &objects)).await;
    // A seekable part of three 1 MiB frames, by the official crate.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("seekable.zt");
    let positions = counting_f32(&[3 << 18], 0);
    let mut w = ztensor::Writer::options().canonical(false).create(&path).unwrap();
    w.object("positions", |o| {
        o.shape([3u64 << 18])
            .part("data", |p| p.dtype(ztensor::DType::F32).encoding(ztensor_seekable()).bytes(&positions))
    })
    .unwrap();
    w.finish().unwrap();
    source.put("seekable.zt", &std::fs::read(&path).unwrap()).await;
    let mut config = source.config(Config::default());
    // What is read and sent is counted here: nothing by digests hashed in the background.
    config.digests.ahead = ztserve::config::HashAhead::None;
    // With sendfile on, its counter shows which runs leave without a copy through the process.
    config.server.sendfile = true;
    let (address, _state) = serve(config).await;

    let sent = || metric("ztserve_sendfile_bytes_total", &[]);
    let gathered = || metric("ztserve_storage_read_bytes_total", &[("purpose", "slice")]);
    let (sent_before, gathered_before) = (sent(), gathered());
    let long = request_async(&address, &format!("{}?shard=1/2&dim=1", api::object_url("m", "long")), &[]).await;
    assert_eq!(long.body, expected(&[8, 131_072], &[0..8, 65_536..131_072]));
    assert!(sent() - sent_before >= long.body.len() as f64, "long runs go out by sendfile");
    assert_eq!(gathered(), gathered_before, "nothing of them is read by the server");
    let columns = request_async(&address, &format!("{}?shard=3/4&dim=1", api::object_url("m", "columns")), &[]).await;
    assert_eq!(columns.body, expected(&[64, 4096], &[0..64, 3072..4096]));
    assert_eq!(gathered(), gathered_before, "runs of 1 KiB and more are sent, not read by the server");
    let narrow = request_async(&address, &format!("{}?shard=1/4&dim=1", api::object_url("m", "narrow")), &[]).await;
    assert_eq!(narrow.body, expected(&[256, 128], &[0..256, 32..64]));
    let read = gathered() - gathered_before;
    assert!(
        read >= narrow.body.len() as f64 && read <= 256.0 * 128.0 * 4.0,
        "short runs are gathered: {read} bytes read"
    );

    let decodes = || metric("ztserve_decodes_started_total", &[]);
    let before = decodes();
    for rank in 0..4 {
        let url = format!("{}?shard={rank}/4&dim=1", api::object_url("m", "frame"));
        let reply = request_async(&address, &url, &[]).await;
        assert_eq!(reply.body, expected(&[256, 1024], &[0..256, rank * 256..(rank + 1) * 256]), "rank {rank}");
    }
    assert_eq!(decodes() - before, 1.0, "one decode of the frame serves every rank");

    // Rows in the last frame decode that frame only; a slice across two frames, those two.
    let url = |spec: &str| format!("{}?slice={spec}", api::object_url("seekable", "positions"));
    let elements = |range: std::ops::Range<u64>| expected(&[3 << 18], std::slice::from_ref(&range));
    let before = decodes();
    let last = request_async(&address, &url("600000:600100"), &[]).await;
    assert_eq!(last.body, elements(600_000..600_100));
    assert_eq!(decodes() - before, 1.0, "one frame of three");
    let across = request_async(&address, &url("262000:263000"), &[]).await;
    assert_eq!(across.body, elements(262_000..263_000));
    assert_eq!(decodes() - before, 3.0, "the first two frames, once each");
}

fn ztensor_seekable() -> &'static str {
    ztserve::format::v2::ZSTD_SEEKABLE
}
