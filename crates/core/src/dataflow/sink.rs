//! Sinks: where a job's results leave it. A transactional sink takes part in
//! checkpoints with a two-phase commit: it pre-commits at the barrier
//! (durable, not yet visible), commits when the checkpoint completes, and on
//! restore commits what the restored checkpoint pre-committed and aborts
//! everything newer. The defaults suit sinks without transactions.

use crate::dataflow::error::UserError;
use crate::model::ids::{Attempt, CheckpointId, SubtaskIndex};

/// Which sink subtask a sink is opened for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SinkContext {
    /// Which sink subtask this is.
    pub subtask: SubtaskIndex,
    /// How many sink subtasks there are.
    pub parallelism: u32,
    /// The attempt it belongs to: a sink that starts without state keeps
    /// what it writes apart from what an earlier attempt's subtask of the
    /// same index wrote (before a rescale removed it and another added
    /// it back).
    pub attempt: Attempt,
}

/// Where records of type `T` leave the job, one per sink subtask. A sink is
/// exactly-once end to end when its output becomes visible only in
/// [`commit`](Sink::commit) and [`finish`](Sink::finish); one that publishes
/// in [`write`](Sink::write) sees records again after a restore.
pub trait Sink<T>: Send {
    /// The results of one input batch.
    fn write(&mut self, records: &mut Vec<T>) -> Result<(), UserError>;

    /// End of input: make everything written durable and visible.
    fn finish(&mut self) -> Result<(), UserError>;

    /// The barrier of `checkpoint` passed: make what was written since the
    /// last barrier durable but invisible; returns the state to restore from.
    fn pre_commit(&mut self, _checkpoint: CheckpointId) -> Result<Vec<u8>, UserError> {
        Ok(Vec::new())
    }

    /// `checkpoint` completed: make everything pre-committed up to it visible.
    fn commit(&mut self, _checkpoint: CheckpointId) -> Result<(), UserError> {
        Ok(())
    }

    /// Called before any write with what `pre_commit` returned for the
    /// restored checkpoint (`None` on a fresh start).
    fn restore(&mut self, _state: Option<&[u8]>) -> Result<(), UserError> {
        Ok(())
    }

    /// Called after `restore` with what `pre_commit` returned at a subtask
    /// that a rescale to a lower parallelism removed: commit it, since that
    /// subtask will not.
    fn adopt(&mut self, _state: &[u8]) -> Result<(), UserError> {
        Ok(())
    }
}
