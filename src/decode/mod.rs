//! Decoded components in memory, one concern per file: where stored bytes come from
//! ([`source`]), a decoder partway through them ([`cursor`]), the shared decode every request
//! for a component reads ([`shared`]), the private decode for one that cannot be held
//! ([`private`]), and the cache bounded in bytes that holds shared decodes ([`cache`]).
//!
//! A component that is not stored verbatim (zstd, or legacy big-endian data) is decoded on
//! request, a chunk at a time, off the async runtime and under a bounded number of concurrent
//! decoders. Each decode is shared: every request for a component
//! reads the one [`Decoded`] entry, waiting only for the chunks it needs, and the decoder goes
//! no further than the furthest byte anyone asked for. Entries live in a least-recently-used
//! cache bounded in bytes; an entry someone is reading is never evicted, so the bytes held
//! never exceed the bound. A component that cannot be held (larger than the cache, or no room
//! because everything is being read) is decoded privately per request with [`stream_private`],
//! holding one chunk at a time.

mod cache;
mod cursor;
mod private;
mod shared;
mod source;

pub(crate) use cache::DecodeCache;
pub(crate) use private::stream_private;
pub(crate) use shared::{Decoded, Hold};
pub(crate) use source::Stored;

use crate::format::FormatError;
use crate::storage::StorageError;

/// Largest piece decoded and published at once: small enough that the first bytes of a
/// component reach the client after a fraction of a millisecond of decoding, large enough that
/// per-chunk bookkeeping is noise next to the decoding itself.
pub(crate) const CHUNK: usize = 256 << 10;

/// One component of one version of a file.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ComponentKey {
    pub model: String,
    /// The stored object's version (a file's identity, an ETag).
    pub version: String,
    pub object: String,
    pub role: String,
    /// One frame of a seekable part, decoded and cached on its own.
    pub frame: Option<usize>,
}

/// Why decoded bytes cannot be delivered.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum DecodeError {
    #[error(transparent)]
    Invalid(#[from] FormatError),
    /// The stored bytes could not be read (a remote store failed or the object changed).
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("the decoder stopped unexpectedly: {0}")]
    Aborted(String),
}
