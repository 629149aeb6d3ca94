//! Which models exist and their parsed manifests. A catalog is built from a scan of every
//! source and the previous catalog: a file whose identity (device, inode, size, mtime) has not
//! changed keeps its parsed manifest, so an unchanged file is parsed once; a file that fails
//! validation stays listed as broken with its reason, and never stops the others from serving.

pub mod cache;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use crate::format::{self, Container, FormatError, Limits, Manifest};
use crate::storage::local::MappedFile;
use crate::storage::scan::{scan_local, FileIdentity};

/// Why a model cannot be served.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CatalogError {
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("cannot read {path}: {message}")]
    Io { path: PathBuf, message: String },
    #[error("id {id:?} is also provided by {first}; this copy in {second} is not served")]
    DuplicateId { id: String, first: String, second: String },
}

impl CatalogError {
    pub fn code(&self) -> &'static str {
        match self {
            CatalogError::Format(e) => e.code(),
            CatalogError::Io { .. } => "io_error",
            CatalogError::DuplicateId { .. } => "duplicate_id",
        }
    }
}

/// One model: a file and, when it is valid, its manifest.
#[derive(Debug)]
pub struct Model {
    pub id: String,
    /// The source directory as configured.
    pub source: String,
    pub path: PathBuf,
    pub identity: FileIdentity,
    pub state: Result<Arc<Manifest>, CatalogError>,
    /// Filled on first use by the serving layer and kept while the file is unchanged: the
    /// file's bytes, mapped once and shared by every response.
    pub mapping: OnceLock<Arc<MappedFile>>,
    /// The manifest rendered as JSON once, not per request.
    pub manifest_json: OnceLock<bytes::Bytes>,
    /// Results of the content checks (bool bytes, sparse structure) by object name, run once
    /// per object while the file is unchanged.
    pub content_checks: Mutex<HashMap<String, Result<(), FormatError>>>,
    /// What has been learnt about each component (by object name and role) of this file
    /// version: kept for as long as the file is unchanged, whatever the decode cache evicts.
    facts: Mutex<HashMap<(String, String), Arc<ComponentFacts>>>,
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
    /// The facts about component `role` of `object`, created empty on first use.
    pub fn facts(&self, object: &str, role: &str) -> Arc<ComponentFacts> {
        let mut facts = self.facts.lock().expect("facts lock is never poisoned");
        Arc::clone(facts.entry((object.to_owned(), role.to_owned())).or_default())
    }
}

/// An immutable snapshot of every source; the server swaps in a new one after each rescan.
#[derive(Debug, Default)]
pub struct Catalog {
    models: BTreeMap<String, Arc<Model>>,
    /// Sources that could not be scanned, with the reason.
    pub unreadable_sources: Vec<(String, String)>,
}

impl Catalog {
    /// Scans `sources` in order, reusing `previous`'s parse of every file whose identity is
    /// unchanged. This does blocking IO: call it off the async runtime.
    pub fn build(sources: &[String], previous: &Catalog, limits: &Limits) -> Catalog {
        let mut catalog = Catalog::default();
        for source in sources {
            let (found, _skipped) = match scan_local(Path::new(source)) {
                Ok(result) => result,
                Err(e) => {
                    catalog.unreadable_sources.push((source.clone(), e.to_string()));
                    continue;
                }
            };
            for file in found {
                if let Some(existing) = catalog.models.get(&file.id) {
                    let duplicate = CatalogError::DuplicateId {
                        id: file.id.clone(),
                        first: existing.source.clone(),
                        second: source.clone(),
                    };
                    tracing::warn!(error = %duplicate, "model id conflict");
                    continue;
                }
                let reused = previous
                    .models
                    .get(&file.id)
                    .filter(|m| m.identity == file.identity && m.path == file.path && &m.source == source);
                let model = match reused {
                    Some(model) => Arc::clone(model),
                    None => Arc::new(load(&file.id, source, &file.path, limits)),
                };
                catalog.models.insert(file.id, model);
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

/// Opens and parses one file. The identity is taken from the open descriptor, so it describes
/// exactly the bytes read even if the path is replaced meanwhile. Reads use `pread`, not a
/// mapping, so a file truncated during the read gives an error, not SIGBUS.
fn load(id: &str, source: &str, path: &Path, limits: &Limits) -> Model {
    let io_error = |e: std::io::Error| CatalogError::Io { path: path.to_owned(), message: e.to_string() };
    let opened = File::open(path).and_then(|f| f.metadata().map(|m| (f, m)));
    let (state, identity) = match opened {
        Err(e) => (Err(io_error(e)), FileIdentity { size: 0, mtime_ns: 0, inode: 0, device: 0 }),
        Ok((file, metadata)) => {
            let identity = FileIdentity::of(&metadata);
            let started = std::time::Instant::now();
            let read = read_manifest(&file, identity.size, limits);
            crate::storage::local::record_read("manifest", started, read.as_ref().map_or(0, |(_, bytes)| *bytes));
            let state = read
                .map(|(manifest, _)| manifest).map(Arc::new).map_err(|e| match e {
                ReadError::Format(e) => CatalogError::Format(e),
                ReadError::Io(e) => io_error(e),
            });
            (state, identity)
        }
    };
    if let Err(e) = &state {
        tracing::warn!(model = id, source, code = e.code(), error = %e, "model is broken");
    }
    Model {
        id: id.to_owned(),
        source: source.to_owned(),
        path: path.to_owned(),
        identity,
        state,
        mapping: OnceLock::new(),
        manifest_json: OnceLock::new(),
        content_checks: Mutex::new(HashMap::new()),
        facts: Mutex::new(HashMap::new()),
    }
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
    let mut head = [0u8; 8];
    let head_len = len.min(8) as usize;
    file.read_exact_at(&mut head[..head_len], 0)?;
    let container = Container::sniff(&head[..head_len])?;
    let tail_len = len.min(16);
    let mut tail = [0u8; 16];
    file.read_exact_at(&mut tail[..tail_len as usize], len - tail_len)?;
    let span = format::manifest_span(container, len, &tail[..tail_len as usize], limits)?;
    let mut manifest = vec![0u8; (span.end - span.start) as usize];
    file.read_exact_at(&mut manifest, span.start)?;
    let read = head_len as u64 + tail_len + manifest.len() as u64;
    Ok((format::parse_manifest(container, &manifest, span, len, limits)?, read))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::write::{ComponentInput, ObjectInput, WriteOptions, Writer};
    use crate::format::DType;

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

    #[test]
    fn unchanged_files_are_parsed_once_and_changes_are_picked_up() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("m");
        std::fs::create_dir_all(root.join("org")).unwrap();
        std::fs::write(root.join("a.zt"), zt(&[1, 2, 3])).unwrap();
        std::fs::write(root.join("org/b.zt"), zt(&[4])).unwrap();
        std::fs::write(root.join("broken.zt"), b"ZTEN1000 not really").unwrap();
        let sources = vec![root.display().to_string()];
        let limits = Limits::default();
        let first = Catalog::build(&sources, &Catalog::default(), &limits);
        let ids: Vec<&str> = first.models().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["a", "broken", "org/b"]);
        assert_eq!(first.get("broken").unwrap().state.as_ref().unwrap_err().code(), "truncated");

        let second = Catalog::build(&sources, &first, &limits);
        assert!(Arc::ptr_eq(first.get("a").unwrap(), second.get("a").unwrap()), "unchanged file reparsed");

        // Atomic replace by rename, a new file, and a removal.
        std::fs::write(root.join("a.tmp"), zt(&[9, 9, 9, 9])).unwrap();
        std::fs::rename(root.join("a.tmp"), root.join("a.zt")).unwrap();
        std::fs::write(root.join("c.zt"), zt(&[7])).unwrap();
        std::fs::remove_file(root.join("org/b.zt")).unwrap();
        let third = Catalog::build(&sources, &second, &limits);
        let ids: Vec<&str> = third.models().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["a", "broken", "c"]);
        let a = third.get("a").unwrap().state.as_ref().unwrap();
        assert_eq!(a.objects[0].shape, [4]);
    }

    #[test]
    fn a_missing_source_is_reported_and_the_others_still_scan() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.zt"), zt(&[1])).unwrap();
        let sources = vec!["/nonexistent/source".to_owned(), dir.path().display().to_string()];
        let catalog = Catalog::build(&sources, &Catalog::default(), &Limits::default());
        assert_eq!(catalog.unreadable_sources.len(), 1);
        assert!(catalog.get("a").unwrap().state.is_ok());
    }

    #[test]
    fn the_same_id_in_two_sources_is_served_from_the_first() {
        let one = tempfile::tempdir().unwrap();
        let two = tempfile::tempdir().unwrap();
        std::fs::write(one.path().join("a.zt"), zt(&[1])).unwrap();
        std::fs::write(two.path().join("a.zt"), zt(&[2, 2])).unwrap();
        let sources = vec![one.path().display().to_string(), two.path().display().to_string()];
        let catalog = Catalog::build(&sources, &Catalog::default(), &Limits::default());
        assert_eq!(catalog.get("a").unwrap().source, sources[0]);
    }
}
