//! One published file as an OCI image layer, pure arithmetic over the stored bytes: an
//! uncompressed tar holding the file at `models/PATH` (its parent directories first), with
//! fixed owners (root), modes (0755 directories, 0644 files) and times (the epoch), so the
//! same file at the same path is the same layer on every server and after every restart. The
//! layer is its tar headers, the file's own bytes, the zeros that pad them to a block and
//! the archive's two end blocks; [`TarLayer`] serves any range of it without a copy, and
//! [`LayerFraming`] gives the bytes around the file that its digest is taken over.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt as _;
use futures_util::stream;

use super::representation::{ByteStream, RangeSource};
use crate::digests::{FileIdentity, file_identity};

/// The directory a model's files are under in its image (KServe's modelcars read
/// `/models/`).
pub(crate) const MODELS_DIR: &str = "models";

/// The tar block size; entries and the archive end on a multiple of it.
const BLOCK: u64 = 512;

/// The archive's end: two zero blocks.
const END_OF_ARCHIVE: u64 = 2 * BLOCK;

/// Zeros sent for padding and the archive's end.
static ZEROS: [u8; (BLOCK + END_OF_ARCHIVE) as usize] = [0; (BLOCK + END_OF_ARCHIVE) as usize];

/// The tar bytes around one file of `file_len` bytes: the headers before it, and how many
/// zeros follow it.
#[derive(Debug, Clone)]
pub(crate) struct LayerFraming {
    pub(crate) head: Bytes,
    pub(crate) file_len: u64,
}

impl LayerFraming {
    /// The framing of a file of `file_len` bytes at `path` (relative, `/`-separated) below
    /// [`MODELS_DIR`]: a directory entry for `models/` and for each directory of `path`, then
    /// the file's header (a GNU long-name entry first when the name is over 100 bytes).
    pub(crate) fn of(path: &str, file_len: u64) -> Result<LayerFraming, String> {
        if path.is_empty() || path.starts_with('/') || path.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
            return Err(format!("{path:?} is not a relative path of plain names"));
        }
        let mut archive = tar::Builder::new(Vec::new());
        let mut entry = |name: &str, kind: tar::EntryType, mode: u32, size: u64| {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(kind);
            header.set_mode(mode);
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            header.set_size(size);
            archive
                .append_data(&mut header, name, std::io::empty())
                .map_err(|e| format!("{path:?} cannot be named in a tar archive: {e}"))
        };
        let mut directory = MODELS_DIR.to_owned();
        entry(&format!("{directory}/"), tar::EntryType::Directory, 0o755, 0)?;
        let (parents, _) = path.rsplit_once('/').unwrap_or(("", path));
        for component in parents.split('/').filter(|c| !c.is_empty()) {
            directory = format!("{directory}/{component}");
            entry(&format!("{directory}/"), tar::EntryType::Directory, 0o755, 0)?;
        }
        entry(&format!("{MODELS_DIR}/{path}"), tar::EntryType::Regular, 0o644, file_len)?;
        let mut head = archive.into_inner().map_err(|e| format!("writing a tar header failed: {e}"))?;
        // `into_inner` ends the archive; the end follows the file instead.
        head.truncate(head.len() - END_OF_ARCHIVE as usize);
        Ok(LayerFraming { head: Bytes::from(head), file_len })
    }

    /// Zeros after the file: its padding to a block, then the archive's end.
    pub(crate) fn tail_len(&self) -> u64 {
        (BLOCK - self.file_len % BLOCK) % BLOCK + END_OF_ARCHIVE
    }

    /// The layer's length.
    pub(crate) fn len(&self) -> u64 {
        self.head.len() as u64 + self.file_len + self.tail_len()
    }

    /// The bytes after the file.
    pub(crate) fn tail(&self) -> &'static [u8] {
        &ZEROS[..self.tail_len() as usize]
    }
}

/// What identifies the layer of a file version at `path` (its digest depends on both).
pub(crate) fn layer_identity(file: FileIdentity, path: &str) -> FileIdentity {
    file_identity("\0image layer v1", &hex::encode(file), path, "")
}

/// A layer's bytes: its framing around the file's bytes as served.
pub(crate) struct TarLayer {
    pub(crate) framing: LayerFraming,
    pub(crate) file: Arc<dyn RangeSource>,
}

impl RangeSource for TarLayer {
    fn len(&self) -> u64 {
        self.framing.len()
    }

    fn open(&self, range: Range<u64>) -> ByteStream {
        let head_len = self.framing.head.len() as u64;
        let file_end = head_len + self.framing.file_len;
        let within = |start: u64, end: u64| range.start.max(start) - start..range.end.min(end).max(start) - start;
        let head = within(0, head_len);
        let file = within(head_len, file_end);
        let tail = within(file_end, self.len());
        let head = (!head.is_empty()).then(|| Ok(self.framing.head.slice(head.start as usize..head.end as usize)));
        let file = (!file.is_empty()).then(|| self.file.open(file));
        let tail = (!tail.is_empty())
            .then(|| Ok(Bytes::from_static(&self.framing.tail()[tail.start as usize..tail.end as usize])));
        stream::iter(head).chain(stream::iter(file).flatten()).chain(stream::iter(tail)).boxed()
    }

    fn gap_worth_reading(&self) -> futures_util::future::BoxFuture<'_, Result<u64, super::ServiceError>> {
        self.file.gap_worth_reading()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::TryStreamExt as _;

    fn layer(path: &str, content: &'static [u8]) -> TarLayer {
        let framing = LayerFraming::of(path, content.len() as u64).unwrap();
        TarLayer { framing, file: Arc::new(Bytes::from_static(content)) }
    }

    async fn read(layer: &TarLayer, range: Range<u64>) -> Vec<u8> {
        layer.open(range).map_ok(|b| b.to_vec()).try_concat().await.unwrap()
    }

    #[tokio::test]
    async fn a_layer_is_a_tar_of_the_file_under_models_with_fixed_metadata() {
        let long = format!("{}/weights.safetensors", "d".repeat(120));
        for (path, content) in [("config.json", &b"{}"[..]), ("tok/vocab.txt", b"a\nb\n"), (long.as_str(), b"x")] {
            let layer = layer(path, content);
            let bytes = read(&layer, 0..layer.len()).await;
            assert_eq!(bytes.len() as u64, layer.len());
            assert_eq!(bytes.len() % 512, 0);
            let mut archive = tar::Archive::new(bytes.as_slice());
            let mut seen = Vec::new();
            for entry in archive.entries().unwrap() {
                let mut entry = entry.unwrap();
                let header = entry.header().clone();
                assert_eq!((header.uid().unwrap(), header.gid().unwrap(), header.mtime().unwrap()), (0, 0, 0));
                let name = entry.path().unwrap().to_string_lossy().into_owned();
                let mut data = Vec::new();
                std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
                if header.entry_type().is_dir() {
                    assert_eq!(header.mode().unwrap(), 0o755);
                } else {
                    assert_eq!(header.mode().unwrap(), 0o644);
                    assert_eq!(data, content);
                }
                seen.push(name);
            }
            assert_eq!(seen.first().map(String::as_str), Some("models/"));
            assert_eq!(seen.last(), Some(&format!("models/{path}")));
        }
    }

    #[tokio::test]
    async fn any_range_of_a_layer_is_the_same_bytes_as_the_whole() {
        let layer = layer("a/b.bin", b"0123456789");
        let whole = read(&layer, 0..layer.len()).await;
        let head = layer.framing.head.len() as u64;
        for range in [0..1, head - 3..head + 4, head + 9..head + 12, 5..layer.len(), layer.len() - 1..layer.len()] {
            assert_eq!(read(&layer, range.clone()).await, whole[range.start as usize..range.end as usize]);
        }
    }

    #[test]
    fn paths_that_are_not_plain_relative_names_are_refused_and_the_same_file_frames_the_same() {
        for bad in ["", "/etc/passwd", "a/../b", "./a", "a//b"] {
            assert!(LayerFraming::of(bad, 1).is_err(), "{bad}");
        }
        assert_eq!(
            LayerFraming::of("m.safetensors", 7).unwrap().head,
            LayerFraming::of("m.safetensors", 7).unwrap().head
        );
        assert_eq!(LayerFraming::of("m", 512).unwrap().tail_len(), 1024);
        assert_eq!(LayerFraming::of("m", 513).unwrap().tail_len(), 511 + 1024);
    }
}
