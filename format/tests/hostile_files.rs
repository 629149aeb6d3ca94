//! Hostile files: random mutations of valid files, from the official writers (the fuzz seeds)
//! and ours, must give errors or valid results — never a panic, a hang or an allocation
//! beyond the limits.

use std::fs;
use std::path::Path;

use proptest::prelude::*;
use ztserve_format::Limits;
use ztserve_format::verify::verify_file;

fn limits() -> Limits {
    Limits { max_manifest_bytes: 1 << 20, max_decoded_bytes: 16 << 20, ..Limits::default() }
}

fn seeds() -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds");
    let mut seeds: Vec<Vec<u8>> = fs::read_dir(dir).unwrap().map(|e| fs::read(e.unwrap().path()).unwrap()).collect();
    assert!(seeds.len() >= 4, "fuzz/seeds lost its files");
    seeds.sort();
    seeds
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip { at: usize, bit: u8 },
    Set { at: usize, byte: u8 },
    Truncate { len: usize },
    Insert { at: usize, bytes: Vec<u8> },
    Remove { at: usize, len: usize },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        (
            any::<usize>(),
            prop::sample::select(vec![
                0u8, 1, 0x17, 0x18, 0x1b, 0x3f, 0x40, 0x7f, 0x80, 0x9f, 0xa0, 0xbf, 0xc2, 0xf9, 0xff
            ])
        )
            .prop_map(|(at, byte)| Mutation::Set { at, byte }),
        any::<usize>().prop_map(|len| Mutation::Truncate { len }),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        (any::<usize>(), 1usize..32).prop_map(|(at, len)| Mutation::Remove { at, len }),
    ]
}

fn apply(file: &mut Vec<u8>, m: &Mutation) {
    if file.is_empty() {
        return;
    }
    let n = file.len();
    match m {
        Mutation::Flip { at, bit } => file[at % n] ^= 1 << bit,
        Mutation::Set { at, byte } => file[at % n] = *byte,
        Mutation::Truncate { len } => file.truncate(len % n),
        Mutation::Insert { at, bytes } => {
            let at = at % n;
            file.splice(at..at, bytes.iter().copied());
        }
        Mutation::Remove { at, len } => {
            let at = at % n;
            file.drain(at..(at + len).min(n));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn mutated_files_give_errors_never_panics(seed in 0usize..64, mutations in prop::collection::vec(mutation(), 1..4)) {
        let seeds = seeds();
        let mut file = seeds[seed % seeds.len()].clone();
        for m in &mutations {
            apply(&mut file, m);
        }
        let report = verify_file(&file, &limits());
        for e in &report.errors {
            prop_assert!(!e.to_string().is_empty());
        }
    }
}

#[test]
fn every_fuzz_seed_corpus_and_regression_input_is_handled_without_panic() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut count = 0;
    for dir in ["seeds", "corpus/format", "regressions"] {
        let Ok(entries) = fs::read_dir(root.join(dir)) else { continue };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.file_name().is_some_and(|n| n == "README.md") {
                continue;
            }
            let bytes = fs::read(&path).unwrap();
            // What the fuzz target does with each input.
            let _ = verify_file(&bytes, &limits());
            if let Ok(manifest) = ztserve_format::parse_file(&bytes, &limits()) {
                let _ = ztserve_format::json::manifest_json(&manifest).to_string();
            }
            count += 1;
        }
    }
    assert!(count >= 500, "fuzz/ lost its corpus: {count} inputs");
}

#[test]
fn every_v2_manifest_fuzz_input_is_handled_without_panic() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut count = 0;
    for dir in ["seeds-v2", "corpus/v2_manifest", "regressions-v2"] {
        for entry in fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.file_name().is_some_and(|n| n == "README.md") {
                continue;
            }
            let bytes = fs::read(&path).unwrap();
            // What the v2_manifest fuzz target does with each input.
            let Some((&pages, manifest)) = bytes.split_first() else { continue };
            let heap: Vec<u8> = (0..4096 * usize::from(pages)).map(|i| (i.wrapping_mul(31) % 251) as u8).collect();
            let file = ztserve_format::v2::file_around(&heap, manifest);
            let shard = ztserve_format::v2::file_around(&heap[..heap.len().min(8192)], &[]);
            let _ = ztserve_format::verify::verify_model(&file, |_| Ok(&shard[..]), &limits());
            count += 1;
        }
    }
    assert!(count >= 40, "fuzz/ lost its v2 corpus: {count} inputs");
}

#[test]
fn every_delta_fuzz_input_is_handled_without_panic() {
    use ztserve_format::delta::{apply, encode, parse_header};
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut count = 0;
    for dir in ["seeds-delta", "corpus/delta_apply", "regressions-delta"] {
        for entry in fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.file_name().is_some_and(|n| n == "README.md") {
                continue;
            }
            let bytes = fs::read(&path).unwrap();
            // What the delta_apply fuzz target does with each input.
            if let Ok(header) = parse_header(&bytes) {
                let region = header.elements.saturating_mul(header.width as u64);
                if region <= 1 << 20 {
                    let _ = apply(&bytes, &mut vec![0u8; region as usize]);
                }
            }
            let _ = apply(&bytes, &mut [0u8; 64]);
            if let Some((&width, rest)) = bytes.split_first() {
                let width = [1, 2, 4, 8][(width & 3) as usize];
                let half = rest.len() / 2 / width * width;
                let (old, new) = (&rest[..half], &rest[half..2 * half]);
                let delta = encode(old, new, width, 1).unwrap();
                let mut target = old.to_vec();
                apply(&delta, &mut target).unwrap();
                assert_eq!(target, new, "{}", path.display());
            }
            count += 1;
        }
    }
    assert!(count >= 8, "fuzz/ lost its delta corpus: {count} inputs");
}

#[test]
fn every_model_signature_fuzz_input_is_handled_without_panic() {
    use ztserve_format::model_signature::{Bundle, SignedModel};
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut signed = 0;
    for dir in ["seeds-signature", "corpus/model_signature", "regressions-signature"] {
        for entry in fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.file_name().is_some_and(|n| n == "README.md") {
                continue;
            }
            let bytes = fs::read(&path).unwrap();
            // What the model_signature fuzz target does with each input.
            let statement = |payload: &[u8]| SignedModel::from_payload(payload, String::new()).is_ok();
            if let Ok(bundle) = Bundle::parse(&bytes, 1 << 20) {
                signed += usize::from(statement(&bundle.payload));
            }
            signed += usize::from(statement(&bytes));
        }
    }
    // The seeds: a bundle model_signing wrote and its statement, each in seeds and corpus.
    assert!(signed >= 4, "fuzz/ lost its model signature seeds: {signed} read");
}

#[test]
fn every_official_seed_is_valid() {
    for seed in seeds() {
        let report = verify_file(&seed, &Limits::default());
        assert!(report.is_valid(), "{:?}", report.errors);
    }
}
