//! The safetensors view of a model as bytes: the plan (`format::view`) made once per model
//! version, and each view file as a representation. A stored file (a model kept as
//! safetensors) is served as it is; a built file is its header from memory, then each
//! tensor's bytes exactly as its component is served on its own route (sent from the file,
//! decoded through the shared cache, or frame by frame when seekable, with the digest policy
//! applied), each opened only when a body reaches it.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::stream;
use futures_util::{StreamExt as _, TryStreamExt as _};

use super::ServiceError;
use super::bytes::{StoredBytes, etag, stored_file_etag};
use super::components::{ComponentRequest, Cut, Representations};
use super::learnt::LearntByVersion;
use super::representation::{ByteStream, RangeSource, guarded};
use crate::catalog::Model;
use crate::format::Manifest;
use crate::format::view::{View, ViewBytes, ViewFile, ViewTensor, plan};

/// Every model's safetensors view: its plan and its files.
pub(crate) struct Views {
    representations: Arc<Representations>,
    learnt: Arc<LearntByVersion>,
    /// How large a built view shard may grow.
    shard_bytes: u64,
}

impl Views {
    pub(super) fn new(representations: Arc<Representations>, learnt: Arc<LearntByVersion>, shard_bytes: u64) -> Views {
        Views { representations, learnt, shard_bytes }
    }

    /// The model's safetensors view, planned on first use and kept for its version.
    pub(crate) fn view(&self, model: &Model, manifest: &Manifest) -> Arc<View> {
        Arc::clone(self.learnt.of(model).view.get_or_init(|| {
            let stored: Vec<(&str, u64)> =
                model.files.iter().enumerate().map(|(i, f)| (f.name.as_str(), model.file_len(manifest, i))).collect();
            Arc::new(plan(manifest, &stored, self.shard_bytes))
        }))
    }

    /// The view file `name` of the model (`model.safetensors`, or the index and shards).
    pub(crate) async fn view_file(
        &self,
        model: &Arc<Model>,
        manifest: &Arc<Manifest>,
        name: &str,
    ) -> Result<StoredBytes, ServiceError> {
        let view = self.view(model, manifest);
        let Some(file) = view.file(name) else {
            let available: Vec<&str> = view.files.iter().map(|f| f.name.as_str()).collect();
            return Err(ServiceError::ViewFileNotFound {
                model: model.id.clone(),
                name: name.to_owned(),
                available: available.join(", "),
            });
        };
        match &file.bytes {
            ViewBytes::Stored { file } => self.representations.stored_file_at(model, manifest, *file).await,
            ViewBytes::Built { head, tensors, .. } => Ok(StoredBytes {
                source: Arc::new(BuiltFile {
                    representations: Arc::clone(&self.representations),
                    model: Arc::clone(model),
                    manifest: Arc::clone(manifest),
                    head: Bytes::from_owner(Arc::clone(head)),
                    tensors: Arc::clone(tensors),
                    len: file.len,
                }),
                etag: view_file_etag(model, file),
            }),
        }
    }
}

/// The ETag of a view file: its stored file's, or for a built one, the model version's with the
/// file's name and a digest of its header (so a server that lays a view out anew never shares a
/// tag with one that laid it out before).
pub(crate) fn view_file_etag(model: &Model, file: &ViewFile) -> String {
    match &file.bytes {
        ViewBytes::Stored { file: index } => stored_file_etag(model, *index),
        ViewBytes::Built { layout, .. } => etag(model, &format!("view\0{}\0{layout}", file.name)),
    }
}

/// A built view file: its head, then its tensors' bytes back to back, both shared with the
/// plan rather than copied per response.
struct BuiltFile {
    representations: Arc<Representations>,
    model: Arc<Model>,
    manifest: Arc<Manifest>,
    head: Bytes,
    /// In file order, tiling `head.len()..len`.
    tensors: Arc<[ViewTensor]>,
    len: u64,
}

impl RangeSource for BuiltFile {
    fn len(&self) -> u64 {
        self.len
    }

    fn open(&self, range: Range<u64>) -> ByteStream {
        let head_len = self.head.len() as u64;
        let head = (range.start < head_len)
            .then(|| Ok(self.head.slice(range.start as usize..range.end.min(head_len) as usize)));
        let first = self.tensors.partition_point(|t| t.range.end <= range.start);
        let (representations, model, manifest) =
            (Arc::clone(&self.representations), Arc::clone(&self.model), Arc::clone(&self.manifest));
        let tensors = Arc::clone(&self.tensors);
        let parts = (first..tensors.len())
            .map(move |i| tensors[i].clone())
            .take_while(move |t| t.range.start < range.end)
            .filter_map(move |t| {
                let within = range.start.max(t.range.start) - t.range.start..range.end.min(t.range.end) - t.range.start;
                (!within.is_empty()).then(|| {
                    tensor_bytes(
                        Arc::clone(&representations),
                        Arc::clone(&model),
                        Arc::clone(&manifest),
                        t.object,
                        within,
                    )
                })
            });
        stream::iter(head).chain(stream::iter(parts).flatten()).boxed()
    }
}

/// `within` of the decoded bytes of object `object`'s one component, served as its own route
/// serves them; the digest policy's check, when one runs, holds back the part's last piece.
fn tensor_bytes(
    representations: Arc<Representations>,
    model: Arc<Model>,
    manifest: Arc<Manifest>,
    object: usize,
    within: Range<u64>,
) -> ByteStream {
    stream::once(async move {
        let object = &manifest.objects[object];
        let component = &object.components[0];
        let whole = within.start == 0 && within.end == component.decoded_length;
        let cut = if whole { Cut::Whole } else { Cut::Ranges };
        let request = ComponentRequest { cut, head: false, accepts_zstd: false };
        let bytes = representations.component_bytes(&model, &manifest, object, component, request).await?;
        let body = bytes.source.open(within);
        Ok(match bytes.guard {
            Some(guard) => guarded(body, guard),
            None => body,
        })
    })
    .try_flatten()
    .boxed()
}
