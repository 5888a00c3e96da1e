//! Progress of running simulations, for a person watching a terminal.
//!
//! A [`Board`] lists a run's simulations (label and the span of its trace's arrivals); each
//! simulation's host stores its event count and simulated time into its [`Progress`] every
//! [`PROGRESS_EVERY`] actor events (relaxed atomics: nothing flows back into the simulation,
//! so results cannot depend on it). A display thread reads the board; see `meshsim run`.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::units::Nanos;

/// Actor events between two progress updates of a host.
pub const PROGRESS_EVERY: u64 = 1 << 14;

const WAITING: u8 = 0;
const RUNNING: u8 = 1;
const DONE: u8 = 2;

/// What one simulation has done so far.
#[derive(Debug, Default)]
pub struct Progress {
    events: AtomicU64,
    now_ns: AtomicU64,
    state: AtomicU8,
    started: Mutex<Option<Instant>>,
}

impl Progress {
    /// Called by the host: `events` actor events processed, simulated time `now`.
    pub fn update(&self, events: u64, now: Nanos) {
        self.events.store(events, Relaxed);
        self.now_ns.store(now.0, Relaxed);
    }

    pub fn start(&self) {
        *self
            .started
            .lock()
            .expect("no panics while holding the lock") = Some(Instant::now());
        self.state.store(RUNNING, Relaxed);
    }

    pub fn finish(&self) {
        self.state.store(DONE, Relaxed);
    }
}

/// One simulation on the board.
#[derive(Debug)]
pub struct Entry {
    /// `[point] policy`.
    pub label: String,
    /// The last arrival of the simulation's trace.
    pub span: Nanos,
    pub progress: Arc<Progress>,
}

/// A running simulation as a display shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct Running {
    pub label: String,
    /// Simulated time over the trace's span, below 1 until the simulation ends (requests
    /// still finish after the last arrival).
    pub fraction: f64,
    pub simulated_s: f64,
    pub span_s: f64,
    pub events_per_s: f64,
    /// Wall-clock seconds left at the rate so far; `None` before any progress.
    pub left_s: Option<f64>,
}

/// The simulations of a run.
#[derive(Debug, Default)]
pub struct Board {
    entries: Mutex<Vec<Entry>>,
}

impl Board {
    /// Adds a simulation; its host updates the returned progress.
    pub fn add(&self, label: String, span: Nanos) -> Arc<Progress> {
        let progress = Arc::new(Progress::default());
        self.entries
            .lock()
            .expect("no panics while holding the lock")
            .push(Entry {
                label,
                span,
                progress: progress.clone(),
            });
        progress
    }

    /// `(done, total)` simulations and the running ones.
    pub fn snapshot(&self) -> (usize, usize, Vec<Running>) {
        let entries = self
            .entries
            .lock()
            .expect("no panics while holding the lock");
        let mut done = 0;
        let mut running = Vec::new();
        for e in entries.iter() {
            let p = &e.progress;
            match p.state.load(Relaxed) {
                DONE => done += 1,
                RUNNING => {
                    let started = *p.started.lock().expect("no panics while holding the lock");
                    let wall = started.map_or(0.0, |s| s.elapsed().as_secs_f64());
                    let now = p.now_ns.load(Relaxed);
                    let fraction = if e.span.0 == 0 {
                        0.0
                    } else {
                        (now as f64 / e.span.0 as f64).min(0.99)
                    };
                    let events = p.events.load(Relaxed) as f64;
                    running.push(Running {
                        label: e.label.clone(),
                        fraction,
                        simulated_s: now as f64 / 1e9,
                        span_s: e.span.as_secs_f64(),
                        events_per_s: if wall > 0.0 { events / wall } else { 0.0 },
                        left_s: (fraction > 0.0).then(|| wall * (1.0 - fraction) / fraction),
                    });
                }
                WAITING => {}
                _ => unreachable!("states are WAITING, RUNNING and DONE"),
            }
        }
        (done, entries.len(), running)
    }
}

impl Running {
    /// One line: `[point] policy  43%  52.1 of 120.0 s simulated  0.61 M events/s  ~12 s left`.
    pub fn line(&self) -> String {
        let left = match self.left_s {
            Some(s) if s.is_finite() => format!("~{s:.0} s left"),
            _ => "estimating".to_string(),
        };
        format!(
            "{:<40} {:>3.0}%  {:.1} of {:.1} s simulated  {:.2} M events/s  {left}",
            self.label,
            100.0 * self.fraction,
            self.simulated_s,
            self.span_s,
            self.events_per_s / 1e6
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_board_reports_fractions_rates_and_what_is_done() {
        let b = Board::default();
        let a = b.add("[x=1] vanilla".into(), Nanos::from_secs(100));
        let c = b.add("[x=2] vanilla".into(), Nanos::from_secs(100));
        assert_eq!(b.snapshot().0, 0);
        assert!(b.snapshot().2.is_empty());
        a.start();
        a.update(1000, Nanos::from_secs(25));
        std::thread::sleep(std::time::Duration::from_millis(5));
        let (done, total, running) = b.snapshot();
        assert_eq!((done, total, running.len()), (0, 2, 1));
        let r = &running[0];
        assert_eq!(r.fraction, 0.25);
        assert!(r.events_per_s > 0.0 && r.left_s.unwrap() > 0.0);
        assert!(r.line().contains("25%"), "{}", r.line());
        // Past the last arrival, requests are still finishing: never 100 % before the end.
        a.update(2000, Nanos::from_secs(150));
        assert_eq!(b.snapshot().2[0].fraction, 0.99);
        a.finish();
        c.start();
        c.finish();
        assert_eq!(b.snapshot().0, 2);
    }
}
