//! The coordinator actor: the shell of the core `CheckpointCoordinator`. It
//! owns the timer, checkpoint storage and the `CompletedCheckpointStore`,
//! feeds the core every message with the current time, and carries out the
//! actions the core returns. It outlives the attempts of a job: the
//! supervisor tells it which subtasks are current.

use crate::messages::SubtaskHandle;
use crate::messages::{
    AcknowledgeCheckpoint, DeclineCheckpoint, EndInput, NotifyCheckpointAborted,
    NotifyCheckpointComplete, SourceExhausted, TriggerCheckpoint,
};
use crate::metrics::{CheckpointCounters, JobMetrics};
use crate::supervisor::{CheckpointingFailed, JobSupervisor};
use actix::{
    Actor, ActorFutureExt, Addr, AsyncContext, Context, Handler, Message, SpawnHandle, WrapFuture,
};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tidemark_core::checkpoint::coordinator::{
    Action, CheckpointCoordinator, Event, Now, RequestId,
};
use tidemark_core::checkpoint::input_end::InputEnd;
use tidemark_core::checkpoint::shared::SharedStateRegistry;
use tidemark_core::checkpoint::stats;
use tidemark_core::checkpoint::store::CompletedCheckpointStore;
use tidemark_core::checkpoint::{CheckpointFailure, CompletedCheckpoint};
use tidemark_core::event::{Barrier, CheckpointKind};
use tidemark_core::ids::{Attempt, CheckpointId, JobId, SubtaskId};
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
pub struct LatestCheckpoint(pub oneshot::Sender<Result<Option<RestoreFrom>, String>>);

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

/// A checkpoint in flight, as the shell tracks it.
struct Triggered {
    at: Instant,
    /// Open as long as the checkpoint: `RUST_LOG` shows its
    /// acknowledgements inside it, and its duration when it closes.
    span: tracing::Span,
}

pub struct CoordinatorActor {
    core: CheckpointCoordinator,
    storage: CheckpointStorage,
    store: CompletedCheckpointStore,
    supervisor: Addr<JobSupervisor>,
    metrics: Arc<JobMetrics>,
    attempt: Attempt,
    sources: Vec<(SubtaskId, SubtaskHandle)>,
    subtasks: Vec<(SubtaskId, SubtaskHandle)>,
    input_end: InputEnd,
    /// Checkpoints whose `_metadata` write is in flight.
    finalizing: BTreeSet<CheckpointId>,
    registry: SharedStateRegistry,
    /// Deletions in flight.
    deleting: usize,
    shutdown_replies: Vec<oneshot::Sender<()>>,

    restore_replies: Vec<oneshot::Sender<Result<Option<RestoreFrom>, String>>>,
    savepoints: Savepoints,
    timer: Option<SpawnHandle>,
    requests: HashMap<RequestId, TriggerReply>,
    /// Savepoint directories manual requests asked for.
    targets: HashMap<RequestId, CheckpointStorage>,
    /// Where savepoints written for manual requests went, until answered.
    locations: HashMap<CheckpointId, String>,
    /// Manual triggers that arrived while no attempt was running.
    waiting: Vec<(RequestId, CheckpointKind)>,
    next_request: RequestId,
    /// Each checkpoint still pending (or finalizing): entries go when
    /// their checkpoint completes, aborts or is abandoned.
    triggered: HashMap<CheckpointId, Triggered>,
    /// Pending checkpoints that some subtask switched to unaligned: a
    /// subset of `triggered`'s.
    switched: HashSet<CheckpointId>,
}

/// The clock the shells hand to the core: monotonic for timers, wall time
/// for barrier timestamps.
pub(crate) fn now() -> Now {
    Now {
        instant: Instant::now(),
        unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    }
}

impl CoordinatorActor {
    pub fn new(
        core: CheckpointCoordinator,
        storage: CheckpointStorage,
        store: CompletedCheckpointStore,
        supervisor: Addr<JobSupervisor>,
        metrics: Arc<JobMetrics>,
        max_space_amplification: f64,
        savepoints: Savepoints,
    ) -> Self {
        CoordinatorActor {
            core,
            storage,
            registry: SharedStateRegistry::rebuild(store.retained())
                .with_max_space_amplification(max_space_amplification),
            store,
            supervisor,
            metrics,
            attempt: Attempt(0),
            sources: Vec::new(),
            subtasks: Vec::new(),
            input_end: InputEnd::default(),
            finalizing: BTreeSet::new(),
            deleting: 0,
            shutdown_replies: Vec::new(),
            restore_replies: Vec::new(),
            savepoints,
            switched: HashSet::new(),
            timer: None,
            requests: HashMap::new(),
            targets: HashMap::new(),
            locations: HashMap::new(),
            waiting: Vec::new(),
            next_request: 0,
            triggered: HashMap::new(),
        }
    }

    fn feed(&mut self, event: Event, ctx: &mut Context<Self>) {
        match self.core.handle(now(), event) {
            Ok(actions) => self.carry_out(actions, ctx),
            Err(e) => tracing::warn!(error = %e, "checkpoint coordinator rejected a message"),
        }
        self.trigger_final(ctx);
        self.rearm(ctx);
    }

    /// Starts the checkpoint that ends the input, once the core allows it
    /// and an attempt is running to take it.
    fn trigger_final(&mut self, ctx: &mut Context<Self>) {
        if !self.sources.is_empty()
            && !self.core.stopping()
            && self.input_end.trigger_final(self.core.pending())
        {
            let request = self.next_request;
            self.next_request += 1;
            self.feed(
                Event::Trigger {
                    request,
                    kind: CheckpointKind::Checkpoint,
                },
                ctx,
            );
        }
    }

    /// Tells source `source` of the running attempt to end its output.
    fn end_input(&self, source: SubtaskId) {
        if let Some((_, handle)) = self.sources.iter().find(|(id, _)| *id == source) {
            handle.send(EndInput);
        }
    }

    /// Between attempts there is nobody to send a barrier to: the clock is
    /// not consulted, so no checkpoint starts that could never complete.
    fn rearm(&mut self, ctx: &mut Context<Self>) {
        if let Some(timer) = self.timer.take() {
            ctx.cancel_future(timer);
        }
        if self.input_end.ended() || self.sources.is_empty() {
            return;
        }
        if let Some(at) = self.core.poll_timeout() {
            let wait = at.saturating_duration_since(Instant::now());
            self.timer = Some(ctx.run_later(wait, |act, ctx| {
                act.timer = None;
                act.feed(Event::Tick, ctx);
            }));
        }
    }

    /// Deletes subsumed checkpoints (metadata first), then state objects,
    /// off the mailbox, so that no metadata outlives the objects it names;
    /// a shutdown waits for every deletion in flight.
    fn spawn_delete(
        &mut self,
        paths: Vec<String>,
        checkpoints: Vec<CheckpointId>,
        ctx: &mut Context<Self>,
    ) {
        let storage = self.storage.clone();
        self.deleting += 1;
        ctx.spawn(
            async move {
                let mut deleted = std::collections::HashSet::new();
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
            .map(|(), act, _ctx| {
                act.deleting -= 1;
                act.answer_shutdown();
            }),
        );
    }

    /// Objects nothing can reference any more.
    fn delete_released(&mut self, ctx: &mut Context<Self>) {
        let paths = self.registry.take_deletable();
        if !paths.is_empty() {
            self.spawn_delete(paths, Vec::new(), ctx);
        }
    }

    /// Every pending checkpoint ends with the attempt, except those whose
    /// metadata is being written: they may still complete, and the registry
    /// counted them already.
    fn abort_all(&mut self, reason: String, ctx: &mut Context<Self>) {
        self.registry.abort_all();
        self.feed(Event::AbortAll { reason }, ctx);
        // Abandoned without NotifyAbort: only those being finalized may
        // still complete. Else a job whose checkpoints never complete again
        // would keep an entry per attempt.
        self.triggered.retain(|id, _| self.finalizing.contains(id));
        self.switched.retain(|id| self.finalizing.contains(id));
        self.delete_released(ctx);
    }

    fn answer_shutdown(&mut self) {
        if self.deleting == 0 && self.finalizing.is_empty() {
            for reply in self.shutdown_replies.drain(..) {
                let _ = reply.send(());
            }
        }
    }

    /// Carries out what the core's machines decided, in their order.
    fn carry_out(&mut self, actions: Vec<Action>, ctx: &mut Context<Self>) {
        for action in actions {
            match action {
                Action::Trigger {
                    barrier,
                    next_id,
                    suspend,
                } => self.trigger(barrier, next_id, suspend, ctx),
                Action::Finalize(checkpoint) => self.finalize(checkpoint, ctx),
                Action::NotifyComplete(id) => self.notify_complete(id),
                Action::NotifyAbort { checkpoint, reason } => {
                    self.notify_abort(checkpoint, reason, ctx)
                }
                Action::Discard { checkpoint, states } => {
                    let paths = self.registry.discardable(checkpoint, &states);
                    self.spawn_delete(paths, Vec::new(), ctx);
                }
                Action::FailJob(reason) => self.supervisor.do_send(CheckpointingFailed(reason)),
                Action::Resolve { request, result } => self.resolve(request, result),
            }
        }
    }

    /// Persists the id counter past `barrier`'s checkpoint, then sends the
    /// barrier to the sources; a counter that was not persisted declines
    /// the checkpoint (in the first source's name; a job without sources
    /// only logs it).
    fn trigger(
        &mut self,
        barrier: Barrier,
        next_id: CheckpointId,
        suspend: bool,
        ctx: &mut Context<Self>,
    ) {
        let span = tracing::info_span!(
            "checkpoint",
            id = barrier.id.0,
            kind = ?barrier.options.kind,
            alignment = ?barrier.options.alignment,
        );
        self.triggered.insert(
            barrier.id,
            Triggered {
                at: Instant::now(),
                span,
            },
        );
        self.registry.triggered(barrier.id);
        let storage = self.storage.clone();
        let sources: Vec<_> = self.sources.iter().map(|(_, a)| a.clone()).collect();
        let first = self.sources.first().map(|(id, _)| *id);
        // `wait`: counter writes and barriers go out in id order.
        ctx.wait(
            async move { storage.store_next_checkpoint_id(next_id).await }
                .into_actor(self)
                .map(move |result, act, ctx| match (result, first) {
                    (Ok(()), _) => {
                        for source in &sources {
                            source.send(TriggerCheckpoint { barrier, suspend });
                        }
                    }
                    (Err(e), Some(subtask)) => act.feed(
                        Event::Decline {
                            checkpoint: barrier.id,
                            subtask,
                            reason: format!("the checkpoint id counter was not persisted: {e}"),
                        },
                        ctx,
                    ),
                    (Err(e), None) => {
                        tracing::warn!(error = %e, "checkpoint id counter not persisted")
                    }
                }),
        );
    }

    /// Registers a completed checkpoint's shared files, then writes its
    /// `_metadata`; a savepoint goes to its own directory instead.
    fn finalize(&mut self, mut checkpoint: CompletedCheckpoint, ctx: &mut Context<Self>) {
        if checkpoint.kind == CheckpointKind::Savepoint {
            return self.write_savepoint(checkpoint, ctx);
        }
        // Registered before the metadata is written: the
        // registry may replace duplicate shared files, and the
        // metadata must hold what it counts.
        self.registry.completed(&mut checkpoint);
        self.delete_released(ctx);
        let storage = self.storage.clone();
        let id = checkpoint.id;
        self.finalizing.insert(id);
        ctx.spawn(
            async move {
                let written = storage.write_metadata(&checkpoint).await;
                (checkpoint, written)
            }
            .into_actor(self)
            .map(move |(checkpoint, written), act, ctx| {
                act.finalizing.remove(&id);
                match written {
                    Ok(()) => act.persisted(checkpoint, ctx),
                    Err(e) => {
                        let unknown = matches!(e, StorageError::UnknownOutcome { .. });
                        act.feed(
                            Event::PersistFailed {
                                checkpoint: id,
                                reason: e.to_string(),
                            },
                            ctx,
                        );
                        // The acks' own objects are left to the
                        // registry: another checkpoint may have
                        // been given them since. A checkpoint
                        // that may exist keeps its references,
                        // and with them all its state.
                        if !unknown {
                            act.registry.removed(&checkpoint);
                            act.delete_released(ctx);
                        }
                    }
                }
                act.answer_restore();
                act.answer_shutdown();
            }),
        );
    }

    /// Tells every subtask that `id` completed (with the files a
    /// compaction wants uploaded again); when `id` is the newest retained
    /// checkpoint and the job's input has ended by it (the end-of-input
    /// rule), tells the sources to end their input.
    fn notify_complete(&mut self, id: CheckpointId) {
        let mut compactions = self.registry.compactions();
        for (subtask_id, subtask) in &self.subtasks {
            let rewrite = compactions
                .remove(subtask_id)
                .into_iter()
                .flatten()
                .map(|key| key.name)
                .collect();
            subtask.send(NotifyCheckpointComplete {
                checkpoint: id,
                rewrite,
            });
        }
        let ends = match self.store.latest() {
            Some(latest) if latest.id == id => self.input_end.completed(latest),
            _ => false,
        };
        if ends {
            for (_, source) in &self.sources {
                source.send(EndInput);
            }
        }
    }

    /// Forgets an aborted checkpoint, releases what only it referenced and
    /// tells every subtask.
    fn notify_abort(
        &mut self,
        checkpoint: CheckpointId,
        reason: CheckpointFailure,
        ctx: &mut Context<Self>,
    ) {
        self.triggered.remove(&checkpoint);
        self.switched.remove(&checkpoint);
        self.registry.aborted(checkpoint);
        self.delete_released(ctx);
        if !matches!(reason, CheckpointFailure::Aborted { .. }) {
            self.metrics
                .checkpoints
                .failed
                .fetch_add(1, Ordering::Relaxed);
        }
        tracing::info!(%reason, "checkpoint aborted");
        for (_, subtask) in &self.subtasks {
            subtask.send(NotifyCheckpointAborted(checkpoint));
        }
    }

    /// Answers a manual trigger or a savepoint request.
    fn resolve(&mut self, request: RequestId, result: Result<CheckpointId, CheckpointFailure>) {
        self.targets.remove(&request);
        let result = result.map(|id| Completed {
            id,
            location: self.locations.remove(&id).unwrap_or_else(|| {
                self.storage
                    .location(&CheckpointStorage::checkpoint_dir(id))
            }),
        });
        if let Some(reply) = self.requests.remove(&request) {
            let _ = reply.send(result);
        }
    }

    fn answer_restore(&mut self) {
        if !self.finalizing.is_empty() {
            return;
        }
        for reply in std::mem::take(&mut self.restore_replies) {
            let latest = match self.store.latest() {
                Some(checkpoint) => Some(RestoreFrom {
                    checkpoint: checkpoint.clone(),
                    owned: true,
                    dir: None,
                }),
                None => self.savepoints.started_from.clone(),
            };
            let restored = match &latest {
                Some(from) => self.core.restore(&from.checkpoint),
                None => Ok(()),
            };
            let _ = reply.send(restored.map(|()| latest));
        }
    }

    /// Copies a savepoint out of the checkpoint directory into its own
    /// directory, then deletes what its snapshots wrote to the checkpoint
    /// directory: it never joins the retained checkpoints.
    fn write_savepoint(&mut self, checkpoint: CompletedCheckpoint, ctx: &mut Context<Self>) {
        let id = checkpoint.id;
        self.finalizing.insert(id);
        let source = self.storage.clone();
        let target = self
            .core
            .request_of(id)
            .and_then(|request| self.targets.get(&request))
            .or(self.savepoints.dir.as_ref())
            .cloned();
        let job = self.savepoints.job;
        ctx.spawn(
            async move {
                let written = match &target {
                    Some(target) => savepoint::write(&source, target, job, &checkpoint)
                        .await
                        .map_err(|e| e.to_string()),
                    None => Err("no savepoint directory is configured".to_owned()),
                };
                (checkpoint, written)
            }
            .into_actor(self)
            .map(move |(checkpoint, written), act, ctx| {
                act.finalizing.remove(&id);
                match written {
                    Ok((location, _)) => {
                        tracing::info!(%location, "savepoint written");
                        stats::lock(act.core.stats()).located(id, location.clone());
                        // Answered with the request, unless abandoned.
                        if act.core.request_of(id).is_some() {
                            act.locations.insert(id, location);
                        }
                        let states: Vec<_> = checkpoint.subtasks.into_values().collect();
                        let copied = act.registry.discardable(id, &states);
                        // Never retained: for the registry it ended like
                        // an aborted checkpoint.
                        act.registry.aborted(id);
                        act.spawn_delete(copied, Vec::new(), ctx);
                        let stats = &act.metrics.checkpoints;
                        stats.savepoints.fetch_add(1, Ordering::Relaxed);
                        if let Some(triggered) = act.triggered.remove(&id) {
                            stats.savepoint_us_last.store(
                                triggered.at.elapsed().as_micros() as u64,
                                Ordering::Relaxed,
                            );
                        }
                        act.feed(Event::Persisted(id), ctx);
                    }
                    Err(reason) => act.feed(
                        Event::PersistFailed {
                            checkpoint: id,
                            reason,
                        },
                        ctx,
                    ),
                }
                act.answer_restore();
                act.answer_shutdown();
            }),
        );
    }

    /// `_metadata` is written: the checkpoint joins the store, which may
    /// subsume older ones, whose directories go.
    fn persisted(&mut self, checkpoint: CompletedCheckpoint, ctx: &mut Context<Self>) {
        let id = checkpoint.id;
        let location = self
            .storage
            .location(&CheckpointStorage::checkpoint_dir(id));
        stats::lock(self.core.stats()).located(id, location);
        let stats = &self.metrics.checkpoints;
        stats.completed.fetch_add(1, Ordering::Relaxed);
        stats.bytes_full.store(
            checkpoint.subtasks.values().map(|s| s.size()).sum(),
            Ordering::Relaxed,
        );
        stats.record_inflight(&checkpoint);
        stats.record_uploads(&checkpoint);
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
        let subsumed = self.store.add(checkpoint);
        for old in &subsumed {
            self.registry.removed(old);
        }
        let released = self.registry.take_deletable();
        stats.record_space(self.registry.physical_files_live(), self.registry.space());
        self.spawn_delete(released, subsumed.iter().map(|c| c.id).collect(), ctx);
        self.feed(Event::Persisted(id), ctx);
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
        self.sources = msg.sources;
        self.subtasks = msg.subtasks;
        let sources = self.sources.iter().map(|(id, _)| *id).collect();
        for source in self
            .input_end
            .deployed(self.attempt, sources, msg.input_ended)
        {
            self.end_input(source);
        }
        for (request, kind) in std::mem::take(&mut self.waiting) {
            self.feed(Event::Trigger { request, kind }, ctx);
        }
        self.trigger_final(ctx);
        self.rearm(ctx);
    }
}

impl Handler<AbortPending> for CoordinatorActor {
    type Result = ();

    fn handle(&mut self, msg: AbortPending, ctx: &mut Context<Self>) {
        self.sources.clear();
        self.subtasks.clear();
        self.abort_all(msg.reason, ctx);
    }
}

impl Handler<Shutdown> for CoordinatorActor {
    type Result = ();

    fn handle(&mut self, Shutdown(reply): Shutdown, ctx: &mut Context<Self>) {
        self.input_end.stop();
        self.sources.clear();
        self.subtasks.clear();
        self.shutdown_replies.push(reply);
        self.abort_all("the job ended".into(), ctx);
        self.answer_shutdown();
    }
}

impl Handler<LatestCheckpoint> for CoordinatorActor {
    type Result = ();

    fn handle(&mut self, LatestCheckpoint(reply): LatestCheckpoint, _ctx: &mut Context<Self>) {
        self.restore_replies.push(reply);
        self.answer_restore();
    }
}

impl Handler<TriggerManual> for CoordinatorActor {
    type Result = ();

    fn handle(&mut self, msg: TriggerManual, ctx: &mut Context<Self>) {
        let refusal = if self.input_end.ended() {
            Some("the input has ended")
        } else if msg.kind == CheckpointKind::Savepoint
            && self.savepoints.dir.is_none()
            && msg.target.is_none()
        {
            Some("no savepoint directory is configured")
        } else {
            None
        };
        let request = self.next_request;
        let admitted = match refusal {
            Some(refusal) => Err(CheckpointFailure::NotTriggered(refusal.into())),
            None => self.core.admit_manual(request, msg.stop),
        };
        if let Err(refusal) = admitted {
            let _ = msg.reply.send(Err(refusal));
            return;
        }
        self.next_request += 1;
        self.requests.insert(request, msg.reply);
        if let Some(target) = msg.target {
            self.targets.insert(request, target);
        }
        if self.sources.is_empty() {
            self.waiting.push((request, msg.kind));
        } else {
            self.feed(
                Event::Trigger {
                    request,
                    kind: msg.kind,
                },
                ctx,
            );
        }
    }
}

impl Handler<AcknowledgeCheckpoint> for CoordinatorActor {
    type Result = ();

    fn handle(&mut self, msg: AcknowledgeCheckpoint, ctx: &mut Context<Self>) {
        if msg.attempt != self.attempt {
            // A snapshot of an abandoned attempt: its checkpoint was aborted.
            let paths = self
                .registry
                .discardable(msg.ack.checkpoint, &[msg.ack.state]);
            return self.spawn_delete(paths, Vec::new(), ctx);
        }
        let (checkpoint, subtask, m) = (msg.ack.checkpoint, msg.ack.subtask, &msg.ack.metrics);
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
        self.feed(Event::Ack(Box::new(msg.ack)), ctx);
    }
}

impl Handler<DeclineCheckpoint> for CoordinatorActor {
    type Result = ();

    fn handle(&mut self, msg: DeclineCheckpoint, ctx: &mut Context<Self>) {
        if msg.attempt == self.attempt {
            self.feed(
                Event::Decline {
                    checkpoint: msg.checkpoint,
                    subtask: msg.subtask,
                    reason: msg.reason,
                },
                ctx,
            );
        }
    }
}

impl Handler<SourceExhausted> for CoordinatorActor {
    type Result = ();

    fn handle(&mut self, msg: SourceExhausted, ctx: &mut Context<Self>) {
        if self.input_end.source_exhausted(msg.attempt, msg.subtask) {
            self.end_input(msg.subtask);
        }
        self.trigger_final(ctx);
    }
}
