//! What `tidemark run` does to its own job at given times: one savepoint
//! (`--savepoint-after`, `--stop-with-savepoint-after`) and rescales
//! (`--rescale-after 6s=4`), each from a thread of its own that the job's
//! end wakes, so that nothing is asked of a job that has ended.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tidemark_actors::runtime::JobControl;
use tidemark_core::cluster::rescale::Requirements;
use tidemark_core::model::ids::OperatorId;

/// A rescale of the whole job at a time after its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RescaleAfter {
    /// From the start.
    pub after: Duration,
    /// The parallelism every operator runs at from then on.
    pub parallelism: u32,
}

/// Parses `DURATION=PARALLELISM` (`6s=4`).
pub fn parse_rescale_after(s: &str) -> Result<RescaleAfter, String> {
    let (after, parallelism) = s
        .split_once('=')
        .ok_or_else(|| format!("expected DURATION=PARALLELISM, such as 6s=4, got {s:?}"))?;
    let parallelism = match parallelism.trim().parse::<u32>() {
        Ok(p) if p > 0 => p,
        _ => return Err(format!("{parallelism:?} is not a parallelism of 1 or more")),
    };
    Ok(RescaleAfter {
        after: crate::config::values::flag_duration(after.trim())?,
        parallelism,
    })
}

/// The threads of a run's timed actions.
pub(super) struct Timed {
    /// Dropped when the job ended: wakes the threads.
    ended: Vec<mpsc::Sender<()>>,
    savepoint: Option<JoinHandle<Option<String>>>,
    rescales: Option<JoinHandle<()>>,
}

impl Timed {
    /// Starts the threads: the savepoint `after` its time (`stop`: one that
    /// ends the job), the rescales of every one of `operators` in the order
    /// of their times.
    pub fn start(
        control: &JobControl,
        savepoint: Option<(Duration, bool)>,
        rescales: &[RescaleAfter],
        operators: Vec<OperatorId>,
    ) -> Timed {
        let start = Instant::now();
        let mut ended = Vec::new();
        let mut woken = || {
            let (tx, rx) = mpsc::channel::<()>();
            ended.push(tx);
            rx
        };
        let savepoint = savepoint.map(|(after, stop)| {
            let (control, woken) = (control.clone(), woken());
            std::thread::spawn(move || {
                if woken.recv_timeout(after) != Err(RecvTimeoutError::Timeout) {
                    return None;
                }
                let taken = match stop {
                    true => control.stop_with_savepoint(),
                    false => control.trigger_savepoint(),
                };
                taken
                    .inspect_err(|e| tracing::warn!(error = %e, "the savepoint failed"))
                    .ok()
                    .map(|s| s.location)
            })
        });
        let mut rescales = rescales.to_vec();
        rescales.sort_by_key(|r| r.after);
        let rescales = (!rescales.is_empty()).then(|| {
            let (control, woken) = (control.clone(), woken());
            std::thread::spawn(move || {
                for rescale in rescales {
                    let wait = (start + rescale.after).saturating_duration_since(Instant::now());
                    if woken.recv_timeout(wait) != Err(RecvTimeoutError::Timeout) {
                        return;
                    }
                    let all: Requirements = operators
                        .iter()
                        .map(|&o| (o, rescale.parallelism))
                        .collect();
                    if let Err(e) = control.rescale(all) {
                        tracing::warn!(error = %e, "the rescale was refused");
                    }
                }
            })
        });
        Timed {
            ended,
            savepoint,
            rescales,
        }
    }

    /// The job ended: the threads end, and the savepoint's location is
    /// returned if one completed.
    pub fn finish(self) -> Option<String> {
        drop(self.ended);
        if let Some(rescales) = self.rescales {
            let _ = rescales.join();
        }
        self.savepoint
            .and_then(|thread| thread.join().ok().flatten())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rescale_is_a_duration_and_a_parallelism() {
        assert_eq!(
            parse_rescale_after("6s=4"),
            Ok(RescaleAfter {
                after: Duration::from_secs(6),
                parallelism: 4
            })
        );
        for bad in ["6s", "6=4", "6s=0", "6s=x"] {
            assert!(parse_rescale_after(bad).is_err(), "{bad}");
        }
    }
}
