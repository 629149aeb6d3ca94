//! The v2 manifest, past its hash: the input is a heap size (one byte, in 4096-byte pages) and
//! a manifest, wrapped in a well-formed v2 container whose footer carries the manifest's true
//! XXH3-64, so every input reaches the deterministic-CBOR decoder, the schema, the blob, layout
//! and shard rules, decoding and the data rules (mutating whole files rarely gets past the
//! hash). Shards resolve to one fixed data shard. Any panic, hang or allocation beyond the
//! limits is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ztserve_format::Limits;
use ztserve_format::v2::file_around;

fuzz_target!(|data: &[u8]| {
    let Some((&pages, manifest)) = data.split_first() else { return };
    let heap: Vec<u8> = (0..4096 * usize::from(pages)).map(|i| (i.wrapping_mul(31) % 251) as u8).collect();
    let file = file_around(&heap, manifest);
    let shard = file_around(&heap[..heap.len().min(8192)], &[]);
    let limits = Limits { max_manifest_bytes: 1 << 20, max_decoded_bytes: 16 << 20, ..Limits::default() };
    let _ = ztserve_format::verify::verify_model(&file, |_| Ok(&shard[..]), &limits);
    if let Ok(manifest) = ztserve_format::parse_file(&file, &limits) {
        let _ = ztserve_format::json::manifest_json(&manifest).to_string();
    }
});
