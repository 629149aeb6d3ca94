//! What the service learns about each model version while it serves it, kept by the service
//! rather than the catalog (which holds only what the files say): the manifest rendered as
//! JSON, the safetensors view's plan, the content checks by object, each local file's block
//! checksums, and per component the digest verdict, the decoded bytes' SHA-256 and a seekable
//! part's seek table. Kept for as
//! long as the catalog lists that version; a version gone from it is forgotten at the rescan.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use crate::catalog::{Catalog, Model};
use crate::format::FormatError;
use crate::format::view::View;
use crate::storage::BlockSums;

/// A document rendered once per model version (the manifest as JSON) and its strong ETag.
#[derive(Debug, Clone)]
pub(crate) struct Rendered {
    pub body: bytes::Bytes,
    pub etag: String,
}

/// What the server has learnt about one component of one model version.
#[derive(Debug, Default)]
pub(super) struct ComponentFacts {
    /// The stored bytes' digest check, once made (under `verify = first-read`); concurrent
    /// first reads share one check.
    pub verdict: tokio::sync::OnceCell<Result<(), FormatError>>,
    /// SHA-256 of the decoded bytes, once a complete decode has computed it.
    pub decoded_sha256: Arc<OnceLock<[u8; 32]>>,
    /// A seekable part's seek table, read and checked once.
    pub seek_table: tokio::sync::OnceCell<Arc<crate::format::seekable::SeekTable>>,
}

/// What the server has learnt about one model version.
#[derive(Debug, Default)]
pub(super) struct Learnt {
    /// The manifest rendered as JSON once, not per request.
    pub manifest_json: OnceLock<Rendered>,
    /// The safetensors view, planned once.
    pub view: OnceLock<Arc<View>>,
    /// Results of the content checks (bool bytes, sparse structure) by object name.
    pub content_checks: Mutex<HashMap<String, Result<(), FormatError>>>,
    /// By object name and component role.
    facts: Mutex<HashMap<(String, String), Arc<ComponentFacts>>>,
    /// The signature's verdict, for the version of the signed directory it was reached for.
    pub signature: arc_swap::ArcSwapOption<super::verdict::SignatureVerdict>,
    /// The signature file read and checked once for a version of the signed directory, shared
    /// by every asker while the files' digests are still being computed.
    pub signed_statement: Mutex<Option<(String, Arc<super::verdict::StatementCheck>)>>,
    /// Each local file's block checksums (by file index), learnt as regions of it are served.
    block_sums: Mutex<HashMap<usize, Arc<BlockSums>>>,
}

impl Learnt {
    /// The block checksums of stored file `file` (of `len` bytes), none known at first.
    pub(super) fn block_sums(&self, file: usize, len: u64) -> Arc<BlockSums> {
        let mut sums = self.block_sums.lock().expect("never poisoned");
        Arc::clone(sums.entry(file).or_insert_with(|| Arc::new(BlockSums::new(len))))
    }

    /// The facts about component `role` of `object`, created empty on first use.
    pub(super) fn facts(&self, object: &str, role: &str) -> Arc<ComponentFacts> {
        let mut facts = self.facts.lock().expect("facts lock is never poisoned");
        Arc::clone(facts.entry((object.to_owned(), role.to_owned())).or_default())
    }
}

/// What has been learnt, by model id, then version (the current one, and any a request still
/// in flight from before a rescan holds). Looked up on every request, so a hit takes a read
/// lock and allocates nothing.
#[derive(Debug, Default)]
pub(super) struct LearntByVersion(RwLock<HashMap<String, Versions>>);

/// One model's learnt state by version.
type Versions = Vec<(String, Arc<Learnt>)>;

impl LearntByVersion {
    /// What has been learnt about `model`'s version, empty at first.
    pub(super) fn of(&self, model: &Model) -> Arc<Learnt> {
        let found = |versions: &[(String, Arc<Learnt>)]| {
            versions.iter().find(|(version, _)| *version == model.version).map(|(_, learnt)| Arc::clone(learnt))
        };
        if let Some(learnt) = self.0.read().expect("never poisoned").get(&model.id).and_then(|v| found(v)) {
            return learnt;
        }
        let mut by_id = self.0.write().expect("never poisoned");
        let versions = by_id.entry(model.id.clone()).or_default();
        found(versions).unwrap_or_else(|| {
            let learnt = Arc::new(Learnt::default());
            versions.push((model.version.clone(), Arc::clone(&learnt)));
            learnt
        })
    }

    /// Forgets every version `catalog` no longer lists.
    pub(super) fn retain_listed(&self, catalog: &Catalog) {
        let mut by_id = self.0.write().expect("never poisoned");
        by_id.retain(|id, versions| {
            let listed = catalog.get(id).map(|m| &m.version);
            versions.retain(|(version, _)| listed == Some(version));
            !versions.is_empty()
        });
    }
}
