//! The blob rules of a v2 manifest, per file: every part's blob aligned, inside the file's
//! data region, and identical to or disjoint from every other (the manifest's included).

use std::collections::BTreeMap;

use super::container::{BLOB_ALIGNMENT, FOOTER_LEN};
use crate::{FormatError, Location, Manifest, Result};

/// The blob rules (§2.4, §3.6 items 3 and 4), per file: aligned, not before byte 4096, inside
/// the file's data region, and pairwise identical or disjoint (with the manifest blob, in the
/// root). References into a shard are checked against the size its table entry declares.
pub(super) fn check_blobs(manifest: &Manifest) -> Result<()> {
    let data_end = |file: usize| match file {
        0 => Some(manifest.file_len - FOOTER_LEN),
        i => manifest.shards[i - 1].size.checked_sub(FOOTER_LEN),
    };
    // Per file: (start, end, object index, component index); the manifest is (usize::MAX, 0).
    let mut by_file: BTreeMap<usize, Vec<(u64, u64, usize, usize)>> = BTreeMap::new();
    by_file.entry(0).or_default().push((manifest.manifest_span.start, manifest.manifest_span.end, usize::MAX, 0));
    for (oi, object) in manifest.objects.iter().enumerate() {
        for (ci, c) in object.components.iter().enumerate() {
            let at = || Location::component(&object.name, &c.role);
            if c.offset % BLOB_ALIGNMENT != 0 {
                return Err(FormatError::Misaligned { at: at(), offset: c.offset, alignment: BLOB_ALIGNMENT });
            }
            if c.offset < BLOB_ALIGNMENT {
                return Err(FormatError::RangeIntoHeader {
                    at: at(),
                    start: c.offset,
                    end: c.offset.saturating_add(c.stored_length),
                    header: BLOB_ALIGNMENT,
                });
            }
            let end = c.offset.checked_add(c.stored_length).ok_or(FormatError::RangeOverflow {
                at: at(),
                offset: c.offset,
                length: c.stored_length,
            })?;
            let limit = data_end(c.file).unwrap_or(0);
            if end > limit {
                return Err(FormatError::RangeIntoFooter { at: at(), start: c.offset, end, data_end: limit });
            }
            if c.stored_length > 0 {
                by_file.entry(c.file).or_default().push((c.offset, end, oi, ci));
            }
        }
    }
    let locate = |oi: usize, ci: usize| {
        if oi == usize::MAX {
            Location::object("(the manifest blob)")
        } else {
            let object = &manifest.objects[oi];
            Location::component(&object.name, &object.components[ci].role)
        }
    };
    for ranges in by_file.values_mut() {
        ranges.sort_unstable();
        let mut reach: Option<(u64, u64, usize, usize)> = None;
        for &range in ranges.iter() {
            if let Some(prev) = reach {
                if range.0 < prev.1 && (range.0, range.1) != (prev.0, prev.1) {
                    return Err(FormatError::Overlap {
                        first: locate(prev.2, prev.3),
                        first_start: prev.0,
                        first_end: prev.1,
                        second: locate(range.2, range.3),
                        second_start: range.0,
                        second_end: range.1,
                    });
                }
            }
            if reach.is_none_or(|prev| range.1 > prev.1) {
                reach = Some(range);
            }
        }
    }
    Ok(())
}
