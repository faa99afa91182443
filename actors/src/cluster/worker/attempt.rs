//! One `Attempt` call on a worker: the attempt's share of the job, from
//! its deployment to its stop.

use super::{AwaitLink, Claim, Rebuild, Release, WorkerHost};
use crate::checkpoint::coordinator::RestoreFrom;
use crate::checkpoint::restore::{load, Restored};
use crate::cluster::deploy::{stop_all, Hosted, Hosting};
use crate::control::{Command, Deploy, Event, FromWorker, Progress, ToWorker};
use crate::dataflow::net::{crossings, LinkEnd, LinkEnds, LinkStream, WorkerAssignment, Workers};
use crate::dataflow::subtask::SubtaskActor;
use crate::job::job_id;
use crate::messages::{
    AcknowledgeCheckpoint, AddSplits, CheckpointReports, DeclineCheckpoint, EndOfData,
    NoMoreSplits, NotifyCheckpointAborted, NotifyCheckpointComplete, Reports, SourceExhausted,
    SplitRequest, Stop, SubtaskFailed, SubtaskFinished, TriggerCheckpoint,
};
use crate::metrics::JobMetrics;
use crate::tls::MutualTls;
use actix::{
    Actor, ActorContext, ActorFutureExt, Addr, AsyncContext, Context, Handler, Recipient,
    ResponseActFuture, SpawnHandle, StreamHandler, WrapFuture,
};
use actix_rt::ArbiterHandle;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tidemark_core::cluster::attempts::RunAttempt;
use tidemark_core::cluster::wire::{self, Hello};
use tidemark_core::job::Job;
use tidemark_core::model::ids::{OperatorId, SubtaskId};
use tidemark_core::time::TimeMarks;
use tidemark_storage::{lease, CheckpointStorage};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};
use tonic::{Status, Streaming};

/// How often a worker reports its counters.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

/// How long a worker waits for a peer's link.
const LINK_TIMEOUT: Duration = Duration::from_secs(30);

/// The call the actor serves.
pub(crate) struct Open {
    pub commands: Streaming<Command>,
    pub events: mpsc::UnboundedSender<Result<Event, Status>>,
}

/// What the worker process lends every attempt.
pub(crate) struct Resources {
    pub host: Addr<WorkerHost>,
    pub rebuild: Rebuild,
    pub arbiters: Vec<ArbiterHandle>,
    pub links: ArbiterHandle,
    pub tls: Option<MutualTls>,
}

/// How this worker opens its links: the lower worker of a pair dials, on
/// the links arbiter (which runs the links' actors), with TLS if it has
/// any; the higher one awaits the link the host accepted.
struct Linking {
    host: Addr<WorkerHost>,
    links: ArbiterHandle,
    tls: Option<MutualTls>,
}

/// One attempt's share of the job on this worker.
pub(crate) struct AttemptActor {
    resources: Resources,
    commands: Option<Streaming<Command>>,
    events: mpsc::UnboundedSender<Result<Event, Status>>,
    /// The attempt of the call, from its first command.
    call: Option<RunAttempt>,
    subtasks: HashMap<SubtaskId, Addr<SubtaskActor>>,
    actors: Vec<Recipient<Stop>>,
    metrics: Arc<JobMetrics>,
    /// Counters as last reported.
    reported: Counters,
    /// The deployment while it reads state and waits for links, and the
    /// commands that arrive meanwhile: a `Cancel` must not wait for it.
    deploying: Option<SpawnHandle>,
    pending: Vec<ToWorker>,
    stopped: bool,
}

/// Empty progress reports from a thread of their own, every
/// [`PROGRESS_EVERY`] until dropped: the heartbeat while the attempt's
/// thread is busy.
struct Heartbeat {
    _stop: std::sync::mpsc::Sender<()>,
}

impl Heartbeat {
    fn start(events: mpsc::UnboundedSender<Result<Event, Status>>, run: RunAttempt) -> Heartbeat {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                stopped.recv_timeout(PROGRESS_EVERY)
            {
                let beat = FromWorker::Progress(Progress::default()).envelope(run.attempt);
                if events.send(Ok(beat)).is_err() {
                    return;
                }
            }
        });
        Heartbeat { _stop: stop }
    }
}

/// Totals a worker reports the growth of.
#[derive(Default)]
struct Counters {
    subtasks: BTreeMap<SubtaskId, (u64, u64, u64)>,
    /// Input watermarks: a level, reported when it changed.
    watermarks: BTreeMap<SubtaskId, i64>,
    sources: BTreeMap<OperatorId, u64>,
    link_bytes_sent: u64,
    restored_inflight_batches: u64,
    time: TimeMarks,
}

/// What an attempt is deployed from, once read and connected.
struct Prepared {
    job: Job,
    hosted: Vec<SubtaskId>,
    placement: WorkerAssignment,
    restore: HashMap<SubtaskId, Restored>,
    ends: LinkEnds,
    storage: Option<CheckpointStorage>,
}

impl AttemptActor {
    pub fn new(open: Open, resources: Resources) -> Self {
        AttemptActor {
            resources,
            commands: Some(open.commands),
            events: open.events,
            call: None,
            subtasks: HashMap::new(),
            actors: Vec::new(),
            metrics: Arc::default(),
            reported: Counters::default(),
            deploying: None,
            pending: Vec::new(),
            stopped: false,
        }
    }

    fn send(&self, event: FromWorker) {
        if let Some(run) = self.call {
            let _ = self.events.send(Ok(event.envelope(run.attempt)));
        }
    }

    /// Ends the call with `problem`, stopping what runs.
    fn refuse(&mut self, problem: String, ctx: &mut Context<Self>) {
        tracing::warn!("{problem}");
        let _ = self.events.send(Err(Status::failed_precondition(problem)));
        self.stop(ctx);
    }

    /// Stops the attempt's actors, then the actor; `Stopped` tells the
    /// driver, if it still listens.
    fn stop(&mut self, ctx: &mut Context<Self>) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        if let Some(deploying) = self.deploying.take() {
            ctx.cancel_future(deploying);
        }
        let stopped = stop_all(std::mem::take(&mut self.actors));
        self.subtasks.clear();
        ctx.wait(stopped.into_actor(self).map(|(), act, ctx| {
            act.progress();
            act.send(FromWorker::Stopped);
            act.release(&ctx.address());
            ctx.stop();
        }));
    }

    /// Tells the host the attempt ended here.
    fn release(&self, actor: &Addr<Self>) {
        if let Some(run) = self.call {
            self.resources.host.do_send(Release {
                run,
                actor: actor.clone(),
            });
        }
    }

    /// Reports what the counters grew by since the last report: also the
    /// worker's heartbeat, from the call's first command on.
    fn progress(&mut self) {
        let mut progress = Progress::default();
        let mut operators = BTreeSet::new();
        for (id, counters) in self.metrics.subtasks() {
            operators.insert(id.operator);
            let now = (
                counters.records_in(),
                counters.records_out(),
                counters.backpressured().as_nanos() as u64,
            );
            let was = self.reported.subtasks.insert(id, now).unwrap_or_default();
            if now != was {
                progress
                    .subtasks
                    .push((id, now.0 - was.0, now.1 - was.1, now.2 - was.2));
            }
            let watermark = counters.input_watermark();
            if self.reported.watermarks.insert(id, watermark) != Some(watermark) {
                progress.watermarks.push((id, watermark));
            }
        }
        for operator in operators {
            let now = self.metrics.records_in_of(operator);
            let was = self
                .reported
                .sources
                .insert(operator, now)
                .unwrap_or_default();
            if now != was {
                progress.sources.push((operator, now - was));
            }
        }
        let grown = |now: u64, was: &mut u64| now - std::mem::replace(was, now);
        let reported = &mut self.reported;
        progress.link_bytes_sent = grown(
            self.metrics.link_bytes_sent.load(Ordering::Relaxed),
            &mut reported.link_bytes_sent,
        );
        progress.restored_inflight_batches = grown(
            self.metrics
                .checkpoints
                .restored_inflight_batches
                .load(Ordering::Relaxed),
            &mut reported.restored_inflight_batches,
        );
        let time = self.metrics.time.marks();
        progress.time = time.since(&reported.time);
        reported.time = time;
        self.send(FromWorker::Progress(progress));
    }

    /// The first command: claims the worker for the attempt, prepares and
    /// starts its share.
    fn deploy(&mut self, deploy: Deploy, ctx: &mut Context<Self>) {
        let run = self.call.expect("the call is known");
        let attempt = run.attempt;
        let host = self.resources.host.clone();
        let rebuild = self.resources.rebuild.clone();
        let linking = Linking {
            host: host.clone(),
            links: self.resources.links.clone(),
            tls: self.resources.tls.clone(),
        };
        let me = ctx.address();
        let claim = Claim {
            run,
            actor: me.clone(),
        };
        let deploying = ctx.spawn(
            async move {
                // Links first, once admitted: a peer waits for this
                // worker's hello, not its restore.
                let admitted = admit(&deploy, run, &rebuild).await?;
                host.send(claim)
                    .await
                    .map_err(|_| "the worker is shutting down".to_owned())??;
                prepare(deploy, admitted, run, linking, me).await
            }
            .into_actor(self)
            .map(move |prepared, act, ctx| {
                act.deploying = None;
                match prepared {
                    Ok(prepared) => act.start(prepared, ctx),
                    Err(problem) => act.refuse(
                        format!("cannot deploy attempt {} here: {problem}", attempt.0),
                        ctx,
                    ),
                }
            }),
        );
        self.deploying = Some(deploying);
    }

    fn start(&mut self, prepared: Prepared, ctx: &mut Context<Self>) {
        if self.stopped {
            return;
        }
        let attempt = self.call.expect("the call is known").attempt;
        let me = ctx.address();
        let workers = Workers {
            placement: prepared.placement,
            links: Some(self.resources.links.clone()),
        };
        let hosting = Hosting {
            job: &prepared.job,
            metrics: &self.metrics,
            attempt,
            reports: Reports::to(&me),
            checkpointing: prepared
                .storage
                .map(|storage| (CheckpointReports::to(&me), storage)),
            arbiters: &self.resources.arbiters,
            workers: &workers,
        };
        // Restoring the operators' state runs on this thread, and a large
        // state takes longer than the driver's patience with silence.
        let beating = self
            .call
            .map(|run| Heartbeat::start(self.events.clone(), run));
        let deployed = hosting.deploy(&prepared.hosted, prepared.restore, prepared.ends);
        drop(beating);
        match deployed {
            Ok(Hosted {
                subtasks, actors, ..
            }) => {
                self.subtasks = subtasks.into_iter().collect();
                self.actors = actors;
                self.send(FromWorker::Deployed);
                for command in std::mem::take(&mut self.pending) {
                    self.command(command, ctx);
                }
            }
            Err(e) => self.refuse(format!("cannot deploy attempt {}: {e}", attempt.0), ctx),
        }
    }

    fn command(&mut self, command: ToWorker, ctx: &mut Context<Self>) {
        if self.deploying.is_some() && !matches!(command, ToWorker::Cancel) {
            return self.pending.push(command);
        }
        let subtask = |act: &Self, id: SubtaskId| {
            let found = act.subtasks.get(&id).cloned();
            if found.is_none() && !act.stopped {
                tracing::warn!(subtask = %id, "a command for a subtask this worker does not host");
            }
            found
        };
        match command {
            ToWorker::Deploy(_) => self.refuse("a second deployment in one call".into(), ctx),
            ToWorker::Trigger {
                subtask: id,
                barrier,
                suspend,
            } => {
                if let Some(s) = subtask(self, id) {
                    s.do_send(TriggerCheckpoint { barrier, suspend });
                }
            }
            ToWorker::Complete {
                subtask: id,
                checkpoint,
                rewrite,
            } => {
                if let Some(s) = subtask(self, id) {
                    s.do_send(NotifyCheckpointComplete {
                        checkpoint,
                        rewrite,
                    });
                }
            }
            ToWorker::Abort {
                subtask: id,
                checkpoint,
            } => {
                if let Some(s) = subtask(self, id) {
                    s.do_send(NotifyCheckpointAborted(checkpoint));
                }
            }
            ToWorker::EndOfData { subtask: id } => {
                if let Some(s) = subtask(self, id) {
                    s.do_send(EndOfData);
                }
            }
            ToWorker::AddSplits {
                subtask: id,
                splits,
            } => {
                if let Some(s) = subtask(self, id) {
                    s.do_send(AddSplits(splits));
                }
            }
            ToWorker::NoMoreSplits { subtask: id } => {
                if let Some(s) = subtask(self, id) {
                    s.do_send(NoMoreSplits);
                }
            }
            ToWorker::Cancel => self.stop(ctx),
        }
    }
}

/// A deployment the worker checked before it lets it claim the worker:
/// the job its recipe rebuilds is the driver's, and the job directory is
/// leased at the attempt's epoch, read from storage rather than taken
/// from the caller, so that no caller stops the running attempt with a
/// made-up later one.
struct Admitted {
    job: Job,
    placement: WorkerAssignment,
    hosted: Vec<SubtaskId>,
    storage: Option<CheckpointStorage>,
}

async fn admit(deploy: &Deploy, run: RunAttempt, rebuild: &Rebuild) -> Result<Admitted, String> {
    let mut job = rebuild(&deploy.recipe)?;
    if job_id(&job.name) != run.job {
        return Err(format!(
            "the recipe builds job {:?}, the driver runs another",
            job.name
        ));
    }
    if !job.graph.rescales_to(&deploy.graph) {
        return Err(
            "the job this worker builds from the recipe differs from the driver's (another build or other arguments)"
                .into(),
        );
    }
    // The driver's parallelism: the job may have been rescaled since it
    // started.
    job.graph = deploy.graph.clone();
    if deploy.worker >= deploy.workers || deploy.peers.len() != deploy.workers as usize {
        return Err(format!(
            "worker {} of {} with {} peer addresses",
            deploy.worker,
            deploy.workers,
            deploy.peers.len()
        ));
    }
    let placement = WorkerAssignment::new(deploy.workers);
    let hosted: Vec<SubtaskId> = job
        .graph
        .subtasks()
        .filter(|id| placement.worker(*id) == deploy.worker)
        .collect();
    let storage = job
        .config
        .checkpointing
        .as_ref()
        .map(|c| CheckpointStorage::open(&c.storage_url, run.job))
        .transpose()
        .map_err(|e| e.to_string())?;
    if let Some(storage) = &storage {
        let leased = lease::current_epoch(storage)
            .await
            .map_err(|e| e.to_string())?;
        if leased != Some(run.epoch) {
            let held = leased.map_or("no run holds it".into(), |epoch| {
                format!("it is leased at epoch {epoch}")
            });
            return Err(format!(
                "the attempt is of lease epoch {}, but {held}: {}",
                run.epoch,
                storage.directory()
            ));
        }
    }
    Ok(Admitted {
        job,
        placement,
        hosted,
        storage: storage.map(|storage| storage.working_for(run.epoch)),
    })
}

/// Opens the links to the other workers and reads the state of the
/// subtasks placed here.
async fn prepare(
    deploy: Deploy,
    admitted: Admitted,
    run: RunAttempt,
    linking: Linking,
    failures: Addr<AttemptActor>,
) -> Result<Prepared, String> {
    let Admitted {
        job,
        placement,
        hosted,
        storage,
    } = admitted;
    let ends = open_links(&deploy, run, &job, placement, linking, failures).await?;
    let restore = restore_state(&deploy, storage.as_ref(), &job, &hosted).await?;
    Ok(Prepared {
        job,
        hosted,
        placement,
        restore,
        ends,
        storage,
    })
}

/// The links of this worker's share, the lower worker of each pair dialing.
async fn open_links(
    deploy: &Deploy,
    run: RunAttempt,
    job: &Job,
    placement: WorkerAssignment,
    linking: Linking,
    failures: Addr<AttemptActor>,
) -> Result<LinkEnds, String> {
    let me = deploy.worker;
    let failures: Recipient<SubtaskFailed> = failures.recipient();
    let mut ends = LinkEnds::new();
    for (a, b) in crossings(&job.graph, placement) {
        if a != me && b != me {
            continue;
        }
        let peer = if a == me { b } else { a };
        let hello = Hello::between(run, me, peer);
        let problem = |e: String| format!("the link to worker {peer}: {e}");
        // The lower worker dials; the higher one's acceptor hands the
        // link over by its hello.
        let end = if me < peer {
            let address = deploy.peers[peer as usize].clone();
            let (reply, dialed) = oneshot::channel();
            let dial = dial(address, hello, linking.tls.clone());
            linking.links.spawn(async move {
                let _ = reply.send(dial.await);
            });
            let stream = dialed
                .await
                .map_err(|_| problem("the links' thread is gone".into()))?
                .map_err(problem)?;
            LinkEnd::opened(stream, Vec::new(), hello, &failures).greeted()
        } else {
            let (reply, link) = oneshot::channel();
            linking.host.do_send(AwaitLink {
                key: (run, peer),
                reply,
            });
            let (stream, read) = tokio::time::timeout(LINK_TIMEOUT, link)
                .await
                .map_err(|_| problem(format!("it sent no hello within {LINK_TIMEOUT:?}")))?
                .map_err(|_| problem("a later attempt replaced this one".into()))?;
            LinkEnd::opened(stream, read, hello, &failures)
        };
        ends.insert(((a, b), me), end);
    }
    Ok(ends)
}

/// Dials the link to the peer at `address`, with TLS if given, and sends
/// the hello at once: the peer hands the link to its attempt by it,
/// whatever this worker still has to do. Runs on the links arbiter.
async fn dial(address: String, hello: Hello, tls: Option<MutualTls>) -> Result<LinkStream, String> {
    let failed = |e: std::io::Error| format!("{address}: {e}");
    let connect = async {
        let stream = tokio::net::TcpStream::connect(address.as_str())
            .await
            .map_err(failed)?;
        stream.set_nodelay(true).map_err(failed)?;
        let mut stream: LinkStream = match &tls {
            Some(tls) => Box::new(
                tls.connect(&address, stream)
                    .await
                    .map_err(|e| format!("{address}: TLS: {e}"))?,
            ),
            None => Box::new(stream),
        };
        let mut first = Vec::new();
        wire::encode_hello(&hello, &mut first);
        stream.write_all(&first).await.map_err(failed)?;
        stream.flush().await.map_err(failed)?;
        Ok(stream)
    };
    tokio::time::timeout(LINK_TIMEOUT, connect)
        .await
        .map_err(|_| format!("{address} did not answer"))?
}

/// The state the deployment's restore gives the subtasks placed here.
async fn restore_state(
    deploy: &Deploy,
    storage: Option<&CheckpointStorage>,
    job: &Job,
    hosted: &[SubtaskId],
) -> Result<HashMap<SubtaskId, Restored>, String> {
    Ok(match (&deploy.restore, storage) {
        (Some(spec), Some(storage)) => {
            let from = RestoreFrom {
                checkpoint: spec.checkpoint.clone(),
                owned: spec.owned,
                dir: spec
                    .dir
                    .as_deref()
                    .map(|dir| CheckpointStorage::open_directory(dir, false))
                    .transpose()
                    .map_err(|e| e.to_string())?,
            };
            load(
                storage,
                &job.graph,
                Some(&from),
                job.config.allows_non_restored_state(),
                job.config.local_dir(),
                |id| hosted.contains(&id),
            )
            .await
            .map_err(|e| e.to_string())?
            .subtasks
        }
        (Some(_), None) => return Err("a restore for a job without checkpointing".into()),
        (None, _) => HashMap::new(),
    })
}

impl Actor for AttemptActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if let Some(commands) = self.commands.take() {
            ctx.add_stream(commands);
        }
    }
}

impl StreamHandler<Result<Command, Status>> for AttemptActor {
    fn handle(&mut self, command: Result<Command, Status>, ctx: &mut Context<Self>) {
        let command = match command {
            Ok(command) => command,
            Err(status) => {
                tracing::warn!("the driver's call broke: {}", status.message());
                return self.stop(ctx);
            }
        };
        if self.call.is_none() {
            self.call = Some(command.of());
            ctx.run_interval(PROGRESS_EVERY, |act, _| act.progress());
        }
        let run = self.call.expect("just set");
        match ToWorker::open(&command, run) {
            Ok(ToWorker::Deploy(deploy))
                if self.subtasks.is_empty() && self.deploying.is_none() && !self.stopped =>
            {
                self.deploy(*deploy, ctx)
            }
            Ok(command) => self.command(command, ctx),
            Err(e) => self.refuse(e.to_string(), ctx),
        }
    }

    fn finished(&mut self, ctx: &mut Context<Self>) {
        self.stop(ctx);
    }
}

impl Handler<Stop> for AttemptActor {
    type Result = ResponseActFuture<Self, ()>;

    /// A newer attempt claimed the worker: answered once the actors
    /// stopped, since `stop` holds the mailbox until then.
    fn handle(&mut self, _: Stop, ctx: &mut Context<Self>) -> Self::Result {
        self.stop(ctx);
        Box::pin(actix::fut::ready(()))
    }
}

impl Handler<SubtaskFailed> for AttemptActor {
    type Result = ();

    fn handle(&mut self, failed: SubtaskFailed, _ctx: &mut Context<Self>) {
        if self.call.map(|run| run.attempt) == Some(failed.attempt) {
            self.send(FromWorker::Failed {
                subtask: failed.subtask,
                error: failed.error.to_string(),
            });
        }
    }
}

impl Handler<SubtaskFinished> for AttemptActor {
    type Result = ();

    fn handle(&mut self, finished: SubtaskFinished, _ctx: &mut Context<Self>) {
        // What the subtask counted reaches the driver before it finishes.
        self.progress();
        self.send(FromWorker::Finished {
            subtask: finished.subtask,
        });
    }
}

impl Handler<AcknowledgeCheckpoint> for AttemptActor {
    type Result = ();

    fn handle(&mut self, ack: AcknowledgeCheckpoint, _ctx: &mut Context<Self>) {
        self.send(FromWorker::Acknowledged(Box::new(ack.ack)));
    }
}

impl Handler<DeclineCheckpoint> for AttemptActor {
    type Result = ();

    fn handle(&mut self, decline: DeclineCheckpoint, _ctx: &mut Context<Self>) {
        self.send(FromWorker::Declined {
            subtask: decline.subtask,
            checkpoint: decline.checkpoint,
            reason: decline.reason,
        });
    }
}

impl Handler<SplitRequest> for AttemptActor {
    type Result = ();

    fn handle(&mut self, request: SplitRequest, _ctx: &mut Context<Self>) {
        self.send(FromWorker::SplitRequested {
            subtask: request.subtask,
        });
    }
}

impl Handler<SourceExhausted> for AttemptActor {
    type Result = ();

    fn handle(&mut self, exhausted: SourceExhausted, _ctx: &mut Context<Self>) {
        self.send(FromWorker::Exhausted {
            subtask: exhausted.subtask,
        });
    }
}
