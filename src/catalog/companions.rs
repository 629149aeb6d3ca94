//! The files beside a model that are not model files (`config.json`, `generation_config.json`,
//! tokenizer files, anything else a loader finds in a model repository): each such file of a
//! source belongs to the models of the nearest directory above it that holds a model file
//! (a `.zt` root, a `.safetensors` file or a checkpoint's index), named by its path below that
//! directory. Where that directory holds one model (a Hugging Face repository's layout), the
//! model has all of them. Where it holds several, a file belongs to the model whose file stem
//! its path starts with, followed by `.`, `-`, `_` or `/` (the longest such stem:
//! `llama.config.json`, `llama-tokenizer.json` and `llama/vocab.txt` are `llama.zt`'s); when no
//! stem fits, to the model named after the directory (a checkpoint's, with a GGUF file beside
//! it), or, when every model there is a GGUF file, to all of them (a directory of GGUF files is
//! one repository's quantizations of one model); else to none, since nothing says which model
//! it describes. A file with no model directory above it
//! belongs to none.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::{Model, Source, directory, version_of};
use crate::format::FileKind;
use crate::storage::{Listed, ObjectVersion};

/// A file beside a model.
#[derive(Debug, Clone)]
pub(crate) struct Companion {
    /// Its path below the model's directory (`config.json`, `tokenizer/vocab.txt`).
    pub name: String,
    pub object: ObjectVersion,
}

/// The companions of each of `models` (by id) among `listed`, the whole listing of `source`.
pub(super) fn assign(
    source: &Arc<Source>,
    models: &[Arc<Model>],
    listed: &[Listed],
) -> BTreeMap<String, Arc<[Companion]>> {
    let model_dirs: BTreeSet<&str> =
        listed.iter().filter(|l| FileKind::of(&l.key).is_some()).map(|l| directory(&l.key)).collect();
    // The models of each directory, by the stem of their first file.
    let mut stems_by_dir: BTreeMap<&str, Vec<(&str, &str)>> = BTreeMap::new();
    let mut all_gguf: BTreeMap<&str, bool> = BTreeMap::new();
    // The model named after its directory (a Hugging Face checkpoint's), by directory.
    let mut named_after: BTreeMap<&str, &str> = BTreeMap::new();
    for model in models {
        let key = model.files[0].object.key.as_str();
        let dir = directory(key);
        stems_by_dir.entry(dir).or_default().push((stem(&key[dir.len()..]), &model.id));
        *all_gguf.entry(dir).or_insert(true) &= FileKind::of(key) == Some(FileKind::Gguf);
        if dir.strip_suffix('/') == Some(model.id.as_str()) {
            named_after.insert(dir, &model.id);
        }
    }
    let mut by_model: BTreeMap<&str, Vec<Companion>> = BTreeMap::new();
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
        let Some(owner) = owner else { continue };
        let name = &file.key[owner.len()..];
        let owners = match stems_by_dir.get(owner).map(Vec::as_slice) {
            Some([(_, only)]) => vec![*only],
            Some(several) => {
                let named: Vec<&(&str, &str)> = several.iter().filter(|(stem, _)| names_stem(name, stem)).collect();
                let longest = named.iter().map(|(stem, _)| stem.len()).max();
                if let (true, Some(checkpoint)) = (named.is_empty(), named_after.get(owner)) {
                    // The directory is a checkpoint's (a GGUF file beside it, say): what no
                    // stem names is the checkpoint's, as its loaders expect.
                    vec![*checkpoint]
                } else if named.is_empty() && all_gguf.get(owner) == Some(&true) {
                    // GGUF files of one directory are one repository's quantizations of one
                    // model: what no stem names describes all of them.
                    several.iter().map(|(_, id)| *id).collect()
                } else {
                    named.iter().filter(|(stem, _)| Some(stem.len()) == longest).map(|(_, id)| *id).collect()
                }
            }
            None => Vec::new(),
        };
        for id in owners {
            by_model.entry(id).or_default().push(Companion { name: name.to_owned(), object: version_of(source, file) });
        }
    }
    by_model.into_iter().map(|(id, files)| (id.to_owned(), files.into())).collect()
}

/// A model file's name without its kind's suffix (`llama` of `llama.zt`, `model` of
/// `model.safetensors.index.json`).
fn stem(name: &str) -> &str {
    let suffix = match FileKind::of(name) {
        Some(FileKind::SafetensorsIndex) => FileKind::SAFETENSORS_INDEX_SUFFIX,
        Some(FileKind::Safetensors) => ".safetensors",
        Some(FileKind::Zt) => ".zt",
        Some(FileKind::Gguf) => match crate::format::gguf::split_name(name) {
            Some((prefix, _, _)) => return prefix,
            None => ".gguf",
        },
        None => "",
    };
    &name[..name.len() - suffix.len()]
}

/// Whether the path `name` is named after the stem `stem`: the stem, then `.`, `-`, `_` or `/`.
fn names_stem(name: &str, stem: &str) -> bool {
    name.strip_prefix(stem).is_some_and(|rest| rest.starts_with(['.', '-', '_', '/']))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stem_is_the_name_without_its_kind_s_suffix_and_names_the_files_that_start_with_it() {
        assert_eq!(stem("llama.zt"), "llama");
        assert_eq!(stem("model.safetensors.index.json"), "model");
        assert_eq!(stem("m.v1.safetensors"), "m.v1");
        assert_eq!(stem("tiny-Q4_K_M.gguf"), "tiny-Q4_K_M");
        assert_eq!(stem("tiny-Q8_0-00002-of-00003.gguf"), "tiny-Q8_0");
        assert!(names_stem("llama.config.json", "llama"));
        assert!(names_stem("llama-tokenizer.json", "llama"));
        assert!(names_stem("llama_notes.txt", "llama"));
        assert!(names_stem("llama/vocab.txt", "llama"));
        assert!(!names_stem("llama.json", "llama2"));
        assert!(!names_stem("llamas.json", "llama"));
        assert!(!names_stem("llama", "llama"));
    }
}
