//! Helpers shared by the integration tests: the official `ztensor` venvs, and builders for
//! hand-made (often hostile) `.zt` files.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use ztserve::format::Value;

/// Where `scripts/python-env` puts its venvs.
pub fn venv_root() -> PathBuf {
    std::env::var_os("ZTSERVE_VENVS").map(PathBuf::from).unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv"))
}

/// The Python of the venv holding `ztensor==version`, made by `scripts/test`. A missing venv
/// fails the test: interop is never skipped silently.
pub fn official_python(version: &str) -> PathBuf {
    let python = venv_root().join(format!("ztensor-{version}")).join("bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/test, which installs ztensor=={version} into a venv",
        python.display()
    );
    python
}

/// Runs `tests/interop/official.py ARGS` under `ztensor==version`.
pub fn run_official(version: &str, args: &[&Path]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/official.py");
    let output = Command::new(official_python(version)).arg(script).args(args).output().expect("python runs");
    assert!(
        output.status.success(),
        "official.py {args:?} under ztensor=={version} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

pub fn text(s: &str) -> Value {
    Value::Text(s.to_owned())
}

pub fn uint(n: u64) -> Value {
    Value::Integer(n.into())
}

pub fn map(entries: Vec<(&str, Value)>) -> Value {
    Value::Map(entries.into_iter().map(|(k, v)| (text(k), v)).collect())
}

pub fn cbor(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    ciborium::ser::into_writer(value, &mut out).unwrap();
    out
}

/// A `ZTEN1000` file: header, `data` (which starts at offset 8), manifest bytes, size, footer.
pub fn v1_file(data: &[u8], manifest: &[u8]) -> Vec<u8> {
    let mut file = b"ZTEN1000".to_vec();
    file.extend_from_slice(data);
    file.extend_from_slice(manifest);
    file.extend_from_slice(&(manifest.len() as u64).to_le_bytes());
    file.extend_from_slice(b"ZTEN1000");
    file
}

/// A `ZTEN0001` file: header, `data`, index bytes, size.
pub fn legacy_file(data: &[u8], index: &[u8]) -> Vec<u8> {
    let mut file = b"ZTEN0001".to_vec();
    file.extend_from_slice(data);
    file.extend_from_slice(index);
    file.extend_from_slice(&(index.len() as u64).to_le_bytes());
    file
}

/// A component map with the usual fields.
pub fn component(dtype: &str, offset: u64, length: u64) -> Vec<(&'static str, Value)> {
    vec![("dtype", text(dtype)), ("offset", uint(offset)), ("length", uint(length))]
}

/// A 1.2 manifest of objects given as (name, shape, format, components).
pub fn manifest(objects: Vec<(&str, Vec<u64>, &str, Vec<(&str, Value)>)>) -> Value {
    let objects = objects
        .into_iter()
        .map(|(name, shape, format, components)| {
            (
                text(name),
                map(vec![
                    ("shape", Value::Array(shape.into_iter().map(uint).collect())),
                    ("format", text(format)),
                    ("components", map(components)),
                ]),
            )
        })
        .collect();
    map(vec![("version", text("1.2.0")), ("objects", Value::Map(objects))])
}

/// Data region of `blocks` 64-byte blocks (after the 8-byte header: 56 bytes, then 64 each),
/// so that offsets 64, 128, … are valid; filled with `fill`.
pub fn data_region(blocks: usize, fill: u8) -> Vec<u8> {
    vec![fill; 56 + 64 * blocks.saturating_sub(1)]
}
