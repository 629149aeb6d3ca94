//! One model as its files say: its id, source, version, stored files (each mapped once when
//! its backend maps files) and parsed manifest, or why it cannot be served.

use std::sync::{Arc, OnceLock};

use super::{CatalogError, Source};
use crate::format::Manifest;
use crate::storage::ObjectVersion;
use crate::storage::mapped::MappedFile;

/// One stored file of a model: its name (beside the model's other files), the object version
/// listed, every read bound to it, and, from a backend that maps files, its mapping, made on
/// first use and kept while the file is unchanged, shared by every response.
#[derive(Debug)]
pub(crate) struct StoredFile {
    pub name: String,
    pub object: ObjectVersion,
    pub mapping: OnceLock<Arc<MappedFile>>,
}

impl StoredFile {
    pub(crate) fn new(object: ObjectVersion) -> StoredFile {
        let name = object.key.rsplit('/').next().unwrap_or(&object.key).to_owned();
        StoredFile { name, object, mapping: OnceLock::new() }
    }
}

/// One model: a manifest and the stored files its components live in (the first holds the
/// manifest), and, when it is valid, the parsed manifest.
#[derive(Debug)]
pub(crate) struct Model {
    pub id: String,
    pub source: Arc<Source>,
    /// The stored files' total size in bytes.
    pub size: u64,
    /// The container of the file holding the manifest, once it has been identified.
    pub container: Option<crate::format::Container>,
    /// What identifies this version of the model: of its one file (a file's identity, an
    /// ETag), or a digest of every file's when it has several.
    pub version: String,
    /// Never empty; a component's `file` indexes it.
    pub files: Vec<StoredFile>,
    pub state: Result<Arc<Manifest>, CatalogError>,
    /// When the catalog first found this version (the S3 endpoint's `Last-Modified`).
    pub found_at: std::time::SystemTime,
}

impl Model {
    pub(super) fn new(
        id: &str,
        source: &Arc<Source>,
        files: Vec<StoredFile>,
        state: Result<Arc<Manifest>, CatalogError>,
    ) -> Model {
        if let Err(e) = &state {
            tracing::warn!(model = id, source = %source.name, code = e.code(), error = %e, "model is broken");
        }
        let size = files.iter().map(|f| f.object.size).sum();
        let version = match &files[..] {
            [one] => one.object.version.clone(),
            several => {
                use sha2::Digest as _;
                let mut hasher = sha2::Sha256::new();
                for file in several {
                    hasher.update(file.object.key.as_bytes());
                    hasher.update([0]);
                    hasher.update(file.object.version.as_bytes());
                    hasher.update([0]);
                }
                hex::encode(&hasher.finalize()[..16])
            }
        };
        Model {
            id: id.to_owned(),
            source: Arc::clone(source),
            size,
            container: None,
            version,
            files,
            state,
            found_at: std::time::SystemTime::now(),
        }
    }

    /// The byte length of the model's file `index` (a component's `file`): for the file holding
    /// the manifest, the length it was parsed at, which every offset in the manifest was checked
    /// against; for any other, its listed size.
    pub(crate) fn file_len(&self, manifest: &Manifest, index: usize) -> u64 {
        if index == 0 { manifest.file_len } else { self.files[index].object.size }
    }

    /// Whether this model can stand for the same files, in the same versions, in a new
    /// catalog: it keeps its mappings and parsed manifest.
    pub(super) fn still_valid_for(&self, source: &Source, files: &[StoredFile]) -> bool {
        self.source.name == source.name
            && self.files.len() == files.len()
            && self
                .files
                .iter()
                .zip(files)
                .all(|(a, b)| a.object.key == b.object.key && a.object.version == b.object.version)
            && self.state.as_ref().map_or_else(CatalogError::is_lasting, |_| true)
    }
}
