//! A writer of GGUF files by hand, rule-breaking ones included, for the tests, the demo models
//! and the fuzzer's seeds; and the element encodings they need (Q8_0 blocks, F16, strings).
//! Kept apart from the reader, which never uses it.

use super::limits::{DEFAULT_ALIGNMENT, MAGIC};
use super::types::ggml_type;

/// Writes GGUF files by hand, rule-breaking ones included: how the tests and the fuzzer's
/// seeds build them. Fields are public so a test can break any of them.
#[derive(Debug, Clone)]
pub struct FileBuilder {
    pub magic: [u8; 4],
    pub version: u32,
    /// Each key, its value type id and its value's bytes.
    pub kvs: Vec<(String, u32, Vec<u8>)>,
    /// Each tensor's name, `ne` (innermost first), GGML type id and offset in the data.
    pub tensors: Vec<(String, Vec<u64>, u32, u64)>,
    /// The counts written, when not the true ones.
    pub counts: Option<(u64, u64)>,
    /// Where the data starts is padded to this.
    pub alignment: u64,
    /// The byte the header is padded with.
    pub padding: u8,
    pub data: Vec<u8>,
}

/// `values` as Q8_0 blocks, as ggml's reference quantizer (and the `gguf` package's) makes them:
/// per 32 values, the scale `d = max|x| / 127` as f16, then each `round(x / d)` as an i8.
/// `values.len()` must be a multiple of 32.
pub fn quantize_q8_0(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() / 32 * 34);
    for block in values.chunks_exact(32) {
        let max = block.iter().fold(0f32, |m, x| m.max(x.abs()));
        let d = max / 127.0;
        let inverse = if d == 0.0 { 0.0 } else { 1.0 / d };
        out.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
        out.extend(block.iter().map(|x| (x * inverse).round() as i8 as u8));
    }
    out
}

/// `values` as F16 elements (GGML type F16), each rounded to the nearest f16.
pub fn f16_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|x| half::f16::from_f32(*x).to_le_bytes()).collect()
}

/// A `gguf_string_t` of `bytes`.
pub fn string_bytes(bytes: &[u8]) -> Vec<u8> {
    let mut out = (bytes.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(bytes);
    out
}

impl FileBuilder {
    /// A version 3 file of architecture `arch`, with no tensors yet.
    pub fn new(arch: &str) -> FileBuilder {
        FileBuilder {
            magic: *MAGIC,
            version: 3,
            kvs: Vec::new(),
            tensors: Vec::new(),
            counts: None,
            alignment: DEFAULT_ALIGNMENT,
            padding: 0,
            data: Vec::new(),
        }
        .kv("general.architecture", 8, string_bytes(arch.as_bytes()))
    }

    /// Adds a key-value of type id `value_type` whose value is `value`'s bytes.
    pub fn kv(mut self, key: &str, value_type: u32, value: Vec<u8>) -> FileBuilder {
        self.kvs.push((key.to_owned(), value_type, value));
        self
    }

    pub fn kv_u32(self, key: &str, value: u32) -> FileBuilder {
        self.kv(key, 4, value.to_le_bytes().to_vec())
    }

    /// Makes the file part `no` (0-based) of a split model of `count` parts and `tensors`
    /// tensors in all, as `gguf-split` writes the `split.*` keys.
    pub fn split(self, no: u16, count: u16, tensors: i32) -> FileBuilder {
        self.kv("split.no", 2, no.to_le_bytes().to_vec()).kv("split.count", 2, count.to_le_bytes().to_vec()).kv(
            "split.tensors.count",
            5,
            tensors.to_le_bytes().to_vec(),
        )
    }

    /// Adds a tensor of type `type_id` and dimensions `ne` (innermost first) whose data is
    /// placed after the data so far, aligned, and filled with a pattern.
    pub fn tensor(self, name: &str, ne: &[u64], type_id: u32) -> FileBuilder {
        let t = ggml_type(type_id).expect("a known type");
        let len = t.bytes_of(ne.iter().product()).expect("whole blocks");
        self.tensor_bytes(name, ne, type_id, (0..len).map(|i| (i.wrapping_mul(31) % 251) as u8).collect())
    }

    /// Adds a tensor as [`tensor`](Self::tensor) does, its data `bytes`.
    pub fn tensor_bytes(mut self, name: &str, ne: &[u64], type_id: u32, bytes: Vec<u8>) -> FileBuilder {
        let offset = (self.data.len() as u64).div_ceil(self.alignment) * self.alignment;
        self.data.resize(offset as usize, 0);
        self.data.extend(bytes);
        self.tensors.push((name.to_owned(), ne.to_vec(), type_id, offset));
        self
    }

    /// The file's bytes.
    pub fn build(&self) -> Vec<u8> {
        let mut out = self.magic.to_vec();
        out.extend_from_slice(&self.version.to_le_bytes());
        let (tensors, kvs) = self.counts.unwrap_or((self.tensors.len() as u64, self.kvs.len() as u64));
        out.extend_from_slice(&tensors.to_le_bytes());
        out.extend_from_slice(&kvs.to_le_bytes());
        for (key, value_type, value) in &self.kvs {
            out.extend(string_bytes(key.as_bytes()));
            out.extend_from_slice(&value_type.to_le_bytes());
            out.extend_from_slice(value);
        }
        for (name, ne, type_id, offset) in &self.tensors {
            out.extend(string_bytes(name.as_bytes()));
            out.extend_from_slice(&(ne.len() as u32).to_le_bytes());
            for d in ne {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&type_id.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
        }
        let start = (out.len() as u64).div_ceil(self.alignment) * self.alignment;
        out.resize(start as usize, self.padding);
        out.extend_from_slice(&self.data);
        out
    }
}
