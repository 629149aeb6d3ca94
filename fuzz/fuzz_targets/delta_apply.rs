//! Refit deltas: the input is applied as a delta to a region of the size its header names (up
//! to 1 MiB) and to one of the wrong size, and, split in two, encoded as an old and a new region
//! whose delta must apply back exactly. Any panic, hang or excess allocation is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ztserve_format::delta::{apply, encode, parse_header};

fuzz_target!(|data: &[u8]| {
    if let Ok(header) = parse_header(data) {
        let region = header.elements.saturating_mul(header.width as u64);
        if region <= 1 << 20 {
            let mut target = vec![0u8; region as usize];
            let _ = apply(data, &mut target);
        }
    }
    let _ = apply(data, &mut [0u8; 64]);
    if let Some((&width, rest)) = data.split_first() {
        let width = [1, 2, 4, 8][(width & 3) as usize];
        let half = rest.len() / 2 / width * width;
        let (old, new) = (&rest[..half], &rest[half..2 * half]);
        let delta = encode(old, new, width, 1).expect("same-length whole-element regions encode");
        let mut target = old.to_vec();
        apply(&delta, &mut target).expect("a fresh delta applies");
        assert_eq!(target, new);
    }
});
