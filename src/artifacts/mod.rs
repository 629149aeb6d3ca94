//! The one writable store: bundles of files a publisher uploads (an engine's compile cache),
//! kept under `[artifacts] dir`. Blobs are content-addressed (`blobs/sha256/HEX`): each is
//! written to a temporary file while it is hashed, and renamed into place only when it hashes
//! to the digest it was sent under. A bundle (`bundles/`) names its files, each a relative path
//! and a blob, with the publisher's signature; it is created once, and only while every blob it
//! names is held, so a reader finds it whole or not at all, and a second publish under the
//! same name (two nodes compiling at once) is refused rather than written over the first.
//! Blobs, bundle documents and uploads in progress stay under `max_bytes`: past it the least
//! recently read bundles go, with the blobs no other bundle names. The index is locked only for
//! what it holds in memory, never across disk I/O, so a lookup never waits on a disk; the steps
//! that change files take turns under a second lock, on the blocking pool. Every method but
//! [`ArtifactStore::put_blob`] and the lookups blocks on the disk: callers on the runtime run
//! them on the blocking pool.

mod bundle;
mod error;
mod index;
mod shared;
mod signed;
#[cfg(test)]
mod tests;
mod writer;

pub(crate) use bundle::{Bundle, BundleFile, check_files, check_name, check_path};
pub(crate) use error::ArtifactError;
pub(crate) use shared::{Bucket, SharedStore};
pub(crate) use signed::{sign_bundle, verify_bundle};
pub(crate) use writer::Priority;

use bundle::{StoredBundle, read_bundle_file};
use error::io_at;
use index::{HeldBlob, Index, Reservation};
use writer::{spawn_writer, sync_dir};

use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::{Stream, StreamExt as _};
use sha2::Digest as _;

use crate::digests::is_sha256_hex;

/// How long a blob no bundle names yet is kept from eviction: a publisher uploads its blobs,
/// then the bundle that names them.
const UNNAMED_BLOB_GRACE: Duration = Duration::from_secs(600);

/// Whether a blob was new to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BlobPut {
    Created,
    AlreadyHeld,
}

/// The store under one directory.
pub(crate) struct ArtifactStore {
    dir: PathBuf,
    max_bytes: u64,
    /// Held only while the index is read or changed in memory.
    index: Mutex<Index>,
    /// Held by whatever places or removes a file (a blob or bundle placed, evicted, or dropped
    /// as damaged), across its disk steps: they take turns, on the blocking pool, while lookups
    /// go on. Taken before `index`, never while holding it.
    changes: Mutex<()>,
}

/// A piece of an upload, as the request's task hands it to the writing thread.
enum Piece {
    Bytes(Bytes),
    End,
}

impl ArtifactStore {
    /// Opens (creating it when missing) the store at `dir`, its blobs bounded by `max_bytes`:
    /// temporaries a crash left are removed, and the index is rebuilt from the blobs and the
    /// bundles (a bundle file that does not parse is logged and removed).
    pub(crate) fn open(dir: &Path, max_bytes: u64) -> Result<ArtifactStore, ArtifactError> {
        for sub in ["blobs/sha256", "bundles", "tmp"] {
            let path = dir.join(sub);
            fs::create_dir_all(&path).map_err(io_at(&path))?;
        }
        if let Ok(disk) = rustix::fs::statvfs(dir) {
            let size = disk.f_blocks.saturating_mul(disk.f_frsize);
            if max_bytes > size {
                tracing::warn!(
                    dir = %dir.display(), max_bytes, disk_bytes = size,
                    "[artifacts] max_bytes is more than the store's disk holds: once the disk is full, publishes are refused (507)"
                );
            }
        }
        let tmp = dir.join("tmp");
        for entry in fs::read_dir(&tmp).map_err(io_at(&tmp))? {
            let path = entry.map_err(io_at(&tmp))?.path();
            fs::remove_file(&path).map_err(io_at(&path))?;
        }
        let mut index = Index::default();
        let blobs = dir.join("blobs/sha256");
        for entry in fs::read_dir(&blobs).map_err(io_at(&blobs))? {
            let entry = entry.map_err(io_at(&blobs))?;
            let meta = entry.metadata().map_err(io_at(&entry.path()))?;
            let Some(hex) = entry.file_name().to_str().filter(|n| is_sha256_hex(n)).map(str::to_owned) else {
                continue;
            };
            let written = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            index.bytes += meta.len();
            index.blobs.insert(hex, HeldBlob { len: meta.len(), named_by: 0, written });
        }
        let bundles = dir.join("bundles");
        for entry in fs::read_dir(&bundles).map_err(io_at(&bundles))? {
            let path = entry.map_err(io_at(&bundles))?.path();
            match read_bundle_file(&path) {
                Ok((name, bundle)) if bundle.files.iter().all(|f| index.blobs.contains_key(&f.sha256)) => {
                    // Gone since it was read: removed by another server sharing the directory.
                    let Ok(meta) = fs::metadata(&path) else { continue };
                    let last_read = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                    index.bytes += meta.len();
                    index.name(name, &bundle, meta.len(), last_read);
                }
                outcome => {
                    let why = outcome.err().map_or_else(|| "a blob it names is gone".to_owned(), |e| e.to_string());
                    tracing::warn!(path = %path.display(), reason = %why, "removing an artifact bundle that cannot be served");
                    fs::remove_file(&path).map_err(io_at(&path))?;
                }
            }
        }
        Ok(ArtifactStore { dir: dir.to_owned(), max_bytes, index: Mutex::new(index), changes: Mutex::new(()) })
    }

    fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The turn to place or remove files; blocks while another write takes its disk steps.
    fn changing(&self) -> std::sync::MutexGuard<'_, ()> {
        self.changes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts `len` more bytes when they fit under the bound as it stands.
    fn count_if_fits(&self, len: u64) -> bool {
        let mut index = self.index();
        let fits = index.bytes + len <= self.max_bytes;
        index.bytes += if fits { len } else { 0 };
        fits
    }

    /// Counts `len` more bytes being written, evicting to make room when the bound is reached;
    /// refused when it cannot be made.
    fn reserve(&self, len: u64) -> Result<(), ArtifactError> {
        if self.count_if_fits(len) {
            return Ok(());
        }
        let _changing = self.changing();
        self.make_room(len);
        if self.count_if_fits(len) {
            return Ok(());
        }
        Err(ArtifactError::Full { held: self.index().bytes, max: self.max_bytes })
    }

    fn blob_path(&self, hex: &str) -> PathBuf {
        self.dir.join("blobs/sha256").join(hex)
    }

    fn bundle_path(&self, name: &str) -> PathBuf {
        // Names hold `/`: the file is named by the name's digest, and holds the name.
        self.dir.join("bundles").join(format!("{}.json", hex::encode(sha2::Sha256::digest(name.as_bytes()))))
    }

    /// The bytes held in blobs and bundle documents, and being written.
    #[cfg(test)]
    pub(crate) fn held_bytes(&self) -> u64 {
        self.index().bytes
    }

    /// Stores the blob `body` under the digest `hex` it must hash to. The bytes are written on
    /// a thread of their own as they arrive and hashed, at [`WRITER_NICENESS`] for a publish
    /// (`Priority::Background`); nothing is kept unless they match, whole.
    pub(crate) async fn put_blob<S, E>(
        self: &Arc<Self>,
        hex: &str,
        mut body: S,
        priority: Priority,
    ) -> Result<BlobPut, ArtifactError>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        if !is_sha256_hex(hex) {
            return Err(ArtifactError::BadDigest(hex.to_owned()));
        }
        if self.index().blobs.contains_key(hex) {
            return Ok(BlobPut::AlreadyHeld);
        }
        let (pieces, received) = tokio::sync::mpsc::channel::<Piece>(4);
        let writer = {
            let (store, hex) = (Arc::clone(self), hex.to_owned());
            spawn_writer(priority, move || store.write_blob(&hex, received))?
        };
        let mut len = 0u64;
        let sent = loop {
            let piece = match body.next().await {
                None => Piece::End,
                Some(Err(e)) => break Err(ArtifactError::Cut(e.to_string())),
                Some(Ok(piece)) => {
                    len += piece.len() as u64;
                    if len > self.max_bytes {
                        break Err(ArtifactError::TooLarge { max: self.max_bytes });
                    }
                    Piece::Bytes(piece)
                }
            };
            let end = matches!(piece, Piece::End);
            if pieces.send(piece).await.is_err() || end {
                break Ok(());
            }
        };
        // Dropped without `End`, the writer removes what it wrote.
        drop(pieces);
        let written = writer.await.map_err(|e| ArtifactError::Cut(format!("the writing thread failed: {e}")))?;
        sent?;
        written
    }

    /// Writes the pieces `received` to a temporary file, counted against the bound and hashed;
    /// at `End`, a match is made durable and renamed into place.
    fn write_blob(
        &self,
        hex: &str,
        mut received: tokio::sync::mpsc::Receiver<Piece>,
    ) -> Result<BlobPut, ArtifactError> {
        let tmp = self.dir.join("tmp");
        let mut file = tempfile::NamedTempFile::new_in(&tmp).map_err(io_at(&tmp))?;
        let mut reservation = Reservation::new(self);
        let mut hasher = sha2::Sha256::new();
        loop {
            match received.blocking_recv() {
                Some(Piece::Bytes(piece)) => {
                    reservation.grow(piece.len() as u64)?;
                    file.write_all(&piece).map_err(io_at(file.path()))?;
                    hasher.update(&piece);
                }
                Some(Piece::End) => break,
                None => return Err(ArtifactError::Cut("the client stopped sending".into())),
            }
        }
        let actual = hex::encode(hasher.finalize());
        if actual != hex {
            return Err(ArtifactError::DigestMismatch { named: hex.to_owned(), actual });
        }
        file.as_file().sync_all().map_err(io_at(file.path()))?;
        let _changing = self.changing();
        if self.index().blobs.contains_key(hex) {
            return Ok(BlobPut::AlreadyHeld);
        }
        let path = self.blob_path(hex);
        file.persist(&path).map_err(|e| io_at(&path)(e.error))?;
        sync_dir(&path)?;
        let mut index = self.index();
        let len = reservation.used;
        index.blobs.insert(hex.to_owned(), HeldBlob { len, named_by: 0, written: SystemTime::now() });
        reservation.keep(&mut index);
        Ok(BlobPut::Created)
    }

    /// The file of blob `hex` and its length, when held.
    pub(crate) fn blob(&self, hex: &str) -> Option<(PathBuf, u64)> {
        let index = self.index();
        index.blobs.get(hex).map(|blob| (self.blob_path(hex), blob.len))
    }

    /// Blob `hex`'s bytes, mapped, once they hash to `hex` (read whole each time: a byte that
    /// rotted on disk changes no stamp); `None` when it is not held. A blob that no longer
    /// hashes to its name is dropped, counted and logged, and answered as one not held.
    pub(crate) fn checked_blob(&self, hex: &str) -> Result<Option<Bytes>, ArtifactError> {
        let Some((path, _)) = self.blob(hex) else { return Ok(None) };
        let bytes = match crate::storage::mapped::MappedFile::open(&path) {
            Ok(mapped) => Bytes::from_owner(mapped),
            // Evicted between the lookup and the open: as if it were not held.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(ArtifactError::Io { path, source }),
        };
        if hex::encode(sha2::Sha256::digest(&bytes)) == hex {
            return Ok(Some(bytes));
        }
        metrics::counter!(crate::telemetry::names::ARTIFACT_BLOBS_DAMAGED).increment(1);
        tracing::error!(blob = hex, path = %path.display(), "an artifact blob no longer hashes to its name (damaged on disk); it is dropped");
        let _changing = self.changing();
        self.drop_with_its_bundles(hex);
        Ok(None)
    }

    /// Publishes `bundle` under `name`, once: refused when the name is taken, a path would
    /// leave the bundle's directory, or a blob it names is not held with its size.
    pub(crate) fn put_bundle(&self, name: &str, bundle: &Bundle) -> Result<(), ArtifactError> {
        check_name(name)?;
        check_files(name, bundle)?;
        {
            let mut index = self.index();
            index.check_publishable(name, bundle)?;
            // Its blobs are about to be named: none is evicted as unnamed while it is published.
            let now = SystemTime::now();
            for file in &bundle.files {
                index.blobs.get_mut(&file.sha256).expect("checked held").written = now;
            }
        }
        let stored = serde_json::to_vec(&StoredBundle { name: name.to_owned(), bundle: bundle.clone() })
            .expect("a bundle serializes");
        let mut reservation = Reservation::new(self);
        reservation.grow(stored.len() as u64)?;
        let tmp = self.dir.join("tmp");
        let mut file = tempfile::NamedTempFile::new_in(&tmp).map_err(io_at(&tmp))?;
        file.write_all(&stored).and_then(|()| file.as_file().sync_all()).map_err(io_at(file.path()))?;
        let _changing = self.changing();
        // Again: a publish or an eviction may have come between.
        self.index().check_publishable(name, bundle)?;
        let path = self.bundle_path(name);
        // A hard link never replaces: of two servers sharing the directory, one wins.
        match fs::hard_link(file.path(), &path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Err(ArtifactError::Exists(name.to_owned())),
            Err(e) => return Err(io_at(&path)(e)),
        }
        sync_dir(&path)?;
        let mut index = self.index();
        index.name(name.to_owned(), bundle, reservation.used, SystemTime::now());
        reservation.keep(&mut index);
        Ok(())
    }

    /// The bundle published under `name`; reading it counts as a use, for eviction.
    pub(crate) fn bundle(&self, name: &str) -> Result<Bundle, ArtifactError> {
        let path = self.bundle_path(name);
        let mut index = self.index();
        let Some(held) = index.bundles.get_mut(name) else {
            return Err(ArtifactError::NoBundle(name.to_owned()));
        };
        held.last_read = SystemTime::now();
        drop(index);
        match read_bundle_file(&path) {
            Ok((_, bundle)) => Ok(bundle),
            // Evicted between the lookup and the read.
            Err(ArtifactError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                Err(ArtifactError::NoBundle(name.to_owned()))
            }
            Err(e) => Err(e),
        }
    }

    /// The names of the bundles held that `visible` allows, in order.
    pub(crate) fn bundle_names(&self, visible: impl Fn(&str) -> bool) -> Vec<String> {
        let index = self.index();
        let mut names: Vec<String> = index.bundles.keys().filter(|name| visible(name)).cloned().collect();
        names.sort();
        names
    }

    /// Makes room for `incoming` more bytes: the least recently read bundles go, with the
    /// blobs only they named, and blobs no bundle has named within the grace period. The caller
    /// holds the turn to change files ([`Self::changing`]).
    fn make_room(&self, incoming: u64) {
        let fits = || self.index().bytes + incoming <= self.max_bytes;
        let (stale, by_use) = {
            let index = self.index();
            let now = SystemTime::now();
            let stale: Vec<String> = index
                .blobs
                .iter()
                .filter(|(_, blob)| {
                    blob.named_by == 0 && now.duration_since(blob.written).unwrap_or_default() > UNNAMED_BLOB_GRACE
                })
                .map(|(hex, _)| hex.clone())
                .collect();
            let by_use: Vec<(SystemTime, String)> =
                index.bundles.iter().map(|(name, held)| (held.last_read, name.clone())).collect();
            (stale, by_use)
        };
        let mut by_use = by_use;
        by_use.sort_unstable();
        for hex in stale {
            if fits() {
                return;
            }
            self.remove_blob(&hex);
        }
        for (_, name) in by_use {
            if fits() {
                return;
            }
            if self.remove_bundle(&name) {
                tracing::info!(bundle = %name, "evicted an artifact bundle, least recently read");
            }
        }
    }

    /// Removes bundle `name`'s file, then its entry and the blobs no other bundle names; false
    /// when its file cannot be removed. The caller holds the turn to change files.
    fn remove_bundle(&self, name: &str) -> bool {
        let path = self.bundle_path(name);
        if let Err(e) = fs::remove_file(&path) {
            tracing::warn!(bundle = %name, error = %e, "cannot remove an artifact bundle");
            return false;
        }
        let orphans = self.index().forget_bundle(name);
        for hex in orphans {
            self.remove_blob(&hex);
        }
        true
    }

    /// Drops blob `hex`, damaged, with every bundle naming it (none can be restored whole now:
    /// a bucket has them again, or their names are free to publish again). The caller holds
    /// the turn to change files.
    fn drop_with_its_bundles(&self, hex: &str) {
        let naming: Vec<String> = {
            let index = self.index();
            let names =
                index.bundles.iter().filter(|(_, held)| held.blobs.binary_search_by(|h| h.as_str().cmp(hex)).is_ok());
            names.map(|(name, _)| name.clone()).collect()
        };
        for name in naming {
            if self.remove_bundle(&name) {
                tracing::warn!(bundle = %name, blob = hex, "dropped an artifact bundle naming a damaged blob");
            }
        }
        // Unless a bundle whose file could not be removed still names it.
        let unnamed = self.index().blobs.get(hex).is_some_and(|blob| blob.named_by == 0);
        if unnamed {
            self.remove_blob(hex);
        }
    }

    /// Removes blob `hex`'s file, then its entry; the caller holds the turn to change files.
    fn remove_blob(&self, hex: &str) {
        let path = self.blob_path(hex);
        match fs::remove_file(&path) {
            Ok(()) => {
                let mut index = self.index();
                let blob = index.blobs.remove(hex).expect("removed only when held");
                index.bytes -= blob.len;
            }
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "cannot evict an artifact blob"),
        }
    }
}
