//! Finding a v2 root's shards among the files listed beside it. A shard name is a label, never
//! a path (spec §7.1), so it is looked up by the spec's conventions, in order: the sibling
//! `<root stem>-<name>.zt`, then any file in the root's directory whose size and whole-file
//! digest match the shard table (Appendix B). A shard found by name is held to its size and,
//! unless digests are not checked, its digest; whole-file digests are computed once per file
//! version and remembered across scans. The same rules hold for local directories and S3
//! prefixes: both are lists of keys.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt as _;

use super::{CatalogError, Source, StoredFile, directory, version_of};
use crate::format::decode::Hasher;
use crate::format::v2::positional_shard_name;
use crate::format::{Digest, FileKind, FormatError, Manifest, Shard};
use crate::storage::Listed;

/// Whole-file digests already computed: by source, key, version and algorithm.
pub(super) type DigestMemo = Mutex<HashMap<(String, String, String, &'static str), Digest>>;

/// Resolves every shard of `manifest` (whose root is `root`) among `listing`: the model's
/// files, root first then each shard in table order, or why the model cannot be served.
pub(super) async fn resolve(
    source: &Arc<Source>,
    root: &Listed,
    manifest: &Manifest,
    listing: &[Listed],
    memo: &DigestMemo,
    check_digests: bool,
) -> Result<Vec<StoredFile>, CatalogError> {
    let dir = directory(&root.key);
    let siblings: Vec<&Listed> = listing
        .iter()
        .filter(|l| l.key != root.key && directory(&l.key) == dir && FileKind::of(&l.key) == Some(FileKind::Zt))
        .collect();
    let mut files = vec![StoredFile::new(version_of(source, root))];
    for shard in &manifest.shards {
        let by_name = format!("{dir}{}", positional_shard_name(&root.key[dir.len()..], &shard.name));
        let named = siblings.iter().find(|l| l.key == by_name);
        let found = match named {
            Some(listed) if listed.size == shard.size => {
                if !check_digests || digest_of(source, listed, &shard.digest, memo).await? == shard.digest {
                    Some(*listed)
                } else {
                    find_by_identity(source, shard, &siblings, memo).await?
                }
            }
            _ => find_by_identity(source, shard, &siblings, memo).await?,
        };
        let Some(listed) = found else {
            let error = match named {
                Some(listed) if listed.size != shard.size => FormatError::ShardSizeMismatch {
                    shard: shard.name.clone(),
                    expected: shard.size,
                    actual: listed.size,
                },
                Some(listed) => FormatError::ShardDigestMismatch {
                    shard: shard.name.clone(),
                    expected: shard.digest.to_string(),
                    actual: digest_of(source, listed, &shard.digest, memo).await?.to_string(),
                },
                None => FormatError::ShardMissing { shard: shard.name.clone() },
            };
            return Err(error.into());
        };
        files.push(StoredFile::new(version_of(source, listed)));
    }
    Ok(files)
}

/// The first sibling of the shard's size whose whole-file digest is the shard's.
async fn find_by_identity<'l>(
    source: &Arc<Source>,
    shard: &Shard,
    siblings: &[&'l Listed],
    memo: &DigestMemo,
) -> Result<Option<&'l Listed>, CatalogError> {
    for listed in siblings.iter().filter(|l| l.size == shard.size) {
        if digest_of(source, listed, &shard.digest, memo).await? == shard.digest {
            return Ok(Some(listed));
        }
    }
    Ok(None)
}

/// The whole-file digest of `listed` in `like`'s algorithm, computed once per file version:
/// the file streams through the hasher off the async runtime, never held whole.
async fn digest_of(
    source: &Arc<Source>,
    listed: &Listed,
    like: &Digest,
    memo: &DigestMemo,
) -> Result<Digest, CatalogError> {
    let key = (source.name.clone(), listed.key.clone(), listed.version.clone(), like.algorithm());
    if let Some(digest) = memo.lock().expect("never poisoned").get(&key) {
        return Ok(digest.clone());
    }
    let object = version_of(source, listed);
    let (pieces, mut receiver) = tokio::sync::mpsc::channel::<bytes::Bytes>(4);
    let hasher = Hasher::for_digest(like);
    let hashing = tokio::task::spawn_blocking(move || {
        let mut hasher = hasher;
        while let Some(piece) = receiver.blocking_recv() {
            hasher.update(&piece);
        }
        hasher.finish()
    });
    let mut reading = object.stream(0..listed.size, "shard");
    while let Some(piece) = reading.next().await {
        if pieces.send(piece?).await.is_err() {
            break;
        }
    }
    drop(pieces);
    let digest = hashing
        .await
        .map_err(|e| {
            CatalogError::Storage(crate::storage::StorageError::Unavailable {
                source_name: source.name.clone(),
                message: e.to_string(),
            })
        })?
        .expect("shard digests are of algorithms this reader computes");
    memo.lock().expect("never poisoned").insert(key, digest.clone());
    Ok(digest)
}
