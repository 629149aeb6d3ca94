//! GGUF files: the input is a whole file, read every way the server and the tools read one:
//! whole (`verify_gguf`), as the first part of a split model, and as a remote reader reads it,
//! a prefix grown while the parser asks for more, which must ask only for bytes the file has
//! and end in the same header. A parsed model's manifest is rendered and every tensor's slice
//! geometry planned. Any panic, hang or excess allocation is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ztserve_format::gguf::{HeaderRead, HeaderReads, parse_file, parse_header, parse_model};
use ztserve_format::verify::verify_gguf;

fuzz_target!(|data: &[u8]| {
    let _ = verify_gguf(&[("model.gguf", data)]);
    let _ = verify_gguf(&[("model-00001-of-00002.gguf", data), ("model-00002-of-00002.gguf", data)]);
    let file_len = data.len() as u64;
    let reads = HeaderReads { file_len };
    let mut held = reads.first(64).end;
    let grown = loop {
        match parse_header(&data[..held as usize], file_len) {
            Err(HeaderRead::NeedMore { needed }) => {
                assert!(needed > held && needed <= file_len, "asked for {needed} holding {held} of {file_len}");
                held = reads.next(held, needed).end;
            }
            other => break other.ok(),
        }
    };
    // Compared as printed: a float value may be NaN, which is not equal to itself.
    let whole = parse_file(data).ok();
    assert_eq!(format!("{grown:?}"), format!("{whole:?}"), "a header read in pieces differs from the whole file's");
    if let Ok(manifest) = parse_model(&[("model.gguf", data)]) {
        let _ = ztserve_format::json::manifest_json(&manifest).to_string();
        for object in &manifest.objects {
            let _ = ztserve_format::slice::geometry(object);
        }
    }
});
