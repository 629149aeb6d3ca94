//! A model's stored bytes for one response: its
//! local file's mapping (sent by `sendfile`) with the descriptor behind it (read with
//! `pread`), or its listed S3 object version, with the source's health updated by every remote
//! read; the strong entity tags of what a model version serves and the model version, which
//! every protocol sends (HTTP's and the Hub's `ETag`, S3's `ETag`, the Hub's commit) and the
//! digests key on.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::{FutureExt as _, StreamExt as _};

use super::ServiceError;
use super::representation::{ByteStream, RangeSource, guard, guarded};
use crate::catalog::{Companion, Model, Source, StoredFile};
use crate::decode::Stored;
use crate::format::Manifest;
use crate::storage::mapped::MappedFile;
use crate::storage::{FileRegion, ObjectVersion, Readahead, StorageError};

/// Where a model's stored bytes are read from for one response.
pub(crate) enum ModelBytes {
    /// The whole file, mapped (for sending only; see [`Stored::File`]), and the file as a
    /// region, which the server's own reads go through.
    Mapped { bytes: Bytes, file: FileRegion, version: String },
    /// The object version listed: every read of the response is bound to it.
    Remote { object: ObjectVersion, source: Arc<Source> },
}

impl ModelBytes {
    /// The stored bytes at `range` of the file, for decoding or hashing.
    pub(crate) fn stored(&self, range: Range<u64>) -> Stored {
        match self {
            ModelBytes::Mapped { file, .. } => Stored::File(file.slice(range)),
            ModelBytes::Remote { object, .. } => Stored::Remote { object: object.clone(), range },
        }
    }

    /// The bytes at `range` of the file, served as they are.
    pub(crate) fn served(&self, readahead: &Readahead, model: &str, range: Range<u64>) -> Arc<dyn RangeSource> {
        match self {
            ModelBytes::Mapped { bytes, file, version } => Arc::new(MappedVersion {
                bytes: bytes.slice(range.start as usize..range.end as usize),
                mapping: Arc::clone(file.mapping()),
                version: version.clone(),
            }),
            ModelBytes::Remote { object, source } => Arc::new(RemoteRange {
                object: object.clone(),
                source: Arc::clone(source),
                model: model.to_owned(),
                start: range.start,
                len: range.end - range.start,
                readahead: readahead.clone(),
            }),
        }
    }

    /// Every byte of `range`, in one buffer (for content checks, which need whole components).
    pub(crate) async fn fetch(&self, source: &Source, model: &str, range: Range<u64>) -> Result<Bytes, ServiceError> {
        let fetched = crate::storage::collect(self.stored(range).stream(0, "check")).await;
        storage_outcome(source, model, fetched)
    }
}

/// Records a remote read's outcome on its source's health and turns a failure into the
/// response's error.
pub(crate) fn storage_outcome<T>(
    source: &Source,
    model: &str,
    outcome: Result<T, StorageError>,
) -> Result<T, ServiceError> {
    match outcome {
        Ok(value) => {
            // A read through the disk cache may not have reached the origin: a cached source
            // recovers at its next listing.
            if source.cache().is_none() {
                source.report_success();
            }
            Ok(value)
        }
        Err(e) => Err(storage_failed(source, model, e)),
    }
}

/// Records a remote read's failure on its source's health, as the response's error.
pub(crate) fn storage_failed(source: &Source, model: &str, error: StorageError) -> ServiceError {
    source.report_failure(&error);
    ServiceError::Storage { model: model.to_owned(), source: error }
}

/// Bytes of a mapped file's version, sent by reference: the last piece of each body waits
/// until the file is found still that version, so a file rewritten in place while it was sent
/// (its size and modification time restored, even) ends the response short of its length.
struct MappedVersion {
    bytes: Bytes,
    mapping: Arc<MappedFile>,
    version: String,
}

impl RangeSource for MappedVersion {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn open(&self, range: Range<u64>) -> ByteStream {
        guarded(self.bytes.open(range), unchanged(Arc::clone(&self.mapping), self.version.clone()))
    }
}

/// The check before a body's last piece that the mapped file is still `version`: bytes sent
/// from a mapping are whatever the file holds when the kernel copies them.
pub(super) fn unchanged(mapping: Arc<MappedFile>, version: String) -> super::representation::Guard {
    // One `fstat`, on this thread: a hop to the blocking pool cost 14% of the requests
    // a second of 1 MiB ranges at 4 connections.
    guard(async move {
        match mapping.is_version(&version) {
            true => Ok(()),
            false => Err("the file changed in place while it was sent".to_owned()),
        }
    })
}

/// Raw bytes of a listed object read through its storage: ranged GETs from S3 (split and run in
/// parallel when long), reads of a local file.
pub(super) struct RemoteRange {
    pub(super) object: ObjectVersion,
    pub(super) source: Arc<Source>,
    pub(super) model: String,
    pub(super) start: u64,
    pub(super) len: u64,
    pub(super) readahead: Readahead,
}

/// A gap of a remote object shorter than this is read through rather than asked for in a new
/// request: a request's latency to a store (tens of milliseconds) moves megabytes.
const REMOTE_GAP_WORTH_READING: u64 = 2 << 20;

impl RangeSource for RemoteRange {
    fn len(&self) -> u64 {
        self.len
    }

    fn gap_worth_reading(&self) -> futures_util::future::BoxFuture<'_, Result<u64, ServiceError>> {
        futures_util::future::ready(Ok(REMOTE_GAP_WORTH_READING)).boxed()
    }

    fn open(&self, range: Range<u64>) -> ByteStream {
        let (source, model) = (Arc::clone(&self.source), self.model.clone());
        let at = self.start + range.start..self.start + range.end;
        self.object
            .read_ahead(at, &self.readahead, "serve")
            .map(move |piece| storage_outcome(&source, &model, piece))
            .boxed()
    }
}

/// The model's stored bytes for one response. A file from a backend that maps files is
/// mapped once per model version (the storage checks the mapping is of the version listed)
/// and checked against the file's identity now (one `fstat`), so a file truncated or
/// rewritten in place is refused rather than read; it is checked again before the last piece
/// of the response goes out ([`ModelBytes::served`]).
pub(crate) async fn model_bytes(
    model: &Arc<Model>,
    manifest: &Manifest,
    file: usize,
) -> Result<ModelBytes, ServiceError> {
    let StoredFile { object, mapping, .. } = model
        .files
        .get(file)
        .ok_or_else(|| ServiceError::Internal(format!("model {:?} has no stored file {file}", model.id)))?;
    // The file holding the manifest is as long as the manifest says; the others as listed.
    let expected_len = model.file_len(manifest, file);
    let changed = || ServiceError::ChangedOnDisk { model: model.id.clone() };
    let mapping = match mapping.get() {
        Some(mapping) => Arc::clone(mapping),
        None => match object.mapping().await {
            Ok(Some(mapped)) => Arc::clone(mapping.get_or_init(|| mapped)),
            Ok(None) => {
                servable(&model.source, &model.id, object)?;
                return Ok(ModelBytes::Remote { object: object.clone(), source: Arc::clone(&model.source) });
            }
            Err(e) if e.is_about_the_object() => return Err(changed()),
            Err(e) => return Err(storage_failed(&model.source, &model.id, e)),
        },
    };
    if mapping.len() as u64 != expected_len || !mapping.is_version(&object.version) {
        return Err(changed());
    }
    Ok(ModelBytes::Mapped {
        bytes: Bytes::from_owner(ArcBytes(Arc::clone(&mapping))),
        file: FileRegion::whole(mapping, &model.source.name, &object.key),
        version: object.version.clone(),
    })
}

/// Refuses at once, rather than partway through a body, an object its source cannot give now:
/// the source is failing and its disk cache holds only part of the object.
pub(super) fn servable(source: &Source, model: &str, object: &ObjectVersion) -> Result<(), ServiceError> {
    if let Some(cache) = source.cache()
        && source.failure().is_some()
    {
        let cached = cache.cached_bytes(&object.key, &object.version, object.size);
        if cached < object.size {
            return Err(ServiceError::NotCached {
                model: model.to_owned(),
                key: object.key.clone(),
                cached,
                size: object.size,
            });
        }
    }
    Ok(())
}

/// Lets `Bytes` share ownership of a mapping.
struct ArcBytes(Arc<MappedFile>);

impl AsRef<[u8]> for ArcBytes {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// A strong ETag for the stored object's version, plus a discriminator for what part of it
/// is served.
pub(crate) fn etag(model: &Model, part: &str) -> String {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    hasher.update(model.version.as_bytes());
    hasher.update([0]);
    hasher.update(part.as_bytes());
    format!("\"{:x}-{}\"", model.size, hex::encode(&hasher.finalize()[..12]))
}

/// `X-Zt-Model-Version`: the stored file's ETag, on every response drawn from a model (its
/// manifest, objects, components and file). Each part has an ETag of its own, so a client
/// that reads a model in many requests compares this instead, to know that every piece came
/// from one version of the file and none from a replacement.
pub(crate) fn model_version(model: &Model) -> String {
    etag(model, "file")
}

/// The model version as it goes into a version-pinned URL (`{id}@{token}`): the
/// `X-Zt-Model-Version` value without its quotes.
pub(crate) fn version_token(model: &Model) -> String {
    model_version(model).trim_matches('"').to_owned()
}

/// The ETag of a file beside the model: its own version's, within the model's.
pub(crate) fn companion_etag(model: &Model, companion: &Companion) -> String {
    etag(model, &format!("companion\0{}\0{}", companion.name, companion.object.version))
}

/// The ETag of the model's stored file `index`: the `/file` tag for a model of one file.
pub(crate) fn stored_file_etag(model: &Model, index: usize) -> String {
    match model.files.get(index) {
        Some(file) if model.files.len() > 1 => etag(model, &format!("file\0{}", file.name)),
        _ => etag(model, "file"),
    }
}

/// A stored file's bytes, as served.
pub(crate) struct StoredBytes {
    pub source: Arc<dyn RangeSource>,
    pub etag: String,
}
