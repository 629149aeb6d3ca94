//! The GGML tensor types: their GGUF ids, names and block geometry ([`TYPES`]), the lookups
//! by id and name, and which objects are block-quantized GGUF tensors.

use crate::{Component, DType, Object};

/// A GGML tensor type: its GGUF id, name and block geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlType {
    pub id: u32,
    /// As ggml names it (`Q4_K`).
    pub name: &'static str,
    /// Elements per block (1 for the dense types).
    pub block_elements: u64,
    /// Bytes per block.
    pub block_bytes: u64,
    /// The zTensor dtype of a dense type's elements; `None` for a block-quantized type.
    pub dense: Option<DType>,
}

impl GgmlType {
    /// The logical type a block-quantized tensor's bytes carry (`gguf.q4_k`).
    pub fn logical_type(&self) -> String {
        format!("gguf.{}", self.name.to_ascii_lowercase())
    }

    /// The object layout of a block-quantized tensor, as `ztensor` 2.x names it (`gguf.q4_k/1`).
    pub fn layout(&self) -> String {
        format!("{}/1", self.logical_type())
    }

    /// Bytes `elements` elements take, or `None` when they are not whole blocks or overflow.
    pub fn bytes_of(&self, elements: u64) -> Option<u64> {
        (elements % self.block_elements == 0).then(|| (elements / self.block_elements).checked_mul(self.block_bytes))?
    }
}

const QK_K: u64 = 256;

const fn dense(id: u32, name: &'static str, dtype: DType, width: u64) -> GgmlType {
    GgmlType { id, name, block_elements: 1, block_bytes: width, dense: Some(dtype) }
}

const fn blocks(id: u32, name: &'static str, block_elements: u64, block_bytes: u64) -> GgmlType {
    GgmlType { id, name, block_elements, block_bytes, dense: None }
}

/// Every GGML type a GGUF file may hold, with the geometry of ggml's `type_traits` (the `gguf`
/// package's `GGML_QUANT_SIZES`).
pub const TYPES: [GgmlType; 34] = [
    dense(0, "F32", DType::F32, 4),
    dense(1, "F16", DType::F16, 2),
    blocks(2, "Q4_0", 32, 2 + 16),
    blocks(3, "Q4_1", 32, 2 + 2 + 16),
    blocks(6, "Q5_0", 32, 2 + 4 + 16),
    blocks(7, "Q5_1", 32, 2 + 2 + 4 + 16),
    blocks(8, "Q8_0", 32, 2 + 32),
    blocks(9, "Q8_1", 32, 4 + 4 + 32),
    blocks(10, "Q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4),
    blocks(11, "Q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12),
    blocks(12, "Q4_K", QK_K, 2 + 2 + QK_K / 2 + 12),
    blocks(13, "Q5_K", QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12),
    blocks(14, "Q6_K", QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16),
    blocks(15, "Q8_K", QK_K, 4 + QK_K + QK_K / 8),
    blocks(16, "IQ2_XXS", QK_K, 2 + QK_K / 4),
    blocks(17, "IQ2_XS", QK_K, 2 + QK_K / 4 + QK_K / 32),
    blocks(18, "IQ3_XXS", QK_K, 2 + QK_K / 4 + QK_K / 8),
    blocks(19, "IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16),
    blocks(20, "IQ4_NL", 32, 2 + 16),
    blocks(21, "IQ3_S", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4),
    blocks(22, "IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 16),
    blocks(23, "IQ4_XS", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64),
    dense(24, "I8", DType::I8, 1),
    dense(25, "I16", DType::I16, 2),
    dense(26, "I32", DType::I32, 4),
    dense(27, "I64", DType::I64, 8),
    dense(28, "F64", DType::F64, 8),
    blocks(29, "IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32),
    dense(30, "BF16", DType::BF16, 2),
    blocks(34, "TQ1_0", QK_K, 2 + 4 * 13),
    blocks(35, "TQ2_0", QK_K, 2 + 64),
    blocks(39, "MXFP4", 32, 1 + 16),
    blocks(40, "NVFP4", 64, 4 + 32),
    blocks(41, "Q1_0", 128, 2 + 16),
];

/// The GGML type of GGUF id `id`.
pub fn ggml_type(id: u32) -> Option<GgmlType> {
    TYPES.iter().copied().find(|t| t.id == id)
}

/// The GGML type named `name` (`Q4_K`), any case.
pub fn ggml_type_named(name: &str) -> Option<GgmlType> {
    TYPES.iter().copied().find(|t| t.name.eq_ignore_ascii_case(name))
}

/// The GGML type of a block-quantized tensor's logical type (`gguf.q4_k`).
pub fn quantized_type(logical_type: &str) -> Option<GgmlType> {
    logical_type.strip_prefix("gguf.").and_then(ggml_type_named).filter(|t| t.dense.is_none())
}

/// The GGML type of `object`, when it is a block-quantized GGUF tensor: its layout
/// `gguf.<type>/1`, whether read from a GGUF file (its component's logical type `gguf.<type>`)
/// or from a zTensor copy of one (no logical type: the layout names the bytes).
pub fn quantized_object(object: &Object) -> Option<GgmlType> {
    let ggml = object.format.strip_prefix("gguf.")?.strip_suffix("/1").and_then(ggml_type_named)?;
    let logical = object.components.first()?.logical_type.as_deref();
    (ggml.dense.is_none() && logical.is_none_or(|l| l == ggml.logical_type())).then_some(ggml)
}

/// The logical type a copy of `component` of `object` written as zTensor declares: none for a
/// GGUF block-quantized tensor, whose layout (`gguf.q4_k/1`) already names its bytes, as
/// `ztensor` 2.x's GGUF reader projects them; the component's own for any other.
pub fn declared_logical_type<'o>(object: &Object, component: &'o Component) -> Option<&'o str> {
    match quantized_object(object) {
        Some(_) => None,
        None => component.logical_type.as_deref(),
    }
}

/// Types ggml once had and removed from GGUF files: named in the refusal.
pub(super) fn removed_type(id: u32) -> Option<&'static str> {
    match id {
        4 => Some("Q4_2"),
        5 => Some("Q4_3"),
        31 => Some("Q4_0_4_4"),
        32 => Some("Q4_0_4_8"),
        33 => Some("Q4_0_8_8"),
        36 => Some("IQ4_NL_4_4"),
        37 => Some("IQ4_NL_4_8"),
        38 => Some("IQ4_NL_8_8"),
        _ => None,
    }
}
