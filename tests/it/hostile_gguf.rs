//! Hostile GGUF files and split models, served among good ones from a local directory and from
//! S3: each is listed broken with the precise reason its rule gives and answers 422, and none
//! stops the good models from serving; a header larger than the first read is read in growing
//! prefixes. Nothing panics, hangs or allocates what a header merely claims. The fuzz target's
//! seeds, corpus and regressions replay through its reads.

use crate::common;

use std::fs;
use std::path::Path;

use common::{ModelSource, request_async, serve};
use ztserve::api;
use ztserve::config::Config;
use ztserve::format::gguf::{FileBuilder, string_bytes};

fn good() -> FileBuilder {
    FileBuilder::new("llama").kv_u32("general.quantization_version", 2).tensor("w", &[64, 2], 8).tensor("n", &[4], 0)
}

/// A part of a split model of `count` parts and `total` tensors, holding `names`.
fn part(no: u16, count: u16, total: i32, names: &[&str]) -> Vec<u8> {
    let builder = FileBuilder::new("llama").kv_u32("general.quantization_version", 2).split(no, count, total);
    names.iter().fold(builder, |builder, name| builder.tensor(name, &[32, 2], 8)).build()
}

/// Every hostile single file: its name and the code it must be broken with.
fn hostile_files() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let with = |change: &dyn Fn(&mut FileBuilder)| {
        let mut builder = good();
        change(&mut builder);
        builder.build()
    };
    let mut cut = good().build();
    cut.truncate(50);
    vec![
        ("magic", with(&|b| b.magic = *b"GGML"), "gguf_magic"),
        ("version", with(&|b| b.version = 1), "gguf_version"),
        ("big-endian", with(&|b| b.version = 3u32.swap_bytes()), "gguf_big_endian"),
        ("tensor-count", with(&|b| b.counts = Some((u64::MAX, 3))), "gguf_too_many_tensors"),
        ("counts-beyond-file", with(&|b| b.counts = Some((500_000, 3))), "gguf_truncated"),
        ("cut", cut, "gguf_truncated"),
        ("key", good().kv_u32("Bad.Key", 1).build(), "gguf_key"),
        ("duplicate-key", good().kv_u32("a.b", 1).kv_u32("a.b", 1).build(), "gguf_duplicate_key"),
        ("string-length", good().kv("a.b", 8, (1u64 << 60).to_le_bytes().to_vec()).build(), "gguf_string_too_long"),
        (
            "array-length",
            good().kv("a.b", 9, [vec![8, 0, 0, 0], u64::MAX.to_le_bytes().to_vec()].concat()).build(),
            "gguf_array_too_long",
        ),
        ("bool", good().kv("a.b", 7, vec![7]).build(), "gguf_bool"),
        ("alignment", good().kv_u32("general.alignment", 48).build(), "gguf_alignment"),
        (
            "no-quantization-version",
            FileBuilder::new("llama").tensor("w", &[32], 2).build(),
            "gguf_quantization_version",
        ),
        ("rank", good().tensor("r", &[1, 1, 1, 1, 1], 0).build(), "gguf_rank"),
        ("type", with(&|b| b.tensors[0].2 = 31), "gguf_tensor_type"),
        ("partial-block", with(&|b| b.tensors[0].1 = vec![40, 2]), "gguf_block"),
        ("misaligned", with(&|b| b.tensors[1].3 += 8), "gguf_misaligned"),
        ("overlap", with(&|b| b.tensors[1].3 = 0), "gguf_overlap"),
        ("out-of-bounds", with(&|b| b.tensors[1].3 = 1 << 30), "gguf_out_of_bounds"),
        ("padding", with(&|b| b.padding = 1), "gguf_padding"),
    ]
}

async fn hostile_gguf_is_broken_with_its_reason(source: ModelSource) {
    let files = hostile_files();
    for (name, bytes, _) in &files {
        source.put(&format!("bad/{name}.gguf"), bytes).await;
    }
    source.put("good/model.gguf", &good().build()).await;
    // A header larger than the first read (a long chat template), read in growing prefixes.
    let template = "{% for m in messages %}{{ m.content }}{% endfor %}".repeat(60_000);
    let big = good().kv("tokenizer.chat_template", 8, string_bytes(template.as_bytes())).build();
    source.put("big/model.gguf", &big).await;
    source.put("missing/m-00001-of-00003.gguf", &part(0, 3, 3, &["a"])).await;
    source.put("missing/m-00003-of-00003.gguf", &part(2, 3, 3, &["c"])).await;
    source.put("orphan/m-00002-of-00002.gguf", &part(1, 2, 2, &["b"])).await;
    source.put("disagree/m-00001-of-00002.gguf", &part(0, 2, 2, &["a"])).await;
    source.put("disagree/m-00002-of-00002.gguf", &part(1, 3, 2, &["b"])).await;
    source.put("twice/m-00001-of-00002.gguf", &part(0, 2, 2, &["a"])).await;
    source.put("twice/m-00002-of-00002.gguf", &part(1, 2, 2, &["a"])).await;
    source.put("split/m-00001-of-00002.gguf", &part(0, 2, 3, &["a", "b"])).await;
    source.put("split/m-00002-of-00002.gguf", &part(1, 2, 3, &["c"])).await;

    let (address, _state) = serve(source.config(Config::default())).await;
    let kind = source.kind();
    let listing = request_async(&address, "/models", &[]).await.json();
    let status = |id: &str| -> (String, Option<String>) {
        let model = listing["models"].as_array().unwrap().iter().find(|m| m["id"] == id);
        let model = model.unwrap_or_else(|| panic!("{kind}: {id} is not listed: {listing}"));
        (model["status"].as_str().unwrap().to_owned(), model["reason"]["code"].as_str().map(str::to_owned))
    };
    let broken = |code: &str| ("broken".to_owned(), Some(code.to_owned()));
    for (name, _, code) in &files {
        assert_eq!(status(&format!("bad/{name}")), broken(code), "{kind}: {name}");
    }
    assert_eq!(status("missing/m"), broken("shard_missing"), "{kind}");
    assert_eq!(status("orphan/m"), broken("shard_missing"), "{kind}: a part without its first is still one model");
    assert_eq!(status("disagree/m"), broken("gguf_split"), "{kind}");
    assert_eq!(status("twice/m"), broken("gguf_duplicate_tensor"), "{kind}");
    for id in ["good", "big", "split/m"] {
        assert_eq!(status(id).0, "ok", "{kind}: {id}");
    }
    let ids: Vec<&str> = listing["models"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert!(!ids.iter().any(|id| id.contains("-0000")), "{kind}: parts are never models of their own: {ids:?}");

    let reply = request_async(&address, &api::model_url("bad/overlap"), &[]).await;
    assert_eq!(reply.status, 422, "{kind}");
    assert!(String::from_utf8_lossy(&reply.body).contains("overlap"), "{kind}");
    let big = request_async(&address, &api::model_url("big"), &[]).await.json();
    assert_eq!(big["attributes"]["tokenizer.chat_template"].as_str().map(str::len), Some(template.len()), "{kind}");
    for (id, object) in [("good", "n"), ("big", "w"), ("split/m", "c")] {
        let reply = request_async(&address, &api::object_url(id, object), &[]).await;
        assert_eq!(reply.status, 200, "{kind}: {id}/{object}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_gguf_in_a_local_directory_is_broken_with_its_reason() {
    hostile_gguf_is_broken_with_its_reason(ModelSource::local()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_gguf_in_s3_is_broken_with_its_reason() {
    hostile_gguf_is_broken_with_its_reason(ModelSource::s3()).await;
}

/// What the `gguf_header` fuzz target does with each of its inputs: read whole, and as a prefix
/// grown while the parser asks, which ends in the same header.
#[test]
fn every_fuzz_input_of_the_gguf_reader_replays_without_a_panic() {
    use ztserve::format::gguf::{HeaderRead, HeaderReads, parse_file, parse_header};
    use ztserve::format::verify::verify_gguf;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut count = 0;
    for dir in ["seeds-gguf", "corpus/gguf_header", "regressions-gguf"] {
        for entry in fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.file_name().is_some_and(|n| n == "README.md") {
                continue;
            }
            let data = fs::read(&path).unwrap();
            let _ = verify_gguf(&[("model.gguf", &data)]);
            let reads = HeaderReads { file_len: data.len() as u64 };
            let mut held = reads.first(64).end;
            let grown = loop {
                match parse_header(&data[..held as usize], data.len() as u64) {
                    Err(HeaderRead::NeedMore { needed }) => held = reads.next(held, needed).end,
                    other => break other.ok(),
                }
            };
            // Compared as printed: a float value may be NaN, which is not equal to itself.
            assert_eq!(format!("{grown:?}"), format!("{:?}", parse_file(&data).ok()), "{}", path.display());
            count += 1;
        }
    }
    assert!(count >= 5, "fuzz/ lost its GGUF inputs: {count}");
    // The seeds are files the gguf package wrote (a split model's parts among them): each is valid.
    for entry in fs::read_dir(root.join("seeds-gguf")).unwrap() {
        let path = entry.unwrap().path();
        let report = verify_gguf(&[(path.file_name().unwrap().to_str().unwrap(), &fs::read(&path).unwrap())]);
        let part = path.to_string_lossy().contains("-of-");
        assert_eq!(report.is_valid(), !part, "{}: {:?}", path.display(), report.errors);
    }
}
