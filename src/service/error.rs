//! `ServiceError`: why the domain could not give a request what it asked for, each variant
//! naming the model (and object, component) it concerns and keeping its cause, and classified
//! here once ([`ErrorKind`]: not found, gone, bad input, refused, busy, unavailable, internal)
//! with its code, its retry time and what a client may read of it. Each wire protocol maps the kinds to
//! its own statuses and codes in one exhaustive match; nothing here knows HTTP.

use crate::catalog::CatalogError;
use crate::format::FormatError;
use crate::served::INTERNAL_MESSAGE;
use crate::storage::StorageError;

/// Why the service could not be set up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SetupError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error(transparent)]
    DigestStore(#[from] crate::digests::DigestStoreError),
    #[error(transparent)]
    Cache(#[from] crate::storage::cache::CacheError),
    #[error("signing: {0}")]
    Trust(#[from] crate::signing::TrustError),
    #[error("the delta store (refits.delta_dir): {0}")]
    DeltaStore(std::io::Error),
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
    /// A version of a trainer's lineage (`[refits] lineages`) its source lists but that is not
    /// listed: older than the versions kept, or without its ready marker.
    #[error("{gone}")]
    LineageVersionGone { model: String, gone: Box<crate::catalog::GoneVersion> },
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
    /// A request for many regions that is refused as written.
    #[error("model {model:?}: {reason}")]
    BadRegions { model: String, reason: super::regions::RegionsRefusal },
    /// The digests a request needs are still being computed (each file version is hashed
    /// once, in the background): retry after `retry_after_secs`.
    #[error(
        "the SHA-256 digests of model {model:?} are being computed ({} of {} hashed); retry in {retry_after_secs} s",
        human_bytes(*hashed), human_bytes(*total)
    )]
    DigestPending { model: String, hashed: u64, total: u64, retry_after_secs: u64 },
    /// A published file that no tar layer can hold (its path is no plain relative name).
    #[error("model {model:?} cannot be an image: {reason}")]
    NoImageLayer { model: String, reason: String },
    #[error("model {model:?} is not served: its signature fails: {source}")]
    SignatureFailed { model: String, source: crate::signing::SignatureError },
    #[error(
        "model {model:?} is not served: it is unsigned (no {signature_file} in its directory or above it) and its source requires a signature"
    )]
    Unsigned { model: String, signature_file: String },
    /// A delta whose two regions together need more memory than `refits.delta_memory_bytes`.
    #[error(
        "model {model:?}, object {object:?}: the delta of this region holds {need} bytes of both versions at once; at most {limit} are held (refits.delta_memory_bytes): ask for smaller slices"
    )]
    DeltaRegionTooLarge { model: String, object: String, need: u64, limit: u64 },
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

/// What kind of failure an error is: the one classification every protocol maps to its own
/// status and code, each with an exhaustive match, so a new kind is placed in every protocol
/// before it compiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    /// What the request names does not exist: a model, version, object, component or file.
    NotFound,
    /// What the request names existed, or will, but is not served: a version of a trainer's
    /// lineage older than those kept, or not yet ready. A client falls back to a version kept.
    Gone,
    /// The request cannot be answered as written (a slice that cannot be cut).
    BadInput,
    /// What the request names exists but cannot be served (a broken model, an invalid
    /// component): asking again gives the same answer until the file changes.
    Refused,
    /// The server is working on it or at capacity: ask again after `retry_after_secs`.
    Busy { retry_after_secs: u64 },
    /// The catalog or a source cannot answer now: ask again after `retry_after_secs`.
    Unavailable { retry_after_secs: u64 },
    /// A defect of ours: its detail goes to the log, never to the client.
    Internal,
    /// The request asks for more than a bound lets one answer hold: asking again as written
    /// gives the same answer.
    TooLarge,
}

impl ErrorKind {
    /// Seconds a client should wait before asking again, for a failure that passes with time.
    pub(crate) fn retry_after_secs(self) -> Option<u64> {
        match self {
            ErrorKind::Busy { retry_after_secs } | ErrorKind::Unavailable { retry_after_secs } => {
                Some(retry_after_secs)
            }
            ErrorKind::NotFound
            | ErrorKind::Gone
            | ErrorKind::BadInput
            | ErrorKind::Refused
            | ErrorKind::Internal
            | ErrorKind::TooLarge => None,
        }
    }
}

impl ServiceError {
    /// What kind of failure this is.
    pub(crate) fn kind(&self) -> ErrorKind {
        use ServiceError as S;
        match self {
            S::ModelNotFound(_)
            | S::VersionGone { .. }
            | S::ObjectNotFound { .. }
            | S::ComponentNotFound { .. }
            | S::FileNotFound { .. }
            | S::ViewFileNotFound { .. }
            | S::SeveralFiles { .. } => ErrorKind::NotFound,
            S::LineageVersionGone { .. } => ErrorKind::Gone,
            S::BadSlice { .. } | S::BadRegions { .. } => ErrorKind::BadInput,
            S::BrokenModel { .. }
            | S::InvalidComponent { .. }
            | S::NoImageLayer { .. }
            | S::SignatureFailed { .. }
            | S::Unsigned { .. } => ErrorKind::Refused,
            S::DecodersBusy => ErrorKind::Busy { retry_after_secs: 1 },
            S::DigestPending { retry_after_secs, .. } => ErrorKind::Busy { retry_after_secs: *retry_after_secs },
            S::NotReady | S::ChangedOnDisk { .. } => ErrorKind::Unavailable { retry_after_secs: 1 },
            // A changed object is listed again at the next rescan; an unreachable store takes longer.
            S::Storage { source, .. } if source.is_about_the_object() => ErrorKind::Unavailable { retry_after_secs: 1 },
            S::Storage { .. } | S::NotCached { .. } => ErrorKind::Unavailable { retry_after_secs: 5 },
            S::DeltaRegionTooLarge { .. } => ErrorKind::TooLarge,
            S::Internal(_) => ErrorKind::Internal,
        }
    }

    /// The machine-readable name of this failure (the HTTP contract's `error.code`).
    pub(crate) fn code(&self) -> &'static str {
        use ServiceError as S;
        match self {
            S::NotReady => "not_ready",
            S::ModelNotFound(_) => "model_not_found",
            S::VersionGone { .. } | S::LineageVersionGone { .. } => "version_gone",
            S::ObjectNotFound { .. } => "object_not_found",
            S::ComponentNotFound { .. } => "component_not_found",
            S::BrokenModel { .. } => "broken_model",
            S::InvalidComponent { .. } => "invalid_component",
            S::DecodersBusy => "decoders_busy",
            S::FileNotFound { .. } => "file_not_found",
            S::ViewFileNotFound { .. } => "view_file_not_found",
            S::SeveralFiles { .. } => "several_files",
            S::ChangedOnDisk { .. } => "changed_on_disk",
            S::NotCached { .. } => "not_cached",
            S::Storage { source: crate::storage::StorageError::Corrupt { .. }, .. } => "origin_corrupt",
            S::Storage { source, .. } if source.is_about_the_object() => "changed_in_source",
            S::Storage { .. } => "source_unavailable",
            S::BadSlice { source, .. } => source.code(),
            S::BadRegions { reason, .. } => reason.code(),
            S::DigestPending { .. } => "digest_pending",
            S::NoImageLayer { .. } => "no_image_layer",
            S::SignatureFailed { .. } => "signature_failed",
            S::Unsigned { .. } => "unsigned_model",
            S::DeltaRegionTooLarge { .. } => "delta_region_too_large",
            S::Internal(_) => "internal",
        }
    }

    /// Why a model's file cannot be served, for a refusal: the format's own reason code.
    pub(crate) fn reason(&self) -> Option<&'static str> {
        match self {
            ServiceError::BrokenModel { source, .. } => Some(source.code()),
            ServiceError::InvalidComponent { source, .. } => Some(source.code()),
            ServiceError::SignatureFailed { source, .. } => Some(source.code()),
            _ => None,
        }
    }

    /// Seconds a client should wait before asking again, for a failure that passes with time.
    pub(crate) fn retry_after_secs(&self) -> Option<u64> {
        self.kind().retry_after_secs()
    }

    /// What a client may read of this error, logging once what it leaves out: an internal
    /// error's detail (at ERROR) and a store's own words (endpoints, request ids; at WARN).
    /// Everything else the client is told whole, and the request's log line is enough.
    pub(crate) fn message_for_client(&self) -> String {
        match self {
            ServiceError::Internal(_) => {
                tracing::error!(error = %self, "request failed");
                INTERNAL_MESSAGE.to_owned()
            }
            ServiceError::Storage { model, source } => {
                tracing::warn!(error = %self, "storage failed");
                if source.is_about_the_object() {
                    format!("model {model:?} changed in its source; it is served again after the next rescan")
                } else {
                    format!("the source of model {model:?} is unavailable; retry later")
                }
            }
            _ => self.to_string(),
        }
    }

    pub(crate) fn invalid(model: &str, source: FormatError) -> ServiceError {
        ServiceError::InvalidComponent { model: model.to_owned(), source: Box::new(source) }
    }
}

impl crate::served::ClientFacing for ServiceError {
    fn message_for_client(&self) -> String {
        ServiceError::message_for_client(self)
    }

    fn retry_after_secs(&self) -> Option<u64> {
        ServiceError::retry_after_secs(self)
    }
}

impl crate::served::BodyAborted for ServiceError {
    fn body_aborted(reason: String) -> ServiceError {
        ServiceError::Internal(format!("response body aborted: {reason}"))
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
