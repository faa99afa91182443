//! The simulated supervisor: the core's [`JobLifecycle`] decides which
//! attempt runs, when it restarts and when the job is over; this carries
//! out its actions as the supervisor actor does, kills workers and the
//! driver, and starts the run that resumes from a stopping savepoint.

use super::storage::{Op, WriteFault};
use super::task::{self, Role, Task, CHANNELS, SINK, SOURCES};
use super::{Channel, Failed, Sim};
use crate::checkpoint::job_checkpoints::JobEvent;
use crate::checkpoint::store::CompletedCheckpointStore;
use crate::checkpoint::{ends_input, CompletedCheckpoint};
use crate::cluster::lifecycle::{JobLifecycle, LifeAction, LifeEvent, Outcome, Phase};
use crate::cluster::restart::RestartStrategy;
use crate::model::channel::{CreditReceiver, CreditSender};
use crate::model::ids::Attempt;
use std::time::Duration;

/// Restarts never run out: every failure injected is one the job must
/// survive.
pub(super) fn lifecycle() -> JobLifecycle {
    let strategy = RestartStrategy::FixedDelay {
        delay: Duration::ZERO,
        max_attempts: u32::MAX,
    };
    JobLifecycle::new(strategy, true)
}

impl Sim {
    /// Tells the lifecycle `event` and carries out what it decides.
    pub(super) fn supervise(&mut self, event: LifeEvent<String>) -> Result<(), Failed> {
        for action in self.life.handle(event) {
            match action {
                LifeAction::Deploy(attempt) => {
                    let from = self.loaded.take().ok_or("deployed before loading")?;
                    self.deploy(attempt, from)?;
                }
                LifeAction::Announce(attempt) => self.announce(attempt)?,
                LifeAction::Restart { reason, .. } => self.replace_attempt(reason)?,
                LifeAction::Rescale(_) => self.replace_attempt("rescaling".into())?,
                LifeAction::Finish(Outcome::Succeeded) => {
                    self.tasks.clear();
                    self.channels.clear();
                    self.coordinate(JobEvent::Shutdown)?;
                }
                LifeAction::Finish(outcome) => return Err(format!("the job failed: {outcome:?}")),
            }
        }
        Ok(())
    }

    /// Stops the attempt, as the actors stop, abandons its pending
    /// checkpoints and asks which checkpoint the next one restores.
    fn replace_attempt(&mut self, reason: String) -> Result<(), Failed> {
        self.tasks.clear();
        self.channels.clear();
        self.coordinate(JobEvent::AttemptFailed { reason })?;
        self.coordinate(JobEvent::RestoreWanted)
    }

    /// The driver answered which checkpoint to restore: the load of the
    /// attempt booting or restarting is done.
    pub(super) fn loaded(&mut self, latest: Option<CompletedCheckpoint>) -> Result<(), Failed> {
        self.loaded = Some(latest.or_else(|| self.started_from.clone()));
        match self.life.phase() {
            Phase::Booting => self.supervise(LifeEvent::Booted),
            Phase::Restarting { attempt } => self.supervise(LifeEvent::Loaded {
                attempt,
                result: Ok(()),
            }),
            // An answer to an earlier request; the one it restarted for
            // is deployed already.
            _ => Ok(()),
        }
    }

    /// Task `t` of the running attempt finished its part.
    pub(super) fn task_finished(&mut self, t: usize) -> Result<(), Failed> {
        let task = &mut self.tasks[t];
        if task.finished {
            return Ok(());
        }
        task.finished = true;
        self.supervise(LifeEvent::SubtaskFinished(self.life.attempt()))
    }

    /// Deploys `attempt` from `from`, checked to hold the state at its
    /// barrier; its sink commits the transactions `from` holds.
    fn deploy(
        &mut self,
        attempt: Attempt,
        from: Option<CompletedCheckpoint>,
    ) -> Result<(), Failed> {
        if let Some(from) = &from {
            self.report.restores += 1;
            self.driver.restore(from);
            self.check_state_at_barrier(from)?;
        }
        self.instance += 1;
        let instance = self.instance;
        let storage = from
            .as_ref()
            .map_or(&self.storage, |c| self.storage.holding(c));
        self.tasks = (0..=SINK)
            .map(|t| Task::restored(t, from.as_ref(), storage, instance))
            .collect::<Result<_, _>>()?;
        self.channels = (0..CHANNELS).map(|_| channel()).collect();
        // What an unaligned checkpoint captured goes out again first.
        for task in &mut self.tasks {
            for (output, batches) in std::mem::take(&mut task.replay) {
                let sender = &mut self.channels[task.outputs[output]].sender;
                batches
                    .into_iter()
                    .for_each(|b| sender.push(crate::model::event::ChannelEvent::Batch(b)));
            }
        }
        if let Role::Sink { pending, .. } = &mut self.tasks[SINK].role {
            let restored = std::mem::take(pending);
            self.commit(restored)?;
        }
        let sources: Vec<_> = (0..SOURCES).map(task::subtask_id).collect();
        self.input_ended = from.as_ref().is_some_and(|c| ends_input(c, &sources));
        let subtasks = self.tasks.len();
        self.supervise(LifeEvent::Deployed {
            attempt,
            subtasks,
            workers: 0,
        })
    }

    fn announce(&mut self, attempt: Attempt) -> Result<(), Failed> {
        self.coordinate(JobEvent::Deployed {
            attempt,
            sources: (0..SOURCES).map(task::subtask_id).collect(),
            subtasks: (0..=SINK).map(task::subtask_id).collect(),
            input_ended: self.input_ended,
        })
    }

    /// Power loss of the driver and every task. Each call in flight has
    /// landed or not, a deletion partly (metadata first); a new driver
    /// recovers from storage and a new lifecycle boots.
    pub(super) fn kill_driver(&mut self) -> Result<(), Failed> {
        self.report.driver_kills += 1;
        for op in std::mem::take(&mut self.ops) {
            if self.rng.next_below(2) == 0 {
                continue;
            }
            match op {
                Op::StoreId { next_id, fails, .. } if !fails => {
                    self.storage.next_id = Some(next_id)
                }
                Op::Metadata { checkpoint, fault } if fault != Some(WriteFault::Failed) => {
                    self.storage.metadata.insert(checkpoint.id, *checkpoint);
                }
                Op::Delete { checkpoints, paths } => {
                    for id in checkpoints {
                        self.storage.metadata.remove(&id);
                    }
                    let done = self.rng.next_below(paths.len() as u64 + 1) as usize;
                    for path in &paths[..done] {
                        self.storage.objects.remove(path);
                    }
                }
                Op::Upload { objects, fails, .. } if !fails => self.storage.objects.extend(objects),
                _ => {}
            }
        }
        self.tasks.clear();
        self.channels.clear();
        self.mail.clear();
        self.failures.clear();
        // Their clients lost the connection.
        self.requests.open.clear();
        self.storing_id = false;
        let store = self.restarted_store();
        self.driver = super::driver(&self.storage, store, &self.setup, self.now());
        self.life = lifecycle();
        self.coordinate(JobEvent::RestoreWanted)
    }

    /// What a restarted driver retains: the newest checkpoints of the job
    /// directory (`--restore latest`). A run resumed from a savepoint
    /// resumes from it again until a checkpoint of its own is newer:
    /// `latest` would find the stopped run's checkpoints, older than the
    /// savepoint whose output the sink committed, and duplicate it.
    fn restarted_store(&self) -> CompletedCheckpointStore {
        let newest = self.storage.metadata.keys().next_back();
        match &self.started_from {
            Some(from) if newest.is_none_or(|id| *id < from.id) => {
                CompletedCheckpointStore::new(self.setup.retain)
            }
            _ => self.storage.recover(self.setup.retain),
        }
    }

    /// A worker process dies with the subtasks it hosts: they stop where
    /// they are, their uploads in flight end half written (garbage nobody
    /// acknowledges), and the supervisor hears of it later.
    pub(super) fn kill_worker(&mut self) -> Result<(), Failed> {
        self.report.worker_kills += 1;
        let w = self.rng.next_below(2) as usize;
        let hosted = self.faults.workers[w].clone();
        for &t in &hosted {
            self.tasks[t].dead = true;
            self.tasks[t].mail.clear();
        }
        for op in std::mem::take(&mut self.ops) {
            match op {
                Op::Upload {
                    task,
                    objects,
                    fails,
                    ..
                } if hosted.contains(&task) => {
                    let written = if fails {
                        0
                    } else {
                        self.rng.next_below(objects.len() as u64 + 1) as usize
                    };
                    for (path, bytes) in objects.into_iter().take(written) {
                        self.garbage.insert(path.clone());
                        self.storage.objects.insert(path, bytes);
                    }
                }
                op => self.ops.push(op),
            }
        }
        let lost = (Some(self.attempt()), format!("worker {w} was lost"));
        self.failures.push_back(lost);
        Ok(())
    }

    /// After a stop with a savepoint, a new run of the job resumes from it
    /// (`--restore DIR`, which the run never claims): its driver retains
    /// nothing yet. Returns whether a run started.
    pub(super) fn resume(&mut self) -> Result<bool, Failed> {
        let Some(id) = self.stopped.take() else {
            return Ok(false);
        };
        self.report.stops += 1;
        let savepoint = self
            .storage
            .savepoints
            .get(&id)
            .ok_or("no savepoint to resume")?;
        self.started_from = Some(savepoint.checkpoint.clone());
        let store = CompletedCheckpointStore::new(self.setup.retain);
        self.driver = super::driver(&self.storage, store, &self.setup, self.now());
        self.life = lifecycle();
        self.shut_down = false;
        self.coordinate(JobEvent::RestoreWanted)?;
        Ok(true)
    }
}

fn channel() -> Channel {
    let receiver = CreditReceiver::new(2, 1);
    let mut sender = CreditSender::default();
    sender.grant(receiver.initial_credits());
    Channel {
        sender,
        receiver,
        held: 0,
    }
}
