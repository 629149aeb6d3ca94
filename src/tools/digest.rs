//! `ztserve digest DIR...`: writes `DIR/SHA256SUMS`, the SHA-256 of every file below DIR in
//! the format `sha256sum` writes and `sha256sum -c` checks (`HEX  PATH`, paths relative to
//! DIR, sorted), hashing a file per core with `pread` into one buffer each. Run in an image
//! build or an init container, it spares a server the first hashing of a large model: the
//! server takes a model directory's `SHA256SUMS` for its files' digests (checked on each
//! file's first whole read). The format itself is `format::sums`.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use sha2::Digest as _;

use crate::format::sums::{SUMS_FILE, sums_line};

/// A file's SHA-256 and length.
pub(super) type Hashed = ([u8; 32], u64);

/// Bytes read from a file at a time while hashing it.
const READ_BUFFER: usize = 4 << 20;

/// Writes `dir/SHA256SUMS` for every file below `dir` (the old `SHA256SUMS` left out); returns
/// how many files and bytes were hashed.
pub fn write_sums(dir: &Path, out: &mut dyn std::io::Write) -> anyhow::Result<(usize, u64)> {
    let mut files = Vec::new();
    walk(dir, dir, &mut files)?;
    files.sort();
    files.retain(|f| f != Path::new(SUMS_FILE));
    let hashed = sha256_files(dir, &files);
    let mut text = String::new();
    let mut bytes = 0;
    for (relative, result) in files.iter().zip(hashed) {
        let (digest, len) = result?;
        let path = relative.to_str().with_context(|| format!("{} is not a UTF-8 path", relative.display()))?;
        let line = sums_line(&digest, path)
            .with_context(|| format!("{path:?} holds a line break, which SHA256SUMS cannot name"))?;
        text.push_str(&line);
        bytes += len;
    }
    let target = dir.join(SUMS_FILE);
    let mut temporary =
        tempfile::NamedTempFile::new_in(dir).with_context(|| format!("cannot write in {}", dir.display()))?;
    temporary.write_all(text.as_bytes())?;
    temporary.as_file().sync_all()?;
    temporary.persist(&target).with_context(|| format!("cannot write {}", target.display()))?;
    writeln!(out, "{}: {} files, {bytes} bytes", target.display(), files.len())?;
    Ok((files.len(), bytes))
}

/// The SHA-256 and length of each of `files` (relative to `dir`), a file per core at a time.
pub(super) fn sha256_files(dir: &Path, files: &[PathBuf]) -> Vec<anyhow::Result<Hashed>> {
    let workers = std::thread::available_parallelism().map_or(2, usize::from).min(files.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let hashed: Vec<std::sync::Mutex<Option<anyhow::Result<Hashed>>>> =
        files.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                let mut buffer = vec![0u8; READ_BUFFER];
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(relative) = files.get(i) else { return };
                    let result = sha256_file(&dir.join(relative), &mut buffer);
                    *hashed[i].lock().expect("never poisoned") = Some(result);
                }
            });
        }
    });
    hashed.into_iter().map(|h| h.into_inner().expect("never poisoned").expect("every file hashed")).collect()
}

/// Every regular file below `dir` (paths relative to `root`), leaving out hidden entries
/// (`.git`, temporary files), as a server's listing of a directory leaves them out.
pub(super) fn walk(root: &Path, dir: &Path, files: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let kind = entry.file_type()?;
        if kind.is_dir() {
            walk(root, &path, files)?;
        } else if kind.is_file() {
            files.push(path.strip_prefix(root).expect("below the root").to_owned());
        }
    }
    Ok(())
}

fn sha256_file(path: &Path, buffer: &mut [u8]) -> anyhow::Result<Hashed> {
    use std::os::unix::fs::FileExt as _;
    let file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut hasher = sha2::Sha256::new();
    let mut at = 0u64;
    loop {
        let n = file.read_at(buffer, at).with_context(|| format!("cannot read {}", path.display()))?;
        if n == 0 {
            return Ok((hasher.finalize().into(), at));
        }
        hasher.update(&buffer[..n]);
        at += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::sums::parse_sums;

    #[test]
    fn sums_are_written_as_sha256sum_writes_them_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), b"{}").unwrap();
        std::fs::create_dir(dir.path().join("tokenizer")).unwrap();
        std::fs::write(dir.path().join("tokenizer/vocab.txt"), b"hello world").unwrap();
        std::fs::write(dir.path().join(".hidden"), b"x").unwrap();
        let mut out = Vec::new();
        assert_eq!(write_sums(dir.path(), &mut out).unwrap(), (2, 13));
        let text = std::fs::read_to_string(dir.path().join(SUMS_FILE)).unwrap();
        assert_eq!(
            text,
            "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a  config.json\n\
             b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9  tokenizer/vocab.txt\n"
        );
        // Written again, the old SHA256SUMS is not among the files.
        assert_eq!(write_sums(dir.path(), &mut out).unwrap(), (2, 13));
        let (sums, unreadable) = parse_sums(&format!("{text}not a line\n{}  \n", "0".repeat(64)));
        assert_eq!((sums.len(), unreadable), (2, 2));
        assert_eq!(
            hex::encode(sums["tokenizer/vocab.txt"]),
            "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9"
        );
    }
}
