//! What a pull writes: the output's layout (its length, the bytes it writes itself) and the
//! units it fills from the model's files, for a raw copy of a file or shard, or a rebuilt 1.2
//! or single-file v2 file of the selected objects, with the digest each unit is checked against.

use std::ops::Range;

use anyhow::{Context, bail};
use sha2::Digest as _;

use super::PullOptions;
use crate::format::write::{StoredComponent, StoredObject, plan};
use crate::format::{self, Digest, Encoding, Manifest, V1_MAGIC};

/// A span of the output checked as a whole once written: a component's blob (against its
/// digest when it has one) or, for legacy big-endian data, a blob decoded after download.
#[derive(Debug, Clone)]
pub(super) struct Unit {
    pub(super) label: String,
    pub(super) output: Range<u64>,
    /// Which of the model's files the source bytes are in, and where.
    pub(super) file: usize,
    pub(super) source: Range<u64>,
    pub(super) digest: Option<Digest>,
    /// Set (object name, component) for an encoded v2 part, whose digest covers its decoded
    /// bytes: it is decoded to be checked.
    pub(super) decoded_check: Option<(String, format::Component)>,
    /// Set (object name, component) for blobs whose stored bytes must be decoded before they
    /// are written.
    pub(super) transform: Option<(String, format::Component)>,
    /// False for the spans of a raw copy between blobs (header, padding, manifest).
    pub(super) is_component: bool,
}

/// What to write: the layout, the units to fill, and the bytes the pull writes itself.
pub(super) struct Layout {
    pub(super) output_len: u64,
    pub(super) units: Vec<Unit>,
    /// (offset, bytes) written locally: the header magic and the tail.
    pub(super) local: Vec<(u64, Vec<u8>)>,
    pub(super) objects: usize,
    pub(super) fingerprint: String,
}

/// Compiles `--objects` patterns; `*` matches `/` too, since object names are not paths.
pub(super) fn selector(patterns: &[String]) -> anyhow::Result<Option<globset::GlobSet>> {
    if patterns.is_empty() {
        return Ok(None);
    }
    let mut set = globset::GlobSetBuilder::new();
    for pattern in patterns {
        set.add(
            globset::GlobBuilder::new(pattern)
                .literal_separator(false)
                .build()
                .with_context(|| format!("--objects {pattern:?}"))?,
        );
    }
    Ok(Some(set.build()?))
}

pub(super) fn label(object: &format::Object, component: &format::Component) -> String {
    format!("{:?}.{:?}", object.name, component.role)
}

/// `--raw`: the output is the model's file `file`; each of its components' blobs is a unit, so
/// its digest is checked.
pub(super) fn raw_layout(
    manifest: &Manifest,
    file: usize,
    source_len: u64,
    options: &PullOptions,
) -> anyhow::Result<Layout> {
    if !options.objects.is_empty() {
        bail!("--objects selects objects for a rebuilt file; --raw copies the whole stored file");
    }
    let mut units = Vec::new();
    let mut covered = 0u64;
    // The file's own blobs; those in other files are copied with theirs.
    let mut blobs: Vec<(&format::Object, &format::Component)> = manifest
        .objects
        .iter()
        .flat_map(|o| o.components.iter().map(move |c| (o, c)))
        .filter(|(_, c)| c.file == file)
        .collect();
    blobs.sort_by_key(|(_, c)| c.offset);
    for (object, component) in blobs {
        let blob = component.offset..component.offset + component.stored_length;
        // Bytes between blobs (header, padding) and zero-length blobs sharing an offset.
        if covered < blob.start {
            units.push(Unit {
                label: "padding".into(),
                output: covered..blob.start,
                file,
                source: covered..blob.start,
                digest: None,
                decoded_check: None,
                transform: None,
                is_component: false,
            });
        }
        if !blob.is_empty() && blob.start >= covered {
            units.push(Unit {
                label: label(object, component),
                output: blob.clone(),
                file,
                source: blob.clone(),
                digest: checkable_digest(component),
                decoded_check: decoded_check(object, component),
                transform: None,
                is_component: true,
            });
            covered = blob.end;
        }
    }
    units.push(Unit {
        label: "manifest".into(),
        output: covered..source_len,
        file,
        source: covered..source_len,
        digest: None,
        decoded_check: None,
        transform: None,
        is_component: false,
    });
    units.retain(|u| !u.output.is_empty());
    let objects = manifest.objects.len();
    Ok(Layout { output_len: source_len, units, local: Vec::new(), objects, fingerprint: "raw".into() })
}

/// A digest this pull can check (one of an algorithm it computes, over bytes it can produce).
pub(super) fn checkable_digest(component: &format::Component) -> Option<Digest> {
    component.digest.clone().filter(|d| d.is_verifiable() && component.encoding.is_known())
}

/// For an encoded v2 part, whose digest covers its decoded bytes: what decodes it.
pub(super) fn decoded_check(
    object: &format::Object,
    component: &format::Component,
) -> Option<(String, format::Component)> {
    (component.digest_scope == format::DigestScope::Decoded && component.encoding != Encoding::Raw)
        .then(|| (object.name.clone(), component.clone()))
}

/// `--raw` of a shard: the whole file, checked against the root's shard table (its size by
/// the probe, its whole-file digest here).
pub(super) fn shard_layout(shard: &format::Shard, len: u64, file: usize) -> Layout {
    let unit = Unit {
        label: format!("shard {:?}", shard.name),
        output: 0..len,
        file,
        source: 0..len,
        digest: Some(shard.digest.clone()),
        decoded_check: None,
        transform: None,
        is_component: false,
    };
    let fingerprint = format!("shard {} {} {}", shard.name, shard.size, shard.digest);
    Layout { output_len: len, units: vec![unit], local: Vec::new(), objects: 0, fingerprint }
}

/// The objects `--objects` selects (every object without it); none is an error.
fn chosen_objects<'m>(manifest: &'m Manifest, options: &PullOptions) -> anyhow::Result<Vec<&'m format::Object>> {
    let select = selector(&options.objects)?;
    let chosen: Vec<&format::Object> =
        manifest.objects.iter().filter(|o| select.as_ref().is_none_or(|s| s.is_match(&o.name))).collect();
    if chosen.is_empty() {
        bail!("no object matches --objects {}", options.objects.join(" "));
    }
    Ok(chosen)
}

/// A single-file v2 file of the selected objects of a v2 model, shards merged: each part's
/// stored bytes copied as they are (seekable streams stay seekable, digests stay true since
/// they cover decoded bytes) at 64 KiB placement, the official writer's default.
pub(super) fn rebuilt_v2_layout(manifest: &Manifest, options: &PullOptions) -> anyhow::Result<Layout> {
    let chosen = chosen_objects(manifest, options)?;
    let planned = format::v2::plan(&chosen, manifest.attributes.as_ref(), 64 << 10);
    let mut units: Vec<Unit> = Vec::new();
    for (object, offsets) in chosen.iter().zip(&planned.offsets) {
        for (component, &offset) in object.components.iter().zip(offsets) {
            let output = offset..offset + component.stored_length;
            // Tied weights share one blob: it is copied once.
            if output.is_empty() || units.iter().any(|u| u.output == output) {
                continue;
            }
            units.push(Unit {
                label: label(object, component),
                output,
                file: component.file,
                source: component.stored_range(),
                digest: checkable_digest(component),
                decoded_check: decoded_check(object, component),
                transform: None,
                is_component: true,
            });
        }
    }
    let mut fingerprint = sha2::Sha256::new();
    for unit in &units {
        fingerprint.update(format!("{}{:?}{:?}{:?}", unit.file, unit.output, unit.source, unit.digest));
    }
    fingerprint.update(&planned.tail);
    let output_len = planned.tail_offset + planned.tail.len() as u64;
    let local = vec![(0, format::V2_MAGIC.to_vec()), (planned.tail_offset, planned.tail)];
    Ok(Layout { output_len, units, local, objects: chosen.len(), fingerprint: hex::encode(fingerprint.finalize()) })
}

/// A 1.2 file of the selected objects, each blob copied as stored (legacy big-endian blobs are
/// decoded to little-endian, since 1.2 has no byte order).
pub(super) fn rebuilt_layout(manifest: &Manifest, options: &PullOptions) -> anyhow::Result<Layout> {
    let chosen = chosen_objects(manifest, options)?;
    let stored_objects: Vec<StoredObject<'_>> = chosen
        .iter()
        .map(|object| StoredObject {
            name: &object.name,
            shape: &object.shape,
            format: &object.format,
            attributes: object.attributes.clone(),
            components: object
                .components
                .iter()
                .map(|c| {
                    let swapped = c.needs_swap();
                    StoredComponent {
                        role: &c.role,
                        dtype: c.dtype,
                        logical_type: format::gguf::declared_logical_type(object, c),
                        encoding: if swapped { Encoding::Raw } else { c.encoding.clone() },
                        stored_length: if swapped { c.decoded_length } else { c.stored_length },
                        decoded_length: c.decoded_length,
                        // A decoded blob's digest is computed anew, with the same algorithm.
                        digest: if swapped { None } else { c.digest.clone() },
                    }
                })
                .collect(),
        })
        .collect();
    let planned = plan(&stored_objects, manifest.attributes.clone())
        .context("the served model cannot be rewritten as a 1.2 file")?;
    let mut units = Vec::new();
    for (object, offsets) in chosen.iter().zip(&planned.offsets) {
        for (component, &offset) in object.components.iter().zip(offsets) {
            let swapped = component.needs_swap();
            let written = if swapped { component.decoded_length } else { component.stored_length };
            units.push(Unit {
                label: label(object, component),
                output: offset..offset + written,
                file: 0,
                source: component.offset..component.offset + component.stored_length,
                digest: component.digest.clone(),
                decoded_check: None,
                transform: swapped.then(|| (object.name.clone(), component.clone())),
                is_component: true,
            });
        }
    }
    units.retain(|u| !u.source.is_empty());
    let mut fingerprint = sha2::Sha256::new();
    for unit in &units {
        fingerprint.update(format!("{:?}{:?}{:?}", unit.output, unit.source, unit.digest));
    }
    fingerprint.update(&planned.tail);
    let output_len = planned.tail_offset + planned.tail.len() as u64;
    let local = vec![(0, V1_MAGIC.to_vec()), (planned.tail_offset, planned.tail)];
    Ok(Layout { output_len, units, local, objects: chosen.len(), fingerprint: hex::encode(fingerprint.finalize()) })
}
