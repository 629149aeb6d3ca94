//! OpenSSF model signatures as `model_signing` 1.x (sigstore/model-transparency) writes them,
//! read as bytes: the signature file, a Sigstore bundle holding one DSSE envelope, with its
//! size, depth and counts bounded ([`Bundle`]), the encodings its signature is over ([`pae`],
//! [`pae_compat`]), and its in-toto statement, with a directory's files matched against it
//! ([`SignedModel`]); and the same two written, for a signer ([`write_statement`],
//! [`write_bundle`]). Whether the signer is trusted is the server's to check.

mod bundle;
mod statement;

pub use bundle::{Bundle, Material, pae, pae_compat, write_bundle};
pub use statement::{SignedModel, write_statement};

/// Why a signature does not let a model be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the signature file is {size} bytes, over the {limit} bytes read (signing.max_signature_bytes)")]
    TooLarge { size: u64, limit: u64 },
    #[error("the signature file is not a model_signing bundle: {0}")]
    Malformed(String),
    #[error("the signature is of a kind not verified here: {0}")]
    Unsupported(String),
    #[error("the signer is not trusted: {0}")]
    Untrusted(String),
    #[error("the signature does not verify: {0}")]
    Invalid(String),
    #[error("the signed statement is not model_signing's: {0}")]
    Statement(String),
    #[error("{}", files_differ(unsigned, missing))]
    FilesDiffer { unsigned: Vec<String>, missing: Vec<String> },
    #[error("file {path:?} has SHA-256 {actual}, not the {signed} it was signed with")]
    DigestMismatch { path: String, actual: String, signed: String },
    #[error("it was signed as {signed:?}, not {asked:?}")]
    NameDiffers { signed: String, asked: String },
}

impl SignatureError {
    /// The reason's code, as every protocol names it.
    pub fn code(&self) -> &'static str {
        match self {
            SignatureError::TooLarge { .. } | SignatureError::Malformed(_) => "signature_malformed",
            SignatureError::Unsupported(_) => "signature_unsupported",
            SignatureError::Untrusted(_) => "signature_untrusted",
            SignatureError::Invalid(_) => "signature_invalid",
            SignatureError::Statement(_) => "signature_statement",
            SignatureError::FilesDiffer { missing, .. } if missing.is_empty() => "signature_unsigned_file",
            SignatureError::FilesDiffer { unsigned, .. } if unsigned.is_empty() => "signature_missing_file",
            SignatureError::FilesDiffer { .. } => "signature_files_differ",
            SignatureError::DigestMismatch { .. } => "signature_digest_mismatch",
            SignatureError::NameDiffers { .. } => "signature_name",
        }
    }
}

/// At most this many names are shown of a list of files.
const NAMES_SHOWN: usize = 5;

fn files_differ(unsigned: &[String], missing: &[String]) -> String {
    let shown = |names: &[String]| {
        let mut text = names.iter().take(NAMES_SHOWN).map(|n| format!("{n:?}")).collect::<Vec<_>>().join(", ");
        if names.len() > NAMES_SHOWN {
            text.push_str(&format!(" and {} more", names.len() - NAMES_SHOWN));
        }
        text
    };
    let mut parts = Vec::new();
    if !unsigned.is_empty() {
        parts.push(format!("files not in the signature: {}", shown(unsigned)));
    }
    if !missing.is_empty() {
        parts.push(format!("files the signature lists are missing: {}", shown(missing)));
    }
    parts.join("; ")
}
