//! The files a model version publishes, the same to every protocol that lists files (the S3
//! endpoint's keys; the Hub API's repositories): each companion beside it (config, tokenizer),
//! each file of its safetensors view (the stored files themselves when it is stored as
//! safetensors), and each stored file not already in the view, with its size and strong ETag.

use std::sync::Arc;

use crate::catalog::{Catalog, Model};
use crate::format::Manifest;
use crate::format::view::ViewBytes;

use super::{Service, companion_etag, stored_file_etag, view_file_etag};

/// What a published file is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Published {
    /// A file of the model's safetensors view, by name: its weights as safetensors.
    View(String),
    /// One of the model's stored files that the view does not already give (a `.zt` file), by
    /// name.
    Stored(String),
    /// The model's companion of this index in the catalog's list.
    Companion(usize),
}

/// One published file of a model version.
#[derive(Debug, Clone)]
pub(crate) struct PublishedFile {
    /// Its path below the model (`config.json`, `model.safetensors`, `dense.zt`).
    pub(crate) path: String,
    pub(crate) what: Published,
    pub(crate) size: u64,
    pub(crate) etag: String,
}

impl Service {
    /// The files `model` (listed in `catalog`, serving `manifest`) publishes: companions, then
    /// the view's files, then the stored files the view does not give.
    pub(crate) fn published_files(
        &self,
        catalog: &Catalog,
        model: &Arc<Model>,
        manifest: &Arc<Manifest>,
    ) -> Vec<PublishedFile> {
        let mut files = Vec::new();
        for (index, companion) in catalog.companions(&model.id).iter().enumerate() {
            files.push(PublishedFile {
                path: companion.name.clone(),
                what: Published::Companion(index),
                size: companion.object.size,
                etag: companion_etag(model, companion),
            });
        }
        let view = self.view(model, manifest);
        let mut in_view = vec![false; model.files.len()];
        for file in &view.files {
            if let ViewBytes::Stored { file: index } = file.bytes {
                in_view[index] = true;
            }
            files.push(PublishedFile {
                path: file.name.clone(),
                what: Published::View(file.name.clone()),
                size: file.len,
                etag: view_file_etag(model, file),
            });
        }
        for (index, stored) in model.files.iter().enumerate().filter(|(i, _)| !in_view[*i]) {
            files.push(PublishedFile {
                path: stored.name.clone(),
                what: Published::Stored(stored.name.clone()),
                size: model.file_len(manifest, index),
                etag: stored_file_etag(model, index),
            });
        }
        files
    }
}
