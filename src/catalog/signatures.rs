//! Which models a signature file covers: `model_signing` signs a directory, so a model is
//! covered by the signature file (`signing.signature_file`, `model.sig`) of the nearest
//! directory at or above its own that holds one, and every other file listed below that
//! directory is one the signature must account for.

use std::collections::BTreeMap;
use std::sync::Arc;

use sha2::Digest as _;

use super::{Companion, Model, Source, directory, version_of};
use crate::storage::{Listed, ObjectVersion};

/// A signed directory: its signature file and every other file below it.
#[derive(Debug)]
pub(crate) struct SignedDirectory {
    pub signature: ObjectVersion,
    /// Every other file below it, by its path below it, sorted.
    pub files: Vec<Companion>,
    /// What identifies this version of the directory: the SHA-256 (hex) of each file's key
    /// and version, so a request compares 64 bytes however many files it holds.
    pub version: String,
}

/// The signed directory of each of `models` (by id) among `listed`, the whole listing of
/// `source`, where `signature_file` names the signature file.
pub(super) fn assign(
    source: &Arc<Source>,
    models: &[Arc<Model>],
    listed: &[Listed],
    signature_file: &str,
) -> BTreeMap<String, Arc<SignedDirectory>> {
    let mut sorted: Vec<&Listed> = listed.iter().collect();
    sorted.sort_by(|a, b| a.key.cmp(&b.key));
    let signatures: BTreeMap<&str, &Listed> = sorted
        .iter()
        .filter(|l| l.key.rsplit('/').next() == Some(signature_file))
        .map(|l| (directory(&l.key), *l))
        .collect();
    let mut directories: BTreeMap<&str, Arc<SignedDirectory>> = BTreeMap::new();
    let mut by_model = BTreeMap::new();
    for model in models {
        let mut dir = directory(&model.files[0].object.key);
        let signed = loop {
            if let Some(signature) = signatures.get(dir) {
                break Some((dir, *signature));
            }
            if dir.is_empty() {
                break None;
            }
            dir = directory(&dir[..dir.len() - 1]);
        };
        let Some((dir, signature)) = signed else { continue };
        let signed = directories.entry(dir).or_insert_with(|| {
            let start = sorted.partition_point(|l| l.key.as_str() < dir);
            let below = sorted[start..].iter().take_while(|l| l.key.starts_with(dir));
            let mut version = sha2::Sha256::new();
            let files = below
                .inspect(|l| {
                    for part in [l.key.as_bytes(), b"\0", l.version.as_bytes(), b"\0"] {
                        version.update(part);
                    }
                })
                .filter(|l| l.key != signature.key)
                .map(|l| Companion { name: l.key[dir.len()..].to_owned(), object: version_of(source, l) })
                .collect();
            let version = hex::encode(version.finalize());
            Arc::new(SignedDirectory { signature: version_of(source, signature), files, version })
        });
        by_model.insert(model.id.clone(), Arc::clone(signed));
    }
    by_model
}
