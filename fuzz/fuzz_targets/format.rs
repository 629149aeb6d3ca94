//! Parse, validate, decode, check digests and content, and render JSON for arbitrary bytes:
//! any panic, hang or allocation beyond the limits is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ztserve_format::Limits;

fuzz_target!(|data: &[u8]| {
    let limits = Limits { max_manifest_bytes: 1 << 20, max_decoded_bytes: 16 << 20, ..Limits::default() };
    let _ = ztserve_format::verify::verify_file(data, &limits);
    if let Ok(manifest) = ztserve_format::parse_file(data, &limits) {
        let _ = ztserve_format::json::manifest_json(&manifest).to_string();
    }
});
