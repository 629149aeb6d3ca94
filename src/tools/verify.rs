//! `ztserve verify`: every rule, decode and digest of a file, reported as text or JSON.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use serde_json::json;

use crate::format::{self, FileKind, Limits};
use crate::storage::mapped::MappedFile;

/// `verify`: returns whether the file is valid, after printing the report.
pub fn verify(path: &Path, as_json: bool, limits: &Limits, out: &mut dyn Write) -> anyhow::Result<bool> {
    if super::kind_of(path) == Some(FileKind::Gguf) {
        let paths = super::gguf_parts(path);
        let mut files = Vec::with_capacity(paths.len());
        for part in &paths {
            files.push(MappedFile::open(part).with_context(|| format!("cannot open {}", part.display()))?);
        }
        let report = format::verify::verify_gguf(&super::gguf_named(&paths, &files));
        return write_report(path, &report, as_json, out);
    }
    let file = MappedFile::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    if let kind @ Some(FileKind::Safetensors | FileKind::SafetensorsIndex) = super::kind_of(path) {
        // A checkpoint's shards are the files its index names in its directory.
        let index = kind == Some(FileKind::SafetensorsIndex);
        let names = if index {
            format::safetensors::parse_index(&file).map(|i| i.shards).unwrap_or_default()
        } else {
            Vec::new()
        };
        let dir = super::directory_of(path);
        let shards: Vec<(String, Option<MappedFile>)> =
            names.into_iter().map(|name| (name.clone(), MappedFile::open(&dir.join(&name)).ok())).collect();
        let report =
            format::verify::verify_safetensors(&file, index, |name| match shards.iter().find(|(n, _)| n == name) {
                Some((_, Some(mapped))) => Ok(&mapped[..]),
                _ => Err(format::FormatError::ShardMissing { shard: name.to_owned() }),
            });
        return write_report(path, &report, as_json, out);
    }
    // A v2 root's shards are found beside it; any other file has none.
    let shards = match format::parse_file(&file, limits) {
        Ok(manifest) => {
            manifest.shards.iter().map(|s| s.name.clone()).zip(super::shards_beside(path, &manifest, true)).collect()
        }
        Err(_) => Vec::new(),
    };
    let report = format::verify::verify_model(
        &file,
        |shard| match shards.iter().find(|(name, _)| *name == shard.name) {
            Some((_, Ok((_, bytes)))) => Ok(&bytes[..]),
            Some((_, Err(e))) => Err(e.clone()),
            None => Err(format::FormatError::ShardMissing { shard: shard.name.clone() }),
        },
        limits,
    );
    write_report(path, &report, as_json, out)
}

/// Prints `report` as text or JSON; returns whether the model is valid.
fn write_report(
    path: &Path,
    report: &format::verify::VerifyReport,
    as_json: bool,
    out: &mut dyn Write,
) -> anyhow::Result<bool> {
    if as_json {
        let errors: Vec<_> =
            report.errors.iter().map(|e| json!({ "code": e.code(), "message": e.to_string() })).collect();
        let body = json!({
            "file": path.display().to_string(),
            "valid": report.is_valid(),
            "objects": report.objects,
            "components": report.components,
            "digests_checked": report.digests_checked,
            "errors": errors,
        });
        serde_json::to_writer_pretty(&mut *out, &body)?;
        writeln!(out)?;
    } else if report.is_valid() {
        writeln!(
            out,
            "valid: {} objects, {} components decoded, {} digests verified",
            report.objects, report.components, report.digests_checked
        )?;
    } else {
        for e in &report.errors {
            writeln!(out, "invalid [{}]: {e}", e.code())?;
        }
    }
    Ok(report.is_valid())
}
