//! JSON objects read as their entries in file order, duplicates kept (a map would drop them),
//! for the header's tensors and the index's `weight_map`.

use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, Visitor};

/// A JSON object's entries in file order, duplicates kept.
pub(super) fn json_entries(text: &str) -> serde_json::Result<Vec<(String, serde_json::Value)>> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let entries = de::Deserializer::deserialize_map(&mut deserializer, EntriesVisitor)?;
    deserializer.end()?;
    Ok(entries)
}

/// The header's top-level entries in file order, duplicates kept (a map would drop them).
struct EntriesVisitor;

impl<'de> Visitor<'de> for EntriesVisitor {
    type Value = Vec<(String, serde_json::Value)>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Self::Value, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            entries.push((key, map.next_value_seed(AnyValue)?));
        }
        Ok(entries)
    }
}

/// A JSON object's entries in file order, duplicates kept.
pub(super) struct Entries;

impl<'de> DeserializeSeed<'de> for Entries {
    type Value = Vec<(String, serde_json::Value)>;
    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> std::result::Result<Self::Value, D::Error> {
        deserializer.deserialize_map(EntriesVisitor)
    }
}

struct AnyValue;

impl<'de> DeserializeSeed<'de> for AnyValue {
    type Value = serde_json::Value;
    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> std::result::Result<Self::Value, D::Error> {
        de::Deserialize::deserialize(deserializer)
    }
}
