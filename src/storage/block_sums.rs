//! Checksums of a local file's blocks ([`BlockSums`]), learnt as runs of it are checksummed,
//! so that the CRC32C of a long run is combined from them and only its ends are read again.

use std::fs::File;
use std::ops::Range;

use super::StorageError;
use super::region::{FileRegion, READ_PIECE, READ_THROUGH, pread_exact_into, scratch, with_scratch};

/// Bytes in a block of [`BlockSums`].
const SUM_BLOCK: u64 = 64 << 10;

/// The CRC32C of every [`SUM_BLOCK`] of one version of a local file, each learnt the first time
/// a run covering it whole is checksummed and kept: the checksum of a long run is then combined
/// from them, and only its ends are read. 4 bytes and a bit per block (66 KB per GB).
#[derive(Debug)]
pub(crate) struct BlockSums {
    sums: Box<[std::sync::atomic::AtomicU32]>,
    /// One bit per block: its sum is known.
    known: Box<[std::sync::atomic::AtomicU64]>,
}

/// `crc` as if followed by [`SUM_BLOCK`] zero bytes: the linear map `crc32c_combine` applies
/// for that length, as its 32 columns, so appending a block's sum costs 32 steps, not a
/// combine's 17 matrix squarings.
fn after_block(crc: u32) -> u32 {
    static COLUMNS: std::sync::LazyLock<[u32; 32]> =
        std::sync::LazyLock::new(|| std::array::from_fn(|bit| crc32c::crc32c_combine(1 << bit, 0, SUM_BLOCK as usize)));
    (0..32).filter(|bit| crc >> bit & 1 == 1).fold(0, |out, bit| out ^ COLUMNS[bit])
}

impl BlockSums {
    /// The sums of a file of `len` bytes, none known yet.
    pub(crate) fn new(len: u64) -> BlockSums {
        let blocks = len.div_ceil(SUM_BLOCK) as usize;
        BlockSums {
            sums: (0..blocks).map(|_| std::sync::atomic::AtomicU32::new(0)).collect(),
            known: (0..blocks.div_ceil(64)).map(|_| std::sync::atomic::AtomicU64::new(0)).collect(),
        }
    }

    fn get(&self, block: usize) -> Option<u32> {
        use std::sync::atomic::Ordering;
        let known = self.known[block / 64].load(Ordering::Acquire) >> (block % 64) & 1 == 1;
        known.then(|| self.sums[block].load(Ordering::Relaxed))
    }

    fn learn(&self, block: usize, sum: u32) {
        use std::sync::atomic::Ordering;
        self.sums[block].store(sum, Ordering::Relaxed);
        self.known[block / 64].fetch_or(1 << (block % 64), Ordering::Release);
    }

    /// The CRC32C of `runs` of `region` (offsets from its start, in order, as if back to back),
    /// read with `pread` into one buffer of at most [`READ_PIECE`] bytes reused throughout
    /// (blocking): a whole block of a long run from its sum (read and learnt when unknown), the
    /// rest read; runs closer than `READ_THROUGH` a span at a time. The sums are the whole
    /// file's: `region` is a region of the file they were made for.
    pub(crate) fn crc32c_of_runs(
        &self,
        region: &FileRegion,
        runs: impl Iterator<Item = Range<u64>>,
    ) -> Result<u32, StorageError> {
        let start = region.range().start;
        let runs = runs.map(|run| start + run.start..start + run.end);
        let (file, source_name, key) = (region.mapping().file(), region.source_name(), region.key());
        with_scratch(|buffer| self.crc32c_of_runs_into(file, runs, buffer, source_name, key))
    }

    fn crc32c_of_runs_into(
        &self,
        file: &File,
        runs: impl Iterator<Item = Range<u64>>,
        buffer: &mut Vec<u8>,
        source_name: &str,
        key: &str,
    ) -> Result<u32, StorageError> {
        let mut crc = 0;
        let mut runs = runs.filter(|run| !run.is_empty()).peekable();
        while let Some(first) = runs.next() {
            if first.end - first.start > READ_THROUGH {
                crc = self.crc32c_of_run(file, crc, first, buffer, source_name, key)?;
                continue;
            }
            let mut span = vec![first];
            while let Some(next) = runs.next_if(|next| {
                let last = span.last().expect("never empty");
                next.end - next.start <= READ_THROUGH
                    && next.start.saturating_sub(last.end) <= READ_THROUGH
                    && next.end - span[0].start <= READ_PIECE
            }) {
                span.push(next);
            }
            let (start, end) = (span[0].start, span[span.len() - 1].end);
            let read = scratch(buffer, (end - start) as usize);
            pread_exact_into(file, start, read, source_name, key)?;
            for run in &span {
                crc = crc32c::crc32c_append(crc, &read[(run.start - start) as usize..(run.end - start) as usize]);
            }
        }
        Ok(crc)
    }

    /// `crc` extended over one long run: its whole blocks by their sums, its ends read.
    fn crc32c_of_run(
        &self,
        file: &File,
        mut crc: u32,
        run: Range<u64>,
        buffer: &mut Vec<u8>,
        source_name: &str,
        key: &str,
    ) -> Result<u32, StorageError> {
        let mut at = run.start;
        while at < run.end {
            let block = (at / SUM_BLOCK) as usize;
            let block_end = (block as u64 + 1) * SUM_BLOCK;
            if at.is_multiple_of(SUM_BLOCK) && block_end <= run.end && block < self.sums.len() {
                let sum = match self.get(block) {
                    Some(sum) => sum,
                    None => {
                        let read = scratch(buffer, SUM_BLOCK as usize);
                        pread_exact_into(file, at, read, source_name, key)?;
                        let sum = crc32c::crc32c(read);
                        self.learn(block, sum);
                        sum
                    }
                };
                crc = after_block(crc) ^ sum;
                at = block_end;
            } else {
                let end = run.end.min(block_end);
                let read = scratch(buffer, (end - at) as usize);
                pread_exact_into(file, at, read, source_name, key)?;
                crc = crc32c::crc32c_append(crc, read);
                at = end;
            }
        }
        Ok(crc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checksum_of_runs_is_the_crc32c_of_their_bytes_whether_its_blocks_are_known_or_not() {
        use std::io::Write as _;
        let len = 3 * SUM_BLOCK + 1234;
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 253) as u8).collect();
        let dir = tempfile::tempdir().unwrap();
        std::fs::File::create(dir.path().join("f")).unwrap().write_all(&bytes).unwrap();
        let mapping = std::sync::Arc::new(crate::storage::mapped::MappedFile::open(&dir.path().join("f")).unwrap());
        let file = FileRegion::whole(mapping, "test", "f");
        let expected = |runs: &[std::ops::Range<u64>]| {
            runs.iter().fold(0, |crc, r| crc32c::crc32c_append(crc, &bytes[r.start as usize..r.end as usize]))
        };
        let sums = BlockSums::new(len);
        let cases: Vec<Vec<std::ops::Range<u64>>> = vec![
            vec![0..len],
            vec![100..len - 7, 0..5],
            vec![SUM_BLOCK..3 * SUM_BLOCK],
            (0..len - 600).step_by(4096).map(|at| at..at + 600).collect(),
            vec![5..5, 7..SUM_BLOCK + 9, 2 * SUM_BLOCK - 3..len],
        ];
        for round in 0..2 {
            for runs in &cases {
                let found = sums.crc32c_of_runs(&file, runs.iter().cloned()).unwrap();
                assert_eq!(found, expected(runs), "round {round}, runs {runs:?}");
            }
        }
        assert!((0..3).all(|block| sums.get(block).is_some()), "every whole block was learnt");
        assert_eq!(sums.get(3), None, "the file's last, partial block is never learnt");
    }

    #[test]
    fn appending_a_block_by_its_sum_is_appending_its_bytes() {
        let block: Vec<u8> = (0..SUM_BLOCK).map(|i| (i % 241) as u8).collect();
        for crc in [0, 1, 0xFFFF_FFFF, 0x1234_5678, crc32c::crc32c(b"ztserve")] {
            assert_eq!(after_block(crc) ^ crc32c::crc32c(&block), crc32c::crc32c_append(crc, &block));
        }
    }
}
