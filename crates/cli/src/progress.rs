//! `tidemark run`'s progress line on a terminal: records, rate and the last
//! checkpoint, rewritten in place twice a second; nothing when standard
//! error is not a terminal.

use std::io::{IsTerminal, Write};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tidemark_actors::metrics::JobMetrics;
use tidemark_core::checkpoint::stats;

/// Prints until dropped.
pub(super) struct Progress {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Progress {
    pub(super) fn start(metrics: Arc<JobMetrics>) -> Self {
        if !std::io::stderr().is_terminal() {
            return Progress {
                stop: None,
                thread: None,
            };
        }
        let (stop, stopped) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let (mut at, mut records) = (Instant::now(), 0);
            while stopped.recv_timeout(Duration::from_millis(500))
                == Err(mpsc::RecvTimeoutError::Timeout)
            {
                let now = (Instant::now(), metrics.records_in());
                let rate = (now.1 - records) as f64 / now.0.duration_since(at).as_secs_f64();
                (at, records) = now;
                let checkpoint = match stats::lock(&metrics.checkpoint_stats).latest_completed() {
                    Some(c) => format!("checkpoint {} in {} ms", c.id.0, c.end_to_end_duration()),
                    None => "no checkpoint yet".to_owned(),
                };
                eprint!("\r\x1b[K{records} records, {rate:.0}/s, {checkpoint}");
                let _ = std::io::stderr().flush();
            }
            eprint!("\r\x1b[K");
        });
        Progress {
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
