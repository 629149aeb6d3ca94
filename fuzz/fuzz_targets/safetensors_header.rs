//! safetensors headers and index files: the input is a data length (two bytes, little-endian)
//! and a JSON header, wrapped in a file of that much data, so every input reaches the header
//! parser, the offset, size and dtype rules and the content checks. The same JSON is then read
//! as a checkpoint's index whose every shard is that file, reaching the index parser and the
//! rules that hold tensors to their shards. Any panic, hang or excess allocation is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ztserve_format::safetensors::file_around;
use ztserve_format::verify::verify_safetensors;

fuzz_target!(|data: &[u8]| {
    let [low, high, header @ ..] = data else { return };
    let file = file_around(header, usize::from(u16::from_le_bytes([*low, *high])));
    let _ = verify_safetensors(&file, false, |_| unreachable!("a single file has no shards"));
    let _ = verify_safetensors(header, true, |_| Ok(&file[..]));
    if let Ok(parsed) = ztserve_format::safetensors::parse_file(&file) {
        if let Ok(manifest) = parsed.into_manifest(file.len() as u64) {
            let _ = ztserve_format::json::manifest_json(&manifest).to_string();
        }
    }
});
