//! Where bytes come from: one object-safe async trait, [`Storage`], over a local directory
//! (`local.rs`, which also memory-maps files for the zero-copy fast path) and an S3 bucket
//! prefix (`s3.rs`, through `object_store`). A backend lists the `.zt` objects under its root
//! and reads byte ranges of one object *version*: a read of an object that changed since it
//! was listed fails with [`StorageError::Changed`] rather than mixing two versions.
//! `tests/storage_conformance.rs` runs one suite against every backend.

pub mod local;
pub mod scan;
pub mod s3;

use std::ops::Range;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;

/// One `.zt` object found under a source's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The path below the root, `/`-separated, with its `.zt` extension.
    pub key: String,
    pub size: u64,
    /// What identifies this version of the object (an ETag, or a file's identity).
    pub version: String,
}

/// Which bytes of an object to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ByteRange {
    /// These bytes (must lie within the object).
    Bounded(Range<u64>),
    /// The last `n` bytes, or the whole object when it is shorter.
    Suffix(u64),
}

/// A read under way: where it lies in the object, and its bytes as they arrive.
pub struct Read {
    /// The object's whole size.
    pub size: u64,
    /// The bytes the stream holds.
    pub range: Range<u64>,
    pub bytes: BoxStream<'static, Result<Bytes, StorageError>>,
}

impl Read {
    /// Collects the whole read from `source_name` into one buffer (for small reads such as
    /// manifests).
    pub async fn collect(self, source_name: &str) -> Result<(u64, Range<u64>, Vec<u8>), StorageError> {
        use futures_util::StreamExt as _;
        let mut out = Vec::with_capacity((self.range.end - self.range.start) as usize);
        let mut bytes = self.bytes;
        while let Some(piece) = bytes.next().await {
            out.extend_from_slice(&piece?);
        }
        if out.len() as u64 != self.range.end - self.range.start {
            return Err(StorageError::Unavailable {
                source_name: source_name.to_owned(),
                message: format!("read ended after {} of {} bytes", out.len(), self.range.end - self.range.start),
            });
        }
        Ok((self.size, self.range, out))
    }
}

/// Why storage could not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageError {
    #[error("{source_name}: {key} does not exist")]
    NotFound { source_name: String, key: String },
    #[error("{source_name}: {key} changed since it was listed")]
    Changed { source_name: String, key: String },
    #[error("{source_name}: range {start}..{end} is outside the object")]
    OutOfRange { source_name: String, start: u64, end: u64 },
    /// Temporary: the store did not answer, or answered an error worth retrying later.
    #[error("{source_name} is unavailable: {message}")]
    Unavailable { source_name: String, message: String },
    /// Lasting until an operator acts: bad credentials, a missing bucket, a bad setting.
    #[error("{source_name} refuses access: {message}")]
    Refused { source_name: String, message: String },
}

/// A place `.zt` objects live.
pub trait Storage: Send + Sync + std::fmt::Debug {
    /// The source as configured (`models`, `s3://bucket/prefix`).
    fn name(&self) -> &str;
    /// Every `.zt` object under the root, in key order.
    fn list(&self) -> BoxFuture<'_, Result<Vec<Listed>, StorageError>>;
    /// Reads `range` of `key`, only from the version `version`.
    fn read(&self, key: &str, range: ByteRange, version: &str) -> BoxFuture<'_, Result<Read, StorageError>>;
}
