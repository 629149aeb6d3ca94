use super::*;
use crate::{Container, DType, Manifest, Result};

/// A file: the header (padded with spaces to 8 bytes, as the library does), then `data`.
fn file(header: &str, data: usize) -> Vec<u8> {
    let mut json = header.as_bytes().to_vec();
    while json.len() % 8 != 0 {
        json.push(b' ');
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&json);
    out.resize(out.len() + data, 7);
    out
}

fn parsed(bytes: &[u8]) -> Result<Header> {
    let span = header_span(bytes, bytes.len() as u64)?;
    parse(&bytes[span.start as usize..span.end as usize], span, bytes.len() as u64)
}

fn code(header: &str, data: usize) -> &'static str {
    parsed(&file(header, data)).unwrap_err().code()
}

#[test]
fn tensors_map_to_stored_dtypes_and_absolute_ranges_in_offset_order() {
    let header = r#"{"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[4,16]},"__metadata__":{"format":"pt"},"a":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}}"#;
    let bytes = file(header, 16);
    let h = parsed(&bytes).unwrap();
    let data_start = h.span.end;
    assert_eq!(h.metadata, vec![("format".to_string(), "pt".to_string())]);
    assert_eq!(h.tensors.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(h.tensors[0].dtype.logical_type, Some("f8_e4m3fn"));
    assert_eq!(h.tensors[0].range, data_start..data_start + 4);
    assert_eq!(h.tensors[1].dtype.dtype, DType::BF16);
    assert_eq!(h.tensors[1].range, data_start + 4..data_start + 16);
}

#[test]
fn sub_byte_types_pack_and_must_fill_whole_bytes() {
    assert!(parsed(&file(r#"{"q":{"dtype":"F4","shape":[6],"data_offsets":[0,3]}}"#, 3)).is_ok());
    assert!(parsed(&file(r#"{"q":{"dtype":"F6_E3M2","shape":[4],"data_offsets":[0,3]}}"#, 3)).is_ok());
    assert_eq!(code(r#"{"q":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}"#, 2), "packed_bits");
}

#[test]
fn every_broken_header_is_refused_with_its_own_code() {
    let t = |offsets: &str| {
        format!(
            r#"{{"a":{{"dtype":"U8","shape":[2],"data_offsets":[0,2]}},"b":{{"dtype":"U8","shape":[2],"data_offsets":{offsets}}}}}"#
        )
    };
    assert_eq!(code(&t("[3,5]"), 5), "data_gap");
    assert_eq!(code(&t("[1,3]"), 3), "overlap");
    assert_eq!(code(&t("[4,2]"), 4), "offsets_reversed");
    assert_eq!(code(&t("[2,5]"), 5), "length_mismatch");
    assert_eq!(code(&t("[2,4]"), 5), "data_region_mismatch");
    assert_eq!(code(r#"{"a":{"dtype":"F7","shape":[1],"data_offsets":[0,1]}}"#, 1), "unknown_dtype");
    assert_eq!(code(r#"{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}"#, 1), "safetensors_header");
    assert_eq!(code(r#"{"a":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}}"#, 1), "safetensors_header");
    assert_eq!(
        code(
            r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#,
            2
        ),
        "duplicate_object"
    );
    assert_eq!(code(r#"{"__metadata__":{"n":1}}"#, 0), "safetensors_header");
    assert_eq!(code("[1,2]", 0), "safetensors_header_start");
    assert_eq!(code(" {}", 0), "safetensors_header_start", "the format says MUST begin with {{");
    assert_eq!(code(r#"{"a":1} x"#, 0), "safetensors_header");
    let mut not_utf8 = file("{}", 0);
    not_utf8[9] = 0xff;
    assert_eq!(parsed(&not_utf8).unwrap_err().code(), "safetensors_header");
}

#[test]
fn the_header_length_is_bounded_by_the_file_and_the_library_limit() {
    let mut huge = (MAX_HEADER_LEN + 1).to_le_bytes().to_vec();
    huge.extend_from_slice(b"{}");
    assert_eq!(header_span(&huge, 10).unwrap_err().code(), "manifest_too_large");
    let beyond = 100u64.to_le_bytes();
    assert_eq!(header_span(&beyond, 50).unwrap_err().code(), "manifest_beyond_file");
    assert_eq!(header_span(&[1, 2], 2).unwrap_err().code(), "truncated");
}

/// Files written by the safetensors library, one tensor of every dtype it defines (shapes
/// that fill whole bytes), read back with the same names, shapes, ranges and metadata.
#[test]
fn files_the_library_writes_read_back_exactly() {
    use safetensors::tensor::{Dtype, TensorView};
    let dtypes = [
        Dtype::BOOL,
        Dtype::F4,
        Dtype::F6_E2M3,
        Dtype::F6_E3M2,
        Dtype::U8,
        Dtype::I8,
        Dtype::F8_E5M2,
        Dtype::F8_E4M3,
        Dtype::F8_E8M0,
        Dtype::F8_E4M3FNUZ,
        Dtype::F8_E5M2FNUZ,
        Dtype::I16,
        Dtype::U16,
        Dtype::F16,
        Dtype::BF16,
        Dtype::I32,
        Dtype::U32,
        Dtype::F32,
        Dtype::C64,
        Dtype::F64,
        Dtype::I64,
        Dtype::U64,
    ];
    assert_eq!(dtypes.len(), DTYPES.len(), "every dtype the library defines is mapped");
    let shape = vec![2usize, 4];
    let buffers: Vec<(String, Dtype, Vec<u8>)> = dtypes
        .iter()
        .enumerate()
        .map(|(i, &d)| (format!("t{i:02}.{d}"), d, vec![i as u8; 8 * d.bitsize() / 8]))
        .collect();
    let views: Vec<(String, TensorView<'_>)> = buffers
        .iter()
        .map(|(name, d, data)| (name.clone(), TensorView::new(*d, shape.clone(), data).unwrap()))
        .collect();
    let metadata = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    let bytes = safetensors::serialize(views, Some(metadata)).unwrap();
    let header = parsed(&bytes).unwrap();
    let (_, reference) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(header.metadata, vec![("format".to_string(), "pt".to_string())]);
    assert_eq!(header.tensors.len(), dtypes.len());
    for tensor in &header.tensors {
        let info = reference.info(&tensor.name).unwrap();
        assert_eq!(tensor.dtype.name, info.dtype.to_string(), "{}", tensor.name);
        assert_eq!(tensor.shape, [2, 4]);
        let (start, end) = info.data_offsets;
        assert_eq!(tensor.range, header.span.end + start as u64..header.span.end + end as u64);
        let index = buffers.iter().position(|(name, ..)| *name == tensor.name).unwrap();
        assert_eq!(&bytes[tensor.range.start as usize..tensor.range.end as usize], &buffers[index].2[..]);
    }
}

#[test]
fn a_header_is_read_with_one_more_read_only_when_the_prefix_does_not_hold_it() {
    let bytes = file(r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}}"#, 12);
    let whole = parse_file(&bytes).unwrap();
    for prefix in [0, 8, 20, whole.span.end, 1 << 20] {
        let reads = HeaderReads::new(bytes.len() as u64, prefix);
        let first = &bytes[reads.first().start as usize..reads.first().end as usize];
        let (span, missing) = reads.locate(first).unwrap();
        assert_eq!(span, whole.span);
        assert_eq!(missing.is_empty(), prefix >= whole.span.end, "prefix {prefix}");
        let header = reads.parse(first, &bytes[missing.start as usize..missing.end as usize]).unwrap();
        assert_eq!(header, whole);
    }
    let manifest = whole.into_manifest(bytes.len() as u64).unwrap();
    assert_eq!(manifest.container, Container::Safetensors);
    let data = manifest.object("a").unwrap().component("data").unwrap();
    assert_eq!((data.dtype, data.stored_length, data.file), (DType::F32, 12, 0));
    assert_eq!(crate::json::cbor_to_json(manifest.attributes.as_ref().unwrap()), serde_json::json!({"format": "pt"}));
}

fn shard(tensors: &[&str]) -> Manifest {
    let mut header = String::from("{");
    for (i, name) in tensors.iter().enumerate() {
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(r#""{name}":{{"dtype":"U8","shape":[1],"data_offsets":[{i},{}]}}"#, i + 1));
    }
    header.push('}');
    let bytes = file(&header, tensors.len());
    parse_file(&bytes).unwrap().into_manifest(bytes.len() as u64).unwrap()
}

fn index(weight_map: &str) -> Index {
    parse_index(format!(r#"{{"metadata":{{"total_size":3}},"weight_map":{weight_map}}}"#).as_bytes()).unwrap()
}

#[test]
fn an_index_and_its_shards_make_one_model_with_each_tensor_in_its_own_shard() {
    let index = index(r#"{"b":"s-2.safetensors","a":"s-1.safetensors","c":"s-2.safetensors"}"#);
    assert_eq!(index.shards, ["s-1.safetensors", "s-2.safetensors"]);
    let (one, two) = (shard(&["a"]), shard(&["b", "c"]));
    let manifest = assemble(&index, 100, &[("s-1.safetensors", &one), ("s-2.safetensors", &two)]).unwrap();
    let files: Vec<(&str, usize)> = manifest.objects.iter().map(|o| (o.name.as_str(), o.components[0].file)).collect();
    assert_eq!(files, [("a", 1), ("b", 2), ("c", 2)]);
    assert_eq!(manifest.manifest_span, 0..100);
    assert_eq!(crate::json::cbor_to_json(manifest.attributes.as_ref().unwrap()), serde_json::json!({"total_size": 3}));

    let wrong = index_codes(r#"{"a":"s-2.safetensors","b":"s-2.safetensors","c":"s-2.safetensors"}"#, &one, &two);
    assert_eq!(wrong, "tensor_in_wrong_shard");
    let missing = index_codes(r#"{"a":"s-1.safetensors","b":"s-1.safetensors","c":"s-2.safetensors"}"#, &one, &two);
    assert_eq!(missing, "tensor_in_wrong_shard");
    let (extra_one, extra_two) = (shard(&["a", "d"]), shard(&["b", "c"]));
    let extra =
        index_codes(r#"{"a":"s-1.safetensors","b":"s-2.safetensors","c":"s-2.safetensors"}"#, &extra_one, &extra_two);
    assert_eq!(extra, "tensor_not_indexed");
    let absent = index_codes(r#"{"a":"s-1.safetensors","b":"s-2.safetensors","z":"s-2.safetensors"}"#, &one, &two);
    assert_eq!(absent, "tensor_not_in_shard");
    let (only_a, only_b) = (shard(&["a"]), shard(&["b"]));
    let gone = index_codes(r#"{"a":"s-1.safetensors","b":"s-2.safetensors","z":"s-2.safetensors"}"#, &only_a, &only_b);
    assert_eq!(gone, "tensor_not_in_shard");
    let (twice_one, twice_two) = (shard(&["a"]), shard(&["a", "b"]));
    let twice = index_codes(r#"{"a":"s-1.safetensors","b":"s-2.safetensors"}"#, &twice_one, &twice_two);
    assert_eq!(twice, "tensor_in_wrong_shard");
}

fn index_codes(weight_map: &str, one: &Manifest, two: &Manifest) -> &'static str {
    let index = index(weight_map);
    assemble(&index, 10, &[("s-1.safetensors", one), ("s-2.safetensors", two)]).unwrap_err().code()
}

#[test]
fn broken_indexes_are_refused_with_the_reason() {
    let code = |text: &str| parse_index(text.as_bytes()).unwrap_err();
    for (text, needle) in [
        ("not json", "not a JSON object"),
        (r#"{"metadata":{}}"#, "no weight_map"),
        (r#"{"weight_map":{},"weight_map":{}}"#, "appears twice"),
        (r#"{"weight_map":{"a":"../x.safetensors"}}"#, "not a file name"),
        (r#"{"weight_map":{"a":"sub/x.safetensors"}}"#, "not a file name"),
        (r#"{"weight_map":{"a":"..\\x.safetensors"}}"#, "not a file name"),
        (r#"{"weight_map":{"a":3}}"#, "not a file name"),
        (r#"{"weight_map":{"a":"model.safetensors.index.json"}}"#, "not a .safetensors file"),
        (r#"{"weight_map":{"a":"x.zt"}}"#, "not a .safetensors file"),
        (r#"{"weight_map":[]}"#, "not a JSON object"),
        (r#"{"metadata":[1],"weight_map":{}}"#, "metadata is"),
    ] {
        let error = code(text);
        assert_eq!(error.code(), "safetensors_index", "{text}");
        assert!(error.to_string().contains(needle), "{text}: {error}");
    }
    assert_eq!(code(r#"{"weight_map":{"a":"x.safetensors","a":"x.safetensors"}}"#).code(), "duplicate_object");
    assert_eq!(parse_index(&[0xff, b'{']).unwrap_err().code(), "safetensors_index");
    let extra = parse_index(br#"{"weight_map":{"a":"x.safetensors"},"format":"pt"}"#).unwrap();
    assert_eq!(extra.weight_map, [("a".to_string(), "x.safetensors".to_string())]);
}

#[test]
fn every_library_dtype_is_known_once() {
    let names: std::collections::HashSet<_> = DTYPES.iter().map(|m| m.name).collect();
    assert_eq!(names.len(), DTYPES.len());
    for name in names {
        assert_eq!(mapped(name).unwrap().name, name);
    }
}
