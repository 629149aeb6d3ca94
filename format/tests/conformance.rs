//! The v2 specification's conformance corpus (`tests/data/v2-conformance`, copied from the
//! official repository): every valid file opens and verifies, every reject file is refused,
//! at open or, for the data rules, by `verify`.

use std::path::{Path, PathBuf};

use ztserve_format::verify::verify_file;
use ztserve_format::{FormatError, Limits, parse_file};

/// A valid case that is only opened: its filler bytes break the packed-nibble data rule (the
/// same bytes are the reject case `f4-nonzero-odd-nibble`).
const OPEN_ONLY: &str = "f4-packed-odd-count";

/// Reject cases whose fault is in the data, found only when the bytes are decoded or verified.
const DATA_RULES: [&str; 6] = [
    "bool-invalid-byte",
    "f4-nonzero-odd-nibble",
    "csr-indptr-not-zero-based",
    "csr-index-out-of-cols",
    "csr-row-not-increasing",
    "verify-digest-mismatch",
];

fn corpus(kind: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/v2-conformance").join(kind);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    paths.sort();
    paths
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "zt"))
        .map(|p| (p.file_stem().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect()
}

#[test]
fn every_valid_file_opens_and_verifies() {
    let cases = corpus("valid");
    assert!(cases.len() >= 19, "the corpus is all there");
    for (name, bytes) in cases {
        match parse_file(&bytes, &Limits::default()) {
            Err(FormatError::DataShard) => assert_eq!(name, "data-shard"),
            Err(e) => panic!("{name}: refused: {e}"),
            Ok(manifest) if manifest.shards.is_empty() && name != OPEN_ONLY => {
                let report = verify_file(&bytes, &Limits::default());
                assert!(report.is_valid(), "{name}: {:?}", report.errors);
            }
            Ok(_) => {}
        }
    }
}

#[test]
fn every_reject_file_is_refused_with_a_reason() {
    let cases = corpus("reject");
    assert!(cases.len() >= 55, "the corpus is all there");
    for (name, bytes) in cases {
        let opened = parse_file(&bytes, &Limits::default());
        if DATA_RULES.contains(&name.as_str()) {
            assert!(opened.is_ok(), "{name}: a data rule must not fail at open: {opened:?}");
            let report = verify_file(&bytes, &Limits::default());
            assert!(!report.is_valid(), "{name}: verify found nothing");
            println!("{name}: {}", report.errors[0].code());
        } else {
            let error = opened.expect_err(&name);
            println!("{name}: {} ({error})", error.code());
        }
    }
}
