//! GGUF files (ggml's format: llama.cpp, Ollama, LM Studio), read purely, versions 2 and 3
//! as ggml's `docs/gguf.md` states them: the `GGUF` magic, the version, the tensor and
//! key-value counts, the metadata key-values, the tensor infos, padding to `general.alignment`,
//! then the tensor data. Every rule the specification states is checked, every count, length
//! and offset bounded before anything is read or allocated ([`MAX_TENSORS`] and the other
//! limits), so a hostile file gets a precise reason. Tensors become objects: the dense GGML
//! types (F32, F16, BF16, F64, I8 … I64) as `dense` tensors of the zTensor dtype, the
//! block-quantized ones as objects of the layout `ztensor` 2.x's GGUF reader names
//! (`gguf.q4_k/1`) whose one `data` component is the raw blocks (logical type `gguf.q4_k`,
//! the GGML type and block geometry in the object's attributes). Shapes
//! are written row-major, outermost first, as numpy and the `gguf` reader show them (GGUF lists
//! `ne[0]`, the innermost, first). A split model (`name-00001-of-00003.gguf`, the `split.*`
//! keys) is [`assemble`]d into one manifest.

mod builder;
mod cursor;
mod files;
mod header;
mod limits;
mod tensors;
mod types;
mod values;

#[cfg(test)]
mod tests;

pub use self::builder::{FileBuilder, f16_bytes, quantize_q8_0, string_bytes};
pub use self::cursor::HeaderRead;
pub use self::files::{
    assemble, file_of_quantization_tag, manifest_of, parse_model, projector_file, split_file_name, split_name,
};
pub use self::header::{Header, HeaderReads, SplitPart, parse_file, parse_header};
pub use self::limits::{
    DEFAULT_ALIGNMENT, KEPT_ARRAY, MAGIC, MAX_ARRAY, MAX_ARRAY_DEPTH, MAX_DIMS, MAX_HEADER, MAX_KEPT_VALUES, MAX_KEY,
    MAX_KVS, MAX_STRING, MAX_TENSOR_NAME, MAX_TENSORS,
};
pub use self::tensors::TensorInfo;
pub use self::types::{
    GgmlType, TYPES, declared_logical_type, ggml_type, ggml_type_named, quantized_object, quantized_type,
};
pub use self::values::{KeyValue, MetaValue, ValueType};
