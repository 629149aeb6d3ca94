//! Interop with the official `ztensor` 2.x (the v2 container), over HTTP: files its writer
//! makes (canonical, 4 KiB-aligned, seekable zstd with a part of 64 MiB and more, an appended
//! generation, every dtype and logical type, a CSR and a group-quantized object) are served from
//! a local directory and from S3, and every component ztserve sends is the bytes
//! `ztensor.open` returns for it.

mod common;

use std::fs;
use std::path::Path;

use common::{ModelSource, Reply, request, run_official_v2, serve};
use ztserve::api;
use ztserve::config::Config;

/// [`request`] off the test's runtime.
async fn ask(address: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    let (address, path) = (address.to_owned(), path.to_owned());
    let headers: Vec<(String, String)> = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    tokio::task::spawn_blocking(move || {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        request(&address, &path, &headers)
    })
    .await
    .unwrap()
}

async fn every_part_is_served_as_the_official_reader_reads_it(source: ModelSource) {
    let dir = tempfile::tempdir().unwrap();
    run_official_v2("2.1.2", &[Path::new("write"), dir.path()]);
    let expect: serde_json::Value = serde_json::from_slice(&fs::read(dir.path().join("expect.json")).unwrap()).unwrap();
    assert_eq!(expect["version"], "2.1.2");
    let files = expect["files"].as_object().unwrap();
    for file in files.keys() {
        source.put(file, &fs::read(dir.path().join(file)).unwrap()).await;
    }
    let (address, _state) = serve(source.config(Config::default())).await;

    let listing = ask(&address, "/models", &[]).await.json();
    for model in listing["models"].as_array().unwrap() {
        assert_eq!(model["status"], "ok", "{}: {model}", source.kind());
        assert_eq!(model["container"], "zt-2");
        assert_eq!(model["files"], 1);
    }
    let mut compared = 0;
    for (file, objects) in files {
        let id = file.strip_suffix(".zt").unwrap();
        for (object, parts) in objects.as_object().unwrap() {
            for (part, bin) in parts.as_object().unwrap() {
                let expected = fs::read(dir.path().join(bin.as_str().unwrap())).unwrap();
                let reply = ask(&address, &api::component_url(id, object, part), &[]).await;
                assert_eq!(
                    reply.status,
                    200,
                    "{}: {id}/{object}/{part}: {}",
                    source.kind(),
                    String::from_utf8_lossy(&reply.body)
                );
                assert!(reply.body == expected, "{}: {id}/{object}/{part}: bytes differ", source.kind());
                compared += 1;
            }
        }
    }
    assert_eq!(compared, 77, "parts compared");

    // The large seekable part: ranges anywhere, across frame boundaries, and to its end.
    let big = fs::read(dir.path().join(files["seekable.zt"]["big"]["data"].as_str().unwrap())).unwrap();
    let url = api::component_url("seekable", "big", "data");
    let len = big.len() as u64;
    for (start, end) in [
        (0, 0),
        (1 << 20, (1 << 20) + 99),
        ((1 << 20) - 5, (1 << 20) + 5),
        (len - 4000, len - 1),
        (12_345_678, 40_000_000),
    ] {
        let reply = ask(&address, &url, &[("range", &format!("bytes={start}-{end}"))]).await;
        assert_eq!(reply.status, 206, "{}: bytes={start}-{end}", source.kind());
        assert!(reply.body == big[start as usize..=end as usize], "{}: bytes={start}-{end} differ", source.kind());
    }
    // A client that accepts zstd is sent the stored stream, which any zstd decoder reads whole.
    let reply = ask(&address, &url, &[("accept-encoding", "zstd")]).await;
    assert_eq!(reply.header("content-encoding"), Some("zstd"));
    assert!(zstd::decode_all(&reply.body[..]).unwrap() == big, "the passed-through stream decodes to the part");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_v2_files_are_served_from_a_local_directory_as_ztensor_open_reads_them() {
    every_part_is_served_as_the_official_reader_reads_it(ModelSource::local()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_v2_files_are_served_from_s3_as_ztensor_open_reads_them() {
    every_part_is_served_as_the_official_reader_reads_it(ModelSource::s3()).await;
}
