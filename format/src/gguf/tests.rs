use super::cursor::{Cursor, Parsed};
use super::header::{Preamble, alignment_of, check_required_keys, read_padding, read_preamble};
use super::tensors::{RawInfo, place_tensors};
use super::*;
use crate::{Container, DType};

#[test]
fn a_quantization_tag_picks_the_gguf_file_llama_cpp_would() {
    let paths = [
        "README.md",
        "mmproj-tiny-F16.gguf",
        "tiny-IQ4_XS.gguf",
        "tiny-Q4_K_M-00002-of-00002.gguf",
        "tiny-Q4_K_M-00001-of-00002.gguf",
        "tiny-Q4_K_S.gguf",
        "tiny-Q8_0.gguf",
        "tiny.imatrix.gguf",
    ];
    let pick = |tag: &str| file_of_quantization_tag(&paths, tag).map(|i| paths[i]);
    assert_eq!(pick("Q4_K_M"), Some("tiny-Q4_K_M-00001-of-00002.gguf"));
    assert_eq!(pick("q4_k_s"), Some("tiny-Q4_K_S.gguf"));
    assert_eq!(pick("IQ4_XS"), Some("tiny-IQ4_XS.gguf"));
    assert_eq!(pick("latest"), Some("tiny-Q4_K_M-00001-of-00002.gguf"));
    assert_eq!(pick("F16"), None, "a projector is not a model");
    assert_eq!(pick("Q2_K"), None);
    assert_eq!(projector_file(&paths).map(|i| paths[i]), Some("mmproj-tiny-F16.gguf"));
    let only_q6 = ["x/tiny-Q6_K.gguf"];
    assert_eq!(file_of_quantization_tag(&only_q6, "latest"), Some(0), "no default tag: the first model");
    assert_eq!(file_of_quantization_tag(&only_q6, "Q8_0"), None);
}

fn code_of<T: std::fmt::Debug>(read: Parsed<T>) -> &'static str {
    match read {
        Err(HeaderRead::Invalid(e)) => e.code(),
        other => panic!("not an invalid header: {other:?}"),
    }
}

fn kv(key: &str, value_type: ValueType, value: MetaValue) -> KeyValue {
    KeyValue { key: key.into(), value_type, value }
}

#[test]
fn the_preamble_bounds_the_counts_by_what_the_file_can_hold() {
    let preamble = |magic: &[u8; 4], version: u32, tensors: u64, kvs: u64, file_len: u64| {
        let mut bytes = magic.to_vec();
        bytes.extend(version.to_le_bytes());
        bytes.extend(tensors.to_le_bytes());
        bytes.extend(kvs.to_le_bytes());
        read_preamble(&mut Cursor { bytes: &bytes, at: 0, file_len, kept: 0 })
    };
    assert_eq!(preamble(MAGIC, 3, 1, 2, 24 + 13 * 2 + 29), Ok(Preamble { version: 3, tensor_count: 1, kv_count: 2 }));
    assert_eq!(code_of(preamble(b"GGUG", 3, 0, 0, 24)), "gguf_magic");
    assert_eq!(code_of(preamble(MAGIC, 3 << 24, 0, 0, 24)), "gguf_big_endian");
    assert_eq!(code_of(preamble(MAGIC, 1, 0, 0, 24)), "gguf_version");
    assert_eq!(code_of(preamble(MAGIC, 3, MAX_TENSORS + 1, 0, u64::MAX)), "gguf_too_many_tensors");
    assert_eq!(code_of(preamble(MAGIC, 3, 0, MAX_KVS + 1, u64::MAX)), "gguf_too_many_keys");
    assert_eq!(code_of(preamble(MAGIC, 3, 1, 2, 24 + 13 * 2 + 28)), "gguf_truncated");
    // A prefix too short asks for more.
    let short = read_preamble(&mut Cursor { bytes: b"GGUF", at: 0, file_len: 100, kept: 0 });
    assert!(matches!(short, Err(HeaderRead::NeedMore { .. })), "{short:?}");
}

#[test]
fn the_alignment_is_a_uint32_power_of_two_multiple_of_eight_or_the_default() {
    let of = |kvs: Vec<KeyValue>| alignment_of(&kvs).map_err(|e| e.code());
    assert_eq!(of(vec![]), Ok(DEFAULT_ALIGNMENT));
    assert_eq!(of(vec![kv("general.alignment", ValueType::U32, MetaValue::Int(64))]), Ok(64));
    assert_eq!(of(vec![kv("general.alignment", ValueType::U32, MetaValue::Int(12))]), Err("gguf_alignment"));
    assert_eq!(of(vec![kv("general.alignment", ValueType::U64, MetaValue::Int(64))]), Err("gguf_alignment"));
}

#[test]
fn the_padding_before_the_data_is_aligned_inside_the_file_and_zero() {
    // The infos end at 1; with an alignment of 4 the data starts at 4.
    let padding = |bytes: &[u8], file_len: u64| read_padding(&mut Cursor { bytes, at: 1, file_len, kept: 0 }, 4);
    assert_eq!(padding(&[9, 0, 0, 0], 8), Ok(4));
    assert_eq!(code_of(padding(&[9, 0, 7, 0], 8)), "gguf_padding");
    assert_eq!(code_of(padding(&[9, 0, 0, 0], 3)), "gguf_truncated");
}

#[test]
fn tensors_are_placed_aligned_in_whole_blocks_inside_the_file_without_overlap() {
    let f32 = ggml_type(0).unwrap();
    let q8_0 = ggml_type(8).unwrap();
    let info = |name: &str, ne: &[u64], ggml: GgmlType, offset: u64| (0, name.to_owned(), ne.to_vec(), ggml, offset);
    let place = |infos: Vec<RawInfo>| place_tensors(infos, 32, 64, 64 + 256).map_err(|e| e.code());
    let (tensors, quantized) = place(vec![info("b", &[8], f32, 32), info("a", &[8], f32, 0)]).unwrap();
    assert_eq!(
        tensors.iter().map(|t| (t.name.as_str(), t.range.clone())).collect::<Vec<_>>(),
        [("a", 64..96), ("b", 96..128)]
    );
    assert!(!quantized);
    assert_eq!(place(vec![info("q", &[32, 2], q8_0, 0)]).map(|(_, q)| q), Ok(true));
    assert_eq!(place(vec![info("a", &[8], f32, 4)]), Err("gguf_misaligned"));
    assert_eq!(place(vec![info("a", &[16], f32, 0), info("b", &[8], f32, 32)]), Err("gguf_overlap"));
    assert_eq!(place(vec![info("a", &[8], f32, 256)]), Err("gguf_out_of_bounds"));
    assert_eq!(place(vec![info("q", &[31], q8_0, 0)]), Err("gguf_block"));
    assert_eq!(place(vec![info("a", &[u64::MAX, 2], f32, 0)]), Err("gguf_shape"));
}

#[test]
fn a_model_names_its_architecture_and_quantized_tensors_their_quantization_version() {
    let arch = |name: &str| kv("general.architecture", ValueType::String, MetaValue::Text(name.into()));
    let version = kv("general.quantization_version", ValueType::U32, MetaValue::Int(2));
    let check = |kvs: &[KeyValue], first: bool, quantized: bool| {
        check_required_keys(kvs, first, quantized).map_err(|e| e.code())
    };
    assert_eq!(check(&[arch("llama")], true, false), Ok(()));
    assert_eq!(check(&[arch("Llama")], true, false), Err("gguf_architecture"));
    assert_eq!(check(&[], true, false), Err("gguf_architecture"));
    // A later part of a split model need not repeat them.
    assert_eq!(check(&[], false, true), Ok(()));
    assert_eq!(check(&[arch("llama")], true, true), Err("gguf_quantization_version"));
    assert_eq!(check(&[arch("llama"), version], true, true), Ok(()));
}

fn code(file: &[u8]) -> &'static str {
    match parse_file(file).and_then(|h| h.into_manifest(file.len() as u64)) {
        Ok(_) => "ok",
        Err(e) => e.code(),
    }
}

fn good() -> FileBuilder {
    FileBuilder::new("llama").kv_u32("general.quantization_version", 2).tensor("token_embd.weight", &[64, 3], 8).tensor(
        "output_norm.weight",
        &[64],
        0,
    )
}

fn u64s(values: &[u64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[test]
fn a_good_file_becomes_a_manifest_with_row_major_shapes_and_block_geometry() {
    let file = good()
        .kv(
            "tokenizer.ggml.tokens",
            9,
            [8u32.to_le_bytes().to_vec(), u64s(&[100])]
                .concat()
                .into_iter()
                .chain((0..100).flat_map(|i| string_bytes(format!("t{i}").as_bytes())))
                .collect(),
        )
        .build();
    let manifest = parse_file(&file).unwrap().into_manifest(file.len() as u64).unwrap();
    assert_eq!(manifest.container, Container::Gguf);
    assert_eq!(manifest.version.as_deref(), Some("3"));
    let q = manifest.object("token_embd.weight").unwrap();
    assert_eq!((q.shape.clone(), q.format.as_str()), (vec![3, 64], "gguf.q8_0/1"));
    assert_eq!(q.components[0].logical_type.as_deref(), Some("gguf.q8_0"));
    assert_eq!(q.components[0].stored_length, 3 * 2 * 34);
    let norm = manifest.object("output_norm.weight").unwrap();
    assert_eq!((norm.format.as_str(), norm.components[0].dtype), ("dense", DType::F32));
    let json = crate::json::manifest_json(&manifest);
    assert_eq!(json["attributes"]["tokenizer.ggml.tokens"], serde_json::json!({"array_of": "STRING", "length": 100}));
    assert_eq!(json["attributes"]["general.architecture"], "llama");
}

#[test]
fn a_header_read_in_pieces_asks_for_exactly_what_it_lacks() {
    let file = good().kv("general.description", 8, string_bytes(&[b'x'; 5000])).build();
    let reads = HeaderReads { file_len: file.len() as u64 };
    let mut held = reads.first(64).end;
    let mut steps = 0;
    let header = loop {
        match parse_header(&file[..held as usize], file.len() as u64) {
            Ok(header) => break header,
            Err(HeaderRead::NeedMore { needed }) => {
                assert!(needed > held && needed <= file.len() as u64);
                held = reads.next(held, needed).end;
                steps += 1;
            }
            Err(HeaderRead::Invalid(e)) => panic!("{e}"),
        }
    };
    assert_eq!(header, parse_file(&file).unwrap());
    assert!(steps <= 4, "{steps}");
}

#[test]
fn every_rule_of_the_specification_is_refused_with_its_own_code() {
    let mut bad_magic = good();
    bad_magic.magic = *b"GGML";
    let mut v1 = good();
    v1.version = 1;
    let mut v4 = good();
    v4.version = 4;
    let mut big_endian = good();
    big_endian.version = 3u32.swap_bytes();
    let mut many_tensors = good();
    many_tensors.counts = Some((MAX_TENSORS + 1, 3));
    let mut many_keys = good();
    many_keys.counts = Some((2, u64::MAX));
    let mut unfit = good();
    unfit.counts = Some((100_000, 2));
    let mut dirty_padding = good();
    dirty_padding.padding = 0xAA;
    let mut cut = good().build();
    cut.truncate(40);
    let nested = |depth: usize| {
        let mut value = [4u32.to_le_bytes().to_vec(), u64s(&[0])].concat();
        for _ in 0..depth {
            value = [9u32.to_le_bytes().to_vec(), u64s(&[1]), value].concat();
        }
        value
    };
    let no_arch = {
        let mut b = good();
        b.kvs.remove(0);
        b
    };
    let misaligned = {
        let mut b = good();
        b.tensors[1].3 += 4;
        b
    };
    let overlapping = {
        let mut b = good();
        b.tensors[1].3 = 0;
        b
    };
    let beyond = {
        let mut b = good();
        b.tensors[1].3 = 1 << 20;
        b
    };
    let overflowing = {
        let mut b = good();
        b.tensors[1].3 = u64::MAX - 31;
        b
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("good", good().build(), "ok"),
        ("magic", bad_magic.build(), "gguf_magic"),
        ("version 1", v1.build(), "gguf_version"),
        ("version 4", v4.build(), "gguf_version"),
        ("big-endian", big_endian.build(), "gguf_big_endian"),
        ("too many tensors", many_tensors.build(), "gguf_too_many_tensors"),
        ("too many keys", many_keys.build(), "gguf_too_many_keys"),
        ("counts beyond the file", unfit.build(), "gguf_truncated"),
        ("cut in the header", cut, "gguf_truncated"),
        ("key case", good().kv_u32("General.Alignment", 32).build(), "gguf_key"),
        ("key segment", good().kv_u32("general..x", 32).build(), "gguf_key"),
        ("key not ascii", good().kv_u32("général.x", 32).build(), "gguf_key"),
        ("duplicate key", good().kv_u32("a.b", 1).kv_u32("a.b", 2).build(), "gguf_duplicate_key"),
        ("value type", good().kv("a.b", 13, vec![0; 8]).build(), "gguf_value_type"),
        ("bool", good().kv("a.b", 7, vec![2]).build(), "gguf_bool"),
        (
            "long bool array",
            good().kv("a.b", 9, [7u32.to_le_bytes().to_vec(), u64s(&[100]), vec![0; 99], vec![3]].concat()).build(),
            "gguf_bool",
        ),
        ("string length", good().kv("a.b", 8, u64s(&[1 << 62])).build(), "gguf_string_too_long"),
        ("string utf-8", good().kv("a.b", 8, string_bytes(&[0xff, 0xfe])).build(), "gguf_string_utf8"),
        (
            "array length",
            good().kv("a.b", 9, [8u32.to_le_bytes().to_vec(), u64s(&[u64::MAX])].concat()).build(),
            "gguf_array_too_long",
        ),
        (
            "array beyond file",
            good().kv("a.b", 9, [8u32.to_le_bytes().to_vec(), u64s(&[1 << 20])].concat()).build(),
            "gguf_truncated",
        ),
        ("array depth", good().kv("a.b", 9, nested(MAX_ARRAY_DEPTH)).build(), "gguf_array_too_deep"),
        ("array depth within", good().kv("a.b", 9, nested(MAX_ARRAY_DEPTH - 1)).build(), "ok"),
        (
            "array type",
            good().kv("a.b", 9, [77u32.to_le_bytes().to_vec(), u64s(&[0])].concat()).build(),
            "gguf_value_type",
        ),
        ("alignment 0", good().kv_u32("general.alignment", 0).build(), "gguf_alignment"),
        ("alignment 12", good().kv_u32("general.alignment", 12).build(), "gguf_alignment"),
        ("alignment 4", good().kv_u32("general.alignment", 4).build(), "gguf_alignment"),
        ("alignment type", good().kv("general.alignment", 10, u64s(&[32])).build(), "gguf_alignment"),
        ("no architecture", no_arch.build(), "gguf_architecture"),
        ("architecture case", FileBuilder::new("Llama").build(), "gguf_architecture"),
        (
            "no quantization version",
            FileBuilder::new("llama").tensor("q", &[32], 2).build(),
            "gguf_quantization_version",
        ),
        (
            "quantization version type",
            FileBuilder::new("llama").kv("general.quantization_version", 10, u64s(&[2])).build(),
            "gguf_quantization_version",
        ),
        ("tensor name", good().tensor(&"n".repeat(65), &[4], 0).build(), "gguf_string_too_long"),
        ("duplicate tensor", good().tensor("output_norm.weight", &[4], 0).build(), "gguf_duplicate_tensor"),
        ("rank", good().tensor("r", &[1, 1, 1, 1, 1], 0).build(), "gguf_rank"),
        (
            "removed type",
            {
                let mut b = good();
                b.tensors[1].2 = 4;
                b.build()
            },
            "gguf_tensor_type",
        ),
        (
            "unknown type",
            {
                let mut b = good();
                b.tensors[1].2 = 99;
                b.build()
            },
            "gguf_tensor_type",
        ),
        (
            "shape overflow",
            {
                let mut b = good();
                b.tensors[1].1 = vec![1 << 32, 1 << 32, 4];
                b.build()
            },
            "gguf_shape",
        ),
        (
            "partial block",
            {
                let mut b = good();
                b.tensors[0].1 = vec![48, 2];
                b.build()
            },
            "gguf_block",
        ),
        ("misaligned", misaligned.build(), "gguf_misaligned"),
        ("overlap", overlapping.build(), "gguf_overlap"),
        ("beyond the file", beyond.build(), "gguf_out_of_bounds"),
        ("offset overflow", overflowing.build(), "gguf_out_of_bounds"),
        ("padding", dirty_padding.build(), "gguf_padding"),
        (
            "split of one",
            good()
                .kv("split.no", 2, vec![0, 0])
                .kv("split.count", 2, vec![1, 0])
                .kv("split.tensors.count", 5, vec![2, 0, 0, 0])
                .build(),
            "ok",
        ),
        (
            "split of two",
            good()
                .kv("split.no", 2, vec![0, 0])
                .kv("split.count", 2, vec![2, 0])
                .kv("split.tensors.count", 5, vec![4, 0, 0, 0])
                .build(),
            "gguf_split",
        ),
        (
            "split part",
            good()
                .kv("split.no", 2, vec![2, 0])
                .kv("split.count", 2, vec![2, 0])
                .kv("split.tensors.count", 5, vec![4, 0, 0, 0])
                .build(),
            "gguf_split",
        ),
        ("split keys", good().kv("split.no", 2, vec![0, 0]).build(), "gguf_split"),
    ];
    for (name, file, expected) in cases {
        assert_eq!(code(&file), expected, "{name}");
    }
}

#[test]
fn split_parts_are_one_model_only_when_every_part_agrees() {
    let part = |no: u16, count: u16, total: i32, names: &[&str]| {
        let builder = FileBuilder::new("llama").kv_u32("general.quantization_version", 2).split(no, count, total);
        names.iter().fold(builder, |b, name| b.tensor(name, &[32, 2], 8)).build()
    };
    let (a, b) = (part(0, 2, 3, &["x", "y"]), part(1, 2, 3, &["z"]));
    let parts = [("m-00001-of-00002.gguf", &a[..]), ("m-00002-of-00002.gguf", &b[..])];
    let manifest = parse_model(&parts).unwrap();
    assert_eq!(
        manifest.objects.iter().map(|o| (o.name.as_str(), o.components[0].file)).collect::<Vec<_>>(),
        [("x", 0), ("y", 0), ("z", 1)]
    );
    let code_of = |parts: &[(&str, &[u8])]| parse_model(parts).map(drop).map_err(|e| e.code());
    let wrong_total = part(1, 2, 4, &["z"]);
    assert_eq!(code_of(&[parts[0], ("m-00002-of-00002.gguf", &wrong_total)]), Err("gguf_split"));
    let twice = part(1, 2, 3, &["y"]);
    assert_eq!(code_of(&[parts[0], ("m-00002-of-00002.gguf", &twice)]), Err("gguf_duplicate_tensor"));
    assert_eq!(code_of(&[parts[1], parts[0]]), Err("gguf_split"));
    assert_eq!(code_of(&parts[..1]), Err("gguf_split"));
}

#[test]
fn arrays_of_short_arrays_keep_a_bounded_number_of_values() {
    // 64 arrays of 64 arrays of 64 bytes: 262,144 values, in about 300 KiB.
    let bytes_array = [0u32.to_le_bytes().to_vec(), u64s(&[64]), vec![7; 64]].concat();
    let level = |inner: &[u8]| [9u32.to_le_bytes().to_vec(), u64s(&[64]), inner.repeat(64)].concat();
    let value = [9u32.to_le_bytes().to_vec(), u64s(&[64]), level(&bytes_array).repeat(64)].concat();
    let file = good().kv("a.b", 9, value).build();
    let header = parse_file(&file).unwrap();
    fn count(value: &MetaValue) -> u64 {
        match value {
            MetaValue::Array(items) => 1 + items.iter().map(count).sum::<u64>(),
            _ => 1,
        }
    }
    let kept: u64 = header.metadata.iter().map(|kv| count(&kv.value)).sum();
    assert!(kept <= MAX_KEPT_VALUES + 64 * 64, "{kept} values kept");
    let MetaValue::Array(outer) = &header.get("a.b").unwrap() else { panic!("kept whole at the top") };
    assert!(outer.iter().any(|inner| matches!(inner, MetaValue::LongArray { len: 64, .. })), "summarised");
}

#[test]
fn split_names_are_five_digit_parts_of_five_digit_counts() {
    assert_eq!(split_name("Grok-100B-v1.0-Q4_0-00003-of-00009.gguf"), Some(("Grok-100B-v1.0-Q4_0", 3, 9)));
    assert_eq!(split_name("m-1-of-2.gguf"), None);
    assert_eq!(split_name("-00001-of-00002.gguf"), None);
    assert_eq!(split_name("m-00001-of-00002.safetensors"), None);
    assert_eq!(split_file_name("m", 2, 3), "m-00002-of-00003.gguf");
}

#[test]
fn every_type_has_the_geometry_of_ggml_and_a_round_trip_name() {
    assert_eq!(TYPES.iter().map(|t| t.id).collect::<std::collections::HashSet<_>>().len(), TYPES.len());
    let q4_k = ggml_type(12).unwrap();
    assert_eq!((q4_k.block_elements, q4_k.block_bytes), (256, 144));
    assert_eq!(quantized_type(&q4_k.logical_type()), Some(q4_k));
    assert_eq!(quantized_type("gguf.f32"), None);
    assert_eq!(ggml_type(30).unwrap().dense, Some(DType::BF16));
}
