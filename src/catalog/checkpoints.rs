//! Sharded safetensors checkpoints: a `*.safetensors.index.json` makes one model of the shards
//! its `weight_map` names, which must be listed in the index's directory and parse, and hold
//! every tensor where the index says (`format::safetensors::assemble`). The model's files are
//! the index, then the shards in name order. A shard belongs to its checkpoint and is not a model
//! of its own; an index that cannot be read claims every safetensors file in its directory,
//! since which ones it names cannot be known and they are parts of a broken checkpoint.

use std::collections::HashSet;
use std::sync::Arc;

use super::{CatalogError, Parsed, ParsedFile, Source, StoredFile, directory, version_of};
use crate::format::safetensors::{Index, assemble};
use crate::format::{FileKind, FormatError, Manifest};
use crate::storage::Listed;

/// The keys of every safetensors file some index of `parsed` claims as its shard.
pub(super) fn claimed_shards(parsed: &[(Listed, ParsedFile)]) -> HashSet<String> {
    let mut claimed = HashSet::new();
    for (object, file) in parsed.iter().filter(|(o, _)| FileKind::of(&o.key) == Some(FileKind::SafetensorsIndex)) {
        let dir = directory(&object.key);
        match &file.state {
            Ok(Parsed::Index(index)) => claimed.extend(index.shards.iter().map(|shard| format!("{dir}{shard}"))),
            _ => claimed.extend(
                parsed
                    .iter()
                    .map(|(o, _)| &o.key)
                    .filter(|key| directory(key) == dir && FileKind::of(key) == Some(FileKind::Safetensors))
                    .cloned(),
            ),
        }
    }
    claimed
}

/// A checkpoint whose index and shards all parsed: assembled into one manifest on demand, so
/// a rescan that finds every file unchanged keeps the model it had without assembling it again.
pub(super) struct Checkpoint {
    index: Arc<Index>,
    index_len: u64,
    shards: Vec<(String, Arc<Manifest>)>,
}

impl Checkpoint {
    /// The model's manifest, every tensor held to the shard the index names.
    pub(super) fn assemble(&self) -> Result<Arc<Manifest>, CatalogError> {
        let shards: Vec<(&str, &Manifest)> = self.shards.iter().map(|(name, m)| (name.as_str(), m.as_ref())).collect();
        Ok(Arc::new(assemble(&self.index, self.index_len, &shards)?))
    }
}

/// The files of the checkpoint whose index is `index_object` (the index, then the shards found
/// so far), and the checkpoint, or why it cannot be served. `parsed` is in key order.
pub(super) fn resolve(
    source: &Arc<Source>,
    index_object: &Listed,
    index_file: &ParsedFile,
    parsed: &[(Listed, ParsedFile)],
) -> (Vec<StoredFile>, Result<Checkpoint, CatalogError>) {
    let mut files = vec![StoredFile::new(version_of(source, index_object))];
    let index = match &index_file.state {
        Ok(Parsed::Index(index)) => index,
        // Files are read by their kind, so an index never holds a manifest.
        Ok(Parsed::Manifest(_) | Parsed::GgufPart(_)) => {
            return (files, Err(FormatError::SafetensorsIndex { detail: "not an index".into() }.into()));
        }
        Err(e) => return (files, Err(e.clone())),
    };
    let dir = directory(&index_object.key);
    let mut shards = Vec::with_capacity(index.shards.len());
    for name in &index.shards {
        let key = format!("{dir}{name}");
        let Ok(at) = parsed.binary_search_by(|(o, _)| o.key.as_str().cmp(&key)) else {
            return (files, Err(FormatError::ShardMissing { shard: name.clone() }.into()));
        };
        let (listed, shard) = &parsed[at];
        match shard.manifest() {
            Ok(manifest) => shards.push((name.clone(), Arc::clone(manifest))),
            Err(e) => return (files, Err(CatalogError::InShard { shard: name.clone(), error: Box::new(e) })),
        }
        files.push(StoredFile::new(version_of(source, listed)));
    }
    (files, Ok(Checkpoint { index: Arc::clone(index), index_len: index_object.size, shards }))
}
