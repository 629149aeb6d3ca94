//! `verify_file`: every structural, decoding, digest and content check over a whole file in
//! memory, collecting each failure rather than stopping at the first (the `verify` tool, and
//! the fuzzer's widest entry point).

use std::borrow::Cow;

use crate::decode::{DECODE_PIECE, decode_component, decode_with, stored_bytes, verify_digest};
use crate::validate::check_content;
use crate::{FormatError, Limits};

/// What `verify` found.
pub struct VerifyReport {
    pub objects: usize,
    pub components: usize,
    pub digests_checked: usize,
    /// Every failure: one structural one, or each failing component.
    pub errors: Vec<FormatError>,
}

impl VerifyReport {
    pub fn is_valid(&self) -> bool {
        self.errors.is_empty()
    }
}

/// Runs every structural, decoding, digest and content check over a file's bytes.
pub fn verify_file(file: &[u8], limits: &Limits) -> VerifyReport {
    let mut report = VerifyReport { objects: 0, components: 0, digests_checked: 0, errors: Vec::new() };
    let manifest = match crate::parse_file(file, limits) {
        Ok(m) => m,
        Err(e) => {
            report.errors.push(e);
            return report;
        }
    };
    let mut scratch = vec![0u8; DECODE_PIECE];
    for object in &manifest.objects {
        report.objects += 1;
        let mut object_ok = true;
        for component in &object.components {
            report.components += 1;
            let result = stored_bytes(file, &object.name, component).and_then(|stored| {
                if component.digest.is_some() {
                    report.digests_checked += 1;
                    verify_digest(&object.name, component, stored)?;
                }
                decode_with::<FormatError>(&object.name, component, stored, &mut scratch, |_| Ok(()))
            });
            if let Err(e) = result {
                object_ok = false;
                report.errors.push(e);
            }
        }
        if object_ok {
            let content = check_content(object, |c| -> crate::Result<Cow<'_, [u8]>> {
                decode_component(&object.name, c, stored_bytes(file, &object.name, c)?)
            });
            if let Err(e) = content {
                report.errors.push(e);
            }
        }
    }
    report
}
