//! The `zt.zstd-seekable/1` encoding profile: independent zstd frames followed by a seek table
//! in a skippable frame. This module reads and checks the table (sizes that cover the stream
//! exactly, decoded sizes that sum to the part's `decoded_length`, frames of at most 16 MiB,
//! all but the last of one size) and maps a decoded range to the frames that hold it, so a
//! reader decodes only what a range covers. Decoding a frame is the ordinary zstd decoder's
//! work ([`crate::decode`]), which also checks its content checksum.

use std::ops::Range;

pub use crate::error::SeekFault;
use crate::{Component, Encoding, FormatError, Location, Result};

/// Largest decoded size of one frame.
pub const MAX_FRAME: u64 = 16 << 20;
/// Most frames one table may list: 32 MiB of table, far beyond any real part (a 64 GiB part in
/// the official writer's 1 MiB frames has 65,536), so a hostile count is refused before it is read.
pub const MAX_FRAMES: u64 = 4 << 20;
/// The skippable frame's magic, which opens the table.
pub const SKIPPABLE_MAGIC: u32 = 0x184D_2A5E;
/// The seekable format's magic, the stream's last four bytes.
pub const SEEKABLE_MAGIC: u32 = 0x8F92_EAB1;
/// The table's own footer: frame count (u32), descriptor (u8), magic (u32).
pub const TABLE_FOOTER_LEN: u64 = 9;
/// Bytes before the table entries: skippable magic and content length.
const SKIPPABLE_HEADER_LEN: u64 = 8;

fn fault(at: &Location, code: SeekFault, detail: impl Into<String>) -> FormatError {
    FormatError::SeekTable { at: at.clone(), fault: code, detail: detail.into() }
}

/// The zstd frame magic, little-endian, which every frame of the stream opens with.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// Checks that `frame` (one frame's stored bytes) is a zstd frame declaring a content checksum,
/// as the profile requires of every frame: the frame header descriptor's bit 2. zstd itself
/// checks the checksum while decoding; without the flag it would decode unchecked.
pub fn check_frame_checksum(at: &Location, frame: &[u8]) -> Result<()> {
    match frame {
        [m0, m1, m2, m3, descriptor, ..] if [*m0, *m1, *m2, *m3] == ZSTD_MAGIC => {
            if descriptor & 0b100 == 0 {
                return Err(fault(
                    at,
                    SeekFault::NoChecksum,
                    "a frame has no content checksum, which the profile requires",
                ));
            }
            Ok(())
        }
        // Not a zstd frame: the decoder says precisely what is wrong.
        _ => Ok(()),
    }
}

/// Reads the table's footer (the stream's last [`TABLE_FOOTER_LEN`] bytes) and returns how
/// many bytes at the end of a `stream_len`-byte stream the whole table takes.
pub fn table_len(at: &Location, stream_len: u64, footer: &[u8]) -> Result<u64> {
    let Some(footer) = footer.get(footer.len().wrapping_sub(TABLE_FOOTER_LEN as usize)..) else {
        return Err(fault(at, SeekFault::Malformed, "the stream is too short to end in a seek table"));
    };
    if stream_len < SKIPPABLE_HEADER_LEN + TABLE_FOOTER_LEN {
        return Err(fault(at, SeekFault::Malformed, "the stream is too short to end in a seek table"));
    }
    if footer[5..9] != SEEKABLE_MAGIC.to_le_bytes() {
        return Err(fault(at, SeekFault::Malformed, "the stream does not end in the seekable magic"));
    }
    let descriptor = footer[4];
    if descriptor & 0x7f != 0 {
        return Err(fault(at, SeekFault::Malformed, format!("reserved descriptor bits set ({descriptor:#04x})")));
    }
    let frames = u64::from(u32::from_le_bytes(footer[..4].try_into().expect("4 bytes")));
    if frames > MAX_FRAMES {
        return Err(fault(at, SeekFault::Malformed, format!("{frames} frames, over the limit of {MAX_FRAMES}")));
    }
    let len = SKIPPABLE_HEADER_LEN + frames * entry_len(descriptor) + TABLE_FOOTER_LEN;
    if len > stream_len {
        return Err(fault(at, SeekFault::Malformed, format!("a {len}-byte seek table in a {stream_len}-byte stream")));
    }
    Ok(len)
}

fn entry_len(descriptor: u8) -> u64 {
    if descriptor & 0x80 != 0 { 12 } else { 8 }
}

/// A checked seek table: where each frame is stored and what it decodes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeekTable {
    /// Decoded size of every frame but the last (the last may be smaller).
    frame_size: u64,
    decoded_len: u64,
    /// Start of each frame in the stream, and the end of the last: `frames + 1` entries.
    stored_starts: Vec<u64>,
}

impl SeekTable {
    /// Parses `table` (the stream's last [`table_len`] bytes) of a `stream_len`-byte stream that
    /// must decode to exactly `decoded_length` bytes.
    pub fn parse(at: &Location, table: &[u8], stream_len: u64, decoded_length: u64) -> Result<SeekTable> {
        let len = table.len() as u64;
        if len != table_len(at, stream_len, table)? {
            return Err(fault(at, SeekFault::Malformed, "the seek table read is not the table's length"));
        }
        let descriptor = table[table.len() - 5];
        let content_len = len - SKIPPABLE_HEADER_LEN;
        if table[..4] != SKIPPABLE_MAGIC.to_le_bytes()
            || table[4..8] != u32::try_from(content_len).unwrap_or(u32::MAX).to_le_bytes()
        {
            return Err(fault(at, SeekFault::Malformed, "the seek table is not a well-formed skippable frame"));
        }
        let entries = &table[SKIPPABLE_HEADER_LEN as usize..table.len() - TABLE_FOOTER_LEN as usize];
        let u32_at = |entry: &[u8], i: usize| u64::from(u32::from_le_bytes(entry[i..i + 4].try_into().expect("4")));
        let frames = entries.chunks_exact(entry_len(descriptor) as usize);
        let count = frames.len();
        let mut stored_starts = Vec::with_capacity(count + 1);
        let (mut stored, mut decoded, mut frame_size) = (0u64, 0u64, 0u64);
        for (i, entry) in frames.enumerate() {
            let (compressed, size) = (u32_at(entry, 0), u32_at(entry, 4));
            if size == 0 || size > MAX_FRAME {
                return Err(fault(
                    at,
                    SeekFault::FrameSize,
                    format!("frame {i} decodes to {size} bytes (1 to 16 MiB)"),
                ));
            }
            if i == 0 {
                frame_size = size;
            } else if i + 1 < count && size != frame_size || i + 1 == count && size > frame_size {
                return Err(fault(
                    at,
                    SeekFault::Unequal,
                    format!("frame {i} decodes to {size} bytes, frame 0 to {frame_size}"),
                ));
            }
            stored_starts.push(stored);
            stored += compressed;
            decoded += size;
        }
        stored_starts.push(stored);
        if decoded != decoded_length {
            return Err(fault(
                at,
                SeekFault::Total,
                format!("frames decode to {decoded} bytes, decoded_length is {decoded_length}"),
            ));
        }
        if stored != stream_len - len {
            return Err(fault(
                at,
                SeekFault::Coverage,
                format!("frames take {stored} bytes, the stream holds {} before its table", stream_len - len),
            ));
        }
        Ok(SeekTable { frame_size, decoded_len: decoded, stored_starts })
    }

    pub fn frame_count(&self) -> usize {
        self.stored_starts.len() - 1
    }

    /// Decoded bytes of every frame but the last.
    pub fn frame_size(&self) -> u64 {
        self.frame_size
    }

    /// The frames holding decoded bytes `range`: the one holding `x` is `x / frame_size`.
    pub fn frames_for(&self, range: Range<u64>) -> Range<usize> {
        if range.is_empty() || self.frame_count() == 0 {
            return 0..0;
        }
        let first = (range.start / self.frame_size) as usize;
        let last = ((range.end - 1) / self.frame_size) as usize;
        first..(last + 1).min(self.frame_count())
    }

    /// Where frame `index` is stored in the stream.
    pub fn stored(&self, index: usize) -> Range<u64> {
        self.stored_starts[index]..self.stored_starts[index + 1]
    }

    /// Frame `index` of `part` as a component of its own: one zstd frame, at its place in the
    /// file, that must decode to exactly its declared size. The part's digest covers the whole
    /// part, so the frame has none.
    /// Its encoding stays [`Encoding::ZstdSeekable`]: one frame of the profile, which
    /// [`crate::decode::decode_frame`] holds to the profile's rules for frames.
    pub fn frame_component(&self, part: &Component, index: usize) -> Component {
        let stored = self.stored(index);
        let decoded = self.decoded(index);
        Component {
            role: part.role.clone(),
            offset: part.offset + stored.start,
            stored_length: stored.end - stored.start,
            encoding: Encoding::ZstdSeekable,
            decoded_length: decoded.end - decoded.start,
            digest: None,
            ..part.clone()
        }
    }

    /// The table of a part whose stored bytes are all in `stored`.
    pub fn of_stored(at: &Location, stored: &[u8], decoded_length: u64) -> Result<SeekTable> {
        let len = table_len(at, stored.len() as u64, stored)?;
        SeekTable::parse(at, &stored[stored.len() - len as usize..], stored.len() as u64, decoded_length)
    }

    /// Which decoded bytes frame `index` holds.
    pub fn decoded(&self, index: usize) -> Range<u64> {
        let start = index as u64 * self.frame_size;
        start..(start + self.frame_size).min(self.decoded_len)
    }
}

/// The seek table for frames of `(compressed, decoded)` sizes, as it follows them in a stream:
/// a skippable frame holding the entries, the frame count, a descriptor with no checksum column,
/// and the seekable magic. For writers of test streams, hostile ones included.
pub fn encode_table(entries: &[(u32, u32)]) -> Vec<u8> {
    let mut out = SKIPPABLE_MAGIC.to_le_bytes().to_vec();
    out.extend(((entries.len() * 8 + 9) as u32).to_le_bytes());
    for (compressed, decoded) in entries {
        out.extend(compressed.to_le_bytes());
        out.extend(decoded.to_le_bytes());
    }
    out.extend((entries.len() as u32).to_le_bytes());
    out.push(0);
    out.extend(SEEKABLE_MAGIC.to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(entries: &[(u32, u32)]) -> Vec<u8> {
        encode_table(entries)
    }

    fn parse(entries: &[(u32, u32)], frames_len: u64, decoded: u64) -> Result<SeekTable> {
        let bytes = table(entries);
        let stream_len = frames_len + bytes.len() as u64;
        SeekTable::parse(&Location::component("t", "data"), &bytes, stream_len, decoded)
    }

    fn code(result: Result<SeekTable>) -> &'static str {
        result.unwrap_err().code()
    }

    #[test]
    fn frames_are_found_by_division() {
        let t = parse(&[(10, 100), (20, 100), (5, 30)], 35, 230).unwrap();
        assert_eq!(t.frames_for(0..1), 0..1);
        assert_eq!(t.frames_for(99..101), 0..2);
        assert_eq!(t.frames_for(200..230), 2..3);
        assert_eq!(t.frames_for(5..5), 0..0);
        assert_eq!((t.stored(1), t.decoded(2)), (10..30, 200..230));
    }

    #[test]
    fn inconsistent_tables_are_refused_with_their_rule() {
        assert_eq!(code(parse(&[(10, 100), (10, 100)], 20, 150)), "seek_table_total");
        assert_eq!(code(parse(&[(10, 100), (10, 100)], 25, 200)), "seek_table_coverage");
        assert_eq!(code(parse(&[(10, 100), (10, 90), (10, 100)], 30, 290)), "seek_frames_unequal");
        assert_eq!(code(parse(&[(10, 100), (10, 200)], 20, 300)), "seek_frames_unequal");
        assert_eq!(code(parse(&[(10, (16 << 20) + 1)], 10, (16 << 20) + 1)), "seek_frame_size");
        assert_eq!(code(parse(&[(10, 0)], 10, 0)), "seek_frame_size");
    }

    #[test]
    fn a_table_longer_than_its_stream_is_refused_before_it_is_read() {
        let at = Location::component("t", "data");
        let mut footer = vec![0xff, 0xff, 0x3f, 0, 0];
        footer.extend(SEEKABLE_MAGIC.to_le_bytes());
        assert_eq!(table_len(&at, 1000, &footer).unwrap_err().code(), "seek_table_malformed");
        footer[4] = 0x01;
        assert_eq!(table_len(&at, 1 << 40, &footer).unwrap_err().code(), "seek_table_malformed");
    }
}
