//! `ztserve inspect`: a file's container, version, attributes and a table of its objects.

use std::io::Write;
use std::path::Path;

use super::{open, shown};
use crate::format::Limits;
use crate::format::json::{cbor_to_json, manifest_json};

/// `inspect`: version, attributes and a table of objects.
pub fn inspect(path: &Path, as_json: bool, limits: &Limits, out: &mut dyn Write) -> anyhow::Result<()> {
    let manifest = open(path, limits)?.manifest;
    if as_json {
        serde_json::to_writer_pretty(&mut *out, &manifest_json(&manifest))?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(out, "file:       {}", path.display())?;
    writeln!(out, "container:  {}", manifest.container)?;
    let unversioned = match manifest.container {
        crate::format::Container::Safetensors => "(none: safetensors files carry no version)",
        crate::format::Container::Gguf => "(none)",
        _ => "(none: 0.1 files carry no version)",
    };
    writeln!(out, "version:    {}", manifest.version.as_deref().unwrap_or(unversioned))?;
    let attributes = manifest.attributes.as_ref().map_or("(none)".to_owned(), |a| cbor_to_json(a).to_string());
    writeln!(out, "attributes: {attributes}")?;
    for (shard, found) in manifest.shards.iter().zip(super::shards_beside(path, &manifest, false)) {
        let found = match found {
            Ok((path, _)) => format!("found at {} (by size; verify checks its digest)", path.display()),
            Err(e) => format!("not found: {e}"),
        };
        writeln!(out, "shard:      {} ({} bytes, {}), {found}", shown(&shard.name), shard.size, shard.digest)?;
    }
    writeln!(out, "objects:    {}", manifest.objects.len())?;
    let mut rows = vec![
        ["NAME", "FORMAT", "SHAPE", "COMPONENT", "DTYPE", "TYPE", "ENCODING", "STORED", "DECODED"].map(String::from),
    ];
    for object in &manifest.objects {
        for (i, c) in object.components.iter().enumerate() {
            let first = i == 0;
            rows.push([
                if first { shown(&object.name) } else { String::new() },
                if first { shown(&object.format) } else { String::new() },
                if first { format!("{:?}", object.shape) } else { String::new() },
                shown(&c.role),
                c.dtype.name().to_owned(),
                c.logical_type.as_deref().map_or("-".to_owned(), shown),
                c.encoding.name().to_owned(),
                c.stored_length.to_string(),
                c.decoded_length.to_string(),
            ]);
        }
        if object.components.is_empty() {
            rows.push([
                shown(&object.name),
                shown(&object.format),
                format!("{:?}", object.shape),
                "-".into(),
                "".into(),
                "".into(),
                "".into(),
                "0".into(),
                "0".into(),
            ]);
        }
    }
    let widths: Vec<usize> = (0..9).map(|col| rows.iter().map(|r| r[col].chars().count()).max().unwrap_or(0)).collect();
    for row in &rows {
        let line: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        writeln!(out, "{}", line.join("  ").trim_end())?;
    }
    Ok(())
}
