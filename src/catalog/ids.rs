//! How the catalog names models: the id a model file asks for (its path without its suffix, or
//! its directory for a `model.*` file or a checkpoint's index, as the Hub names a repository's
//! checkpoints), and, where several model files of one source ask for one id, which keeps it:
//! the first of a checkpoint's index, a safetensors file, a `.zt` file and a GGUF file (then by
//! path); each other is named by its path without its suffix, or, when that is taken too, by its
//! whole path. So two models never share an id, and a GGUF file beside a Hugging Face checkpoint
//! never takes the checkpoint's name.

use std::collections::{HashMap, HashSet};

use crate::format::FileKind;
use crate::format::gguf::split_name;

/// The id a model file of `kind` at `key` asks for: the path without its suffix, or, for an
/// index, a `model.safetensors`, a `model.zt` and a `model.gguf`, its directory (the file's
/// stem when that is not `model`, or when the file is at the source's root). Every part of a
/// split GGUF model (`name-00001-of-00003.gguf`) asks for the id its prefix (`name.gguf`) would.
pub(super) fn asked_id(kind: FileKind, key: &str) -> String {
    match kind {
        FileKind::Zt => directory_or_stem(key, ".zt"),
        FileKind::Safetensors => directory_or_stem(key, ".safetensors"),
        FileKind::Gguf => directory_or_stem(&split_gguf_as_one(key), ".gguf"),
        FileKind::SafetensorsIndex => {
            let stem = key.strip_suffix(FileKind::SAFETENSORS_INDEX_SUFFIX).unwrap_or(key);
            match stem.rsplit_once('/') {
                Some((dir, "model")) => dir.to_owned(),
                _ => stem.to_owned(),
            }
        }
    }
}

/// The key of a split GGUF part written as the one file it stands for (`dir/name.gguf`).
fn split_gguf_as_one(key: &str) -> String {
    let name_at = key.rfind('/').map_or(0, |slash| slash + 1);
    match split_name(&key[name_at..]) {
        Some((prefix, _, _)) => format!("{}{prefix}.gguf", &key[..name_at]),
        None => key.to_owned(),
    }
}

/// `key` without `suffix`, or its directory when its name is `model` and it has one.
fn directory_or_stem(key: &str, suffix: &str) -> String {
    match key.strip_suffix(suffix).and_then(|k| k.strip_suffix("/model")) {
        Some(dir) if !dir.is_empty() => dir.to_owned(),
        _ => key.strip_suffix(suffix).unwrap_or(key).to_owned(),
    }
}

/// `key` without its kind's suffix (a split GGUF part's as the file it stands for).
fn stem_id(kind: FileKind, key: &str) -> String {
    let suffix = match kind {
        FileKind::Zt => ".zt",
        FileKind::Safetensors => ".safetensors",
        FileKind::Gguf => return split_gguf_as_one(key).strip_suffix(".gguf").unwrap_or(key).to_owned(),
        FileKind::SafetensorsIndex => FileKind::SAFETENSORS_INDEX_SUFFIX,
    };
    key.strip_suffix(suffix).unwrap_or(key).to_owned()
}

/// Which kind keeps an id several files ask for: lower first.
fn precedence(kind: FileKind) -> u8 {
    match kind {
        FileKind::SafetensorsIndex => 0,
        FileKind::Safetensors => 1,
        FileKind::Zt => 2,
        FileKind::Gguf => 3,
    }
}

/// The id of each of `files` (the model files of one source that stand for a model, by key),
/// no two the same: see the module's doc.
pub(super) fn assign<'a>(files: impl IntoIterator<Item = (&'a str, FileKind)>) -> HashMap<&'a str, String> {
    let mut files: Vec<(&str, FileKind)> = files.into_iter().collect();
    files.sort_by_key(|&(key, kind)| (precedence(kind), key));
    let mut taken: HashSet<String> = files.iter().map(|&(key, kind)| asked_id(kind, key)).collect();
    let mut asked_by: HashMap<String, &str> = HashMap::new();
    let mut ids = HashMap::with_capacity(files.len());
    // First every file that keeps the id it asked for, so that a file renamed never takes an
    // id another file asked for.
    let mut renamed = Vec::new();
    for &(key, kind) in &files {
        let asked = asked_id(kind, key);
        if asked_by.contains_key(&asked) {
            renamed.push((key, kind));
        } else {
            asked_by.insert(asked.clone(), key);
            ids.insert(key, asked);
        }
    }
    for (key, kind) in renamed {
        let stem = stem_id(kind, key);
        let id = if taken.contains(&stem) { key.to_owned() } else { stem };
        taken.insert(id.clone());
        ids.insert(key, id);
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_asks_for_its_path_or_its_directory_as_the_hub_names_checkpoints() {
        let cases = [
            ("org/llama.zt", FileKind::Zt, "org/llama"),
            ("org/llama.safetensors", FileKind::Safetensors, "org/llama"),
            ("org/llama/model.safetensors.index.json", FileKind::SafetensorsIndex, "org/llama"),
            ("org/llama/other.safetensors.index.json", FileKind::SafetensorsIndex, "org/llama/other"),
            ("model.safetensors.index.json", FileKind::SafetensorsIndex, "model"),
            ("org/llama/model.safetensors", FileKind::Safetensors, "org/llama"),
            ("model.safetensors", FileKind::Safetensors, "model"),
            ("org/llama/model.zt", FileKind::Zt, "org/llama"),
            ("model.zt", FileKind::Zt, "model"),
            ("org/llama/mymodel.zt", FileKind::Zt, "org/llama/mymodel"),
            ("org/llama/model-00001-of-00002.safetensors", FileKind::Safetensors, "org/llama/model-00001-of-00002"),
            ("org/tiny-gguf/model.gguf", FileKind::Gguf, "org/tiny-gguf"),
            ("org/tiny/tiny-Q4_K_M.gguf", FileKind::Gguf, "org/tiny/tiny-Q4_K_M"),
            ("org/tiny/tiny-Q8_0-00002-of-00003.gguf", FileKind::Gguf, "org/tiny/tiny-Q8_0"),
            ("org/tiny/model-00001-of-00002.gguf", FileKind::Gguf, "org/tiny"),
            ("tiny-00001-of-00002.gguf", FileKind::Gguf, "tiny"),
        ];
        for (key, kind, id) in cases {
            assert_eq!(FileKind::of(key), Some(kind), "{key}");
            assert_eq!(asked_id(kind, key), id, "{key}");
        }
    }

    fn ids_of(keys: &[&'static str]) -> Vec<(&'static str, String)> {
        let ids = assign(keys.iter().map(|&k| (k, FileKind::of(k).unwrap())));
        let mut ids: Vec<(&str, String)> = ids.into_iter().collect();
        ids.sort();
        ids
    }

    #[test]
    fn a_checkpoint_keeps_its_directory_and_the_files_beside_it_are_named_by_their_paths() {
        let owned = |pairs: &[(&'static str, &str)]| pairs.iter().map(|&(k, v)| (k, v.to_owned())).collect::<Vec<_>>();
        // A GGUF file beside a safetensors checkpoint: the checkpoint keeps the directory.
        assert_eq!(
            ids_of(&["llama/model.gguf", "llama/model.safetensors"]),
            owned(&[("llama/model.gguf", "llama/model"), ("llama/model.safetensors", "llama")])
        );
        // An index takes the directory; the single file beside it keeps its path.
        assert_eq!(
            ids_of(&["llama/model.safetensors", "llama/model.safetensors.index.json"]),
            owned(&[("llama/model.safetensors", "llama/model"), ("llama/model.safetensors.index.json", "llama")])
        );
        // Three ask for one id: the third's path without its suffix is taken, so its whole path.
        assert_eq!(
            ids_of(&["llama/model.gguf", "llama/model.zt", "llama/model.safetensors"]),
            owned(&[
                ("llama/model.gguf", "llama/model.gguf"),
                ("llama/model.safetensors", "llama"),
                ("llama/model.zt", "llama/model"),
            ])
        );
        // A file at the top named as a directory's checkpoint: the safetensors checkpoint wins,
        // and the other keeps its whole path.
        assert_eq!(
            ids_of(&["llama.zt", "llama/model.safetensors"]),
            owned(&[("llama.zt", "llama.zt"), ("llama/model.safetensors", "llama")])
        );
        // A renamed file never takes an id another file asked for.
        assert_eq!(
            ids_of(&["a/model.gguf", "a/model.safetensors", "a/model.zt"]).len(),
            3,
            "every file has an id of its own"
        );
        assert_eq!(
            ids_of(&["a/model.zt", "a/model.safetensors", "a/model/x.safetensors", "a/model.safetensors.index.json"])
                .into_iter()
                .map(|(_, id)| id)
                .collect::<HashSet<_>>()
                .len(),
            4
        );
        // Files asking for ids of their own keep them.
        assert_eq!(
            ids_of(&["org/tiny/tiny-Q4_K_M.gguf", "org/tiny/model.safetensors"]),
            owned(&[("org/tiny/model.safetensors", "org/tiny"), ("org/tiny/tiny-Q4_K_M.gguf", "org/tiny/tiny-Q4_K_M")])
        );
    }
}
