//! Unit tests of the file-level reads: finding a manifest with the fewest reads, and telling
//! stored files apart by name.

use std::ops::Range;

use super::*;
use crate::write::{ComponentInput, ObjectInput, WriteOptions, Writer};

/// A 1.2 file of `objects` one-byte tensors: its manifest grows with the count.
fn file(objects: usize) -> Vec<u8> {
    let names: Vec<String> = (0..objects).map(|i| format!("tensor.{i}")).collect();
    let mut writer = Writer::new(Vec::new()).unwrap();
    for name in &names {
        let data = ComponentInput { role: "data", dtype: DType::U8, logical_type: None, bytes: &[7] };
        let object = ObjectInput { name, shape: &[1], format: "dense", attributes: None, components: vec![data] };
        writer.add(&object, &WriteOptions::default()).unwrap();
    }
    writer.finish(None).unwrap()
}

/// Drives the reads as a remote reader would, counting the bytes it fetched.
fn read(file: &[u8], suffix: u64) -> (Manifest, u64, bool) {
    let reads = ManifestReads::new(file.len() as u64, suffix);
    let slice = |range: Range<u64>| &file[range.start as usize..range.end as usize];
    let located = reads.locate(slice(reads.head()), slice(reads.tail()), &Limits::default()).unwrap();
    let fetched =
        reads.head().end + (reads.tail().end - reads.tail().start) + located.missing.end - located.missing.start;
    let manifest = located.parse(slice(reads.tail()), slice(located.missing.clone()), &Limits::default()).unwrap();
    (manifest, fetched, located.missing.is_empty())
}

#[test]
fn a_manifest_is_found_with_a_second_read_only_when_the_tail_does_not_hold_it() {
    let bytes = file(200);
    let whole = parse_file(&bytes, &Limits::default()).unwrap();
    for suffix in [0, 16, 100, 4096, 1 << 20] {
        let (manifest, fetched, one_read) = read(&bytes, suffix);
        assert_eq!(manifest, whole, "suffix {suffix}");
        let span_len = whole.manifest_span.end - whole.manifest_span.start;
        assert_eq!(one_read, suffix.max(MAX_TRAILER_LEN) >= span_len + 16, "suffix {suffix}");
        assert!(fetched <= HEADER_LEN + suffix.max(MAX_TRAILER_LEN).min(bytes.len() as u64) + span_len);
    }
}

#[test]
fn files_are_told_apart_by_name() {
    let cases = [
        ("org/llama.zt", Some(FileKind::Zt)),
        ("org/llama.safetensors", Some(FileKind::Safetensors)),
        ("org/llama/model.safetensors.index.json", Some(FileKind::SafetensorsIndex)),
        ("org/llama/other.safetensors.index.json", Some(FileKind::SafetensorsIndex)),
        ("model.safetensors.index.json", Some(FileKind::SafetensorsIndex)),
        ("org/llama/model.safetensors", Some(FileKind::Safetensors)),
        ("model.safetensors", Some(FileKind::Safetensors)),
        ("org/llama/model.zt", Some(FileKind::Zt)),
        ("model.zt", Some(FileKind::Zt)),
        ("org/llama/mymodel.zt", Some(FileKind::Zt)),
        ("org/llama/model-00001-of-00002.safetensors", Some(FileKind::Safetensors)),
        ("org/config.json", None),
        ("org/.safetensors", None),
        ("org/.zt", None),
        ("org/llama.zt.partial", None),
        ("org/tiny-gguf/model.gguf", Some(FileKind::Gguf)),
        ("org/tiny/tiny-Q4_K_M.gguf", Some(FileKind::Gguf)),
        ("org/tiny/tiny-Q8_0-00002-of-00003.gguf", Some(FileKind::Gguf)),
        ("org/tiny/model-00001-of-00002.gguf", Some(FileKind::Gguf)),
        ("tiny-00001-of-00002.gguf", Some(FileKind::Gguf)),
        ("org/.gguf", None),
    ];
    for (key, expected) in cases {
        assert_eq!(FileKind::of(key), expected, "{key}");
    }
}
