//! The simulated supervisor: the core's [`JobLifecycle`] decides which
//! attempt runs, when it restarts and when the job is over; this carries
//! out its actions as the supervisor actor does, and kills the driver.

use super::storage::{Op, WriteFault};
use super::task::{self, Role, Task, CHANNELS, SINK, SOURCES};
use super::{Channel, Failed, Sim};
use crate::checkpoint::job_checkpoints::JobEvent;
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
                LifeAction::Restart { reason, .. } => {
                    self.tasks.clear();
                    self.channels.clear();
                    self.coordinate(JobEvent::AttemptFailed { reason })?;
                    self.coordinate(JobEvent::RestoreWanted)?;
                }
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

    /// The driver answered which checkpoint to restore: the load of the
    /// attempt booting or restarting is done.
    pub(super) fn loaded(&mut self, latest: Option<CompletedCheckpoint>) -> Result<(), Failed> {
        self.loaded = Some(latest);
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
        self.tasks = (0..=SINK)
            .map(|t| Task::restored(t, from.as_ref(), &self.storage, instance))
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
        self.driver = super::driver(&self.storage, &self.setup, self.now());
        self.life = lifecycle();
        self.coordinate(JobEvent::RestoreWanted)
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
