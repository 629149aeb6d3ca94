//! The file tools over local files: `inspect`, `verify` (a file's rules and digests; a
//! directory's signature), `cat`, `convert`, `digest` and `write-demo`, one module each; and
//! `artifacts`, a directory published to a server's artifact store and restored from it. Each
//! takes paths and writers so tests drive them directly; `main.rs` only parses arguments and
//! sets exit codes.

pub mod artifacts;
mod cat;
mod convert;
mod demo;
pub mod digest;
mod inspect;
mod signature;
mod verify;

pub use cat::cat;
pub use convert::{Target, convert};
pub use demo::{CheckpointTensor, safetensors_checkpoint, safetensors_file, write_demo};
pub use inspect::inspect;
pub use signature::{SignatureCheck, verify_signature};
pub use verify::verify;

use std::path::Path;

use anyhow::Context;

use crate::format::{self, FileKind, Limits, Manifest};
use crate::storage::mapped::MappedFile;

/// A model opened from the file a tool was given, and the files its components are in as far
/// as they were opened with it: the file itself, then a checkpoint's shards (a v2 root's
/// shards are found when needed, [`shards_beside`]).
pub(crate) struct Opened {
    pub manifest: Manifest,
    pub files: Vec<MappedFile>,
}

fn map(path: &Path) -> anyhow::Result<MappedFile> {
    MappedFile::open(path).with_context(|| format!("cannot open {}", path.display()))
}

/// Opens a `.zt` file, a `.safetensors` file, a checkpoint's `.safetensors.index.json` (with
/// the shards it names, in its directory) or a `.gguf` file (with its split model's other
/// parts).
pub(crate) fn open(path: &Path, limits: &Limits) -> anyhow::Result<Opened> {
    let file = map(path)?;
    let invalid = |what: &str| format!("{} is not a valid {what}", path.display());
    match kind_of(path) {
        Some(FileKind::Safetensors) => {
            let manifest = format::safetensors::parse_file(&file)
                .and_then(|header| header.into_manifest(file.len() as u64))
                .with_context(|| invalid("safetensors file"))?;
            Ok(Opened { manifest, files: vec![file] })
        }
        Some(FileKind::SafetensorsIndex) => {
            let index = format::safetensors::parse_index(&file).with_context(|| invalid("safetensors index"))?;
            let dir = directory_of(path);
            let mut files = vec![file];
            for name in &index.shards {
                files.push(map(&dir.join(name))?);
            }
            let manifest = format::safetensors::parse_checkpoint(&index, files[0].len() as u64, |name| {
                let at = index.shards.iter().position(|n| n == name).expect("the index names it");
                Ok(&files[at + 1][..])
            })
            .with_context(|| invalid("safetensors checkpoint"))?
            .0;
            Ok(Opened { manifest, files })
        }
        Some(FileKind::Gguf) => {
            let paths = gguf_parts(path);
            let mut files = Vec::with_capacity(paths.len());
            let mut given = Some(file);
            for part in &paths {
                // The file given is one of them, mapped already.
                files.push(match given.take_if(|_| part == path) {
                    Some(file) => file,
                    None => map(part)?,
                });
            }
            let parts = gguf_named(&paths, &files);
            let manifest = format::gguf::parse_model(&parts).with_context(|| invalid("GGUF model"))?;
            Ok(Opened { manifest, files })
        }
        _ => {
            let manifest = format::parse_file(&file, limits).with_context(|| invalid(".zt file"))?;
            Ok(Opened { manifest, files: vec![file] })
        }
    }
}

/// The files of the GGUF model `path` is a file of: itself, or every part of its split model
/// (`name-00001-of-00003.gguf` …), in its directory, in order.
pub(crate) fn gguf_parts(path: &Path) -> Vec<std::path::PathBuf> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    match format::gguf::split_name(name) {
        Some((prefix, _, count)) => {
            (1..=count).map(|n| directory_of(path).join(format::gguf::split_file_name(prefix, n, count))).collect()
        }
        None => vec![path.to_owned()],
    }
}

/// Each of `files` (mapped from `paths`) with its file name, as the GGUF reader takes them.
pub(crate) fn gguf_named<'f>(paths: &'f [std::path::PathBuf], files: &'f [MappedFile]) -> Vec<(&'f str, &'f [u8])> {
    paths.iter().zip(files).map(|(p, f)| (p.file_name().and_then(|n| n.to_str()).unwrap_or(""), &f[..])).collect()
}

/// The kind of the file at `path`, by its name.
pub(crate) fn kind_of(path: &Path) -> Option<FileKind> {
    path.file_name().and_then(|n| n.to_str()).and_then(FileKind::of)
}

pub(crate) fn directory_of(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
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
    let dir = directory_of(root);
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
