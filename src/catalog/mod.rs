//! Which models exist and their parsed manifests. A catalog is built from a listing of every
//! source (local directories and S3 prefixes) and the previous catalog: an object whose
//! version (a file's identity, an S3 ETag) has not changed keeps its parsed manifest, so it is
//! read and parsed once; an object that fails validation stays listed as broken with its
//! reason, and never stops the others from serving. A source that cannot be listed keeps the
//! models it had, and is reported degraded until it answers again.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use futures_util::StreamExt as _;

use crate::format::{FormatError, Limits, MAX_TRAILER_LEN, Manifest, ManifestReads};
use crate::storage::local::{MappedFile, version_of};
use crate::storage::scan::{FileIdentity, scan_local};
use crate::storage::{Listed, ObjectVersion, Storage, StorageError};

/// Why a model cannot be served.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CatalogError {
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("cannot read {path}: {message}")]
    Io { path: PathBuf, message: String },
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("id {id:?} is also provided by {first}; this copy in {second} is not served")]
    DuplicateId { id: String, first: String, second: String },
}

impl CatalogError {
    pub fn code(&self) -> &'static str {
        match self {
            CatalogError::Format(e) => e.code(),
            CatalogError::Io { .. } => "io_error",
            CatalogError::Storage(_) => "storage_error",
            CatalogError::DuplicateId { .. } => "duplicate_id",
        }
    }

    /// Whether the failure belongs to the object's bytes (kept until the object changes),
    /// rather than to reading them (retried at the next rescan).
    fn is_lasting(&self) -> bool {
        matches!(self, CatalogError::Format(_))
    }
}

/// Where a source's objects live.
#[derive(Debug)]
pub enum Backend {
    /// A local directory: listed by walking it, served from memory maps.
    Local(PathBuf),
    /// Any [`Storage`] (an S3 prefix): listed and read through the trait.
    Remote(Arc<dyn Storage>),
}

/// One configured source and how it has been answering.
#[derive(Debug)]
pub struct Source {
    /// As configured: `models`, `s3://bucket/prefix`.
    pub name: String,
    pub backend: Backend,
    degraded: AtomicBool,
    /// The last failure to list or read, while it lasts.
    failure: Mutex<Option<StorageError>>,
}

impl Source {
    pub fn new(name: &str, backend: Backend) -> Arc<Source> {
        Arc::new(Source { name: name.to_owned(), backend, degraded: AtomicBool::new(false), failure: Mutex::new(None) })
    }

    /// The backend's name: `local` or the storage's (`s3`).
    pub fn kind(&self) -> &'static str {
        match &self.backend {
            Backend::Local(_) => "local",
            Backend::Remote(storage) => storage.backend(),
        }
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

/// One stored file of a model, and where its bytes are.
#[derive(Debug)]
pub enum StoredFile {
    Local {
        path: PathBuf,
        identity: FileIdentity,
        /// Filled on first use by the serving layer and kept while the file is unchanged: the
        /// file's bytes, mapped once and shared by every response.
        mapping: OnceLock<Arc<MappedFile>>,
    },
    Remote(ObjectVersion),
}

/// One model: a stored object and, when it is valid, its manifest.
#[derive(Debug)]
pub struct Model {
    pub id: String,
    pub source: Arc<Source>,
    /// The stored object's size in bytes.
    pub size: u64,
    /// What identifies this version of the object (a file's identity, an ETag).
    pub version: String,
    pub file: StoredFile,
    pub state: Result<Arc<Manifest>, CatalogError>,
    /// The manifest rendered as JSON once, not per request.
    pub manifest_json: OnceLock<Rendered>,
    /// Results of the content checks (bool bytes, sparse structure) by object name, run once
    /// per object while the file is unchanged.
    pub content_checks: Mutex<HashMap<String, Result<(), FormatError>>>,
    /// What has been learnt about each component (by object name and role) of this file
    /// version: kept for as long as the file is unchanged, whatever the decode cache evicts.
    facts: Mutex<HashMap<(String, String), Arc<ComponentFacts>>>,
}

/// A body rendered once per model version and its strong ETag (a digest of the body itself,
/// so a change in how the server renders it changes the tag too).
#[derive(Debug, Clone)]
pub struct Rendered {
    pub body: bytes::Bytes,
    pub etag: String,
}

/// What the server has learnt about one component of one file version.
#[derive(Debug, Default)]
pub struct ComponentFacts {
    /// The stored bytes' digest check, once made (under `verify = first-read`); concurrent
    /// first reads share one check.
    pub verdict: tokio::sync::OnceCell<Result<(), FormatError>>,
    /// SHA-256 of the decoded bytes, once a complete decode has computed it.
    pub decoded_sha256: Arc<OnceLock<[u8; 32]>>,
}

impl Model {
    fn new(
        id: &str,
        source: &Arc<Source>,
        size: u64,
        version: String,
        file: StoredFile,
        state: Result<Arc<Manifest>, CatalogError>,
    ) -> Model {
        if let Err(e) = &state {
            tracing::warn!(model = id, source = %source.name, code = e.code(), error = %e, "model is broken");
        }
        Model {
            id: id.to_owned(),
            source: Arc::clone(source),
            size,
            version,
            file,
            state,
            manifest_json: OnceLock::new(),
            content_checks: Mutex::new(HashMap::new()),
            facts: Mutex::new(HashMap::new()),
        }
    }

    /// The facts about component `role` of `object`, created empty on first use.
    pub fn facts(&self, object: &str, role: &str) -> Arc<ComponentFacts> {
        let mut facts = self.facts.lock().expect("facts lock is never poisoned");
        Arc::clone(facts.entry((object.to_owned(), role.to_owned())).or_default())
    }

    /// Whether this model can stand for `version` of the same object in a new catalog.
    fn still_valid_for(&self, source: &Source, version: &str) -> bool {
        self.source.name == source.name
            && self.version == version
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
}

/// An immutable snapshot of every source; the server swaps in a new one after each rescan.
#[derive(Debug, Default)]
pub struct Catalog {
    models: BTreeMap<String, Arc<Model>>,
    /// Sources that could not be listed in this scan, with the reason.
    pub unreadable_sources: Vec<(String, String)>,
}

impl Catalog {
    /// Lists `sources` in order, reusing `previous`'s parse of every object whose version is
    /// unchanged. Blocking work (walking directories, reading local manifests) runs off the
    /// async runtime.
    pub async fn build(sources: &[Arc<Source>], previous: &Arc<Catalog>, options: &ScanOptions) -> Catalog {
        let mut catalog = Catalog::default();
        for source in sources {
            let listed = match &source.backend {
                Backend::Local(root) => {
                    let (walked, root, previous, limits) =
                        (Arc::clone(source), root.clone(), Arc::clone(previous), options.limits);
                    tokio::task::spawn_blocking(move || list_local(&walked, &root, &previous, &limits))
                        .await
                        .unwrap_or_else(|e| {
                            Err(StorageError::Unavailable { source_name: source.name.clone(), message: e.to_string() })
                        })
                }
                Backend::Remote(storage) => list_remote(source, storage, previous, options).await,
            };
            let models = match listed {
                Ok(models) => {
                    source.report_success();
                    models
                }
                Err(e) => {
                    // Keep serving what was known: reads will say whether the objects answer.
                    source.report_failure(&e);
                    catalog.unreadable_sources.push((source.name.clone(), e.to_string()));
                    previous.models().filter(|m| Arc::ptr_eq(&m.source, source)).cloned().collect()
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
}

/// Walks a local source; new and changed files are opened and parsed. Blocking.
fn list_local(
    source: &Arc<Source>,
    root: &Path,
    previous: &Catalog,
    limits: &Limits,
) -> Result<Vec<Arc<Model>>, StorageError> {
    let (found, _skipped) = scan_local(root)
        .map_err(|e| StorageError::Unavailable { source_name: source.name.clone(), message: e.to_string() })?;
    Ok(found
        .into_iter()
        .map(|file| {
            let reused = previous.get(&file.id).filter(|m| {
                matches!(&m.file, StoredFile::Local { path, .. } if *path == file.path)
                    && m.still_valid_for(source, &version_of(&file.identity))
            });
            match reused {
                Some(model) => Arc::clone(model),
                None => Arc::new(load_local(&file.id, source, &file.path, limits)),
            }
        })
        .collect())
}

/// Lists a remote source; new and changed objects have their manifests read, several at once.
async fn list_remote(
    source: &Arc<Source>,
    storage: &Arc<dyn Storage>,
    previous: &Catalog,
    options: &ScanOptions,
) -> Result<Vec<Arc<Model>>, StorageError> {
    let listed = storage.list().await?;
    let models = futures_util::stream::iter(listed)
        .map(|object: Listed| async move {
            let id = object.key.strip_suffix(".zt").unwrap_or(&object.key).to_owned();
            if let Some(model) = previous.get(&id).filter(|m| m.still_valid_for(source, &object.version)) {
                return Arc::clone(model);
            }
            let object = ObjectVersion {
                storage: Arc::clone(storage),
                key: object.key,
                version: object.version,
                size: object.size,
            };
            let state = read_remote_manifest(&object, options).await;
            if let Err(CatalogError::Storage(e)) = &state {
                source.report_failure(e);
            }
            let (size, version) = (object.size, object.version.clone());
            Arc::new(Model::new(&id, source, size, version, StoredFile::Remote(object), state.map(Arc::new)))
        })
        .buffer_unordered(options.concurrent_reads.max(1))
        .collect()
        .await;
    Ok(models)
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
    tokio::task::spawn_blocking(move || located.parse(&tail, &missing, &limits))
        .await
        .map_err(|e| {
            CatalogError::Storage(StorageError::Unavailable {
                source_name: object.storage.name().to_owned(),
                message: e.to_string(),
            })
        })?
        .map_err(CatalogError::from)
}

/// Opens and parses one local file. The identity is taken from the open descriptor, so it
/// describes exactly the bytes read even if the path is replaced meanwhile. Reads use `pread`,
/// not a mapping, so a file truncated during the read gives an error, not SIGBUS.
fn load_local(id: &str, source: &Arc<Source>, path: &Path, limits: &Limits) -> Model {
    let io_error = |e: std::io::Error| CatalogError::Io { path: path.to_owned(), message: e.to_string() };
    let opened = File::open(path).and_then(|f| f.metadata().map(|m| (f, m)));
    let (state, identity) = match opened {
        Err(e) => (Err(io_error(e)), FileIdentity { size: 0, mtime_ns: 0, inode: 0, device: 0 }),
        Ok((file, metadata)) => {
            let identity = FileIdentity::of(&metadata);
            let started = std::time::Instant::now();
            let read = read_manifest(&file, identity.size, limits);
            crate::storage::local::record_read("manifest", started, read.as_ref().map_or(0, |(_, bytes)| *bytes));
            let state = read.map(|(manifest, _)| Arc::new(manifest)).map_err(|e| match e {
                ReadError::Format(e) => CatalogError::Format(e),
                ReadError::Io(e) => io_error(e),
            });
            (state, identity)
        }
    };
    let file = StoredFile::Local { path: path.to_owned(), identity, mapping: OnceLock::new() };
    Model::new(id, source, identity.size, version_of(&identity), file, state)
}

enum ReadError {
    Format(FormatError),
    Io(std::io::Error),
}

impl From<FormatError> for ReadError {
    fn from(e: FormatError) -> Self {
        ReadError::Format(e)
    }
}

impl From<std::io::Error> for ReadError {
    fn from(e: std::io::Error) -> Self {
        ReadError::Io(e)
    }
}

/// Reads the header, the trailer and the manifest: three reads, never the component bytes.
/// Returns the manifest and the bytes read.
fn read_manifest(file: &File, len: u64, limits: &Limits) -> Result<(Manifest, u64), ReadError> {
    let reads = ManifestReads::new(len, MAX_TRAILER_LEN);
    let read = |range: std::ops::Range<u64>| -> std::io::Result<Vec<u8>> {
        let mut bytes = vec![0u8; (range.end - range.start) as usize];
        file.read_exact_at(&mut bytes, range.start)?;
        Ok(bytes)
    };
    let (head, tail) = (read(reads.head())?, read(reads.tail())?);
    let located = reads.locate(&head, &tail, limits)?;
    let missing = read(located.missing.clone())?;
    let total = (head.len() + tail.len() + missing.len()) as u64;
    Ok((located.parse(&tail, &missing, limits)?, total))
}

#[cfg(test)]
mod tests {
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
        dirs.iter().map(|d| Source::new(&d.display().to_string(), Backend::Local(d.to_path_buf()))).collect()
    }

    fn build(sources: &[Arc<Source>], previous: &Arc<Catalog>) -> Arc<Catalog> {
        let options = ScanOptions { limits: Limits::default(), manifest_suffix_bytes: 64 << 10, concurrent_reads: 4 };
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
}
