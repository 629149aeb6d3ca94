//! The file tools over local files: `inspect`, `verify`, `cat`, `convert` and `write-demo`,
//! one module each. Each takes paths and writers so tests drive them directly; `main.rs` only
//! parses arguments and sets exit codes.

mod cat;
mod convert;
mod demo;
mod inspect;
mod verify;

pub use cat::cat;
pub use convert::{Target, convert};
pub use demo::write_demo;
pub use inspect::inspect;
pub use verify::verify;

use std::path::Path;

use anyhow::Context;

use crate::format::{self, Limits, Manifest};
use crate::storage::mapped::MappedFile;

pub(crate) fn open(path: &Path, limits: &Limits) -> anyhow::Result<(MappedFile, Manifest)> {
    let file = MappedFile::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let manifest =
        format::parse_file(&file, limits).with_context(|| format!("{} is not a valid .zt file", path.display()))?;
    Ok((file, manifest))
}

/// A v2 root's shards, found beside it as the server finds them: at the positional name, held
/// to the table's size and (with `check_digests`) digest, or else any `.zt` in the root's
/// directory of the shard's size and digest. One entry per shard, in table order: the file, or
/// why none was found.
pub(crate) fn shards_beside(
    root: &Path,
    manifest: &Manifest,
    check_digests: bool,
) -> Vec<Result<(std::path::PathBuf, MappedFile), format::FormatError>> {
    let dir = root.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let root_name = root.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let siblings: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            let mut paths: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
            paths.sort();
            paths
        })
        .unwrap_or_default();
    manifest
        .shards
        .iter()
        .map(|shard| {
            let positional = dir.join(format::v2::positional_shard_name(&root_name, &shard.name));
            let others = siblings.iter().filter(|p| **p != positional && p.extension().is_some_and(|e| e == "zt"));
            let mut last = format::FormatError::ShardMissing { shard: shard.name.clone() };
            for path in std::iter::once(&positional).chain(others) {
                let Ok(file) = MappedFile::open(path) else { continue };
                let checked = if *path == positional && !check_digests {
                    format::verify::check_shard_size(shard, file.len() as u64)
                } else {
                    format::verify::check_shard(shard, &file)
                };
                match checked {
                    Ok(()) => return Ok((path.clone(), file)),
                    // What the positional file says is the reason, if nothing else matches.
                    Err(e) if *path == positional => last = e,
                    Err(_) => {}
                }
            }
            Err(last)
        })
        .collect()
}

/// Escapes control characters so hostile names cannot rewrite the terminal.
pub(crate) fn shown(name: &str) -> String {
    if name.chars().any(|c| c.is_control()) || name.is_empty() { format!("{name:?}") } else { name.to_owned() }
}
