//! Manual checkpoints and savepoints, as the REST API asks for them: each
//! request is answered exactly once; one that succeeded names a checkpoint
//! that completed, or a savepoint whose copy held the state at its barrier.

use super::storage::Op;
use super::{Failed, Sim};
use crate::checkpoint::coordinator::RequestId;
use crate::checkpoint::job_checkpoints::{JobEvent, Resolved};
use crate::checkpoint::{CheckpointFailure, CompletedCheckpoint};
use crate::model::event::CheckpointKind;

impl Sim {
    /// Whether a request may be made now: some are left and an attempt
    /// runs.
    pub(super) fn can_request(&self) -> bool {
        self.requests.left > 0 && self.t >= self.requests.at && !self.tasks.is_empty()
    }

    /// Asks for a checkpoint or a savepoint.
    pub(super) fn request(&mut self) -> Result<(), Failed> {
        self.requests.left -= 1;
        self.requests.at = self.t + self.rng.next_below(1_500);
        let request = self.requests.next;
        self.requests.next += 1;
        let kind = match self.rng.next_below(2) {
            0 => CheckpointKind::Checkpoint,
            _ => CheckpointKind::Savepoint,
        };
        self.requests.open.insert(request, kind);
        self.coordinate(JobEvent::Trigger {
            request,
            kind,
            stop: false,
            savepoint_dir: true,
        })
    }

    /// The answer to `request`.
    pub(super) fn resolved(
        &mut self,
        request: RequestId,
        result: Result<Resolved, CheckpointFailure>,
    ) -> Result<(), Failed> {
        let Some(kind) = self.requests.open.remove(&request) else {
            return Err(format!("request {request} answered twice, or never made"));
        };
        let Ok(resolved) = result else {
            return Ok(());
        };
        let id = resolved.checkpoint;
        let known = match kind {
            CheckpointKind::Checkpoint => self.requests.completed.contains(&id),
            CheckpointKind::Savepoint => self.requests.savepoints.contains(&id),
        };
        if known {
            Ok(())
        } else {
            Err(format!(
                "request {request} answered with {id}, which never completed"
            ))
        }
    }

    /// The savepoint's copy lands (its state checked while the objects it
    /// copies are still there) or fails.
    pub(super) fn savepoint_written(
        &mut self,
        checkpoint: CompletedCheckpoint,
        fails: bool,
    ) -> Result<(), Failed> {
        let id = checkpoint.id;
        let result = if fails {
            Err("injected".to_owned())
        } else {
            self.check_state_at_barrier(&checkpoint)?;
            self.requests.savepoints.insert(id);
            Ok(format!("savepoints/{}", id.0))
        };
        self.coordinate(JobEvent::SavepointWritten {
            checkpoint: id,
            result,
        })
    }

    pub(super) fn write_savepoint(&mut self, checkpoint: CompletedCheckpoint) {
        let fails = self.chance(self.faults.metadata);
        self.ops.push(Op::Savepoint {
            checkpoint: Box::new(checkpoint),
            fails,
        });
    }
}
