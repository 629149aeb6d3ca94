use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures_util::TryStreamExt as _;
use sha2::Digest as _;

use super::{DigestOf, DigestWaits, Hashing, StatedByModel};
use crate::catalog::Model;
use crate::config::HashAhead;
use crate::digests::FileDigests;
use crate::format::Manifest;
use crate::service::ServiceError;
use crate::service::fixture::{Scanned, one_tensor_safetensors, scanned};
use crate::service::published::PublishedFile;

const LONG: Duration = Duration::from_secs(60);

fn hashing_over(scanned: &Scanned, ahead: HashAhead) -> Arc<Hashing> {
    hashing_with_workers(scanned, ahead, 1)
}

fn hashing_with_workers(scanned: &Scanned, ahead: HashAhead, workers: usize) -> Arc<Hashing> {
    let config = crate::config::Digests { ahead, hash_concurrency: Some(workers), ..Default::default() };
    let waits = DigestWaits { file: LONG, listing: LONG, request_timeout: None };
    let digests = FileDigests::open(None).unwrap();
    let publication = Arc::clone(&scanned.publication);
    Arc::new(Hashing::new(&config, digests, publication, crate::config::Signing::default(), waits))
}

/// A folder with one model, `org/m`: a safetensors file and a config beside it.
fn one_model(dir: &Path) -> Vec<u8> {
    std::fs::create_dir_all(dir.join("org/m")).unwrap();
    let weights = one_tensor_safetensors(&[1.0, 2.0, 3.0]);
    std::fs::write(dir.join("org/m/model.safetensors"), &weights).unwrap();
    std::fs::write(dir.join("org/m/config.json"), b"{\"hidden_size\": 3}").unwrap();
    weights
}

fn the_model(scanned: &Scanned) -> (Arc<Model>, Arc<Manifest>) {
    let models: Vec<&Arc<Model>> = scanned.catalog.models().collect();
    assert_eq!(models.len(), 1, "one model listed");
    let manifest = models[0].state.as_ref().expect("the model reads").clone();
    (Arc::clone(models[0]), manifest)
}

fn file<'a>(files: &'a [PublishedFile], path: &str) -> &'a PublishedFile {
    files.iter().find(|f| f.path == path).unwrap_or_else(|| panic!("{path} not in {files:?}"))
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    sha2::Sha256::digest(bytes).into()
}

#[tokio::test]
async fn a_scan_hashes_every_file_and_layer_ahead_and_a_second_scan_queues_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let weights = one_model(dir.path());
    let scanned = scanned(dir.path(), None).await;
    let hashing = hashing_over(&scanned, HashAhead::All);
    hashing.schedule(&scanned.catalog, StatedByModel::new()).await;
    let (model, manifest) = the_model(&scanned);
    let files = scanned.publication.repository_files(&scanned.catalog, &model, &manifest);
    let asked: Vec<&PublishedFile> = files.iter().collect();
    let digests =
        hashing.published_sha256s(&scanned.catalog, &model, &manifest, &asked, DigestOf::File, LONG).await.unwrap();
    let expected: Vec<[u8; 32]> =
        files.iter().map(|f| sha256(&std::fs::read(dir.path().join("org/m").join(&f.path)).unwrap())).collect();
    assert_eq!(digests, expected);
    assert_eq!(digests[files.iter().position(|f| f.path == "model.safetensors").unwrap()], sha256(&weights));
    let progress = hashing.digest_progress(&model);
    assert_eq!((progress.files, progress.known_files), (2, 2));
    assert_eq!(progress.hashed_bytes, progress.bytes);

    // Each file's image layer is hashed ahead too, after every file's own digest.
    let of = DigestOf::ImageLayer;
    hashing.published_sha256s(&scanned.catalog, &model, &manifest, &asked, of, LONG).await.unwrap();

    hashing.schedule(&scanned.catalog, StatedByModel::new()).await;
    let counts = hashing.lock().counts();
    assert_eq!((counts.queued, counts.hashing, counts.failed), (0, 0, 0), "nothing is hashed twice");
}

#[tokio::test]
async fn a_digest_not_hashed_ahead_is_hashed_when_asked_and_a_short_wait_says_how_far() {
    let dir = tempfile::tempdir().unwrap();
    let weights = one_model(dir.path());
    let scanned = scanned(dir.path(), None).await;
    // No worker here: the ask waits its whole time, whatever the machine's speed.
    let stalled = hashing_with_workers(&scanned, HashAhead::None, 0);
    stalled.schedule(&scanned.catalog, StatedByModel::new()).await;
    let (model, manifest) = the_model(&scanned);
    let files = scanned.publication.repository_files(&scanned.catalog, &model, &manifest);
    let weights_file = file(&files, "model.safetensors");
    assert_eq!(stalled.known_sha256(&scanned.catalog, &model, &manifest, weights_file), None, "not hashed ahead");
    let short = Duration::from_millis(10);
    let refused = stalled.published_sha256(&scanned.catalog, &model, &manifest, weights_file, short).await.unwrap_err();
    match refused {
        ServiceError::DigestPending { hashed, total, .. } => {
            assert_eq!(hashed, 0);
            assert_eq!(total, files.iter().map(|f| f.size).sum::<u64>());
        }
        other => panic!("expected a pending digest, got {other:?}"),
    }

    let hashing = hashing_over(&scanned, HashAhead::None);
    hashing.schedule(&scanned.catalog, StatedByModel::new()).await;
    assert_eq!(hashing.lock().counts().queued, 0, "nothing is hashed ahead");
    let digest = hashing.published_sha256(&scanned.catalog, &model, &manifest, weights_file, LONG).await.unwrap();
    assert_eq!(digest, sha256(&weights));
}

#[tokio::test]
async fn a_stated_digest_is_listed_unread_and_the_first_whole_read_checks_it() {
    let dir = tempfile::tempdir().unwrap();
    let weights = one_model(dir.path());
    let wrong = [7u8; 32];
    std::fs::write(dir.path().join("org/m/SHA256SUMS"), format!("{}  model.safetensors\n", hex::encode(wrong)))
        .unwrap();
    let scanned = scanned(dir.path(), None).await;
    let hashing = hashing_over(&scanned, HashAhead::All);
    let stated = hashing.hand_down_statements(&scanned.catalog).await;
    assert!(stated.is_empty(), "a local source's fills are not checked: nothing to hand down");
    hashing.schedule(&scanned.catalog, stated).await;
    let (model, manifest) = the_model(&scanned);
    let files = scanned.publication.repository_files(&scanned.catalog, &model, &manifest);
    let weights_file = file(&files, "model.safetensors");
    assert_eq!(hashing.known_sha256(&scanned.catalog, &model, &manifest, weights_file), Some(wrong));

    let bytes = hashing.published_file_bytes(&scanned.catalog, &model, &manifest, weights_file).await.unwrap();
    let len = bytes.source.len();
    let part: Vec<u8> = bytes.source.open(0..4).map_ok(|p| p.to_vec()).try_concat().await.unwrap();
    assert_eq!(part, weights[..4], "a part is no whole read, and is not held");
    let whole = bytes.source.open(0..len).map_ok(|p| p.to_vec()).try_concat().await;
    assert!(whole.is_err(), "the mismatch ends the body with an error");
    let known = hashing.known_sha256(&scanned.catalog, &model, &manifest, weights_file);
    assert_eq!(known, Some(sha256(&weights)), "the computed digest replaces the stated one");
}
