//! One suite every storage backend passes: a local directory, an S3 bucket prefix served by a
//! real S3-protocol server (moto) on 127.0.0.1, that prefix read through the node's disk
//! cache, and a Hub repository served by another ztserve's `/hf`.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use futures_util::TryStreamExt as _;
use object_store::path::Path as StorePath;
use object_store::{ObjectStoreExt as _, PutPayload};
use ztserve::storage::hub::{HubOptions, HubStorage};
use ztserve::storage::local::LocalStorage;
use ztserve::storage::s3::S3Storage;
use ztserve::storage::{ByteRange, ObjectVersion, Payload, ReadIntent, Storage, StorageError};

/// Where the suite puts and replaces objects, for each backend.
trait Fixture {
    fn storage(&self) -> &dyn Storage;
    async fn put(&self, key: &str, bytes: &[u8]);
    async fn remove(&self, key: &str);
    /// Whether a version already read stays readable after the object is replaced or removed
    /// (a disk cache keeps the bytes of each version it read, and serves exactly those).
    fn keeps_versions_read(&self) -> bool {
        false
    }
    /// The backend's key for the suite's `key`.
    fn key(&self, key: &str) -> String {
        key.to_owned()
    }
    /// Keys the backend lists besides the suite's, with their sizes.
    fn resident(&self) -> Vec<(String, u64)> {
        Vec::new()
    }
    /// Whether a read names the commit the version was listed at, which a removal replaces
    /// as any change does: a removed object's version then reads as changed, not missing.
    fn reads_at_commits(&self) -> bool {
        false
    }
}

struct Local {
    dir: tempfile::TempDir,
    storage: LocalStorage,
}

impl Fixture for Local {
    fn storage(&self) -> &dyn Storage {
        &self.storage
    }
    async fn put(&self, key: &str, bytes: &[u8]) {
        let path = self.dir.path().join(key);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        // Replace by rename, as deployments do; a new inode is a new version.
        let temporary = path.with_extension("tmp");
        std::fs::write(&temporary, bytes).unwrap();
        std::fs::rename(&temporary, &path).unwrap();
    }
    async fn remove(&self, key: &str) {
        std::fs::remove_file(self.dir.path().join(key)).unwrap();
    }
}

struct S3 {
    _server: common::S3Server,
    client: object_store::aws::AmazonS3,
    prefix: String,
    storage: S3Storage,
}

impl Fixture for S3 {
    fn storage(&self) -> &dyn Storage {
        &self.storage
    }
    async fn put(&self, key: &str, bytes: &[u8]) {
        let location = StorePath::from(format!("{}/{key}", self.prefix));
        self.client.put(&location, PutPayload::from(bytes.to_vec())).await.unwrap();
    }
    async fn remove(&self, key: &str) {
        self.client.delete(&StorePath::from(format!("{}/{key}", self.prefix))).await.unwrap();
    }
}

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

async fn collect(
    storage: &dyn Storage,
    key: &str,
    range: ByteRange,
    version: &str,
) -> Result<(u64, Vec<u8>), StorageError> {
    collect_for(storage, key, range, version, ReadIntent::Serve).await
}

async fn collect_for(
    storage: &dyn Storage,
    key: &str,
    range: ByteRange,
    version: &str,
    intent: ReadIntent,
) -> Result<(u64, Vec<u8>), StorageError> {
    let (size, _, bytes) = storage.read(key, range, version, intent).await?.collect(storage.name()).await?;
    Ok((size, bytes))
}

async fn suite(fixture: &impl Fixture) {
    let big = bytes(3 << 20, 7);
    fixture.put("a.bin", b"first version").await;
    fixture.put("org/big.bin", &big).await;
    fixture.put("org/notes.txt", b"not a model").await;
    fixture.put("org/.cache/partial.bin", b"hidden").await;
    let storage = fixture.storage();
    let (a_key, big_key) = (fixture.key("a.bin"), fixture.key("org/big.bin"));

    // Listing: every visible file below the root (model files and the files beside them; no
    // hidden path), relative keys, sizes, in key order.
    let listed = storage.list().await.unwrap();
    let keys: Vec<(String, u64)> = listed.iter().map(|l| (l.key.clone(), l.size)).collect();
    let mut expected = fixture.resident();
    expected.extend([("a.bin", 13), ("org/big.bin", 3 << 20), ("org/notes.txt", 11)].map(|(k, n)| (fixture.key(k), n)));
    expected.sort();
    assert_eq!(keys, expected, "{}", storage.name());
    let version_of = |key: &str| listed.iter().find(|l| l.key == key).unwrap().version.clone();
    let (a, big_version) = (version_of(&a_key), version_of(&big_key));

    // Ranges: bounded, suffix, suffix longer than the object; large reads arrive whole.
    assert_eq!(collect(storage, &a_key, ByteRange::Bounded(6..13), &a).await.unwrap(), (13, b"version".to_vec()));
    assert_eq!(collect(storage, &a_key, ByteRange::Suffix(7), &a).await.unwrap(), (13, b"version".to_vec()));
    assert_eq!(
        collect(storage, &a_key, ByteRange::Suffix(64 << 10), &a).await.unwrap(),
        (13, b"first version".to_vec())
    );
    let middle = (1 << 20) + 3..(3 << 20) - 5;
    let (_, got) = collect(storage, &big_key, ByteRange::Bounded(middle.clone()), &big_version).await.unwrap();
    assert!(got == big[middle.start as usize..middle.end as usize], "{}: large range differs", storage.name());
    // A read for parsing answers the same bytes as one for serving, however it is had.
    let parsed = collect_for(storage, &big_key, ByteRange::Suffix(100), &big_version, ReadIntent::Parse).await;
    assert_eq!(parsed.unwrap(), (3 << 20, big[(3 << 20) - 100..].to_vec()), "{}", storage.name());

    // A replaced object is a new version: reads of the old one fail, never mix.
    fixture.put("a.bin", b"second version!").await;
    let stale = collect(storage, &a_key, ByteRange::Bounded(0..5), &a).await;
    let kept = fixture.keeps_versions_read() && stale == Ok((13, b"first".to_vec()));
    assert!(matches!(stale, Err(StorageError::Changed { .. })) || kept, "{}: {stale:?}", storage.name());
    if fixture.keeps_versions_read() {
        // Not read before, so not kept: the source's answer.
        let unread = collect(storage, &big_key, ByteRange::Bounded(0..5), "another version").await;
        assert!(unread.is_err(), "{}: {unread:?}", storage.name());
    }
    let fresh = storage.list().await.unwrap().into_iter().find(|l| l.key == a_key).unwrap();
    assert_ne!(fresh.version, a);
    assert_eq!(
        collect(storage, &a_key, ByteRange::Suffix(8), &fresh.version).await.unwrap(),
        (15, b"version!".to_vec())
    );

    // A removed object is missing (or, read at a commit the removal replaced, changed).
    fixture.remove("a.bin").await;
    let missing = collect(storage, &a_key, ByteRange::Bounded(0..1), &fresh.version).await;
    let kept = fixture.keeps_versions_read() && missing == Ok((15, b"s".to_vec()));
    let changed = fixture.reads_at_commits() && matches!(missing, Err(StorageError::Changed { .. }));
    assert!(
        matches!(missing, Err(StorageError::NotFound { .. })) || kept || changed,
        "{}: {missing:?}",
        storage.name()
    );
}

#[tokio::test]
async fn a_local_directory_passes_the_storage_suite() {
    let dir = tempfile::tempdir().unwrap();
    let storage = LocalStorage::new(&dir.path().display().to_string(), dir.path());
    suite(&Local { dir, storage }).await;
}

#[tokio::test]
async fn local_reads_are_file_regions_of_exactly_the_version_listed() {
    let dir = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(LocalStorage::new("local", dir.path()));
    std::fs::write(dir.path().join("m.zt"), b"first version").unwrap();
    let listed = storage.list().await.unwrap().remove(0);
    let object =
        ObjectVersion { storage: Arc::clone(&storage), key: listed.key, version: listed.version, size: listed.size };
    let read = storage.read(&object.key, ByteRange::Bounded(6..13), &object.version, ReadIntent::Serve).await.unwrap();
    assert!(matches!(read.payload, Payload::File(_)), "a local read is a file region");
    let pieces: Vec<bytes::Bytes> = read.into_stream().try_collect().await.unwrap();
    assert_eq!(pieces.concat(), b"version", "read with pread");
    let mapping = object.mapping().await.unwrap().expect("a local file is mapped");
    assert_eq!(&mapping[..], b"first version");
    // Replaced under the same name: the old version is never mapped as if it were the new one.
    std::fs::write(dir.path().join("m.tmp"), b"other version").unwrap();
    std::fs::rename(dir.path().join("m.tmp"), dir.path().join("m.zt")).unwrap();
    assert!(matches!(object.mapping().await, Err(StorageError::Changed { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_prefix_passes_the_storage_suite() {
    let server = common::start_s3();
    server.create_bucket("models");
    let client = server.client("models");
    // Objects outside the prefix are not listed.
    client.put(&StorePath::from("other/x.zt"), PutPayload::from_static(b"elsewhere")).await.unwrap();
    let storage = S3Storage::new("s3://models/prod", "models", "prod", &server.options()).unwrap();
    suite(&S3 { client, prefix: "prod".into(), storage, _server: server }).await;
}

/// An S3 prefix read through the node's disk cache, in blocks small enough that the suite's
/// large object spans many.
struct CachedS3 {
    s3: S3,
    storage: ztserve::storage::cache::CachedStorage,
    _dir: tempfile::TempDir,
}

impl Fixture for CachedS3 {
    fn storage(&self) -> &dyn Storage {
        &self.storage
    }
    async fn put(&self, key: &str, bytes: &[u8]) {
        self.s3.put(key, bytes).await;
    }
    async fn remove(&self, key: &str) {
        self.s3.remove(key).await;
    }
    fn keeps_versions_read(&self) -> bool {
        true
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_prefix_read_through_the_disk_cache_passes_the_storage_suite() {
    let server = common::start_s3();
    server.create_bucket("models");
    let client = server.client("models");
    let remote = Arc::new(S3Storage::new("s3://models/prod", "models", "prod", &server.options()).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let cache = ztserve::storage::cache::DiskCache::open(dir.path(), 64 << 20, 256 << 10).unwrap();
    let storage = ztserve::storage::cache::CachedStorage::new(remote, cache);
    let s3 = S3 {
        client,
        prefix: "prod".into(),
        storage: S3Storage::new("s3://models/prod", "models", "prod", &server.options()).unwrap(),
        _server: server,
    };
    suite(&CachedS3 { s3, storage, _dir: dir }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_store_fails_promptly_as_unavailable_and_a_missing_bucket_is_reported() {
    let server = common::start_s3();
    let options = ztserve::storage::s3::S3Options { retries: 1, ..server.options() };
    let missing_bucket = S3Storage::new("s3://nobucket", "nobucket", "", &options).unwrap();
    let listed = tokio::time::timeout(Duration::from_secs(30), missing_bucket.list()).await.expect("no hang");
    assert!(matches!(listed, Err(StorageError::Refused { .. })), "{listed:?}");
    drop(server);
    let gone = S3Storage::new("s3://models", "models", "", &options).unwrap();
    let started = std::time::Instant::now();
    let read = tokio::time::timeout(
        Duration::from_secs(30),
        gone.read("a.zt", ByteRange::Bounded(0..1), "\"x\"", ReadIntent::Serve),
    )
    .await
    .expect("no hang");
    assert!(matches!(read, Err(StorageError::Unavailable { .. })), "{:?}", read.map(|r| r.size));
    assert!(started.elapsed() < Duration::from_secs(15), "gave up after {:?}", started.elapsed());
}

/// A Hub repository served by another ztserve's `/hf` over a directory: the suite's files sit
/// beside the repository's model (`org/repo/model.safetensors`), so its tree lists them, and
/// the origin rescans after each change (as it would at its next interval).
struct Hub {
    dir: tempfile::TempDir,
    origin: Arc<ztserve::server::Server>,
    model_len: u64,
    storage: HubStorage,
}

impl Hub {
    async fn start() -> Hub {
        let dir = tempfile::tempdir().unwrap();
        let model = common::one_tensor_safetensors(&bytes(100, 1));
        std::fs::create_dir_all(dir.path().join("org/repo")).unwrap();
        std::fs::write(dir.path().join("org/repo/model.safetensors"), &model).unwrap();
        let config = ztserve::config::Config::serving(vec![ztserve::config::SourceSpec::local(dir.path())]);
        let (address, origin) = common::serve(config).await;
        let options = HubOptions {
            endpoint: format!("http://{address}/hf"),
            token: None,
            connect_timeout: Duration::from_secs(5),
            read_timeout: Duration::from_secs(30),
            retries: 1,
            ca_file: None,
        };
        let storage = HubStorage::new("hf://org/repo", "org/repo", None, &options).unwrap();
        Hub { dir, origin, model_len: model.len() as u64, storage }
    }
}

impl Fixture for Hub {
    fn storage(&self) -> &dyn Storage {
        &self.storage
    }
    async fn put(&self, key: &str, bytes: &[u8]) {
        let path = self.dir.path().join("org/repo").join(key);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let temporary = path.with_extension("tmp");
        std::fs::write(&temporary, bytes).unwrap();
        std::fs::rename(&temporary, &path).unwrap();
        self.origin.rescan().await;
    }
    async fn remove(&self, key: &str) {
        std::fs::remove_file(self.dir.path().join("org/repo").join(key)).unwrap();
        self.origin.rescan().await;
    }
    fn key(&self, key: &str) -> String {
        format!("org/repo/{key}")
    }
    fn resident(&self) -> Vec<(String, u64)> {
        vec![(self.key("model.safetensors"), self.model_len)]
    }
    fn reads_at_commits(&self) -> bool {
        true
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_repository_passes_the_storage_suite() {
    suite(&Hub::start().await).await;
}
