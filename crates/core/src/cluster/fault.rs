//! Failure injection, decided here and carried out by the runtime: a seeded
//! schedule of subtask kills spread over a run, and targeted faults at the
//! steps of a checkpoint that tests must survive.

use crate::model::ids::{CheckpointId, SubtaskId};
use crate::model::rng::SplitMix64;

/// Where a targeted fault strikes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    /// While the subtask takes the synchronous part of its snapshot.
    SyncSnapshot,
    /// While the asynchronous part writes the snapshot to storage.
    AsyncWrite,
    /// Not a failure: the asynchronous part wrote everything and then never
    /// acknowledges, until the checkpoint's abort cancels it.
    StallAfterWrite,
    /// After the subtask acknowledged, before the checkpoint completes.
    AfterAck,
    /// While a sink commits on checkpoint completion.
    SinkCommit,
}

/// Fail `subtask` at `point` of `checkpoint`, once, in the first attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The step of the checkpoint that fails.
    pub point: FaultPoint,
    /// The checkpoint during which it fails.
    pub checkpoint: CheckpointId,
    /// The subtask that fails.
    pub subtask: SubtaskId,
}

/// A subtask made slow, to backpressure its upstreams: after each batch it
/// takes no input for `ns_per_record` per record of the batch. It waits
/// without holding its arbiter's thread, as a subtask on a thread of its own
/// would, so the subtasks sharing the thread keep their pace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlowSubtask {
    /// The subtask made slow.
    pub subtask: SubtaskId,
    /// Pause per record of each batch, in nanoseconds.
    pub ns_per_record: u64,
}

/// Kills at given amounts of progress: the moment is random, but reproducible
/// from the seed, and expressed in records read so that it falls inside the
/// run whatever the speed of the machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KillSchedule {
    /// (records read by all sources, index into the job's subtasks), ascending.
    kills: Vec<(u64, usize)>,
}

impl KillSchedule {
    /// `kills` kills of random subtasks among `subtasks`, at random progress
    /// inside the middle 90% of a run of `records` records.
    pub fn new(seed: u64, kills: usize, records: u64, subtasks: usize) -> Self {
        let mut rng = SplitMix64::new(seed ^ 0x6b69_6c6c);
        let mut kills: Vec<(u64, usize)> = (0..kills)
            .map(|_| {
                // Inside the middle 90% of the run, so that every kill lands
                // while the job is still running.
                let at = records / 20 + rng.next_below(records - records / 10 + 1);
                (at, rng.next_below(subtasks as u64) as usize)
            })
            .collect();
        kills.sort_unstable();
        KillSchedule { kills }
    }

    /// Kills not yet due.
    pub fn remaining(&self) -> usize {
        self.kills.len()
    }

    /// The next kill, if it is due once `progress` records were read. One at
    /// a time: the runtime takes the next only from a restored attempt, so
    /// that every kill costs a restart.
    pub fn pop_due(&mut self, progress: u64) -> Option<usize> {
        let (at, subtask) = *self.kills.first()?;
        (at <= progress).then(|| {
            self.kills.remove(0);
            subtask
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_kills_inside_the_run() {
        let a = KillSchedule::new(42, 5, 1_000_000, 6);
        assert_eq!(a, KillSchedule::new(42, 5, 1_000_000, 6));
        assert_ne!(a, KillSchedule::new(43, 5, 1_000_000, 6));
        for &(at, subtask) in &a.kills {
            assert!((50_000..=950_000).contains(&at), "{at}");
            assert!(subtask < 6);
        }
    }

    #[test]
    fn kills_are_due_once_in_order_of_progress() {
        let mut s = KillSchedule::new(1, 3, 1000, 2);
        let all = s.kills.clone();
        assert_eq!(s.pop_due(0), None);
        assert_eq!(s.pop_due(all[1].0), Some(all[0].1));
        assert_eq!(s.pop_due(all[1].0), Some(all[1].1));
        assert_eq!(s.pop_due(all[1].0), None);
        assert_eq!(s.pop_due(u64::MAX), Some(all[2].1));
        assert_eq!(s.pop_due(u64::MAX), None);
    }
}
