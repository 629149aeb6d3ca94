//! What the artifact store refuses, and why it failed: one error type for the store, its
//! bucket and its uploads, and the reading of an I/O error (a full disk is a refusal, not a
//! failure).

use std::io;
use std::path::{Path, PathBuf};

/// What the store refuses, and why it failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ArtifactError {
    #[error("{name:?} is not a bundle name: {reason}")]
    BadName { name: String, reason: &'static str },
    #[error("{0:?} is not a SHA-256 digest (64 lowercase hexadecimal digits)")]
    BadDigest(String),
    #[error("the bytes sent hash to sha256:{actual}, not to sha256:{named}")]
    DigestMismatch { named: String, actual: String },
    #[error("a blob of more than {max} bytes is over the store's bound ([artifacts] max_bytes)")]
    TooLarge { max: u64 },
    #[error(
        "the store is full: {held} of its {max} bytes are bundles read more recently, blobs just uploaded, or uploads in progress"
    )]
    Full { held: u64, max: u64 },
    #[error("the store's disk is full (writing {}): nothing was kept", path.display())]
    DiskFull { path: PathBuf },
    #[error("bundle {name:?}: {reason}")]
    BadBundle { name: String, reason: String },
    #[error("bundle {name:?} names sha256:{digest}, which the store does not hold with that size: upload it first")]
    MissingBlob { name: String, digest: String },
    #[error("bundle {0:?} exists: a bundle is published once, and another node published it first")]
    Exists(String),
    #[error("no bundle {0:?}")]
    NoBundle(String),
    #[error("bundle {0:?} is unsigned, and a signature is required")]
    Unsigned(String),
    #[error("bundle {name:?}: {refused}")]
    Signature { name: String, refused: crate::signing::SignatureError },
    #[error("the upload ended before its last byte: {0}")]
    Cut(String),
    #[error("the artifact store's bucket failed: {0}")]
    Bucket(String),
    #[error("{0}")]
    Failed(String),
    #[error("the artifact store failed at {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

pub(super) fn io_at(path: &Path) -> impl FnOnce(io::Error) -> ArtifactError + '_ {
    move |source| match source.kind() {
        // A disk smaller than the bound: refused as a full store, never torn (the temporary goes).
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => ArtifactError::DiskFull { path: path.to_owned() },
        _ => ArtifactError::Io { path: path.to_owned(), source },
    }
}
