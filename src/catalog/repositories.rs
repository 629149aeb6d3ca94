//! Which models are published together as one repository, as the Hub holds a directory of
//! files: the model named after its directory (`org/llama` of `org/llama/model.safetensors`)
//! with every model of that directory beside it (a GGUF file beside the checkpoint, a
//! checkpoint's `model.safetensors` beside its index), or a directory's GGUF models together
//! (a model's quantizations, which `llama.cpp -hf org/repo:Q4_K_M` picks among); every other
//! model alone. Every protocol that lists repositories (the Hub API, the S3 `models` bucket)
//! asks here, so each lists the same paths.

use std::sync::Arc;

use super::{Catalog, Model};
use crate::format::Container;

/// The directory of `model`'s first file, without its last `/` (empty at the top of a source).
fn directory_of(model: &Model) -> &str {
    let key = &model.files[0].object.key;
    key.rsplit_once('/').map_or("", |(dir, _)| dir)
}

impl Catalog {
    /// The id of the repository `model` is published in (a model id): its directory when the
    /// model joins the one named after it, or is a GGUF model of a directory with no such
    /// model; else the model's own id.
    pub(crate) fn repository_of(&self, model: &Model) -> String {
        let dir = directory_of(model);
        if dir.is_empty() || model.id == dir {
            return model.id.clone();
        }
        let joins = match self.get(dir) {
            Some(named) => Arc::ptr_eq(&named.source, &model.source) && directory_of(named) == dir,
            None => model.container == Some(Container::Gguf),
        };
        if joins { dir.to_owned() } else { model.id.clone() }
    }

    /// The models of repository `id` (their ids, the model of that id first, then sorted),
    /// among those `allows` lets through: the model of that id, and the valid models of that
    /// directory that join it.
    pub(crate) fn members_of(&self, id: &str, allows: impl Fn(&str) -> bool) -> Vec<String> {
        let mut members: Vec<String> = self
            .models()
            .filter(|m| allows(&m.id) && (m.id == id || (m.id.starts_with(id) && m.state.is_ok())))
            .filter(|m| self.repository_of(m) == id)
            .map(|m| m.id.clone())
            .collect();
        members.sort_by(|a, b| (a != id).cmp(&(b != id)).then_with(|| a.cmp(b)));
        members
    }

    /// Whether `member` of repository `id` shows its published files there (the model named
    /// after it; a GGUF model, whose published file is the file itself) rather than its files
    /// as stored, as the Hub lists a directory's files: the safetensors view of a checkpoint's
    /// `model.safetensors` beside its index would take the names of the checkpoint's own files.
    pub(crate) fn shows_published_files(&self, id: &str, member: &Model) -> bool {
        member.id == id || member.container == Some(Container::Gguf)
    }
}
