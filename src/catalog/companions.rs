//! The files beside a model that are not model files (`config.json`, `generation_config.json`,
//! tokenizer files, anything else a loader finds in a model repository): each such file of a
//! source belongs to the models of the nearest directory above it that holds a model file
//! (a `.zt` root, a `.safetensors` file or a checkpoint's index), named by its path below that
//! directory. A file with no model directory above it belongs to none.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::{Model, Source, directory, version_of};
use crate::format::FileKind;
use crate::storage::{Listed, ObjectVersion};

/// A file beside a model.
#[derive(Debug, Clone)]
pub struct Companion {
    /// Its path below the model's directory (`config.json`, `tokenizer/vocab.txt`).
    pub name: String,
    pub object: ObjectVersion,
}

/// The companions of each of `models` (by id) among `listed`, the whole listing of `source`.
pub fn assign(source: &Arc<Source>, models: &[Arc<Model>], listed: &[Listed]) -> BTreeMap<String, Arc<[Companion]>> {
    let model_dirs: BTreeSet<&str> =
        listed.iter().filter(|l| FileKind::of(&l.key).is_some()).map(|l| directory(&l.key)).collect();
    let mut by_dir: BTreeMap<&str, Vec<Companion>> = BTreeMap::new();
    for file in listed.iter().filter(|l| FileKind::of(&l.key).is_none()) {
        // The nearest directory above the file, its own first, that holds a model file.
        let mut dir = directory(&file.key);
        let owner = loop {
            if model_dirs.contains(dir) {
                break Some(dir);
            }
            if dir.is_empty() {
                break None;
            }
            dir = directory(&dir[..dir.len() - 1]);
        };
        if let Some(owner) = owner {
            let name = file.key[owner.len()..].to_owned();
            by_dir.entry(owner).or_default().push(Companion { name, object: version_of(source, file) });
        }
    }
    let by_dir: BTreeMap<&str, Arc<[Companion]>> = by_dir.into_iter().map(|(dir, files)| (dir, files.into())).collect();
    models
        .iter()
        .filter_map(|model| {
            let dir = directory(&model.files[0].object.key);
            by_dir.get(dir).map(|files| (model.id.clone(), Arc::clone(files)))
        })
        .collect()
}
