//! The byte reader of a GGUF header: a [`Cursor`] over a prefix of the file, reading
//! little-endian fields, strings and metadata values, each bounded before it is read; and
//! how a read fails ([`HeaderRead`]: invalid, or past the bytes given).

use super::limits::{KEPT_ARRAY, MAX_ARRAY, MAX_ARRAY_DEPTH, MAX_HEADER, MAX_KEPT_VALUES, MAX_STRING};
use super::values::{MetaValue, ValueType};
use crate::FormatError;

pub(super) fn gguf_error(code: &'static str, at: u64, detail: String) -> FormatError {
    FormatError::Gguf { code, at, detail }
}

/// Why a header could not be parsed from the bytes given.
#[derive(Debug, Clone, PartialEq)]
pub enum HeaderRead {
    /// The header runs past the bytes given: read the file's first `needed` bytes at least.
    NeedMore {
        needed: u64,
    },
    Invalid(FormatError),
}

impl From<FormatError> for HeaderRead {
    fn from(e: FormatError) -> Self {
        HeaderRead::Invalid(e)
    }
}

pub(super) type Parsed<T> = std::result::Result<T, HeaderRead>;

/// Reads little-endian fields from a prefix of a file of `file_len` bytes.
pub(super) struct Cursor<'b> {
    pub(super) bytes: &'b [u8],
    pub(super) at: u64,
    pub(super) file_len: u64,
    /// Metadata values kept so far ([`MAX_KEPT_VALUES`]).
    pub(super) kept: u64,
}

impl<'b> Cursor<'b> {
    pub(super) fn take(&mut self, n: u64, what: &str) -> Parsed<&'b [u8]> {
        let end = self.at.checked_add(n).filter(|&end| end <= self.file_len).ok_or_else(|| {
            gguf_error(
                "gguf_truncated",
                self.at,
                format!("{what} ({n} bytes) runs past the end of the {}-byte file", self.file_len),
            )
        })?;
        if end > MAX_HEADER {
            return Err(gguf_error(
                "gguf_header_too_large",
                self.at,
                format!("the header runs past {MAX_HEADER} bytes"),
            )
            .into());
        }
        if end > self.bytes.len() as u64 {
            return Err(HeaderRead::NeedMore { needed: end });
        }
        let taken = &self.bytes[self.at as usize..end as usize];
        self.at = end;
        Ok(taken)
    }

    pub(super) fn u32(&mut self, what: &str) -> Parsed<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().expect("4 bytes")))
    }

    pub(super) fn u64(&mut self, what: &str) -> Parsed<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().expect("8 bytes")))
    }

    /// A `gguf_string_t` of at most `max` bytes, valid UTF-8.
    pub(super) fn string(&mut self, what: &str, max: u64) -> Parsed<String> {
        Ok(self.str(what, max)?.to_owned())
    }

    /// A `gguf_string_t` of at most `max` bytes, valid UTF-8, as it lies in the bytes read.
    fn str(&mut self, what: &str, max: u64) -> Parsed<&'b str> {
        let at = self.at;
        let len = self.u64(what)?;
        if len > max {
            return Err(gguf_error(
                "gguf_string_too_long",
                at,
                format!("{what} is {len} bytes, over the {max}-byte limit"),
            )
            .into());
        }
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes)
            .map_err(|_| gguf_error("gguf_string_utf8", at, format!("{what} is not valid UTF-8")).into())
    }

    /// A metadata value of type `value_type`, arrays `depth` deep so far, read and checked;
    /// returned when it is to be `kept` (an element of a long array is only checked).
    pub(super) fn value(
        &mut self,
        value_type: ValueType,
        key: &str,
        depth: usize,
        keep: bool,
    ) -> Parsed<Option<MetaValue>> {
        let at = self.at;
        let fixed = |c: &mut Self, n: u64| -> Parsed<[u8; 8]> {
            let mut out = [0u8; 8];
            out[..n as usize].copy_from_slice(c.take(n, key)?);
            Ok(out)
        };
        let value = match value_type {
            ValueType::U8 => MetaValue::Int(fixed(self, 1)?[0].into()),
            ValueType::I8 => MetaValue::Int((fixed(self, 1)?[0] as i8).into()),
            ValueType::U16 => MetaValue::Int(u16::from_le_bytes(fixed(self, 2)?[..2].try_into().expect("2")).into()),
            ValueType::I16 => MetaValue::Int(i16::from_le_bytes(fixed(self, 2)?[..2].try_into().expect("2")).into()),
            ValueType::U32 => MetaValue::Int(u32::from_le_bytes(fixed(self, 4)?[..4].try_into().expect("4")).into()),
            ValueType::I32 => MetaValue::Int(i32::from_le_bytes(fixed(self, 4)?[..4].try_into().expect("4")).into()),
            ValueType::F32 => MetaValue::Float(f32::from_le_bytes(fixed(self, 4)?[..4].try_into().expect("4")).into()),
            ValueType::U64 => MetaValue::Int(u64::from_le_bytes(fixed(self, 8)?).into()),
            ValueType::I64 => MetaValue::Int(i64::from_le_bytes(fixed(self, 8)?).into()),
            ValueType::F64 => MetaValue::Float(f64::from_le_bytes(fixed(self, 8)?)),
            ValueType::Bool => match fixed(self, 1)?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                other => {
                    return Err(
                        gguf_error("gguf_bool", at, format!("{key}: a bool is 0 or 1, not {other:#04x}")).into()
                    );
                }
            },
            ValueType::String => {
                let text = self.str(key, MAX_STRING)?;
                if !keep {
                    return Ok(None);
                }
                MetaValue::Text(text.to_owned())
            }
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    let detail = format!("{key}: arrays nest deeper than {MAX_ARRAY_DEPTH} levels");
                    return Err(gguf_error("gguf_array_too_deep", at, detail).into());
                }
                let type_id = self.u32(key)?;
                let of = ValueType::of(type_id).ok_or_else(|| {
                    gguf_error("gguf_value_type", at, format!("{key}: array of unknown value type {type_id}"))
                })?;
                let len = self.u64(key)?;
                if len > MAX_ARRAY {
                    let detail = format!("{key}: an array of {len} elements, over the {MAX_ARRAY}-element limit");
                    return Err(gguf_error("gguf_array_too_long", at, detail).into());
                }
                if let Some(width) = of.fixed_width() {
                    // Fixed-width elements: read and checked at once (bools must be 0 or 1).
                    let whole = len * width;
                    if len > KEPT_ARRAY {
                        let bytes = self.take(whole, key)?;
                        if of == ValueType::Bool {
                            if let Some(bad) = bytes.iter().position(|&b| b > 1) {
                                let detail = format!("{key}: bool element {bad} is {:#04x}, not 0 or 1", bytes[bad]);
                                return Err(gguf_error("gguf_bool", at, detail).into());
                            }
                        }
                        return Ok(keep.then_some(MetaValue::LongArray { of, len }));
                    }
                }
                // Each element takes at least one byte: a count beyond the file is refused
                // before anything is kept.
                if len > self.file_len.saturating_sub(self.at) {
                    let detail = format!("{key}: {len} elements cannot fit in the rest of the file");
                    return Err(gguf_error("gguf_truncated", at, detail).into());
                }
                let keep_items = keep && len <= KEPT_ARRAY && self.kept + len <= MAX_KEPT_VALUES;
                let mut items = Vec::with_capacity(if keep_items { len as usize } else { 0 });
                for _ in 0..len {
                    items.extend(self.value(of, key, depth + 1, keep_items)?);
                }
                if keep_items { MetaValue::Array(items) } else { MetaValue::LongArray { of, len } }
            }
        };
        if !keep {
            return Ok(None);
        }
        self.kept += 1;
        Ok(Some(value))
    }
}
