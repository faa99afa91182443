//! The coordinator actor: the shell of the core's `JobCheckpoints`. It owns
//! the timer, checkpoint storage, the master hooks and the subtasks'
//! addresses, feeds the core every message with the current time, carries
//! out the IO and runs the user code it asks for and feeds back the
//! outcomes; every decision is the core's. It outlives the attempts of a
//! job: the supervisor tells it which subtasks are current.

use crate::checkpoint::hooks::MasterHooks;
use crate::clock::now;
use crate::dataflow::sources::{HostsSources, SourceHost};
use crate::dataflow::subtask::SubtaskHandle;
use crate::messages::{
    AcknowledgeCheckpoint, CheckpointingFailed, DeclineCheckpoint, EndOfData,
    NotifyCheckpointAborted, NotifyCheckpointComplete, SourceExhausted, SplitRequest,
    SubtaskFailed, TriggerCheckpoint,
};
use crate::metrics::{CheckpointCounters, JobMetrics};
use actix::{
    Actor, ActorFutureExt, Addr, AsyncContext, Context, Handler, Message, Recipient, SpawnHandle,
    WrapFuture,
};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tidemark_core::checkpoint::coordinator::{CheckpointCoordinator, HookError, RequestId};
use tidemark_core::checkpoint::job_checkpoints::{
    JobAction, JobCheckpoints, JobEvent, Resolved, WriteFailure,
};
use tidemark_core::checkpoint::stats;
use tidemark_core::checkpoint::store::CompletedCheckpointStore;
use tidemark_core::checkpoint::{CheckpointFailure, CompletedCheckpoint};
use tidemark_core::model::event::{Barrier, CheckpointKind};
use tidemark_core::model::graph::JobGraph;
use tidemark_core::model::ids::{Attempt, CheckpointId, JobId, SubtaskId};
use tidemark_storage::savepoint;
use tidemark_storage::{CheckpointStorage, StorageError};
use tokio::sync::oneshot;

/// The subtasks of the current attempt.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Deployed {
    pub attempt: Attempt,
    pub sources: Vec<(SubtaskId, SubtaskHandle)>,
    pub subtasks: Vec<(SubtaskId, SubtaskHandle)>,
    /// It restored a checkpoint holding every source as exhausted.
    pub input_ended: bool,
}

/// The attempt failed: abandon pending checkpoints.
#[derive(Message)]
#[rtype(result = "()")]
pub struct AbortPending {
    pub reason: String,
}

/// The attempts from the next on run this graph, at a new parallelism.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Rescaled(pub JobGraph);

/// A checkpoint to restore from.
#[derive(Clone, Debug)]
pub struct RestoreFrom {
    pub checkpoint: CompletedCheckpoint,
    /// One of the job's retained checkpoints, whose files it owns and may
    /// base incremental checkpoints on; otherwise the savepoint or
    /// unclaimed checkpoint the job was started from.
    pub owned: bool,
    /// Where its state is when not in the job's checkpoint storage: the
    /// savepoint directory the job was started from.
    pub dir: Option<CheckpointStorage>,
}

/// The checkpoint to restore from: answered once no abandoned checkpoint is
/// still writing its metadata, so that a checkpoint that completes during a
/// restart is the one restored (the sinks may commit it). The master hooks
/// are restored from it on the way.
#[derive(Message)]
#[rtype(result = "()")]
pub struct LatestCheckpoint(pub oneshot::Sender<Result<Option<RestoreFrom>, HookError>>);

/// The job is over: abandon pending checkpoints and answer once their state
/// is deleted.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Shutdown(pub oneshot::Sender<()>);

/// A checkpoint or savepoint a manual trigger asked for, once durable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completed {
    /// Its id.
    pub id: CheckpointId,
    /// Its directory, a path or URL: what `--restore` takes.
    pub location: String,
    /// It holds every source as exhausted: the job's input ends with it.
    pub ends_input: bool,
}

/// What a manual trigger is answered with.
pub type TriggerReply = oneshot::Sender<Result<Completed, CheckpointFailure>>;

/// Trigger a checkpoint or savepoint now; answered when it completed or failed.
#[derive(Message)]
#[rtype(result = "()")]
pub struct TriggerManual {
    pub kind: CheckpointKind,
    /// A savepoint that stops the job: no periodic checkpoint starts after
    /// it, and its completion commits the sinks.
    pub stop: bool,
    /// Where this savepoint goes instead of the job's savepoint directory.
    pub target: Option<CheckpointStorage>,
    pub reply: TriggerReply,
}

/// Where savepoints go, and what the job started from.
pub struct Savepoints {
    pub job: JobId,
    /// The savepoint directory; `None`: savepoints cannot be taken.
    pub dir: Option<CheckpointStorage>,
    /// The savepoint or unclaimed checkpoint the job started from: what a
    /// failover restores until the job has a checkpoint of its own.
    pub started_from: Option<RestoreFrom>,
}

/// A checkpoint in flight, as the shell tracks it for its metrics.
struct Triggered {
    at: Instant,
    /// Open as long as the checkpoint: `RUST_LOG` shows its
    /// acknowledgements inside it, and its duration when it closes.
    span: tracing::Span,
}

pub struct CoordinatorActor {
    core: JobCheckpoints,
    /// Run when the core asks for their states and on every restore.
    hooks: MasterHooks,
    /// The job's source coordinators.
    sources: SourceHost,
    storage: CheckpointStorage,
    /// The job's supervisor, which fails the job over.
    supervisor: Recipient<CheckpointingFailed>,
    /// The job's supervisor, for failures of the sources it hosts.
    failures: Recipient<SubtaskFailed>,
    metrics: Arc<JobMetrics>,
    attempt: Attempt,
    /// Every subtask of the running attempt, sources included.
    subtasks: HashMap<SubtaskId, SubtaskHandle>,
    shutdown_replies: Vec<oneshot::Sender<()>>,
    restore_replies: VecDeque<oneshot::Sender<Result<Option<RestoreFrom>, HookError>>>,
    savepoints: Savepoints,
    timer: Option<SpawnHandle>,
    requests: HashMap<RequestId, TriggerReply>,
    /// Savepoint directories manual requests asked for.
    targets: HashMap<RequestId, CheckpointStorage>,
    next_request: RequestId,
    /// Each checkpoint still pending (or finalizing): entries go when
    /// their checkpoint completes, aborts or is abandoned.
    triggered: HashMap<CheckpointId, Triggered>,
    /// Pending checkpoints that some subtask switched to unaligned: a
    /// subset of `triggered`'s.
    switched: HashSet<CheckpointId>,
}

impl CoordinatorActor {
    pub fn new<S>(
        core: CheckpointCoordinator,
        storage: CheckpointStorage,
        store: CompletedCheckpointStore,
        supervisor: Addr<S>,
        metrics: Arc<JobMetrics>,
        max_space_amplification: f64,
        savepoints: Savepoints,
    ) -> Self
    where
        S: Actor<Context = Context<S>> + Handler<CheckpointingFailed> + Handler<SubtaskFailed>,
    {
        CoordinatorActor {
            sources: SourceHost::default(),
            hooks: MasterHooks::default(),
            core: JobCheckpoints::new(core, store, max_space_amplification),
            storage,
            failures: supervisor.clone().recipient(),
            supervisor: supervisor.recipient(),
            metrics,
            attempt: Attempt(0),
            subtasks: HashMap::new(),
            shutdown_replies: Vec::new(),
            restore_replies: VecDeque::new(),
            savepoints,
            switched: HashSet::new(),
            timer: None,
            requests: HashMap::new(),
            targets: HashMap::new(),
            next_request: 0,
            triggered: HashMap::new(),
        }
    }

    /// Hosts the job's source coordinators: see `sources`.
    pub fn hosting(self, sources: SourceHost) -> Self {
        CoordinatorActor { sources, ..self }
    }

    /// Runs the job's master hooks, restored already if the job resumes
    /// from a checkpoint; the core awaits them (`await_master_hooks`).
    pub fn with_master_hooks(self, hooks: MasterHooks) -> Self {
        CoordinatorActor { hooks, ..self }
    }

    /// Feeds `event`, then the outcomes of the actions carried out at once,
    /// in the same turn: no message, hence no split handed out, comes
    /// between the master hooks' snapshot and the id counter write that
    /// holds the mailbox until the barrier goes out.
    fn feed(&mut self, event: JobEvent, ctx: &mut Context<Self>) {
        let mut events = VecDeque::from([event]);
        while let Some(event) = events.pop_front() {
            for action in self.core.handle(now(), event) {
                events.extend(self.carry_out(action, ctx));
            }
        }
        self.rearm(ctx);
    }

    fn rearm(&mut self, ctx: &mut Context<Self>) {
        if let Some(timer) = self.timer.take() {
            ctx.cancel_future(timer);
        }
        if let Some(at) = self.core.poll_timeout() {
            let wait = at.saturating_duration_since(Instant::now());
            self.timer = Some(ctx.run_later(wait, |act, ctx| {
                act.timer = None;
                act.feed(JobEvent::Tick, ctx);
            }));
        }
    }

    fn send_to<M>(&self, subtasks: impl IntoIterator<Item = SubtaskId>, message: impl Fn() -> M)
    where
        M: crate::messages::ToSubtask,
        crate::dataflow::subtask::SubtaskActor: Handler<M>,
    {
        for id in subtasks {
            if let Some(handle) = self.subtasks.get(&id) {
                handle.send(message());
            }
        }
    }

    /// Carries out one action of the core, feeding back its outcome later
    /// or, for the master hooks, returning it.
    fn carry_out(&mut self, action: JobAction, ctx: &mut Context<Self>) -> Option<JobEvent> {
        match action {
            JobAction::TriggerHooks(checkpoint) => {
                let result = self.hooks.trigger(checkpoint);
                return Some(JobEvent::HooksTriggered { checkpoint, result });
            }
            JobAction::StoreNextId { barrier, next_id } => {
                self.store_next_id(barrier, next_id, ctx)
            }
            JobAction::InjectBarrier {
                sources,
                barrier,
                suspend,
            } => self.send_to(sources, || TriggerCheckpoint { barrier, suspend }),
            JobAction::WriteMetadata(checkpoint) => self.write_metadata(checkpoint, ctx),
            JobAction::WriteSavepoint {
                checkpoint,
                request,
            } => self.write_savepoint(checkpoint, request, ctx),
            JobAction::Delete { checkpoints, paths } => self.delete(checkpoints, paths, ctx),
            JobAction::Completed(checkpoint) => self.completed(&checkpoint),
            JobAction::SavepointCompleted {
                checkpoint,
                location,
            } => self.savepoint_completed(checkpoint, location),
            JobAction::NotifyComplete {
                checkpoint,
                subtasks,
            } => {
                for (id, rewrite) in subtasks {
                    self.send_to([id], || NotifyCheckpointComplete {
                        checkpoint,
                        rewrite: rewrite.clone(),
                    });
                }
            }
            JobAction::NotifyAbort {
                checkpoint,
                subtasks,
                reason,
            } => self.notify_abort(checkpoint, subtasks, reason),
            JobAction::EndOfData(sources) => self.send_to(sources, || EndOfData),
            JobAction::FailJob(reason) => self.supervisor.do_send(CheckpointingFailed(reason)),
            JobAction::Stats(event) => stats::lock(&self.metrics.checkpoint_stats).apply(event),
            JobAction::Resolve { request, result } => self.resolve(request, result),
            JobAction::Restore(latest) => self.answer_restore(latest),
            JobAction::ShutDown => {
                for reply in self.shutdown_replies.drain(..) {
                    let _ = reply.send(());
                }
            }
            JobAction::Rejected(e) => {
                tracing::warn!(error = %e, "checkpoint coordinator rejected a message")
            }
        }
        None
    }

    /// Persists the id counter, the mailbox held meanwhile: counter writes
    /// and barriers go out in id order.
    fn store_next_id(&mut self, barrier: Barrier, next_id: CheckpointId, ctx: &mut Context<Self>) {
        let checkpoint = barrier.id;
        let span = tracing::info_span!(
            "checkpoint",
            id = checkpoint.0,
            kind = ?barrier.options.kind,
            alignment = ?barrier.options.alignment,
        );
        let at = Instant::now();
        self.triggered.insert(checkpoint, Triggered { at, span });
        let storage = self.storage.clone();
        ctx.wait(
            async move { storage.store_next_checkpoint_id(next_id).await }
                .into_actor(self)
                .map(move |result, act, ctx| {
                    let result = result.map_err(|e| e.to_string());
                    act.feed(JobEvent::IdStored { checkpoint, result }, ctx);
                }),
        );
    }

    fn write_metadata(&mut self, checkpoint: CompletedCheckpoint, ctx: &mut Context<Self>) {
        let storage = self.storage.clone();
        let id = checkpoint.id;
        ctx.spawn(
            async move { storage.write_metadata(&checkpoint).await }
                .into_actor(self)
                .map(move |written, act, ctx| {
                    let location = act.storage.location(&CheckpointStorage::checkpoint_dir(id));
                    let result = written.map(|()| location).map_err(|e| WriteFailure {
                        outcome_unknown: matches!(e, StorageError::UnknownOutcome { .. }),
                        reason: e.to_string(),
                    });
                    act.feed(
                        JobEvent::MetadataWritten {
                            checkpoint: id,
                            result,
                        },
                        ctx,
                    );
                }),
        );
    }

    /// Copies a savepoint out of the checkpoint directory into its own
    /// directory: the request's target, else the job's savepoint directory.
    fn write_savepoint(
        &mut self,
        checkpoint: CompletedCheckpoint,
        request: Option<RequestId>,
        ctx: &mut Context<Self>,
    ) {
        let id = checkpoint.id;
        let source = self.storage.clone();
        let target = request
            .and_then(|request| self.targets.get(&request))
            .or(self.savepoints.dir.as_ref())
            .cloned();
        let job = self.savepoints.job;
        ctx.spawn(
            async move {
                match &target {
                    Some(target) => savepoint::write(&source, target, job, &checkpoint)
                        .await
                        .map(|(location, _)| location)
                        .map_err(|e| e.to_string()),
                    None => Err("no savepoint directory is configured".to_owned()),
                }
            }
            .into_actor(self)
            .map(move |result, act, ctx| {
                act.feed(
                    JobEvent::SavepointWritten {
                        checkpoint: id,
                        result,
                    },
                    ctx,
                )
            }),
        );
    }

    /// Deletes checkpoints (metadata first), then state objects, off the
    /// mailbox; failures are logged: what is left is garbage, not a loss.
    fn delete(
        &mut self,
        checkpoints: Vec<CheckpointId>,
        paths: Vec<String>,
        ctx: &mut Context<Self>,
    ) {
        let storage = self.storage.clone();
        ctx.spawn(
            async move {
                let mut deleted = HashSet::new();
                for id in checkpoints {
                    match storage.delete_checkpoint(id).await {
                        Ok(objects) => deleted.extend(objects),
                        Err(e) => tracing::warn!(error = %e, checkpoint = %id, "discarding a subsumed checkpoint failed"),
                    }
                }
                // Objects a deleted checkpoint's listing found went with
                // it: a second delete would succeed on object stores and
                // count twice. What the listing missed goes here.
                let missed = paths.into_iter().filter(|path| !deleted.contains(path)).collect();
                match storage.delete_many(missed).await {
                    Ok(failed) => {
                        for (path, e) in failed {
                            tracing::warn!(error = %e, path, "discarding checkpoint state failed");
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "discarding checkpoint state failed"),
                }
            }
            .into_actor(self)
            .map(|(), act, ctx| act.feed(JobEvent::Deleted, ctx)),
        );
    }

    /// Records a checkpoint that joined the store.
    fn completed(&mut self, checkpoint: &CompletedCheckpoint) {
        let id = checkpoint.id;
        let stats = &self.metrics.checkpoints;
        stats.completed.fetch_add(1, Ordering::Relaxed);
        stats.bytes_full.store(
            checkpoint.subtasks.values().map(|s| s.size()).sum(),
            Ordering::Relaxed,
        );
        stats.record_inflight(checkpoint);
        stats.record_uploads(checkpoint);
        if self.switched.remove(&id) {
            stats.switched_to_unaligned.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(triggered) = self.triggered.remove(&id) {
            CheckpointCounters::record(
                &stats.durations_ms,
                triggered.at.elapsed().as_secs_f64() * 1e3,
            );
        }
        // Older checkpoints have ended one way or another.
        self.triggered.retain(|pending, _| *pending > id);
        self.switched.retain(|pending| *pending > id);
        let registry = self.core.registry();
        stats.record_space(registry.physical_files_live(), registry.space());
    }

    fn savepoint_completed(&mut self, id: CheckpointId, location: String) {
        tracing::info!(%location, "savepoint written");
        let stats = &self.metrics.checkpoints;
        stats.savepoints.fetch_add(1, Ordering::Relaxed);
        if let Some(triggered) = self.triggered.remove(&id) {
            stats
                .savepoint_us_last
                .store(triggered.at.elapsed().as_micros() as u64, Ordering::Relaxed);
        }
    }

    fn notify_abort(
        &mut self,
        checkpoint: CheckpointId,
        subtasks: Vec<SubtaskId>,
        reason: CheckpointFailure,
    ) {
        self.triggered.remove(&checkpoint);
        self.switched.remove(&checkpoint);
        if !matches!(reason, CheckpointFailure::Aborted { .. }) {
            self.metrics
                .checkpoints
                .failed
                .fetch_add(1, Ordering::Relaxed);
        }
        tracing::info!(%reason, "checkpoint aborted");
        self.send_to(subtasks, || NotifyCheckpointAborted(checkpoint));
    }

    /// Answers a manual trigger or a savepoint request.
    fn resolve(&mut self, request: RequestId, result: Result<Resolved, CheckpointFailure>) {
        self.targets.remove(&request);
        let result = result.map(|resolved| Completed {
            id: resolved.checkpoint,
            ends_input: resolved.ends_input,
            location: resolved.location.unwrap_or_else(|| {
                self.storage
                    .location(&CheckpointStorage::checkpoint_dir(resolved.checkpoint))
            }),
        });
        if let Some(reply) = self.requests.remove(&request) {
            let _ = reply.send(result);
        }
    }

    /// Answers the oldest restore request: the newest retained checkpoint,
    /// else what the job started from, its master hooks restored.
    fn answer_restore(&mut self, latest: Option<CompletedCheckpoint>) {
        let Some(reply) = self.restore_replies.pop_front() else {
            return;
        };
        let from = match latest {
            Some(checkpoint) => Some(RestoreFrom {
                checkpoint,
                owned: true,
                dir: None,
            }),
            None => self.savepoints.started_from.clone(),
        };
        let restored = match &from {
            Some(from) => {
                self.core.restore(&from.checkpoint);
                self.hooks.restore(&from.checkpoint)
            }
            None => Ok(()),
        };
        let _ = reply.send(restored.map(|()| from));
    }

    /// Every pending checkpoint ends with the attempt, except those being
    /// written: they may still complete.
    fn attempt_ended(&mut self, event: JobEvent, ctx: &mut Context<Self>) {
        self.subtasks.clear();
        self.feed(event, ctx);
        let core = &self.core;
        self.triggered.retain(|id, _| core.finalizing(*id));
        self.switched.retain(|id| core.finalizing(*id));
    }
}

impl Actor for CoordinatorActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.rearm(ctx);
    }
}

impl Handler<Deployed> for CoordinatorActor {
    type Result = ();

    fn handle(&mut self, msg: Deployed, ctx: &mut Context<Self>) {
        self.attempt = msg.attempt;
        SourceHost::start(self, msg.attempt, &msg.sources, ctx);
        let sources = msg.sources.iter().map(|(id, _)| *id).collect();
        let subtasks = msg.subtasks.iter().map(|(id, _)| *id).collect();
        self.subtasks = msg.sources.into_iter().chain(msg.subtasks).collect();
        self.feed(
            JobEvent::Deployed {
                attempt: msg.attempt,
                sources,
                subtasks,
                input_ended: msg.input_ended,
            },
            ctx,
        );
    }
}

impl Handler<AbortPending> for CoordinatorActor {
    type Result = ();

    fn handle(&mut self, msg: AbortPending, ctx: &mut Context<Self>) {
        self.attempt_ended(JobEvent::AttemptFailed { reason: msg.reason }, ctx);
    }
}

impl Handler<Rescaled> for CoordinatorActor {
    type Result = ();

    fn handle(&mut self, Rescaled(graph): Rescaled, ctx: &mut Context<Self>) {
        self.feed(JobEvent::Rescaled { graph }, ctx);
    }
}

impl Handler<Shutdown> for CoordinatorActor {
    type Result = ();

    fn handle(&mut self, Shutdown(reply): Shutdown, ctx: &mut Context<Self>) {
        self.shutdown_replies.push(reply);
        self.attempt_ended(JobEvent::Shutdown, ctx);
    }
}

impl Handler<LatestCheckpoint> for CoordinatorActor {
    type Result = ();

    fn handle(&mut self, LatestCheckpoint(reply): LatestCheckpoint, ctx: &mut Context<Self>) {
        self.restore_replies.push_back(reply);
        self.feed(JobEvent::RestoreWanted, ctx);
    }
}

impl Handler<TriggerManual> for CoordinatorActor {
    type Result = ();

    fn handle(&mut self, msg: TriggerManual, ctx: &mut Context<Self>) {
        let request = self.next_request;
        self.next_request += 1;
        self.requests.insert(request, msg.reply);
        let savepoint_dir = msg.target.is_some() || self.savepoints.dir.is_some();
        if let Some(target) = msg.target {
            self.targets.insert(request, target);
        }
        self.feed(
            JobEvent::Trigger {
                request,
                kind: msg.kind,
                stop: msg.stop,
                savepoint_dir,
            },
            ctx,
        );
    }
}

impl Handler<AcknowledgeCheckpoint> for CoordinatorActor {
    type Result = ();

    fn handle(&mut self, msg: AcknowledgeCheckpoint, ctx: &mut Context<Self>) {
        let (checkpoint, subtask, m) = (msg.ack.checkpoint, msg.ack.subtask, &msg.ack.metrics);
        if msg.attempt == self.attempt {
            let _span = self
                .triggered
                .get(&checkpoint)
                .map_or_else(tracing::Span::none, |t| t.span.clone())
                .entered();
            tracing::debug!(
                %checkpoint,
                %subtask,
                alignment_ms = m.alignment.as_secs_f64() * 1e3,
                bytes_during_alignment = m.bytes_during_alignment,
                start_delay_ms = m.start_delay.as_secs_f64() * 1e3,
                sync_ms = m.sync.as_secs_f64() * 1e3,
                async_ms = m.async_.as_secs_f64() * 1e3,
                state_size = m.state_size,
                persisted_inflight_bytes = m.persisted_inflight_bytes,
                unaligned = m.unaligned,
                switched_to_unaligned = m.switched_to_unaligned,
                "acknowledged"
            );
            // A late ack of an ended checkpoint is not kept.
            if m.switched_to_unaligned && self.triggered.contains_key(&checkpoint) {
                self.switched.insert(checkpoint);
            }
            CheckpointCounters::record(
                &self.metrics.checkpoints.alignments_ms,
                m.alignment.as_secs_f64() * 1e3,
            );
        }
        self.feed(
            JobEvent::Ack {
                attempt: msg.attempt,
                ack: Box::new(msg.ack),
            },
            ctx,
        );
    }
}

impl Handler<DeclineCheckpoint> for CoordinatorActor {
    type Result = ();

    fn handle(&mut self, msg: DeclineCheckpoint, ctx: &mut Context<Self>) {
        self.feed(
            JobEvent::Decline {
                attempt: msg.attempt,
                checkpoint: msg.checkpoint,
                subtask: msg.subtask,
                reason: msg.reason,
            },
            ctx,
        );
    }
}

impl HostsSources for CoordinatorActor {
    fn sources(&mut self) -> &mut SourceHost {
        &mut self.sources
    }

    fn source_failed(&mut self, failed: SubtaskFailed, _ctx: &mut Context<Self>) {
        self.failures.do_send(failed);
    }
}

impl Handler<SplitRequest> for CoordinatorActor {
    type Result = ();

    fn handle(&mut self, request: SplitRequest, ctx: &mut Context<Self>) {
        SourceHost::request(self, request, ctx);
    }
}

impl Handler<SourceExhausted> for CoordinatorActor {
    type Result = ();

    fn handle(&mut self, msg: SourceExhausted, ctx: &mut Context<Self>) {
        self.feed(
            JobEvent::SourceExhausted {
                attempt: msg.attempt,
                source: msg.subtask,
            },
            ctx,
        );
    }
}
