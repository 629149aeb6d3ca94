//! Bounded CBOR decoding and strict field access. A pre-scan walks the item headers with
//! `ciborium-ll` before any tree is built, so a hostile manifest is refused for its depth, item
//! count, declared lengths or trailing bytes without allocating for what it merely claims;
//! only then does `ciborium` build the `Value` tree, whose maps are checked for duplicate keys.

use std::collections::HashSet;

use ciborium::Value;
use ciborium_ll::{Decoder, Header};

use super::{FormatError, Limits, Result};

/// Decodes exactly one CBOR item filling `bytes`, within `limits`.
pub(super) fn decode(bytes: &[u8], limits: &Limits) -> Result<Value> {
    prescan(bytes, limits)?;
    let value: Value = ciborium::de::from_reader_with_recursion_limit(bytes, limits.max_cbor_depth + 1)
        .map_err(|e| match e {
            ciborium::de::Error::RecursionLimitExceeded => FormatError::CborTooDeep { limit: limits.max_cbor_depth },
            ciborium::de::Error::Syntax(offset) => FormatError::CborInvalid { offset, detail: "syntax error".into() },
            ciborium::de::Error::Semantic(offset, detail) => {
                FormatError::CborInvalid { offset: offset.unwrap_or(0), detail }
            }
            ciborium::de::Error::Io(e) => FormatError::CborInvalid { offset: 0, detail: format!("{e:?}") },
        })?;
    check_duplicate_keys(&value, "manifest")?;
    Ok(value)
}

/// What an open container still expects.
enum Open {
    /// A definite array or map (maps count keys and values separately), or a tag's one item.
    Items(u64),
    /// An indefinite array or map, closed by a break.
    Indefinite,
    /// An indefinite byte or text string: definite chunks of the same major type, then a break.
    Chunks { text: bool },
}

fn prescan(bytes: &[u8], limits: &Limits) -> Result<()> {
    let mut decoder = Decoder::from(bytes);
    let mut open: Vec<Open> = Vec::new();
    let mut items: u64 = 0;
    let mut scratch = [0u8; 4096];
    loop {
        let offset = decoder.offset();
        let remaining = (bytes.len() - offset) as u64;
        let header = decoder.pull().map_err(|e| cbor_error(e, offset))?;
        items += 1;
        if items > limits.max_cbor_items {
            return Err(FormatError::CborTooManyItems { limit: limits.max_cbor_items });
        }
        if let Some(Open::Chunks { text }) = open.last() {
            let text = *text;
            match header {
                Header::Break => {
                    open.pop();
                    if finish_item(&mut open) {
                        break;
                    }
                    continue;
                }
                Header::Bytes(Some(len)) if !text => skip(&mut decoder, len, offset, bytes.len(), &mut scratch)?,
                Header::Text(Some(len)) if text => skip(&mut decoder, len, offset, bytes.len(), &mut scratch)?,
                _ => {
                    return Err(FormatError::CborInvalid {
                        offset,
                        detail: "indefinite string holds something other than a definite chunk".into(),
                    });
                }
            }
            continue;
        }
        let completes = match header {
            Header::Positive(_) | Header::Negative(_) | Header::Float(_) | Header::Simple(_) => true,
            Header::Tag(_) => {
                open.push(Open::Items(1));
                false
            }
            Header::Break => match open.last() {
                Some(Open::Indefinite) => {
                    open.pop();
                    true
                }
                _ => return Err(FormatError::CborInvalid { offset, detail: "unexpected break".into() }),
            },
            Header::Bytes(Some(len)) | Header::Text(Some(len)) => {
                skip(&mut decoder, len, offset, bytes.len(), &mut scratch)?;
                true
            }
            Header::Bytes(None) => {
                open.push(Open::Chunks { text: false });
                false
            }
            Header::Text(None) => {
                open.push(Open::Chunks { text: true });
                false
            }
            Header::Array(Some(n)) | Header::Map(Some(n)) => {
                let per_entry = if matches!(header, Header::Map(_)) { 2 } else { 1 };
                let count = (n as u64).checked_mul(per_entry).unwrap_or(u64::MAX);
                // Every item takes at least one byte, so a count above what remains is a lie.
                if count > remaining {
                    return Err(FormatError::CborLengthBeyondInput { offset, declared: n as u64, remaining });
                }
                if count == 0 {
                    true
                } else {
                    open.push(Open::Items(count));
                    false
                }
            }
            Header::Array(None) | Header::Map(None) => {
                open.push(Open::Indefinite);
                false
            }
        };
        if open.len() > limits.max_cbor_depth {
            return Err(FormatError::CborTooDeep { limit: limits.max_cbor_depth });
        }
        if completes && finish_item(&mut open) {
            break;
        }
    }
    let trailing = bytes.len() - decoder.offset();
    if trailing > 0 {
        return Err(FormatError::CborTrailingBytes { count: trailing });
    }
    Ok(())
}

/// Records that one item finished inside the innermost open container, closing every
/// container this completes. Returns true when the top-level item is complete.
fn finish_item(open: &mut Vec<Open>) -> bool {
    loop {
        match open.last_mut() {
            None => return true,
            Some(Open::Items(left)) => {
                *left -= 1;
                if *left > 0 {
                    return false;
                }
                open.pop();
            }
            Some(Open::Indefinite) | Some(Open::Chunks { .. }) => return false,
        }
    }
}

fn skip(decoder: &mut Decoder<&[u8]>, len: usize, offset: usize, total: usize, scratch: &mut [u8]) -> Result<()> {
    let remaining = total - decoder.offset();
    if len > remaining {
        return Err(FormatError::CborLengthBeyondInput { offset, declared: len as u64, remaining: remaining as u64 });
    }
    let mut left = len;
    while left > 0 {
        let n = left.min(scratch.len());
        ciborium_io::Read::read_exact(decoder, &mut scratch[..n])
            .map_err(|_| FormatError::CborInvalid { offset, detail: "unexpected end of input".into() })?;
        left -= n;
    }
    Ok(())
}

fn cbor_error<E: std::fmt::Debug>(error: ciborium_ll::Error<E>, offset: usize) -> FormatError {
    match error {
        ciborium_ll::Error::Syntax(at) => FormatError::CborInvalid { offset: at, detail: "malformed item header".into() },
        ciborium_ll::Error::Io(_) => FormatError::CborInvalid { offset, detail: "unexpected end of input".into() },
    }
}

/// A map key in a form that can be hashed: text keys as themselves, any other key by its
/// canonical encoding.
#[derive(PartialEq, Eq, Hash)]
enum KeyRef<'a> {
    Text(&'a str),
    Other(Vec<u8>),
}

fn check_duplicate_keys(value: &Value, context: &str) -> Result<()> {
    // Iterative, so depth is bounded by the pre-scan and never by the stack.
    let mut pending: Vec<&Value> = vec![value];
    while let Some(v) = pending.pop() {
        match v {
            Value::Map(entries) => {
                let mut seen = HashSet::with_capacity(entries.len());
                for (k, val) in entries {
                    let key = match k {
                        Value::Text(t) => KeyRef::Text(t),
                        other => {
                            let mut buf = Vec::new();
                            ciborium::ser::into_writer(other, &mut buf).expect("encoding to memory cannot fail");
                            KeyRef::Other(buf)
                        }
                    };
                    if !seen.insert(key) {
                        return Err(FormatError::DuplicateKey { context: context.to_owned(), key: describe_key(k) });
                    }
                    pending.push(k);
                    pending.push(val);
                }
            }
            Value::Array(items) => pending.extend(items.iter()),
            Value::Tag(_, inner) => pending.push(inner),
            _ => {}
        }
    }
    Ok(())
}

fn describe_key(key: &Value) -> String {
    match key {
        Value::Text(t) => format!("{t:?}"),
        other => format!("{other:?}"),
    }
}

/// A CBOR map's entries by text key, for strict typed access.
pub(super) struct Fields<'a> {
    context: String,
    entries: Vec<(&'a str, &'a Value)>,
}

impl<'a> Fields<'a> {
    /// Views `value` as a map with text keys. Non-text keys are unknown fields: ignored.
    pub fn of(value: &'a Value, context: impl Into<String>) -> Result<Fields<'a>> {
        let context = context.into();
        let Value::Map(map) = value else {
            return Err(FormatError::WrongShape { context, expected: "a map" });
        };
        let entries = map.iter().filter_map(|(k, v)| k.as_text().map(|k| (k, v))).collect();
        Ok(Fields { context, entries })
    }

    pub fn get(&self, field: &str) -> Option<&'a Value> {
        self.entries.iter().find(|(k, _)| *k == field).map(|(_, v)| *v)
    }

    pub fn entries(&self) -> impl Iterator<Item = (&'a str, &'a Value)> + '_ {
        self.entries.iter().copied()
    }

    pub fn require(&self, field: &'static str) -> Result<&'a Value> {
        self.get(field).ok_or_else(|| FormatError::MissingField { context: self.context.clone(), field })
    }

    pub fn text(&self, field: &'static str) -> Result<Option<&'a str>> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Text(t)) => Ok(Some(t)),
            Some(_) => Err(self.wrong(field, "a text string")),
        }
    }

    pub fn required_text(&self, field: &'static str) -> Result<&'a str> {
        self.text(field)?.ok_or_else(|| FormatError::MissingField { context: self.context.clone(), field })
    }

    pub fn uint(&self, field: &'static str) -> Result<Option<u64>> {
        self.get(field).map(|v| unsigned(v, &self.context, field)).transpose()
    }

    pub fn required_uint(&self, field: &'static str) -> Result<u64> {
        unsigned(self.require(field)?, &self.context, field)
    }

    pub fn uint_array(&self, field: &'static str) -> Result<Vec<u64>> {
        let Value::Array(items) = self.require(field)? else {
            return Err(self.wrong(field, "an array of unsigned integers"));
        };
        items.iter().map(|v| unsigned(v, &self.context, field)).collect()
    }

    pub fn wrong(&self, field: &str, expected: &'static str) -> FormatError {
        FormatError::WrongShape { context: format!("{}.{field}", self.context), expected }
    }
}

/// Reads an unsigned integer, refusing negative, float, tagged (bignum) and other values.
fn unsigned(value: &Value, context: &str, field: &'static str) -> Result<u64> {
    let found = match value {
        Value::Integer(i) => match u64::try_from(*i) {
            Ok(v) => return Ok(v),
            Err(_) if i128::from(*i) < 0 => "a negative integer",
            Err(_) => "an integer beyond 64 bits",
        },
        Value::Float(_) => "a float",
        Value::Tag(..) => "a tagged value",
        Value::Text(_) => "a text string",
        Value::Bytes(_) => "a byte string",
        Value::Bool(_) => "a boolean",
        Value::Null => "null",
        Value::Array(_) => "an array",
        Value::Map(_) => "a map",
        _ => "an unknown value",
    };
    Err(FormatError::NotUnsigned { context: context.to_owned(), field, found })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits::default()
    }

    #[test]
    fn indefinite_maps_and_strings_decode() {
        // {_ "a": (_ "x" "y")}
        let bytes = [0xbf, 0x61, b'a', 0x7f, 0x61, b'x', 0x61, b'y', 0xff, 0xff];
        let v = decode(&bytes, &limits()).unwrap();
        assert_eq!(v, Value::Map(vec![(Value::Text("a".into()), Value::Text("xy".into()))]));
    }

    #[test]
    fn declared_byte_length_beyond_input_is_refused_before_allocation() {
        // bytes(2^62) with nothing after
        let bytes = [0x5b, 0x40, 0, 0, 0, 0, 0, 0, 0];
        assert!(matches!(decode(&bytes, &limits()), Err(FormatError::CborLengthBeyondInput { .. })));
    }

    #[test]
    fn declared_array_length_beyond_input_is_refused() {
        let bytes = [0x9a, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert!(matches!(decode(&bytes, &limits()), Err(FormatError::CborLengthBeyondInput { .. })));
    }

    #[test]
    fn trailing_bytes_after_the_item_are_refused() {
        assert_eq!(decode(&[0x80, 0x00], &limits()), Err(FormatError::CborTrailingBytes { count: 1 }));
    }

    #[test]
    fn nesting_deeper_than_the_limit_is_refused() {
        let mut bytes = vec![0x81; 100];
        bytes.push(0x00);
        assert!(matches!(decode(&bytes, &limits()), Err(FormatError::CborTooDeep { .. })));
        let mut deep_tags = vec![0xc6; 100];
        deep_tags.push(0x00);
        assert!(matches!(decode(&deep_tags, &limits()), Err(FormatError::CborTooDeep { .. })));
    }

    #[test]
    fn item_count_above_the_limit_is_refused() {
        let mut bytes = vec![0x98, 200];
        bytes.extend(std::iter::repeat_n(0u8, 200));
        let small = Limits { max_cbor_items: 100, ..Limits::default() };
        assert!(matches!(decode(&bytes, &small), Err(FormatError::CborTooManyItems { .. })));
    }

    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        // {"a": {"k": 1, "k": 2}}
        let bytes = [0xa1, 0x61, b'a', 0xa2, 0x61, b'k', 0x01, 0x61, b'k', 0x02];
        assert!(matches!(decode(&bytes, &limits()), Err(FormatError::DuplicateKey { .. })));
    }

    #[test]
    fn invalid_headers_are_refused() {
        assert!(matches!(decode(&[0x1c], &limits()), Err(FormatError::CborInvalid { .. })));
        assert!(matches!(decode(&[0xff], &limits()), Err(FormatError::CborInvalid { .. })));
        assert!(matches!(decode(&[0x82, 0x01], &limits()), Err(FormatError::CborLengthBeyondInput { .. })));
        assert!(matches!(decode(&[0x9f, 0x01], &limits()), Err(FormatError::CborInvalid { .. })));
        assert!(matches!(decode(&[], &limits()), Err(FormatError::CborInvalid { .. })));
    }

    #[test]
    fn unsigned_fields_refuse_negative_float_and_tagged_values() {
        let map = Value::Map(vec![
            (Value::Text("neg".into()), Value::Integer((-1).into())),
            (Value::Text("flt".into()), Value::Float(1.0)),
            (Value::Text("tag".into()), Value::Tag(2, Box::new(Value::Bytes(vec![1])))),
            (Value::Text("ok".into()), Value::Integer(7.into())),
        ]);
        let fields = Fields::of(&map, "x").unwrap();
        assert_eq!(fields.required_uint("ok").unwrap(), 7);
        for (field, found) in [("neg", "a negative integer"), ("flt", "a float"), ("tag", "a tagged value")] {
            match fields.required_uint(field) {
                Err(FormatError::NotUnsigned { found: f, .. }) => assert_eq!(f, found),
                other => panic!("{field}: {other:?}"),
            }
        }
    }
}
