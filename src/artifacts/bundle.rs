//! What a bundle is and what it may hold: the files a publisher names (relative paths that stay
//! inside the bundle's directory, each with its digest), the limits on names, paths and file
//! counts, and the document a bundle is kept as on disk.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::error::{ArtifactError, io_at};
use crate::digests::is_sha256_hex;

/// The most files one bundle may name (a compile cache holds hundreds to thousands).
pub(crate) const MAX_BUNDLE_FILES: usize = 100_000;

/// The longest bundle name, and the longest path of a file in a bundle, in bytes.
const MAX_NAME_BYTES: usize = 512;
const MAX_PATH_BYTES: usize = 4096;

/// What a publisher uploads under a name: the files, and its signature over them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Bundle {
    pub files: Vec<BundleFile>,
    /// The publisher's OpenSSF model signature (the Sigstore bundle) over the files, as its
    /// publisher wrote it; absent when the bundle is unsigned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<serde_json::Value>,
}

/// One file of a bundle: where it goes below the bundle's directory, and its blob.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BundleFile {
    pub path: String,
    pub sha256: String,
    pub size: u64,
}

/// A bundle file: the name it was published under, and the bundle.
#[derive(Serialize, Deserialize)]
pub(super) struct StoredBundle {
    pub(super) name: String,
    pub(super) bundle: Bundle,
}

pub(super) fn read_bundle_file(path: &Path) -> Result<(String, Bundle), ArtifactError> {
    let bytes = fs::read(path).map_err(io_at(path))?;
    let stored: StoredBundle = serde_json::from_slice(&bytes)
        .map_err(|e| ArtifactError::BadBundle { name: path.display().to_string(), reason: e.to_string() })?;
    check_name(&stored.name)?;
    check_files(&stored.name, &stored.bundle)?;
    Ok((stored.name, stored.bundle))
}

/// A bundle name: `/`-separated segments of `A-Z a-z 0-9 . _ -`, none `.` or `..`.
pub(crate) fn check_name(name: &str) -> Result<(), ArtifactError> {
    let bad = |reason| Err(ArtifactError::BadName { name: name.to_owned(), reason });
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return bad("a name is 1 to 512 bytes");
    }
    for segment in name.split('/') {
        if segment.is_empty() || segment == "." || segment == ".." {
            return bad("a segment is empty, `.` or `..`");
        }
        if !segment.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
            return bad("a segment holds a character other than A-Z a-z 0-9 . _ -");
        }
    }
    Ok(())
}

/// A bundle's files: relative paths that stay inside its directory, each once, each with a
/// digest.
pub(crate) fn check_files(name: &str, bundle: &Bundle) -> Result<(), ArtifactError> {
    let bad = |reason: String| Err(ArtifactError::BadBundle { name: name.to_owned(), reason });
    if bundle.files.is_empty() || bundle.files.len() > MAX_BUNDLE_FILES {
        return bad(format!("a bundle names 1 to {MAX_BUNDLE_FILES} files"));
    }
    let mut seen = BTreeMap::new();
    for file in &bundle.files {
        if let Err(reason) = check_path(&file.path) {
            return bad(format!("path {:?} {reason}", file.path));
        }
        if !is_sha256_hex(&file.sha256) {
            return bad(format!("{:?} of {:?} is not a SHA-256 digest", file.sha256, file.path));
        }
        if seen.insert(file.path.as_str(), ()).is_some() {
            return bad(format!("path {:?} is named twice", file.path));
        }
    }
    Ok(())
}

/// A path below a bundle's directory: relative, `/`-separated, no segment empty, `.` or `..`.
pub(crate) fn check_path(path: &str) -> Result<(), &'static str> {
    if path.is_empty() || path.len() > MAX_PATH_BYTES {
        return Err("is not 1 to 4096 bytes");
    }
    if path.contains(['\0', '\\']) {
        return Err("holds a NUL or a backslash");
    }
    if path.split('/').any(|segment| segment.is_empty() || segment == "." || segment == "..") {
        return Err("leaves its directory, or has an empty segment");
    }
    Ok(())
}
