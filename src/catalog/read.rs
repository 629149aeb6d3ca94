//! Reading what a listed file holds, by its kind: a `.zt` manifest (its header and tail
//! first, then the one read a large manifest may need), a safetensors header, a checkpoint's
//! index, or a GGUF header (a prefix, grown while the header runs past it); parsing runs off
//! the async runtime. What a read gives ([`Parsed`]) and how the catalog reads
//! ([`ScanOptions`]) are defined here, for the scan that calls it.

use std::sync::Arc;

use super::CatalogError;
use crate::format::safetensors::Index;
use crate::format::{FileKind, FormatError, Limits, Manifest, ManifestReads};
use crate::format::{gguf, safetensors};
use crate::storage::{MANIFEST_READ, ObjectVersion, StorageError};

/// How the catalog reads manifests.
#[derive(Debug, Clone)]
pub(crate) struct ScanOptions {
    pub limits: Limits,
    /// Bytes read from the end of a remote object in the first request for its manifest.
    pub manifest_suffix_bytes: u64,
    /// Remote manifests read at once.
    pub concurrent_reads: usize,
    /// Whether a shard found by name must also match its whole-file digest (a shard found by
    /// scanning the directory is always matched by digest).
    pub check_shard_digests: bool,
    /// The name of the signature file whose directories are found, when signatures are read.
    pub signature_file: Option<String>,
    /// Which prefixes are lineages, and which of their versions stay listed.
    pub lineages: super::LineageRules,
}

/// One listed file's manifest (or a checkpoint's index), as read for one version of it.
#[derive(Debug, Clone)]
pub(super) struct ParsedFile {
    pub(super) version: String,
    pub(super) state: Result<Parsed, CatalogError>,
}

/// What a listed file holds. Not one of the format crate's kinds: those say what a file is by
/// its name ([`FileKind`](crate::format::FileKind), which chose how this was read) or bytes
/// ([`Container`](crate::format::Container), which a manifest records); this holds what the
/// reading made of it.
#[derive(Debug, Clone)]
pub(super) enum Parsed {
    /// A `.zt` manifest, or a safetensors file's header as one.
    Manifest(Arc<Manifest>),
    /// A sharded safetensors checkpoint's index.
    Index(Arc<Index>),
    /// A part of a split GGUF model (`name-00001-of-00003.gguf`): its header, read with the
    /// other parts' into the model's manifest.
    GgufPart(Arc<crate::format::gguf::Header>),
}

impl ParsedFile {
    /// The manifest it holds, or why it holds none (an index holds none: it names files that do).
    pub(super) fn manifest(&self) -> Result<&Arc<Manifest>, CatalogError> {
        match &self.state {
            Ok(Parsed::Manifest(manifest)) => Ok(manifest),
            Ok(Parsed::Index(_)) => {
                Err(FormatError::SafetensorsIndex { detail: "an index, where a tensor file belongs".into() }.into())
            }
            Ok(Parsed::GgufPart(_)) => Err(FormatError::Gguf {
                code: "gguf_split",
                at: 0,
                detail: "a part of a split model, read with its other parts".into(),
            }
            .into()),
            Err(e) => Err(e.clone()),
        }
    }
}

/// Reads what a listed file holds, by its kind.
pub(super) async fn read_listed(object: &ObjectVersion, options: &ScanOptions) -> Result<Parsed, CatalogError> {
    match FileKind::of(&object.key) {
        Some(FileKind::SafetensorsIndex) => {
            if object.size > safetensors::MAX_INDEX_LEN {
                let limit = safetensors::MAX_INDEX_LEN;
                return Err(FormatError::ManifestTooLarge { size: object.size, limit }.into());
            }
            let bytes = object.fetch(0..object.size, MANIFEST_READ).await?;
            let index = blocking(object, move || safetensors::parse_index(&bytes)).await?;
            Ok(Parsed::Index(Arc::new(index)))
        }
        Some(FileKind::Safetensors) => {
            let reads = safetensors::HeaderReads::new(object.size, options.manifest_suffix_bytes);
            let first = object.fetch(reads.first(), MANIFEST_READ).await?;
            let (_, missing) = reads.locate(&first)?;
            let missing = object.fetch(missing, MANIFEST_READ).await?;
            let size = object.size;
            let manifest = blocking(object, move || reads.parse(&first, &missing)?.into_manifest(size)).await?;
            Ok(Parsed::Manifest(Arc::new(manifest)))
        }
        Some(FileKind::Gguf) => {
            let header = read_gguf_header(object, options).await?;
            let name = object.key.rsplit('/').next().unwrap_or(&object.key);
            if gguf::split_name(name).is_some() {
                return Ok(Parsed::GgufPart(Arc::new(header)));
            }
            let size = object.size;
            Ok(Parsed::Manifest(Arc::new(blocking(object, move || header.into_manifest(size)).await?)))
        }
        _ => Ok(Parsed::Manifest(Arc::new(read_remote_manifest(object, options).await?))),
    }
}

/// Reads a GGUF file's header: a prefix of `manifest_suffix_bytes`, then, while the header
/// runs past what was read, the bytes after it (so that what is held at least quadruples).
async fn read_gguf_header(object: &ObjectVersion, options: &ScanOptions) -> Result<gguf::Header, CatalogError> {
    let reads = gguf::HeaderReads { file_len: object.size };
    let mut held = object.fetch(reads.first(options.manifest_suffix_bytes), MANIFEST_READ).await?;
    loop {
        let (prefix, step) = (held.clone(), reads.clone());
        match blocking(object, move || step.step(&prefix)).await? {
            Ok(header) => return Ok(header),
            Err(next) => held = [held.as_ref(), object.fetch(next, MANIFEST_READ).await?.as_ref()].concat().into(),
        }
    }
}

/// Runs a parse off the async runtime.
async fn blocking<T: Send + 'static>(
    object: &ObjectVersion,
    parse: impl FnOnce() -> Result<T, FormatError> + Send + 'static,
) -> Result<T, CatalogError> {
    tokio::task::spawn_blocking(parse)
        .await
        .map_err(|e| {
            CatalogError::Storage(StorageError::Unavailable {
                source_name: object.storage.name().to_owned(),
                message: e.to_string(),
            })
        })?
        .map_err(CatalogError::from)
}

/// Reads a remote object's manifest: one suffix read of `manifest_suffix_bytes` holds the
/// trailer and, when it fits, the manifest; a second read fetches the rest of a larger one.
/// The 8-byte header is read alongside the suffix (or taken from it, for a small object).
async fn read_remote_manifest(object: &ObjectVersion, options: &ScanOptions) -> Result<Manifest, CatalogError> {
    let reads = ManifestReads::new(object.size, options.manifest_suffix_bytes);
    let (head, tail) = if reads.tail().start == 0 {
        let whole = object.fetch(reads.tail(), MANIFEST_READ).await?;
        (whole.slice(..reads.head().end as usize), whole)
    } else {
        let (head, tail) = futures_util::future::join(
            object.fetch(reads.head(), MANIFEST_READ),
            object.fetch(reads.tail(), MANIFEST_READ),
        )
        .await;
        (head?, tail?)
    };
    let located = reads.locate(&head, &tail, &options.limits)?;
    let missing = object.fetch(located.missing.clone(), MANIFEST_READ).await?;
    let limits = options.limits;
    blocking(object, move || located.parse(&tail, &missing, &limits)).await
}
