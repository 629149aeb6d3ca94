//! safetensors files (Hugging Face's format), read purely: an 8-byte little-endian header
//! length, a JSON header of at most 100,000,000 bytes (the safetensors library's bound) mapping
//! each tensor name to its dtype, shape and `data_offsets`, an optional `__metadata__` of
//! strings, and the tensors' bytes tiling the rest of the file with no gap or overlap. Each
//! tensor becomes what a zTensor dense object's `data` component says: a storage dtype, a
//! logical type where safetensors has one zTensor names (bool, f8, f4, complex), and the byte
//! range. The rules are the safetensors library's (`Metadata::validate`), each failure named
//! with the tensor it is about; names must also be unique, which a JSON map does not promise.
//! A sharded checkpoint's `*.safetensors.index.json` (`metadata`, `weight_map`) is read here
//! too, and [`assemble`] makes one [`Manifest`](crate::Manifest) of it and its shards' headers, holding every
//! tensor to the shard the index names.

mod dtypes;
mod entries;
mod header;
mod index;

#[cfg(test)]
mod tests;

pub use self::dtypes::{DTYPES, Mapped, mapped};
pub use self::header::{
    Header, HeaderReads, LENGTH_FIELD, MAX_HEADER_LEN, Tensor, file_around, header_span, parse, parse_file,
};
pub use self::index::{Index, MAX_INDEX_LEN, assemble, parse_checkpoint, parse_index};
