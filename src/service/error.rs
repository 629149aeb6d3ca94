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
    #[error("internal error: {0}")]
    Internal(String),
}

impl ServiceError {
    pub(crate) fn invalid(model: &str, source: FormatError) -> ServiceError {
        ServiceError::InvalidComponent { model: model.to_owned(), source: Box::new(source) }
    }
}
