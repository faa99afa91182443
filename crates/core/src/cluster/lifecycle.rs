//! The life of one job run, sans-IO: booting, deploying an attempt,
//! running it, restarting after a failure, finishing, as one enum
//! ([`Phase`]) instead of flags spread over the supervisor actor. The
//! supervisor feeds it what happened ([`LifeEvent`]) and carries out what
//! it decides ([`LifeAction`]); the rules, each a test below:
//!
//! - Messages of an older attempt (a finish, a failure, a worker's
//!   readiness, a restart's loaded state) are dropped.
//! - The outcome is decided once; nothing after it starts or restarts.
//! - Without checkpointing a failure fails the job; with it, every failure
//!   counts against the restart strategy, which gives the delay before
//!   the next attempt or gives up (`RestartsExhausted`).
//! - A failure not tied to an attempt (checkpointing failed) blames the
//!   running one; while restarting there is none to blame, and it is
//!   dropped rather than restarting twice.
//! - An attempt hosted by worker processes runs once every worker started
//!   its share; the job succeeds when every subtask of the running
//!   attempt finished.
//! - A restart whose state failed to load with a transient storage error
//!   restarts again; any other load error fails the job.
//! - A rescale replaces the running attempt with the next one, restored
//!   from the checkpoint just completed, without a delay and without
//!   counting against the restart strategy; an attempt not running (still
//!   deploying, restarting, or older), or one of whose subtasks finished
//!   (the job is ending), is not rescaled.

use crate::cluster::restart::RestartStrategy;
use crate::model::ids::Attempt;
use std::time::Duration;

/// Where the run stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Opening the coordinator and loading the state to start from.
    Booting,
    /// The attempt is being deployed; `workers`: worker processes yet to
    /// start their share.
    Deploying {
        /// The attempt.
        attempt: Attempt,
        /// Worker processes yet to start their share (0: not known yet).
        workers: usize,
        /// Subtasks yet to finish.
        unfinished: usize,
    },
    /// The attempt runs.
    Running {
        /// The attempt.
        attempt: Attempt,
        /// Subtasks yet to finish.
        unfinished: usize,
    },
    /// The failed attempt stops, the restart delay runs and the state of
    /// `attempt` loads.
    Restarting {
        /// The attempt to come.
        attempt: Attempt,
    },
    /// The outcome is decided.
    Finished,
}

/// What the supervisor tells the machine.
#[derive(Debug)]
pub enum LifeEvent<E> {
    /// The coordinator is open and the first state loaded.
    Booted,
    /// `attempt` was deployed with `subtasks` subtasks, on `workers` worker
    /// processes (0: in this process, running at once).
    Deployed {
        /// The attempt.
        attempt: Attempt,
        /// Its subtasks.
        subtasks: usize,
        /// Worker processes that must each report their share started.
        workers: usize,
    },
    /// A worker process started its share of `attempt`.
    WorkerDeployed(Attempt),
    /// A subtask of `attempt` finished its input.
    SubtaskFinished(Attempt),
    /// Something failed: a subtask of `attempt`, or with `None` the run
    /// itself (checkpointing, deploying).
    Failed {
        /// The attempt it belongs to; `None`: the current one.
        attempt: Option<Attempt>,
        /// What failed.
        error: E,
    },
    /// The state `attempt` restores from was loaded, or not.
    Loaded {
        /// The attempt of the restart.
        attempt: Attempt,
        /// The load's error, and whether it was transient.
        result: Result<(), (E, bool)>,
    },
    /// The checkpoint a rescale of `attempt` waited for completed: the
    /// next attempt runs at the new parallelism.
    Rescale(Attempt),
    /// The run ends now: cancelled, stopped with a savepoint, or unable to
    /// boot.
    Ended(Result<(), E>),
}

/// How the run ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome<E> {
    /// Every subtask finished, or a stop with a savepoint completed.
    Succeeded,
    /// A failure that no restart may recover.
    Failed(E),
    /// The restart strategy gave up after `restarts` restarts.
    RestartsExhausted {
        /// Restarts made.
        restarts: u32,
        /// The failure it gave up on.
        last: E,
    },
}

/// What the supervisor must do.
#[derive(Debug, PartialEq, Eq)]
pub enum LifeAction<E> {
    /// Deploy `attempt` with the state just loaded, then report
    /// [`LifeEvent::Deployed`].
    Deploy(Attempt),
    /// `attempt` runs: tell the coordinator, record the recovery.
    Announce(Attempt),
    /// Stop the failed attempt, abort its pending checkpoints (`reason`),
    /// wait `delay`, load the latest checkpoint's state and report
    /// [`LifeEvent::Loaded`] for `attempt`.
    Restart {
        /// The next attempt.
        attempt: Attempt,
        /// The restart strategy's wait.
        delay: Duration,
        /// Why, for the pending checkpoints' abort and the log.
        reason: String,
    },
    /// Stop the running attempt at once, load the latest checkpoint's
    /// state at the new parallelism and report [`LifeEvent::Loaded`] for
    /// `attempt`, the next one.
    Rescale(Attempt),
    /// Stop the attempt and the coordinator and report `Outcome`.
    Finish(Outcome<E>),
}

/// The phase of one run and its restart count.
#[derive(Debug)]
pub struct JobLifecycle {
    phase: Phase,
    attempt: Attempt,
    restarts: u32,
    strategy: RestartStrategy,
    checkpointing: bool,
    /// Subtasks of the attempt deployed last.
    subtasks: usize,
}

impl JobLifecycle {
    /// A run booting; without `checkpointing` nothing restarts.
    pub fn new(strategy: RestartStrategy, checkpointing: bool) -> Self {
        JobLifecycle {
            phase: Phase::Booting,
            attempt: Attempt(0),
            restarts: 0,
            strategy,
            checkpointing,
            subtasks: 0,
        }
    }

    /// Where the run stands.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The attempt deployed, running or to come (the last one once
    /// finished).
    pub fn attempt(&self) -> Attempt {
        self.attempt
    }

    /// Restarts so far.
    pub fn restarts(&self) -> u32 {
        self.restarts
    }

    /// Whether `attempt` is still the one to deploy or run.
    pub fn is_current(&self, attempt: Attempt) -> bool {
        !matches!(self.phase, Phase::Finished) && attempt == self.attempt()
    }

    /// Applies `event`; returns what to do.
    pub fn handle<E: ToString>(&mut self, event: LifeEvent<E>) -> Vec<LifeAction<E>> {
        if self.phase == Phase::Finished {
            return Vec::new();
        }
        match event {
            LifeEvent::Booted if self.phase == Phase::Booting => self.deploy(Attempt(0)),
            LifeEvent::Booted => Vec::new(),
            LifeEvent::Deployed {
                attempt,
                subtasks,
                workers,
            } => self.deployed(attempt, subtasks, workers),
            LifeEvent::WorkerDeployed(attempt) => self.worker_deployed(attempt),
            LifeEvent::SubtaskFinished(attempt) => self.subtask_finished(attempt),
            LifeEvent::Failed { attempt, error } => self.failed(attempt, error),
            LifeEvent::Loaded { attempt, result } => match result {
                _ if self.phase != (Phase::Restarting { attempt }) => Vec::new(),
                Ok(()) => self.deploy(attempt),
                Err((error, true)) => self.restart(attempt, error),
                Err((error, false)) => self.finish(Outcome::Failed(error)),
            },
            LifeEvent::Rescale(attempt) => self.rescale(attempt),
            LifeEvent::Ended(Ok(())) => self.finish(Outcome::Succeeded),
            LifeEvent::Ended(Err(error)) => self.finish(Outcome::Failed(error)),
        }
    }

    fn deploy<E>(&mut self, attempt: Attempt) -> Vec<LifeAction<E>> {
        self.attempt = attempt;
        self.phase = Phase::Deploying {
            attempt,
            workers: 0,
            unfinished: 0,
        };
        vec![LifeAction::Deploy(attempt)]
    }

    fn deployed<E>(
        &mut self,
        attempt: Attempt,
        subtasks: usize,
        workers: usize,
    ) -> Vec<LifeAction<E>> {
        if !matches!(self.phase, Phase::Deploying { attempt: a, .. } if a == attempt) {
            return Vec::new();
        }
        self.subtasks = subtasks;
        self.phase = Phase::Deploying {
            attempt,
            workers,
            unfinished: subtasks,
        };
        if workers > 0 {
            return Vec::new();
        }
        self.phase = Phase::Running {
            attempt,
            unfinished: subtasks,
        };
        vec![LifeAction::Announce(attempt)]
    }

    fn worker_deployed<E>(&mut self, attempt: Attempt) -> Vec<LifeAction<E>> {
        let Phase::Deploying {
            attempt: current,
            workers,
            unfinished,
        } = &mut self.phase
        else {
            return Vec::new();
        };
        if *current != attempt || *workers == 0 {
            return Vec::new();
        }
        *workers -= 1;
        if *workers > 0 {
            return Vec::new();
        }
        self.phase = Phase::Running {
            attempt,
            unfinished: *unfinished,
        };
        vec![LifeAction::Announce(attempt)]
    }

    fn subtask_finished<E>(&mut self, attempt: Attempt) -> Vec<LifeAction<E>> {
        let (Phase::Running {
            attempt: current,
            unfinished,
        }
        | Phase::Deploying {
            attempt: current,
            unfinished,
            ..
        }) = &mut self.phase
        else {
            return Vec::new();
        };
        if *current != attempt || *unfinished == 0 {
            return Vec::new();
        }
        *unfinished -= 1;
        if *unfinished > 0 {
            return Vec::new();
        }
        self.finish(Outcome::Succeeded)
    }

    fn failed<E: ToString>(&mut self, attempt: Option<Attempt>, error: E) -> Vec<LifeAction<E>> {
        let current = match self.phase {
            Phase::Deploying { attempt, .. } | Phase::Running { attempt, .. } => Some(attempt),
            Phase::Booting | Phase::Restarting { .. } | Phase::Finished => None,
        };
        match (current, attempt) {
            (Some(current), Some(attempt)) if attempt != current => Vec::new(),
            _ if !self.checkpointing => self.finish(Outcome::Failed(error)),
            (None, _) => Vec::new(),
            (Some(current), _) => self.restart(current, error),
        }
    }

    fn restart<E: ToString>(&mut self, failed: Attempt, error: E) -> Vec<LifeAction<E>> {
        self.restarts += 1;
        let Some(delay) = self.strategy.delay(self.restarts) else {
            return self.finish(Outcome::RestartsExhausted {
                restarts: self.restarts - 1,
                last: error,
            });
        };
        let attempt = Attempt(failed.0 + 1);
        self.attempt = attempt;
        self.phase = Phase::Restarting { attempt };
        vec![LifeAction::Restart {
            attempt,
            delay,
            reason: error.to_string(),
        }]
    }

    fn rescale<E>(&mut self, running: Attempt) -> Vec<LifeAction<E>> {
        let whole = |unfinished| unfinished == self.subtasks;
        if !matches!(self.phase, Phase::Running { attempt, unfinished } if attempt == running && whole(unfinished))
        {
            return Vec::new();
        }
        let attempt = Attempt(running.0 + 1);
        self.attempt = attempt;
        self.phase = Phase::Restarting { attempt };
        vec![LifeAction::Rescale(attempt)]
    }

    fn finish<E>(&mut self, outcome: Outcome<E>) -> Vec<LifeAction<E>> {
        self.phase = Phase::Finished;
        vec![LifeAction::Finish(outcome)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Event = LifeEvent<&'static str>;
    type Action = LifeAction<&'static str>;

    fn fixed(max_attempts: u32) -> RestartStrategy {
        RestartStrategy::FixedDelay {
            delay: Duration::from_millis(10),
            max_attempts,
        }
    }

    fn restart(attempt: u32, reason: &str) -> Action {
        LifeAction::Restart {
            attempt: Attempt(attempt),
            delay: Duration::from_millis(10),
            reason: reason.into(),
        }
    }

    /// A run of attempt 0 with `subtasks` subtasks in this process.
    fn running(strategy: RestartStrategy, subtasks: usize) -> JobLifecycle {
        let mut life = JobLifecycle::new(strategy, true);
        assert_eq!(
            life.handle::<&str>(Event::Booted),
            [LifeAction::Deploy(Attempt(0))]
        );
        let deployed = Event::Deployed {
            attempt: Attempt(0),
            subtasks,
            workers: 0,
        };
        assert_eq!(life.handle(deployed), [LifeAction::Announce(Attempt(0))]);
        life
    }

    fn failed(attempt: Option<u32>, error: &'static str) -> Event {
        LifeEvent::Failed {
            attempt: attempt.map(Attempt),
            error,
        }
    }

    #[test]
    fn the_job_succeeds_when_every_subtask_of_the_running_attempt_finished() {
        let mut life = running(fixed(3), 2);
        assert_eq!(life.handle(Event::SubtaskFinished(Attempt(0))), []);
        assert_eq!(
            life.handle(Event::SubtaskFinished(Attempt(0))),
            [LifeAction::Finish(Outcome::Succeeded)]
        );
        assert_eq!(life.phase(), Phase::Finished);
    }

    #[test]
    fn a_failure_restarts_a_new_attempt_and_drops_the_old_ones_messages() {
        let mut life = running(fixed(3), 2);
        assert_eq!(life.handle(failed(Some(0), "boom")), [restart(1, "boom")]);
        // The failed attempt's last words.
        assert_eq!(life.handle(Event::SubtaskFinished(Attempt(0))), []);
        assert_eq!(life.handle(failed(Some(0), "again")), []);
        let loaded = Event::Loaded {
            attempt: Attempt(1),
            result: Ok(()),
        };
        assert_eq!(life.handle(loaded), [LifeAction::Deploy(Attempt(1))]);
        assert_eq!(life.attempt(), Attempt(1));
    }

    #[test]
    fn the_restart_strategy_gives_up_with_the_count_and_the_last_failure() {
        let mut life = running(fixed(1), 1);
        life.handle(failed(None, "first"));
        life.handle(Event::Loaded {
            attempt: Attempt(1),
            result: Ok(()),
        });
        life.handle(Event::Deployed {
            attempt: Attempt(1),
            subtasks: 1,
            workers: 0,
        });
        assert_eq!(
            life.handle(failed(None, "second")),
            [LifeAction::Finish(Outcome::RestartsExhausted {
                restarts: 1,
                last: "second"
            })]
        );
    }

    #[test]
    fn without_checkpointing_a_failure_fails_the_job() {
        let mut life = JobLifecycle::new(fixed(3), false);
        life.handle::<&str>(Event::Booted);
        assert_eq!(
            life.handle(failed(Some(0), "boom")),
            [LifeAction::Finish(Outcome::Failed("boom"))]
        );
    }

    #[test]
    fn nothing_starts_or_restarts_once_the_outcome_is_decided() {
        let mut life = running(fixed(3), 1);
        assert_eq!(
            life.handle(Event::Ended(Err("cancelled"))),
            [LifeAction::Finish(Outcome::Failed("cancelled"))]
        );
        assert_eq!(life.handle(failed(None, "late")), []);
        assert_eq!(life.handle(Event::SubtaskFinished(Attempt(0))), []);
        assert!(!life.is_current(Attempt(0)));
    }

    #[test]
    fn a_checkpointing_failure_while_restarting_does_not_restart_twice() {
        let mut life = running(fixed(3), 1);
        life.handle(failed(Some(0), "boom"));
        assert_eq!(life.handle(failed(None, "checkpoints failed")), []);
        assert_eq!(life.attempt(), Attempt(1));
    }

    #[test]
    fn an_attempt_on_worker_processes_runs_once_every_worker_started() {
        let mut life = JobLifecycle::new(fixed(3), true);
        life.handle::<&str>(Event::Booted);
        let deployed = Event::Deployed {
            attempt: Attempt(0),
            subtasks: 4,
            workers: 2,
        };
        assert_eq!(life.handle(deployed), []);
        assert_eq!(life.handle(Event::WorkerDeployed(Attempt(0))), []);
        assert_eq!(
            life.handle(Event::WorkerDeployed(Attempt(0))),
            [LifeAction::Announce(Attempt(0))]
        );
        // A duplicate report changes nothing.
        assert_eq!(life.handle(Event::WorkerDeployed(Attempt(0))), []);
    }

    #[test]
    fn a_transient_load_failure_restarts_again_and_any_other_fails_the_job() {
        let mut life = running(fixed(5), 1);
        life.handle(failed(None, "boom"));
        let transient = Event::Loaded {
            attempt: Attempt(1),
            result: Err(("timeout", true)),
        };
        assert_eq!(life.handle(transient), [restart(2, "timeout")]);
        let corrupt = Event::Loaded {
            attempt: Attempt(2),
            result: Err(("corrupt", false)),
        };
        assert_eq!(
            life.handle(corrupt),
            [LifeAction::Finish(Outcome::Failed("corrupt"))]
        );
    }

    #[test]
    fn a_rescale_replaces_the_running_attempt_without_counting_a_restart() {
        let mut life = running(fixed(1), 2);
        assert_eq!(
            life.handle(Event::Rescale(Attempt(0))),
            [LifeAction::Rescale(Attempt(1))]
        );
        assert_eq!(life.restarts(), 0);
        // The old attempt's stop is not a failure, and a second rescale of
        // it is stale.
        assert_eq!(life.handle(failed(Some(0), "stopped")), []);
        assert_eq!(life.handle(Event::Rescale(Attempt(0))), []);
        let loaded = Event::Loaded {
            attempt: Attempt(1),
            result: Ok(()),
        };
        assert_eq!(life.handle(loaded), [LifeAction::Deploy(Attempt(1))]);
        // Not running yet: nothing to rescale.
        assert_eq!(life.handle(Event::Rescale(Attempt(1))), []);
        let deployed = Event::Deployed {
            attempt: Attempt(1),
            subtasks: 3,
            workers: 0,
        };
        assert_eq!(life.handle(deployed), [LifeAction::Announce(Attempt(1))]);
        // An attempt whose subtasks have begun to finish is not rescaled.
        assert_eq!(life.handle(Event::SubtaskFinished(Attempt(1))), []);
        assert_eq!(life.handle(Event::Rescale(Attempt(1))), []);
        // The one restart the strategy allows is still there.
        assert_eq!(life.handle(failed(None, "boom")), [restart(2, "boom")]);
    }
}
