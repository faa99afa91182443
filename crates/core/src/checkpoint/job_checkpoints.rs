//! The checkpointing of a whole job, sans-IO: the [`CheckpointCoordinator`]
//! together with the shared-state registry, the completed-checkpoint store,
//! the end of input and the bookkeeping of manual requests, restores and
//! shutdown, as one machine from [`JobEvent`]s to [`JobAction`]s. The
//! coordinator actor only carries the actions out and feeds back their
//! outcomes, so every ordering rule between storage writes, deletions and
//! notifications lives here, where a deterministic test and the simulator
//! drive it step by step:
//!
//! - a checkpoint's barriers go out only once its master hooks' states are
//!   in, and not at all if a hook failed;
//! - the id counter is stored before a barrier goes out;
//! - a checkpoint's shared files are registered before its `_metadata` is
//!   written, and it completes (notifies, commits sinks) only after;
//! - a subsumed checkpoint's metadata is deleted with, not before, the
//!   objects only it referenced, and an object a retained checkpoint still
//!   references is never deleted;
//! - a restore or a shutdown is answered only once no `_metadata` write is
//!   in flight, so a checkpoint that completes during a restart is the one
//!   restored.

use super::coordinator::{
    Action, CheckpointCoordinator, CoordinatorError, Event, HookError, Now, RequestId,
};
use super::input_end::InputEnd;
use super::shared::SharedStateRegistry;
use super::stats::StatsEvent;
use super::store::CompletedCheckpointStore;
use super::{ends_input, Ack, CheckpointFailure, CompletedCheckpoint};
use crate::model::event::{Barrier, CheckpointKind};
use crate::model::graph::JobGraph;
use crate::model::ids::{Attempt, CheckpointId, SubtaskId};
use std::collections::{BTreeMap, BTreeSet};

/// What the shell tells [`JobCheckpoints`]: messages of the job and the
/// outcomes of the IO it was asked for.
#[derive(Debug)]
pub enum JobEvent {
    /// A timer fired; see [`JobCheckpoints::poll_timeout`].
    Tick,
    /// An attempt runs with these subtasks; `input_ended`: it restored a
    /// checkpoint holding every source as exhausted.
    Deployed {
        /// The attempt.
        attempt: Attempt,
        /// Its source subtasks, which barriers are injected into.
        sources: Vec<SubtaskId>,
        /// Every subtask, notified of completions and aborts.
        subtasks: Vec<SubtaskId>,
        /// It restored a checkpoint that ended the input.
        input_ended: bool,
    },
    /// The running attempt failed: pending checkpoints are abandoned.
    AttemptFailed {
        /// Why, for the failures reported.
        reason: String,
    },
    /// The job is over: abandon everything, answered with
    /// [`JobAction::ShutDown`] once no write or deletion is in flight.
    Shutdown,
    /// Which checkpoint to restore from: answered with
    /// [`JobAction::Restore`] once no `_metadata` write is in flight.
    RestoreWanted,
    /// The attempts from the next on run `graph`, at a new parallelism;
    /// told between attempts, after the last one's failure or rescale.
    Rescaled {
        /// The job's graph at its new parallelism.
        graph: JobGraph,
    },
    /// A manual checkpoint or savepoint, answered with
    /// [`JobAction::Resolve`].
    Trigger {
        /// Names the request in its answer; the shell's, unique.
        request: RequestId,
        /// Checkpoint or savepoint.
        kind: CheckpointKind,
        /// A savepoint that stops the job.
        stop: bool,
        /// Somewhere a savepoint can go: the request named a target or
        /// the job has a savepoint directory.
        savepoint_dir: bool,
    },
    /// A subtask of `attempt` acknowledged.
    Ack {
        /// The attempt of the subtask.
        attempt: Attempt,
        /// The acknowledgement.
        ack: Box<Ack>,
    },
    /// A subtask of `attempt` declined a checkpoint.
    Decline {
        /// The attempt of the subtask.
        attempt: Attempt,
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// The subtask.
        subtask: SubtaskId,
        /// Why.
        reason: String,
    },
    /// A source of `attempt` has read everything.
    SourceExhausted {
        /// Its attempt.
        attempt: Attempt,
        /// The source.
        source: SubtaskId,
    },
    /// The outcome of [`JobAction::TriggerHooks`].
    HooksTriggered {
        /// The checkpoint whose barriers wait for it.
        checkpoint: CheckpointId,
        /// Each hook's state by its name, or the first hook's failure.
        result: Result<BTreeMap<String, Vec<u8>>, HookError>,
    },
    /// The outcome of [`JobAction::StoreNextId`].
    IdStored {
        /// The checkpoint whose barrier waits for it.
        checkpoint: CheckpointId,
        /// The storage error, if it failed.
        result: Result<(), String>,
    },
    /// The outcome of [`JobAction::WriteMetadata`].
    MetadataWritten {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// Its location (what `--restore` takes), or the failure.
        result: Result<String, WriteFailure>,
    },
    /// The outcome of [`JobAction::WriteSavepoint`]: where it went.
    SavepointWritten {
        /// The savepoint.
        checkpoint: CheckpointId,
        /// Its location, or why it failed.
        result: Result<String, String>,
    },
    /// One [`JobAction::Delete`] finished (failures are the shell's to log:
    /// what was not deleted is garbage, never a loss).
    Deleted,
}

/// Why a `_metadata` write failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteFailure {
    /// The storage error.
    pub reason: String,
    /// The write may have happened: the checkpoint may exist, so it keeps
    /// every object it references.
    pub outcome_unknown: bool,
}

/// A manual request's checkpoint, durable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// Its id.
    pub checkpoint: CheckpointId,
    /// Where a savepoint went; `None`: the checkpoint's own directory.
    pub location: Option<String>,
    /// A checkpoint that holds every source as exhausted: the job's input
    /// ends with it.
    pub ends_input: bool,
}

/// What the shell must do, in order.
#[derive(Debug, PartialEq)]
pub enum JobAction {
    /// Run every master hook's `trigger` for this checkpoint and feed back
    /// [`JobEvent::HooksTriggered`] before anything else: a source
    /// coordinator's hook snapshots which splits are handed out, so none
    /// may go out between its snapshot and the barrier.
    TriggerHooks(CheckpointId),
    /// Persist the id counter, then feed back [`JobEvent::IdStored`];
    /// nothing else may be stored or sent until then.
    StoreNextId {
        /// The barrier that waits for it.
        barrier: Barrier,
        /// The counter value.
        next_id: CheckpointId,
    },
    /// Tell these sources to inject `barrier`.
    InjectBarrier {
        /// Sources of the running attempt.
        sources: Vec<SubtaskId>,
        /// The barrier.
        barrier: Barrier,
        /// The sources emit nothing after it (a stop with a savepoint).
        suspend: bool,
    },
    /// Write the checkpoint's `_metadata` and feed back
    /// [`JobEvent::MetadataWritten`].
    WriteMetadata(CompletedCheckpoint),
    /// Copy a savepoint into its directory (the request's target, if it
    /// named one) and feed back [`JobEvent::SavepointWritten`].
    WriteSavepoint {
        /// The savepoint as acknowledged.
        checkpoint: CompletedCheckpoint,
        /// The manual request that asked for it.
        request: Option<RequestId>,
    },
    /// Delete these checkpoints (metadata first), then these objects, and
    /// feed back [`JobEvent::Deleted`].
    Delete {
        /// Subsumed checkpoints.
        checkpoints: Vec<CheckpointId>,
        /// Objects nothing references any more.
        paths: Vec<String>,
    },
    /// This checkpoint joined the completed-checkpoint store (and may
    /// have been subsumed at once): record it.
    Completed(Box<CompletedCheckpoint>),
    /// A savepoint was written: record it.
    SavepointCompleted {
        /// The savepoint.
        checkpoint: CheckpointId,
        /// Its location.
        location: String,
    },
    /// Tell every subtask that `checkpoint` completed, with the shared
    /// files each must upload again rather than reuse (compaction).
    NotifyComplete {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// Every subtask, with its files to upload again.
        subtasks: Vec<(SubtaskId, BTreeSet<String>)>,
    },
    /// Tell these subtasks that `checkpoint` was aborted.
    NotifyAbort {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// Every subtask of the running attempt.
        subtasks: Vec<SubtaskId>,
        /// Why.
        reason: CheckpointFailure,
    },
    /// Tell these sources to end their output.
    EndOfData(Vec<SubtaskId>),
    /// Checkpointing failed more often than tolerated.
    FailJob(String),
    /// Record this in the checkpoint statistics (the REST API's), in order.
    Stats(StatsEvent),
    /// Answer a manual request.
    Resolve {
        /// The request.
        request: RequestId,
        /// Its checkpoint, or why it failed.
        result: Result<Resolved, CheckpointFailure>,
    },
    /// Answer one [`JobEvent::RestoreWanted`]: the newest retained
    /// checkpoint, or `None` (the shell falls back to what the job started
    /// from). The shell restores the master hooks from the checkpoint it
    /// resumes from and calls [`JobCheckpoints::restore`].
    Restore(Option<CompletedCheckpoint>),
    /// Answer the [`JobEvent::Shutdown`]: nothing is written or deleted any
    /// more.
    ShutDown,
    /// An event contradicted what the coordinator knows; nothing changed.
    Rejected(CoordinatorError),
}

/// The request of the final checkpoint, which nobody waits for: the
/// shell's request ids count up from 0.
const FINAL_REQUEST: RequestId = RequestId::MAX;

/// Switches that break one ordering rule each, so that a test shows the
/// simulator catches the break; only the test kit can flip them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BrokenRule {
    /// Keep every rule.
    #[default]
    None,
    /// Complete a checkpoint when its metadata write starts, not when it
    /// ends.
    CompleteBeforeMetadata,
    /// Delete every object of a subsumed checkpoint, shared files a
    /// retained checkpoint references included.
    DeleteReferencedSharedFiles,
}

/// The checkpointing of one job run: see the module documentation.
pub struct JobCheckpoints {
    core: CheckpointCoordinator,
    registry: SharedStateRegistry,
    /// What recovery subsumed, deleted with the first event.
    recovered_deletes: Option<(Vec<CheckpointId>, Vec<String>)>,
    store: CompletedCheckpointStore,
    input_end: InputEnd,
    attempt: Attempt,
    sources: Vec<SubtaskId>,
    subtasks: Vec<SubtaskId>,
    /// Barriers waiting for their id counter write.
    storing: BTreeMap<CheckpointId, (Barrier, bool)>,
    /// Checkpoints whose `_metadata` (or savepoint) write is in flight.
    finalizing: BTreeMap<CheckpointId, CompletedCheckpoint>,
    /// Deletions in flight.
    deleting: usize,
    /// Manual triggers that arrived while no attempt was running.
    waiting: Vec<(RequestId, CheckpointKind)>,
    /// Where savepoints of manual requests went, until answered.
    locations: BTreeMap<CheckpointId, String>,
    restores_wanted: usize,
    shutdown_wanted: bool,
    broken: BrokenRule,
}

impl JobCheckpoints {
    /// Checkpointing resumed over the retained checkpoints of `store` (the
    /// registry counts their references), with `core` deciding triggers.
    /// The checkpoints its recovery subsumed are counted too, then deleted
    /// with the objects only they referenced, with the first event.
    pub fn new(
        core: CheckpointCoordinator,
        mut store: CompletedCheckpointStore,
        max_space_amplification: f64,
    ) -> Self {
        let surplus = store.take_surplus();
        let mut registry = SharedStateRegistry::rebuild(store.retained().chain(&surplus))
            .with_max_space_amplification(max_space_amplification);
        for old in &surplus {
            registry.removed(old);
        }
        let recovered_deletes = (
            surplus.iter().map(|c| c.id).collect(),
            registry.take_deletable(),
        );
        JobCheckpoints {
            core,
            registry,
            recovered_deletes: Some(recovered_deletes),
            store,
            input_end: InputEnd::default(),
            attempt: Attempt(0),
            sources: Vec::new(),
            subtasks: Vec::new(),
            storing: BTreeMap::new(),
            finalizing: BTreeMap::new(),
            deleting: 0,
            waiting: Vec::new(),
            locations: BTreeMap::new(),
            restores_wanted: 0,
            shutdown_wanted: false,
            broken: BrokenRule::None,
        }
    }

    /// Breaks `rule`, for the test that shows the simulator catches it.
    #[cfg(any(test, feature = "testkit"))]
    pub fn break_rule(&mut self, rule: BrokenRule) {
        self.broken = rule;
    }

    /// The retained checkpoints.
    pub fn store(&self) -> &CompletedCheckpointStore {
        &self.store
    }

    /// The shared-state registry: space and live files, for metrics.
    pub fn registry(&self) -> &SharedStateRegistry {
        &self.registry
    }

    /// Whether checkpoint `id` is being written: it may still complete.
    pub fn finalizing(&self, id: CheckpointId) -> bool {
        self.finalizing.contains_key(&id)
    }

    /// Resumes the id counter from `checkpoint`, the one a
    /// [`JobAction::Restore`] led the shell to.
    pub fn restore(&mut self, checkpoint: &CompletedCheckpoint) {
        self.core.restore(checkpoint)
    }

    /// When to [`JobEvent::Tick`]: never between attempts or after the
    /// input ended, so that no checkpoint starts that could never complete.
    pub fn poll_timeout(&self) -> Option<std::time::Instant> {
        if self.input_end.ended() || self.sources.is_empty() {
            return None;
        }
        self.core.poll_timeout()
    }

    /// Applies `event` at `now`; returns what the shell must do, in order.
    pub fn handle(&mut self, now: Now, event: JobEvent) -> Vec<JobAction> {
        let mut out = Vec::new();
        if let Some((checkpoints, paths)) = self.recovered_deletes.take() {
            self.delete(checkpoints, paths, &mut out);
        }
        match event {
            JobEvent::Tick => self.feed(now, Event::Tick, &mut out),
            JobEvent::Deployed {
                attempt,
                sources,
                subtasks,
                input_ended,
            } => self.deployed(now, attempt, sources, subtasks, input_ended, &mut out),
            JobEvent::AttemptFailed { reason } => self.abort_all(now, reason, &mut out),
            JobEvent::Shutdown => {
                self.input_end.stop();
                self.shutdown_wanted = true;
                self.abort_all(now, "the job ended".into(), &mut out);
            }
            JobEvent::RestoreWanted => self.restores_wanted += 1,
            JobEvent::Rescaled { graph } => self.core.rescaled(&graph),
            JobEvent::Trigger {
                request,
                kind,
                stop,
                savepoint_dir,
            } => self.manual(now, request, kind, stop, savepoint_dir, &mut out),
            JobEvent::Ack { attempt, ack } => self.ack(now, attempt, ack, &mut out),
            JobEvent::Decline {
                attempt,
                checkpoint,
                subtask,
                reason,
            } => {
                if attempt == self.attempt {
                    let event = Event::Decline {
                        checkpoint,
                        subtask,
                        reason,
                    };
                    self.feed(now, event, &mut out);
                }
            }
            JobEvent::SourceExhausted { attempt, source } => {
                if self.input_end.source_exhausted(attempt, source) {
                    out.push(JobAction::EndOfData(vec![source]));
                }
            }
            JobEvent::HooksTriggered { checkpoint, result } => {
                self.feed(now, Event::HooksTriggered { checkpoint, result }, &mut out)
            }
            JobEvent::IdStored { checkpoint, result } => {
                self.id_stored(now, checkpoint, result, &mut out)
            }
            JobEvent::MetadataWritten { checkpoint, result } => {
                self.metadata_written(now, checkpoint, result, &mut out)
            }
            JobEvent::SavepointWritten { checkpoint, result } => {
                self.savepoint_written(now, checkpoint, result, &mut out)
            }
            JobEvent::Deleted => self.deleting -= 1,
        }
        self.trigger_final(now, &mut out);
        self.answer_waiters(&mut out);
        out
    }

    fn deployed(
        &mut self,
        now: Now,
        attempt: Attempt,
        sources: Vec<SubtaskId>,
        subtasks: Vec<SubtaskId>,
        input_ended: bool,
        out: &mut Vec<JobAction>,
    ) {
        self.attempt = attempt;
        self.sources = sources.clone();
        self.subtasks = subtasks;
        let ending = self.input_end.deployed(attempt, sources, input_ended);
        if !ending.is_empty() {
            out.push(JobAction::EndOfData(ending));
        }
        for (request, kind) in std::mem::take(&mut self.waiting) {
            self.feed(now, Event::Trigger { request, kind }, out);
        }
    }

    fn manual(
        &mut self,
        now: Now,
        request: RequestId,
        kind: CheckpointKind,
        stop: bool,
        savepoint_dir: bool,
        out: &mut Vec<JobAction>,
    ) {
        let admitted = if self.input_end.ended() {
            Err(CheckpointFailure::NotTriggered(
                "the input has ended".into(),
            ))
        } else if kind == CheckpointKind::Savepoint && !savepoint_dir {
            Err(CheckpointFailure::NotTriggered(
                "no savepoint directory is configured".into(),
            ))
        } else {
            self.core.admit_manual(request, stop)
        };
        match admitted {
            Err(refusal) => out.push(JobAction::Resolve {
                request,
                result: Err(refusal),
            }),
            Ok(()) if self.sources.is_empty() => self.waiting.push((request, kind)),
            Ok(()) => self.feed(now, Event::Trigger { request, kind }, out),
        }
    }

    fn ack(&mut self, now: Now, attempt: Attempt, ack: Box<Ack>, out: &mut Vec<JobAction>) {
        if attempt != self.attempt {
            // A snapshot of an abandoned attempt: its checkpoint was aborted.
            let paths = self.registry.discardable(ack.checkpoint, &[ack.state]);
            self.delete(Vec::new(), paths, out);
            return;
        }
        self.feed(now, Event::Ack(ack), out);
    }

    /// Starts the checkpoint that ends the input, once the coordinator
    /// allows it and an attempt is running to take it.
    fn trigger_final(&mut self, now: Now, out: &mut Vec<JobAction>) {
        if !self.sources.is_empty()
            && !self.core.stopping()
            && self.input_end.trigger_final(self.core.pending())
        {
            let request = FINAL_REQUEST;
            let kind = CheckpointKind::Checkpoint;
            self.feed(now, Event::Trigger { request, kind }, out);
        }
    }

    fn id_stored(
        &mut self,
        now: Now,
        checkpoint: CheckpointId,
        result: Result<(), String>,
        out: &mut Vec<JobAction>,
    ) {
        // Gone: the attempt it was for failed meanwhile.
        let Some((barrier, suspend)) = self.storing.remove(&checkpoint) else {
            return;
        };
        match (result, self.sources.first()) {
            (Ok(()), _) => out.push(JobAction::InjectBarrier {
                sources: self.sources.clone(),
                barrier,
                suspend,
            }),
            (Err(e), Some(&subtask)) => {
                let reason = format!("the checkpoint id counter was not persisted: {e}");
                let event = Event::Decline {
                    checkpoint,
                    subtask,
                    reason,
                };
                self.feed(now, event, out);
            }
            (Err(e), None) => tracing::warn!(error = %e, "checkpoint id counter not persisted"),
        }
    }

    fn metadata_written(
        &mut self,
        now: Now,
        checkpoint: CheckpointId,
        result: Result<String, WriteFailure>,
        out: &mut Vec<JobAction>,
    ) {
        let Some(written) = self.finalizing.remove(&checkpoint) else {
            return;
        };
        match result {
            // Completed already, when the rule is broken.
            Ok(_) if self.broken == BrokenRule::CompleteBeforeMetadata => {}
            Ok(location) => {
                // Before it completes: the statistics of the latest
                // completed checkpoint copy its entry then.
                let path = location;
                out.push(JobAction::Stats(StatsEvent::Located {
                    id: checkpoint,
                    path,
                }));
                self.persisted(now, written, out)
            }
            Err(failure) => {
                let event = Event::PersistFailed {
                    checkpoint,
                    reason: failure.reason,
                };
                self.feed(now, event, out);
                // The acks' own objects are left to the registry: another
                // checkpoint may have been given them since. A checkpoint
                // that may exist keeps its references, and with them all
                // its state.
                if !failure.outcome_unknown {
                    self.registry.removed(&written);
                    self.delete_released(out);
                }
            }
        }
    }

    /// `_metadata` is written: the checkpoint joins the store, which may
    /// subsume older ones, whose directories go with the objects only they
    /// referenced.
    fn persisted(&mut self, now: Now, checkpoint: CompletedCheckpoint, out: &mut Vec<JobAction>) {
        let id = checkpoint.id;
        out.push(JobAction::Completed(Box::new(checkpoint.clone())));
        let subsumed = self.store.add(checkpoint);
        let mut released = Vec::new();
        for old in &subsumed {
            self.registry.removed(old);
            if self.broken == BrokenRule::DeleteReferencedSharedFiles {
                let shared = old.subtasks.values().flat_map(|s| s.shared_files());
                released.extend(shared.filter_map(|f| f.handle.physical().map(str::to_owned)));
            }
        }
        released.extend(self.registry.take_deletable());
        released.sort();
        released.dedup();
        self.delete(subsumed.iter().map(|c| c.id).collect(), released, out);
        self.feed(now, Event::Persisted(id), out);
    }

    fn savepoint_written(
        &mut self,
        now: Now,
        checkpoint: CheckpointId,
        result: Result<String, String>,
        out: &mut Vec<JobAction>,
    ) {
        let Some(written) = self.finalizing.remove(&checkpoint) else {
            return;
        };
        match result {
            Ok(location) => {
                out.push(JobAction::Stats(StatsEvent::Located {
                    id: checkpoint,
                    path: location.clone(),
                }));
                out.push(JobAction::SavepointCompleted {
                    checkpoint,
                    location: location.clone(),
                });
                // Answered with the request, unless abandoned.
                if self.core.request_of(checkpoint).is_some() {
                    self.locations.insert(checkpoint, location);
                }
                // Never retained: for the registry it ended like an
                // aborted checkpoint, and what it wrote to the checkpoint
                // directory was copied.
                let states: Vec<_> = written.subtasks.into_values().collect();
                let copied = self.registry.discardable(checkpoint, &states);
                self.registry.aborted(checkpoint);
                self.delete(Vec::new(), copied, out);
                self.feed(now, Event::Persisted(checkpoint), out);
            }
            Err(reason) => self.feed(now, Event::PersistFailed { checkpoint, reason }, out),
        }
    }

    /// Every pending checkpoint ends with the attempt, except those being
    /// written: they may still complete, and the registry counted them.
    fn abort_all(&mut self, now: Now, reason: String, out: &mut Vec<JobAction>) {
        self.sources.clear();
        self.subtasks.clear();
        self.storing.clear();
        self.registry.abort_all();
        self.feed(now, Event::AbortAll { reason }, out);
        self.delete_released(out);
    }

    /// Hands `event` to the coordinator and carries its actions over.
    fn feed(&mut self, now: Now, event: Event, out: &mut Vec<JobAction>) {
        match self.core.handle(now, event) {
            Ok(actions) => {
                for action in actions {
                    self.apply(now, action, out);
                }
            }
            Err(e) => out.push(JobAction::Rejected(e)),
        }
    }

    fn apply(&mut self, now: Now, action: Action, out: &mut Vec<JobAction>) {
        match action {
            Action::TriggerHooks(checkpoint) => out.push(JobAction::TriggerHooks(checkpoint)),
            Action::Trigger {
                barrier,
                next_id,
                suspend,
            } => {
                self.registry.triggered(barrier.id);
                self.storing.insert(barrier.id, (barrier, suspend));
                out.push(JobAction::StoreNextId { barrier, next_id });
            }
            Action::Finalize(checkpoint) => self.finalize(now, checkpoint, out),
            Action::NotifyComplete(checkpoint) => self.notify_complete(checkpoint, out),
            Action::NotifyAbort { checkpoint, reason } => {
                self.registry.aborted(checkpoint);
                self.delete_released(out);
                out.push(JobAction::NotifyAbort {
                    checkpoint,
                    subtasks: self.subtasks.clone(),
                    reason,
                });
            }
            Action::Discard { checkpoint, states } => {
                let paths = self.registry.discardable(checkpoint, &states);
                self.delete(Vec::new(), paths, out);
            }
            Action::FailJob(reason) => out.push(JobAction::FailJob(reason)),
            Action::Stats(event) => out.push(JobAction::Stats(event)),
            Action::Resolve { request, .. } if request == FINAL_REQUEST => {}
            Action::Resolve { request, result } => {
                let result = result.map(|checkpoint| Resolved {
                    checkpoint,
                    location: self.locations.remove(&checkpoint),
                    ends_input: self
                        .store
                        .latest()
                        .is_some_and(|c| c.id == checkpoint && ends_input(c, &self.sources)),
                });
                out.push(JobAction::Resolve { request, result });
            }
        }
    }

    /// Registers a checkpoint's shared files, then has its `_metadata`
    /// written: the registry may replace duplicate shared files, and the
    /// metadata must hold what it counts. A savepoint goes to its own
    /// directory instead.
    fn finalize(
        &mut self,
        now: Now,
        mut checkpoint: CompletedCheckpoint,
        out: &mut Vec<JobAction>,
    ) {
        let id = checkpoint.id;
        if checkpoint.kind == CheckpointKind::Savepoint {
            let request = self.core.request_of(id);
            self.finalizing.insert(id, checkpoint.clone());
            out.push(JobAction::WriteSavepoint {
                checkpoint,
                request,
            });
            return;
        }
        self.registry.completed(&mut checkpoint);
        self.delete_released(out);
        self.finalizing.insert(id, checkpoint.clone());
        out.push(JobAction::WriteMetadata(checkpoint.clone()));
        if self.broken == BrokenRule::CompleteBeforeMetadata {
            self.persisted(now, checkpoint, out);
        }
    }

    /// Tells every subtask that `id` completed; when `id` is the newest
    /// retained checkpoint and the input ended by it, the sources too.
    fn notify_complete(&mut self, id: CheckpointId, out: &mut Vec<JobAction>) {
        let mut compactions = self.registry.compactions();
        let subtasks = self
            .subtasks
            .iter()
            .map(|s| {
                let rewrite = compactions.remove(s).into_iter().flatten();
                (*s, rewrite.map(|key| key.name).collect())
            })
            .collect();
        out.push(JobAction::NotifyComplete {
            checkpoint: id,
            subtasks,
        });
        let ends = match self.store.latest() {
            Some(latest) if latest.id == id => self.input_end.completed(latest),
            _ => false,
        };
        if ends && !self.sources.is_empty() {
            out.push(JobAction::EndOfData(self.sources.clone()));
        }
    }

    fn delete_released(&mut self, out: &mut Vec<JobAction>) {
        let paths = self.registry.take_deletable();
        self.delete(Vec::new(), paths, out);
    }

    fn delete(
        &mut self,
        checkpoints: Vec<CheckpointId>,
        paths: Vec<String>,
        out: &mut Vec<JobAction>,
    ) {
        if checkpoints.is_empty() && paths.is_empty() {
            return;
        }
        self.deleting += 1;
        out.push(JobAction::Delete { checkpoints, paths });
    }

    fn answer_waiters(&mut self, out: &mut Vec<JobAction>) {
        if !self.finalizing.is_empty() {
            return;
        }
        for _ in 0..std::mem::take(&mut self.restores_wanted) {
            out.push(JobAction::Restore(self.store.latest().cloned()));
        }
        if self.shutdown_wanted && self.deleting == 0 {
            self.shutdown_wanted = false;
            out.push(JobAction::ShutDown);
        }
    }
}
