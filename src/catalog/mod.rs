//! Which models exist and their parsed manifests. A catalog is built from a listing of every
//! source (local directories and S3 prefixes alike, through the `Storage` trait) and the
//! previous catalog: an object whose version (a file's identity, an S3 ETag) has not changed
//! keeps its parsed manifest, so it is read and parsed once; an object that fails validation
//! stays listed as broken with its reason, and never stops the others from serving. A source
//! that cannot be listed keeps the models it had, and is reported degraded until it answers
//! again. A v2 root's shards are found among the files beside it ([`shards`]); a data shard
//! (a v2 file with no manifest) is part of some root's model, never a model of its own. A
//! safetensors file is a model unless a `*.safetensors.index.json` beside it makes it a shard of
//! a checkpoint ([`checkpoints`]). The other files listed belong to the models of the nearest
//! directory above them that holds a model file ([`companions`]).

mod checkpoints;
mod companions;
mod shards;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use futures_util::StreamExt as _;

use crate::format::safetensors::{self, Index};
use crate::format::{FileKind, FormatError, Limits, Manifest, ManifestReads};
use crate::storage::mapped::MappedFile;
use crate::storage::{Listed, ObjectVersion, Storage, StorageError};
pub use companions::Companion;

/// Why a model cannot be served.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CatalogError {
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("id {id:?} is also provided by {first}; this copy in {second} is not served")]
    DuplicateId { id: String, first: String, second: String },
    #[error("shard {shard}: {error}")]
    InShard { shard: String, error: Box<CatalogError> },
}

impl CatalogError {
    pub fn code(&self) -> &'static str {
        match self {
            CatalogError::Format(e) => e.code(),
            CatalogError::Storage(_) => "storage_error",
            CatalogError::DuplicateId { .. } => "duplicate_id",
            CatalogError::InShard { error, .. } => error.code(),
        }
    }

    /// Whether the failure belongs to the object's bytes (kept until the object changes),
    /// rather than to reading them (retried at the next rescan).
    fn is_lasting(&self) -> bool {
        match self {
            CatalogError::InShard { error, .. } => error.is_lasting(),
            other => matches!(other, CatalogError::Format(_)),
        }
    }
}

/// One configured source and how it has been answering.
#[derive(Debug)]
pub struct Source {
    /// As configured: `models`, `s3://bucket/prefix`.
    pub name: String,
    pub storage: Arc<dyn Storage>,
    degraded: AtomicBool,
    /// The last failure to list or read, while it lasts.
    failure: Mutex<Option<StorageError>>,
}

impl Source {
    pub fn new(storage: Arc<dyn Storage>) -> Arc<Source> {
        let name = storage.name().to_owned();
        Arc::new(Source { name, storage, degraded: AtomicBool::new(false), failure: Mutex::new(None) })
    }

    /// The backend's name (`local`, `s3`).
    pub fn kind(&self) -> &'static str {
        self.storage.backend()
    }

    /// Records a failure of the source itself (unreachable, refusing); a changed or missing
    /// object says nothing about the source and is not recorded.
    pub fn report_failure(&self, error: &StorageError) {
        if matches!(error, StorageError::Unavailable { .. } | StorageError::Refused { .. }) {
            if !self.degraded.swap(true, Ordering::SeqCst) {
                tracing::warn!(source = %self.name, error = %error, "source degraded");
            }
            *self.failure.lock().expect("never poisoned") = Some(error.clone());
        }
    }

    /// Records that the source answered.
    pub fn report_success(&self) {
        if self.degraded.load(Ordering::Relaxed) && self.degraded.swap(false, Ordering::SeqCst) {
            tracing::info!(source = %self.name, "source answers again");
            *self.failure.lock().expect("never poisoned") = None;
        }
    }

    /// The failure the source is degraded by, if it is.
    pub fn failure(&self) -> Option<StorageError> {
        self.failure.lock().expect("never poisoned").clone()
    }
}

/// One stored file of a model: its name (beside the model's other files), the object version
/// listed, every read bound to it, and, from a backend that maps files, its mapping, made on
/// first use and kept while the file is unchanged, shared by every response.
#[derive(Debug)]
pub struct StoredFile {
    pub name: String,
    pub object: ObjectVersion,
    pub mapping: OnceLock<Arc<MappedFile>>,
}

impl StoredFile {
    pub fn new(object: ObjectVersion) -> StoredFile {
        let name = object.key.rsplit('/').next().unwrap_or(&object.key).to_owned();
        StoredFile { name, object, mapping: OnceLock::new() }
    }
}

/// One model: a manifest and the stored files its components live in (the first holds the
/// manifest), and, when it is valid, the parsed manifest.
#[derive(Debug)]
pub struct Model {
    pub id: String,
    pub source: Arc<Source>,
    /// The stored files' total size in bytes.
    pub size: u64,
    /// The container of the file holding the manifest, once it has been identified.
    pub container: Option<crate::format::Container>,
    /// What identifies this version of the model: of its one file (a file's identity, an
    /// ETag), or a digest of every file's when it has several.
    pub version: String,
    /// Never empty; a component's `file` indexes it.
    pub files: Vec<StoredFile>,
    pub state: Result<Arc<Manifest>, CatalogError>,
    /// When the catalog first found this version (the S3 endpoint's `Last-Modified`).
    pub found_at: std::time::SystemTime,
}

impl Model {
    fn new(
        id: &str,
        source: &Arc<Source>,
        files: Vec<StoredFile>,
        state: Result<Arc<Manifest>, CatalogError>,
    ) -> Model {
        if let Err(e) = &state {
            tracing::warn!(model = id, source = %source.name, code = e.code(), error = %e, "model is broken");
        }
        let size = files.iter().map(|f| f.object.size).sum();
        let version = match &files[..] {
            [one] => one.object.version.clone(),
            several => {
                use sha2::Digest as _;
                let mut hasher = sha2::Sha256::new();
                for file in several {
                    hasher.update(file.object.key.as_bytes());
                    hasher.update([0]);
                    hasher.update(file.object.version.as_bytes());
                    hasher.update([0]);
                }
                hex::encode(&hasher.finalize()[..16])
            }
        };
        Model {
            id: id.to_owned(),
            source: Arc::clone(source),
            size,
            container: None,
            version,
            files,
            state,
            found_at: std::time::SystemTime::now(),
        }
    }

    /// The byte length of the model's file `index` (a component's `file`): for the file holding
    /// the manifest, the length it was parsed at, which every offset in the manifest was checked
    /// against; for any other, its listed size.
    pub fn file_len(&self, manifest: &Manifest, index: usize) -> u64 {
        if index == 0 { manifest.file_len } else { self.files[index].object.size }
    }

    /// Whether this model can stand for the same files, in the same versions, in a new
    /// catalog: it keeps its mappings and parsed manifest.
    fn still_valid_for(&self, source: &Source, files: &[StoredFile]) -> bool {
        self.source.name == source.name
            && self.files.len() == files.len()
            && self
                .files
                .iter()
                .zip(files)
                .all(|(a, b)| a.object.key == b.object.key && a.object.version == b.object.version)
            && self.state.as_ref().map_or_else(CatalogError::is_lasting, |_| true)
    }
}

/// How the catalog reads manifests.
#[derive(Debug, Clone)]
pub struct ScanOptions {
    pub limits: Limits,
    /// Bytes read from the end of a remote object in the first request for its manifest.
    pub manifest_suffix_bytes: u64,
    /// Remote manifests read at once.
    pub concurrent_reads: usize,
    /// Whether a shard found by name must also match its whole-file digest (a shard found by
    /// scanning the directory is always matched by digest).
    pub check_shard_digests: bool,
}

/// One listed file's manifest (or a checkpoint's index), as read for one version of it.
#[derive(Debug, Clone)]
struct ParsedFile {
    version: String,
    state: Result<Parsed, CatalogError>,
}

/// What a listed file holds.
#[derive(Debug, Clone)]
enum Parsed {
    /// A `.zt` manifest, or a safetensors file's header as one.
    Manifest(Arc<Manifest>),
    /// A sharded safetensors checkpoint's index.
    Index(Arc<Index>),
}

impl ParsedFile {
    /// The manifest it holds, or why it holds none (an index holds none: it names files that do).
    fn manifest(&self) -> Result<&Arc<Manifest>, CatalogError> {
        match &self.state {
            Ok(Parsed::Manifest(manifest)) => Ok(manifest),
            Ok(Parsed::Index(_)) => {
                Err(FormatError::SafetensorsIndex { detail: "an index, where a tensor file belongs".into() }.into())
            }
            Err(e) => Err(e.clone()),
        }
    }
}

/// An immutable snapshot of every source; the server swaps in a new one after each rescan.
#[derive(Debug, Default)]
pub struct Catalog {
    models: BTreeMap<String, Arc<Model>>,
    /// Sources that could not be listed in this scan, with the reason.
    pub unreadable_sources: Vec<(String, String)>,
    /// Every listed file's manifest (data shards and broken files included) by source and
    /// key, so an unchanged file is read once.
    files: HashMap<(String, String), ParsedFile>,
    /// Whole-file digests of shards, computed once per file version.
    digests: shards::DigestMemo,
    /// The files beside each model that are not model files, by model id.
    companions: BTreeMap<String, Arc<[Companion]>>,
}

impl Catalog {
    /// Lists `sources` in order, reusing `previous`'s parse of every object whose version is
    /// unchanged. Blocking work (walking directories, reading local manifests) runs off the
    /// async runtime.
    pub async fn build(sources: &[Arc<Source>], previous: &Arc<Catalog>, options: &ScanOptions) -> Catalog {
        let mut catalog = Catalog {
            digests: std::sync::Mutex::new(previous.digests.lock().expect("never poisoned").clone()),
            ..Catalog::default()
        };
        for source in sources {
            let listed = list(source, previous, options, &catalog.digests).await;
            let models = match listed {
                Ok((models, files, companions)) => {
                    source.report_success();
                    catalog.files.extend(files);
                    for (id, files) in companions {
                        catalog.companions.entry(id).or_insert(files);
                    }
                    models
                }
                Err(e) => {
                    // Keep serving what was known: reads will say whether the objects answer.
                    source.report_failure(&e);
                    catalog.unreadable_sources.push((source.name.clone(), e.to_string()));
                    let kept = previous.files.iter().filter(|((name, _), _)| *name == source.name);
                    catalog.files.extend(kept.map(|(key, parsed)| (key.clone(), parsed.clone())));
                    let kept: Vec<Arc<Model>> =
                        previous.models().filter(|m| Arc::ptr_eq(&m.source, source)).cloned().collect();
                    for model in &kept {
                        if let Some(files) = previous.companions.get(&model.id) {
                            catalog.companions.entry(model.id.clone()).or_insert_with(|| Arc::clone(files));
                        }
                    }
                    kept
                }
            };
            for model in models {
                if let Some(existing) = catalog.models.get(&model.id) {
                    let duplicate = CatalogError::DuplicateId {
                        id: model.id.clone(),
                        first: existing.source.name.clone(),
                        second: source.name.clone(),
                    };
                    tracing::warn!(error = %duplicate, "model id conflict");
                    continue;
                }
                catalog.models.insert(model.id.clone(), model);
            }
        }
        catalog
    }

    pub fn get(&self, id: &str) -> Option<&Arc<Model>> {
        self.models.get(id)
    }

    /// Every model, ordered by id.
    pub fn models(&self) -> impl Iterator<Item = &Arc<Model>> {
        self.models.values()
    }

    /// The files beside model `id` that are not model files (none when it has none).
    pub fn companions(&self, id: &str) -> &[Companion] {
        self.companions.get(id).map_or(&[], |files| files)
    }
}

/// A source's models, the manifest of every model file it lists, and each model's companions.
type Listing = (Vec<Arc<Model>>, Vec<((String, String), ParsedFile)>, BTreeMap<String, Arc<[Companion]>>);

/// Lists a source; new and changed objects have their manifests read, several at once. Every
/// file with a manifest is a model, and every index a checkpoint's; a root's shards are
/// resolved among the files listed.
async fn list(
    source: &Arc<Source>,
    previous: &Catalog,
    options: &ScanOptions,
    digests: &shards::DigestMemo,
) -> Result<Listing, StorageError> {
    let storage = &source.storage;
    let listed = storage.list().await?;
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
    let claimed = checkpoints::claimed_shards(&parsed);
    let mut models = Vec::with_capacity(parsed.len());
    for (object, file) in &parsed {
        let Some(kind) = FileKind::of(&object.key) else { continue };
        let id = kind.model_id(&object.key);
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
    let files = parsed.into_iter().map(|(object, file)| ((source.name.clone(), object.key), file)).collect();
    Ok((models, files, companions))
}

/// The directory part of a key (`org/` of `org/llama.zt`; empty at the source's root).
fn directory(key: &str) -> &str {
    key.rfind('/').map_or("", |slash| &key[..=slash])
}

fn version_of(source: &Arc<Source>, listed: &Listed) -> ObjectVersion {
    ObjectVersion {
        storage: Arc::clone(&source.storage),
        key: listed.key.clone(),
        version: listed.version.clone(),
        size: listed.size,
    }
}

/// Reads what a listed file holds, by its kind.
async fn read_listed(object: &ObjectVersion, options: &ScanOptions) -> Result<Parsed, CatalogError> {
    match FileKind::of(&object.key) {
        Some(FileKind::SafetensorsIndex) => {
            if object.size > safetensors::MAX_INDEX_LEN {
                let limit = safetensors::MAX_INDEX_LEN;
                return Err(FormatError::ManifestTooLarge { size: object.size, limit }.into());
            }
            let bytes = object.fetch(0..object.size, "manifest").await?;
            let index = blocking(object, move || safetensors::parse_index(&bytes)).await?;
            Ok(Parsed::Index(Arc::new(index)))
        }
        Some(FileKind::Safetensors) => {
            let reads = safetensors::HeaderReads::new(object.size, options.manifest_suffix_bytes);
            let first = object.fetch(reads.first(), "manifest").await?;
            let (_, missing) = reads.locate(&first)?;
            let missing = object.fetch(missing, "manifest").await?;
            let size = object.size;
            let manifest = blocking(object, move || reads.parse(&first, &missing)?.into_manifest(size)).await?;
            Ok(Parsed::Manifest(Arc::new(manifest)))
        }
        _ => Ok(Parsed::Manifest(Arc::new(read_remote_manifest(object, options).await?))),
    }
}

/// Runs a parse off the async runtime.
async fn blocking<T: Send + 'static>(
    object: &ObjectVersion,
    parse: impl FnOnce() -> Result<T, FormatError> + Send + 'static,
) -> Result<T, CatalogError> {
    tokio::task::spawn_blocking(parse)
        .await
        .map_err(|e| {
            CatalogError::Storage(StorageError::Unavailable {
                source_name: object.storage.name().to_owned(),
                message: e.to_string(),
            })
        })?
        .map_err(CatalogError::from)
}

/// Reads a remote object's manifest: one suffix read of `manifest_suffix_bytes` holds the
/// trailer and, when it fits, the manifest; a second read fetches the rest of a larger one.
/// The 8-byte header is read alongside the suffix (or taken from it, for a small object).
async fn read_remote_manifest(object: &ObjectVersion, options: &ScanOptions) -> Result<Manifest, CatalogError> {
    let reads = ManifestReads::new(object.size, options.manifest_suffix_bytes);
    let (head, tail) = if reads.tail().start == 0 {
        let whole = object.fetch(reads.tail(), "manifest").await?;
        (whole.slice(..reads.head().end as usize), whole)
    } else {
        let (head, tail) =
            futures_util::future::join(object.fetch(reads.head(), "manifest"), object.fetch(reads.tail(), "manifest"))
                .await;
        (head?, tail?)
    };
    let located = reads.locate(&head, &tail, &options.limits)?;
    let missing = object.fetch(located.missing.clone(), "manifest").await?;
    let limits = options.limits;
    blocking(object, move || located.parse(&tail, &missing, &limits)).await
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::format::DType;
    use crate::format::write::{ComponentInput, ObjectInput, WriteOptions, Writer};

    fn zt(values: &[u8]) -> Vec<u8> {
        let mut w = Writer::new(Vec::new()).unwrap();
        w.add(
            &ObjectInput {
                name: "w",
                shape: &[values.len() as u64],
                format: "dense",
                attributes: None,
                components: vec![ComponentInput { role: "data", dtype: DType::U8, logical_type: None, bytes: values }],
            },
            &WriteOptions::default(),
        )
        .unwrap();
        w.finish(None).unwrap()
    }

    fn local(dirs: &[&Path]) -> Vec<Arc<Source>> {
        dirs.iter()
            .map(|d| Source::new(Arc::new(crate::storage::local::LocalStorage::new(&d.display().to_string(), *d))))
            .collect()
    }

    fn build(sources: &[Arc<Source>], previous: &Arc<Catalog>) -> Arc<Catalog> {
        let options = ScanOptions {
            limits: Limits::default(),
            manifest_suffix_bytes: 64 << 10,
            concurrent_reads: 4,
            check_shard_digests: true,
        };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        Arc::new(runtime.block_on(Catalog::build(sources, previous, &options)))
    }

    #[test]
    fn unchanged_files_are_parsed_once_and_changes_are_picked_up() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("m");
        std::fs::create_dir_all(root.join("org")).unwrap();
        std::fs::write(root.join("a.zt"), zt(&[1, 2, 3])).unwrap();
        std::fs::write(root.join("org/b.zt"), zt(&[4])).unwrap();
        std::fs::write(root.join("broken.zt"), b"ZTEN1000 not really").unwrap();
        let sources = local(&[&root]);
        let first = build(&sources, &Arc::default());
        let ids: Vec<&str> = first.models().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["a", "broken", "org/b"]);
        assert_eq!(first.get("broken").unwrap().state.as_ref().unwrap_err().code(), "truncated");

        let second = build(&sources, &first);
        assert!(Arc::ptr_eq(first.get("a").unwrap(), second.get("a").unwrap()), "unchanged file reparsed");

        // Atomic replace by rename, a new file, and a removal.
        std::fs::write(root.join("a.tmp"), zt(&[9, 9, 9, 9])).unwrap();
        std::fs::rename(root.join("a.tmp"), root.join("a.zt")).unwrap();
        std::fs::write(root.join("c.zt"), zt(&[7])).unwrap();
        std::fs::remove_file(root.join("org/b.zt")).unwrap();
        let third = build(&sources, &second);
        let ids: Vec<&str> = third.models().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["a", "broken", "c"]);
        let a = third.get("a").unwrap().state.as_ref().unwrap();
        assert_eq!(a.objects[0].shape, [4]);
    }

    #[test]
    fn a_missing_source_is_reported_and_the_others_still_scan() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.zt"), zt(&[1])).unwrap();
        let sources = local(&[Path::new("/nonexistent/source"), dir.path()]);
        let catalog = build(&sources, &Arc::default());
        assert_eq!(catalog.unreadable_sources.len(), 1);
        assert!(sources[0].failure().is_some());
        assert!(catalog.get("a").unwrap().state.is_ok());
    }

    #[test]
    fn a_source_that_stops_answering_keeps_its_models() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("m");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("a.zt"), zt(&[1])).unwrap();
        let sources = local(&[&root]);
        let first = build(&sources, &Arc::default());
        std::fs::rename(&root, dir.path().join("gone")).unwrap();
        let second = build(&sources, &first);
        assert!(Arc::ptr_eq(first.get("a").unwrap(), second.get("a").unwrap()));
        assert!(sources[0].failure().is_some());
        std::fs::rename(dir.path().join("gone"), &root).unwrap();
        build(&sources, &second);
        assert!(sources[0].failure().is_none(), "recovered");
    }

    #[test]
    fn the_same_id_in_two_sources_is_served_from_the_first() {
        let one = tempfile::tempdir().unwrap();
        let two = tempfile::tempdir().unwrap();
        std::fs::write(one.path().join("a.zt"), zt(&[1])).unwrap();
        std::fs::write(two.path().join("a.zt"), zt(&[2, 2])).unwrap();
        let sources = local(&[one.path(), two.path()]);
        let catalog = build(&sources, &Arc::default());
        assert_eq!(catalog.get("a").unwrap().source.name, sources[0].name);
    }

    /// A safetensors file of U8 tensors.
    fn st(tensors: &[(&str, &[u8])]) -> Vec<u8> {
        let views = tensors.iter().map(|(name, data)| {
            (
                name.to_string(),
                ::safetensors::tensor::TensorView::new(::safetensors::Dtype::U8, vec![data.len()], data).unwrap(),
            )
        });
        ::safetensors::serialize(views, None).unwrap()
    }

    #[test]
    fn an_index_makes_one_model_of_its_shards_and_a_broken_one_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("org/llama")).unwrap();
        std::fs::create_dir_all(root.join("org/gone")).unwrap();
        std::fs::create_dir_all(root.join("org/bad")).unwrap();
        std::fs::write(root.join("single.safetensors"), st(&[("w", &[1, 2])])).unwrap();
        std::fs::write(root.join("org/llama/model-00001-of-00002.safetensors"), st(&[("a", &[1])])).unwrap();
        std::fs::write(root.join("org/llama/model-00002-of-00002.safetensors"), st(&[("b", &[2, 2])])).unwrap();
        let index = r#"{"metadata":{"total_size":3},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}"#;
        std::fs::write(root.join("org/llama/model.safetensors.index.json"), index).unwrap();
        std::fs::write(root.join("org/gone/model-00001-of-00002.safetensors"), st(&[("a", &[1])])).unwrap();
        std::fs::write(root.join("org/gone/model.safetensors.index.json"), index).unwrap();
        std::fs::write(root.join("org/bad/model-00001-of-00001.safetensors"), st(&[("a", &[1])])).unwrap();
        std::fs::write(root.join("org/bad/model.safetensors.index.json"), "{not json").unwrap();
        let sources = local(&[root]);
        let catalog = build(&sources, &Arc::default());
        let ids: Vec<&str> = catalog.models().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["org/bad", "org/gone", "org/llama", "single"]);
        let llama = catalog.get("org/llama").unwrap();
        let names: Vec<&str> = llama.files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            ["model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
        );
        assert_eq!(llama.container, Some(crate::format::Container::Safetensors));
        let manifest = llama.state.as_ref().unwrap();
        assert_eq!(manifest.object("b").unwrap().components[0].file, 2);
        let code = |id: &str| catalog.get(id).unwrap().state.as_ref().unwrap_err().code();
        assert_eq!(code("org/gone"), "shard_missing");
        assert_eq!(code("org/bad"), "safetensors_index");
        assert!(catalog.get("single").unwrap().state.is_ok());

        // Unchanged files keep the model; a shard rewritten changes the model's version, and a
        // broken shard breaks the checkpoint.
        let again = build(&sources, &catalog);
        assert!(Arc::ptr_eq(llama, again.get("org/llama").unwrap()), "an unchanged checkpoint is kept");
        let version = llama.version.clone();
        std::fs::write(root.join("org/llama/model-00002-of-00002.safetensors"), b"\xff\xff").unwrap();
        let next = build(&sources, &catalog);
        let llama = next.get("org/llama").unwrap();
        assert_ne!(llama.version, version);
        let error = llama.state.as_ref().unwrap_err();
        assert_eq!(error.code(), "truncated");
        assert!(error.to_string().starts_with("shard model-00002-of-00002.safetensors:"), "{error}");
    }
}
