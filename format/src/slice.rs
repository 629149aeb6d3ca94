//! Slices of dense row-major tensors, planned purely: a slice spec (`start:stop` per
//! dimension, numpy-style: `:` for a whole dimension, an omitted bound for its end, negative
//! bounds counted from the end, trailing dimensions left out meaning whole, no steps) or an even
//! split of one dimension among tensor-parallel ranks (the last taking any remainder, as vLLM's
//! loaders divide), checked against a shape; and the sub-tensor's bytes as the ordered,
//! maximal contiguous byte runs of the whole tensor it is made of, generated lazily (from any
//! byte of the slice on), so a slice of any size is planned in constant memory; and which
//! objects can be cut at all (dense, whole-byte elements of a known type).

use std::fmt;
use std::ops::Range;

use crate::Object;

/// A slice: one range of indices per dimension of the tensor it was checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice {
    pub ranges: Vec<Range<u64>>,
}

/// Why a slice cannot be cut from a tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SliceError {
    /// The spec is not `start:stop` per dimension (`spec` empty: the query's keys are wrong).
    Syntax { spec: String, detail: String },
    /// More dimensions than the tensor has.
    Rank { given: usize, rank: usize },
    /// A bound beyond its dimension.
    OutOfBounds { dimension: usize, bound: i64, size: u64 },
    /// A start after its stop.
    Reversed { dimension: usize, start: u64, stop: u64 },
    /// A rank split that does not fit the tensor (rank ≥ world, world 0, no such dimension).
    Shard { detail: String },
    /// The object is not one dense tensor of its shape.
    NotDense { detail: String },
    /// Its elements are smaller than a byte (packed), so a slice may start inside a byte.
    SubByte { logical_type: String },
    /// Its logical type is not one this server knows the element size of.
    UnknownType { logical_type: String },
    /// A GGML block-quantized tensor cut inside a block: its innermost dimension is cut only
    /// at whole blocks.
    PartialBlock { ggml_type: String, block: u64, start: u64, stop: u64 },
}

impl SliceError {
    /// The stable code of the error, as the HTTP contract names it.
    pub fn code(&self) -> &'static str {
        match self {
            SliceError::Syntax { .. } => "slice_syntax",
            SliceError::Rank { .. } => "slice_rank",
            SliceError::OutOfBounds { .. } => "slice_out_of_bounds",
            SliceError::Reversed { .. } => "slice_reversed",
            SliceError::Shard { .. } => "slice_shard",
            SliceError::NotDense { .. } => "slice_not_dense",
            SliceError::SubByte { .. } => "slice_sub_byte",
            SliceError::UnknownType { .. } => "slice_unknown_type",
            SliceError::PartialBlock { .. } => "slice_partial_block",
        }
    }
}

impl fmt::Display for SliceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SliceError::Syntax { spec, detail } if spec.is_empty() => write!(f, "{detail}"),
            SliceError::Syntax { spec, detail } => write!(f, "slice {spec:?}: {detail}"),
            SliceError::Rank { given, rank } => {
                write!(f, "the slice has {given} dimensions; the tensor has {rank}")
            }
            SliceError::OutOfBounds { dimension, bound, size } => {
                write!(f, "bound {bound} of dimension {dimension} is outside its {size} elements")
            }
            SliceError::Reversed { dimension, start, stop } => {
                write!(f, "dimension {dimension} starts at {start}, after its stop {stop}; slices have no steps")
            }
            SliceError::Shard { detail } | SliceError::NotDense { detail } => write!(f, "{detail}"),
            SliceError::SubByte { logical_type } => {
                write!(f, "{logical_type} packs several elements into a byte, so its slices cannot be cut as bytes")
            }
            SliceError::UnknownType { logical_type } => {
                write!(f, "the logical type {logical_type:?} is not registered, so the size of its elements is unknown")
            }
            SliceError::PartialBlock { ggml_type, block, start, stop } => write!(
                f,
                "{ggml_type} stores its innermost dimension in blocks of {block} elements, so it is cut only at \
                 multiples of {block}, not at {start}:{stop}"
            ),
        }
    }
}

impl std::error::Error for SliceError {}

/// A bound as written: `None` when omitted.
fn bound(text: &str, spec: &str) -> Result<Option<i64>, SliceError> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse::<i64>()
        .map(Some)
        .map_err(|_| SliceError::Syntax { spec: spec.to_owned(), detail: format!("{text:?} is not an integer bound") })
}

/// A bound resolved against a dimension of `size`: negative ones count from its end.
fn resolve(bound: i64, size: u64, dimension: usize) -> Result<u64, SliceError> {
    let out = || SliceError::OutOfBounds { dimension, bound, size };
    let resolved = if bound < 0 { size.checked_sub(bound.unsigned_abs()).ok_or_else(out)? } else { bound as u64 };
    if resolved > size {
        return Err(out());
    }
    Ok(resolved)
}

/// Parses `spec` (`0:4096,:` …) against `shape`.
pub fn parse(spec: &str, shape: &[u64]) -> Result<Slice, SliceError> {
    let parts: Vec<&str> = if spec.trim().is_empty() { Vec::new() } else { spec.split(',').collect() };
    if parts.len() > shape.len() {
        return Err(SliceError::Rank { given: parts.len(), rank: shape.len() });
    }
    let mut ranges = Vec::with_capacity(shape.len());
    for (dimension, (&size, part)) in
        shape.iter().zip(parts.iter().map(Some).chain(std::iter::repeat(None))).enumerate()
    {
        let Some(part) = part else {
            ranges.push(0..size);
            continue;
        };
        let Some((start, stop)) = part.split_once(':') else {
            let detail = format!("dimension {dimension} is {part:?}, not start:stop");
            return Err(SliceError::Syntax { spec: spec.to_owned(), detail });
        };
        if stop.contains(':') {
            let detail = format!("dimension {dimension} has a step; slices have none");
            return Err(SliceError::Syntax { spec: spec.to_owned(), detail });
        }
        let start = bound(start, spec)?.map_or(Ok(0), |b| resolve(b, size, dimension))?;
        let stop = bound(stop, spec)?.map_or(Ok(size), |b| resolve(b, size, dimension))?;
        if start > stop {
            return Err(SliceError::Reversed { dimension, start, stop });
        }
        ranges.push(start..stop);
    }
    Ok(Slice { ranges })
}

/// The bytes of one element of `object`, when it can be sliced: a dense tensor (one `data`
/// component) of whole-byte elements whose decoded bytes are exactly its shape's.
pub fn element_bytes(object: &Object) -> Result<u64, SliceError> {
    let not_dense = |detail: String| SliceError::NotDense { detail };
    if object.format != "dense" {
        return Err(not_dense(format!("{} is a {} object; only dense tensors are sliced", object.name, object.format)));
    }
    let [data] = &object.components[..] else {
        return Err(not_dense(format!("{} has {} components, not one", object.name, object.components.len())));
    };
    let element = match data.logical_type.as_deref() {
        None => data.dtype.width(),
        Some(name) => match crate::v2::logical_size(name) {
            Some((_, crate::v2::LogicalSize::PerElement(ratio))) => data.dtype.width() * ratio,
            Some((_, crate::v2::LogicalSize::Nibbles)) => {
                return Err(SliceError::SubByte { logical_type: name.to_owned() });
            }
            None => return Err(SliceError::UnknownType { logical_type: name.to_owned() }),
        },
    };
    let whole = object.element_count().and_then(|n| n.checked_mul(element));
    if whole != Some(data.decoded_length) {
        let detail = format!(
            "{}: its {} bytes are not its shape's elements of {element} bytes",
            object.name, data.decoded_length
        );
        return Err(not_dense(detail));
    }
    Ok(element)
}

/// How slices of an object are cut from its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    /// The shape its bytes are laid out in: the object's own, with a GGML block-quantized
    /// tensor's innermost dimension counted in blocks.
    pub shape: Vec<u64>,
    /// Bytes of one element of that shape (a whole block of a block-quantized tensor).
    pub element: u64,
    /// The object's innermost elements per element of `shape` (1 unless block-quantized).
    pub block: u64,
    /// The GGML type of a block-quantized tensor (`Q4_K`).
    pub ggml_type: Option<&'static str>,
}

/// How `object` is cut, when it can be: a dense tensor of whole-byte elements
/// ([`element_bytes`]), or a GGML block-quantized tensor, whose rows are whole blocks.
pub fn geometry(object: &Object) -> Result<Geometry, SliceError> {
    let Some(ggml) = crate::gguf::quantized_object(object) else {
        let element = element_bytes(object)?;
        return Ok(Geometry { shape: object.shape.clone(), element, block: 1, ggml_type: None });
    };
    let not_cut = |detail: String| SliceError::NotDense { detail };
    let [data] = &object.components[..] else {
        return Err(not_cut(format!("{} has {} components, not one", object.name, object.components.len())));
    };
    let mut shape = object.shape.clone();
    let inner = shape.last_mut().filter(|d| **d % ggml.block_elements == 0);
    let Some(inner) = inner else {
        return Err(not_cut(format!("{}: its rows are not whole {} blocks", object.name, ggml.name)));
    };
    *inner /= ggml.block_elements;
    let whole = shape.iter().try_fold(ggml.block_bytes, |n, &d| n.checked_mul(d));
    if whole != Some(data.decoded_length) {
        let detail =
            format!("{}: its {} bytes are not its shape's {} blocks", object.name, data.decoded_length, ggml.name);
        return Err(not_cut(detail));
    }
    Ok(Geometry { shape, element: ggml.block_bytes, block: ggml.block_elements, ggml_type: Some(ggml.name) })
}

impl Geometry {
    /// `slice`, of the object's shape, in this geometry's units: a block-quantized tensor's
    /// innermost range must start and stop at whole blocks.
    pub fn cut(&self, slice: &Slice) -> Result<Slice, SliceError> {
        let mut cut = slice.clone();
        if self.block > 1 {
            let last = cut.ranges.last_mut().expect("a block-quantized tensor has a dimension");
            if last.start % self.block != 0 || last.end % self.block != 0 {
                let ggml_type = self.ggml_type.unwrap_or_default().to_owned();
                return Err(SliceError::PartialBlock {
                    ggml_type,
                    block: self.block,
                    start: last.start,
                    stop: last.end,
                });
            }
            *last = last.start / self.block..last.end / self.block;
        }
        Ok(cut)
    }
}

/// The `shard=RANK/WORLD` and `dim=D` of a request (a negative dimension counts from the
/// last) as a slice of `shape`.
pub fn shard_spec(split: &str, dim: &str, shape: &[u64]) -> Result<Slice, SliceError> {
    let syntax = |detail: String| SliceError::Syntax { spec: format!("shard={split}&dim={dim}"), detail };
    let (rank, world) = split
        .split_once('/')
        .and_then(|(r, w)| Some((r.trim().parse::<u64>().ok()?, w.trim().parse::<u64>().ok()?)))
        .ok_or_else(|| syntax(format!("shard {split:?} is not RANK/WORLD")))?;
    let dimension = dim.trim().parse::<i64>().map_err(|_| syntax(format!("dim {dim:?} is not an integer")))?;
    let resolved = if dimension < 0 { (shape.len() as i64).checked_add(dimension) } else { Some(dimension) };
    let Some(dimension) = resolved.filter(|&d| d >= 0 && (d as usize) < shape.len()) else {
        let detail = format!("dimension {dimension} does not exist in a tensor of rank {}", shape.len());
        return Err(SliceError::Shard { detail });
    };
    shard(rank, world, dimension as usize, shape)
}

/// Rank `rank` of `world`'s share of dimension `dimension` of `shape`: an even split, the last
/// rank taking any remainder.
pub fn shard(rank: u64, world: u64, dimension: usize, shape: &[u64]) -> Result<Slice, SliceError> {
    if world == 0 || rank >= world {
        return Err(SliceError::Shard { detail: format!("rank {rank} is not one of {world} ranks") });
    }
    let Some(&size) = shape.get(dimension) else {
        let detail = format!("dimension {dimension} does not exist in a tensor of rank {}", shape.len());
        return Err(SliceError::Shard { detail });
    };
    let each = size / world;
    let start = rank * each;
    let stop = if rank + 1 == world { size } else { start + each };
    let mut ranges: Vec<Range<u64>> = shape.iter().map(|&d| 0..d).collect();
    ranges[dimension] = start..stop;
    Ok(Slice { ranges })
}

/// The slice as a spec that resolves to it alone: `start:stop` for every dimension.
impl fmt::Display for Slice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, range) in self.ranges.iter().enumerate() {
            let comma = if i == 0 { "" } else { "," };
            write!(f, "{comma}{}:{}", range.start, range.end)?;
        }
        Ok(())
    }
}

impl Slice {
    /// The sub-tensor's shape.
    pub fn shape(&self) -> Vec<u64> {
        self.ranges.iter().map(|r| r.end - r.start).collect()
    }

    /// The sub-tensor's length in bytes, for elements of `element` bytes (`None` on overflow).
    pub fn len(&self, element: u64) -> Option<u64> {
        self.ranges.iter().try_fold(element, |n, r| n.checked_mul(r.end - r.start))
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.ranges.iter().any(|r| r.is_empty())
    }

    /// The byte runs of the whole tensor of `shape` (elements of `element` bytes) that make the
    /// sub-tensor, in row-major order, each as long as it can be. The tensor's bytes must fit in
    /// a `u64`, as every checked object's do ([`element_bytes`]); an empty slice has no runs,
    /// whatever the other dimensions.
    pub fn runs(&self, shape: &[u64], element: u64) -> Runs {
        let index: Vec<u64> = self.ranges.iter().map(|r| r.start).collect();
        let empty = Runs { ranges: self.ranges.clone(), outer: 0, index, strides: Vec::new(), run_len: 0, done: true };
        if self.is_empty() {
            return empty;
        }
        // The innermost dimensions the slice takes whole are one run with the first one it cuts.
        let bytes_of = |dims: &[u64]| dims.iter().fold(element, |n, &d| n.saturating_mul(d));
        let cut = (0..shape.len()).rev().find(|&d| self.ranges[d] != (0..shape[d]));
        let (outer, run_len, strides) = match cut {
            None => (0, bytes_of(shape), Vec::new()),
            Some(cut) => {
                let inner = bytes_of(&shape[cut + 1..]);
                let mut strides = vec![0; cut + 1];
                let mut stride = inner;
                for d in (0..=cut).rev() {
                    strides[d] = stride;
                    stride = stride.saturating_mul(shape[d]);
                }
                (cut, (self.ranges[cut].end - self.ranges[cut].start).saturating_mul(inner), strides)
            }
        };
        let index: Vec<u64> = self.ranges.iter().take(outer).map(|r| r.start).collect();
        Runs { outer, index, strides, run_len, done: false, ..empty }
    }

    /// The byte runs of the whole tensor that make bytes `within` of the sub-tensor (within
    /// `0..len`), in order, the first and last cut to fit. The first is found by arithmetic,
    /// not by walking the runs before it.
    pub fn runs_within(&self, shape: &[u64], element: u64, within: Range<u64>) -> RunsWithin {
        let mut runs = self.runs(shape, element);
        let skipped = within.start.checked_div(runs.run_len).unwrap_or(0);
        // The outer index of run `skipped`, the last outer dimension fastest.
        let mut rest = skipped;
        for d in (0..runs.outer).rev() {
            let extent = (self.ranges[d].end - self.ranges[d].start).max(1);
            runs.index[d] = self.ranges[d].start + rest % extent;
            rest /= extent;
        }
        if rest > 0 || (runs.strides.is_empty() && skipped > 0) {
            runs.done = true;
        }
        let into_first = within.start - skipped * runs.run_len;
        RunsWithin { runs, into_first, left: within.end.saturating_sub(within.start) }
    }
}

/// The runs of part of a slice (see [`Slice::runs_within`]).
#[derive(Debug, Clone)]
pub struct RunsWithin {
    runs: Runs,
    /// Bytes of the next run that come before the part.
    into_first: u64,
    /// Bytes of the part still to come.
    left: u64,
}

impl Iterator for RunsWithin {
    type Item = Range<u64>;

    fn next(&mut self) -> Option<Range<u64>> {
        if self.left == 0 {
            return None;
        }
        let run = self.runs.next()?;
        let start = run.start + std::mem::take(&mut self.into_first);
        let end = run.end.min(start + self.left);
        self.left -= end - start;
        Some(start..end)
    }
}

/// The byte runs of a slice, in order (see [`Slice::runs`]).
#[derive(Debug, Clone)]
pub struct Runs {
    ranges: Vec<Range<u64>>,
    /// How many outer dimensions are iterated; the rest make each run.
    outer: usize,
    /// The current index in the outer dimensions.
    index: Vec<u64>,
    /// Bytes per step of each dimension up to the one cut innermost (empty: no cut).
    strides: Vec<u64>,
    run_len: u64,
    done: bool,
}

impl Iterator for Runs {
    type Item = Range<u64>;

    fn next(&mut self) -> Option<Range<u64>> {
        if self.done {
            return None;
        }
        if self.strides.is_empty() {
            self.done = true;
            return (self.run_len > 0).then_some(0..self.run_len);
        }
        let cut = self.outer;
        let start: u64 = self.index.iter().zip(&self.strides).map(|(i, s)| i * s).sum::<u64>()
            + self.ranges[cut].start * self.strides[cut];
        // The next outer index, last dimension fastest.
        let mut d = self.outer;
        loop {
            if d == 0 {
                self.done = true;
                break;
            }
            d -= 1;
            self.index[d] += 1;
            if self.index[d] < self.ranges[d].end {
                break;
            }
            self.index[d] = self.ranges[d].start;
        }
        Some(start..start + self.run_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slice's bytes gathered by its runs from a tensor whose every byte is its offset (mod 251).
    fn gathered(slice: &Slice, shape: &[u64], element: u64) -> Vec<u8> {
        slice.runs(shape, element).flat_map(|r| r.map(|b| (b % 251) as u8)).collect()
    }

    /// The same bytes picked element by element, as numpy slicing picks them.
    fn picked(slice: &Slice, shape: &[u64], element: u64) -> Vec<u8> {
        let total: u64 = shape.iter().product();
        let mut out = Vec::new();
        for flat in 0..total {
            let mut rest = flat;
            let mut index = vec![0; shape.len()];
            for d in (0..shape.len()).rev() {
                index[d] = rest % shape[d];
                rest /= shape[d];
            }
            if index.iter().zip(&slice.ranges).all(|(i, r)| r.contains(i)) {
                out.extend((flat * element..(flat + 1) * element).map(|b| (b % 251) as u8));
            }
        }
        out
    }

    #[test]
    fn specs_parse_numpy_style_and_bad_ones_are_refused_with_their_code() {
        let shape = [8, 6, 4];
        assert_eq!(parse("2:5", &shape).unwrap().ranges, [2..5, 0..6, 0..4]);
        assert_eq!(parse(":, 1:, :3", &shape).unwrap().ranges, [0..8, 1..6, 0..3]);
        assert_eq!(parse("-3:, :-2", &shape).unwrap().ranges, [5..8, 0..4, 0..4]);
        assert_eq!(parse("", &shape).unwrap().ranges, [0..8, 0..6, 0..4]);
        assert_eq!(parse("3:3", &shape).unwrap().shape(), [0, 6, 4], "an empty slice is a slice");
        assert_eq!(parse("", &[]).unwrap().ranges, [], "a scalar is whole");
        for (spec, code) in [
            ("1", "slice_syntax"),
            ("a:b", "slice_syntax"),
            ("0:4:2", "slice_syntax"),
            (":,:,:,:", "slice_rank"),
            ("0:9", "slice_out_of_bounds"),
            ("-9:", "slice_out_of_bounds"),
            ("5:2", "slice_reversed"),
            ("99999999999999999999:", "slice_syntax"),
        ] {
            assert_eq!(parse(spec, &shape).unwrap_err().code(), code, "{spec}");
        }
    }

    #[test]
    fn shards_split_evenly_and_the_last_takes_the_remainder() {
        let shape = [10, 7];
        let rows: Vec<Range<u64>> = (0..3).map(|r| shard(r, 3, 0, &shape).unwrap().ranges[0].clone()).collect();
        assert_eq!(rows, [0..3, 3..6, 6..10]);
        assert_eq!(shard(1, 2, 1, &shape).unwrap().ranges, [0..10, 3..7]);
        assert_eq!(shard(2, 2, 0, &shape).unwrap_err().code(), "slice_shard");
        assert_eq!(shard(0, 0, 0, &shape).unwrap_err().code(), "slice_shard");
        assert_eq!(shard(0, 2, 2, &shape).unwrap_err().code(), "slice_shard");
    }

    /// A list of one run.
    fn one(run: Range<u64>) -> Vec<Range<u64>> {
        vec![run]
    }

    #[test]
    fn runs_are_maximal_and_gather_what_numpy_would_pick() {
        // Rows of a matrix are one run; columns one run per row; whole tensors one run.
        let rows: Vec<_> = parse("1:3", &[4, 8]).unwrap().runs(&[4, 8], 2).collect();
        assert_eq!(rows, one(16..48));
        let columns: Vec<_> = parse(":,2:4", &[3, 8]).unwrap().runs(&[3, 8], 2).collect();
        assert_eq!(columns, [4..8, 20..24, 36..40]);
        assert_eq!(parse("", &[3, 8]).unwrap().runs(&[3, 8], 4).collect::<Vec<_>>(), one(0..96));
        assert_eq!(parse("1:1", &[3, 8]).unwrap().runs(&[3, 8], 4).count(), 0);
        assert_eq!(parse("", &[]).unwrap().runs(&[], 8).collect::<Vec<_>>(), one(0..8), "a scalar");
        for (spec, shape) in [
            ("1:3,:,2:5", &[4u64, 3, 6][..]),
            (":,1:2,:", &[2, 3, 4]),
            ("0:1,0:1,0:1,1:2", &[2, 2, 2, 2]),
            ("-2:,:-1", &[5, 5]),
            (":3", &[7]),
        ] {
            let slice = parse(spec, shape).unwrap();
            for element in [1, 2, 4, 8] {
                let bytes = gathered(&slice, shape, element);
                assert_eq!(bytes, picked(&slice, shape, element), "{spec} of {shape:?} × {element}");
                assert_eq!(bytes.len() as u64, slice.len(element).unwrap());
            }
        }
    }

    #[test]
    fn an_empty_slice_has_no_runs_whatever_the_other_dimensions() {
        let huge = [0, u64::MAX, u64::MAX];
        let slice = parse("", &huge).unwrap();
        assert_eq!(slice.runs(&huge, 8).count(), 0);
        assert_eq!(slice.runs_within(&huge, 8, 0..0).count(), 0);
        let slice = parse(":,5:5", &[3, u64::MAX]).unwrap();
        assert_eq!(slice.runs(&[3, u64::MAX], 16).count(), 0);
    }

    #[test]
    fn any_part_of_a_slice_is_the_same_part_of_its_gathered_bytes() {
        for (spec, shape) in [("1:3,:,2:5", &[4u64, 3, 6][..]), (":,2:4", &[3, 8]), ("", &[5, 3]), ("2:6", &[9])] {
            let slice = parse(spec, shape).unwrap();
            for element in [1, 2, 8] {
                let bytes = gathered(&slice, shape, element);
                let len = bytes.len() as u64;
                for start in 0..=len {
                    for end in start..=len {
                        let part: Vec<u8> = slice
                            .runs_within(shape, element, start..end)
                            .flat_map(|r| r.map(|b| (b % 251) as u8))
                            .collect();
                        assert_eq!(part, bytes[start as usize..end as usize], "{spec} × {element}: {start}..{end}");
                    }
                }
            }
        }
    }

    #[test]
    fn shard_requests_resolve_like_numpy_dimensions_and_print_as_specs() {
        let shape = [10, 7];
        assert_eq!(shard_spec("2/3", "0", &shape).unwrap().to_string(), "6:10,0:7");
        assert_eq!(shard_spec("0/2", "-1", &shape).unwrap().to_string(), "0:10,0:3");
        assert_eq!(
            parse(&shard_spec("1/2", "1", &shape).unwrap().to_string(), &shape).unwrap().to_string(),
            "0:10,3:7"
        );
        for (shard, dim, code) in [
            ("1", "0", "slice_syntax"),
            ("a/2", "0", "slice_syntax"),
            ("0/2", "x", "slice_syntax"),
            ("0/2", "2", "slice_shard"),
            ("0/2", "-3", "slice_shard"),
            ("2/2", "0", "slice_shard"),
        ] {
            assert_eq!(shard_spec(shard, dim, &shape).unwrap_err().code(), code, "{shard} {dim}");
        }
    }

    #[test]
    fn only_dense_tensors_of_whole_byte_elements_are_sliced() {
        use crate::{ByteOrder, Component, DType, DigestScope, Encoding};
        let data = |dtype, logical: Option<&str>, decoded_length| Component {
            role: "data".into(),
            dtype,
            logical_type: logical.map(str::to_owned),
            offset: 0,
            stored_length: decoded_length,
            encoding: Encoding::Raw,
            decoded_length,
            digest: None,
            digest_scope: DigestScope::Stored,
            byte_order: ByteOrder::Little,
            file: 0,
        };
        let object = |format: &str, components| Object {
            name: "w".into(),
            format: format.into(),
            shape: vec![2, 3],
            components,
            attributes: None,
        };
        let element = |o: &Object| element_bytes(o).map_err(|e| e.code());
        assert_eq!(element(&object("dense", vec![data(DType::BF16, None, 12)])), Ok(2));
        assert_eq!(element(&object("dense", vec![data(DType::F64, Some("complex128"), 96)])), Ok(16));
        assert_eq!(element(&object("dense", vec![data(DType::U8, Some("f8_e4m3fn"), 6)])), Ok(1));
        assert_eq!(element(&object("dense", vec![data(DType::U8, Some("f4_e2m1"), 3)])), Err("slice_sub_byte"));
        assert_eq!(element(&object("dense", vec![data(DType::U8, Some("mx9"), 6)])), Err("slice_unknown_type"));
        assert_eq!(element(&object("dense", vec![data(DType::F32, None, 20)])), Err("slice_not_dense"));
        assert_eq!(element(&object("zt.sparse_csr/1", vec![data(DType::F32, None, 24)])), Err("slice_not_dense"));
    }
}
