//! One test per validation, decoding and digest rule of the format, each on a hand-built file.

use crate::common;

use common::*;
use ztserve::format::decode::{decode_component, stored_bytes, verify_digest};
use ztserve::format::verify::verify_file;
use ztserve::format::{ByteOrder, Digest, FormatError, Limits, Value, parse_file};

fn parse(file: &[u8]) -> Result<ztserve::format::Manifest, FormatError> {
    parse_file(file, &Limits::default())
}

/// The code of the error a file fails with.
fn code(file: &[u8]) -> &'static str {
    match parse(file) {
        Ok(_) => "ok",
        Err(e) => {
            // Every message names something useful; none is empty.
            assert!(!e.to_string().is_empty());
            e.code()
        }
    }
}

fn dense_f32(name: &str, shape: Vec<u64>, offset: u64, length: u64) -> Vec<u8> {
    let m = manifest(vec![(name, shape, "dense", vec![("data", map(component("f32", offset, length)))])]);
    v1_file(&data_region(2, 0), &cbor(&m))
}

#[test]
fn a_minimal_valid_file_parses() {
    let m = parse(&dense_f32("w", vec![2, 4], 64, 32)).unwrap();
    assert_eq!(m.objects[0].components[0].decoded_length, 32);
}

#[test]
fn bad_header_magic_is_refused() {
    let mut file = dense_f32("w", vec![2], 64, 8);
    file[0] = b'X';
    assert_eq!(code(&file), "bad_header_magic");
}

#[test]
fn a_1x_body_behind_the_v2_magic_is_read_by_the_v2_rules() {
    let mut file = dense_f32("w", vec![2], 64, 8);
    file[..8].copy_from_slice(b"\x89ZT2\r\n\x1a\n");
    assert_eq!(code(&file), "bad_footer_magic");
}

#[test]
fn bad_footer_magic_is_refused() {
    let mut file = dense_f32("w", vec![2], 64, 8);
    let n = file.len();
    file[n - 1] = b'1';
    assert_eq!(code(&file), "bad_footer_magic");
}

#[test]
fn truncated_files_are_refused() {
    assert_eq!(code(b"ZTEN1000\x01\0\0\0\0\0\0\0ZTEN1000"), "truncated");
    assert_eq!(code(b"ZTEN00"), "truncated");
    assert_eq!(code(b""), "truncated");
    // A file cut short loses its footer.
    let file = dense_f32("w", vec![2], 64, 8);
    assert_eq!(code(&file[..file.len() - 3]), "bad_footer_magic");
}

#[test]
fn a_zero_manifest_size_is_refused() {
    let mut file = b"ZTEN1000\x80".to_vec();
    file.extend_from_slice(&0u64.to_le_bytes());
    file.extend_from_slice(b"ZTEN1000");
    assert_eq!(code(&file), "manifest_empty");
}

#[test]
fn a_manifest_size_over_the_limit_is_refused() {
    let file = dense_f32("w", vec![2], 64, 8);
    let small = Limits { max_manifest_bytes: 16, ..Limits::default() };
    assert_eq!(parse_file(&file, &small).unwrap_err().code(), "manifest_too_large");
    let mut huge = file.clone();
    let n = huge.len();
    huge[n - 16..n - 8].copy_from_slice(&(2u64 << 30).to_le_bytes());
    assert_eq!(code(&huge), "manifest_too_large");
}

#[test]
fn a_manifest_size_beyond_the_file_is_refused() {
    let mut file = dense_f32("w", vec![2], 64, 8);
    let n = file.len();
    file[n - 16..n - 8].copy_from_slice(&(n as u64).to_le_bytes());
    assert_eq!(code(&file), "manifest_beyond_file");
}

#[test]
fn invalid_cbor_is_refused() {
    assert_eq!(code(&v1_file(&[], &[0xa1, 0x1c, 0x00])), "cbor_invalid");
}

#[test]
fn cbor_nested_too_deep_is_refused() {
    let mut deep = vec![0x81u8; 500];
    deep.push(0);
    assert_eq!(code(&v1_file(&[], &deep)), "cbor_too_deep");
}

#[test]
fn cbor_lengths_larger_than_the_input_are_refused() {
    assert_eq!(code(&v1_file(&[], &[0x7b, 0, 0, 0, 1, 0, 0, 0, 0])), "cbor_length_beyond_input");
}

#[test]
fn trailing_bytes_after_the_manifest_are_refused() {
    let m = manifest(vec![]);
    let mut bytes = cbor(&m);
    bytes.push(0);
    assert_eq!(code(&v1_file(&[], &bytes)), "cbor_trailing_bytes");
}

#[test]
fn duplicate_keys_are_refused() {
    // {"version": "1.2.0", "objects": {}, "objects": {}}
    let mut bytes = vec![0xa3];
    bytes.extend(cbor(&text("version")));
    bytes.extend(cbor(&text("1.2.0")));
    for _ in 0..2 {
        bytes.extend(cbor(&text("objects")));
        bytes.push(0xa0);
    }
    assert_eq!(code(&v1_file(&[], &bytes)), "duplicate_key");
}

#[test]
fn a_manifest_of_the_wrong_shape_is_refused() {
    assert_eq!(code(&v1_file(&[], &cbor(&Value::Array(vec![])))), "wrong_shape");
    let objects_not_map = map(vec![("version", text("1.2.0")), ("objects", Value::Array(vec![]))]);
    assert_eq!(code(&v1_file(&[], &cbor(&objects_not_map))), "wrong_shape");
    let shape_not_array = manifest(vec![("w", vec![], "dense", vec![("data", map(component("f32", 64, 0)))])]);
    let mut bytes = cbor(&shape_not_array);
    // Legacy container with a map index is also the wrong shape.
    assert_eq!(code(&legacy_file(&[], &bytes)), "wrong_shape");
    bytes.clear();
}

#[test]
fn missing_required_fields_are_refused() {
    assert_eq!(code(&v1_file(&[], &cbor(&map(vec![("objects", map(vec![]))])))), "missing_field");
    assert_eq!(code(&v1_file(&[], &cbor(&map(vec![("version", text("1.2.0"))])))), "missing_field");
    let no_offset =
        manifest(vec![("w", vec![0], "dense", vec![("data", map(vec![("dtype", text("f32")), ("length", uint(0))]))])]);
    match parse(&v1_file(&[], &cbor(&no_offset))) {
        Err(FormatError::MissingField { context, field }) => {
            assert_eq!(field, "offset");
            assert!(context.contains("\"w\"") && context.contains("\"data\""), "{context}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn unknown_dtypes_are_refused() {
    let m = manifest(vec![("w", vec![2], "dense", vec![("data", map(component("f128", 64, 32)))])]);
    assert_eq!(code(&v1_file(&data_region(2, 0), &cbor(&m))), "unknown_dtype");
}

#[test]
fn the_1_1_compound_dtype_names_are_read_only_in_manifests_that_declare_1_1() {
    for (version, expected) in
        [("1.1.0", "ok"), ("1.1.7", "ok"), ("1.2.0", "unknown_dtype"), ("1.3.0", "unknown_dtype")]
    {
        let mut m = manifest(vec![("w", vec![8], "dense", vec![("data", map(component("f8_e4m3", 64, 8)))])]);
        let Value::Map(fields) = &mut m else { unreachable!() };
        fields[0].1 = text(version);
        assert_eq!(code(&v1_file(&data_region(2, 0), &cbor(&m))), expected, "f8_e4m3 in a {version} manifest");
    }
}

#[test]
fn unknown_encodings_are_refused() {
    let mut c = component("f32", 64, 8);
    c.push(("encoding", text("lz4")));
    let m = manifest(vec![("w", vec![2], "dense", vec![("data", map(c))])]);
    assert_eq!(code(&v1_file(&data_region(2, 0), &cbor(&m))), "unknown_encoding");
}

#[test]
fn negative_float_and_tagged_integers_are_refused_where_unsigned_belong() {
    for bad in [Value::Integer((-64).into()), Value::Float(64.0), Value::Tag(2, Box::new(Value::Bytes(vec![64])))] {
        let c = vec![("dtype", text("f32")), ("offset", bad), ("length", uint(8))];
        let m = manifest(vec![("w", vec![2], "dense", vec![("data", map(c))])]);
        assert_eq!(code(&v1_file(&data_region(2, 0), &cbor(&m))), "not_unsigned");
    }
    let m = map(vec![
        ("version", text("1.2.0")),
        (
            "objects",
            map(vec![(
                "w",
                map(vec![
                    ("shape", Value::Array(vec![Value::Integer((-1).into())])),
                    ("format", text("x")),
                    ("components", map(vec![])),
                ]),
            )]),
        ),
    ]);
    assert_eq!(code(&v1_file(&[], &cbor(&m))), "not_unsigned");
}

#[test]
fn offsets_not_a_multiple_of_64_are_refused() {
    assert_eq!(code(&dense_f32("w", vec![2], 72, 8)), "misaligned");
}

#[test]
fn offset_plus_length_overflowing_is_refused() {
    assert_eq!(code(&dense_f32("w", vec![2], 64, u64::MAX - 10)), "range_overflow");
}

#[test]
fn components_running_into_the_manifest_are_refused() {
    assert_eq!(code(&dense_f32("w", vec![32], 64, 128)), "range_into_manifest");
}

#[test]
fn components_overlapping_the_header_are_refused() {
    assert_eq!(code(&dense_f32("w", vec![2], 0, 8)), "range_into_header");
}

#[test]
fn partially_overlapping_components_are_refused_but_identical_and_empty_ones_are_allowed() {
    let two = |second_offset: u64, second_len: u64| {
        let m = manifest(vec![
            ("a", vec![16], "dense", vec![("data", map(component("u8", 64, 16)))]),
            ("b", vec![second_len], "dense", vec![("data", map(component("u8", second_offset, second_len)))]),
        ]);
        v1_file(&data_region(3, 0), &cbor(&m))
    };
    match parse(&two(64, 8)) {
        Err(FormatError::Overlap { first, second, .. }) => {
            assert_eq!((&*first.object, &*second.object), ("b", "a"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(code(&two(64, 16)), "ok", "identical ranges share storage");
    assert_eq!(code(&two(64, 0)), "ok", "zero-length blobs share the next blob's offset");
    assert_eq!(code(&two(128, 16)), "ok");
}

#[test]
fn raw_length_not_matching_the_shape_is_refused() {
    assert_eq!(code(&dense_f32("w", vec![3], 64, 8)), "length_mismatch");
    assert_eq!(code(&dense_f32("w", vec![], 64, 8)), "length_mismatch");
}

#[test]
fn component_lengths_not_a_multiple_of_the_dtype_width_are_refused() {
    let m = manifest(vec![(
        "q",
        vec![4],
        "quantized_group",
        vec![
            ("packed_weight", map(component("i32", 64, 6))),
            ("scales", map(component("f16", 128, 2))),
            ("zeros", map(component("f16", 192, 2))),
        ],
    )]);
    assert_eq!(code(&v1_file(&data_region(5, 0), &cbor(&m))), "length_not_multiple");
}

#[test]
fn shape_products_that_overflow_are_refused() {
    assert_eq!(code(&dense_f32("w", vec![1 << 32, 1 << 32], 64, 8)), "shape_overflow");
    // Fits as an element count but overflows once multiplied by the width.
    assert_eq!(code(&dense_f32("w", vec![1 << 62], 64, 8)), "shape_overflow");
}

#[test]
fn decoded_sizes_above_the_limit_are_refused() {
    let mut c = component("f32", 64, 8);
    c.push(("encoding", text("zstd")));
    c.push(("uncompressed_length", uint(1 << 40)));
    let m = manifest(vec![("w", vec![1 << 38], "dense", vec![("data", map(c))])]);
    let file = v1_file(&data_region(2, 0), &cbor(&m));
    let limits = Limits { max_decoded_bytes: 1 << 30, ..Limits::default() };
    assert_eq!(parse_file(&file, &limits).unwrap_err().code(), "decoded_too_large");
}

#[test]
fn required_components_missing_are_refused_for_each_well_known_format() {
    for (format, present) in [
        ("dense", vec![("other", map(component("u8", 64, 1)))]),
        ("sparse_csr", vec![("values", map(component("f32", 64, 4))), ("indices", map(component("u64", 128, 8)))]),
        ("sparse_coo", vec![("values", map(component("f32", 64, 4)))]),
        (
            "quantized_group",
            vec![("packed_weight", map(component("i32", 64, 4))), ("scales", map(component("f16", 128, 2)))],
        ),
    ] {
        let m = manifest(vec![("x", vec![1, 1], format, present)]);
        assert_eq!(code(&v1_file(&data_region(4, 0), &cbor(&m))), "missing_component", "{format}");
    }
}

#[test]
fn a_version_whose_major_is_not_1_is_refused_in_a_zten1000_container() {
    for version in ["2.0.0", "0.1.0", "", "one"] {
        let m = map(vec![("version", text(version)), ("objects", map(vec![]))]);
        assert_eq!(code(&v1_file(&[], &cbor(&m))), "unsupported_version", "{version:?}");
    }
    let m = map(vec![("version", text("1.9.7")), ("objects", map(vec![]))]);
    assert_eq!(code(&v1_file(&[], &cbor(&m))), "ok", "minor versions only add optional fields");
}

#[test]
fn sparse_index_components_must_be_u64() {
    let m = manifest(vec![(
        "s",
        vec![1, 1],
        "sparse_coo",
        vec![("values", map(component("f32", 64, 4))), ("coords", map(component("u32", 128, 8)))],
    )]);
    assert_eq!(code(&v1_file(&data_region(3, 0), &cbor(&m))), "sparse_index_dtype");
}

#[test]
fn a_known_logical_type_over_the_wrong_dtype_is_refused() {
    let mut c = component("f32", 64, 8);
    c.push(("type", text("f8_e4m3fn")));
    let m = manifest(vec![("w", vec![2], "dense", vec![("data", map(c))])]);
    assert_eq!(code(&v1_file(&data_region(2, 0), &cbor(&m))), "logical_type_mismatch");
}

#[test]
fn malformed_digests_are_refused() {
    for digest in ["crc32c:1234", "sha256:xyz", "md5:00", "crc32c:0x12345G78"] {
        let mut c = component("u8", 64, 1);
        c.push(("digest", text(digest)));
        let m = manifest(vec![("w", vec![1], "dense", vec![("data", map(c))])]);
        assert_eq!(code(&v1_file(&data_region(2, 0), &cbor(&m))), "bad_digest", "{digest}");
    }
}

#[test]
fn unknown_fields_formats_and_logical_types_are_kept_and_served_by_dtype() {
    let mut c = component("u8", 64, 4);
    c.push(("type", text("x_vendor.int3")));
    c.push(("future_field", map(vec![("a", uint(1))])));
    let m = map(vec![
        ("version", text("1.3.0")),
        ("future_root_field", uint(7)),
        (
            "objects",
            map(vec![(
                "w",
                map(vec![
                    ("shape", Value::Array(vec![uint(2)])),
                    ("format", text("x_vendor.packed")),
                    ("components", map(vec![("blob", map(c))])),
                ]),
            )]),
        ),
    ]);
    let mut data = data_region(2, 0);
    data[56..60].copy_from_slice(&[1, 2, 3, 4]);
    let file = v1_file(&data, &cbor(&m));
    let parsed = parse(&file).unwrap();
    let object = parsed.object("w").unwrap();
    assert_eq!(object.format, "x_vendor.packed");
    let blob = object.component("blob").unwrap();
    assert_eq!(blob.logical_type.as_deref(), Some("x_vendor.int3"));
    assert_eq!(decode_component("w", blob, stored_bytes(&file, "w", blob).unwrap()).unwrap().as_ref(), &[1, 2, 3, 4]);
}

#[test]
fn zstd_without_uncompressed_length_is_sized_from_the_shape_and_logical_ratio() {
    let payload: Vec<u8> = (0..64).collect();
    let frame = zstd::bulk::compress(&payload, 3).unwrap();
    let mut c = component("f32", 64, frame.len() as u64);
    c.push(("type", text("complex64")));
    c.push(("encoding", text("zstd")));
    let m = manifest(vec![("z", vec![8], "dense", vec![("data", map(c))])]);
    let mut data = data_region(1, 0);
    data.extend_from_slice(&frame);
    let file = v1_file(&data, &cbor(&m));
    let parsed = parse(&file).unwrap();
    let c = parsed.object("z").unwrap().component("data").unwrap();
    assert_eq!(c.decoded_length, 64, "8 complex64 = 16 f32 = 64 bytes");
    assert_eq!(decode_component("z", c, stored_bytes(&file, "z", c).unwrap()).unwrap().as_ref(), payload.as_slice());
}

#[test]
fn zstd_of_a_non_dense_component_without_uncompressed_length_is_refused() {
    let mut c = component("u8", 64, 9);
    c.push(("encoding", text("zstd")));
    let m = manifest(vec![("x", vec![4], "custom", vec![("blob", map(c))])]);
    assert_eq!(code(&v1_file(&data_region(2, 0), &cbor(&m))), "unknown_decoded_length");
}

// --- legacy (0.1) ----------------------------------------------------------------------

fn legacy_entry(name: &str, dtype: &str, shape: Vec<u64>, offset: u64, size: u64, extra: Vec<(&str, Value)>) -> Value {
    let mut fields = vec![
        ("name", text(name)),
        ("offset", uint(offset)),
        ("size", uint(size)),
        ("dtype", text(dtype)),
        ("shape", Value::Array(shape.into_iter().map(uint).collect())),
        ("encoding", text("raw")),
    ];
    fields.extend(extra);
    map(fields)
}

#[test]
fn the_17_byte_empty_legacy_file_parses() {
    let file = legacy_file(&[], &[0x80]);
    assert_eq!(file.len(), 17);
    assert!(parse(&file).unwrap().objects.is_empty());
}

#[test]
fn legacy_big_endian_data_is_byte_swapped_to_little_endian() {
    let mut data = data_region(1, 0);
    data.extend_from_slice(&[0x00, 0x00, 0x01, 0x02, 0xAA, 0xBB, 0xCC, 0xDD]);
    let index = Value::Array(vec![legacy_entry("be", "int32", vec![2], 64, 8, vec![("data_endianness", text("big"))])]);
    let file = legacy_file(&data, &cbor(&index));
    let parsed = parse(&file).unwrap();
    let c = parsed.object("be").unwrap().component("data").unwrap();
    assert_eq!(c.byte_order, ByteOrder::Big);
    let decoded = decode_component("be", c, stored_bytes(&file, "be", c).unwrap()).unwrap();
    assert_eq!(decoded.as_ref(), &[0x02, 0x01, 0x00, 0x00, 0xDD, 0xCC, 0xBB, 0xAA]);
}

#[test]
fn legacy_indefinite_maps_long_dtypes_layouts_and_custom_fields_are_read() {
    let entry = legacy_entry(
        "sp",
        "uint8",
        vec![3],
        64,
        3,
        vec![("layout", text("sparse")), ("sparse_format", text("csr")), ("mine", uint(5))],
    );
    // Re-encode the map as indefinite-length, as the 0.1.4 writer does.
    let definite = cbor(&Value::Array(vec![entry]));
    let mut index = vec![0x81, 0xbf];
    index.extend_from_slice(&definite[2..]);
    index.push(0xff);
    let mut data = data_region(1, 0);
    data.extend_from_slice(&[7, 8, 9]);
    let parsed = parse(&legacy_file(&data, &index)).unwrap();
    let object = parsed.object("sp").unwrap();
    assert_eq!(object.format, "sparse");
    let attributes = object.attributes.as_ref().unwrap();
    assert_eq!(ztserve::format::json::cbor_to_json(attributes), serde_json::json!({"sparse_format": "csr", "mine": 5}));
}

#[test]
fn legacy_files_refuse_short_dtype_names_unknown_endianness_and_duplicate_names() {
    let data = {
        let mut d = data_region(1, 0);
        d.extend_from_slice(&[0; 4]);
        d
    };
    let short = Value::Array(vec![legacy_entry("a", "f32", vec![1], 64, 4, vec![])]);
    assert_eq!(code(&legacy_file(&data, &cbor(&short))), "unknown_dtype");
    let endian =
        Value::Array(vec![legacy_entry("a", "float32", vec![1], 64, 4, vec![("data_endianness", text("middle"))])]);
    assert_eq!(code(&legacy_file(&data, &cbor(&endian))), "unknown_endianness");
    let twice = Value::Array(vec![
        legacy_entry("a", "float32", vec![1], 64, 4, vec![]),
        legacy_entry("a", "float32", vec![1], 64, 4, vec![]),
    ]);
    assert_eq!(code(&legacy_file(&data, &cbor(&twice))), "duplicate_object");
}

// --- content checks -------------------------------------------------------------------

fn verify_codes(file: &[u8]) -> Vec<&'static str> {
    verify_file(file, &Limits::default()).errors.iter().map(|e| e.code()).collect()
}

#[test]
fn bool_bytes_other_than_0_or_1_fail_verification() {
    let m = manifest(vec![("b", vec![4], "dense", vec![("data", map(component("bool", 64, 4)))])]);
    let mut data = data_region(1, 0);
    data.extend_from_slice(&[0, 1, 2, 1]);
    let file = v1_file(&data, &cbor(&m));
    assert!(parse(&file).is_ok(), "structure is fine");
    assert_eq!(verify_codes(&file), ["bool_byte"]);
}

fn csr_file(indptr: &[u64], indices: &[u64], shape: Vec<u64>) -> Vec<u8> {
    let u64s = |v: &[u64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let mut data = data_region(1, 0);
    let values_off = 8 + data.len() as u64;
    data.extend_from_slice(&[0u8; 64]); // up to 16 f32 values
    let nnz = indices.len() as u64;
    let indices_off = 8 + data.len() as u64;
    let mut block = u64s(indices);
    block.resize(block.len().next_multiple_of(64).max(64), 0);
    data.extend_from_slice(&block);
    let indptr_off = 8 + data.len() as u64;
    data.extend_from_slice(&u64s(indptr));
    let m = manifest(vec![(
        "csr",
        shape,
        "sparse_csr",
        vec![
            ("values", map(component("f32", values_off, nnz * 4))),
            ("indices", map(component("u64", indices_off, nnz * 8))),
            ("indptr", map(component("u64", indptr_off, indptr.len() as u64 * 8))),
        ],
    )]);
    v1_file(&data, &cbor(&m))
}

#[test]
fn a_valid_csr_structure_passes_verification() {
    assert!(verify_codes(&csr_file(&[0, 1, 3], &[2, 0, 1], vec![2, 3])).is_empty());
}

#[test]
fn csr_indptr_of_the_wrong_length_fails_verification() {
    assert_eq!(verify_codes(&csr_file(&[0, 3], &[2, 0, 1], vec![2, 3])), ["sparse_structure"]);
}

#[test]
fn csr_indptr_that_decreases_or_does_not_end_at_nnz_fails_verification() {
    assert_eq!(verify_codes(&csr_file(&[0, 2, 1], &[2, 0, 1], vec![2, 3])), ["sparse_structure"]);
    assert_eq!(verify_codes(&csr_file(&[0, 1, 2], &[2, 0, 1], vec![2, 3])), ["sparse_structure"]);
}

#[test]
fn csr_column_indices_out_of_range_fail_verification() {
    assert_eq!(verify_codes(&csr_file(&[0, 1, 3], &[2, 0, 3], vec![2, 3])), ["sparse_structure"]);
}

#[test]
fn coo_coords_must_hold_ndim_times_nnz_entries_in_range() {
    let build = |coords: &[u64], shape: Vec<u64>| {
        let mut data = data_region(1, 0);
        data.extend_from_slice(&[0u8; 64]); // values: 2 × f32 at offset 64
        let coords_bytes: Vec<u8> = coords.iter().flat_map(|x| x.to_le_bytes()).collect();
        data.extend_from_slice(&coords_bytes);
        let m = manifest(vec![(
            "coo",
            shape,
            "sparse_coo",
            vec![
                ("values", map(component("f32", 64, 8))),
                ("coords", map(component("u64", 128, coords_bytes.len() as u64))),
            ],
        )]);
        v1_file(&data, &cbor(&m))
    };
    assert!(verify_codes(&build(&[0, 1, 2, 0], vec![2, 3])).is_empty());
    assert_eq!(verify_codes(&build(&[0, 1, 2], vec![2, 3])), ["sparse_structure"]);
    assert_eq!(verify_codes(&build(&[0, 2, 2, 0], vec![2, 3])), ["sparse_structure"]);
}

// --- decoding and digests ---------------------------------------------------------------

/// A dense u8 object whose data is `stored`, zstd-encoded with `declared` decoded bytes.
fn zstd_file(stored: &[u8], declared: u64) -> Vec<u8> {
    let mut c = component("u8", 64, stored.len() as u64);
    c.push(("encoding", text("zstd")));
    c.push(("uncompressed_length", uint(declared)));
    let m = manifest(vec![("z", vec![declared], "dense", vec![("data", map(c))])]);
    let mut data = data_region(1, 0);
    data.extend_from_slice(stored);
    v1_file(&data, &cbor(&m))
}

fn decode_code(file: &[u8]) -> &'static str {
    let parsed = parse(file).unwrap();
    let c = parsed.object("z").unwrap().component("data").unwrap();
    match decode_component("z", c, stored_bytes(file, "z", c).unwrap()) {
        Ok(_) => "ok",
        Err(e) => e.code(),
    }
}

fn payload() -> Vec<u8> {
    (0..100_000u32).map(|i| (i % 251) as u8).collect()
}

#[test]
fn a_zstd_frame_that_inflates_past_its_declared_size_is_refused() {
    let frame = zstd::bulk::compress(&payload(), 3).unwrap();
    assert_eq!(decode_code(&zstd_file(&frame, 99_999)), "zstd_too_long");
}

#[test]
fn a_zstd_bomb_is_stopped_at_its_declared_size_without_inflating() {
    let bomb = zstd::bulk::compress(&vec![0u8; 512 << 20], 19).unwrap();
    assert!(bomb.len() < 64 << 10);
    assert_eq!(decode_code(&zstd_file(&bomb, 1024)), "zstd_too_long");
}

#[test]
fn a_zstd_frame_that_stops_short_of_its_declared_size_is_refused_not_padded() {
    let frame = zstd::bulk::compress(&payload(), 3).unwrap();
    assert_eq!(decode_code(&zstd_file(&frame, 100_001)), "zstd_too_short");
}

#[test]
fn a_truncated_zstd_frame_is_refused() {
    let frame = zstd::bulk::compress(&payload(), 3).unwrap();
    assert_eq!(decode_code(&zstd_file(&frame[..frame.len() - 5], 100_000)), "zstd_truncated");
}

#[test]
fn bytes_that_are_not_a_zstd_frame_are_refused() {
    assert_eq!(decode_code(&zstd_file(b"definitely not zstd", 100)), "zstd_corrupt");
    assert_eq!(decode_code(&zstd_file(&[], 0)), "zstd_truncated");
}

#[test]
fn a_zstd_frame_failing_its_checksum_is_refused() {
    let mut compressor = zstd::bulk::Compressor::new(3).unwrap();
    compressor.include_checksum(true).unwrap();
    let mut frame = compressor.compress(&payload()).unwrap();
    let n = frame.len();
    frame[n - 1] ^= 0xff;
    assert_eq!(decode_code(&zstd_file(&frame, 100_000)), "zstd_corrupt");
}

#[test]
fn trailing_garbage_after_a_zstd_frame_is_refused() {
    let mut frame = zstd::bulk::compress(&payload(), 3).unwrap();
    frame.extend_from_slice(b"junk");
    assert_ne!(decode_code(&zstd_file(&frame, 100_000)), "ok");
}

#[test]
fn digests_are_verified_over_the_stored_bytes() {
    let frame = zstd::bulk::compress(&payload(), 3).unwrap();
    let crc = crc32c::crc32c(&frame);
    for (digest, ok) in [
        (format!("crc32c:0x{crc:08X}"), true),
        (format!("crc32c:0x{crc:08x}"), true),
        (format!("crc32c:0x{:08X}", crc ^ 1), false),
        (format!("sha256:{}", hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&frame))), true),
        (format!("sha256:{}", hex::encode([0u8; 32])), false),
    ] {
        let mut c = component("u8", 64, frame.len() as u64);
        c.push(("encoding", text("zstd")));
        c.push(("uncompressed_length", uint(100_000)));
        c.push(("digest", text(&digest)));
        let m = manifest(vec![("z", vec![100_000], "dense", vec![("data", map(c))])]);
        let mut data = data_region(1, 0);
        data.extend_from_slice(&frame);
        let file = v1_file(&data, &cbor(&m));
        let parsed = parse(&file).unwrap();
        let c = parsed.object("z").unwrap().component("data").unwrap();
        assert!(matches!(c.digest, Some(Digest::Crc32c(_)) | Some(Digest::Sha256(_))));
        let result = verify_digest("z", c, stored_bytes(&file, "z", c).unwrap());
        assert_eq!(result.is_ok(), ok, "{digest}: {result:?}");
        assert_eq!(verify_codes(&file).is_empty(), ok);
        if !ok {
            assert_eq!(verify_codes(&file), ["digest_mismatch"]);
        }
    }
}
