//! Listing a source into models: new and changed objects have their manifests read (several
//! at once), unchanged ones keep their parse; every file with a manifest is a model, every
//! index a checkpoint's, a root's shards are resolved among the files listed, and the other
//! files are given to the models beside them.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::StreamExt as _;

use super::read::{ParsedFile, ScanOptions, read_listed};
use super::{
    Catalog, CatalogError, Companion, Model, Source, StoredFile, checkpoints, companions, gguf_splits, ids, shards,
    signatures,
};
use crate::format::{FileKind, FormatError};
use crate::storage::{Listed, ObjectVersion, StorageError};

pub(super) type Listing = (
    Vec<Arc<Model>>,
    Vec<((String, String), ParsedFile)>,
    BTreeMap<String, Arc<[Companion]>>,
    BTreeMap<String, Arc<super::SignedDirectory>>,
    BTreeMap<String, Arc<super::Versions>>,
);

/// Lists a source; new and changed objects have their manifests read, several at once. Every
/// file with a manifest is a model, and every index a checkpoint's; a root's shards are
/// resolved among the files listed. Every backend's listing passes here (and a listing the disk
/// cache kept, through [`models_of`]).
pub(super) async fn list(
    source: &Arc<Source>,
    previous: &Catalog,
    options: &ScanOptions,
    digests: &shards::DigestMemo,
) -> Result<Listing, StorageError> {
    let listed = source.storage.list().await?;
    Ok(models_of(source, listed, previous, options, digests).await)
}

/// The models of `listed`, a listing of `source` (as [`list`] makes them). The keys of the
/// lineages' versions that are not kept are dropped first, before anything is read.
pub(super) async fn models_of(
    source: &Arc<Source>,
    listed: Vec<Listed>,
    previous: &Catalog,
    options: &ScanOptions,
    digests: &shards::DigestMemo,
) -> Listing {
    let (listed, lineages) = options.lineages.sift(&source.name, listed);
    let parsed = parse_listed(source, &listed, previous, options).await;
    let claimed = checkpoints::claimed_shards(&parsed);
    let ids = ids::assign(parsed.iter().filter_map(|(object, file)| {
        let kind = FileKind::of(&object.key)?;
        stands_for_a_model(object, kind, file, &claimed, &parsed).then_some((object.key.as_str(), kind))
    }));
    let mut models = Vec::with_capacity(parsed.len());
    for (object, file) in &parsed {
        let Some(kind) = FileKind::of(&object.key) else { continue };
        let Some(id) = ids.get(object.key.as_str()).cloned() else { continue };
        let (files, state, container) = match kind {
            FileKind::SafetensorsIndex => {
                let (files, checkpoint) = checkpoints::resolve(source, object, file, &parsed);
                // Every file unchanged: the model is too, and is not assembled again.
                if let Some(model) = previous.get(&id).filter(|m| m.still_valid_for(source, &files)) {
                    models.push(Arc::clone(model));
                    continue;
                }
                (files, checkpoint.and_then(|c| c.assemble()), Some(crate::format::Container::Safetensors))
            }
            FileKind::Safetensors if claimed.contains(object.key.as_str()) => continue,
            FileKind::Gguf if gguf_splits::is_part(&object.key) => {
                // The first part listed stands for the model; the others are its files.
                let Some((files, assembled)) = gguf_splits::resolve(source, object, &parsed) else { continue };
                if let Some(model) = previous.get(&id).filter(|m| m.still_valid_for(source, &files)) {
                    models.push(Arc::clone(model));
                    continue;
                }
                (files, assembled, Some(crate::format::Container::Gguf))
            }
            _ if matches!(file.state, Err(CatalogError::Format(FormatError::DataShard))) => continue,
            _ => {
                let root = || StoredFile::new(version_of(source, object));
                let (files, state) = match file.manifest() {
                    Ok(manifest) if !manifest.shards.is_empty() => {
                        match shards::resolve(source, object, manifest, &listed, digests, options.check_shard_digests)
                            .await
                        {
                            Ok(files) => (files, Ok(Arc::clone(manifest))),
                            Err(e) => (vec![root()], Err(e)),
                        }
                    }
                    state => (vec![root()], state.cloned()),
                };
                // Known once the manifest parsed, even when the model's shards are not found.
                (files, state, file.manifest().ok().map(|m| m.container))
            }
        };
        if let Err(CatalogError::Storage(e)) = &state {
            source.report_failure(e);
        }
        match previous.get(&id).filter(|m| m.still_valid_for(source, &files)) {
            Some(model) if model.state.is_ok() == state.is_ok() => models.push(Arc::clone(model)),
            _ => {
                let mut model = Model::new(&id, source, files, state);
                model.container = container;
                models.push(Arc::new(model))
            }
        }
    }
    let companions = companions::assign(source, &models, &listed);
    let signed = match &options.signature_file {
        Some(name) => signatures::assign(source, &models, &listed, name),
        None => BTreeMap::new(),
    };
    let files = parsed.into_iter().map(|(object, file)| ((source.name.clone(), object.key), file)).collect();
    (models, files, companions, signed, lineages)
}

/// Whether `object` (a file of `kind`, read as `file`) is a model of its own rather than part of
/// one: a checkpoint's shard (`claimed`), a split GGUF's later part, or a `.zt` data shard.
fn stands_for_a_model(
    object: &Listed,
    kind: FileKind,
    file: &ParsedFile,
    claimed: &std::collections::HashSet<String>,
    parsed: &[(Listed, ParsedFile)],
) -> bool {
    match kind {
        FileKind::SafetensorsIndex => true,
        FileKind::Safetensors if claimed.contains(object.key.as_str()) => false,
        FileKind::Gguf if gguf_splits::is_part(&object.key) => gguf_splits::stands_for_model(&object.key, parsed),
        _ => !matches!(file.state, Err(CatalogError::Format(FormatError::DataShard))),
    }
}

/// Each model file of `listed` (a listing of `source`) read: its manifest parsed, or kept from
/// `previous` when its version is unchanged and its outcome lasts; sorted by key.
async fn parse_listed(
    source: &Arc<Source>,
    listed: &[Listed],
    previous: &Catalog,
    options: &ScanOptions,
) -> Vec<(Listed, ParsedFile)> {
    let model_files: Vec<Listed> = listed.iter().filter(|l| FileKind::of(&l.key).is_some()).cloned().collect();
    let mut parsed: Vec<(Listed, ParsedFile)> = futures_util::stream::iter(model_files)
        .map(|object: Listed| async move {
            let known = previous.files.get(&(source.name.clone(), object.key.clone()));
            if let Some(parsed) = known.filter(|p| p.version == object.version) {
                if parsed.state.as_ref().map_or_else(CatalogError::is_lasting, |_| true) {
                    return (object, parsed.clone());
                }
            }
            let version = version_of(source, &object);
            let state = read_listed(&version, options).await;
            if let Err(CatalogError::Storage(e)) = &state {
                source.report_failure(e);
            }
            (object, ParsedFile { version: version.version, state })
        })
        .buffer_unordered(options.concurrent_reads.max(1))
        .collect()
        .await;
    parsed.sort_by(|a, b| a.0.key.cmp(&b.0.key));
    parsed
}

/// The directory part of a key (`org/` of `org/llama.zt`; empty at the source's root).
pub(super) fn directory(key: &str) -> &str {
    key.rfind('/').map_or("", |slash| &key[..=slash])
}

pub(super) fn version_of(source: &Arc<Source>, listed: &Listed) -> ObjectVersion {
    ObjectVersion {
        storage: Arc::clone(&source.storage),
        key: listed.key.clone(),
        version: listed.version.clone(),
        size: listed.size,
    }
}
