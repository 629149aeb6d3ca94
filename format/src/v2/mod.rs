//! The zTensor v2 container (`89 5A 54 32 0D 0A 1A 0A`, spec "Draft 4"): the 40-byte footer
//! and its manifest hash, the deterministic-CBOR manifest of objects, parts and shards read
//! into the generation-neutral model, and every rule of the spec's validation summary (§3.6):
//! names, ranks, blob alignment and bounds per file, identical-or-disjoint blobs, logical
//! types, and the metadata rules of the layouts it interprets (`dense`, `zt.sparse_csr/1`,
//! `zt.sparse_coo/1`, `zt.quant_group/1`). Other layouts, logical types and encodings are kept
//! as declared and served structurally, never guessed at. Data rules (bool bytes, packed
//! nibbles, sparse index structure) need the decoded bytes: they are checked here, through
//! [`validate::check_content`](crate::validate::check_content).

mod blobs;
mod container;
mod content;
mod layouts;
mod manifest;
mod plan;

#[cfg(test)]
mod tests;

pub use self::container::{BLOB_ALIGNMENT, FOOTER_LEN, Footer, VERSION, check_manifest_hash, file_around};
pub(super) use self::content::check_content;
pub use self::layouts::{LogicalSize, logical_size};
pub(super) use self::manifest::parse;
pub use self::manifest::{
    MAX_DEPTH, MAX_NAME_LEN, MAX_RANK, MAX_SHARD_NAME_LEN, ZSTD_SEEKABLE, check_shard_name, parse_digest,
    positional_shard_name,
};
pub use self::plan::{deterministic_cbor, plan};
