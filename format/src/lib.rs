//! The zTensor byte layout, and nothing else: bytes in, typed values out. This crate owns the
//! container framing of every supported generation (`ZTEN0001` legacy, `ZTEN1000` 1.x, v2), turns
//! each into one generation-neutral [`Manifest`], validates it, decodes components and writes
//! files. It does no IO and never touches async code, so the server, the CLI and the fuzzer all
//! share exactly the same rules.
//!
//! Reading is split so that a remote reader fetches only what it needs, whatever does the
//! reading: [`ManifestReads`] names the header and tail reads, then the one read a large
//! manifest may still need, and parses what they brought. [`parse_file`] does it all over a
//! whole file in memory.

#![forbid(unsafe_code)]

mod cbor;
mod container;
pub mod decode;
pub mod delta;
mod error;
pub mod gguf;
pub mod json;
mod model;
pub mod model_signature;
mod read;
pub mod safetensors;
pub mod seekable;
pub mod slice;
pub mod sums;
pub mod v2;
pub mod validate;
pub mod verify;
pub mod view;
mod zt1;

pub use ciborium::Value;
pub(crate) use container::printable;
pub use container::{ALIGNMENT, Container, FileKind, HEADER_LEN, LEGACY_MAGIC, Limits, V1_MAGIC, V2_MAGIC};
pub use error::{FormatError, Location, Result};
/// What a published repository's files say of a block-quantized model, by capability: the file
/// of a quantization tag, the multimodal projector beside it, and a tensor's quantization.
pub use gguf::{
    GgmlType, file_of_quantization_tag, projector_file, quantized_object as quantization_of,
    quantized_type as quantization_of_type,
};
pub use model::{
    ByteOrder, Component, DType, Digest, DigestScope, Encoding, Manifest, Object, Shard, known_logical_type,
};
pub use read::{Located, MAX_TRAILER_LEN, ManifestReads, parse_file};
/// The 1.2 writer, which lives with the rest of the zTensor 1.x container in `zt1`.
pub use zt1::write;

#[cfg(test)]
mod tests;
