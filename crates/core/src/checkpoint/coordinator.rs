//! The checkpoint coordinator, after Flink's `CheckpointCoordinator`, as a
//! sans-IO state machine: it decides when a checkpoint starts, collects the
//! subtasks' acknowledgements, and decides when each checkpoint completes,
//! fails or is subsumed. The shell feeds it events with the current time and
//! carries out the actions it returns — run the master hooks, persist the id
//! counter, send barriers and notifications, write `_metadata`, delete
//! discarded state — and arms a timer at
//! [`CheckpointCoordinator::poll_timeout`] after every call. It owns no clock,
//! timer, storage, channel or user code: the master hooks run in the shell,
//! which reports their states back with [`Event::HooksTriggered`].
//!
//! A rejected event changes nothing: `handle` validates the event before it
//! looks at the clock, so an error never swallows actions that are due.

use super::stats::{CheckpointType, StatsEvent};
use super::{Ack, CheckpointFailure, CheckpointPolicy, CompletedCheckpoint, SubtaskState};
use crate::model::event::{Alignment, Barrier, CheckpointKind, CheckpointOptions};
use crate::model::graph::{Edge, JobGraph, OperatorSpec};
use crate::model::ids::{CheckpointId, SubtaskId};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::mem;
use std::time::Instant;

/// Names a manual trigger, chosen by the shell, so that its
/// `Action::Resolve` can be routed back to whoever asked.
pub type RequestId = u64;

/// Ended checkpoints remembered, so that a late message for one of them can
/// be told from a bogus id (Flink keeps 16 as well).
const RECENTLY_ENDED: usize = 16;

/// Wall and monotonic time of one step: the instant drives timers, the Unix
/// milliseconds go into barriers.
#[derive(Clone, Copy, Debug)]
pub struct Now {
    /// Monotonic time: timeouts, intervals and pauses.
    pub instant: Instant,
    /// Wall time, milliseconds since the Unix epoch: barrier timestamps.
    pub unix_ms: u64,
}

/// What the shell tells the coordinator, one event per
/// [`CheckpointCoordinator::handle`] call.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A timer fired (or any moment the shell wants the coordinator to look
    /// at the clock). Only a Tick starts a periodic checkpoint.
    Tick,
    /// Manual trigger of a checkpoint or savepoint; answered with
    /// `Action::Resolve`.
    Trigger {
        /// Names the request in its `Resolve`.
        request: RequestId,
        /// Checkpoint or savepoint.
        kind: CheckpointKind,
    },
    /// A subtask acknowledged a checkpoint with its state (Flink's
    /// `AcknowledgeCheckpoint`), boxed: its state is large beside the
    /// other events.
    Ack(Box<Ack>),
    /// A subtask abandoned a checkpoint (Flink's `DeclineCheckpoint`): the
    /// checkpoint fails.
    Decline {
        /// The declined checkpoint.
        checkpoint: CheckpointId,
        /// The subtask that declined.
        subtask: SubtaskId,
        /// Why, for the failure.
        reason: String,
    },
    /// The shell made a finalized checkpoint durable (metadata written,
    /// added to the completed-checkpoint store).
    Persisted(CheckpointId),
    /// The shell could not make a finalized checkpoint durable: it fails.
    PersistFailed {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// The storage error.
        reason: String,
    },
    /// The job is restarting or stopping: abandon everything pending and
    /// queued.
    AbortAll {
        /// Why, for the failures reported.
        reason: String,
    },
    /// The shell ran the master hooks an `Action::TriggerHooks` asked for.
    /// Dropped if the checkpoint ended meanwhile.
    HooksTriggered {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// Each hook's state by its name (a hook that returned none is
        /// absent), or the first hook's failure.
        result: Result<BTreeMap<String, Vec<u8>>, HookError>,
    },
}

/// What the shell must do, in order.
#[derive(Debug, PartialEq)]
pub enum Action {
    /// Run every master hook's `trigger` for this checkpoint and feed back
    /// `Event::HooksTriggered`; its barriers wait for it.
    TriggerHooks(CheckpointId),
    /// Persist the id counter (`next_id` = barrier.id + 1) then tell every
    /// source subtask to inject this barrier.
    Trigger {
        /// The barrier the sources inject.
        barrier: Barrier,
        /// The counter value to persist first.
        next_id: CheckpointId,
        /// A savepoint that stops the job (Flink's synchronous savepoint):
        /// the sources emit nothing after its barrier, unless it fails.
        suspend: bool,
    },
    /// Every subtask acknowledged: write `_metadata`, add to the store, then
    /// feed back Persisted or PersistFailed.
    Finalize(CompletedCheckpoint),
    /// Tell every subtask that the checkpoint completed (two-phase-commit
    /// sinks commit, incremental backends move their base). Not sent for an
    /// intermediate savepoint, only for one that stops the job.
    NotifyComplete(CheckpointId),
    /// Tell every subtask that the checkpoint was aborted, so that they
    /// cancel its running asynchronous part.
    NotifyAbort {
        /// The aborted checkpoint.
        checkpoint: CheckpointId,
        /// Why.
        reason: CheckpointFailure,
    },
    /// Delete the objects these states wrote (an aborted checkpoint's acks,
    /// a late ack).
    Discard {
        /// The checkpoint the states belong to.
        checkpoint: CheckpointId,
        /// The states whose objects to delete.
        states: Vec<SubtaskState>,
    },
    /// Consecutive failures exceeded the tolerable number.
    FailJob(String),
    /// Record this in the checkpoint statistics, in order with the rest.
    Stats(StatsEvent),
    /// Answer manual request `request`: the id of its completed checkpoint,
    /// or why it failed.
    Resolve {
        /// The request of the `Event::Trigger`.
        request: RequestId,
        /// Its outcome.
        result: Result<CheckpointId, CheckpointFailure>,
    },
}

/// An event that contradicts what the coordinator knows; it was not applied.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CoordinatorError {
    /// An ack or decline of an id that was never triggered or ended too long
    /// ago to be remembered.
    #[error("{subtask} reported on unknown checkpoint {checkpoint}")]
    UnknownCheckpoint {
        /// The checkpoint named.
        checkpoint: CheckpointId,
        /// The subtask that sent it.
        subtask: SubtaskId,
    },
    /// An ack or decline from a subtask that is not part of the job.
    #[error("{subtask} is not expected to acknowledge checkpoint {checkpoint}")]
    UnknownSubtask {
        /// The checkpoint named.
        checkpoint: CheckpointId,
        /// The subtask that sent it.
        subtask: SubtaskId,
    },
    /// A second ack of a subtask for a checkpoint it already acknowledged.
    #[error("{subtask} acknowledged checkpoint {checkpoint} twice")]
    DuplicateAck {
        /// The checkpoint named.
        checkpoint: CheckpointId,
        /// The subtask that sent it.
        subtask: SubtaskId,
    },
    /// Persisted or PersistFailed for a checkpoint that was never handed out
    /// with `Action::Finalize`, or whose outcome is already known.
    #[error("checkpoint {checkpoint} is not being finalized")]
    NotFinalizing {
        /// The checkpoint named.
        checkpoint: CheckpointId,
    },
    /// An ack or decline of a checkpoint whose barriers have not gone out.
    #[error("{subtask} reported on checkpoint {checkpoint} before its barrier went out")]
    BeforeBarrier {
        /// The checkpoint named.
        checkpoint: CheckpointId,
        /// The subtask that sent it.
        subtask: SubtaskId,
    },
    /// Master hooks' states for a checkpoint that never asked for them, or
    /// whose barriers went out already.
    #[error("checkpoint {checkpoint} is not waiting for its master hooks")]
    NotAwaitingHooks {
        /// The checkpoint named.
        checkpoint: CheckpointId,
    },
}

/// A master hook's error, as the shell reports it.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum HookError {
    /// `trigger` failed: the checkpoint fails before any barrier goes out.
    #[error("master hook {hook} failed on {checkpoint}: {reason}")]
    Trigger {
        /// The hook's name.
        hook: String,
        /// The checkpoint triggered.
        checkpoint: CheckpointId,
        /// The hook's error.
        reason: String,
    },
    /// `restore` failed: so does the restore.
    #[error("master hook {hook} failed to restore {checkpoint}: {reason}")]
    Restore {
        /// The hook's name.
        hook: String,
        /// The checkpoint restored.
        checkpoint: CheckpointId,
        /// The hook's error.
        reason: String,
    },
}

/// User code run on trigger and on restore (Flink's
/// `MasterTriggerRestoreHook`), by the coordinator's shell: never inside
/// [`CheckpointCoordinator::handle`], which asks for it with
/// `Action::TriggerHooks`.
pub trait MasterHook: Send {
    /// Keys the hook's state in `CompletedCheckpoint::master_states`.
    fn name(&self) -> &str;

    /// Runs before the barriers of `checkpoint` go out; the state returned
    /// is stored in its metadata. An error fails the checkpoint before any
    /// barrier goes out.
    fn trigger(&mut self, checkpoint: CheckpointId) -> Result<Option<Vec<u8>>, String>;

    /// Runs when the job resumes from `checkpoint`, with the state `trigger`
    /// returned for it (`None` if none); an error fails the restore.
    fn restore(&mut self, checkpoint: CheckpointId, state: Option<&[u8]>) -> Result<(), String>;
}

struct PendingCheckpoint {
    kind: CheckpointKind,
    /// Trigger time, Unix milliseconds.
    timestamp: u64,
    triggered: Instant,
    request: Option<RequestId>,
    acks: BTreeMap<SubtaskId, SubtaskState>,
    master_states: BTreeMap<String, Vec<u8>>,
    /// Its barriers wait for the master hooks' states: nobody has heard of
    /// it but the shell.
    awaiting_hooks: bool,
    /// Every ack is in and `Finalize` went out: the shell is persisting it,
    /// so it no longer expires.
    finalizing: bool,
}

enum Ended {
    Completed,
    /// Expired, declined, subsumed, aborted, or failed to persist: its
    /// states were discarded, so a late ack's state goes the same way.
    Failed,
    /// Aborted by `AbortAll` while the shell was persisting it. It may yet
    /// become durable, so its states are kept, not discarded, until the
    /// shell reports the outcome.
    Abandoned(Vec<SubtaskState>),
}

/// Where a checkpoint stands for a message about it, as of `now`.
enum Status<'a> {
    /// Triggered, its barriers waiting for the master hooks.
    AwaitingHooks,
    /// Triggered, waiting for acks, not expired.
    Open(&'a PendingCheckpoint),
    /// Every expected subtask acked it: finalizing, completed, or abandoned
    /// while finalizing.
    AllAcked,
    /// Ended without completing, or expires at `now`.
    Failed,
    Unknown,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// Decline, timeout or failed persist: the subtasks are told (if its
    /// barriers went out), and it counts against the tolerable failures.
    Failure,
    /// A master hook failed, so no barrier went out: nobody to tell.
    HookFailure,
    /// A newer checkpoint completed: not a failure.
    Subsumed,
    /// The job is going away: nobody to tell, not a failure.
    AbortAll,
}

/// Decides when checkpoints start and end, for one job run.
pub struct CheckpointCoordinator {
    policy: CheckpointPolicy,
    subtasks: BTreeSet<SubtaskId>,
    alignment: Alignment,
    next_id: CheckpointId,
    /// Every checkpoint's barriers wait for the master hooks' states.
    master_hooks: bool,
    /// Pending and finalizing checkpoints, iterated in id order so that the
    /// actions of one call come out in a deterministic order.
    pending: BTreeMap<CheckpointId, PendingCheckpoint>,
    /// Manual requests waiting for a free slot, FIFO. Non-empty only while
    /// every slot is taken or a checkpoint awaits its master hooks.
    queued: VecDeque<(RequestId, CheckpointKind)>,
    ended: VecDeque<(CheckpointId, Ended)>,
    consecutive_failures: u32,
    /// The periodic interval counts from here: the start, the last periodic
    /// trigger, or the last `AbortAll`.
    periodic_from: Instant,
    /// When the most recent checkpoint ended; `min_pause` counts from here.
    last_end: Option<Instant>,
    /// The request of a stop with a savepoint under way: no periodic
    /// checkpoint starts, so that nothing after the savepoint commits.
    stop: Option<RequestId>,
    /// Recorded in every checkpoint: a restore matches state to operators
    /// by uid, and channel state to edges.
    operators: Vec<OperatorSpec>,
    edges: Vec<Edge>,
}

impl CheckpointCoordinator {
    /// `subtasks`: every subtask that must acknowledge; `sources` is not
    /// needed (the shell knows them).
    /// `alignment`: the job's mode for checkpoints; savepoints are always
    /// `Alignment::Aligned`.
    /// `next_id`: first id to use (recovered from storage by the shell; ids
    /// strictly increase).
    pub fn new(
        policy: CheckpointPolicy,
        subtasks: Vec<SubtaskId>,
        alignment: Alignment,
        next_id: CheckpointId,
        now: Now,
    ) -> Self {
        CheckpointCoordinator {
            policy,
            subtasks: subtasks.into_iter().collect(),
            alignment,
            next_id,
            master_hooks: false,
            pending: BTreeMap::new(),
            queued: VecDeque::new(),
            ended: VecDeque::new(),
            consecutive_failures: 0,
            periodic_from: now.instant,
            last_end: None,
            stop: None,
            operators: Vec::new(),
            edges: Vec::new(),
        }
    }

    /// The job's operators and edges, recorded in the metadata of every
    /// checkpoint.
    pub fn record_graph(&mut self, graph: &JobGraph) {
        self.operators = graph.operators.clone();
        self.edges = graph.edges.clone();
    }

    /// From the next attempt on the job runs `graph`, at a new
    /// parallelism: its subtasks acknowledge, its operators are recorded.
    /// Told between attempts, when nothing is pending.
    pub fn rescaled(&mut self, graph: &JobGraph) {
        self.record_graph(graph);
        self.subtasks = graph.subtasks().collect();
    }

    /// Admits manual request `request` before its `Event::Trigger`. While a
    /// stop with a savepoint is under way none is: nothing may start after
    /// the savepoint that stops the job. With `stop`, `request`, a savepoint,
    /// stops the job: periodic checkpoints pause and the savepoint, unlike
    /// an intermediate one, commits side effects. If it fails, the job goes
    /// on as if no stop had been asked for.
    pub fn admit_manual(
        &mut self,
        request: RequestId,
        stop: bool,
    ) -> Result<(), CheckpointFailure> {
        if self.stopping() {
            return Err(CheckpointFailure::NotTriggered(
                "the job is stopping with a savepoint".into(),
            ));
        }
        if stop {
            self.stop = Some(request);
        }
        Ok(())
    }

    /// Whether a stop with a savepoint is under way.
    pub fn stopping(&self) -> bool {
        self.stop.is_some()
    }

    fn resolve_failed(
        &mut self,
        request: RequestId,
        failure: CheckpointFailure,
        out: &mut Vec<Action>,
    ) {
        if self.stop == Some(request) {
            self.stop = None;
        }
        out.push(Action::Resolve {
            request,
            result: Err(failure),
        });
    }

    /// The job has master hooks: from now on every checkpoint asks for
    /// their states with `Action::TriggerHooks` and sends its barriers only
    /// once they are in. Without, no round trip delays the barriers.
    pub fn await_master_hooks(&mut self) {
        self.master_hooks = true;
    }

    /// Resumes from `checkpoint`: ids go on after its id, so that nothing
    /// named after a checkpoint id (sink files) of the run it came from is
    /// written again. The shell restores the master hooks from its
    /// `master_states`.
    pub fn restore(&mut self, checkpoint: &CompletedCheckpoint) {
        self.next_id = self.next_id.max(CheckpointId(checkpoint.id.0 + 1));
    }

    /// Applies `event` at `now` and returns what the shell must do, in
    /// order: first what expired by `now`, then the event's consequences,
    /// then triggers that are due. An event that contradicts the
    /// coordinator's state is refused with nothing changed.
    pub fn handle(&mut self, now: Now, event: Event) -> Result<Vec<Action>, CoordinatorError> {
        self.check(now.instant, &event)?;
        let mut out = Vec::new();
        self.expire(now, &mut out);
        let tick = matches!(event, Event::Tick);
        match event {
            Event::Tick => {}
            Event::Trigger { request, kind } => self.queued.push_back((request, kind)),
            Event::Ack(ack) => self.ack(now, *ack, &mut out),
            Event::Decline {
                checkpoint,
                subtask,
                reason,
            } => {
                if self.pending.get(&checkpoint).is_some_and(|p| !p.finalizing) {
                    let failure = CheckpointFailure::Declined {
                        checkpoint,
                        subtask,
                        reason,
                    };
                    self.end(now, checkpoint, failure, Ending::Failure, &mut out);
                }
            }
            Event::Persisted(checkpoint) => self.persisted(now, checkpoint, &mut out),
            Event::PersistFailed { checkpoint, reason } => {
                if self.pending.contains_key(&checkpoint) {
                    let failure = CheckpointFailure::FinalizeFailed { checkpoint, reason };
                    self.end(now, checkpoint, failure, Ending::Failure, &mut out);
                } else if let Some(entry) = self.ended_mut(checkpoint) {
                    if let Ended::Abandoned(states) = mem::replace(entry, Ended::Failed) {
                        discard(checkpoint, states, &mut out);
                        out.push(Action::Stats(StatsEvent::Failed {
                            id: checkpoint,
                            timestamp: now.unix_ms,
                            reason,
                        }));
                    }
                }
            }
            Event::AbortAll { reason } => self.abort_all(now, reason, &mut out),
            Event::HooksTriggered { checkpoint, result } => {
                self.hooks_triggered(now, checkpoint, result, &mut out)
            }
        }
        self.trigger_queued(now, &mut out);
        if tick {
            self.trigger_periodic(now, &mut out);
        }
        Ok(out)
    }

    /// Earliest instant at which a Tick has work: the next periodic trigger
    /// (if a slot is free) or the earliest pending expiry. It may lie in the
    /// past: tick at once.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let periodic = self.may_trigger().then(|| self.periodic_due()).flatten();
        let expiry = self
            .pending
            .values()
            .filter(|p| !p.finalizing)
            .filter_map(|p| p.triggered.checked_add(self.policy.timeout))
            .min();
        periodic.into_iter().chain(expiry).min()
    }

    /// The id the next checkpoint will get.
    pub fn next_id(&self) -> CheckpointId {
        self.next_id
    }

    /// The manual request that triggered checkpoint `id`, while it is
    /// pending or finalizing: the shell finds by it where the request wants
    /// a savepoint written.
    pub fn request_of(&self, id: CheckpointId) -> Option<RequestId> {
        self.pending.get(&id).and_then(|p| p.request)
    }

    /// Pending plus finalizing checkpoints: the slots `max_concurrent` limits.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    fn check(&self, now: Instant, event: &Event) -> Result<(), CoordinatorError> {
        match event {
            Event::Ack(ack) => {
                let (checkpoint, subtask) = (ack.checkpoint, ack.subtask);
                match self.status(checkpoint, now) {
                    Status::Unknown => Err(CoordinatorError::UnknownCheckpoint {
                        checkpoint,
                        subtask,
                    }),
                    Status::Failed => Ok(()),
                    Status::AwaitingHooks => Err(CoordinatorError::BeforeBarrier {
                        checkpoint,
                        subtask,
                    }),
                    _ if !self.subtasks.contains(&subtask) => {
                        Err(CoordinatorError::UnknownSubtask {
                            checkpoint,
                            subtask,
                        })
                    }
                    Status::Open(p) if !p.acks.contains_key(&subtask) => Ok(()),
                    // Never a late ack to discard: its state may be the very
                    // objects the checkpoint references.
                    _ => Err(CoordinatorError::DuplicateAck {
                        checkpoint,
                        subtask,
                    }),
                }
            }
            Event::Decline {
                checkpoint,
                subtask,
                ..
            } => {
                let (checkpoint, subtask) = (*checkpoint, *subtask);
                match self.status(checkpoint, now) {
                    Status::Unknown => Err(CoordinatorError::UnknownCheckpoint {
                        checkpoint,
                        subtask,
                    }),
                    Status::AwaitingHooks => Err(CoordinatorError::BeforeBarrier {
                        checkpoint,
                        subtask,
                    }),
                    Status::Open(_) if !self.subtasks.contains(&subtask) => {
                        Err(CoordinatorError::UnknownSubtask {
                            checkpoint,
                            subtask,
                        })
                    }
                    _ => Ok(()),
                }
            }
            Event::Persisted(checkpoint) | Event::PersistFailed { checkpoint, .. } => {
                let awaited = self.pending.get(checkpoint).is_some_and(|p| p.finalizing)
                    || matches!(self.ended_entry(*checkpoint), Some(Ended::Abandoned(_)));
                if awaited {
                    Ok(())
                } else {
                    Err(CoordinatorError::NotFinalizing {
                        checkpoint: *checkpoint,
                    })
                }
            }
            Event::HooksTriggered { checkpoint, .. } if !self.hooks_expected(*checkpoint) => {
                Err(CoordinatorError::NotAwaitingHooks {
                    checkpoint: *checkpoint,
                })
            }
            Event::HooksTriggered { .. }
            | Event::Tick
            | Event::Trigger { .. }
            | Event::AbortAll { .. } => Ok(()),
        }
    }

    /// The master hooks' states of `id` are awaited, or late: it ended.
    fn hooks_expected(&self, id: CheckpointId) -> bool {
        match self.pending.get(&id) {
            Some(p) => p.awaiting_hooks,
            None => self.ended_entry(id).is_some(),
        }
    }

    fn status(&self, checkpoint: CheckpointId, now: Instant) -> Status<'_> {
        match self.pending.get(&checkpoint) {
            Some(p) if p.awaiting_hooks => Status::AwaitingHooks,
            Some(p) if p.finalizing => Status::AllAcked,
            Some(p) if self.expired(p, now) => Status::Failed,
            Some(p) => Status::Open(p),
            None => match self.ended_entry(checkpoint) {
                Some(Ended::Failed) => Status::Failed,
                Some(_) => Status::AllAcked,
                None => Status::Unknown,
            },
        }
    }

    fn expired(&self, p: &PendingCheckpoint, now: Instant) -> bool {
        // A timeout too long to reach never expires.
        !p.finalizing
            && p.triggered
                .checked_add(self.policy.timeout)
                .is_some_and(|at| at <= now)
    }

    fn expire(&mut self, now: Now, out: &mut Vec<Action>) {
        let expired: Vec<CheckpointId> = self
            .pending
            .iter()
            .filter(|(_, p)| self.expired(p, now.instant))
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            self.end(
                now,
                id,
                CheckpointFailure::Expired(id),
                Ending::Failure,
                out,
            );
        }
    }

    /// Only called for an ack `check` accepted: either a new ack of an open
    /// checkpoint or a late one.
    fn ack(&mut self, now: Now, ack: Ack, out: &mut Vec<Action>) {
        match self.pending.get_mut(&ack.checkpoint) {
            Some(p) => {
                out.push(Action::Stats(StatsEvent::acknowledged(&ack, now.unix_ms)));
                p.acks.insert(ack.subtask, ack.state);
                self.finalize_if_acked(ack.checkpoint, out);
            }
            None => out.push(Action::Discard {
                checkpoint: ack.checkpoint,
                states: vec![ack.state],
            }),
        }
    }

    fn finalize_if_acked(&mut self, id: CheckpointId, out: &mut Vec<Action>) {
        let Some(p) = self.pending.get_mut(&id) else {
            return;
        };
        if p.awaiting_hooks || p.acks.len() < self.subtasks.len() {
            return;
        }
        p.finalizing = true;
        // The acks stay: a failed persist must discard them.
        out.push(Action::Finalize(CompletedCheckpoint {
            id,
            kind: p.kind,
            format: Default::default(),
            operators: self.operators.clone(),
            edges: self.edges.clone(),
            key_hash: crate::model::key_hash::KEY_HASH_VERSION,
            timestamp: p.timestamp,
            subtasks: p.acks.clone(),
            master_states: mem::take(&mut p.master_states),
        }));
    }

    fn persisted(&mut self, now: Now, id: CheckpointId, out: &mut Vec<Action>) {
        let Some(p) = self.pending.remove(&id) else {
            // Abandoned while finalizing, durable after all; the job has
            // moved on, so there is nobody to notify.
            if let Some(entry) = self.ended_mut(id) {
                *entry = Ended::Completed;
                out.push(Action::Stats(StatsEvent::Completed {
                    id,
                    timestamp: now.unix_ms,
                }));
            }
            return;
        };
        out.push(Action::Stats(StatsEvent::Completed {
            id,
            timestamp: now.unix_ms,
        }));
        // Savepoints are the user's business, not a sign of the job's health.
        if p.kind == CheckpointKind::Checkpoint {
            self.consecutive_failures = 0;
        }
        self.last_end = Some(now.instant);
        self.record_ended(id, Ended::Completed);
        // An intermediate savepoint commits no side effects (as in Flink):
        // the job goes on, and a failover restores an older checkpoint.
        let stops = p.request.is_some() && p.request == self.stop;
        if p.kind == CheckpointKind::Checkpoint || stops {
            out.push(Action::NotifyComplete(id));
        }
        if let Some(request) = p.request {
            out.push(Action::Resolve {
                request,
                result: Ok(id),
            });
        }
        // A savepoint is not retained, so it subsumes nothing.
        let subsumed: Vec<CheckpointId> = match p.kind {
            CheckpointKind::Checkpoint => self
                .pending
                .range(..id)
                .filter(|(_, p)| !p.finalizing && p.kind == CheckpointKind::Checkpoint)
                .map(|(old, _)| *old)
                .collect(),
            CheckpointKind::Savepoint => Vec::new(),
        };
        for old in subsumed {
            let failure = CheckpointFailure::Aborted {
                checkpoint: old,
                reason: format!("subsumed by {id}"),
            };
            self.end(now, old, failure, Ending::Subsumed, out);
        }
    }

    /// Ends a pending or finalizing checkpoint without completing it.
    fn end(
        &mut self,
        now: Now,
        id: CheckpointId,
        failure: CheckpointFailure,
        ending: Ending,
        out: &mut Vec<Action>,
    ) {
        let Some(p) = self.pending.remove(&id) else {
            return;
        };
        let states: Vec<SubtaskState> = p.acks.into_values().collect();
        let ended = if p.finalizing && ending == Ending::AbortAll {
            Ended::Abandoned(states)
        } else {
            discard(id, states, out);
            out.push(Action::Stats(StatsEvent::Failed {
                id,
                timestamp: now.unix_ms,
                reason: failure.to_string(),
            }));
            Ended::Failed
        };
        // Before its barriers, nobody but the shell has heard of it.
        if !p.awaiting_hooks && matches!(ending, Ending::Failure | Ending::Subsumed) {
            out.push(Action::NotifyAbort {
                checkpoint: id,
                reason: failure.clone(),
            });
        }
        if let Some(request) = p.request {
            self.resolve_failed(request, failure.clone(), out);
        }
        self.last_end = Some(now.instant);
        self.record_ended(id, ended);
        let counts = matches!(ending, Ending::Failure | Ending::HookFailure);
        if counts && p.kind == CheckpointKind::Checkpoint {
            self.consecutive_failures += 1;
            if self.consecutive_failures > self.policy.tolerable_failures {
                out.push(Action::FailJob(format!(
                    "{} consecutive checkpoint failures exceed the tolerable {}: {failure}",
                    self.consecutive_failures, self.policy.tolerable_failures
                )));
                // As Flink does: the job fails once, not again on every
                // further failure while it goes down.
                self.consecutive_failures = 0;
            }
        }
    }

    fn abort_all(&mut self, now: Now, reason: String, out: &mut Vec<Action>) {
        let ids: Vec<CheckpointId> = self.pending.keys().copied().collect();
        for id in ids {
            let failure = CheckpointFailure::Aborted {
                checkpoint: id,
                reason: reason.clone(),
            };
            self.end(now, id, failure, Ending::AbortAll, out);
        }
        // A queued request has no checkpoint id yet, so it cannot be
        // `Aborted { checkpoint, .. }`.
        for (request, _) in std::mem::take(&mut self.queued) {
            let failure = CheckpointFailure::NotTriggered(reason.clone());
            self.resolve_failed(request, failure, out);
        }
        self.periodic_from = now.instant;
        self.last_end = None;
    }

    /// A slot is free and no checkpoint awaits its master hooks: one at a
    /// time, so that barriers and counter writes go out in id order.
    fn may_trigger(&self) -> bool {
        self.pending.len() < self.policy.max_concurrent
            && !self.pending.values().any(|p| p.awaiting_hooks)
    }

    fn trigger_queued(&mut self, now: Now, out: &mut Vec<Action>) {
        while self.may_trigger() {
            let Some((request, kind)) = self.queued.pop_front() else {
                break;
            };
            self.trigger(now, kind, Some(request), out);
        }
    }

    fn trigger_periodic(&mut self, now: Now, out: &mut Vec<Action>) {
        let due = self.periodic_due().is_some_and(|due| due <= now.instant);
        if due && self.may_trigger() {
            self.periodic_from = now.instant;
            self.trigger(now, CheckpointKind::Checkpoint, None, out);
        }
    }

    fn periodic_due(&self) -> Option<Instant> {
        if self.stopping() {
            return None;
        }
        // An interval or pause too long to reach never triggers.
        let due = self.periodic_from.checked_add(self.policy.interval?)?;
        match self.last_end {
            Some(end) => Some(due.max(end.checked_add(self.policy.min_pause)?)),
            None => Some(due),
        }
    }

    /// Starts checkpoint `next_id`: its master hooks first, if the job has
    /// any, else its barriers at once.
    fn trigger(
        &mut self,
        now: Now,
        kind: CheckpointKind,
        request: Option<RequestId>,
        out: &mut Vec<Action>,
    ) {
        let id = self.next_id;
        self.next_id = CheckpointId(id.0 + 1);
        let stops = request.is_some() && request == self.stop;
        let kind_stats = match kind {
            CheckpointKind::Savepoint if stops => CheckpointType::SyncSavepoint,
            CheckpointKind::Savepoint => CheckpointType::Savepoint,
            CheckpointKind::Checkpoint if self.alignment == Alignment::Unaligned => {
                CheckpointType::UnalignedCheckpoint
            }
            CheckpointKind::Checkpoint => CheckpointType::Checkpoint,
        };
        out.push(Action::Stats(StatsEvent::Pending {
            id,
            kind: kind_stats,
            timestamp: now.unix_ms,
            subtasks: self.subtasks.clone(),
        }));
        self.pending.insert(
            id,
            PendingCheckpoint {
                kind,
                timestamp: now.unix_ms,
                triggered: now.instant,
                request,
                acks: BTreeMap::new(),
                master_states: BTreeMap::new(),
                awaiting_hooks: self.master_hooks,
                finalizing: false,
            },
        );
        if self.master_hooks {
            out.push(Action::TriggerHooks(id));
        } else {
            self.send_barriers(id, out);
        }
    }

    /// The master hooks' states of `id` are in, and its barriers go out; or
    /// a hook failed, and so does the checkpoint, before any barrier.
    fn hooks_triggered(
        &mut self,
        now: Now,
        id: CheckpointId,
        result: Result<BTreeMap<String, Vec<u8>>, HookError>,
        out: &mut Vec<Action>,
    ) {
        // Ended meanwhile: expired or aborted.
        let Some(p) = self.pending.get_mut(&id) else {
            return;
        };
        match result {
            Ok(states) => {
                p.master_states = states;
                p.awaiting_hooks = false;
                self.send_barriers(id, out);
            }
            Err(e) => {
                let failure = CheckpointFailure::NotTriggered(e.to_string());
                self.end(now, id, failure, Ending::HookFailure, out);
            }
        }
    }

    fn send_barriers(&mut self, id: CheckpointId, out: &mut Vec<Action>) {
        let Some(p) = self.pending.get(&id) else {
            return;
        };
        let alignment = match p.kind {
            CheckpointKind::Savepoint => Alignment::Aligned,
            CheckpointKind::Checkpoint => self.alignment,
        };
        out.push(Action::Trigger {
            barrier: Barrier {
                id,
                timestamp: p.timestamp,
                options: CheckpointOptions {
                    kind: p.kind,
                    alignment,
                },
            },
            next_id: self.next_id,
            suspend: p.request.is_some() && p.request == self.stop,
        });
        // A job without subtasks has nobody to wait for.
        self.finalize_if_acked(id, out);
    }

    fn record_ended(&mut self, id: CheckpointId, ended: Ended) {
        if self.ended.len() == RECENTLY_ENDED {
            self.ended.pop_front();
        }
        self.ended.push_back((id, ended));
    }

    fn ended_entry(&self, id: CheckpointId) -> Option<&Ended> {
        self.ended.iter().find(|(e, _)| *e == id).map(|(_, s)| s)
    }

    fn ended_mut(&mut self, id: CheckpointId) -> Option<&mut Ended> {
        self.ended
            .iter_mut()
            .find(|(e, _)| *e == id)
            .map(|(_, s)| s)
    }
}

fn discard(checkpoint: CheckpointId, states: Vec<SubtaskState>, out: &mut Vec<Action>) {
    if !states.is_empty() {
        out.push(Action::Discard { checkpoint, states });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{
        CheckpointMetrics, KeyGroupsStateHandle, KeyedStateHandle, StateHandle,
    };
    use crate::model::ids::{OperatorId, SubtaskIndex};
    use proptest::prelude::*;
    use std::time::Duration;

    use CheckpointKind::{Checkpoint, Savepoint};

    const UNIX_BASE: u64 = 1_700_000_000_000;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn subtask(i: u32) -> SubtaskId {
        SubtaskId {
            operator: OperatorId(0),
            index: SubtaskIndex(i),
        }
    }

    /// Generous limits, so that a test only meets the one it is about.
    fn policy() -> CheckpointPolicy {
        CheckpointPolicy {
            interval: Some(ms(1000)),
            timeout: ms(60_000),
            min_pause: Duration::ZERO,
            max_concurrent: 1,
            tolerable_failures: 10,
            retain: 1,
        }
    }

    /// Names its checkpoint and subtask, so a discarded state shows whose it was.
    fn state(id: u64, i: u32) -> SubtaskState {
        SubtaskState {
            keyed: Some(KeyedStateHandle::KeyGroups(KeyGroupsStateHandle {
                start_group: 0,
                offsets: vec![0],
                handle: StateHandle::object(format!("chk-{id}/{i}"), 10, 0),
            })),
            ..SubtaskState::default()
        }
    }

    fn ack(id: u64, i: u32) -> Event {
        Event::Ack(Box::new(Ack {
            subtask: subtask(i),
            checkpoint: CheckpointId(id),
            state: state(id, i),
            metrics: CheckpointMetrics::default(),
        }))
    }

    fn decline(id: u64, i: u32, reason: &str) -> Event {
        Event::Decline {
            checkpoint: CheckpointId(id),
            subtask: subtask(i),
            reason: reason.to_owned(),
        }
    }

    fn manual(request: RequestId, kind: CheckpointKind) -> Event {
        Event::Trigger { request, kind }
    }

    fn trigger(id: u64, at: u64, kind: CheckpointKind, alignment: Alignment) -> Action {
        Action::Trigger {
            barrier: Barrier {
                id: CheckpointId(id),
                timestamp: UNIX_BASE + at,
                options: CheckpointOptions { kind, alignment },
            },
            next_id: CheckpointId(id + 1),
            suspend: false,
        }
    }

    fn checkpoint(id: u64, at: u64) -> Action {
        trigger(id, at, Checkpoint, Alignment::Aligned)
    }

    fn completed(id: u64, at: u64, subtasks: u32) -> CompletedCheckpoint {
        CompletedCheckpoint {
            id: CheckpointId(id),
            kind: Checkpoint,
            format: Default::default(),
            operators: Vec::new(),
            edges: Vec::new(),
            key_hash: crate::model::key_hash::KEY_HASH_VERSION,
            timestamp: UNIX_BASE + at,
            subtasks: (0..subtasks).map(|i| (subtask(i), state(id, i))).collect(),
            master_states: BTreeMap::new(),
        }
    }

    fn notify_abort(id: u64, reason: CheckpointFailure) -> Action {
        Action::NotifyAbort {
            checkpoint: CheckpointId(id),
            reason,
        }
    }

    fn triggered(actions: &[Action]) -> Vec<u64> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Trigger { barrier, .. } => Some(barrier.id.0),
                _ => None,
            })
            .collect()
    }

    fn finalized(actions: Vec<Action>) -> CompletedCheckpoint {
        match <[Action; 1]>::try_from(actions) {
            Ok([Action::Finalize(completed)]) => completed,
            other => panic!("expected one Finalize, got {other:?}"),
        }
    }

    /// A coordinator on a fake clock: every time is milliseconds after its start.
    struct Harness {
        coordinator: CheckpointCoordinator,
        base: Instant,
        subtasks: u32,
        /// What the coordinator reported to the statistics, applied as the
        /// shell does.
        stats: crate::checkpoint::stats::CheckpointStatsTracker,
    }

    impl Harness {
        fn new(policy: CheckpointPolicy, subtasks: u32) -> Self {
            Self::with(policy, subtasks, Alignment::Aligned, CheckpointId(1))
        }

        fn with(
            policy: CheckpointPolicy,
            subtasks: u32,
            alignment: Alignment,
            next_id: CheckpointId,
        ) -> Self {
            let base = Instant::now();
            let now = Now {
                instant: base,
                unix_ms: UNIX_BASE,
            };
            let ids = (0..subtasks).map(subtask).collect();
            Harness {
                coordinator: CheckpointCoordinator::new(policy, ids, alignment, next_id, now),
                base,
                subtasks,
                stats: Default::default(),
            }
        }

        fn at(&self, t: u64) -> Now {
            Now {
                instant: self.base + ms(t),
                unix_ms: UNIX_BASE + t,
            }
        }

        fn try_handle(&mut self, t: u64, event: Event) -> Result<Vec<Action>, CoordinatorError> {
            let now = self.at(t);
            let mut actions = self.coordinator.handle(now, event)?;
            actions.retain(|action| match action {
                Action::Stats(event) => {
                    self.stats.apply(event.clone());
                    false
                }
                _ => true,
            });
            Ok(actions)
        }

        fn handle(&mut self, t: u64, event: Event) -> Vec<Action> {
            self.try_handle(t, event).expect("event accepted")
        }

        fn tick(&mut self, t: u64) -> Vec<Action> {
            self.handle(t, Event::Tick)
        }

        /// Acks from every subtask; returns what the last one caused.
        fn ack_all(&mut self, t: u64, id: u64) -> Vec<Action> {
            (0..self.subtasks).fold(Vec::new(), |_, i| self.handle(t, ack(id, i)))
        }

        /// Acks from every subtask and the shell's report that it persisted.
        fn complete(&mut self, t: u64, id: u64) -> Vec<Action> {
            assert_eq!(finalized(self.ack_all(t, id)).id, CheckpointId(id));
            self.handle(t, Event::Persisted(CheckpointId(id)))
        }

        fn poll_timeout(&self) -> Option<u64> {
            let at = self.coordinator.poll_timeout()?;
            Some(at.saturating_duration_since(self.base).as_millis() as u64)
        }
    }

    /// The statistics follow the protocol's decisions: what the coordinator
    /// completed, failed or abandoned, with each ack's time.
    mod stats {
        use super::*;
        use crate::checkpoint::stats::{CheckpointStatus, CheckpointType};

        fn entry(h: &Harness, id: u64) -> crate::checkpoint::stats::CheckpointStats {
            h.stats
                .get(CheckpointId(id))
                .cloned()
                .expect("in the history")
        }

        #[test]
        fn a_completed_checkpoint_records_every_ack_and_its_end() {
            let mut h = Harness::new(policy(), 2);
            h.tick(1000);
            h.handle(1030, ack(1, 1));
            let c = entry(&h, 1);
            assert_eq!(
                (c.status, c.num_acknowledged(), c.num_subtasks()),
                (CheckpointStatus::InProgress, 1, 2)
            );
            assert_eq!(c.trigger_timestamp, UNIX_BASE + 1000);
            assert_eq!(c.end_to_end_duration(), 30);
            let finalize = h.handle(1070, ack(1, 0));
            assert!(matches!(finalize[..], [Action::Finalize(_)]));
            assert_eq!(
                entry(&h, 1).status,
                CheckpointStatus::InProgress,
                "in progress until durable"
            );
            h.handle(1090, Event::Persisted(CheckpointId(1)));
            let c = entry(&h, 1);
            assert_eq!(
                (c.status, c.end_to_end_duration()),
                (CheckpointStatus::Completed, 90)
            );
            let (last, s) = c.last_acknowledged().unwrap();
            assert_eq!((last, s.ack_timestamp), (subtask(0), UNIX_BASE + 1070));
            assert_eq!(h.stats.counts().completed, 1);
        }

        #[test]
        fn declined_expired_and_subsumed_checkpoints_fail_with_their_reason() {
            let policy = CheckpointPolicy {
                max_concurrent: 2,
                min_pause: Duration::ZERO,
                timeout: Duration::from_millis(5000),
                ..policy()
            };
            let mut h = Harness::new(policy, 2);
            h.tick(1000);
            h.handle(1010, decline(1, 0, "disk full"));
            let c = entry(&h, 1);
            assert_eq!(
                (c.status, c.end_timestamp),
                (CheckpointStatus::Failed, Some(UNIX_BASE + 1010))
            );
            assert!(c.failure.unwrap().contains("disk full"));
            h.tick(2000);
            h.tick(3000);
            h.complete(3100, 3);
            assert!(entry(&h, 2).failure.unwrap().contains("subsumed by chk-3"));
            h.tick(4000);
            h.tick(9000);
            assert_eq!(entry(&h, 4).status, CheckpointStatus::Failed, "expired");
            let counts = h.stats.counts();
            assert_eq!(
                (
                    counts.total,
                    counts.completed,
                    counts.failed,
                    counts.in_progress
                ),
                (5, 1, 3, 1)
            );
        }

        #[test]
        fn savepoints_and_unaligned_checkpoints_are_typed() {
            let mut h = Harness::with(policy(), 1, Alignment::Unaligned, CheckpointId(1));
            h.tick(1000);
            assert_eq!(entry(&h, 1).kind, CheckpointType::UnalignedCheckpoint);
            h.complete(1100, 1);
            h.handle(1200, manual(7, Savepoint));
            assert_eq!(entry(&h, 2).kind, CheckpointType::Savepoint);
            h.complete(1300, 2);
            h.coordinator.admit_manual(8, true).unwrap();
            h.handle(1400, manual(8, Savepoint));
            assert_eq!(entry(&h, 3).kind, CheckpointType::SyncSavepoint);
            let tracker = &h.stats;
            assert_eq!(tracker.latest_savepoint().unwrap().id, CheckpointId(2));
            assert_eq!(tracker.latest_completed().unwrap().id, CheckpointId(1));
        }

        #[test]
        fn a_checkpoint_abandoned_while_persisting_ends_as_its_write_did() {
            let mut h = Harness::new(policy(), 1);
            h.tick(1000);
            h.ack_all(1010, 1);
            h.handle(
                1020,
                Event::AbortAll {
                    reason: "restart".into(),
                },
            );
            assert_eq!(
                entry(&h, 1).status,
                CheckpointStatus::InProgress,
                "it may yet be durable"
            );
            h.handle(1030, Event::Persisted(CheckpointId(1)));
            assert_eq!(entry(&h, 1).status, CheckpointStatus::Completed);
            h.tick(3000);
            h.ack_all(3010, 2);
            h.handle(
                3020,
                Event::AbortAll {
                    reason: "restart".into(),
                },
            );
            h.handle(
                3030,
                Event::PersistFailed {
                    checkpoint: CheckpointId(2),
                    reason: "storage down".into(),
                },
            );
            let c = entry(&h, 2);
            assert_eq!(
                (c.status, c.failure.as_deref()),
                (CheckpointStatus::Failed, Some("storage down"))
            );
        }
    }

    #[test]
    fn first_periodic_trigger_is_due_exactly_one_interval_after_start() {
        let mut h = Harness::new(policy(), 2);
        assert_eq!(h.poll_timeout(), Some(1000));
        assert_eq!(h.tick(0), vec![]);
        assert_eq!(h.tick(999), vec![]);
        assert_eq!(h.tick(1000), vec![checkpoint(1, 1000)]);
        assert_eq!(h.coordinator.pending(), 1);
    }

    #[test]
    fn no_interval_means_no_periodic_trigger_and_nothing_to_wait_for() {
        let policy = CheckpointPolicy {
            interval: None,
            ..policy()
        };
        let mut h = Harness::new(policy, 1);
        assert_eq!(h.poll_timeout(), None);
        assert_eq!(h.tick(1_000_000), vec![]);
    }

    #[test]
    fn ids_start_from_the_recovered_next_id_and_strictly_increase() {
        let mut h = Harness::with(policy(), 1, Alignment::Aligned, CheckpointId(42));
        assert_eq!(h.coordinator.next_id(), CheckpointId(42));
        assert_eq!(h.tick(1000), vec![checkpoint(42, 1000)]);
        h.complete(1100, 42);
        assert_eq!(
            h.handle(1200, manual(1, Savepoint)),
            vec![trigger(43, 1200, Savepoint, Alignment::Aligned)]
        );
        h.complete(1300, 43);
        assert_eq!(h.tick(2000), vec![checkpoint(44, 2000)]);
        assert_eq!(h.coordinator.next_id(), CheckpointId(45));
    }

    #[test]
    fn finalizes_only_on_the_last_ack_and_completes_when_persisted() {
        let mut h = Harness::new(policy(), 3);
        h.tick(1000);
        assert_eq!(h.handle(1100, ack(1, 0)), vec![]);
        assert_eq!(h.handle(1200, ack(1, 2)), vec![]);
        assert_eq!(
            h.handle(1300, ack(1, 1)),
            vec![Action::Finalize(completed(1, 1000, 3))]
        );
        assert_eq!(
            h.coordinator.pending(),
            1,
            "a finalizing checkpoint still holds its slot"
        );
        assert_eq!(
            h.handle(1400, Event::Persisted(CheckpointId(1))),
            vec![Action::NotifyComplete(CheckpointId(1))]
        );
        assert_eq!(h.coordinator.pending(), 0);
    }

    #[test]
    fn a_finalizing_checkpoint_does_not_expire() {
        let policy = CheckpointPolicy {
            timeout: ms(500),
            ..policy()
        };
        let mut h = Harness::new(policy, 1);
        h.tick(1000);
        h.ack_all(1400, 1);
        assert_eq!(h.poll_timeout(), None);
        assert_eq!(h.tick(5000), vec![]);
        assert_eq!(
            h.handle(5000, Event::Persisted(CheckpointId(1))),
            vec![Action::NotifyComplete(CheckpointId(1))]
        );
    }

    #[test]
    fn timeout_aborts_exactly_at_trigger_plus_timeout_and_notifies_abort() {
        let policy = CheckpointPolicy {
            timeout: ms(500),
            ..policy()
        };
        let mut h = Harness::new(policy, 2);
        h.tick(1000);
        assert_eq!(h.poll_timeout(), Some(1500));
        assert_eq!(h.tick(1499), vec![]);
        assert_eq!(
            h.tick(1500),
            vec![notify_abort(1, CheckpointFailure::Expired(CheckpointId(1)))]
        );
        assert_eq!(h.coordinator.pending(), 0);
    }

    #[test]
    fn an_ack_at_the_expiry_instant_is_late() {
        let policy = CheckpointPolicy {
            timeout: ms(500),
            ..policy()
        };
        let mut h = Harness::new(policy, 2);
        h.tick(1000);
        h.handle(1100, ack(1, 0));
        assert_eq!(
            h.handle(1500, ack(1, 1)),
            vec![
                Action::Discard {
                    checkpoint: CheckpointId(1),
                    states: vec![state(1, 0)]
                },
                notify_abort(1, CheckpointFailure::Expired(CheckpointId(1))),
                Action::Discard {
                    checkpoint: CheckpointId(1),
                    states: vec![state(1, 1)]
                },
            ]
        );
    }

    #[test]
    fn late_ack_of_a_timed_out_checkpoint_is_ignored_and_its_state_discarded() {
        let policy = CheckpointPolicy {
            timeout: ms(500),
            ..policy()
        };
        let mut h = Harness::new(policy, 2);
        h.tick(1000);
        h.handle(1200, ack(1, 0));
        assert_eq!(
            h.tick(1500),
            vec![
                Action::Discard {
                    checkpoint: CheckpointId(1),
                    states: vec![state(1, 0)]
                },
                notify_abort(1, CheckpointFailure::Expired(CheckpointId(1)))
            ]
        );
        assert_eq!(
            h.handle(1600, ack(1, 1)),
            vec![Action::Discard {
                checkpoint: CheckpointId(1),
                states: vec![state(1, 1)]
            }]
        );
    }

    #[test]
    fn ack_of_an_unknown_checkpoint_is_rejected() {
        let mut h = Harness::new(policy(), 1);
        assert_eq!(
            h.try_handle(0, ack(7, 0)),
            Err(CoordinatorError::UnknownCheckpoint {
                checkpoint: CheckpointId(7),
                subtask: subtask(0)
            })
        );
        assert_eq!(
            h.try_handle(0, decline(7, 0, "no")),
            Err(CoordinatorError::UnknownCheckpoint {
                checkpoint: CheckpointId(7),
                subtask: subtask(0)
            })
        );
    }

    #[test]
    fn ended_checkpoints_are_remembered_for_sixteen_more() {
        let policy = CheckpointPolicy {
            interval: None,
            ..policy()
        };
        let mut h = Harness::new(policy, 2);
        for id in 1..=17 {
            assert_eq!(triggered(&h.handle(id, manual(id, Checkpoint))), vec![id]);
            h.handle(id, decline(id, 0, "busy"));
        }
        assert!(matches!(
            h.try_handle(20, ack(1, 1)),
            Err(CoordinatorError::UnknownCheckpoint { .. })
        ));
        assert_eq!(
            h.handle(20, ack(2, 1)),
            vec![Action::Discard {
                checkpoint: CheckpointId(2),
                states: vec![state(2, 1)]
            }]
        );
        assert_eq!(
            h.handle(20, decline(2, 1, "late")),
            vec![],
            "a decline of an ended checkpoint is ignored"
        );
    }

    #[test]
    fn duplicate_ack_and_unknown_subtask_are_rejected_and_change_nothing() {
        let mut h = Harness::new(policy(), 2);
        h.tick(1000);
        h.handle(1100, ack(1, 0));
        let mut again = ack(1, 0);
        if let Event::Ack(a) = &mut again {
            a.state = state(99, 0);
        }
        assert_eq!(
            h.try_handle(1200, again),
            Err(CoordinatorError::DuplicateAck {
                checkpoint: CheckpointId(1),
                subtask: subtask(0)
            })
        );
        assert_eq!(
            h.try_handle(1200, ack(1, 5)),
            Err(CoordinatorError::UnknownSubtask {
                checkpoint: CheckpointId(1),
                subtask: subtask(5)
            })
        );
        assert_eq!(
            h.try_handle(1200, decline(1, 5, "who?")),
            Err(CoordinatorError::UnknownSubtask {
                checkpoint: CheckpointId(1),
                subtask: subtask(5)
            })
        );
        assert_eq!(
            h.handle(1300, ack(1, 1)),
            vec![Action::Finalize(completed(1, 1000, 2))]
        );
    }

    #[test]
    fn a_rejected_event_does_not_swallow_a_due_expiry() {
        let policy = CheckpointPolicy {
            timeout: ms(500),
            ..policy()
        };
        let mut h = Harness::new(policy, 1);
        h.tick(1000);
        assert!(h.try_handle(2000, ack(9, 0)).is_err());
        assert_eq!(
            h.tick(2000),
            vec![
                notify_abort(1, CheckpointFailure::Expired(CheckpointId(1))),
                checkpoint(2, 2000)
            ]
        );
    }

    #[test]
    fn a_repeated_ack_of_a_completed_checkpoint_is_a_duplicate_not_a_state_to_delete() {
        let mut h = Harness::new(policy(), 1);
        h.tick(1000);
        h.ack_all(1100, 1);
        let duplicate = Err(CoordinatorError::DuplicateAck {
            checkpoint: CheckpointId(1),
            subtask: subtask(0),
        });
        assert_eq!(h.try_handle(1150, ack(1, 0)), duplicate);
        h.handle(1200, Event::Persisted(CheckpointId(1)));
        assert_eq!(h.try_handle(1300, ack(1, 0)), duplicate);
    }

    #[test]
    fn next_trigger_waits_for_min_pause_after_the_last_end() {
        let policy = CheckpointPolicy {
            min_pause: ms(3000),
            ..policy()
        };
        let mut h = Harness::new(policy, 1);
        h.tick(1000);
        h.complete(1500, 1);
        assert_eq!(h.poll_timeout(), Some(4500));
        assert_eq!(h.tick(2000), vec![]);
        assert_eq!(h.tick(4499), vec![]);
        assert_eq!(h.tick(4500), vec![checkpoint(2, 4500)]);
        // A failure ends a checkpoint too.
        h.handle(4600, decline(2, 0, "busy"));
        assert_eq!(h.poll_timeout(), Some(7600));
    }

    #[test]
    fn periodic_interval_counts_from_the_last_periodic_trigger() {
        let mut h = Harness::new(policy(), 1);
        h.tick(1000);
        h.complete(1100, 1);
        assert_eq!(h.poll_timeout(), Some(2000));
        // A late tick triggers once, and the schedule counts from it.
        assert_eq!(h.tick(2700), vec![checkpoint(2, 2700)]);
        h.complete(2800, 2);
        assert_eq!(h.tick(3699), vec![]);
        assert_eq!(h.tick(3700), vec![checkpoint(3, 3700)]);
    }

    #[test]
    fn max_concurrent_holds_back_a_third_checkpoint_until_one_ends() {
        let policy = CheckpointPolicy {
            max_concurrent: 2,
            ..policy()
        };
        let mut h = Harness::new(policy, 1);
        assert_eq!(h.tick(1000), vec![checkpoint(1, 1000)]);
        assert_eq!(h.tick(2000), vec![checkpoint(2, 2000)]);
        assert_eq!(h.tick(3000), vec![]);
        assert_eq!(
            h.poll_timeout(),
            Some(61_000),
            "only the expiry of checkpoint 1 is due while full"
        );
        h.ack_all(3500, 1);
        assert_eq!(
            h.tick(3600),
            vec![],
            "a finalizing checkpoint still takes a slot"
        );
        assert_eq!(
            h.handle(3700, Event::Persisted(CheckpointId(1))),
            vec![Action::NotifyComplete(CheckpointId(1))]
        );
        assert_eq!(h.poll_timeout(), Some(3700));
        assert_eq!(h.tick(3700), vec![checkpoint(3, 3700)]);
        assert_eq!(h.coordinator.pending(), 2);
    }

    #[test]
    fn manual_trigger_is_queued_at_max_concurrent_and_resolved_with_its_id() {
        let policy = CheckpointPolicy {
            interval: None,
            ..policy()
        };
        let mut h = Harness::new(policy, 1);
        assert_eq!(h.handle(0, manual(7, Checkpoint)), vec![checkpoint(1, 0)]);
        assert_eq!(h.handle(10, manual(8, Savepoint)), vec![]);
        assert_eq!(h.handle(20, manual(9, Checkpoint)), vec![]);
        assert_eq!(h.coordinator.pending(), 1);
        assert_eq!(
            h.complete(100, 1),
            vec![
                Action::NotifyComplete(CheckpointId(1)),
                Action::Resolve {
                    request: 7,
                    result: Ok(CheckpointId(1))
                },
                trigger(2, 100, Savepoint, Alignment::Aligned),
            ]
        );
        assert_eq!(
            h.handle(200, decline(2, 0, "disk full")),
            vec![
                notify_abort(
                    2,
                    CheckpointFailure::Declined {
                        checkpoint: CheckpointId(2),
                        subtask: subtask(0),
                        reason: "disk full".into()
                    }
                ),
                Action::Resolve {
                    request: 8,
                    result: Err(CheckpointFailure::Declined {
                        checkpoint: CheckpointId(2),
                        subtask: subtask(0),
                        reason: "disk full".into()
                    })
                },
                checkpoint(3, 200),
            ]
        );
        assert_eq!(
            h.complete(300, 3),
            vec![
                Action::NotifyComplete(CheckpointId(3)),
                Action::Resolve {
                    request: 9,
                    result: Ok(CheckpointId(3))
                },
            ]
        );
    }

    #[test]
    fn manual_trigger_ignores_interval_and_min_pause() {
        let policy = CheckpointPolicy {
            min_pause: ms(5000),
            ..policy()
        };
        let mut h = Harness::new(policy, 1);
        assert_eq!(h.handle(10, manual(1, Checkpoint)), vec![checkpoint(1, 10)]);
        h.complete(20, 1);
        assert_eq!(h.handle(30, manual(2, Checkpoint)), vec![checkpoint(2, 30)]);
    }

    #[test]
    fn savepoint_barrier_is_aligned_when_the_job_is_unaligned() {
        let policy = CheckpointPolicy {
            max_concurrent: 2,
            ..policy()
        };
        let mut h = Harness::with(policy, 1, Alignment::Unaligned, CheckpointId(1));
        assert_eq!(
            h.tick(1000),
            vec![trigger(1, 1000, Checkpoint, Alignment::Unaligned)]
        );
        assert_eq!(
            h.handle(1100, manual(1, Savepoint)),
            vec![trigger(2, 1100, Savepoint, Alignment::Aligned)]
        );
    }

    #[test]
    fn second_consecutive_failure_fails_the_job_with_tolerable_one() {
        let policy = CheckpointPolicy {
            tolerable_failures: 1,
            ..policy()
        };
        let mut h = Harness::new(policy, 1);
        h.tick(1000);
        assert_eq!(
            h.handle(1100, decline(1, 0, "disk full")).len(),
            1,
            "only NotifyAbort"
        );
        assert_eq!(h.tick(2000), vec![checkpoint(2, 2000)]);
        let failure = CheckpointFailure::Declined {
            checkpoint: CheckpointId(2),
            subtask: subtask(0),
            reason: "disk full".into(),
        };
        assert_eq!(
            h.handle(2100, decline(2, 0, "disk full")),
            vec![
                notify_abort(2, failure),
                Action::FailJob(
                    "2 consecutive checkpoint failures exceed the tolerable 1: \
                     subtask op-0#0 declined checkpoint chk-2: disk full"
                        .into()
                ),
            ]
        );
    }

    #[test]
    fn a_success_between_failures_resets_the_count() {
        let policy = CheckpointPolicy {
            tolerable_failures: 1,
            ..policy()
        };
        let mut h = Harness::new(policy, 1);
        h.tick(1000);
        h.handle(1100, decline(1, 0, "busy"));
        h.tick(2000);
        h.complete(2100, 2);
        h.tick(3000);
        let actions = h.handle(3100, decline(3, 0, "busy"));
        assert!(
            !actions.iter().any(|a| matches!(a, Action::FailJob(_))),
            "{actions:?}"
        );
    }

    #[test]
    fn persist_failure_discards_notifies_abort_and_counts() {
        let policy = CheckpointPolicy {
            tolerable_failures: 0,
            ..policy()
        };
        let mut h = Harness::new(policy, 1);
        h.tick(1000);
        h.ack_all(1100, 1);
        let failure = CheckpointFailure::FinalizeFailed {
            checkpoint: CheckpointId(1),
            reason: "store unavailable".into(),
        };
        assert_eq!(
            h.handle(
                1200,
                Event::PersistFailed {
                    checkpoint: CheckpointId(1),
                    reason: "store unavailable".into()
                }
            ),
            vec![
                Action::Discard {
                    checkpoint: CheckpointId(1),
                    states: vec![state(1, 0)]
                },
                notify_abort(1, failure.clone()),
                Action::FailJob(format!(
                    "1 consecutive checkpoint failures exceed the tolerable 0: {failure}"
                )),
            ]
        );
    }

    #[test]
    fn persist_outcome_is_rejected_for_a_checkpoint_not_being_finalized() {
        let mut h = Harness::new(policy(), 2);
        h.tick(1000);
        h.handle(1100, ack(1, 0));
        let not_finalizing = |id| {
            Err(CoordinatorError::NotFinalizing {
                checkpoint: CheckpointId(id),
            })
        };
        assert_eq!(
            h.try_handle(1200, Event::Persisted(CheckpointId(1))),
            not_finalizing(1)
        );
        assert_eq!(
            h.try_handle(1200, Event::Persisted(CheckpointId(5))),
            not_finalizing(5)
        );
        h.handle(1300, ack(1, 1));
        h.handle(1400, Event::Persisted(CheckpointId(1)));
        assert_eq!(
            h.try_handle(1500, Event::Persisted(CheckpointId(1))),
            not_finalizing(1)
        );
    }

    #[test]
    fn a_completed_savepoint_subsumes_no_pending_checkpoint() {
        let policy = CheckpointPolicy {
            max_concurrent: 2,
            ..policy()
        };
        let mut h = Harness::new(policy, 1);
        h.tick(1000);
        h.handle(1100, manual(7, Savepoint));
        assert_eq!(
            h.complete(1200, 2),
            vec![Action::Resolve {
                request: 7,
                result: Ok(CheckpointId(2))
            }],
            "an intermediate savepoint commits nothing: no completion notice"
        );
        assert_eq!(h.coordinator.pending(), 1, "checkpoint 1 goes on");
        assert_eq!(
            h.complete(1300, 1),
            vec![Action::NotifyComplete(CheckpointId(1))]
        );
    }

    #[test]
    fn a_stop_with_savepoint_pauses_periodic_checkpoints_and_its_savepoint_commits() {
        let mut h = Harness::new(policy(), 1);
        let mut stopping = trigger(1, 5000, Savepoint, Alignment::Aligned);
        assert_eq!(h.coordinator.admit_manual(1, true), Ok(()));
        assert!(h.coordinator.stopping());
        assert_eq!(
            h.coordinator.admit_manual(2, false),
            Err(CheckpointFailure::NotTriggered(
                "the job is stopping with a savepoint".into()
            )),
            "nothing starts after the stopping savepoint"
        );
        assert_eq!(h.poll_timeout(), None);
        assert_eq!(h.tick(5000), vec![]);
        let Action::Trigger { suspend, .. } = &mut stopping else {
            unreachable!()
        };
        *suspend = true;
        assert_eq!(h.handle(5000, manual(1, Savepoint)), vec![stopping]);
        assert_eq!(
            h.complete(5100, 1),
            vec![
                Action::NotifyComplete(CheckpointId(1)),
                Action::Resolve {
                    request: 1,
                    result: Ok(CheckpointId(1))
                }
            ],
            "the stopping savepoint commits the sinks"
        );
        assert_eq!(h.tick(9000), vec![], "still stopping: nothing after it");
    }

    #[test]
    fn a_failed_stop_with_savepoint_resumes_periodic_checkpoints() {
        let mut h = Harness::new(policy(), 1);
        h.coordinator.admit_manual(1, true).unwrap();
        h.handle(5000, manual(1, Savepoint));
        let failed = h.handle(5100, decline(1, 0, "no"));
        assert!(
            failed.iter().any(|a| matches!(
                a,
                Action::Resolve {
                    request: 1,
                    result: Err(_)
                }
            )),
            "{failed:?}"
        );
        assert!(!h.coordinator.stopping());
        assert_eq!(h.coordinator.admit_manual(2, false), Ok(()));
        assert_eq!(h.tick(5100), vec![checkpoint(2, 5100)]);
    }

    /// Only the savepoint that stops the job suspends the sources after its
    /// barrier; a plain savepoint or checkpoint does not.
    #[test]
    fn only_a_stopping_savepoint_suspends_the_sources() {
        let suspends = |actions: &[Action]| {
            actions.iter().find_map(|a| match a {
                Action::Trigger { suspend, .. } => Some(*suspend),
                _ => None,
            })
        };
        let mut h = Harness::new(policy(), 1);
        h.coordinator.admit_manual(1, false).unwrap();
        assert_eq!(suspends(&h.handle(5000, manual(1, Savepoint))), Some(false));
        h.handle(5100, decline(1, 0, "no"));
        h.coordinator.admit_manual(2, true).unwrap();
        assert_eq!(suspends(&h.handle(5200, manual(2, Savepoint))), Some(true));
    }

    #[test]
    fn savepoint_failures_do_not_fail_the_job() {
        let policy = CheckpointPolicy {
            tolerable_failures: 0,
            interval: None,
            ..policy()
        };
        let mut h = Harness::new(policy, 1);
        h.handle(0, manual(1, Savepoint));
        let actions = h.handle(100, decline(1, 0, "busy"));
        assert_eq!(
            actions.len(),
            2,
            "NotifyAbort and Resolve only: {actions:?}"
        );
    }

    #[test]
    fn completing_a_checkpoint_subsumes_older_pending_checkpoints_but_not_savepoints() {
        let policy = CheckpointPolicy {
            max_concurrent: 3,
            tolerable_failures: 0,
            ..policy()
        };
        let mut h = Harness::new(policy, 2);
        h.tick(1000);
        h.handle(1500, manual(9, Savepoint));
        h.tick(2000);
        h.handle(2100, ack(1, 0));
        let subsumed = CheckpointFailure::Aborted {
            checkpoint: CheckpointId(1),
            reason: "subsumed by chk-3".into(),
        };
        assert_eq!(
            h.complete(2600, 3),
            vec![
                Action::NotifyComplete(CheckpointId(3)),
                Action::Discard {
                    checkpoint: CheckpointId(1),
                    states: vec![state(1, 0)]
                },
                notify_abort(1, subsumed),
            ]
        );
        assert_eq!(h.coordinator.pending(), 1, "the savepoint goes on");
        assert_eq!(
            h.handle(2700, ack(1, 1)),
            vec![Action::Discard {
                checkpoint: CheckpointId(1),
                states: vec![state(1, 1)]
            }]
        );
        assert_eq!(
            h.complete(2800, 2),
            vec![Action::Resolve {
                request: 9,
                result: Ok(CheckpointId(2))
            }]
        );
    }

    #[test]
    fn abort_all_resolves_queued_requests_and_discards_acked_states() {
        let policy = CheckpointPolicy {
            tolerable_failures: 0,
            ..policy()
        };
        let mut h = Harness::new(policy, 2);
        assert_eq!(
            h.handle(100, manual(1, Checkpoint)),
            vec![checkpoint(1, 100)]
        );
        h.handle(150, ack(1, 0));
        assert_eq!(h.handle(200, manual(2, Savepoint)), vec![]);
        assert_eq!(
            h.handle(
                300,
                Event::AbortAll {
                    reason: "restart".into()
                }
            ),
            vec![
                Action::Discard {
                    checkpoint: CheckpointId(1),
                    states: vec![state(1, 0)]
                },
                Action::Resolve {
                    request: 1,
                    result: Err(CheckpointFailure::Aborted {
                        checkpoint: CheckpointId(1),
                        reason: "restart".into()
                    })
                },
                Action::Resolve {
                    request: 2,
                    result: Err(CheckpointFailure::NotTriggered("restart".into()))
                },
            ]
        );
        assert_eq!(h.coordinator.pending(), 0);
        assert_eq!(
            h.handle(400, ack(1, 1)),
            vec![Action::Discard {
                checkpoint: CheckpointId(1),
                states: vec![state(1, 1)]
            }]
        );
        assert_eq!(
            h.poll_timeout(),
            Some(1300),
            "periodic timing restarts from the abort"
        );
        assert_eq!(h.tick(1000), vec![]);
        assert_eq!(h.tick(1300), vec![checkpoint(2, 1300)]);
    }

    #[test]
    fn abort_all_keeps_a_finalizing_checkpoint_states_until_the_persist_outcome() {
        let policy = CheckpointPolicy {
            interval: None,
            ..policy()
        };
        let abort = || Event::AbortAll {
            reason: "stop".into(),
        };
        let aborted = Action::Resolve {
            request: 5,
            result: Err(CheckpointFailure::Aborted {
                checkpoint: CheckpointId(1),
                reason: "stop".into(),
            }),
        };

        let mut failed = Harness::new(policy.clone(), 1);
        failed.handle(0, manual(5, Checkpoint));
        failed.ack_all(100, 1);
        assert_eq!(failed.handle(200, abort()), vec![aborted]);
        assert_eq!(failed.coordinator.pending(), 0);
        let persist_failed = Event::PersistFailed {
            checkpoint: CheckpointId(1),
            reason: "io".into(),
        };
        assert_eq!(
            failed.handle(300, persist_failed),
            vec![Action::Discard {
                checkpoint: CheckpointId(1),
                states: vec![state(1, 0)]
            }]
        );
        assert_eq!(
            failed.handle(400, ack(1, 0)),
            vec![Action::Discard {
                checkpoint: CheckpointId(1),
                states: vec![state(1, 0)]
            }]
        );

        let mut durable = Harness::new(policy, 1);
        durable.handle(0, manual(5, Checkpoint));
        durable.ack_all(100, 1);
        durable.handle(200, abort());
        assert_eq!(
            durable.handle(300, Event::Persisted(CheckpointId(1))),
            vec![]
        );
        assert!(matches!(
            durable.try_handle(400, ack(1, 0)),
            Err(CoordinatorError::DuplicateAck { .. })
        ));
    }

    /// The master hooks as the shell runs them: the coordinator only sees
    /// their states or failure come back.
    mod master_hooks {
        use super::*;
        use crate::checkpoint::stats::CheckpointStatus;

        /// A coordinator whose job has master hooks.
        fn hooked(policy: CheckpointPolicy, subtasks: u32) -> Harness {
            let mut h = Harness::new(policy, subtasks);
            h.coordinator.await_master_hooks();
            h
        }

        fn states(states: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
            states
                .iter()
                .map(|(hook, state)| ((*hook).to_owned(), state.as_bytes().to_vec()))
                .collect()
        }

        fn hooks_in(id: u64, hook_states: &[(&str, &str)]) -> Event {
            Event::HooksTriggered {
                checkpoint: CheckpointId(id),
                result: Ok(states(hook_states)),
            }
        }

        fn hook_failed(id: u64) -> Event {
            Event::HooksTriggered {
                checkpoint: CheckpointId(id),
                result: Err(HookError::Trigger {
                    hook: "kafka".into(),
                    checkpoint: CheckpointId(id),
                    reason: "broker down".into(),
                }),
            }
        }

        fn trigger_hooks(id: u64) -> Action {
            Action::TriggerHooks(CheckpointId(id))
        }

        #[test]
        fn barriers_go_out_only_once_the_hooks_states_are_in() {
            let policy = CheckpointPolicy {
                max_concurrent: 2,
                ..policy()
            };
            let mut h = hooked(policy, 2);
            assert_eq!(h.tick(1000), vec![trigger_hooks(1)]);
            assert!(matches!(
                h.try_handle(1010, ack(1, 0)),
                Err(CoordinatorError::BeforeBarrier { .. })
            ));
            assert_eq!(
                h.poll_timeout(),
                Some(61_000),
                "no periodic trigger while a checkpoint awaits its hooks, only its expiry"
            );
            assert_eq!(
                h.handle(1020, manual(7, Checkpoint)),
                vec![],
                "a free slot, but the request waits behind the hooks"
            );
            assert_eq!(
                h.handle(1050, hooks_in(1, &[("kafka", "offsets")])),
                vec![checkpoint(1, 1000), trigger_hooks(2)],
                "the barrier carries the trigger time; then the queued request starts"
            );
            assert_eq!(
                h.try_handle(1060, hooks_in(1, &[])),
                Err(CoordinatorError::NotAwaitingHooks {
                    checkpoint: CheckpointId(1)
                })
            );
            assert_eq!(
                h.try_handle(1060, hooks_in(9, &[])),
                Err(CoordinatorError::NotAwaitingHooks {
                    checkpoint: CheckpointId(9)
                })
            );
            let completed = finalized(h.ack_all(1100, 1));
            assert_eq!(completed.master_states, states(&[("kafka", "offsets")]));
        }

        #[test]
        fn a_failing_hook_fails_the_checkpoint_before_any_barrier() {
            let policy = CheckpointPolicy {
                tolerable_failures: 0,
                interval: None,
                ..policy()
            };
            let mut h = hooked(policy, 1);
            assert_eq!(h.handle(100, manual(3, Checkpoint)), vec![trigger_hooks(1)]);
            let failure = CheckpointFailure::NotTriggered(
                "master hook kafka failed on chk-1: broker down".into(),
            );
            assert_eq!(
                h.handle(120, hook_failed(1)),
                vec![
                    Action::Resolve {
                        request: 3,
                        result: Err(failure.clone())
                    },
                    Action::FailJob(format!(
                        "1 consecutive checkpoint failures exceed the tolerable 0: {failure}"
                    )),
                ],
                "no barrier, and no abort for subtasks that never heard of it"
            );
            assert_eq!(h.coordinator.pending(), 0);
            assert_eq!(h.coordinator.next_id(), CheckpointId(2), "the id is spent");
            let stats = h.stats.get(CheckpointId(1)).expect("in the history");
            assert_eq!(
                (stats.status, stats.failure.clone()),
                (CheckpointStatus::Failed, Some(failure.to_string()))
            );
        }

        #[test]
        fn a_late_answer_of_the_hooks_is_dropped() {
            let policy = CheckpointPolicy {
                timeout: ms(500),
                ..policy()
            };
            let mut h = hooked(policy, 1);
            assert_eq!(h.tick(1000), vec![trigger_hooks(1)]);
            assert_eq!(h.tick(1500), vec![], "expired, and nobody to tell");
            assert_eq!(
                h.stats.get(CheckpointId(1)).map(|c| c.status),
                Some(CheckpointStatus::Failed)
            );
            assert_eq!(h.handle(1600, hooks_in(1, &[("kafka", "offsets")])), vec![]);
            assert_eq!(h.tick(2000), vec![trigger_hooks(2)]);
            let abort = Event::AbortAll {
                reason: "restart".into(),
            };
            assert_eq!(h.handle(2100, abort), vec![]);
            assert_eq!(h.handle(2200, hook_failed(2)), vec![]);
            assert_eq!(h.coordinator.pending(), 0);
        }

        #[test]
        fn a_job_without_subtasks_finalizes_once_the_hooks_states_are_in() {
            let mut h = hooked(policy(), 0);
            assert_eq!(h.tick(1000), vec![trigger_hooks(1)]);
            let completed = CompletedCheckpoint {
                master_states: states(&[("audit", "seen")]),
                ..completed(1, 1000, 0)
            };
            assert_eq!(
                h.handle(1010, hooks_in(1, &[("audit", "seen")])),
                vec![checkpoint(1, 1000), Action::Finalize(completed)]
            );
        }
    }

    #[test]
    fn a_restore_resumes_ids_after_the_restored_checkpoint() {
        let mut h = Harness::new(policy(), 1);
        h.coordinator.restore(&completed(1, 0, 1));
        assert_eq!(h.coordinator.next_id(), CheckpointId(2));
        h.coordinator.restore(&completed(41, 0, 1));
        assert_eq!(h.coordinator.next_id(), CheckpointId(42));
        h.coordinator.restore(&completed(7, 0, 1));
        assert_eq!(h.coordinator.next_id(), CheckpointId(42), "never back");
    }

    #[test]
    fn every_checkpoint_records_the_jobs_operators() {
        let mut h = Harness::new(policy(), 1);
        let mut graph = crate::model::graph::JobGraph::default();
        graph.add_operator("count", 1);
        h.coordinator.record_graph(&graph);
        h.tick(1000);
        assert_eq!(finalized(h.ack_all(1100, 1)).operators, graph.operators);
    }

    #[test]
    fn a_job_without_subtasks_finalizes_on_trigger() {
        let mut h = Harness::new(policy(), 0);
        assert_eq!(
            h.tick(1000),
            vec![checkpoint(1, 1000), Action::Finalize(completed(1, 1000, 0))]
        );
    }

    /// One step of a random schedule; ids are picked among those seen so far.
    #[derive(Clone, Debug)]
    enum Op {
        Advance(u64),
        Tick,
        Trigger(CheckpointKind),
        Ack { pick: usize, subtask: u32 },
        Decline { pick: usize, subtask: u32 },
        Persisted(usize),
        PersistFailed(usize),
        AbortAll,
        HooksTriggered { pick: usize, fails: bool },
    }

    fn op() -> impl Strategy<Value = Op> {
        let kind = prop_oneof![Just(Checkpoint), Just(Savepoint)];
        prop_oneof![
            3 => (0u64..1500).prop_map(Op::Advance),
            3 => Just(Op::Tick),
            2 => kind.prop_map(Op::Trigger),
            8 => (any::<usize>(), 0u32..3).prop_map(|(pick, subtask)| Op::Ack { pick, subtask }),
            1 => (any::<usize>(), 0u32..3).prop_map(|(pick, subtask)| Op::Decline { pick, subtask }),
            3 => any::<usize>().prop_map(Op::Persisted),
            1 => any::<usize>().prop_map(Op::PersistFailed),
            1 => Just(Op::AbortAll),
            3 => (any::<usize>(), proptest::bool::weighted(0.2))
                .prop_map(|(pick, fails)| Op::HooksTriggered { pick, fails }),
        ]
    }

    fn random_policy() -> impl Strategy<Value = CheckpointPolicy> {
        (
            proptest::option::weighted(0.8, 200u64..3000),
            500u64..5000,
            0u64..2000,
            1usize..4,
            0u32..3,
        )
            .prop_map(
                |(interval, timeout, min_pause, max_concurrent, tolerable_failures)| {
                    CheckpointPolicy {
                        interval: interval.map(ms),
                        timeout: ms(timeout),
                        min_pause: ms(min_pause),
                        max_concurrent,
                        tolerable_failures,
                        retain: 1,
                    }
                },
            )
    }

    /// Picks one of the three newest `ids`, where messages mostly go, or now
    /// and then an id that may never have existed.
    fn pick(ids: &[CheckpointId], pick: usize) -> CheckpointId {
        if ids.is_empty() || pick.is_multiple_of(10) {
            CheckpointId((pick % 40) as u64)
        } else {
            ids[ids.len() - 1 - pick % ids.len().min(3)]
        }
    }

    proptest! {
        #[test]
        fn random_event_sequences_keep_the_invariants(
            policy in random_policy(),
            hooked in any::<bool>(),
            ops in proptest::collection::vec(op(), 1..200),
        ) {
            const SUBTASKS: u32 = 2;
            let max_concurrent = policy.max_concurrent;
            let mut h = Harness::with(policy, SUBTASKS, Alignment::Unaligned, CheckpointId(5));
            if hooked {
                h.coordinator.await_master_hooks();
            }
            // The states a checkpoint's hooks return: its id.
            let hook_states = |id: CheckpointId| BTreeMap::from([("hook".to_owned(), id.0.to_le_bytes().to_vec())]);
            let mut hooking: Vec<CheckpointId> = Vec::new();
            let mut t = 0;
            let mut requests = 0;
            let mut triggered: Vec<CheckpointId> = Vec::new();
            let mut finalized: BTreeMap<CheckpointId, CompletedCheckpoint> = BTreeMap::new();
            let mut persisted = BTreeSet::new();
            let mut reported = BTreeSet::new();
            let mut durable = BTreeSet::new();
            let mut completed = BTreeSet::new();
            let mut resolved = BTreeSet::new();
            let mut discarded = BTreeSet::new();
            for op in ops.into_iter().chain([Op::AbortAll]) {
                let finalized_ids: Vec<CheckpointId> = finalized.keys().copied().collect();
                let event = match op {
                    Op::Advance(d) => {
                        t += d;
                        continue;
                    }
                    Op::Tick => Event::Tick,
                    Op::Trigger(kind) => {
                        requests += 1;
                        Event::Trigger { request: requests - 1, kind }
                    }
                    Op::Ack { pick: p, subtask: i } => {
                        let id = pick(&triggered, p);
                        ack(id.0, i)
                    }
                    Op::Decline { pick: p, subtask: i } => decline(pick(&triggered, p).0, i, "random"),
                    Op::Persisted(p) => Event::Persisted(pick(&finalized_ids, p)),
                    Op::PersistFailed(p) => Event::PersistFailed {
                        checkpoint: pick(&finalized_ids, p),
                        reason: "random".into(),
                    },
                    Op::AbortAll => Event::AbortAll { reason: "random".into() },
                    Op::HooksTriggered { pick: p, fails } => {
                        let checkpoint = pick(&hooking, p);
                        let result = if fails {
                            Err(HookError::Trigger { hook: "hook".into(), checkpoint, reason: "random".into() })
                        } else {
                            Ok(hook_states(checkpoint))
                        };
                        Event::HooksTriggered { checkpoint, result }
                    }
                };
                let infallible = matches!(event, Event::Tick | Event::Trigger { .. } | Event::AbortAll { .. });
                // The shell reports one outcome per finalized checkpoint, and
                // adds it to the store before reporting it persisted, whatever
                // the coordinator makes of the report.
                match &event {
                    Event::Persisted(id) if finalized.contains_key(id) && reported.insert(*id) => {
                        durable.insert(*id);
                    }
                    Event::PersistFailed { checkpoint, .. } if finalized.contains_key(checkpoint) => {
                        reported.insert(*checkpoint);
                    }
                    _ => {}
                }
                let persisting = match &event {
                    Event::Persisted(id) => Some(*id),
                    _ => None,
                };
                let hooks_in = match &event {
                    Event::HooksTriggered { checkpoint, result: Ok(_) } => Some(*checkpoint),
                    _ => None,
                };
                let actions = match h.try_handle(t, event) {
                    Ok(actions) => actions,
                    Err(e) => {
                        prop_assert!(!infallible, "{e}");
                        continue;
                    }
                };
                persisted.extend(persisting);
                for action in actions {
                    match action {
                        Action::TriggerHooks(id) => {
                            prop_assert!(hooked);
                            prop_assert!(hooking.last().is_none_or(|last| *last < id));
                            hooking.push(id);
                        }
                        Action::Trigger { barrier, next_id, .. } => {
                            // With hooks, a barrier goes out in the very step
                            // its hooks' states came in.
                            prop_assert!(!hooked || hooks_in == Some(barrier.id));
                            prop_assert!(triggered.last().is_none_or(|last| *last < barrier.id));
                            prop_assert_eq!(next_id, CheckpointId(barrier.id.0 + 1));
                            if barrier.options.kind == Savepoint {
                                prop_assert_eq!(barrier.options.alignment, Alignment::Aligned);
                            }
                            triggered.push(barrier.id);
                        }
                        Action::Finalize(c) => {
                            prop_assert!(triggered.contains(&c.id));
                            prop_assert_eq!(c.subtasks.len(), SUBTASKS as usize);
                            if hooked {
                                prop_assert_eq!(&c.master_states, &hook_states(c.id));
                            }
                            prop_assert!(finalized.insert(c.id, c).is_none(), "finalized twice");
                        }
                        Action::NotifyComplete(id) => {
                            prop_assert!(finalized.contains_key(&id) && persisted.contains(&id));
                            // No stop with a savepoint here: an intermediate
                            // savepoint commits nothing.
                            prop_assert_eq!(finalized[&id].kind, Checkpoint);
                            prop_assert!(completed.insert(id), "completed twice");
                        }
                        Action::Resolve { request, result } => {
                            prop_assert!(request < requests);
                            prop_assert!(resolved.insert(request), "request {} resolved twice", request);
                            if let Ok(id) = result {
                                prop_assert!(persisted.contains(&id));
                                prop_assert_eq!(
                                    completed.contains(&id),
                                    finalized[&id].kind == Checkpoint
                                );
                            }
                        }
                        Action::Discard { states, .. } => {
                            discarded.extend(states.iter().flat_map(|s| s.objects()).map(str::to_owned));
                        }
                        Action::NotifyAbort { .. } | Action::FailJob(_) | Action::Stats(_) => {}
                    }
                }
                prop_assert!(h.coordinator.pending() <= max_concurrent);
                let awaiting_hooks = h.coordinator.pending.values().any(|p| p.awaiting_hooks);
                prop_assert!(
                    h.coordinator.queued.is_empty()
                        || h.coordinator.pending() == max_concurrent
                        || awaiting_hooks
                );
                // poll_timeout is the earliest moment a Tick has work.
                if h.poll_timeout().is_none_or(|at| at > t) {
                    prop_assert_eq!(h.handle(t, Event::Tick), vec![]);
                }
            }
            // The final AbortAll settles everything.
            prop_assert_eq!(h.coordinator.pending(), 0);
            prop_assert_eq!(resolved.len() as u64, requests, "every request is resolved");
            // A durable checkpoint's state is never deleted.
            for id in &durable {
                for state in finalized[id].subtasks.values() {
                    for object in state.objects() {
                        prop_assert!(!discarded.contains(object), "{} discarded", object);
                    }
                }
            }
        }
    }
}
