//! What the unit tests of the service's parts stand on: a folder of models scanned by a real
//! catalog, and the publication over it.

use std::path::Path;
use std::sync::Arc;

use super::catalogs::Catalogs;
use super::components::Representations;
use super::learnt::LearntByVersion;
use super::published::Publication;
use super::view::Views;
use crate::catalog::{Catalog, ScanOptions, Source};
use crate::decode::DecodeCache;
use crate::format::Limits;
use crate::storage::Readahead;
use crate::storage::local::LocalStorage;

/// A folder's models, listed, and what serves their files.
pub(super) struct Scanned {
    pub catalogs: Arc<Catalogs>,
    pub catalog: Arc<Catalog>,
    pub publication: Arc<Publication>,
    pub learnt: Arc<LearntByVersion>,
}

/// The catalogs of `dir` as the source `test`, reading `signature_file` as a model's
/// signature; not scanned yet.
pub(super) fn catalogs_of(dir: &Path, signature_file: Option<&str>) -> Arc<Catalogs> {
    let source = Source::new(Arc::new(LocalStorage::new("test", dir)));
    let options = ScanOptions {
        limits: Limits::default(),
        manifest_suffix_bytes: 64 * 1024,
        concurrent_reads: 2,
        check_shard_digests: true,
        signature_file: signature_file.map(str::to_owned),
        lineages: crate::catalog::LineageRules::default(),
    };
    Arc::new(Catalogs::new(vec![source], options))
}

/// `dir` scanned once as the source `test`, reading `signature_file` as a model's signature.
pub(super) async fn scanned(dir: &Path, signature_file: Option<&str>) -> Scanned {
    let catalogs = catalogs_of(dir, signature_file);
    let catalog = catalogs.rescan(async |_: &Catalog| {}).await.expect("the first scan swaps in its catalog");
    let learnt = Arc::new(LearntByVersion::default());
    let readahead =
        Readahead { chunk: 1 << 20, concurrency: 1, budget: Arc::new(tokio::sync::Semaphore::new(1 << 16)) };
    let representations = Arc::new(Representations::new(
        DecodeCache::new(1 << 20, 1),
        std::time::Duration::from_secs(1),
        readahead,
        crate::config::VerifyPolicy::FirstRead,
        Arc::clone(&learnt),
    ));
    let views = Views::new(Arc::clone(&representations), Arc::clone(&learnt), 1 << 30);
    let publication = Arc::new(Publication::new(views, representations));
    Scanned { catalogs, catalog, publication, learnt }
}

/// A safetensors file of one F32 tensor of `values`.
pub(super) fn one_tensor_safetensors(values: &[f32]) -> Vec<u8> {
    let header =
        format!(r#"{{"w":{{"dtype":"F32","shape":[{}],"data_offsets":[0,{}]}}}}"#, values.len(), values.len() * 4);
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    file
}
