//! What a pull has already written, so a second run after an interruption fetches only what is
//! missing. Beside the partial output lives a journal: one JSON line naming what is being
//! pulled (server URL, the file's ETag, the output's layout), then one `START END` line per
//! byte range of the output written in full. Lines are appended after their bytes are written;
//! a journal for anything else (another version, another selection) is discarded, not trusted.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What a partial output is a part of. Two pulls may share a partial only when all of it
/// is equal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub url: String,
    pub etag: String,
    pub source_len: u64,
    pub raw: bool,
    /// SHA-256 of the output's layout (its offsets and manifest), in hex.
    pub layout: String,
    pub output_len: u64,
}

/// The partial output's journal.
pub struct Journal {
    file: File,
    done: Vec<Range<u64>>,
}

/// The partial output beside `output`, and its journal.
pub fn partial_paths(output: &Path) -> (PathBuf, PathBuf) {
    let name = output.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "output".into());
    let dir = output.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    (dir.join(format!(".{name}.ztserve-pull")), dir.join(format!(".{name}.ztserve-pull.journal")))
}

impl Journal {
    /// Opens the journal at `path` when it belongs to `identity`, keeping what it records;
    /// otherwise starts a new one. Returns whether anything was kept.
    pub fn open(path: &Path, identity: &Identity) -> anyhow::Result<(Journal, bool)> {
        if let Some(done) = read(path, identity)? {
            let file = OpenOptions::new().append(true).open(path)?;
            let kept = !done.is_empty();
            return Ok((Journal { file, done: merged(done) }, kept));
        }
        let mut file = File::create(path)?;
        writeln!(file, "{}", serde_json::to_string(identity)?)?;
        Ok((Journal { file, done: Vec::new() }, false))
    }

    /// Whether every byte of `range` was written by an earlier run or this one.
    pub fn covers(&self, range: &Range<u64>) -> bool {
        let at = self.done.partition_point(|r| r.end <= range.start);
        self.done.get(at).is_some_and(|r| r.start <= range.start && range.end <= r.end)
    }

    /// The parts of `range` not yet written, in order.
    pub fn missing(&self, range: &Range<u64>) -> Vec<Range<u64>> {
        let mut out = Vec::new();
        let mut at = range.start;
        for done in &self.done[self.done.partition_point(|r| r.end <= range.start)..] {
            if done.start >= range.end {
                break;
            }
            if done.start > at {
                out.push(at..done.start);
            }
            at = at.max(done.end);
        }
        if at < range.end {
            out.push(at..range.end);
        }
        out
    }

    /// Records `range` as written.
    pub fn record(&mut self, range: Range<u64>) -> std::io::Result<()> {
        writeln!(self.file, "{} {}", range.start, range.end)?;
        let at = self.done.partition_point(|r| r.start < range.start);
        self.done.insert(at, range);
        self.done = merged(std::mem::take(&mut self.done));
        Ok(())
    }

    /// Forgets `range` (its bytes failed their digest): later runs fetch it again.
    pub fn forget(&mut self, range: &Range<u64>) -> std::io::Result<()> {
        writeln!(self.file, "-{} {}", range.start, range.end)?;
        self.done = subtract(std::mem::take(&mut self.done), range);
        Ok(())
    }
}

/// The ranges recorded in the journal at `path`, when it exists and is for `identity`.
fn read(path: &Path, identity: &Identity) -> anyhow::Result<Option<Vec<Range<u64>>>> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let mut lines = BufReader::new(file).lines();
    let Some(Ok(first)) = lines.next() else { return Ok(None) };
    if serde_json::from_str::<Identity>(&first).ok().as_ref() != Some(identity) {
        return Ok(None);
    }
    let mut done = Vec::new();
    for line in lines {
        // A line cut short by a crash is the last one; everything before it stands.
        let Ok(line) = line else { break };
        let (forget, text) = match line.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, line.as_str()),
        };
        let Some(range) = text
            .split_once(' ')
            .and_then(|(a, b)| Some(a.parse::<u64>().ok()?..b.parse::<u64>().ok()?))
            .filter(|r| r.start < r.end && r.end <= identity.output_len)
        else {
            break;
        };
        if forget {
            done = subtract(merged(done), &range);
        } else {
            done.push(range);
        }
    }
    Ok(Some(done))
}

/// Sorted, disjoint, adjacent ranges joined.
fn merged(mut ranges: Vec<Range<u64>>) -> Vec<Range<u64>> {
    ranges.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for range in ranges {
        match out.last_mut() {
            Some(last) if range.start <= last.end => last.end = last.end.max(range.end),
            _ => out.push(range),
        }
    }
    out
}

fn subtract(ranges: Vec<Range<u64>>, cut: &Range<u64>) -> Vec<Range<u64>> {
    let mut out = Vec::with_capacity(ranges.len() + 1);
    for r in ranges {
        if r.end <= cut.start || cut.end <= r.start {
            out.push(r);
            continue;
        }
        if r.start < cut.start {
            out.push(r.start..cut.start);
        }
        if cut.end < r.end {
            out.push(cut.end..r.end);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> Identity {
        Identity { url: "http://h/models/m/file".into(), etag: "\"1\"".into(), source_len: 100, raw: false, layout: "ab".into(), output_len: 1000 }
    }

    #[test]
    fn a_journal_keeps_written_ranges_across_runs_and_only_for_the_same_identity() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let (mut journal, kept) = Journal::open(&path, &identity()).unwrap();
        assert!(!kept);
        journal.record(0..100).unwrap();
        journal.record(200..300).unwrap();
        journal.record(100..200).unwrap();
        journal.forget(&(250..260)).unwrap();
        drop(journal);

        let (journal, kept) = Journal::open(&path, &identity()).unwrap();
        assert!(kept);
        assert!(journal.covers(&(0..250)));
        assert!(!journal.covers(&(240..260)));
        assert!(journal.covers(&(260..300)));
        assert!(!journal.covers(&(300..301)));
        assert_eq!(journal.missing(&(0..400)), vec![250..260, 300..400]);
        assert_eq!(journal.missing(&(255..270)), vec![255..260]);
        assert_eq!(journal.missing(&(0..100)), vec![]);

        let other = Identity { etag: "\"2\"".into(), ..identity() };
        let (journal, kept) = Journal::open(&path, &other).unwrap();
        assert!(!kept);
        assert!(!journal.covers(&(0..1)));
    }

    #[test]
    fn a_line_cut_short_ends_the_journal_without_losing_earlier_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        std::fs::write(&path, format!("{}\n0 10\n10 2", serde_json::to_string(&identity()).unwrap())).unwrap();
        let (journal, _) = Journal::open(&path, &identity()).unwrap();
        assert!(journal.covers(&(0..10)));
        assert!(!journal.covers(&(10..11)));
    }
}
