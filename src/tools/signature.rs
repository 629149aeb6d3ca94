//! `ztserve verify DIR`: a model directory's OpenSSF signature (`model_signing`'s `model.sig`)
//! checked with the server's own code: the signer against the keys and CA given, then every
//! file below the directory (as the server lists it: hidden entries left out) against the
//! signed statement, by name and by SHA-256. For an image build or an init container, where a
//! model should fail before it is ever served.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::json;

use crate::signing::{SignatureError, Trust};

/// What is trusted, and where the signature is.
pub struct SignatureCheck {
    pub public_keys: Vec<PathBuf>,
    pub ca_file: Option<PathBuf>,
    /// The signature file's name in the directory.
    pub signature_file: String,
    pub max_signature_bytes: u64,
}

/// Checks `dir`'s signature; returns whether it verifies, after printing the verdict.
pub fn verify_signature(
    dir: &Path,
    check: &SignatureCheck,
    as_json: bool,
    out: &mut dyn Write,
) -> anyhow::Result<bool> {
    let trust = Trust::load(&check.public_keys, check.ca_file.as_deref())?;
    let signature = dir.join(&check.signature_file);
    let verdict = match std::fs::metadata(&signature) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Verdict::Unsigned,
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", signature.display())),
        Ok(meta) if meta.len() > check.max_signature_bytes => {
            Verdict::Failed(SignatureError::TooLarge { size: meta.len(), limit: check.max_signature_bytes })
        }
        Ok(_) => {
            let bytes = std::fs::read(&signature).with_context(|| format!("cannot read {}", signature.display()))?;
            check_directory(dir, &trust, &bytes, check)?
        }
    };
    let (valid, report) = match &verdict {
        Verdict::Verified { signer, files } => (true, json!({ "state": "verified", "signer": signer, "files": files })),
        Verdict::Unsigned => (false, json!({ "state": "unsigned", "signature_file": check.signature_file })),
        Verdict::Failed(error) => {
            (false, json!({ "state": "failed", "reason": { "code": error.code(), "message": error.to_string() } }))
        }
    };
    if as_json {
        let mut report = report;
        report["path"] = json!(dir.display().to_string());
        writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        match &verdict {
            Verdict::Verified { signer, files } => {
                writeln!(out, "{}: verified, signed by {signer} ({files} files)", dir.display())?
            }
            Verdict::Unsigned => writeln!(out, "{}: unsigned (no {})", dir.display(), check.signature_file)?,
            Verdict::Failed(error) => writeln!(out, "{}: FAILED [{}] {error}", dir.display(), error.code())?,
        }
    }
    Ok(valid)
}

enum Verdict {
    Verified { signer: String, files: usize },
    Unsigned,
    Failed(SignatureError),
}

fn check_directory(dir: &Path, trust: &Trust, bytes: &[u8], check: &SignatureCheck) -> anyhow::Result<Verdict> {
    let signed = match trust.verify(bytes, check.max_signature_bytes) {
        Ok(signed) => signed,
        Err(error) => return Ok(Verdict::Failed(error)),
    };
    let mut files = Vec::new();
    super::digest::walk(dir, dir, &mut files)?;
    let mut named: Vec<(String, PathBuf)> = Vec::with_capacity(files.len());
    for file in files {
        let name = file.to_str().with_context(|| format!("{} is not a UTF-8 path", file.display()))?.to_owned();
        if !signed.ignores(&name, &check.signature_file) {
            named.push((name, file));
        }
    }
    named.sort();
    if let Err(error) = signed.match_names(named.iter().map(|(name, _)| name.as_str())) {
        return Ok(Verdict::Failed(error));
    }
    let paths: Vec<PathBuf> = named.iter().map(|(_, path)| path.clone()).collect();
    for ((name, _), hashed) in named.iter().zip(super::digest::sha256_files(dir, &paths)) {
        if let Err(error) = signed.check_digest(name, &hashed?.0) {
            return Ok(Verdict::Failed(error));
        }
    }
    Ok(Verdict::Verified { files: signed.file_count(), signer: signed.signer })
}
