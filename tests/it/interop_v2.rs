//! Interop with the official `ztensor` 2.x (the v2 container), over HTTP: files its writer
//! makes (canonical, 4 KiB-aligned, seekable zstd with a part of 64 MiB and more, an appended
//! generation, every dtype and logical type, a CSR and a group-quantized object) are served from
//! a local directory and from S3, and every component ztserve sends is the bytes
//! `ztensor.open` returns for it.

use crate::common;

use std::fs;
use std::path::Path;

use common::{ModelSource, request_async, run_official_v2, serve};
use ztserve::api;
use ztserve::config::Config;

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

    let listing = request_async(&address, "/models", &[]).await.json();
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
                let reply = request_async(&address, &api::component_url(id, object, part), &[]).await;
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
        let reply = request_async(&address, &url, &[("range", &format!("bytes={start}-{end}"))]).await;
        assert_eq!(reply.status, 206, "{}: bytes={start}-{end}", source.kind());
        assert!(reply.body == big[start as usize..=end as usize], "{}: bytes={start}-{end} differ", source.kind());
    }
    // A client that accepts zstd is sent the stored stream, which any zstd decoder reads whole.
    let reply = request_async(&address, &url, &[("accept-encoding", "zstd")]).await;
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

/// `ztserve convert --format v2` (raw, and seekable with `--compress zstd`) writes files the
/// official 2.1.2 reader opens to exactly the safetensors input's tensors, dtypes, logical types
/// and metadata; the same input gives the same bytes.
#[test]
fn convert_writes_v2_that_ztensor_2_1_2_reads_identically() {
    use safetensors::tensor::{Dtype, TensorView, serialize_to_file};
    let dir = tempfile::tempdir().unwrap();
    let f32s: Vec<u8> = (0..12).flat_map(|i| (i as f32 * 0.25).to_le_bytes()).collect();
    let bf16: Vec<u8> = (0..16u8).collect();
    let fp8: Vec<u8> = (0..5u8).map(|i| i * 40).collect();
    let bools = vec![1u8, 0, 1];
    let i64s: Vec<u8> = [-3i64, 1 << 40].iter().flat_map(|v| v.to_le_bytes()).collect();
    let tensors = vec![
        ("model.weight", Dtype::F32, vec![3usize, 4], &f32s, "f32", None),
        ("model.bf16", Dtype::BF16, vec![8], &bf16, "bf16", None),
        ("model.fp8", Dtype::F8_E5M2, vec![5], &fp8, "u8", Some("f8_e5m2")),
        ("model.mask", Dtype::BOOL, vec![3], &bools, "u8", Some("bool")),
        ("model.step", Dtype::I64, vec![2], &i64s, "i64", None),
    ];
    let input = dir.path().join("model.safetensors");
    let views: Vec<(&str, TensorView<'_>)> = tensors
        .iter()
        .map(|(name, dtype, shape, bytes, ..)| (*name, TensorView::new(*dtype, shape.clone(), bytes).unwrap()))
        .collect();
    let metadata = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    serialize_to_file(views, Some(metadata), &input).unwrap();

    for compress in ["none", "zstd"] {
        let output = dir.path().join(format!("model-{compress}.zt"));
        let convert = std::process::Command::new(env!("CARGO_BIN_EXE_ztserve"))
            .args(["convert", "--format", "v2", "--compress", compress])
            .arg(&input)
            .arg(&output)
            .output()
            .unwrap();
        assert!(convert.status.success(), "{}", String::from_utf8_lossy(&convert.stderr));
        let read = dir.path().join(format!("read-{compress}"));
        fs::create_dir(&read).unwrap();
        run_official_v2("2.1.2", &[Path::new("read"), &output, &read]);
        let listing: serde_json::Value = serde_json::from_slice(&fs::read(read.join("read.json")).unwrap()).unwrap();
        assert_eq!(listing["attributes"], serde_json::json!({"format": "pt"}), "{compress}");
        assert_eq!(listing["objects"].as_object().unwrap().len(), tensors.len());
        for (name, _, shape, bytes, dtype, logical) in &tensors {
            let object = &listing["objects"][name];
            assert_eq!(object["shape"], serde_json::json!(shape), "{compress}: {name}");
            let part = &object["parts"]["data"];
            assert_eq!((part["dtype"].as_str(), part["type"].as_str()), (Some(*dtype), *logical), "{compress}: {name}");
            let read_bytes = fs::read(read.join(part["bin"].as_str().unwrap())).unwrap();
            assert!(&read_bytes == *bytes, "{compress}: {name}: ztensor.open reads other bytes");
        }
        let parsed = ztserve::format::parse_file(&fs::read(&output).unwrap(), &Default::default()).unwrap();
        let encoding = parsed.objects[0].components[0].encoding.name().to_owned();
        assert_eq!(encoding, if compress == "zstd" { "zt.zstd-seekable/1" } else { "raw" });
        let again = dir.path().join(format!("again-{compress}.zt"));
        let convert = std::process::Command::new(env!("CARGO_BIN_EXE_ztserve"))
            .args(["convert", "--format", "v2", "--compress", compress])
            .arg(&input)
            .arg(&again)
            .output()
            .unwrap();
        assert!(convert.status.success());
        assert_eq!(fs::read(&again).unwrap(), fs::read(&output).unwrap(), "{compress}: same input, same bytes");
    }
}

/// `ztserve convert --format v2` upgrades the files the official 0.1.4, 1.1.1 and 1.2.3
/// writers write (every dtype they have, zstd, bool, fp8 and complex types, sparse and
/// quantized objects, a custom format), which `ztensor` 2.x cannot open, to v2 files that
/// 2.1.2's `ztensor.open` reads to exactly the bytes each writer was given, raw and seekable.
/// A name v2 cannot hold (1.2.3 writes an object named "") is refused by name, leaving no file.
#[test]
fn convert_upgrades_official_0_1_and_1_x_files_to_v2_that_ztensor_2_1_2_reads_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let convert = |input: &Path, output: &Path, compress: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_ztserve"))
            .args(["convert", "--format", "v2", "--compress", compress])
            .arg(input)
            .arg(output)
            .output()
            .unwrap()
    };
    let unnamed = dir.path().join("unnamed");
    fs::create_dir(&unnamed).unwrap();
    common::run_official("1.2.3", &[Path::new("write"), &unnamed]);
    let refused = convert(&unnamed.join("official.zt"), &dir.path().join("unnamed.zt"), "none");
    let message = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{message}");
    assert!(message.contains("object \"\"") && message.contains("invalid name"), "{message}");
    assert!(!dir.path().join("unnamed.zt").exists(), "a refused conversion leaves no file");

    for version in ["0.1.4", "1.1.1", "1.2.3"] {
        let written = dir.path().join(version);
        fs::create_dir(&written).unwrap();
        common::run_official(version, &[Path::new("write"), &written, Path::new("v2-names")]);
        let expect: serde_json::Value =
            serde_json::from_slice(&fs::read(written.join("expect.json")).unwrap()).unwrap();
        for compress in ["none", "zstd"] {
            let output = dir.path().join(format!("{version}-{compress}.zt"));
            let converted = convert(&written.join("official.zt"), &output, compress);
            assert!(converted.status.success(), "{version}: {}", String::from_utf8_lossy(&converted.stderr));
            let read = dir.path().join(format!("read-{version}-{compress}"));
            fs::create_dir(&read).unwrap();
            run_official_v2("2.1.2", &[Path::new("read"), &output, &read]);
            let listing: serde_json::Value =
                serde_json::from_slice(&fs::read(read.join("read.json")).unwrap()).unwrap();
            let objects = expect["objects"].as_object().unwrap();
            assert_eq!(listing["objects"].as_object().unwrap().len(), objects.len(), "{version} {compress}");
            for (name, roles) in objects {
                for (role, bin) in roles.as_object().unwrap() {
                    let part = &listing["objects"][name]["parts"][role];
                    let at = format!("{version} {compress}: {name:?} {role}");
                    assert!(part.is_object(), "{at}: not in the v2 file: {}", listing["objects"][name]);
                    let given = fs::read(written.join(bin.as_str().unwrap())).unwrap();
                    let read_back = fs::read(read.join(part["bin"].as_str().unwrap())).unwrap();
                    assert!(read_back == given, "{at}: ztensor 2.1.2 reads other bytes than the writer was given");
                }
            }
        }
    }
}
