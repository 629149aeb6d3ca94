//! Finding the files a local source lists (every regular file under its directory but hidden
//! ones: model files, and the files beside them such as `config.json`), each keyed by its path
//! relative to the source, `/`-separated. Symlinks are followed only while they stay inside the
//! source; anything that would leave it is skipped and reported. Each file's identity (device,
//! inode, size, times) is its version, written as a string ([`version_of`]) and checked again
//! against an open file ([`is_version`]).

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What identifies one version of a file: a rename or rewrite changes at least one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileIdentity {
    pub size: u64,
    pub mtime_ns: i128,
    /// The inode's change time, which no one can set back: a file rewritten in place with
    /// its size and modification time restored still changes it.
    pub ctime_ns: i128,
    pub inode: u64,
    pub device: u64,
}

impl FileIdentity {
    pub fn of(metadata: &fs::Metadata) -> FileIdentity {
        FileIdentity {
            size: metadata.len(),
            mtime_ns: i128::from(metadata.mtime()) * 1_000_000_000 + i128::from(metadata.mtime_nsec()),
            ctime_ns: i128::from(metadata.ctime()) * 1_000_000_000 + i128::from(metadata.ctime_nsec()),
            inode: metadata.ino(),
            device: metadata.dev(),
        }
    }
}

/// A file version as a string: its identity (device, inode, size, modification and change
/// times).
pub fn version_of(identity: &FileIdentity) -> String {
    let FileIdentity { device, inode, size, mtime_ns, ctime_ns } = identity;
    format!("{device:x}-{inode:x}-{size:x}-{mtime_ns:x}-{ctime_ns:x}")
}

/// The identity [`version_of`] wrote into `version`; `None` for a version it did not write.
fn identity_in(version: &str) -> Option<FileIdentity> {
    let mut fields = version.split('-').map(|field| u128::from_str_radix(field, 16).ok());
    let mut next = || fields.next().flatten();
    let (device, inode, size) =
        (u64::try_from(next()?).ok()?, u64::try_from(next()?).ok()?, u64::try_from(next()?).ok()?);
    // Times before 1970 are written as their two's complement.
    let (mtime_ns, ctime_ns) = (next()? as i128, next()? as i128);
    fields.next().is_none().then_some(FileIdentity { device, inode, size, mtime_ns, ctime_ns })
}

/// Whether the open `file` is still `version` (blocking: one `fstat`); a file written in
/// place since is not, whatever times were restored. A file replaced by a rename (or removed)
/// still is: the unlink changed its change time, and nothing can change its bytes through the
/// path any more.
pub fn is_version(file: &fs::File, version: &str) -> io::Result<bool> {
    let metadata = file.metadata()?;
    let now = FileIdentity::of(&metadata);
    Ok(identity_in(version).is_some_and(|listed| {
        now == listed || (metadata.nlink() == 0 && FileIdentity { ctime_ns: listed.ctime_ns, ..now } == listed)
    }))
}

/// A file found under a source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundFile {
    /// Its path relative to the source, `/`-separated.
    pub key: String,
    pub path: PathBuf,
    pub identity: FileIdentity,
}

/// Something under a source that was not listed, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub path: PathBuf,
    pub reason: String,
}

/// Walks `root` (iteratively: depth never reaches the stack) for regular files, leaving out
/// hidden ones and hidden directories (a name starting with `.`: caches, partial downloads).
pub fn scan_local(root: &Path) -> io::Result<(Vec<FoundFile>, Vec<Skipped>)> {
    let canonical_root = root.canonicalize()?;
    let mut found = Vec::new();
    let mut skipped = Vec::new();
    let mut pending = vec![canonical_root.clone()];
    while let Some(dir) = pending.pop() {
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) => {
                skipped.push(Skipped { path: dir, reason: format!("cannot list: {e}") });
                continue;
            }
        };
        for entry in entries {
            let Ok(entry) = entry else { continue };
            let path = entry.path();
            if entry.file_name().as_encoded_bytes().starts_with(b".") {
                continue;
            }
            let Ok(file_type) = entry.file_type() else { continue };
            // Resolve symlinks and keep only targets inside the source.
            let (target, metadata) = if file_type.is_symlink() {
                match path.canonicalize() {
                    Ok(target) if target.starts_with(&canonical_root) => match fs::metadata(&target) {
                        Ok(m) => (target, m),
                        Err(_) => continue,
                    },
                    Ok(_) => {
                        skipped.push(Skipped { path, reason: "symlink leads outside the source".into() });
                        continue;
                    }
                    Err(_) => {
                        skipped.push(Skipped { path, reason: "dangling symlink".into() });
                        continue;
                    }
                }
            } else {
                match entry.metadata() {
                    Ok(m) => (path.clone(), m),
                    Err(_) => continue,
                }
            };
            if metadata.is_dir() {
                // A symlinked directory is walked under its link's name only if it is not an
                // ancestor (which would loop).
                if file_type.is_symlink() && canonical_root.starts_with(&target) {
                    skipped.push(Skipped { path, reason: "symlink loops back to an ancestor".into() });
                } else if !file_type.is_symlink() {
                    pending.push(path);
                }
                continue;
            }
            if !metadata.is_file() {
                continue;
            }
            match relative_key(&canonical_root, &path) {
                Some(key) => found.push(FoundFile { key, path: target, identity: FileIdentity::of(&metadata) }),
                None => skipped.push(Skipped { path, reason: "path is not UTF-8".into() }),
            }
        }
    }
    found.sort_by(|a, b| a.key.cmp(&b.key));
    Ok((found, skipped))
}

/// `org/llama.zt` for `ROOT/org/llama.zt`.
fn relative_key(root: &Path, path: &Path) -> Option<String> {
    let relative = path.strip_prefix(root).ok()?;
    let parts: Option<Vec<&str>> = relative.components().map(|c| c.as_os_str().to_str()).collect();
    Some(parts?.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_names_the_identity_it_was_written_from() {
        let identity = FileIdentity { device: 0xfd01, inode: 42, size: 1 << 40, mtime_ns: -1_500, ctime_ns: 1 << 62 };
        assert_eq!(identity_in(&version_of(&identity)), Some(identity));
        for foreign in ["", "1-2-3-4", "1-2-3-4-5-6", "1-2-x-4-5", "\"etag\""] {
            assert_eq!(identity_in(foreign), None, "{foreign:?}");
        }
    }

    #[test]
    fn keys_are_relative_paths_of_visible_files_and_symlinks_stay_inside() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("models");
        fs::create_dir_all(root.join("org/sub")).unwrap();
        fs::write(root.join("top.zt"), b"x").unwrap();
        fs::write(root.join("org/sub/llama v1.zt"), b"x").unwrap();
        fs::write(root.join("org/readme.txt"), b"x").unwrap();
        fs::create_dir_all(root.join("org/.cache")).unwrap();
        fs::write(root.join("org/.cache/download.zt"), b"x").unwrap();
        fs::write(root.join("org/.hidden.zt"), b"x").unwrap();
        fs::write(root.join("org/st.safetensors"), b"x").unwrap();
        fs::write(root.join("org/model.safetensors.index.json"), b"x").unwrap();
        fs::write(dir.path().join("outside.zt"), b"x").unwrap();
        std::os::unix::fs::symlink(dir.path().join("outside.zt"), root.join("escape.zt")).unwrap();
        std::os::unix::fs::symlink(root.join("top.zt"), root.join("alias.zt")).unwrap();
        std::os::unix::fs::symlink(&root, root.join("org/loop")).unwrap();
        let (found, skipped) = scan_local(&root).unwrap();
        let keys: Vec<&str> = found.iter().map(|f| f.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "alias.zt",
                "org/model.safetensors.index.json",
                "org/readme.txt",
                "org/st.safetensors",
                "org/sub/llama v1.zt",
                "top.zt"
            ]
        );
        let reasons: Vec<&str> = skipped.iter().map(|s| s.reason.as_str()).collect();
        assert!(reasons.contains(&"symlink leads outside the source"), "{reasons:?}");
        assert!(reasons.contains(&"symlink loops back to an ancestor"), "{reasons:?}");
    }
}
