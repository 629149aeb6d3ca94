//! The artifact store as replicas share it: the local store ([`ArtifactStore`]) in front of an
//! S3 prefix (`[artifacts] s3`) every replica writes through and reads from. A blob is in the
//! bucket before its upload is answered; a bundle is created in the bucket with a conditional
//! put (`If-None-Match: *`), so of replicas publishing one name at once exactly one wins, then
//! kept locally. A bundle or blob a replica lacks is fetched from the bucket, each blob checked
//! against its digest as the local store takes it, before it is served. Without a bucket every
//! call is the local store's. Eviction is local: the bucket keeps what its lifecycle keeps.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::{Stream, StreamExt as _, TryStreamExt as _};
use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt as _, PutMode, PutOptions, PutPayload};

use super::{ArtifactError, ArtifactStore, BlobPut, Bundle, Priority};

/// The bucket's prefix, and a client of it.
pub(crate) struct Bucket {
    pub(crate) client: Arc<dyn ObjectStore>,
    /// `s3://bucket/prefix`, as shown in errors.
    pub(crate) name: String,
    pub(crate) prefix: String,
}

/// The local store, and the bucket shared with other replicas when there is one.
pub(crate) struct SharedStore {
    pub(crate) local: Arc<ArtifactStore>,
    pub(crate) bucket: Option<Bucket>,
}

impl Bucket {
    fn key(&self, relative: &str) -> Key {
        Key::from(if self.prefix.is_empty() { relative.to_owned() } else { format!("{}/{relative}", self.prefix) })
    }

    fn blob_key(&self, hex: &str) -> Key {
        self.key(&format!("blobs/sha256/{hex}"))
    }

    fn bundle_key(&self, name: &str) -> Key {
        self.key(&format!("bundles/{name}.json"))
    }

    fn failed(&self, what: &str, error: impl std::fmt::Display) -> ArtifactError {
        ArtifactError::Bucket(format!("{what} in {}: {error}", self.name))
    }
}

impl SharedStore {
    /// Stores blob `hex` locally, then in the bucket unless it holds it already.
    pub(crate) async fn put_blob<S, E>(&self, hex: &str, body: S) -> Result<BlobPut, ArtifactError>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let put = self.local.put_blob(hex, body, Priority::Background).await?;
        if let Some(bucket) = &self.bucket {
            self.ensure_in_bucket(bucket, hex).await?;
        }
        Ok(put)
    }

    /// The local file of blob `hex` and its length, fetched from the bucket when only it holds it.
    pub(crate) async fn blob(&self, hex: &str) -> Result<Option<(PathBuf, u64)>, ArtifactError> {
        if let Some(held) = self.local.blob(hex) {
            return Ok(Some(held));
        }
        let Some(bucket) = &self.bucket else { return Ok(None) };
        match bucket.client.get(&bucket.blob_key(hex)).await {
            Ok(got) => {
                let stream = got.into_stream().map_err(|e| e.to_string());
                self.local.put_blob(hex, Box::pin(stream), Priority::Reader).await?;
                Ok(self.local.blob(hex))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(bucket.failed("reading a blob", e)),
        }
    }

    /// Blob `hex`'s bytes, checked against its name: from here, or fetched from the bucket
    /// when missing here or dropped here as damaged; `None` when neither holds it whole.
    pub(crate) async fn checked_blob(&self, hex: &str) -> Result<Option<bytes::Bytes>, ArtifactError> {
        for _ in 0..2 {
            if self.blob(hex).await?.is_none() {
                return Ok(None);
            }
            let (local, owned) = (Arc::clone(&self.local), hex.to_owned());
            if let Some(bytes) = blocking(move || local.checked_blob(&owned)).await? {
                return Ok(Some(bytes));
            }
            if self.bucket.is_none() {
                break;
            }
        }
        Ok(None)
    }

    /// Publishes `bundle` as `name` once among every replica: checked, its blobs held here
    /// (fetched from the bucket where another replica took them) and in the bucket (uploaded
    /// again where an earlier upload failed), created in the bucket (refused when it is
    /// there), then kept locally: the bucket never holds a bundle whose blob it lacks.
    pub(crate) async fn put_bundle(&self, name: &str, bundle: Bundle) -> Result<(), ArtifactError> {
        let Some(bucket) = &self.bucket else {
            let local = Arc::clone(&self.local);
            let name = name.to_owned();
            return blocking(move || local.put_bundle(&name, &bundle)).await;
        };
        super::check_name(name)?;
        super::check_files(name, &bundle)?;
        for file in &bundle.files {
            let held = self.blob(&file.sha256).await?;
            if held.is_none_or(|(_, len)| len != file.size) {
                return Err(ArtifactError::MissingBlob { name: name.to_owned(), digest: file.sha256.clone() });
            }
        }
        let mut digests: Vec<String> = bundle.files.iter().map(|file| file.sha256.clone()).collect();
        digests.sort_unstable();
        digests.dedup();
        let checks = digests.into_iter().map(|hex| async move { self.ensure_in_bucket(bucket, &hex).await });
        futures_util::stream::iter(checks).buffer_unordered(BUCKET_CHECKS).try_collect::<()>().await?;
        let json = serde_json::to_vec(&bundle).expect("a bundle serializes");
        let create = PutOptions { mode: PutMode::Create, ..Default::default() };
        match bucket.client.put_opts(&bucket.bundle_key(name), PutPayload::from(json), create).await {
            Ok(_) => {}
            Err(object_store::Error::AlreadyExists { .. }) => return Err(ArtifactError::Exists(name.to_owned())),
            Err(e) => return Err(bucket.failed("creating a bundle", e)),
        }
        self.keep_locally(name, bundle).await
    }

    /// Blob `hex`, held here, in the bucket too: uploaded when the bucket lacks it.
    async fn ensure_in_bucket(&self, bucket: &Bucket, hex: &str) -> Result<(), ArtifactError> {
        let key = bucket.blob_key(hex);
        match bucket.client.head(&key).await {
            Ok(_) => Ok(()),
            Err(object_store::Error::NotFound { .. }) => {
                let (path, _) = self
                    .local
                    .blob(hex)
                    .ok_or_else(|| ArtifactError::MissingBlob { name: String::new(), digest: hex.to_owned() })?;
                upload(bucket, &key, path).await
            }
            Err(e) => Err(bucket.failed("checking a blob", e)),
        }
    }

    async fn keep_locally(&self, name: &str, bundle: Bundle) -> Result<(), ArtifactError> {
        let (local, name) = (Arc::clone(&self.local), name.to_owned());
        match blocking(move || local.put_bundle(&name, &bundle)).await {
            Err(ArtifactError::Exists(_)) => Ok(()),
            other => other,
        }
    }

    /// The bundle published as `name`, here or (fetched, with its blobs) from the bucket.
    pub(crate) async fn bundle(&self, name: &str) -> Result<Bundle, ArtifactError> {
        let (local, owned) = (Arc::clone(&self.local), name.to_owned());
        let found = blocking(move || local.bundle(&owned)).await;
        let (Err(ArtifactError::NoBundle(_)), Some(bucket)) = (&found, &self.bucket) else {
            return found;
        };
        super::check_name(name)?;
        let bytes = match bucket.client.get(&bucket.bundle_key(name)).await {
            Ok(got) => got.bytes().await.map_err(|e| bucket.failed("reading a bundle", e))?,
            Err(object_store::Error::NotFound { .. }) => return found,
            Err(e) => return Err(bucket.failed("reading a bundle", e)),
        };
        let bundle: Bundle = serde_json::from_slice(&bytes)
            .map_err(|e| ArtifactError::BadBundle { name: name.to_owned(), reason: format!("in the bucket: {e}") })?;
        super::check_files(name, &bundle)?;
        for file in &bundle.files {
            if self.blob(&file.sha256).await?.is_none() {
                return Err(ArtifactError::MissingBlob { name: name.to_owned(), digest: file.sha256.clone() });
            }
        }
        self.keep_locally(name, bundle.clone()).await?;
        Ok(bundle)
    }

    /// The names of the bundles held here or in the bucket that `visible` allows, in order.
    pub(crate) async fn bundle_names(&self, visible: impl Fn(&str) -> bool) -> Result<Vec<String>, ArtifactError> {
        let mut names = self.local.bundle_names(&visible);
        if let Some(bucket) = &self.bucket {
            let root = bucket.key("bundles");
            let listed: Vec<_> =
                bucket.client.list(Some(&root)).try_collect().await.map_err(|e| bucket.failed("listing bundles", e))?;
            for object in listed {
                let relative = object.location.as_ref().strip_prefix(root.as_ref()).unwrap_or_default();
                let name = relative.trim_start_matches('/').strip_suffix(".json").unwrap_or_default();
                if super::check_name(name).is_ok() && visible(name) {
                    names.push(name.to_owned());
                }
            }
            names.sort();
            names.dedup();
        }
        Ok(names)
    }
}

/// Blobs of a bundle looked for in the bucket at once.
const BUCKET_CHECKS: usize = 16;

/// Uploads the local file at `path` to `key`, streamed in parts.
async fn upload(bucket: &Bucket, key: &Key, path: PathBuf) -> Result<(), ArtifactError> {
    let mut file = tokio::fs::File::open(&path).await.map_err(|source| ArtifactError::Io { path, source })?;
    let mut writer = object_store::buffered::BufWriter::new(Arc::clone(&bucket.client), key.clone());
    let copied = tokio::io::copy(&mut file, &mut writer).await;
    let closed = match copied {
        Ok(_) => tokio::io::AsyncWriteExt::shutdown(&mut writer).await,
        Err(e) => {
            let _ = writer.abort().await;
            Err(e)
        }
    };
    closed.map_err(|e| bucket.failed("uploading a blob", e))
}

/// Runs a local store call on the blocking pool: they wait on the disk.
pub(crate) async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> Result<T, ArtifactError> + Send + 'static,
) -> Result<T, ArtifactError> {
    tokio::task::spawn_blocking(call)
        .await
        .map_err(|e| ArtifactError::Failed(format!("an artifact store call failed: {e}")))?
}
