//! `ServiceError`: why the domain could not give a request what it asked for, each variant
//! naming the model (and object, component) it concerns and keeping its cause. The wire
//! protocols choose statuses from it (`http/error.rs`); nothing here knows HTTP.

use crate::catalog::CatalogError;
use crate::format::FormatError;
use crate::storage::StorageError;

/// Why the service could not be set up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SetupError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error(transparent)]
    DigestStore(#[from] super::digests::DigestStoreError),
    #[error(transparent)]
    Cache(#[from] crate::storage::cache::CacheError),
}

#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum ServiceError {
    #[error("the catalog is not ready yet")]
    NotReady,
    #[error("no model {0:?}")]
    ModelNotFound(String),
    /// A version-pinned URL whose version the model no longer has.
    #[error("model {model:?} is no longer at version {version}; it is at {current}")]
    VersionGone { model: String, version: String, current: String },
    #[error("model {model:?} has no object {object:?}")]
    ObjectNotFound { model: String, object: String },
    #[error("object {object:?} of model {model:?} has no component {role:?}; its components are {available}")]
    ComponentNotFound { model: String, object: String, role: String, available: String },
    #[error("model {model:?} is broken: {source}")]
    BrokenModel { model: String, source: Box<CatalogError> },
    #[error("model {model:?}: {source}")]
    InvalidComponent { model: String, source: Box<FormatError> },
    /// Every decoder stayed busy for `decode_wait_ms`.
    #[error("every decoder is busy; retry shortly")]
    DecodersBusy,
    #[error("model {model:?} has no stored file {name:?}; its files are {available}")]
    FileNotFound { model: String, name: String, available: String },
    #[error("the safetensors view of model {model:?} has no file {name:?}; its files are {available}")]
    ViewFileNotFound { model: String, name: String, available: String },
    /// `/file` of a model stored in several files: each is served by name.
    #[error("model {model:?} is stored in {count} files, not one: fetch each from its URL under /files/")]
    SeveralFiles { model: String, count: usize },
    #[error("model {model:?} changed on disk; it is served again after the next rescan")]
    ChangedOnDisk { model: String },
    /// The source cannot be read now and the disk cache holds only part of the file: refused
    /// before any byte, rather than cut short partway.
    #[error(
        "the source of model {model:?} is unavailable and the disk cache holds {cached} of the {size} bytes of {key}; retry later"
    )]
    NotCached { model: String, key: String, cached: u64, size: u64 },
    /// Storage could not give a model's bytes: its source is unavailable or refuses access,
    /// or the object changed since it was listed.
    #[error("model {model:?}: {source}")]
    Storage { model: String, source: StorageError },
    /// A slice that cannot be cut from the object (the spec, or the object's kind).
    #[error("model {model:?}, object {object:?}: {source}")]
    BadSlice { model: String, object: String, source: crate::format::slice::SliceError },
    /// The digests a request needs are still being computed (each file version is hashed
    /// once, in the background): retry after `retry_after_secs`.
    #[error(
        "the SHA-256 digests of model {model:?} are being computed ({} of {} hashed); retry in {retry_after_secs} s",
        human_bytes(*hashed), human_bytes(*total)
    )]
    DigestPending { model: String, hashed: u64, total: u64, retry_after_secs: u64 },
    #[error("internal error: {0}")]
    Internal(String),
}

/// `bytes` as a person reads them (`1.5 GB`, decimal as file managers and the Hub show sizes).
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit < UNITS.len() - 1 {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

impl ServiceError {
    /// Seconds a client should wait before asking again, for a refusal that passes with time.
    pub(crate) fn retry_after_secs(&self) -> Option<u64> {
        match self {
            ServiceError::DigestPending { retry_after_secs, .. } => Some(*retry_after_secs),
            _ => None,
        }
    }

    pub(crate) fn invalid(model: &str, source: FormatError) -> ServiceError {
        ServiceError::InvalidComponent { model: model.to_owned(), source: Box::new(source) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_digest_says_how_far_hashing_is_in_bytes_a_person_reads() {
        let pending = ServiceError::DigestPending {
            model: "deepseek/v3".into(),
            hashed: 12_345_000_000,
            total: 703_000_000_000,
            retry_after_secs: 42,
        };
        assert_eq!(
            pending.to_string(),
            "the SHA-256 digests of model \"deepseek/v3\" are being computed (12.3 GB of 703.0 GB hashed); retry in 42 s"
        );
        assert_eq!(pending.retry_after_secs(), Some(42));
        assert_eq!(human_bytes(999), "999 B");
    }
}
