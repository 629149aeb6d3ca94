//! Split GGUF models: the parts `name-00001-of-00003.gguf` … `name-00003-of-00003.gguf` of one
//! directory are one model (named as `name.gguf` would be), whose files are the parts in order
//! and whose manifest `format::gguf::assemble` makes of their headers: every part listed and
//! parsed, their `split.*` keys agreeing with their names. The first part listed stands for the
//! model, so a split model missing its first part is still one (broken) model, not several.

use std::sync::Arc;

use super::{CatalogError, Parsed, ParsedFile, Source, StoredFile, directory, version_of};
use crate::format::gguf::{assemble, split_file_name, split_name};
use crate::format::{FormatError, Manifest};
use crate::storage::Listed;

/// Whether the file at `key` is named as a part of a split GGUF model.
pub(super) fn is_part(key: &str) -> bool {
    split_name(&key[directory(key).len()..]).is_some()
}

/// Whether the part at `key` stands for its model: no earlier part of it is listed in `parsed`
/// (in key order).
pub(super) fn stands_for_model(key: &str, parsed: &[(Listed, ParsedFile)]) -> bool {
    let dir = directory(key);
    match split_name(&key[dir.len()..]) {
        Some((prefix, number, count)) => (1..number).all(|n| listed_part(parsed, dir, prefix, n, count).is_none()),
        None => false,
    }
}

/// Part `n` of `count` of the split model `prefix` in `dir`, if `parsed` (in key order) lists it.
fn listed_part<'a>(
    parsed: &'a [(Listed, ParsedFile)],
    dir: &str,
    prefix: &str,
    n: u64,
    count: u64,
) -> Option<&'a (Listed, ParsedFile)> {
    let key = format!("{dir}{}", split_file_name(prefix, n, count));
    parsed.binary_search_by(|(o, _)| o.key.as_str().cmp(&key)).ok().map(|at| &parsed[at])
}

/// A split model's files (the parts listed, in order) and its manifest, or why it has none.
type SplitModel = (Vec<StoredFile>, Result<Arc<Manifest>, CatalogError>);

/// The files of the split model `part` belongs to (the parts listed, in order) and its
/// manifest, or why it cannot be served; `None` when an earlier part of the same model is
/// listed and stands for it. `parsed` is in key order.
pub(super) fn resolve(source: &Arc<Source>, part: &Listed, parsed: &[(Listed, ParsedFile)]) -> Option<SplitModel> {
    if !stands_for_model(&part.key, parsed) {
        return None;
    }
    let dir = directory(&part.key);
    let (prefix, _, count) = split_name(&part.key[dir.len()..])?;
    let listed = |n: u64| listed_part(parsed, dir, prefix, n, count);
    let mut files = Vec::new();
    let mut headers = Vec::new();
    let mut failure = None;
    for n in 1..=count {
        let name = split_file_name(prefix, n, count);
        let Some((object, file)) = listed(n) else {
            failure.get_or_insert(CatalogError::from(FormatError::ShardMissing { shard: name }));
            continue;
        };
        files.push(StoredFile::new(version_of(source, object)));
        match &file.state {
            Ok(Parsed::GgufPart(header)) => headers.push((name, Arc::clone(header), object.size)),
            // A file named as a part is always read as one.
            Ok(_) => {
                let error = FormatError::Gguf { code: "gguf_split", at: 0, detail: "not read as a split part".into() };
                failure.get_or_insert(CatalogError::InShard { shard: name, error: Box::new(error.into()) });
            }
            Err(e) => {
                failure.get_or_insert(CatalogError::InShard { shard: name, error: Box::new(e.clone()) });
            }
        }
    }
    let state = match failure {
        Some(e) => Err(e),
        None => {
            let parts: Vec<(&str, &crate::format::gguf::Header, u64)> =
                headers.iter().map(|(name, header, len)| (name.as_str(), header.as_ref(), *len)).collect();
            assemble(&parts).map(Arc::new).map_err(CatalogError::from)
        }
    };
    Some((files, state))
}
