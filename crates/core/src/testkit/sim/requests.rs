//! Manual checkpoints, savepoints and stops with a savepoint, as the REST
//! API asks for them: each request is answered exactly once; one that
//! succeeded names a checkpoint that completed, or a savepoint whose copy
//! held the state at its barrier; a stop that succeeded ends the run. A
//! checkpoint asked for may be a rescale's, which replaces the running
//! attempt once it completed.

use super::storage::{Op, Savepoint, Storage};
use super::{Failed, Sim};
use crate::checkpoint::coordinator::RequestId;
use crate::checkpoint::job_checkpoints::{JobEvent, Resolved};
use crate::checkpoint::{savepoint, CheckpointFailure, CompletedCheckpoint};
use crate::cluster::lifecycle::LifeEvent;
use crate::model::event::CheckpointKind;
use crate::model::ids::CheckpointId;

impl Sim {
    /// Whether a request may be made now: some are left and an attempt
    /// runs.
    pub(super) fn can_request(&self) -> bool {
        self.requests.left > 0 && self.t >= self.requests.at && !self.tasks.is_empty()
    }

    /// Asks for a checkpoint, a savepoint, or (in the first run) a stop
    /// with a savepoint.
    pub(super) fn request(&mut self) -> Result<(), Failed> {
        self.requests.left -= 1;
        self.requests.at = self.t + self.rng.next_below(1_500);
        let request = self.requests.next;
        self.requests.next += 1;
        let (kind, stop) = match self.rng.next_below(3) {
            0 => (CheckpointKind::Checkpoint, false),
            n => (
                CheckpointKind::Savepoint,
                n == 2 && self.started_from.is_none(),
            ),
        };
        self.requests.open.insert(request, kind);
        if stop {
            self.requests.stops.insert(request);
        }
        self.coordinate(JobEvent::Trigger {
            request,
            kind,
            stop,
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
        let stop = self.requests.stops.remove(&request);
        let Ok(resolved) = result else {
            return Ok(());
        };
        let id = resolved.checkpoint;
        let known = match kind {
            CheckpointKind::Checkpoint => self.requests.completed.contains(&id),
            CheckpointKind::Savepoint => self.requests.savepoints.contains(&id),
        };
        if !known {
            return Err(format!(
                "request {request} answered with {id}, which never completed"
            ));
        }
        if stop {
            self.stopped_with(id)?;
        } else if kind == CheckpointKind::Checkpoint && self.rng.next_below(2) == 0 {
            // A rescale's checkpoint: the running attempt gives way to
            // the next, restored from the latest checkpoint.
            self.supervise(LifeEvent::Rescale(self.attempt()))?;
        }
        Ok(())
    }

    /// The job stops after savepoint `id`. Every subtask first takes what
    /// its mailbox holds, the sink's commit of the savepoint included: the
    /// supervisor actor's stop follows that notification. The next run
    /// resumes from the savepoint.
    fn stopped_with(&mut self, id: CheckpointId) -> Result<(), Failed> {
        for t in 0..self.tasks.len() {
            while self
                .tasks
                .get(t)
                .is_some_and(|t| !t.dead && !t.mail.is_empty())
            {
                self.take_mail(t)?;
            }
        }
        self.stopped = Some(id);
        self.supervise(LifeEvent::Ended(Ok(())))
    }

    /// The savepoint's copy lands (its state checked while the objects it
    /// copies are still there) into a directory of its own, or fails.
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
            self.copy_savepoint(&checkpoint)?;
            self.requests.savepoints.insert(id);
            Ok(format!("savepoints/{}", id.0))
        };
        self.coordinate(JobEvent::SavepointWritten {
            checkpoint: id,
            result,
        })
    }

    /// Copies `checkpoint`'s objects into its savepoint's directory, as
    /// the savepoint copier does, by the core's plan.
    fn copy_savepoint(&mut self, checkpoint: &CompletedCheckpoint) -> Result<(), Failed> {
        let (relocated, copies) = savepoint::relocate(checkpoint);
        let mut directory = Storage::default();
        for copy in copies {
            let from = copy.from.physical().ok_or("a copy of inline state")?;
            let bytes = self.storage.read(from)?.to_vec();
            directory.objects.insert(copy.to, bytes);
        }
        let savepoint = Savepoint {
            checkpoint: relocated,
            directory,
        };
        self.storage.savepoints.insert(checkpoint.id, savepoint);
        Ok(())
    }

    pub(super) fn write_savepoint(&mut self, checkpoint: CompletedCheckpoint) {
        let fails = self.chance(self.faults.metadata);
        self.ops.push(Op::Savepoint {
            checkpoint: Box::new(checkpoint),
            fails,
        });
    }
}
