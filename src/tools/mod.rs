//! The file tools over local files: `inspect`, `verify`, `cat`, `convert` and `write-demo`,
//! one module each. Each takes paths and writers so tests drive them directly; `main.rs` only
//! parses arguments and sets exit codes.

mod cat;
mod convert;
mod demo;
mod inspect;
mod verify;

pub use cat::cat;
pub use convert::{convert, parse_compress, parse_digest};
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

/// Escapes control characters so hostile names cannot rewrite the terminal.
pub(crate) fn shown(name: &str) -> String {
    if name.chars().any(|c| c.is_control()) || name.is_empty() { format!("{name:?}") } else { name.to_owned() }
}
