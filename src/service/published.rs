//! The files a model version publishes, the same to every protocol that lists files (the S3
//! endpoint's keys; the Hub API's repositories): each companion beside it (config, tokenizer),
//! each file of its safetensors view (the stored files themselves when it is stored as
//! safetensors), and each stored file not already in the view (every stored file of a model
//! published as its stored files, whose view is not), with its size and strong ETag;
//! the bytes each serves, and what identifies those bytes for their digest (how digests come
//! to be known is [`super::hashing`]'s). [`Publication`] owns it, with the views it lists.

use std::sync::Arc;

use crate::catalog::{Catalog, Companion, Model};
use crate::format::Manifest;
use crate::format::view::ViewBytes;
use crate::storage::ObjectVersion;

use super::components::Representations;
use super::view::Views;
use super::{ServiceError, StoredBytes, companion_etag, stored_file_etag, view_file_etag};
use crate::digests::{FileIdentity, file_identity};

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
    /// The file of this index in the list of the model's signed directory (checked against its
    /// signature, never published).
    Signed(usize),
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

/// The files every model version publishes, and their bytes: over the representations of a
/// model's bytes and its safetensors views.
pub(crate) struct Publication {
    views: Views,
    representations: Arc<Representations>,
}

impl Publication {
    pub(super) fn new(views: Views, representations: Arc<Representations>) -> Publication {
        Publication { views, representations }
    }

    /// The model's safetensors view, planned on first use and kept for its version.
    pub(crate) fn view(&self, model: &Model, manifest: &Manifest) -> Arc<crate::format::view::View> {
        self.views.view(model, manifest)
    }

    /// The view file `name` of the model (`model.safetensors`, or the index and shards).
    pub(crate) async fn view_file(
        &self,
        model: &Arc<Model>,
        manifest: &Arc<Manifest>,
        name: &str,
    ) -> Result<StoredBytes, ServiceError> {
        self.views.view_file(model, manifest, name).await
    }

    /// The files `model` (listed in `catalog`, serving `manifest`) publishes: companions, then
    /// the view's files, then the stored files the view does not give; of a model published
    /// as its stored files, its companions and stored files.
    pub(crate) fn published_files(
        &self,
        catalog: &Catalog,
        model: &Arc<Model>,
        manifest: &Arc<Manifest>,
    ) -> Vec<PublishedFile> {
        let mut files = companion_files(catalog, model);
        if manifest.container.publishes_stored_files() {
            // Its weights go as they are stored: its view would hold only the dense tensors,
            // and its loaders read the files themselves.
            files.extend((0..model.files.len()).map(|i| stored_file(model, manifest, i)));
            return files;
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
        files.extend((0..model.files.len()).filter(|i| !in_view[*i]).map(|i| stored_file(model, manifest, i)));
        files
    }

    /// The files of `model` as its source holds them: those beside it and each stored file as
    /// it is (a `.zt` model's files, a checkpoint's shards), by name, which a copy of the model
    /// as stored needs.
    pub(crate) fn files_as_stored(
        &self,
        catalog: &Catalog,
        model: &Arc<Model>,
        manifest: &Arc<Manifest>,
    ) -> Vec<PublishedFile> {
        let mut files = companion_files(catalog, model);
        files.extend((0..model.files.len()).map(|index| stored_file(model, manifest, index)));
        files
    }

    /// Every file of `model`'s signed directory, as published files by their path below it:
    /// those whose digests its verdict may need (which the signature leaves out is known only
    /// once it is read).
    pub(crate) fn signature_files(&self, catalog: &Catalog, model: &Model) -> Vec<PublishedFile> {
        let Some(dir) = catalog.signed_directory(&model.id) else { return Vec::new() };
        dir.files.iter().enumerate().map(|(index, file)| signed_file(model, index, file)).collect()
    }

    /// The representations of every model's bytes.
    pub(crate) fn representations(&self) -> &Representations {
        &self.representations
    }
}

/// The files beside `model`, published as they are.
fn companion_files(catalog: &Catalog, model: &Model) -> Vec<PublishedFile> {
    let companions = catalog.companions(&model.id);
    let file = |(index, companion): (usize, &Companion)| PublishedFile {
        path: companion.name.clone(),
        what: Published::Companion(index),
        size: companion.object.size,
        etag: companion_etag(model, companion),
    };
    companions.iter().enumerate().map(file).collect()
}

/// File `index` of `model`'s signed directory, as a published file.
pub(super) fn signed_file(model: &Model, index: usize, file: &Companion) -> PublishedFile {
    PublishedFile {
        path: file.name.clone(),
        what: Published::Signed(index),
        size: file.object.size,
        etag: companion_etag(model, file),
    }
}

/// Stored file `index` of `model`, published as it is.
fn stored_file(model: &Model, manifest: &Manifest, index: usize) -> PublishedFile {
    let name = &model.files[index].name;
    PublishedFile {
        path: name.clone(),
        what: Published::Stored(name.clone()),
        size: model.file_len(manifest, index),
        etag: stored_file_etag(model, index),
    }
}

impl Publication {
    /// The files a repository of `model` holds for the protocols that serve models as
    /// repositories of files (the Hub API, the OCI registry): its companions and its weights
    /// as safetensors (or its stored files, for a model published as them), sorted by path. Stored `.zt` files are
    /// left out, so a client that takes every file does not fetch the weights twice; a
    /// companion named like one of the view's files gives way to it.
    pub(crate) fn repository_files(
        &self,
        catalog: &Catalog,
        model: &Arc<Model>,
        manifest: &Arc<Manifest>,
    ) -> Vec<PublishedFile> {
        let mut files: Vec<PublishedFile> = self
            .published_files(catalog, model, manifest)
            .into_iter()
            .filter(|f| manifest.container.publishes_stored_files() || !matches!(f.what, Published::Stored(_)))
            .collect();
        files.sort_by(|a, b| a.path.cmp(&b.path));
        files.dedup_by(|later, first| {
            let same = later.path == first.path;
            if same && matches!(first.what, Published::Companion(_)) {
                std::mem::swap(later, first);
            }
            same
        });
        files
    }

    /// The bytes `file` of `model` serves (`catalog` is the one `file` was listed from).
    pub(crate) async fn published_bytes(
        &self,
        catalog: &Catalog,
        model: &Arc<Model>,
        manifest: &Arc<Manifest>,
        file: &Published,
    ) -> Result<StoredBytes, ServiceError> {
        match file {
            Published::View(name) => self.view_file(model, manifest, name).await,
            Published::Stored(name) => self.representations.stored_file_named(model, manifest, name).await,
            Published::Companion(index) => match catalog.companions(&model.id).get(*index) {
                Some(companion) => self.representations.companion_file(model, companion),
                None => Err(ServiceError::Internal(format!("no companion {index} of {:?}", model.id))),
            },
            Published::Signed(index) => match catalog.signed_directory(&model.id).and_then(|d| d.files.get(*index)) {
                Some(file) => self.representations.companion_file(model, file),
                None => Err(ServiceError::Internal(format!("no signed file {index} of {:?}", model.id))),
            },
        }
    }

    /// What identifies the bytes of `file` for their digest: the stored object behind it when
    /// it is served as stored (so a new model version that leaves a shard alone keeps that
    /// shard's digest, and a 700 GB model is not hashed again for a changed config), else the
    /// file built from the model's stored files (its name, size and layout, and every stored
    /// file's version). Versions are taken as the storage names content
    /// ([`crate::storage::Content::version`]), so a digest store kept on a volume still
    /// serves a new container, whose overlay is a new device.
    pub(crate) fn digest_identity(
        &self,
        catalog: &Catalog,
        model: &Arc<Model>,
        manifest: &Arc<Manifest>,
        file: &PublishedFile,
    ) -> FileIdentity {
        match self.object_behind(catalog, model, manifest, file) {
            Some(object) => {
                let version = object.content().version;
                file_identity(&model.source.name, "\0stored object", &object.key, &version)
            }
            None => {
                let layout = match &file.what {
                    Published::View(name) => match self.view(model, manifest).file(name).map(|f| f.bytes.clone()) {
                        Some(ViewBytes::Built { layout, .. }) => layout,
                        _ => String::new(),
                    },
                    _ => String::new(),
                };
                let mut built = format!("{}\0{layout}", file.size);
                for stored in &model.files {
                    built.push('\0');
                    built.push_str(&stored.object.content().version);
                }
                file_identity(&model.source.name, &model.id, &file.path, &built)
            }
        }
    }

    /// The object whose bytes `file` serves as they are (a companion; a stored file the view
    /// passes through), if any.
    pub(super) fn object_behind(
        &self,
        catalog: &Catalog,
        model: &Arc<Model>,
        manifest: &Arc<Manifest>,
        file: &PublishedFile,
    ) -> Option<ObjectVersion> {
        let object = match &file.what {
            Published::Companion(index) => catalog.companions(&model.id).get(*index)?.object.clone(),
            Published::Signed(index) => catalog.signed_directory(&model.id)?.files.get(*index)?.object.clone(),
            Published::View(name) => {
                let view = self.view(model, manifest);
                match view.files.iter().find(|f| f.name == *name)?.bytes {
                    ViewBytes::Stored { file: index } => model.files.get(index)?.object.clone(),
                    _ => return None,
                }
            }
            Published::Stored(name) => model.files.iter().find(|f| f.name == *name)?.object.clone(),
        };
        (object.size == file.size).then_some(object)
    }
}
