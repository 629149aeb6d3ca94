//! The `SHA256SUMS` text format, as `sha256sum` writes it and `sha256sum -c` checks it: one
//! `HEX  PATH` line per file (`HEX *PATH` in its binary mode). `ztserve digest` writes it; the
//! server takes a model directory's as its files' digests.

use std::collections::BTreeMap;

/// The name of the file of digests in a model's directory.
pub const SUMS_FILE: &str = "SHA256SUMS";

/// Largest `SHA256SUMS` a server reads: 32 thousand lines of a long path each.
pub const MAX_SUMS_BYTES: u64 = 8 << 20;

/// The line of `path` with SHA-256 `digest`, its line break included; `None` when the path
/// holds a line break, which the format cannot name.
pub fn sums_line(digest: &[u8; 32], path: &str) -> Option<String> {
    (!path.contains('\n')).then(|| format!("{}  {path}\n", hex::encode(digest)))
}

/// The digests of `text` (a `SHA256SUMS`) by path, and the number of lines that are not a
/// digest line (`HEX  PATH`, or `HEX *PATH` for sha256sum's binary mode).
pub fn parse_sums(text: &str) -> (BTreeMap<String, [u8; 32]>, usize) {
    let mut sums = BTreeMap::new();
    let mut unreadable = 0;
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        let parsed = line.split_once(' ').and_then(|(hex, rest)| {
            let path = rest.strip_prefix(' ').or_else(|| rest.strip_prefix('*'))?;
            let mut digest = [0u8; 32];
            hex::decode_to_slice(hex, &mut digest).ok()?;
            (!path.is_empty()).then(|| (path.strip_prefix("./").unwrap_or(path).to_owned(), digest))
        });
        match parsed {
            Some((path, digest)) => {
                sums.insert(path, digest);
            }
            None => unreadable += 1,
        }
    }
    (sums, unreadable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_read_back_and_what_is_no_digest_line_is_counted() {
        let text = format!(
            "{}{}not a line\n{}  \n",
            sums_line(&[1; 32], "config.json").unwrap(),
            sums_line(&[2; 32], "tokenizer/vocab.txt").unwrap(),
            "0".repeat(64)
        );
        let (sums, unreadable) = parse_sums(&text);
        assert_eq!((sums.len(), unreadable), (2, 2));
        assert_eq!(sums["tokenizer/vocab.txt"], [2; 32]);
        assert_eq!(sums_line(&[0; 32], "a\nb"), None);
    }

    #[test]
    fn binary_mode_lines_and_a_leading_dot_slash_are_read() {
        let line = format!("{} *./model.safetensors\n", "ab".repeat(32));
        let (sums, unreadable) = parse_sums(&line);
        assert_eq!(unreadable, 0);
        assert_eq!(sums["model.safetensors"], [0xab; 32]);
    }
}
