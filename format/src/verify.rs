//! `verify_file` and `verify_model`: every structural, decoding, digest and content check over
//! a model's files in memory (a v2 root and its shards, or one file of any generation),
//! collecting each failure rather than stopping at the first (the `verify` tool, and the
//! fuzzer's widest entry point).

use std::borrow::Cow;

use crate::decode::{DECODE_PIECE, Hasher, check_digest, decode_component, decode_with, stored_bytes, verify_digest};
use crate::validate::check_content;
use crate::{Component, DigestScope, FormatError, Limits, Manifest, Shard};

/// What `verify` found.
pub struct VerifyReport {
    pub objects: usize,
    pub components: usize,
    pub digests_checked: usize,
    /// Components in an encoding this reader does not know: kept as stored, not decoded.
    pub undecodable: usize,
    /// Every failure: one structural one, or each failing shard and component.
    pub errors: Vec<FormatError>,
}

impl VerifyReport {
    pub fn is_valid(&self) -> bool {
        self.errors.is_empty()
    }
}

/// Runs every check over one file's bytes (a v2 root naming shards fails for each shard).
pub fn verify_file(file: &[u8], limits: &Limits) -> VerifyReport {
    verify_model(file, |shard| Err(FormatError::ShardMissing { shard: shard.name.clone() }), limits)
}

/// Runs every check over a GGUF model's files (one file, or a split model's parts in order,
/// each with its name): GGUF declares no digests and no encodings, so its rules are its
/// header's ([`crate::gguf`]).
pub fn verify_gguf(parts: &[(&str, &[u8])]) -> VerifyReport {
    let mut report = VerifyReport { objects: 0, components: 0, digests_checked: 0, undecodable: 0, errors: Vec::new() };
    match crate::gguf::parse_model(parts) {
        Ok(manifest) => {
            report.objects = manifest.objects.len();
            report.components = manifest.objects.iter().map(|o| o.components.len()).sum();
        }
        Err(e) => report.errors.push(e),
    }
    report
}

/// Checks a shard file's size against its entry in the root's table.
pub fn check_shard_size(shard: &Shard, size: u64) -> Result<(), FormatError> {
    if size != shard.size {
        return Err(FormatError::ShardSizeMismatch { shard: shard.name.clone(), expected: shard.size, actual: size });
    }
    Ok(())
}

/// Checks a shard file against its entry in the root's table: its size, then its digest.
pub fn check_shard(shard: &Shard, bytes: &[u8]) -> Result<(), FormatError> {
    check_shard_size(shard, bytes.len() as u64)?;
    let mut hasher = Hasher::for_digest(&shard.digest);
    hasher.update(bytes);
    match hasher.finish() {
        Some(actual) if actual != shard.digest => Err(FormatError::ShardDigestMismatch {
            shard: shard.name.clone(),
            expected: shard.digest.to_string(),
            actual: actual.to_string(),
        }),
        _ => Ok(()),
    }
}

/// Runs every check over a model: the root file's bytes, and each shard's bytes as `shard`
/// finds them (or why it could not), each checked against the shard table.
pub fn verify_model<'a>(
    root: &'a [u8],
    shard: impl Fn(&Shard) -> Result<&'a [u8], FormatError>,
    limits: &Limits,
) -> VerifyReport {
    let mut report = VerifyReport { objects: 0, components: 0, digests_checked: 0, undecodable: 0, errors: Vec::new() };
    let manifest = match crate::parse_file(root, limits) {
        Ok(m) => m,
        Err(e) => {
            report.errors.push(e);
            return report;
        }
    };
    let mut files: Vec<Option<&[u8]>> = vec![Some(root)];
    for entry in &manifest.shards {
        match shard(entry).and_then(|bytes| check_shard(entry, bytes).map(|()| bytes)) {
            Ok(bytes) => files.push(Some(bytes)),
            Err(e) => {
                report.errors.push(e);
                files.push(None);
            }
        }
    }
    verify_components(&manifest, &files, &mut report);
    report
}

/// Runs every check over a safetensors file (`index` false) or a sharded checkpoint's index
/// and each shard's bytes as `shard` finds them: the header rules, then each tensor's content
/// rules (bool bytes). safetensors declares no digests, so none is checked.
pub fn verify_safetensors<'a>(
    file: &'a [u8],
    index: bool,
    shard: impl Fn(&str) -> Result<&'a [u8], FormatError>,
) -> VerifyReport {
    let mut report = VerifyReport { objects: 0, components: 0, digests_checked: 0, undecodable: 0, errors: Vec::new() };
    let parsed = if index {
        crate::safetensors::parse_index(file)
            .and_then(|index| crate::safetensors::parse_checkpoint(&index, file.len() as u64, shard))
            .map(|(manifest, shards)| (manifest, std::iter::once(file).chain(shards).map(Some).collect()))
    } else {
        crate::safetensors::parse_file(file)
            .and_then(|header| header.into_manifest(file.len() as u64))
            .map(|manifest| (manifest, vec![Some(file)]))
    };
    match parsed {
        Ok((manifest, files)) => verify_components(&manifest, &files, &mut report),
        Err(e) => report.errors.push(e),
    }
    report
}

fn verify_components(manifest: &Manifest, files: &[Option<&[u8]>], report: &mut VerifyReport) {
    let mut scratch = vec![0u8; DECODE_PIECE];
    for object in &manifest.objects {
        report.objects += 1;
        let mut object_ok = true;
        for component in &object.components {
            report.components += 1;
            // A missing or mismatched shard was reported once, for the shard.
            let Some(file) = files[component.file] else {
                object_ok = false;
                continue;
            };
            if !component.encoding.is_known() {
                report.undecodable += 1;
                object_ok = false;
                continue;
            }
            let checked = component.digest.as_ref().is_some_and(|d| d.is_verifiable());
            report.digests_checked += usize::from(checked);
            let result = stored_bytes(file, &object.name, component)
                .and_then(|stored| verify_component(&object.name, component, stored, &mut scratch));
            if let Err(e) = result {
                object_ok = false;
                report.errors.push(e);
            }
        }
        if object_ok {
            let content = check_content(object, |c| -> crate::Result<Cow<'_, [u8]>> {
                let file = files[c.file].expect("every file of a checked object is present");
                decode_component(&object.name, c, stored_bytes(file, &object.name, c)?)
            });
            if let Err(e) = content {
                report.errors.push(e);
            }
        }
    }
}

/// Decodes one component and checks its digest over the bytes it covers.
fn verify_component(object: &str, component: &Component, stored: &[u8], scratch: &mut [u8]) -> crate::Result<()> {
    match component.digest_scope {
        DigestScope::Stored => {
            verify_digest(object, component, stored)?;
            decode_with::<FormatError>(object, component, stored, scratch, |_| Ok(()))
        }
        DigestScope::Decoded => {
            let decoded = decode_component(object, component, stored)?;
            let Some(expected) = &component.digest else { return Ok(()) };
            let mut hasher = Hasher::for_digest(expected);
            hasher.update(&decoded);
            check_digest(object, component, hasher.finish())
        }
    }
}
