//! The GGUF constants: the magic, the default alignment, and the limits every count, length
//! and nesting of a header is held to before anything is read past it or allocated for it.

/// The magic every GGUF file starts with.
pub const MAGIC: &[u8; 4] = b"GGUF";
/// The alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a tensor has (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Longest tensor name, in bytes (the specification's 64).
pub const MAX_TENSOR_NAME: u64 = 64;
/// Longest metadata key, in bytes (the specification's 65535).
pub const MAX_KEY: u64 = 65_535;
/// Longest metadata string value, in bytes (a chat template is tens of KiB).
pub const MAX_STRING: u64 = 16 << 20;
/// Most elements of one metadata array (a tokenizer's vocabulary is about 10^5, its merges 10^6).
pub const MAX_ARRAY: u64 = 1 << 24;
/// Deepest nesting of metadata arrays (arrays of arrays of …).
pub const MAX_ARRAY_DEPTH: usize = 4;
/// Most tensors in one file.
pub const MAX_TENSORS: u64 = 1 << 20;
/// Most metadata key-values in one file.
pub const MAX_KVS: u64 = 1 << 20;
/// Longest header (everything before the tensor data) read, in bytes.
pub const MAX_HEADER: u64 = 1 << 30;
/// Arrays longer than this appear in a manifest's attributes as their type and length only.
pub const KEPT_ARRAY: u64 = 64;
/// Values kept in a header's attributes in all (scalars, strings, the elements of short arrays):
/// arrays past it are kept as their type and length only, so arrays of short arrays cannot
/// make the kept metadata many times larger than the file.
pub const MAX_KEPT_VALUES: u64 = 1 << 16;
