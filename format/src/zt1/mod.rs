//! The zTensor 0.1 (`ZTEN0001`) and 1.x (`ZTEN1000`) containers: the [`trailer`] that locates
//! the manifest, the 0.1 CBOR array index ([`legacy`]) and the 1.x CBOR map manifest
//! ([`manifest`]), both read into the generation-neutral model and held to the structural rules
//! of [`validate`](crate::validate), and the 1.2 [`write`]r. Their magics live with the other
//! framing in `container`.

mod legacy;
mod manifest;
mod trailer;
pub mod write;

use std::ops::Range;

pub(crate) use self::trailer::manifest_span;
use crate::{Container, Limits, Manifest, Result, cbor, validate};

/// Decodes and structurally validates a 0.1 or 1.x manifest found at `span` in a file of
/// `file_len` bytes.
pub(crate) fn parse(
    container: Container,
    bytes: &[u8],
    span: Range<u64>,
    file_len: u64,
    limits: &Limits,
) -> Result<Manifest> {
    let value = cbor::decode(bytes, limits, cbor::Rules::ANY)?;
    let manifest = match container {
        Container::Legacy01 => legacy::parse(value, span, file_len)?,
        _ => manifest::parse(value, span, file_len)?,
    };
    validate::check_structure(&manifest, limits)?;
    Ok(manifest)
}
