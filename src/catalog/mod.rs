//! Which models exist and their parsed manifests. A catalog is built from a listing of every
//! source (local directories and S3 prefixes alike, through the `Storage` trait) and the
//! previous catalog: an object whose version (a file's identity, an S3 ETag) has not changed
//! keeps its parsed manifest, so it is read and parsed once; an object that fails validation
//! stays listed as broken with its reason, and never stops the others from serving. A source
//! that cannot be listed keeps the models it had, and is reported degraded until it answers
//! again. A v2 root's shards are found among the files beside it ([`shards`]); a data shard
//! (a v2 file with no manifest) is part of some root's model, never a model of its own. A
//! safetensors file is a model unless a `*.safetensors.index.json` beside it makes it a shard of
//! a checkpoint ([`checkpoints`]). A GGUF file is a model, and the parts of a split GGUF model
//! (`name-00001-of-00003.gguf` …) are one ([`gguf_splits`]). The other files listed belong to
//! the models of the nearest directory above them that holds a model file ([`companions`]).
//! One concern a file: the sources and their health ([`source`]), a model as its files say
//! ([`model`]), listing a source into models ([`scan`]), reading what a listed file holds
//! ([`read`]), which models one repository publishes together ([`repositories`]), and which
//! versions of a trainer's lineage are listed ([`lineages`]).

mod checkpoints;
mod companions;
mod gguf_splits;
mod ids;
mod lineages;
mod model;
mod read;
mod repositories;
mod scan;
mod shards;
mod signatures;
mod source;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

pub(crate) use companions::Companion;
pub(crate) use lineages::{GoneVersion, LineageRules, Versions};
pub(crate) use model::{Model, StoredFile};
pub(crate) use read::ScanOptions;
use read::{Parsed, ParsedFile};
use scan::{directory, list, version_of};
pub(crate) use signatures::SignedDirectory;
pub(crate) use source::Source;

use crate::format::FormatError;
use crate::storage::StorageError;

/// Why a model cannot be served.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum CatalogError {
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
    pub(crate) fn code(&self) -> &'static str {
        match self {
            CatalogError::Format(e) => e.code(),
            CatalogError::Storage(_) => "storage_error",
            CatalogError::DuplicateId { .. } => "duplicate_id",
            CatalogError::InShard { error, .. } => error.code(),
        }
    }

    /// Whether the failure belongs to the object's bytes (kept until the object changes),
    /// rather than to reading them (retried at the next rescan).
    pub(super) fn is_lasting(&self) -> bool {
        match self {
            CatalogError::InShard { error, .. } => error.is_lasting(),
            other => matches!(other, CatalogError::Format(_)),
        }
    }
}

/// An immutable snapshot of every source; the server swaps in a new one after each rescan.
#[derive(Debug, Default)]
pub(crate) struct Catalog {
    models: BTreeMap<String, Arc<Model>>,
    /// Sources that could not be listed in this scan, with the reason.
    pub unreadable_sources: Vec<(String, String)>,
    /// Sources that could not be listed and were read from the listing their disk cache kept.
    pub from_kept_listings: Vec<String>,
    /// Every listed file's manifest (data shards and broken files included) by source and
    /// key, so an unchanged file is read once.
    files: HashMap<(String, String), ParsedFile>,
    /// Whole-file digests of shards, computed once per file version.
    digests: shards::DigestMemo,
    /// The files beside each model that are not model files, by model id.
    companions: BTreeMap<String, Arc<[Companion]>>,
    /// The directory each signed model's signature file covers, by model id.
    signed: BTreeMap<String, Arc<SignedDirectory>>,
    /// The versions each lineage keeps and drops, by lineage (as the first source listing
    /// versions of it lists them).
    lineages: BTreeMap<String, Arc<Versions>>,
}

impl Catalog {
    /// Lists `sources` in order, reusing `previous`'s parse of every object whose version is
    /// unchanged. Blocking work (walking directories, reading local manifests) runs off the
    /// async runtime.
    pub(crate) async fn build(sources: &[Arc<Source>], previous: &Arc<Catalog>, options: &ScanOptions) -> Catalog {
        let mut catalog = Catalog {
            digests: std::sync::Mutex::new(previous.digests.lock().expect("never poisoned").clone()),
            ..Catalog::default()
        };
        for source in sources {
            let listed = list(source, previous, options, &catalog.digests).await;
            let models = match listed {
                Ok(listing) => {
                    source.report_success();
                    catalog.take(listing)
                }
                Err(e) => {
                    // Keep serving what was known: reads will say whether the objects answer.
                    source.report_failure(&e);
                    catalog.unreadable_sources.push((source.name.clone(), e.to_string()));
                    let kept = previous.files.iter().filter(|((name, _), _)| *name == source.name);
                    catalog.files.extend(kept.map(|(key, parsed)| (key.clone(), parsed.clone())));
                    let kept: Vec<Arc<Model>> =
                        previous.models().filter(|m| Arc::ptr_eq(&m.source, source)).cloned().collect();
                    for (lineage, versions) in previous.lineages.iter().filter(|(_, v)| v.source == source.name) {
                        catalog.lineages.entry(lineage.clone()).or_insert_with(|| Arc::clone(versions));
                    }
                    for model in &kept {
                        if let Some(files) = previous.companions.get(&model.id) {
                            catalog.companions.entry(model.id.clone()).or_insert_with(|| Arc::clone(files));
                        }
                        if let Some(dir) = previous.signed.get(&model.id) {
                            catalog.signed.entry(model.id.clone()).or_insert_with(|| Arc::clone(dir));
                        }
                    }
                    let from_disk = match source.cache() {
                        Some(cache) if kept.is_empty() => cache.kept_listing().await,
                        _ => None,
                    };
                    match from_disk {
                        // Nothing known yet (a start while the store is down): the listing the
                        // disk cache kept, whose manifests it holds.
                        Some(listed) => {
                            catalog.from_kept_listings.push(source.name.clone());
                            tracing::warn!(source = %source.name, objects = listed.len(), "serving the listing kept in the disk cache");
                            let listing = scan::models_of(source, listed, previous, options, &catalog.digests).await;
                            catalog.take(listing)
                        }
                        None => kept,
                    }
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

    /// What one source's listing adds: its files, companions, signed directories and
    /// lineages (each kept from the first source that has it); its models are returned.
    fn take(&mut self, (models, files, companions, signed, lineages): scan::Listing) -> Vec<Arc<Model>> {
        self.files.extend(files);
        for (id, files) in companions {
            self.companions.entry(id).or_insert(files);
        }
        for (id, dir) in signed {
            self.signed.entry(id).or_insert(dir);
        }
        for (lineage, versions) in lineages {
            self.lineages.entry(lineage).or_insert(versions);
        }
        models
    }

    pub(crate) fn get(&self, id: &str) -> Option<&Arc<Model>> {
        self.models.get(id)
    }

    /// Why model `id` is not listed, when it is a version of a lineage that its source lists
    /// but that is not kept (older than those kept, or not ready).
    pub(crate) fn gone_version(&self, id: &str) -> Option<GoneVersion> {
        lineages::gone(&self.lineages, id)
    }

    /// Whether model `id` is a kept version of a lineage (or a model in one's folder).
    pub(crate) fn is_kept_version(&self, id: &str) -> bool {
        lineages::version_of(&self.lineages, id).is_some_and(|(versions, v)| versions.kept.iter().any(|k| k == v))
    }

    /// The lineage model `id` is a version of, that version, and the rest of the id after it
    /// (empty, or `/weights` for a model deeper in the version's folder).
    pub(crate) fn lineage_version(&self, id: &str) -> Option<(Arc<Versions>, String, String)> {
        let (versions, version) = lineages::version_of(&self.lineages, id)?;
        let rest = &id[versions.lineage.len() + 1 + version.len()..];
        Some((Arc::clone(versions), version.to_owned(), rest.to_owned()))
    }

    /// What each lineage keeps and drops, by lineage.
    pub(crate) fn lineages(&self) -> impl Iterator<Item = &Arc<Versions>> {
        self.lineages.values()
    }

    /// Every model, ordered by id.
    pub(crate) fn models(&self) -> impl Iterator<Item = &Arc<Model>> {
        self.models.values()
    }

    /// The files beside model `id` that are not model files (none when it has none).
    pub(crate) fn companions(&self, id: &str) -> &[Companion] {
        self.companions.get(id).map_or(&[], |files| files)
    }

    /// The directory model `id`'s signature file covers, when it is signed (and signatures are
    /// read: [`ScanOptions::signature_file`]).
    pub(crate) fn signed_directory(&self, id: &str) -> Option<&Arc<SignedDirectory>> {
        self.signed.get(id)
    }
}

/// A source's models, the manifest of every model file it lists, and each model's companions.
#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::format::write::{ComponentInput, ObjectInput, WriteOptions, Writer};
    use crate::format::{DType, Limits};

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
            signature_file: None,
            lineages: LineageRules::default(),
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

    #[test]
    fn a_model_safetensors_is_its_directorys_model_unless_an_index_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("org/single")).unwrap();
        std::fs::create_dir_all(root.join("org/both")).unwrap();
        std::fs::write(root.join("model.safetensors"), st(&[("w", &[1])])).unwrap();
        std::fs::write(root.join("org/single/model.safetensors"), st(&[("w", &[1])])).unwrap();
        std::fs::write(root.join("org/single/config.json"), "{}").unwrap();
        std::fs::write(root.join("org/both/model.safetensors"), st(&[("w", &[1])])).unwrap();
        std::fs::write(root.join("org/both/model-00001-of-00001.safetensors"), st(&[("a", &[1])])).unwrap();
        let index = r#"{"weight_map":{"a":"model-00001-of-00001.safetensors"}}"#;
        std::fs::write(root.join("org/both/model.safetensors.index.json"), index).unwrap();
        let catalog = build(&local(&[root]), &Arc::default());
        let ids: Vec<&str> = catalog.models().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["model", "org/both", "org/both/model", "org/single"]);
        assert!(catalog.models().all(|m| m.state.is_ok()));
        let companions: Vec<&str> = catalog.companions("org/single").iter().map(|c| c.name.as_str()).collect();
        assert_eq!(companions, ["config.json"]);
    }

    #[test]
    fn a_model_zt_is_its_directorys_model_with_the_files_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("org/tiny/tokenizer")).unwrap();
        std::fs::write(root.join("org/tiny/model.zt"), zt(&[1, 2])).unwrap();
        std::fs::write(root.join("org/tiny/config.json"), "{}").unwrap();
        std::fs::write(root.join("org/tiny/tokenizer/vocab.txt"), "a").unwrap();
        std::fs::write(root.join("model.zt"), zt(&[3])).unwrap();
        let catalog = build(&local(&[root]), &Arc::default());
        let ids: Vec<&str> = catalog.models().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["model", "org/tiny"]);
        let tiny = catalog.get("org/tiny").unwrap();
        assert_eq!(tiny.files[0].name, "model.zt");
        let companions: Vec<&str> = catalog.companions("org/tiny").iter().map(|c| c.name.as_str()).collect();
        assert_eq!(companions, ["config.json", "tokenizer/vocab.txt"]);
    }
}
