//! Progress of a pull: a bar on a terminal, a line every few seconds elsewhere, or nothing.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{HumanBytes, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::ProgressMode;

/// A bar on a terminal, a line every few seconds elsewhere, or nothing.
pub(super) struct ProgressDisplay {
    pub(super) bar: Option<ProgressBar>,
    pub(super) lines: Option<std::sync::Mutex<LineState>>,
    pub(super) total: u64,
}

pub(super) struct LineState {
    pub(super) done: u64,
    pub(super) started: Instant,
    pub(super) last: Instant,
}

impl ProgressDisplay {
    pub(super) fn new(mode: ProgressMode, total: u64) -> ProgressDisplay {
        let terminal = std::io::stderr().is_terminal();
        match mode {
            ProgressMode::Auto if terminal => {
                let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
                bar.set_style(
                    ProgressStyle::with_template(
                        "{bar:40} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}",
                    )
                    .expect("the template is valid"),
                );
                ProgressDisplay { bar: Some(bar), lines: None, total }
            }
            ProgressMode::Auto | ProgressMode::Lines => {
                let now = Instant::now();
                ProgressDisplay {
                    bar: None,
                    lines: Some(std::sync::Mutex::new(LineState { done: 0, started: now, last: now })),
                    total,
                }
            }
            ProgressMode::Quiet => ProgressDisplay { bar: None, lines: None, total },
        }
    }

    pub(super) fn advance(&self, bytes: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(bytes);
        }
        if let Some(lines) = &self.lines {
            let mut state = lines.lock().expect("progress lock");
            state.done += bytes;
            if state.last.elapsed() >= Duration::from_secs(2) {
                state.last = Instant::now();
                eprintln!("{}", self.line(&state));
            }
        }
    }

    pub(super) fn line(&self, state: &LineState) -> String {
        let seconds = state.started.elapsed().as_secs_f64().max(1e-3);
        let percent = if self.total == 0 { 100.0 } else { state.done as f64 * 100.0 / self.total as f64 };
        format!(
            "pull: {} of {} ({percent:.0}%), {}/s",
            HumanBytes(state.done),
            HumanBytes(self.total),
            HumanBytes((state.done as f64 / seconds) as u64)
        )
    }

    pub(super) fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if let Some(lines) = &self.lines {
            eprintln!("{}", self.line(&lines.lock().expect("progress lock")));
        }
    }
}
