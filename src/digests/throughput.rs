//! How fast digests are computed here, learnt from the files hashed so far, and so how long an
//! asker should wait for the bytes still to hash.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A throughput assumed for one hashing worker before any file has been hashed (bytes per
/// second): SHA-256 with the CPU's SHA extensions, reading from the page cache.
const ASSUMED_RATE: u64 = 1 << 30;

/// Files shorter than this say little about throughput (their time is mostly set-up).
const RATE_SAMPLE_MIN: u64 = 64 << 20;

/// The longest wait a refused asker is told to make, in seconds.
const MAX_RETRY_AFTER_SECS: u64 = 3600;

/// Bytes per second one worker hashes.
#[derive(Debug)]
pub(crate) struct Throughput(AtomicU64);

impl Default for Throughput {
    fn default() -> Throughput {
        Throughput(AtomicU64::new(ASSUMED_RATE))
    }
}

impl Throughput {
    /// Seconds until `remaining` bytes are hashed by `workers` workers at the rate seen so far
    /// (at least 1, at most an hour).
    pub(crate) fn seconds_for(&self, remaining: u64, workers: usize) -> u64 {
        let rate = self.0.load(Ordering::Relaxed).max(1) * workers.max(1) as u64;
        remaining.div_ceil(rate).clamp(1, MAX_RETRY_AFTER_SECS)
    }

    /// Learns from one file of `bytes` hashed in `took`.
    pub(crate) fn learn(&self, bytes: u64, took: Duration) {
        if bytes < RATE_SAMPLE_MIN || took.is_zero() {
            return;
        }
        let seen = (bytes as f64 / took.as_secs_f64()) as u64;
        let old = self.0.load(Ordering::Relaxed);
        // Weighted toward the newest: the machine's load changes.
        self.0.store((old + 3 * seen) / 4, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_follows_the_rate_seen_weighted_toward_the_newest() {
        let throughput = Throughput::default();
        assert_eq!(throughput.seconds_for(10 << 30, 2), 5, "1 GiB/s per worker assumed");
        // A small file teaches nothing; a large one moves the rate three quarters of the way.
        throughput.learn(1 << 20, Duration::from_secs(10));
        assert_eq!(throughput.seconds_for(10 << 30, 1), 10);
        throughput.learn(1 << 30, Duration::from_secs(4));
        let rate = ((1u64 << 30) + 3 * (1 << 28)) / 4;
        assert_eq!(throughput.seconds_for(rate * 7, 1), 7);
        assert_eq!(throughput.seconds_for(0, 1), 1, "at least a second");
        assert_eq!(throughput.seconds_for(u64::MAX, 1), 3600, "at most an hour");
    }
}
