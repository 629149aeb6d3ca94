//! Interop with the official `ztensor` packages, both directions: their files decode to the
//! exact bytes their writers were given, and our files read back identically through 1.2.3.

use crate::common;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use common::run_official;
use ztserve::format::decode::{decode_component, stored_bytes};
use ztserve::format::verify::verify_file;
use ztserve::format::write::{ComponentInput, DigestAlgorithm, ObjectInput, WriteOptions, Writer};
use ztserve::format::{DType, Limits, Value, parse_file};

fn official_file_decodes_to_what_its_writer_was_given(version: &str) {
    let dir = tempfile::tempdir().unwrap();
    run_official(version, &[Path::new("write"), dir.path()]);
    let file = fs::read(dir.path().join("official.zt")).unwrap();
    let expect: serde_json::Value = serde_json::from_slice(&fs::read(dir.path().join("expect.json")).unwrap()).unwrap();
    assert_eq!(expect["version"], version);

    let report = verify_file(&file, &Limits::default());
    assert!(report.is_valid(), "ztensor=={version} file fails verify: {:?}", report.errors);
    let manifest = parse_file(&file, &Limits::default()).unwrap();
    let objects = expect["objects"].as_object().unwrap();
    assert_eq!(manifest.objects.len(), objects.len(), "object count");
    let mut compared = 0;
    for (name, roles) in objects {
        let object = manifest.object(name).unwrap_or_else(|| panic!("object {name:?} missing"));
        assert_eq!(object.components.len(), roles.as_object().unwrap().len(), "{name}: component count");
        for (role, bin) in roles.as_object().unwrap() {
            let expected = fs::read(dir.path().join(bin.as_str().unwrap())).unwrap();
            let component = object.component(role).unwrap_or_else(|| panic!("{name}.{role} missing"));
            let stored = stored_bytes(&file, name, component).unwrap();
            let decoded = decode_component(name, component, stored).unwrap();
            assert!(
                decoded.as_ref() == expected.as_slice(),
                "{name}.{role}: decoded bytes differ from what ztensor=={version} was given"
            );
            compared += 1;
        }
    }
    assert!(compared >= 16, "only {compared} components compared");
}

#[test]
fn files_written_by_ztensor_0_1_4_decode_to_the_bytes_it_was_given() {
    official_file_decodes_to_what_its_writer_was_given("0.1.4");
}

#[test]
fn files_written_by_ztensor_1_1_1_decode_to_the_bytes_it_was_given() {
    official_file_decodes_to_what_its_writer_was_given("1.1.1");
}

#[test]
fn files_written_by_ztensor_1_2_3_decode_to_the_bytes_it_was_given() {
    official_file_decodes_to_what_its_writer_was_given("1.2.3");
}

fn le<T: Copy>(values: &[T], to_le: impl Fn(T) -> Vec<u8>) -> Vec<u8> {
    values.iter().flat_map(|&v| to_le(v)).collect()
}

#[test]
fn files_from_our_writer_read_back_identically_through_ztensor_1_2_3() {
    let f32s = le(&(0..1000).map(|i| i as f32 * 0.5 - 7.0).collect::<Vec<_>>(), |v| v.to_le_bytes().to_vec());
    let i64s = le(&[-5i64, 0, 1 << 40, i64::MIN], |v| v.to_le_bytes().to_vec());
    let bools = vec![1u8, 0, 0, 1, 1];
    let u64s = |v: &[u64]| le(v, |x| x.to_le_bytes().to_vec());
    let csr_values = le(&[1.0f64, 2.0, 3.0], |v| v.to_le_bytes().to_vec());
    let csr_indices = u64s(&[1, 0, 2]);
    let csr_indptr = u64s(&[0, 1, 1, 3]);
    let coo_values = le(&[9i32, 8], |v| v.to_le_bytes().to_vec());
    let coo_coords = u64s(&[0, 2, 1, 0]);
    let packed = le(&(0..32).collect::<Vec<i32>>(), |v| v.to_le_bytes().to_vec());
    let halves = vec![0u8, 60, 0, 56, 0, 52, 0, 48];
    let fp8: Vec<u8> = (0..=255).collect();
    let attributes = Value::Map(vec![
        (Value::Text("bits".into()), Value::Integer(4.into())),
        (Value::Text("nested".into()), Value::Array(vec![Value::Float(0.5), Value::Null, Value::Bool(true)])),
    ]);
    let dense = |name: &'static str, shape: &'static [u64], dtype, logical_type, bytes: &'static [u8]| ObjectInput {
        name,
        shape,
        format: "dense",
        attributes: None,
        components: vec![ComponentInput { role: "data", dtype, logical_type, bytes }],
    };
    // Leak the test data so the object list can borrow it with 'static names.
    let f32s: &'static [u8] = f32s.leak();
    let i64s: &'static [u8] = i64s.leak();
    let bools: &'static [u8] = bools.leak();
    let fp8: &'static [u8] = fp8.leak();
    let objects = vec![
        (dense("weights", &[10, 100], DType::F32, None, f32s), WriteOptions::default()),
        (
            dense("weights.zstd", &[1000], DType::F32, None, f32s),
            WriteOptions { zstd_level: Some(9), digest: Some(DigestAlgorithm::Sha256) },
        ),
        (
            dense("ints", &[2, 2], DType::I64, None, i64s),
            WriteOptions { zstd_level: None, digest: Some(DigestAlgorithm::Crc32c) },
        ),
        (dense("flags", &[5], DType::Bool, None, bools), WriteOptions::default()),
        (dense("scalar", &[], DType::I64, None, &i64s[..8]), WriteOptions::default()),
        (dense("empty", &[0, 3], DType::F32, None, &[]), WriteOptions::default()),
        (dense("fp8", &[256], DType::U8, Some("f8_e5m2"), fp8), WriteOptions { zstd_level: Some(1), digest: None }),
        (dense("名前 with/slash", &[3], DType::U8, None, &fp8[..3]), WriteOptions::default()),
        (
            ObjectInput {
                name: "csr",
                shape: &[3, 3],
                format: "sparse_csr",
                attributes: None,
                components: vec![
                    ComponentInput { role: "values", dtype: DType::F64, logical_type: None, bytes: &csr_values },
                    ComponentInput { role: "indices", dtype: DType::U64, logical_type: None, bytes: &csr_indices },
                    ComponentInput { role: "indptr", dtype: DType::U64, logical_type: None, bytes: &csr_indptr },
                ],
            },
            WriteOptions { zstd_level: Some(3), digest: Some(DigestAlgorithm::Sha256) },
        ),
        (
            ObjectInput {
                name: "coo",
                shape: &[2, 3],
                format: "sparse_coo",
                attributes: None,
                components: vec![
                    ComponentInput { role: "values", dtype: DType::I32, logical_type: None, bytes: &coo_values },
                    ComponentInput { role: "coords", dtype: DType::U64, logical_type: None, bytes: &coo_coords },
                ],
            },
            WriteOptions::default(),
        ),
        (
            ObjectInput {
                name: "quant",
                shape: &[8, 32],
                format: "quantized_group",
                attributes: Some(attributes),
                components: vec![
                    ComponentInput { role: "packed_weight", dtype: DType::I32, logical_type: None, bytes: &packed },
                    ComponentInput { role: "scales", dtype: DType::F16, logical_type: None, bytes: &halves },
                    ComponentInput { role: "zeros", dtype: DType::F16, logical_type: None, bytes: &halves },
                ],
            },
            WriteOptions { zstd_level: None, digest: Some(DigestAlgorithm::Crc32c) },
        ),
        (
            ObjectInput {
                name: "custom",
                shape: &[4],
                format: "x_vendor.table",
                attributes: None,
                components: vec![ComponentInput {
                    role: "table",
                    dtype: DType::U8,
                    logical_type: None,
                    bytes: &fp8[..4],
                }],
            },
            WriteOptions::default(),
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ours.zt");
    let mut writer = Writer::new(Vec::new()).unwrap();
    let mut expected: BTreeMap<String, BTreeMap<String, Vec<u8>>> = BTreeMap::new();
    for (object, options) in &objects {
        writer.add(object, options).unwrap();
        for c in &object.components {
            expected.entry(object.name.to_owned()).or_default().insert(c.role.to_owned(), c.bytes.to_vec());
        }
    }
    let file_attributes = Value::Map(vec![(Value::Text("framework".into()), Value::Text("test".into()))]);
    fs::write(&path, writer.finish(Some(file_attributes)).unwrap()).unwrap();

    let out = dir.path().join("read");
    run_official("1.2.3", &[Path::new("read"), &path, &out]);
    let listing: serde_json::Value = serde_json::from_slice(&fs::read(out.join("read.json")).unwrap()).unwrap();
    let listing = listing.as_object().unwrap();
    assert_eq!(listing.len(), expected.len(), "ztensor 1.2.3 sees a different number of objects");
    for (object, _) in &objects {
        let seen = &listing[object.name];
        assert_eq!(seen["format"], object.format, "{}: format", object.name);
        assert_eq!(seen["shape"], serde_json::json!(object.shape), "{}: shape", object.name);
        for (role, bytes) in &expected[object.name] {
            let bin = seen["components"][role].as_str().unwrap_or_else(|| panic!("{}.{role} not read", object.name));
            let read = fs::read(out.join(bin)).unwrap();
            assert!(&read == bytes, "{}.{role}: ztensor 1.2.3 read different bytes", object.name);
        }
    }
}
