//! The job supervisor: deploys the subtask and endpoint actors of a job over
//! the arbiter pool, watches them, and ends the job when every subtask has
//! finished, when it is cancelled, or when a failure cannot be recovered.
//! With checkpointing, a failure stops the attempt, aborts pending
//! checkpoints and, after the restart strategy's delay, deploys a new attempt
//! restored from the latest completed checkpoint. Messages of an older
//! attempt are recognised by their attempt number and dropped.

use crate::checkpoint::coordinator::{
    AbortPending, Completed, CoordinatorActor, Deployed, LatestCheckpoint, Rescaled, RestoreFrom,
    Savepoints, Shutdown, TriggerManual, TriggerReply,
};
use crate::checkpoint::hooks::MasterHooks;
use crate::checkpoint::restore::{load, restore_failure, transient, Loaded, LoadedFrom, Restored};
use crate::cluster::deploy::{stop_all, Hosted, Hosting};
use crate::cluster::remote::{Pool, Reporting};
use crate::control::{Deploy, RestoreSpec};
use crate::dataflow::net::{self, LinkActor, WorkerAssignment, Workers};
use crate::dataflow::sources::{HostsSources, SourceHost};
use crate::dataflow::subtask::SubtaskHandle;
use crate::job::{job_id, JobError, JobReport};
use crate::messages::{
    Cancel, CheckpointReports, CheckpointingFailed, Kill, LeaseTakenOver, Reports, SplitRequest,
    Stop, SubtaskFailed, SubtaskFinished, WorkerDeployed,
};
use crate::metrics::{CheckpointCounters, JobMetrics};
use actix::{
    Actor, ActorFutureExt, Addr, AsyncContext, Context, Handler, Message, Recipient, System,
    WrapFuture,
};
use actix_rt::ArbiterHandle;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidemark_core::checkpoint::coordinator::CheckpointCoordinator;
use tidemark_core::checkpoint::restore::RestoreCandidates;
use tidemark_core::checkpoint::savepoint::check_references;
use tidemark_core::checkpoint::start::{self, Start, StartFrom, StartPoint};
use tidemark_core::checkpoint::stats::{self, RestoredStats};
use tidemark_core::checkpoint::store::CompletedCheckpointStore;
use tidemark_core::checkpoint::{CheckpointConfig, CheckpointFailure, RestoreMode};
use tidemark_core::cluster::attempts::RunAttempt;
use tidemark_core::cluster::fault::KillSchedule;
use tidemark_core::cluster::lifecycle::{JobLifecycle, LifeAction, LifeEvent, Outcome, Phase};
use tidemark_core::cluster::rescale::{Requirements, RescaleAction, RescaleError, Rescales};
use tidemark_core::job::Job;
use tidemark_core::model::event::{Alignment, CheckpointKind};
use tidemark_core::model::graph::{JobGraph, Partitioner};
use tidemark_core::model::ids::{Attempt, CheckpointId, JobId, SubtaskId};
use tidemark_core::MasterHook;
use tidemark_storage::savepoint::{self, SavepointError};
use tidemark_storage::CheckpointStorage;
use tokio::sync::oneshot;

/// Job handle → supervisor → coordinator.
#[derive(Message)]
#[rtype(result = "()")]
pub struct TriggerCheckpointRequest(pub TriggerManual);

/// Job handle → supervisor: take a savepoint, commit the sinks and end the
/// job; answered once the savepoint completed (or failed, and the job goes
/// on).
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopWithSavepoint {
    /// Where the savepoint goes instead of the job's savepoint directory.
    pub target: Option<CheckpointStorage>,
    pub reply: TriggerReply,
}

/// Job handle or REST API → supervisor: run at the parallelism asked for
/// (Flink's resource requirements); answered once taken or refused,
/// before it is carried out.
#[derive(Message)]
#[rtype(result = "()")]
pub struct RescaleRequest {
    pub requirements: Requirements,
    pub reply: oneshot::Sender<Result<(), RescaleError>>,
}

/// A completed savepoint (or checkpoint, triggered by hand).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Savepoint {
    /// Its checkpoint id, from the same counter as the job's checkpoints.
    pub id: CheckpointId,
    /// Its directory, a path or URL: what `--restore` takes.
    pub location: String,
}

/// Triggers checkpoints and savepoints of a running job, from any thread
/// that is not driving an async runtime; each call blocks until the
/// checkpoint completed or failed.
#[derive(Clone)]
pub struct JobControl {
    pub(crate) supervisor: Addr<JobSupervisor>,
}

impl JobControl {
    /// Triggers a checkpoint or savepoint now and blocks until it completed
    /// (for a savepoint: was copied into its directory) or failed. Fails
    /// with [`CheckpointFailure::NotTriggered`] when the job runs without
    /// checkpointing or has ended.
    pub fn trigger_checkpoint(
        &self,
        kind: CheckpointKind,
    ) -> Result<CheckpointId, CheckpointFailure> {
        Ok(Self::answer(self.request(kind, false, None))?.id)
    }

    /// A savepoint into the job's savepoint directory; the job goes on.
    pub fn trigger_savepoint(&self) -> Result<Savepoint, CheckpointFailure> {
        Self::answer(self.request(CheckpointKind::Savepoint, false, None))
    }

    /// A savepoint, then the sinks commit it and the job ends: `wait`
    /// returns once it has. If the savepoint fails, the job goes on.
    pub fn stop_with_savepoint(&self) -> Result<Savepoint, CheckpointFailure> {
        Self::answer(self.request(CheckpointKind::Savepoint, true, None))
    }

    /// Asks for a checkpoint or savepoint (`stop`: one that ends the job,
    /// into `target` if given) without waiting: the answer comes on the
    /// receiver.
    pub(crate) fn request(
        &self,
        kind: CheckpointKind,
        stop: bool,
        target: Option<CheckpointStorage>,
    ) -> Answer {
        let (reply, answer) = tokio::sync::oneshot::channel();
        if stop {
            self.supervisor.do_send(StopWithSavepoint { target, reply });
        } else {
            self.supervisor
                .do_send(TriggerCheckpointRequest(TriggerManual {
                    kind,
                    stop,
                    target,
                    reply,
                }));
        }
        answer
    }

    /// Asks the job to run at the parallelism `requirements` give its
    /// operators (the others keep theirs), and returns once taken: the
    /// running attempt gives way, after a checkpoint, to one at the new
    /// parallelism restored from it. Its progress is in
    /// [`JobMetrics::rescales`](crate::metrics::JobMetrics::rescales).
    pub fn rescale(&self, requirements: Requirements) -> Result<(), RescaleError> {
        self.request_rescale(requirements)
            .blocking_recv()
            .unwrap_or(Err(RescaleError::Ended))
    }

    /// [`JobControl::rescale`] without waiting: the answer comes on the
    /// receiver.
    pub(crate) fn request_rescale(
        &self,
        requirements: Requirements,
    ) -> oneshot::Receiver<Result<(), RescaleError>> {
        let (reply, answer) = oneshot::channel();
        self.supervisor.do_send(RescaleRequest {
            requirements,
            reply,
        });
        answer
    }

    /// Ends the job, as [`JobHandle::cancel`](crate::runtime::JobHandle::cancel).
    pub fn cancel(&self) {
        self.supervisor.do_send(Cancel);
    }

    fn answer(answer: Answer) -> Result<Savepoint, CheckpointFailure> {
        finished(answer.blocking_recv())
    }
}

/// The answer to a manual trigger, on its way.
pub(crate) type Answer = tokio::sync::oneshot::Receiver<Result<Completed, CheckpointFailure>>;

/// What an [`Answer`] that arrived means: a reply dropped unanswered is a
/// job that ended.
pub(crate) fn finished(
    answer: Result<Result<Completed, CheckpointFailure>, tokio::sync::oneshot::error::RecvError>,
) -> Result<Savepoint, CheckpointFailure> {
    let completed = answer
        .unwrap_or_else(|_| Err(CheckpointFailure::NotTriggered("the job has ended".into())))?;
    Ok(Savepoint {
        id: completed.id,
        location: completed.location,
    })
}

pub struct JobSupervisor {
    job: Job,
    arbiters: Vec<ArbiterHandle>,
    /// Which worker hosts each subtask, and where their links run.
    workers: Workers,
    /// The worker processes hosting the subtasks, if not this one; taken
    /// while they are made ready for an attempt.
    pool: Option<Pool>,
    /// Whether worker processes host the subtasks (and read their state).
    distributed: bool,
    /// What orders this run's attempts after other runs': see `run`.
    epoch: u64,
    /// The run's phase and restarts: every decision of its lifecycle.
    life: JobLifecycle,
    /// The state loaded for the attempt to deploy next.
    loaded: Option<Loaded>,
    /// What the deployed attempt restores from, recorded once it runs.
    restoring: Option<LoadedFrom>,
    metrics: Arc<JobMetrics>,
    started: Instant,
    outcome: Option<mpsc::Sender<Result<JobReport, JobError>>>,
    storage: Option<CheckpointStorage>,
    coordinator: Option<Addr<CoordinatorActor>>,
    /// The job's source coordinators, unless the checkpoint coordinator
    /// hosts them.
    sources: SourceHost,
    subtasks: Vec<(SubtaskId, SubtaskHandle)>,
    /// Every actor of the current attempt.
    actors: Vec<Recipient<Stop>>,
    /// The current attempt's link ends, by the worker they belong to.
    links: Vec<(u32, Addr<LinkActor>)>,
    /// When the current attempt's predecessor failed.
    failed_at: Option<Instant>,
    /// Manual triggers that arrived before the coordinator was up.
    early_triggers: Vec<TriggerManual>,
    /// Where savepoints go.
    savepoint_dir: Option<CheckpointStorage>,
}

/// Where a job's subtasks run: on this process's arbiters, spread over
/// its virtual workers, or in worker processes.
pub struct Hosts {
    pub arbiters: Vec<ArbiterHandle>,
    pub workers: Workers,
    pub pool: Option<Pool>,
}

impl JobSupervisor {
    pub fn new(
        job: Job,
        Hosts {
            arbiters,
            workers,
            pool,
        }: Hosts,
        metrics: Arc<JobMetrics>,
        outcome: mpsc::Sender<Result<JobReport, JobError>>,
        storage: Option<CheckpointStorage>,
        savepoint_dir: Option<CheckpointStorage>,
    ) -> Self {
        *metrics.rescales() = Rescales::new(&job.graph);
        JobSupervisor {
            epoch: storage
                .as_ref()
                .map_or_else(|| crate::clock::now().unix_ms, CheckpointStorage::epoch),
            distributed: pool.is_some(),
            life: JobLifecycle::new(
                job.config.restart,
                storage.is_some() && job.config.checkpointing.is_some(),
            ),
            loaded: None,
            restoring: None,
            pool,
            savepoint_dir,
            sources: SourceHost::new(&job),
            job,
            arbiters,
            workers,
            metrics,
            started: Instant::now(),
            outcome: Some(outcome),
            storage,
            coordinator: None,
            subtasks: Vec::new(),
            actors: Vec::new(),
            links: Vec::new(),
            failed_at: None,
            early_triggers: Vec::new(),
        }
    }

    /// Opens the coordinator (recovering the completed checkpoints and the id
    /// counter from storage) and loads the state to start from.
    fn boot(&mut self, ctx: &mut Context<Self>) {
        let (Some(storage), Some(settings)) =
            (self.storage.clone(), self.job.config.checkpointing.clone())
        else {
            self.loaded = Some(Loaded::default());
            return self.feed(LifeEvent::Booted, ctx);
        };
        let boot = Boot {
            storage,
            settings,
            graph: self.job.graph.clone(),
            local_dir: self.job.config.local_dir().map(Path::to_path_buf),
            hooks: self.job.take_master_hooks(),
            sources: std::mem::take(&mut self.sources),
            supervisor: ctx.address(),
            metrics: self.metrics.clone(),
            savepoint_dir: self.savepoint_dir.clone(),
            job: crate::job::job_id(&self.job.name),
            local: !self.distributed,
        };
        ctx.spawn(
            boot.open()
                .into_actor(self)
                .map(|result, act, ctx| match result {
                    Ok((coordinator, restore)) => {
                        for request in act.early_triggers.drain(..) {
                            coordinator.do_send(request);
                        }
                        act.coordinator = Some(coordinator);
                        act.loaded = Some(restore);
                        act.feed(LifeEvent::Booted, ctx);
                    }
                    Err(e) => act.feed(LifeEvent::Ended(Err(e)), ctx),
                }),
        );
    }

    /// Carries out what the lifecycle decided.
    fn feed(&mut self, event: LifeEvent<JobError>, ctx: &mut Context<Self>) {
        for action in self.life.handle(event) {
            match action {
                LifeAction::Deploy(attempt) => {
                    let loaded = self.loaded.take().expect("loaded before it deploys");
                    self.start(attempt, loaded, ctx);
                }
                LifeAction::Announce(attempt) => {
                    let restore = self.restoring.take();
                    self.running(attempt, restore);
                    SourceHost::start(self, attempt, &self.subtasks.clone(), ctx);
                    let rescale = self.metrics.rescales().running(attempt, now_ms());
                    if let Some(rescale) = rescale {
                        self.rescale(rescale, ctx);
                    }
                }
                LifeAction::Restart {
                    attempt,
                    delay,
                    reason,
                } => self.restart_after(attempt, delay, reason, ctx),
                LifeAction::Rescale(attempt) => {
                    tracing::info!(%attempt, "rescaling the job");
                    self.replace_attempt(attempt, Duration::ZERO, "the job rescales".into(), ctx);
                }
                LifeAction::Finish(outcome) => {
                    let outcome = match outcome {
                        Outcome::Succeeded => Ok(JobReport {
                            records_in: self.metrics.records_in(),
                            elapsed: self.started.elapsed(),
                        }),
                        Outcome::Failed(e) => Err(e),
                        Outcome::RestartsExhausted { restarts, last } => {
                            // No checkpoint of the failed attempt may
                            // complete while its actors stop.
                            if let Some(coordinator) = &self.coordinator {
                                let reason = last.to_string();
                                coordinator.do_send(AbortPending { reason });
                            }
                            Err(JobError::RestartsExhausted {
                                restarts,
                                last: Box::new(last),
                            })
                        }
                    };
                    self.complete(outcome, ctx);
                }
            }
        }
    }

    /// A failure of `attempt` (`None`: of the run).
    fn fail(&mut self, attempt: Option<Attempt>, error: JobError, ctx: &mut Context<Self>) {
        self.feed(LifeEvent::Failed { attempt, error }, ctx);
    }

    fn start(&mut self, attempt: Attempt, loaded: Loaded, ctx: &mut Context<Self>) {
        let Some(mut pool) = self.pool.take() else {
            if let Err(e) = self.deploy(ctx.address(), loaded.subtasks) {
                return self.fail(Some(attempt), e, ctx);
            }
            self.restoring = loaded.restore;
            let subtasks = self.subtasks.len();
            let deployed = LifeEvent::Deployed {
                attempt,
                subtasks,
                workers: 0,
            };
            return self.feed(deployed, ctx);
        };
        ctx.spawn(
            async move {
                let ready = pool.ready().await;
                (pool, ready)
            }
            .into_actor(self)
            .map(move |(pool, ready), act, ctx| {
                act.pool = Some(pool);
                if !act.life.is_current(attempt) {
                    return;
                }
                match ready {
                    // Running once every worker started its share.
                    Ok(()) => {
                        let workers = act.deploy_remote(ctx.address(), loaded.from);
                        act.restoring = loaded.restore;
                        let subtasks = act.subtasks.len();
                        let deployed = LifeEvent::Deployed {
                            attempt,
                            subtasks,
                            workers,
                        };
                        act.feed(deployed, ctx);
                    }
                    Err(e) => act.fail(Some(attempt), e, ctx),
                }
            }),
        );
    }

    /// Bookkeeping once `attempt` is deployed, restored from `restore`.
    fn running(&mut self, attempt: Attempt, restore: Option<LoadedFrom>) {
        let input_ended = restore.as_ref().is_some_and(|from| from.input_ended);
        if let Some(from) = restore {
            self.metrics.checkpoints.record_restore(
                from.checkpoint,
                from.bytes,
                from.started.elapsed(),
            );
            stats::lock(&self.metrics.checkpoint_stats).restored(RestoredStats {
                id: from.checkpoint,
                timestamp: crate::clock::now().unix_ms,
                is_savepoint: from.is_savepoint,
                external_path: Some(from.location),
            });
        }
        self.recovered();
        if let Some(coordinator) = &self.coordinator {
            let graph = &self.job.graph;
            let sources = self
                .subtasks
                .iter()
                .filter(|(id, _)| graph.is_source(id.operator))
                .cloned()
                .collect();
            coordinator.do_send(Deployed {
                attempt,
                sources,
                subtasks: self.subtasks.clone(),
                input_ended,
            });
        }
    }

    /// The restored attempt runs: how long since its predecessor failed.
    fn recovered(&mut self) {
        if let Some(at) = self.failed_at.take() {
            CheckpointCounters::record(
                &self.metrics.checkpoints.recoveries_ms,
                at.elapsed().as_secs_f64() * 1e3,
            );
        }
    }

    /// The current attempt of this run: numbered within the run, the run by
    /// its lease epoch (without checkpointing, which takes no lease, by its
    /// start time), so that a worker tells a later attempt from a stale one.
    fn run(&self) -> RunAttempt {
        RunAttempt {
            job: job_id(&self.job.name),
            epoch: self.epoch,
            attempt: self.life.attempt(),
        }
    }

    /// Deploys the attempt on the worker processes: each rebuilds the job,
    /// reads its subtasks' state and opens its links. A worker that hosts
    /// no subtask (more workers than subtasks) is left out. Returns how
    /// many workers host a share.
    fn deploy_remote(
        &mut self,
        me: Addr<Self>,
        from: Option<crate::checkpoint::coordinator::RestoreFrom>,
    ) -> usize {
        let pool = self.pool.as_ref().expect("the pool is back");
        let placement = WorkerAssignment::new(pool.count());
        let run = self.run();
        let restore = from.map(|from| RestoreSpec {
            checkpoint: from.checkpoint,
            owned: from.owned,
            dir: from.dir.map(|dir| dir.directory()),
        });
        let peers = pool.data_addresses();
        let mut subtasks = Vec::new();
        let mut actors: Vec<Recipient<Stop>> = Vec::new();
        for worker in 0..pool.count() {
            let hosted: Vec<SubtaskId> = self
                .job
                .graph
                .subtasks()
                .filter(|id| placement.worker(*id) == worker)
                .collect();
            let Some(&blame) = hosted.first() else {
                continue;
            };
            let deploy = Deploy {
                recipe: pool.distributed.recipe.clone(),
                graph: self.job.graph.clone(),
                worker,
                workers: pool.count(),
                peers: peers.clone(),
                restore: restore.clone(),
            };
            let reporting = Reporting {
                reports: Reports::to(&me),
                deployed: me.clone().recipient(),
                checkpoints: self.coordinator.as_ref().map(CheckpointReports::to),
                metrics: self.metrics.clone(),
                blame,
            };
            let (commands, remote) = pool.attach(worker, deploy, run, reporting);
            subtasks.extend(hosted.into_iter().map(|subtask| {
                let commands = commands.clone();
                (subtask, SubtaskHandle::Remote { subtask, commands })
            }));
            actors.push(remote.recipient());
        }
        subtasks.sort_by_key(|(id, _)| *id);
        let workers = actors.len();
        self.subtasks = subtasks;
        self.actors = actors;
        workers
    }

    fn deploy(
        &mut self,
        me: Addr<Self>,
        restore: HashMap<SubtaskId, Restored>,
    ) -> Result<(), JobError> {
        let failures = me.clone().recipient();
        let run = self.run();
        let ends = net::loopback(&self.job.graph, self.workers.placement, run, &failures)
            .map_err(|e| JobError::Runtime(format!("cannot open a link between workers: {e}")))?;
        let hosting = Hosting {
            job: &self.job,
            metrics: &self.metrics,
            attempt: self.life.attempt(),
            reports: Reports::to(&me),
            checkpointing: self
                .coordinator
                .as_ref()
                .map(CheckpointReports::to)
                .zip(self.storage.clone()),
            arbiters: &self.arbiters,
            workers: &self.workers,
        };
        let hosted: Vec<SubtaskId> = self.job.graph.subtasks().collect();
        let Hosted {
            subtasks,
            actors,
            links,
        } = hosting.deploy(&hosted, restore, ends)?;
        self.subtasks = subtasks
            .into_iter()
            .map(|(id, addr)| (id, SubtaskHandle::Local(addr)))
            .collect();
        self.actors = actors;
        self.links = links;
        Ok(())
    }

    /// Stops every actor of the attempt: see `stop_all`.
    fn stop_attempt(&mut self) -> impl std::future::Future<Output = ()> + 'static {
        self.subtasks.clear();
        self.links.clear();
        stop_all(std::mem::take(&mut self.actors))
    }

    /// Stops the failed attempt and aborts its pending checkpoints; once
    /// its actors stopped and `delay` passed, loads the state of `attempt`.
    fn restart_after(
        &mut self,
        attempt: Attempt,
        delay: Duration,
        reason: String,
        ctx: &mut Context<Self>,
    ) {
        let restart = self.life.restarts();
        tracing::warn!(error = %reason, restart, ?delay, "restarting the job");
        let stats = &self.metrics.checkpoints;
        stats.restarts.fetch_add(1, Ordering::Relaxed);
        stats.restart_wait_us.fetch_add(
            u64::try_from(delay.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        self.failed_at.get_or_insert_with(Instant::now);
        self.replace_attempt(attempt, delay, reason, ctx);
    }

    /// Stops the running attempt and aborts its pending checkpoints; once
    /// its actors stopped and `delay` passed, loads the state of `attempt`
    /// at the parallelism asked for last.
    fn replace_attempt(
        &mut self,
        attempt: Attempt,
        delay: Duration,
        reason: String,
        ctx: &mut Context<Self>,
    ) {
        let stopped = self.stop_attempt();
        let coordinator = self
            .coordinator
            .clone()
            .expect("a job that restarts checkpoints");
        coordinator.do_send(AbortPending { reason });
        let (graph, rescaled) = {
            let mut rescales = self.metrics.rescales();
            let (graph, rescaled) = rescales.deploying(now_ms());
            (graph.clone(), rescaled)
        };
        if rescaled {
            self.job.graph = graph.clone();
            coordinator.do_send(Rescaled(graph));
        }
        // The new attempt starts once the old one's actors have stopped:
        // two attempts never run side by side.
        ctx.spawn(
            futures::future::join(stopped, actix_rt::time::sleep(delay))
                .into_actor(self)
                .map(move |_, act, ctx| act.restart(attempt, coordinator, ctx)),
        );
    }

    fn restart(
        &mut self,
        attempt: Attempt,
        coordinator: Addr<CoordinatorActor>,
        ctx: &mut Context<Self>,
    ) {
        let Some(storage) = self.storage.clone() else {
            return;
        };
        let allow_non_restored = self.job.config.allows_non_restored_state();
        let graph = self.job.graph.clone();
        let local_dir = self.job.config.local_dir().map(Path::to_path_buf);
        let local = !self.distributed;
        ctx.spawn(
            async move {
                let (reply, answer) = tokio::sync::oneshot::channel();
                coordinator.do_send(LatestCheckpoint(reply));
                let latest: Option<RestoreFrom> = answer
                    .await
                    .map_err(|e| JobError::Runtime(format!("the coordinator is gone: {e}")))?
                    .map_err(JobError::MasterHook)?;
                load(
                    &storage,
                    &graph,
                    latest.as_ref(),
                    allow_non_restored,
                    local_dir.as_deref(),
                    |_| local,
                )
                .await
            }
            .into_actor(self)
            .map(move |result, act, ctx| {
                let result = match result {
                    Ok(restore) => {
                        if act.life.is_current(attempt) {
                            act.loaded = Some(restore);
                        }
                        Ok(())
                    }
                    // Storage that failed a read may serve the next attempt.
                    Err(e) => {
                        let transient = transient(&e);
                        Err((e, transient))
                    }
                };
                act.feed(LifeEvent::Loaded { attempt, result }, ctx);
            }),
        );
    }

    /// Ends the job: stops the attempt, abandons pending checkpoints and
    /// waits for their state to be deleted, then reports and stops the
    /// runtime.
    fn complete(&mut self, outcome: Result<JobReport, JobError>, ctx: &mut Context<Self>) {
        let Some(tx) = self.outcome.take() else {
            return;
        };
        self.metrics.rescales().ended(now_ms());
        let stopped = self.stop_attempt();
        let coordinator = self.coordinator.clone();
        ctx.spawn(
            async move {
                stopped.await;
                if let Some(coordinator) = coordinator {
                    let (reply, done) = tokio::sync::oneshot::channel();
                    coordinator.do_send(Shutdown(reply));
                    let _ = done.await;
                }
            }
            .into_actor(self)
            .map(move |(), _, _| {
                let _ = tx.send(outcome);
                System::current().stop();
            }),
        );
    }

    /// Carries out what the rescales decided: a checkpoint to rescale
    /// from, whose outcome they are told, or the attempt's replacement.
    fn rescale(&mut self, action: RescaleAction, ctx: &mut Context<Self>) {
        let attempt = match action {
            RescaleAction::Replace(attempt) => return self.feed(LifeEvent::Rescale(attempt), ctx),
            RescaleAction::Checkpoint(attempt) => attempt,
        };
        let (reply, answer) = oneshot::channel();
        let trigger = TriggerManual {
            kind: CheckpointKind::Checkpoint,
            stop: false,
            target: None,
            reply,
        };
        <Self as Handler<TriggerCheckpointRequest>>::handle(
            self,
            TriggerCheckpointRequest(trigger),
            ctx,
        );
        ctx.spawn(answer.into_actor(self).map(move |answer, act, ctx| {
            let answer = answer.unwrap_or_else(|_| {
                Err(CheckpointFailure::NotTriggered("the job has ended".into()))
            });
            let mut rescales = act.metrics.rescales();
            let next = match answer {
                Ok(completed) if completed.ends_input => {
                    rescales.input_ended(attempt, now_ms());
                    None
                }
                result => rescales.checkpointed(
                    attempt,
                    result.map(drop).map_err(|e| e.to_string()),
                    now_ms(),
                ),
            };
            drop(rescales);
            if let Some(next) = next {
                act.rescale(next, ctx);
            }
        }));
    }

    /// Kills the worker hosting `victim`, as a crash would: every subtask
    /// on it dies and its ends of the links close, which the peers see.
    /// In one worker, that is the subtask alone.
    fn kill_worker_of(&mut self, victim: SubtaskId, kill: Kill) {
        let placement = match &self.pool {
            Some(pool) => WorkerAssignment::new(pool.count()),
            None => self.workers.placement,
        };
        let worker = placement.worker(victim);
        tracing::info!(subtask = %victim, worker, kill.failure, kill.of, "injecting a failure");
        if let Some(pool) = &mut self.pool {
            return pool.kill(worker);
        }
        for (id, subtask) in &self.subtasks {
            let dies = if placement.spreads() {
                placement.worker(*id) == worker
            } else {
                *id == victim
            };
            if let (true, SubtaskHandle::Local(subtask)) = (dies, subtask) {
                subtask.do_send(kill);
            }
        }
        for (_, link) in self.links.iter().filter(|(w, _)| *w == worker) {
            link.do_send(Stop);
        }
    }

    fn schedule_kills(&mut self, ctx: &mut Context<Self>) {
        let Some(of) = self.job.config.kills.as_ref().map(KillSchedule::remaining) else {
            return;
        };
        let mut failure = 0;
        let mut killed: Option<Attempt> = None;
        ctx.run_interval(Duration::from_millis(2), move |act, _ctx| {
            if act.subtasks.is_empty() || killed == Some(act.life.attempt()) {
                return;
            }
            let progress = act.metrics.records_in();
            let Some(victim) = act
                .job
                .config
                .kills
                .as_mut()
                .and_then(|s| s.pop_due(progress))
            else {
                return;
            };
            let (id, _) = act.subtasks[victim % act.subtasks.len()];
            failure += 1;
            act.kill_worker_of(id, Kill { failure, of });
            killed = Some(act.life.attempt());
        });
    }
}

/// A boot's completed-checkpoint store, its restore candidates (newest
/// first), and the start it was told, to record once restored.
type Candidates = (
    CompletedCheckpointStore,
    Vec<RestoreFrom>,
    Option<StartFrom>,
);

/// What a checkpointed job opens before its first attempt: the
/// coordinator, with the completed checkpoints and id counter recovered
/// from storage, and the state to start from.
struct Boot {
    storage: CheckpointStorage,
    settings: CheckpointConfig,
    graph: JobGraph,
    local_dir: Option<PathBuf>,
    hooks: Vec<Box<dyn MasterHook>>,
    sources: SourceHost,
    supervisor: Addr<JobSupervisor>,
    metrics: Arc<JobMetrics>,
    savepoint_dir: Option<CheckpointStorage>,
    job: JobId,
    /// Subtasks run in this process (which reads their state).
    local: bool,
}

impl Boot {
    async fn open(self) -> Result<(Addr<CoordinatorActor>, Loaded), JobError> {
        let next_id = self
            .storage
            .next_checkpoint_id()
            .await
            .map_err(JobError::Storage)?;
        let (mut store, candidates, told) = self.candidates().await?;
        let (from, restore) = self.load_newest(&mut store, candidates).await?;
        if let (Some(told), Some(restored)) = (told, &from) {
            let first = next_id.max(CheckpointId(restored.checkpoint.id.0 + 1));
            let start = StartPoint { from: told, first };
            self.storage
                .write_start(&start)
                .await
                .map_err(JobError::Storage)?;
        }
        let subtasks: Vec<SubtaskId> = self.graph.subtasks().collect();
        let mut core = CheckpointCoordinator::new(
            self.settings.policy.clone(),
            subtasks,
            self.settings.alignment,
            next_id,
            crate::clock::now(),
        );
        core.record_graph(&self.graph);
        let mut hooks = MasterHooks::new(self.hooks);
        if !hooks.is_empty() {
            core.await_master_hooks();
        }
        if let Some(from) = &from {
            core.restore(&from.checkpoint);
            hooks.restore(&from.checkpoint)?;
        }
        let coordinator = CoordinatorActor::new(
            core,
            self.storage,
            store,
            self.supervisor,
            self.metrics,
            self.settings.layout.max_space_amplification,
            Savepoints {
                job: self.job,
                dir: self.savepoint_dir,
                started_from: from.filter(|f| !f.owned),
            },
        )
        .hosting(self.sources)
        .with_master_hooks(hooks)
        .start();
        Ok((coordinator, restore))
    }

    /// The completed-checkpoint store to start with, the checkpoints the
    /// start may restore from, newest first, and the start to record if
    /// the run was told one. Failover restores only from checkpoints of
    /// this run or the one it was started from, never from other runs'
    /// leftovers, and `latest` never from before the directory's last
    /// start ([`start`]).
    async fn candidates(&self) -> Result<Candidates, JobError> {
        let (storage, settings) = (&self.storage, &self.settings);
        let retain = settings.policy.retain;
        let last = storage.read_start().await.map_err(JobError::Storage)?;
        match start::decide(&settings.restore, last.as_ref()) {
            Start::Fresh => Ok((CompletedCheckpointStore::new(retain), Vec::new(), None)),
            Start::Continue { since, or } => {
                let mut store = storage
                    .recover_store(retain)
                    .await
                    .map_err(JobError::Storage)?;
                if let Some(first) = since {
                    let keep = match &or {
                        Some(StartFrom::Checkpoint(id)) => Some(*id),
                        _ => None,
                    };
                    store.retire_before(first, keep);
                }
                let mut candidates: Vec<RestoreFrom> = store
                    .retained()
                    .rev()
                    .filter(|c| since.is_none_or(|first| c.id >= first))
                    .map(|checkpoint| RestoreFrom {
                        checkpoint: checkpoint.clone(),
                        owned: true,
                        dir: None,
                    })
                    .collect();
                if let (true, Some(from)) = (candidates.is_empty(), &or) {
                    candidates = self.told(from, &mut store).await?;
                }
                Ok((store, candidates, None))
            }
            Start::At(from) => {
                let mut store = CompletedCheckpointStore::new(retain);
                let candidates = self.told(&from, &mut store).await?;
                Ok((store, candidates, Some(from)))
            }
        }
    }

    /// The restore a run was told: a checkpoint of the job's directory,
    /// which the store takes in claim mode, or a savepoint.
    async fn told(
        &self,
        from: &StartFrom,
        store: &mut CompletedCheckpointStore,
    ) -> Result<Vec<RestoreFrom>, JobError> {
        let storage = &self.storage;
        Ok(match from {
            StartFrom::Checkpoint(id) => {
                let checkpoint = storage
                    .read_metadata(*id)
                    .await
                    .map_err(JobError::Storage)?;
                let location = storage.location(&CheckpointStorage::metadata_path(*id));
                check_references(&location, &checkpoint).map_err(SavepointError::from)?;
                let owned = self.settings.restore_mode == RestoreMode::Claim;
                if owned && store.retained().all(|c| c.id != *id) {
                    store.add(checkpoint.clone());
                }
                vec![RestoreFrom {
                    checkpoint,
                    owned,
                    dir: None,
                }]
            }
            StartFrom::Savepoint(url) => {
                let (dir, checkpoint) = savepoint::open(url).await?;
                vec![RestoreFrom {
                    checkpoint,
                    owned: false,
                    dir: Some(dir),
                }]
            }
        })
    }

    /// Loads the newest candidate whose state is whole: with `latest`, a
    /// checkpoint whose state is damaged gives way to the one before it
    /// (and leaves the store); any other failure fails the start.
    async fn load_newest(
        &self,
        store: &mut CompletedCheckpointStore,
        candidates: Vec<RestoreFrom>,
    ) -> Result<(Option<RestoreFrom>, Loaded), JobError> {
        let mut candidates = RestoreCandidates::new(candidates);
        loop {
            let Some(from) = candidates.next_to_try() else {
                return Ok((None, Loaded::default()));
            };
            let loaded = load(
                &self.storage,
                &self.graph,
                Some(&from),
                self.settings.allow_non_restored_state,
                self.local_dir.as_deref(),
                |_| self.local,
            )
            .await;
            let e = match loaded {
                Ok(loaded) => return Ok((Some(from), loaded)),
                Err(e) => e,
            };
            let Some(older) = candidates.fall_back(restore_failure(&e)) else {
                return Err(e);
            };
            let id = from.checkpoint.id;
            tracing::warn!(
                "checkpoint {id} cannot be restored ({e}); restoring the retained checkpoint {} before it instead: output a sink committed after that checkpoint will be written again",
                older.checkpoint.id.0
            );
            store.remove(id);
        }
    }
}

impl Actor for JobSupervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.started = Instant::now();
        self.schedule_kills(ctx);
        self.boot(ctx);
    }
}

impl Drop for JobSupervisor {
    /// A supervisor that dies without an outcome takes the runtime with it,
    /// so that `JobHandle::wait` returns instead of hanging.
    fn drop(&mut self) {
        if self.outcome.take().is_some() {
            System::current().stop();
        }
    }
}

impl Handler<SubtaskFinished> for JobSupervisor {
    type Result = ();

    fn handle(&mut self, msg: SubtaskFinished, ctx: &mut Context<Self>) {
        tracing::debug!(subtask = %msg.subtask, "finished");
        self.feed(LifeEvent::SubtaskFinished(msg.attempt), ctx);
    }
}

impl Handler<WorkerDeployed> for JobSupervisor {
    type Result = ();

    fn handle(&mut self, WorkerDeployed(attempt): WorkerDeployed, ctx: &mut Context<Self>) {
        self.feed(LifeEvent::WorkerDeployed(attempt), ctx);
    }
}

impl HostsSources for JobSupervisor {
    fn sources(&mut self) -> &mut SourceHost {
        &mut self.sources
    }

    fn source_failed(&mut self, failed: SubtaskFailed, ctx: &mut Context<Self>) {
        ctx.notify(failed);
    }
}

/// A split source subtask asks for a split: from the checkpoint
/// coordinator, which hosts the source coordinators, or from this
/// supervisor without one.
impl Handler<SplitRequest> for JobSupervisor {
    type Result = ();

    fn handle(&mut self, request: SplitRequest, ctx: &mut Context<Self>) {
        match &self.coordinator {
            Some(coordinator) => coordinator.do_send(request),
            None => SourceHost::request(self, request, ctx),
        }
    }
}

impl Handler<SubtaskFailed> for JobSupervisor {
    type Result = ();

    fn handle(&mut self, msg: SubtaskFailed, ctx: &mut Context<Self>) {
        // Logged once: as the restart's reason or in the outcome.
        let error = JobError::TaskFailed {
            subtask: msg.subtask,
            error: msg.error,
        };
        self.fail(Some(msg.attempt), error, ctx);
    }
}

impl Handler<CheckpointingFailed> for JobSupervisor {
    type Result = ();

    /// As in Flink, a job whose checkpoints fail beyond the tolerable number
    /// fails over: it restarts from its latest checkpoint if its restart
    /// strategy allows.
    fn handle(&mut self, msg: CheckpointingFailed, ctx: &mut Context<Self>) {
        self.fail(None, JobError::Checkpointing(msg.0), ctx);
    }
}

impl Handler<TriggerCheckpointRequest> for JobSupervisor {
    type Result = ();

    fn handle(
        &mut self,
        TriggerCheckpointRequest(request): TriggerCheckpointRequest,
        _ctx: &mut Context<Self>,
    ) {
        match &self.coordinator {
            Some(coordinator) => coordinator.do_send(request),
            None if self.storage.is_some() => self.early_triggers.push(request),
            None => {
                let _ = request.reply.send(Err(CheckpointFailure::NotTriggered(
                    "the job runs without checkpointing".into(),
                )));
            }
        }
    }
}

impl Handler<StopWithSavepoint> for JobSupervisor {
    type Result = ();

    fn handle(
        &mut self,
        StopWithSavepoint { target, reply }: StopWithSavepoint,
        ctx: &mut Context<Self>,
    ) {
        self.metrics.rescales().stop_began();
        let (savepoint, done) = oneshot::channel();
        let trigger = TriggerManual {
            kind: CheckpointKind::Savepoint,
            stop: true,
            target,
            reply: savepoint,
        };
        <Self as Handler<TriggerCheckpointRequest>>::handle(
            self,
            TriggerCheckpointRequest(trigger),
            ctx,
        );
        ctx.spawn(done.into_actor(self).map(move |outcome, act, ctx| {
            let outcome = outcome.unwrap_or_else(|_| {
                Err(CheckpointFailure::NotTriggered("the job has ended".into()))
            });
            if outcome.is_ok() {
                // The sinks were told to commit before this answer came:
                // the notification is ahead of the stop in their mailboxes.
                act.feed(LifeEvent::Ended(Ok(())), ctx);
            } else {
                let rescale = act.metrics.rescales().stop_failed();
                if let Some(rescale) = rescale {
                    act.rescale(rescale, ctx);
                }
            }
            let _ = reply.send(outcome);
        }));
    }
}

impl JobSupervisor {
    /// Why no rescale of this job can restore, whatever is asked.
    fn cannot_rescale(&self) -> Option<RescaleError> {
        let checkpointing = self.job.config.checkpointing.as_ref();
        let Some(settings) = checkpointing.filter(|_| self.storage.is_some()) else {
            return Some(RescaleError::NoCheckpointing);
        };
        let edges = &self.job.graph.edges;
        let broadcast = edges
            .iter()
            .any(|e| e.partitioner == Partitioner::Broadcast);
        (settings.alignment != Alignment::Aligned && broadcast)
            .then_some(RescaleError::UnalignedBroadcast)
    }
}

impl Handler<RescaleRequest> for JobSupervisor {
    type Result = ();

    fn handle(&mut self, request: RescaleRequest, ctx: &mut Context<Self>) {
        let taken = if self.life.phase() == Phase::Finished {
            Err(RescaleError::Ended)
        } else if let Some(e) = self.cannot_rescale() {
            Err(e)
        } else {
            let mut rescales = self.metrics.rescales();
            rescales.require(&request.requirements, now_ms())
        };
        let action = match taken {
            Ok(action) => action,
            Err(e) => {
                let _ = request.reply.send(Err(e));
                return;
            }
        };
        let _ = request.reply.send(Ok(()));
        if let Some(action) = action {
            self.rescale(action, ctx);
        }
    }
}

impl Handler<Cancel> for JobSupervisor {
    type Result = ();

    fn handle(&mut self, _: Cancel, ctx: &mut Context<Self>) {
        self.feed(LifeEvent::Ended(Err(JobError::Cancelled)), ctx);
    }
}

/// Fenced for good: the run ends at once with why, instead of restarting
/// into checkpoints that cannot complete.
impl Handler<LeaseTakenOver> for JobSupervisor {
    type Result = ();

    fn handle(&mut self, LeaseTakenOver(fenced): LeaseTakenOver, ctx: &mut Context<Self>) {
        self.feed(LifeEvent::Ended(Err(JobError::Storage(fenced))), ctx);
    }
}

/// Now, in ms since the epoch, as the rescale history records it.
fn now_ms() -> u64 {
    crate::clock::now().unix_ms
}
