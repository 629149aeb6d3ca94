//! Local directories as a [`super::Storage`]: listed by walking them, read as regions of files
//! mapped whole (`region.rs`, over `mapped.rs`).

use std::io;
use std::sync::Arc;

use super::mapped::MappedFile;
use super::scan::{FileIdentity, version_of};

/// A local directory as a [`super::Storage`]: listed by walking it, read as regions of
/// files mapped whole ([`super::FileRegion`]), each mapping checked against the version
/// listed through the descriptor it was made from.
#[derive(Debug)]
pub struct LocalStorage {
    name: String,
    root: std::path::PathBuf,
}

impl LocalStorage {
    /// The source `name` over the directory `root`.
    pub fn new(name: &str, root: impl Into<std::path::PathBuf>) -> LocalStorage {
        LocalStorage { name: name.to_owned(), root: root.into() }
    }

    fn unavailable(&self, e: impl std::fmt::Display) -> super::StorageError {
        super::StorageError::Unavailable { source_name: self.name.clone(), message: e.to_string() }
    }
}

impl super::Storage for LocalStorage {
    fn name(&self) -> &str {
        &self.name
    }

    fn backend(&self) -> &'static str {
        "local"
    }

    /// The version without its device: a container's overlay is a new device at every start,
    /// while the inode, size and times of an image's file stay what they were.
    fn content(&self, _key: &str, version: &str) -> super::Content {
        let version = version.split_once('-').map_or(version, |(_device, rest)| rest);
        super::Content { version: version.to_owned(), sha256: None }
    }

    fn list(&self) -> futures_util::future::BoxFuture<'_, Result<Vec<super::Listed>, super::StorageError>> {
        use futures_util::FutureExt as _;
        let root = self.root.clone();
        async move {
            let (found, _) = tokio::task::spawn_blocking(move || super::scan::scan_local(&root))
                .await
                .map_err(|e| self.unavailable(e))?
                .map_err(|e| self.unavailable(e))?;
            let mut listed: Vec<super::Listed> = found
                .into_iter()
                .map(|f| super::Listed { key: f.key, size: f.identity.size, version: version_of(&f.identity) })
                .collect();
            listed.sort_by(|a, b| a.key.cmp(&b.key));
            Ok(listed)
        }
        .boxed()
    }

    fn maps_files(&self) -> bool {
        true
    }

    fn read(
        &self,
        key: &str,
        range: super::ByteRange,
        version: &str,
        _intent: super::ReadIntent,
    ) -> futures_util::future::BoxFuture<'_, Result<super::Read, super::StorageError>> {
        use futures_util::FutureExt as _;
        let (key, version) = (key.to_owned(), version.to_owned());
        let path = self.root.join(&key);
        let name = self.name.clone();
        async move {
            // Mapped, then compared with the version listed through the mapping's own
            // descriptor, so the bytes are exactly that version's even if the path was
            // replaced meanwhile.
            let opened = tokio::task::spawn_blocking(move || match MappedFile::open(&path) {
                Ok(mapping) => {
                    let identity = FileIdentity::of(&mapping.file().metadata()?);
                    Ok(Some((version_of(&identity) == version, identity.size, mapping)))
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e),
            })
            .await
            .map_err(|e| self.unavailable(e))?;
            let (mapping, size) = match opened {
                Ok(None) => return Err(super::StorageError::NotFound { source_name: name, key }),
                Ok(Some((false, _, _))) => return Err(super::StorageError::Changed { source_name: name, key }),
                Ok(Some((true, size, mapping))) => (Arc::new(mapping), size),
                Err(e) => {
                    return Err(super::StorageError::Unreadable { source_name: name, key, message: e.to_string() });
                }
            };
            let span = match range {
                super::ByteRange::Bounded(r) if r.end <= size && r.start <= r.end => r,
                super::ByteRange::Bounded(r) => {
                    return Err(super::StorageError::OutOfRange { source_name: name, start: r.start, end: r.end });
                }
                super::ByteRange::Suffix(n) => size.saturating_sub(n)..size,
            };
            let region = super::region::FileRegion::new(mapping, span.clone(), &name, &key);
            Ok(super::Read { size, range: span, payload: super::Payload::File(region) })
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_files_content_is_named_without_its_device_which_a_remount_changes() {
        use crate::storage::Storage as _;
        let storage = LocalStorage::new("src", std::path::Path::new("/nowhere"));
        let identity = |device| FileIdentity { device, inode: 7, size: 9, mtime_ns: 11, ctime_ns: 13 };
        let (here, remounted) = (version_of(&identity(1)), version_of(&identity(2)));
        assert_ne!(here, remounted);
        assert_eq!(storage.content("k", &here), storage.content("k", &remounted));
        assert_eq!(storage.content("k", &here).version, "7-9-b-d");
    }
}
