//! OpenSSF model signatures: the input is read as a signature file (a Sigstore bundle) and, when
//! one parses, its payload as the signed statement, then matched against a directory's names;
//! the input is also read as a statement itself, so the statement's reader is reached without
//! base64. Any panic, hang or excess allocation is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ztserve_format::model_signature::{Bundle, SignedModel, pae, pae_compat};

fn statement(payload: &[u8]) {
    if let Ok(signed) = SignedModel::from_payload(payload, String::new()) {
        let _ = signed.ignores("a/b", "model.sig");
        let _ = signed.match_names(["config.json", "model.safetensors"]);
        let _ = signed.check_digest("config.json", &[0; 32]);
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(bundle) = Bundle::parse(data, 1 << 20) {
        let _ = (pae(&bundle.payload), pae_compat(&bundle.payload));
        statement(&bundle.payload);
    }
    statement(data);
});
