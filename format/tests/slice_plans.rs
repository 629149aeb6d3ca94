//! Slice arithmetic (`format::slice`) against its definition, for any shape, slice, element
//! width and part of the slice: the bytes its runs cover are exactly the elements numpy's
//! slicing picks, in row-major order, and shard splits tile their dimension.

use proptest::prelude::*;
use ztserve_format::slice::{Slice, parse, shard};

/// A shape of rank 0 to 4 with small dimensions (0 included), and a slice of it as a spec with
/// negative and omitted bounds mixed in.
fn shape_and_spec() -> impl Strategy<Value = (Vec<u64>, String)> {
    prop::collection::vec(0u64..7, 0..=4).prop_flat_map(|shape| {
        let bounds: Vec<_> = shape
            .iter()
            .map(|&d| {
                let d = d as i64;
                (0..=d, 0..=d, any::<[bool; 4]>()).prop_map(move |(a, b, [neg_a, neg_b, omit_a, omit_b])| {
                    let (start, stop) = (a.min(b), a.max(b));
                    let write =
                        |x: i64, negative: bool, omit: bool, at_default: bool| match (omit && at_default, negative) {
                            (true, _) => String::new(),
                            // -0 is 0, not the end: only a bound before the end is written from the end.
                            (false, true) if x < d => (x - d).to_string(),
                            (false, _) => x.to_string(),
                        };
                    format!("{}:{}", write(start, neg_a, omit_a, start == 0), write(stop, neg_b, omit_b, stop == d))
                })
            })
            .collect();
        (Just(shape), bounds, 0..=4usize).prop_map(|(shape, parts, kept)| {
            let kept = kept.min(parts.len());
            (shape, parts[..kept].join(","))
        })
    })
}

/// The bytes of elements numpy's slicing picks, each byte named by its offset in the tensor.
fn picked(slice: &Slice, shape: &[u64], element: u64) -> Vec<u64> {
    let total: u64 = shape.iter().product();
    let mut out = Vec::new();
    for flat in 0..total {
        let (mut rest, mut inside) = (flat, true);
        for d in (0..shape.len()).rev() {
            inside &= slice.ranges[d].contains(&(rest % shape[d]));
            rest /= shape[d];
        }
        if inside {
            out.extend(flat * element..(flat + 1) * element);
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn any_part_of_any_slice_is_the_bytes_numpy_picks(
        (shape, spec) in shape_and_spec(),
        element in prop::sample::select(vec![1u64, 2, 4, 8, 16]),
        cut in (0.0f64..=1.0, 0.0f64..=1.0),
    ) {
        let slice = parse(&spec, &shape).unwrap();
        let expected = picked(&slice, &shape, element);
        prop_assert_eq!(slice.len(element), Some(expected.len() as u64));
        prop_assert_eq!(parse(&slice.to_string(), &shape).unwrap(), slice.clone(), "the printed spec resolves to it");
        let len = expected.len() as u64;
        let (a, b) = ((cut.0 * len as f64) as u64, (cut.1 * len as f64) as u64);
        let within = a.min(b)..a.max(b);
        let runs: Vec<_> = slice.runs_within(&shape, element, within.clone()).collect();
        prop_assert!(runs.iter().all(|r| !r.is_empty()), "no empty runs: {:?}", runs);
        prop_assert!(runs.windows(2).all(|w| w[0].end < w[1].start), "runs ascend with gaps: {:?}", runs);
        let bytes: Vec<u64> = runs.into_iter().flatten().collect();
        prop_assert_eq!(&bytes[..], &expected[within.start as usize..within.end as usize]);
    }

    #[test]
    fn shards_tile_their_dimension_and_the_last_takes_the_remainder(
        shape in prop::collection::vec(0u64..40, 1..=3),
        world in 1u64..10,
        dim in 0usize..3,
    ) {
        let dim = dim % shape.len();
        let mut next = 0;
        for rank in 0..world {
            let ranges = shard(rank, world, dim, &shape).unwrap().ranges;
            prop_assert_eq!(ranges[dim].start, next);
            let expected = if rank + 1 == world { shape[dim] - next } else { shape[dim] / world };
            prop_assert_eq!(ranges[dim].end - ranges[dim].start, expected);
            next = ranges[dim].end;
            for (d, range) in ranges.iter().enumerate() {
                if d != dim {
                    prop_assert_eq!(range.clone(), 0..shape[d]);
                }
            }
        }
        prop_assert_eq!(next, shape[dim]);
    }
}
