//! A model's files as bytes, as [`Representations`] serves them: a stored file by its index or
//! name, and a file beside the model (config, tokenizer) bound to its listed version; a name
//! looked up among both says which it found.

use std::sync::Arc;

use super::ServiceError;
use super::bytes::{RemoteRange, StoredBytes, companion_etag, model_bytes, servable, stored_file_etag};
use super::components::Representations;
use crate::catalog::{Companion, Model};
use crate::format::Manifest;

impl Representations {
    /// The stored file of a model stored in one, byte for byte.
    pub(crate) async fn stored_file(
        &self,
        model: &Arc<Model>,
        manifest: &Manifest,
    ) -> Result<StoredBytes, ServiceError> {
        if model.files.len() != 1 {
            return Err(ServiceError::SeveralFiles { model: model.id.clone(), count: model.files.len() });
        }
        self.stored_file_at(model, manifest, 0).await
    }

    /// The model's stored file `index` (in the model's file order), byte for byte.
    pub(crate) async fn stored_file_at(
        &self,
        model: &Arc<Model>,
        manifest: &Manifest,
        index: usize,
    ) -> Result<StoredBytes, ServiceError> {
        let bytes = model_bytes(model, manifest, index).await?;
        // The file holding the manifest is as long as the manifest says; the others as listed.
        let len = model.file_len(manifest, index);
        Ok(StoredBytes {
            source: bytes.served(&self.readahead, &model.id, 0..len),
            etag: stored_file_etag(model, index),
        })
    }

    /// A file beside the model (`config.json`, …), byte for byte, bound to its listed version.
    pub(crate) fn companion_file(
        &self,
        model: &Arc<Model>,
        companion: &Companion,
    ) -> Result<StoredBytes, ServiceError> {
        servable(&model.source, &model.id, &companion.object)?;
        Ok(StoredBytes {
            source: Arc::new(RemoteRange {
                object: companion.object.clone(),
                source: Arc::clone(&model.source),
                model: model.id.clone(),
                start: 0,
                len: companion.object.size,
                readahead: self.readahead.clone(),
            }),
            etag: companion_etag(model, companion),
        })
    }

    /// The model's stored file `name` (the root or a shard), byte for byte.
    pub(crate) async fn stored_file_named(
        &self,
        model: &Arc<Model>,
        manifest: &Manifest,
        name: &str,
    ) -> Result<StoredBytes, ServiceError> {
        let Some(index) = model.files.iter().position(|f| f.name == name) else {
            let names: Vec<&str> = model.files.iter().map(|f| f.name.as_str()).collect();
            return Err(ServiceError::FileNotFound {
                model: model.id.clone(),
                name: name.to_owned(),
                available: names.join(", "),
            });
        };
        self.stored_file_at(model, manifest, index).await
    }

    /// The model's file `name`: one of its stored files, or else one of the files beside it
    /// (`companions`) by its path below the model's directory (`config.json`,
    /// `tokenizer/vocab.txt`). Which of the two it is comes with it: a companion is not covered
    /// by the model version.
    pub(crate) async fn file_named(
        &self,
        model: &Arc<Model>,
        manifest: &Manifest,
        companions: &[Companion],
        name: &str,
    ) -> Result<(StoredBytes, FoundFile), ServiceError> {
        if let Some(index) = model.files.iter().position(|f| f.name == name) {
            return Ok((self.stored_file_at(model, manifest, index).await?, FoundFile::Stored));
        }
        match companions.iter().find(|c| c.name == name) {
            Some(companion) => Ok((self.companion_file(model, companion)?, FoundFile::Companion)),
            None => {
                let names: Vec<&str> = model
                    .files
                    .iter()
                    .map(|f| f.name.as_str())
                    .chain(companions.iter().map(|c| c.name.as_str()))
                    .collect();
                Err(ServiceError::FileNotFound {
                    model: model.id.clone(),
                    name: name.to_owned(),
                    available: names.join(", "),
                })
            }
        }
    }
}

/// Which of a model's files a name found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FoundFile {
    /// One of the model's stored files: bound to the model version.
    Stored,
    /// A file beside the model (config, tokenizer): its own version, not the model's.
    Companion,
}
