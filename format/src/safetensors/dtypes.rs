//! The safetensors dtypes: every one the safetensors library defines ([`DTYPES`]), each with
//! the zTensor storage dtype, logical type and bits per element it is served as.

use crate::DType;

/// How zTensor stores one safetensors dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapped {
    /// The safetensors name (`BF16`, `F8_E4M3`, …).
    pub name: &'static str,
    pub dtype: DType,
    /// The zTensor logical type, where the storage dtype alone does not say what the bytes are.
    pub logical_type: Option<&'static str>,
    /// Bits per element (sub-byte types pack several elements per byte).
    pub bits: u64,
}

/// Every dtype the safetensors library (0.8) defines. F6 types have no zTensor logical type
/// of their own: they are served as the bytes they are, labelled with their safetensors name.
pub const DTYPES: [Mapped; 22] = [
    Mapped { name: "BOOL", dtype: DType::U8, logical_type: Some("bool"), bits: 8 },
    Mapped { name: "U8", dtype: DType::U8, logical_type: None, bits: 8 },
    Mapped { name: "I8", dtype: DType::I8, logical_type: None, bits: 8 },
    Mapped { name: "U16", dtype: DType::U16, logical_type: None, bits: 16 },
    Mapped { name: "I16", dtype: DType::I16, logical_type: None, bits: 16 },
    Mapped { name: "U32", dtype: DType::U32, logical_type: None, bits: 32 },
    Mapped { name: "I32", dtype: DType::I32, logical_type: None, bits: 32 },
    Mapped { name: "U64", dtype: DType::U64, logical_type: None, bits: 64 },
    Mapped { name: "I64", dtype: DType::I64, logical_type: None, bits: 64 },
    Mapped { name: "F16", dtype: DType::F16, logical_type: None, bits: 16 },
    Mapped { name: "BF16", dtype: DType::BF16, logical_type: None, bits: 16 },
    Mapped { name: "F32", dtype: DType::F32, logical_type: None, bits: 32 },
    Mapped { name: "F64", dtype: DType::F64, logical_type: None, bits: 64 },
    Mapped { name: "C64", dtype: DType::F32, logical_type: Some("complex64"), bits: 64 },
    Mapped { name: "F8_E4M3", dtype: DType::U8, logical_type: Some("f8_e4m3fn"), bits: 8 },
    Mapped { name: "F8_E5M2", dtype: DType::U8, logical_type: Some("f8_e5m2"), bits: 8 },
    Mapped { name: "F8_E8M0", dtype: DType::U8, logical_type: Some("f8_e8m0"), bits: 8 },
    Mapped { name: "F8_E4M3FNUZ", dtype: DType::U8, logical_type: Some("f8_e4m3fnuz"), bits: 8 },
    Mapped { name: "F8_E5M2FNUZ", dtype: DType::U8, logical_type: Some("f8_e5m2fnuz"), bits: 8 },
    Mapped { name: "F4", dtype: DType::U8, logical_type: Some("f4_e2m1"), bits: 4 },
    Mapped { name: "F6_E2M3", dtype: DType::U8, logical_type: Some("F6_E2M3"), bits: 6 },
    Mapped { name: "F6_E3M2", dtype: DType::U8, logical_type: Some("F6_E3M2"), bits: 6 },
];

/// How zTensor stores the safetensors dtype `name`; `None` for a name safetensors does not define.
pub fn mapped(name: &str) -> Option<Mapped> {
    DTYPES.iter().copied().find(|m| m.name == name)
}
