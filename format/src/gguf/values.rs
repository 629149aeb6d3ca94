//! GGUF metadata values: their types ([`ValueType`]), the values as kept ([`MetaValue`]) and
//! the key-values a header holds ([`KeyValue`]).

use crate::Value;

/// A metadata value's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    pub(super) fn of(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// As the `gguf` package names it (`UINT32`).
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "UINT8",
            I8 => "INT8",
            U16 => "UINT16",
            I16 => "INT16",
            U32 => "UINT32",
            I32 => "INT32",
            F32 => "FLOAT32",
            Bool => "BOOL",
            String => "STRING",
            Array => "ARRAY",
            U64 => "UINT64",
            I64 => "INT64",
            F64 => "FLOAT64",
        }
    }

    pub(super) fn fixed_width(self) -> Option<u64> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }
}

/// A metadata value as kept: scalars and short arrays whole, long arrays as their element type
/// and length ([`KEPT_ARRAY`](super::KEPT_ARRAY)).
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    Int(i128),
    Float(f64),
    Bool(bool),
    Text(String),
    Array(Vec<MetaValue>),
    /// An array too long to keep: its element type and length.
    LongArray {
        of: ValueType,
        len: u64,
    },
}

impl MetaValue {
    /// As a manifest attribute: a long array as `{"array_of": TYPE, "length": N}`.
    pub fn to_value(&self) -> Value {
        match self {
            MetaValue::Int(i) => match i64::try_from(*i) {
                Ok(v) => Value::Integer(v.into()),
                Err(_) => Value::Integer(u64::try_from(*i).unwrap_or(u64::MAX).into()),
            },
            MetaValue::Float(f) => Value::Float(*f),
            MetaValue::Bool(b) => Value::Bool(*b),
            MetaValue::Text(t) => Value::Text(t.clone()),
            MetaValue::Array(items) => Value::Array(items.iter().map(MetaValue::to_value).collect()),
            MetaValue::LongArray { of, len } => Value::Map(vec![
                (Value::Text("array_of".into()), Value::Text(of.name().into())),
                (Value::Text("length".into()), Value::Integer((*len).into())),
            ]),
        }
    }

    pub(super) fn as_u64(&self) -> Option<u64> {
        match self {
            MetaValue::Int(i) => u64::try_from(*i).ok(),
            _ => None,
        }
    }
}

/// One metadata key-value.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyValue {
    pub key: String,
    pub value_type: ValueType,
    pub value: MetaValue,
}
