//! Hostile safetensors files and checkpoints, served among a good model: each is listed broken
//! with its precise reason, answers 422 with it, and never stops the good model from serving;
//! nothing panics, hangs or allocates what a header merely claims. The fuzz target's seeds,
//! corpus and regressions replay through its wrapper.

use crate::common;

use std::fs;
use std::path::Path;

use common::{ModelSource, request_async, serve};
use ztserve::api;
use ztserve::config::Config;
use ztserve::format::safetensors::file_around;

/// A file whose header is `header` padded with spaces to a multiple of 8, then `data` bytes.
fn st(header: &str, data: usize) -> Vec<u8> {
    let mut json = header.to_owned();
    while !json.len().is_multiple_of(8) {
        json.push(' ');
    }
    file_around(json.as_bytes(), data)
}

/// Two U8 tensors: `a` at [0, 2] and `b` at `offsets` with shape [`b_len`].
fn two(offsets: &str, b_len: u64) -> String {
    format!(
        r#"{{"a":{{"dtype":"U8","shape":[2],"data_offsets":[0,2]}},"b":{{"dtype":"U8","shape":[{b_len}],"data_offsets":{offsets}}}}}"#
    )
}

fn one(dtype: &str, shape: &str, end: u64) -> String {
    format!(r#"{{"t":{{"dtype":"{dtype}","shape":{shape},"data_offsets":[0,{end}]}}}}"#)
}

/// Every hostile single file: its name and the code it must be broken with.
fn hostile_files() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let mut beyond = 1_000u64.to_le_bytes().to_vec();
    beyond.extend_from_slice(b"{}");
    let mut huge = (100_000_001u64).to_le_bytes().to_vec();
    huge.extend_from_slice(&[b' '; 64]);
    let mut not_utf8 = st(&one("U8", "[1]", 1), 1);
    not_utf8[9] = 0xff;
    vec![
        ("header-beyond-file", beyond, "manifest_beyond_file"),
        ("header-huge", huge, "manifest_too_large"),
        ("truncated", vec![1, 2, 3], "truncated"),
        ("not-json", st("{ this is not json", 0), "safetensors_header"),
        ("not-an-object", st("[1, 2, 3]", 0), "safetensors_header_start"),
        // The official reader lets leading whitespace through; the format says MUST begin with `{`.
        ("leading-space", st(&format!(" {}", one("U8", "[1]", 1)), 1), "safetensors_header_start"),
        ("not-utf8", not_utf8, "safetensors_header"),
        ("out-of-bounds", st(&one("U8", "[1000]", 1000), 10), "data_region_mismatch"),
        ("overlapping", st(&two("[1,3]", 2), 3), "overlap"),
        ("reversed", st(&two("[4,2]", 2), 4), "offsets_reversed"),
        ("gap", st(&two("[3,5]", 2), 5), "data_gap"),
        ("size-not-shape", st(&one("F32", "[3]", 8), 8), "length_mismatch"),
        ("unknown-dtype", st(&one("F12", "[1]", 1), 1), "unknown_dtype"),
        ("negative-shape", st(&one("U8", "[-1]", 1), 1), "safetensors_header"),
        ("fractional-shape", st(&one("U8", "[1.5]", 1), 1), "safetensors_header"),
        ("shape-overflow", st(&one("U64", "[4294967296,4294967296,4294967296]", 8), 8), "shape_overflow"),
        (
            "duplicate-names",
            st(
                r#"{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"t":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#,
                2,
            ),
            "duplicate_object",
        ),
        ("metadata-not-strings", st(r#"{"__metadata__":{"n":1}}"#, 0), "safetensors_header"),
        (
            "unknown-field",
            st(r#"{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}}"#, 1),
            "safetensors_header",
        ),
    ]
}

async fn hostile_checkpoints_are_broken_with_their_reason(source: ModelSource) {
    let good = common::safetensors_file(&[("w", safetensors::Dtype::F32, vec![2], &[0, 0, 128, 63, 0, 0, 0, 64])]);
    source.put("good.safetensors", &good).await;
    let files = hostile_files();
    for (name, bytes, _) in &files {
        source.put(&format!("bad/{name}.safetensors"), bytes).await;
    }
    // Checkpoints: a shard missing, a tensor in the wrong shard, an index that is not JSON, one
    // that points outside its directory or at itself, and one whose shard is itself broken.
    let a: &[common::StTensor<'_>] = &[("a", safetensors::Dtype::U8, vec![1], &[1])];
    let b: &[common::StTensor<'_>] = &[("b", safetensors::Dtype::U8, vec![1], &[2])];
    let checkpoint = common::safetensors_checkpoint(&[a, b]);
    for (name, bytes) in &checkpoint {
        if !name.starts_with("model-00002") {
            source.put(&format!("missing/{name}"), bytes).await;
        }
    }
    let swapped = common::safetensors_checkpoint(&[b, a]);
    source.put("wrong/model.safetensors.index.json", &checkpoint[0].1).await;
    for (name, bytes) in &swapped[1..] {
        source.put(&format!("wrong/{name}"), bytes).await;
    }
    source.put("notjson/model.safetensors.index.json", b"{\"weight_map\": ").await;
    source.put("notjson/model-00001-of-00001.safetensors", &checkpoint[1].1).await;
    let escape = br#"{"weight_map":{"a":"../good.safetensors"}}"#;
    source.put("escape/model.safetensors.index.json", escape).await;
    let itself = br#"{"weight_map":{"a":"model.safetensors.index.json"}}"#;
    source.put("itself/model.safetensors.index.json", itself).await;
    source.put("brokenshard/model.safetensors.index.json", &checkpoint[0].1).await;
    source.put("brokenshard/model-00001-of-00002.safetensors", &checkpoint[1].1).await;
    source.put("brokenshard/model-00002-of-00002.safetensors", &st(&two("[3,5]", 2), 5)).await;

    let (address, _state) = serve(source.config(Config::default())).await;
    let kind = source.kind();
    let listing = request_async(&address, "/models", &[]).await.json();
    let reason = |id: &str| -> String {
        let model = listing["models"].as_array().unwrap().iter().find(|m| m["id"] == id);
        let model = model.unwrap_or_else(|| panic!("{kind}: {id} is not listed: {listing}"));
        assert_eq!(model["status"], "broken", "{kind}: {id}: {model}");
        model["reason"]["code"].as_str().unwrap().to_owned()
    };
    for (name, _, code) in &files {
        assert_eq!(reason(&format!("bad/{name}")), *code, "{kind}: {name}");
    }
    assert_eq!(reason("missing"), "shard_missing");
    assert_eq!(reason("wrong"), "tensor_in_wrong_shard");
    assert_eq!(reason("notjson"), "safetensors_index");
    assert_eq!(reason("escape"), "safetensors_index");
    assert_eq!(reason("itself"), "safetensors_index");
    assert_eq!(reason("brokenshard"), "data_gap");
    let ids: Vec<&str> = listing["models"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert!(!ids.iter().any(|id| id.contains("model-0000")), "{kind}: shards are never models: {ids:?}");

    // A broken model answers 422 with its reason; the good one serves throughout.
    let reply = request_async(&address, &api::model_url("wrong"), &[]).await;
    assert_eq!(reply.status, 422, "{kind}");
    assert!(String::from_utf8_lossy(&reply.body).contains("tensor_in_wrong_shard"), "{kind}");
    let reply = request_async(&address, &api::object_url("good", "w"), &[]).await;
    assert_eq!((reply.status, &reply.body[..]), (200, &[0, 0, 128, 63, 0, 0, 0, 64][..]), "{kind}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_safetensors_in_a_local_directory_are_broken_with_their_reason() {
    hostile_checkpoints_are_broken_with_their_reason(ModelSource::local()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_safetensors_in_s3_are_broken_with_their_reason() {
    hostile_checkpoints_are_broken_with_their_reason(ModelSource::s3()).await;
}

/// What the `safetensors_header` fuzz target does with each of its inputs.
#[test]
fn every_fuzz_input_of_the_header_parser_replays_without_a_panic() {
    use ztserve::format::verify::verify_safetensors;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut count = 0;
    for dir in ["seeds-safetensors", "corpus/safetensors_header", "regressions-safetensors"] {
        for entry in fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.file_name().is_some_and(|n| n == "README.md") {
                continue;
            }
            let input = fs::read(&path).unwrap();
            let [low, high, header @ ..] = &input[..] else { continue };
            let file = file_around(header, usize::from(u16::from_le_bytes([*low, *high])));
            let _ = verify_safetensors(&file, false, |_| unreachable!());
            let _ = verify_safetensors(header, true, |_| Ok(&file[..]));
            count += 1;
        }
    }
    assert!(count >= 10, "fuzz/ lost its safetensors inputs: {count}");
    // The seeds are files the peers wrote: each parses.
    for entry in fs::read_dir(root.join("seeds-safetensors")).unwrap() {
        let path = entry.unwrap().path();
        let input = fs::read(&path).unwrap();
        let (length, header) = input.split_at(2);
        if path.to_string_lossy().contains("index") {
            assert!(ztserve::format::safetensors::parse_index(header).is_ok());
        } else {
            let file = file_around(header, usize::from(u16::from_le_bytes([length[0], length[1]])));
            assert!(ztserve::format::safetensors::parse_file(&file).is_ok(), "{header:?}");
        }
    }
}
