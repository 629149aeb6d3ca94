//! The `ztserve` binary's file subcommands, run as a user would.

use crate::common;

use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use ztserve::format::write::{ComponentInput, ObjectInput, WriteOptions, Writer};
use ztserve::format::{DType, Encoding, Limits, parse_file};

fn ztserve(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ztserve")).args(args.iter().map(|a| a.as_ref())).output().unwrap()
}

fn sample(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("sample.zt");
    let mut w = Writer::new(Vec::new()).unwrap();
    let data: Vec<u8> = (0..24u8).collect();
    w.add(
        &ObjectInput {
            name: "w",
            shape: &[2, 3],
            format: "dense",
            attributes: None,
            components: vec![ComponentInput { role: "data", dtype: DType::F32, logical_type: None, bytes: &data }],
        },
        &WriteOptions { zstd_level: Some(3), digest: Some(ztserve::format::write::DigestAlgorithm::Sha256) },
    )
    .unwrap();
    w.add(
        &ObjectInput {
            name: "q\nname",
            shape: &[4],
            format: "quantized_group",
            attributes: None,
            components: vec![
                ComponentInput { role: "packed_weight", dtype: DType::I32, logical_type: None, bytes: &data[..8] },
                ComponentInput { role: "scales", dtype: DType::F16, logical_type: None, bytes: &data[..2] },
                ComponentInput { role: "zeros", dtype: DType::F16, logical_type: None, bytes: &data[2..4] },
            ],
        },
        &WriteOptions::default(),
    )
    .unwrap();
    fs::write(&path, w.finish(None).unwrap()).unwrap();
    path
}

#[test]
fn inspect_prints_version_and_a_table_of_objects_with_control_characters_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let out = ztserve(&[&"inspect", &sample(dir.path())]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("version:    1.2.0"), "{text}");
    assert!(text.contains("\"q\\nname\""), "names with newlines are escaped: {text}");
    assert!(text.contains("zstd") && text.contains("packed_weight"));
}

#[test]
fn inspect_json_is_the_whole_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let out = ztserve(&[&"inspect", &sample(dir.path()), &"--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["version"], "1.2.0");
    assert_eq!(json["objects"][0]["components"][0]["decoded_length"], 24);
    assert!(json["objects"][0]["components"][0]["digest"].as_str().unwrap().starts_with("sha256:"));
}

#[test]
fn verify_exits_0_for_a_valid_file_and_1_with_the_reason_for_a_corrupt_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = sample(dir.path());
    let ok = ztserve(&[&"verify", &path]);
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stdout));
    let mut bytes = fs::read(&path).unwrap();
    let m = parse_file(&bytes, &Limits::default()).unwrap();
    bytes[m.objects[0].components[0].offset as usize + 5] ^= 0x40;
    let bad = dir.path().join("bad.zt");
    fs::write(&bad, &bytes).unwrap();
    let out = ztserve(&[&"verify", &bad, &"--json"]);
    assert_eq!(out.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["valid"], false);
    assert_eq!(json["errors"][0]["code"], "digest_mismatch");
    assert!(json["errors"][0]["message"].as_str().unwrap().contains("object \"w\""));
}

#[test]
fn verify_of_a_file_that_is_not_zt_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("junk.zt");
    fs::write(&path, b"hello world, not a tensor file").unwrap();
    let out = ztserve(&[&"verify", &path]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("bad_header_magic"));
}

#[test]
fn cat_writes_decoded_bytes_and_names_the_roles_when_the_component_is_ambiguous() {
    let dir = tempfile::tempdir().unwrap();
    let path = sample(dir.path());
    let out = ztserve(&[&"cat", &path, &"w"]);
    assert!(out.status.success());
    assert_eq!(out.stdout, (0..24u8).collect::<Vec<_>>());
    let out = ztserve(&[&"cat", &path, &"q\nname"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("\"packed_weight\", \"scales\", \"zeros\""), "{err}");
    let out = ztserve(&[&"cat", &path, &"q\nname", &"--component", &"zeros"]);
    assert_eq!(out.stdout, vec![2u8, 3]);
    let out = ztserve(&[&"cat", &path, &"missing"]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn convert_turns_safetensors_into_a_file_with_the_same_tensors() {
    use safetensors::tensor::{Dtype, TensorView, serialize_to_file};
    let dir = tempfile::tempdir().unwrap();
    let f32s: Vec<u8> = (0..12).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let bf16: Vec<u8> = (0..8u8).collect();
    let fp8: Vec<u8> = (0..5u8).collect();
    let tensors = vec![
        ("b.weight", TensorView::new(Dtype::F32, vec![3, 4], &f32s).unwrap()),
        ("a.bf16", TensorView::new(Dtype::BF16, vec![4], &bf16).unwrap()),
        ("c.fp8", TensorView::new(Dtype::F8_E4M3, vec![5], &fp8).unwrap()),
    ];
    let input = dir.path().join("model.safetensors");
    let metadata: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    serialize_to_file(tensors, Some(metadata), &input).unwrap();
    let output = dir.path().join("model.zt");
    let out = ztserve(&[&"convert", &input, &output, &"--compress", &"zstd:5", &"--digest", &"crc32c"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let bytes = fs::read(&output).unwrap();
    let m = parse_file(&bytes, &Limits::default()).unwrap();
    let names: Vec<_> = m.objects.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["a.bf16", "b.weight", "c.fp8"]);
    let fp8_component = m.object("c.fp8").unwrap().component("data").unwrap();
    assert_eq!(fp8_component.logical_type.as_deref(), Some("f8_e4m3fn"));
    assert_eq!(fp8_component.encoding, Encoding::Zstd);
    assert_eq!(
        ztserve::format::json::cbor_to_json(m.attributes.as_ref().unwrap()),
        serde_json::json!({"format": "pt"})
    );
    let cat = ztserve(&[&"cat", &output, &"b.weight"]);
    assert_eq!(cat.stdout, f32s);
    assert_eq!(ztserve(&[&"verify", &output]).status.code(), Some(0));
    // Same input, same bytes.
    let again = dir.path().join("again.zt");
    ztserve(&[&"convert", &input, &again, &"--compress", &"zstd:5", &"--digest", &"crc32c"]);
    assert_eq!(fs::read(&again).unwrap(), bytes);
}

#[test]
fn the_tools_read_a_sharded_safetensors_checkpoint_through_its_index() {
    use safetensors::Dtype;
    let dir = tempfile::tempdir().unwrap();
    let bf16: Vec<u8> = (0..24u8).collect();
    let fp8: Vec<u8> = (100..106u8).collect();
    let mask = [1u8, 0, 1];
    let first: &[common::StTensor<'_>] = &[("layer.0.weight", Dtype::BF16, vec![3, 4], &bf16)];
    let second: &[common::StTensor<'_>] =
        &[("layer.1.weight", Dtype::F8_E4M3, vec![2, 3], &fp8), ("mask", Dtype::BOOL, vec![3], &mask)];
    for (name, bytes) in common::safetensors_checkpoint(&[first, second]) {
        fs::write(dir.path().join(name), bytes).unwrap();
    }
    let index = dir.path().join("model.safetensors.index.json");
    let out = ztserve(&[&"inspect", &index]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("container:  safetensors") && text.contains("f8_e4m3fn"), "{text}");
    assert!(text.contains("\"total_size\":33") && text.contains("\"format\":\"pt\""), "{text}");
    let out = ztserve(&[&"verify", &index]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(ztserve(&[&"cat", &index, &"layer.1.weight"]).stdout, fp8);
    assert_eq!(
        ztserve(&[&"cat", &dir.path().join("model-00001-of-00002.safetensors"), &"layer.0.weight"]).stdout,
        bf16
    );

    for (format, compress) in [("1.2", "zstd"), ("v2", "none")] {
        let output = dir.path().join(format!("out-{format}.zt"));
        let out = ztserve(&[&"convert", &index, &output, &"--format", &format, &"--compress", &compress]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(ztserve(&[&"cat", &output, &"layer.1.weight"]).stdout, fp8, "{format}");
        assert_eq!(ztserve(&[&"cat", &output, &"mask"]).stdout, mask, "{format}");
        assert_eq!(ztserve(&[&"verify", &output]).status.code(), Some(0), "{format}");
    }

    // A tensor moved to the other shard, and a shard gone, each named.
    let (wrong, dir2) = (common::safetensors_checkpoint(&[second, first]), tempfile::tempdir().unwrap());
    fs::write(dir2.path().join("model.safetensors.index.json"), fs::read(&index).unwrap()).unwrap();
    for (name, bytes) in &wrong[1..] {
        fs::write(dir2.path().join(name), bytes).unwrap();
    }
    let out = ztserve(&[&"verify", &"--json", &dir2.path().join("model.safetensors.index.json")]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["errors"][0]["code"], "tensor_in_wrong_shard", "{report}");
    fs::remove_file(dir2.path().join("model-00002-of-00002.safetensors")).unwrap();
    let out = ztserve(&[&"verify", &"--json", &dir2.path().join("model.safetensors.index.json")]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["errors"][0]["code"], "shard_missing", "{report}");
    let out = ztserve(&[&"inspect", &dir2.path().join("model.safetensors.index.json")]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn convert_refuses_bad_options_and_inputs_without_leaving_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("x.safetensors");
    fs::write(&input, b"not safetensors").unwrap();
    let output = dir.path().join("x.zt");
    assert_eq!(ztserve(&[&"convert", &input, &output]).status.code(), Some(1));
    assert_eq!(ztserve(&[&"convert", &input, &output, &"--compress", &"zstd:99"]).status.code(), Some(1));
    assert!(!output.exists());
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file left behind");
}

/// A file with one zstd u8 object "z" holding `data`.
fn zstd_object_file(data: &[u8]) -> Vec<u8> {
    let mut w = Writer::new(Vec::new()).unwrap();
    w.add(
        &ObjectInput {
            name: "z",
            shape: &[data.len() as u64],
            format: "dense",
            attributes: None,
            components: vec![ComponentInput { role: "data", dtype: DType::U8, logical_type: None, bytes: data }],
        },
        &WriteOptions { zstd_level: Some(1), digest: None },
    )
    .unwrap();
    w.finish(None).unwrap()
}

#[test]
fn cat_streams_a_multi_piece_zstd_component_and_fails_on_a_corrupt_one() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..2_000_000u32).map(|i| (i % 251) as u8).collect();
    let good = dir.path().join("good.zt");
    fs::write(&good, zstd_object_file(&data)).unwrap();
    assert_eq!(ztserve(&[&"cat", &good, &"z"]).stdout, data);

    let mut bytes = zstd_object_file(&data);
    let m = parse_file(&bytes, &Limits::default()).unwrap();
    let c = &m.objects[0].components[0];
    // Damage the frame's tail: its checksum no longer matches.
    bytes[(c.offset + c.stored_length - 2) as usize] ^= 0xff;
    let corrupt = dir.path().join("corrupt.zt");
    fs::write(&corrupt, &bytes).unwrap();
    let out = ztserve(&[&"cat", &corrupt, &"z"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("zstd"), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout.len() <= data.len());
}

#[test]
fn the_committed_demo_models_are_exactly_what_write_demo_writes() {
    let dir = tempfile::tempdir().unwrap();
    let out = ztserve(&[&"write-demo", &dir.path()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
    let mut total = 0;
    for name in [
        "demo/dense.zt",
        "demo/structured.zt",
        "v2/seekable.zt",
        "v2/sharded.zt",
        "v2/sharded-00001-of-00002.zt",
        "v2/sharded-00002-of-00002.zt",
        "hf/tiny-llama/model.safetensors.index.json",
        "hf/tiny-llama/model-00001-of-00002.safetensors",
        "hf/tiny-llama/model-00002-of-00002.safetensors",
        "gguf/tiny/tiny-F16.gguf",
        "gguf/tiny/tiny-Q8_0.gguf",
    ] {
        let fresh = fs::read(dir.path().join(name)).unwrap();
        assert_eq!(fs::read(committed.join(name)).unwrap(), fresh, "models/{name}: run `ztserve write-demo models`");
        if !name.contains("-of-") {
            // A root (or a checkpoint's index) is verified with its shards, found beside it.
            let out = ztserve(&[&"verify", &committed.join(name)]);
            assert_eq!(out.status.code(), Some(0), "{name}: {}", String::from_utf8_lossy(&out.stdout));
        }
        total += fresh.len();
    }
    let files = |root: &Path| -> usize {
        fs::read_dir(root).unwrap().map(|d| fs::read_dir(d.unwrap().path()).unwrap().count()).sum()
    };
    assert_eq!(files(&committed), files(dir.path()), "models/ holds exactly what write-demo writes");
    assert!(total < 2 << 20, "demo models must stay under 2 MiB");
}

/// `convert` takes any file ztserve reads, to either generation: each demo model (a 1.2 file
/// with sparse and quantized objects, a seekable v2 file, a v2 root with shards found beside
/// it, a sharded safetensors checkpoint) converted to 1.2 and to v2 gives every component as
/// `cat` gives it from the source, and `verify` passes on what it wrote.
#[test]
fn convert_takes_every_demo_model_to_either_generation_with_the_same_components() {
    let dir = tempfile::tempdir().unwrap();
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
    let inputs = [
        demo.join("demo/dense.zt"),
        demo.join("demo/structured.zt"),
        demo.join("v2/seekable.zt"),
        demo.join("v2/sharded.zt"),
        demo.join("hf/tiny-llama/model.safetensors.index.json"),
    ];
    for input in &inputs {
        let out = ztserve(&[&"inspect", &"--json", input]);
        assert!(out.status.success(), "{}: {}", input.display(), String::from_utf8_lossy(&out.stderr));
        let inspected: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let objects = inspected["objects"].as_array().unwrap();
        for (format, compress) in [("1.2", "zstd"), ("v2", "none"), ("v2", "zstd")] {
            let output = dir.path().join(format!("{}-{format}-{compress}.zt", objects.len()));
            let out = ztserve(&[&"convert", input, &output, &"--format", &format, &"--compress", &compress]);
            let at = format!("{} to {format} {compress}", input.display());
            // 1.2 has no f8_e8m0 or f4 types: such a model is refused by name, as v2 is its target.
            if !out.status.success() {
                let message = String::from_utf8_lossy(&out.stderr);
                assert!(format == "1.2" && message.contains("--format v2 has it"), "{at}: {message}");
                assert!(!output.exists(), "{at}: a refused conversion leaves no file");
                continue;
            }
            assert_eq!(ztserve(&[&"verify", &output]).status.code(), Some(0), "{at}");
            for object in objects {
                let name = object["name"].as_str().unwrap();
                for component in object["components"].as_array().unwrap() {
                    let role = component["role"].as_str().unwrap();
                    let from = ztserve(&[&"cat", input, &name, &"--component", &role]);
                    let to = ztserve(&[&"cat", &output, &name, &"--component", &role]);
                    assert!(from.status.success(), "{at}: cat {name} {role}");
                    assert!(to.status.success(), "{at}: {name} {role}: {}", String::from_utf8_lossy(&to.stderr));
                    assert!(from.stdout == to.stdout, "{at}: {name} {role} differs");
                }
            }
            fs::remove_file(&output).unwrap();
        }
    }
}
