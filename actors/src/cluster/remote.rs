//! The driver's side of worker processes: finding or launching them, one
//! `Attempt` call per worker and attempt carrying the commands of the
//! supervisor and the coordinator to the worker's subtasks and their
//! reports back, and the worker's death as a failure of the attempt.

use crate::control::worker_client::WorkerClient;
use crate::control::{
    Command, Commands, Deploy, Empty, Event, FromWorker, ToWorker, KEEPALIVE, LISTENING,
    MAX_CONTROL_MESSAGE,
};
use crate::job::JobError;
use crate::messages::{
    AcknowledgeCheckpoint, CheckpointReports, DeclineCheckpoint, Reports, SourceExhausted,
    SplitRequest, Stop, SubtaskFailed, SubtaskFinished, WorkerDeployed,
};
use crate::metrics::JobMetrics;
use crate::tls::MutualTls;
use actix::{
    Actor, ActorContext, ActorFutureExt, Addr, AsyncContext, Context, Handler, Recipient,
    ResponseFuture, StreamHandler, WrapFuture,
};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidemark_core::cluster::attempts::RunAttempt;
use tidemark_core::dataflow::error::TaskError;
use tidemark_core::model::ids::{Attempt, SubtaskId};
use tokio::io::AsyncBufReadExt;
use tokio::sync::{mpsc, oneshot};
use tonic::transport::Channel;

/// How long a launched worker may take to say where it listens.
const LAUNCH_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a worker may take to answer where it is reached.
const INFO_TIMEOUT: Duration = Duration::from_secs(5);

/// A worker sends its progress every 100 ms from its call's first command
/// on: this long without a word from it, it is lost even though its
/// connection stands (hung, stopped, or restoring state for longer).
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(15);

/// The worker processes of a job.
#[derive(Clone, Debug)]
pub enum WorkerSet {
    /// Launched here: `count` processes of `program` with `args`, each
    /// relaunched when it died.
    Launch {
        /// The binary: one whose `args` serve `tidemark.v1.Worker`.
        program: PathBuf,
        /// Its arguments (`worker --exit-with-stdin` for `tidemark`).
        args: Vec<String>,
        /// How many.
        count: u32,
    },
    /// Started elsewhere, at these control addresses (`host:port`); a dead
    /// one is asked again at each restart until it answers.
    Addresses(Vec<String>),
}

/// A job spread over worker processes: where they are, and the recipe
/// they rebuild the job from.
#[derive(Clone, Debug)]
pub struct Distributed {
    /// Where the workers are.
    pub workers: WorkerSet,
    /// What each worker's builder rebuilds the job from.
    pub recipe: Vec<u8>,
    /// Mutual TLS with the workers, which must have it too.
    pub tls: Option<MutualTls>,
}

impl WorkerSet {
    /// How many workers there are.
    pub fn count(&self) -> u32 {
        match self {
            WorkerSet::Launch { count, .. } => *count,
            WorkerSet::Addresses(addresses) => addresses.len() as u32,
        }
    }
}

/// One worker process as the driver knows it.
struct Peer {
    control: Option<String>,
    client: Option<WorkerClient<Channel>>,
    data: String,
    child: Option<tokio::process::Child>,
}

impl Peer {
    /// Asks worker `index` where its peers reach it, connecting first.
    async fn answer(&mut self, index: usize, tls: Option<&MutualTls>) -> Result<(), JobError> {
        let control = self.control.clone().expect("a worker's address is known");
        let fail =
            |problem: String| JobError::Runtime(format!("worker {index} at {control}: {problem}"));
        let mut client = match self.client.take() {
            Some(client) => client,
            None => {
                let scheme = if tls.is_some() { "https" } else { "http" };
                let mut endpoint =
                    tonic::transport::Endpoint::from_shared(format!("{scheme}://{control}"))
                        .map_err(|e| fail(e.to_string()))?;
                if let Some(tls) = tls {
                    endpoint = endpoint
                        .tls_config(tls.client(&control))
                        .map_err(|e| fail(format!("TLS: {e}")))?;
                }
                let endpoint = endpoint
                    .connect_timeout(INFO_TIMEOUT)
                    .tcp_nodelay(true)
                    .http2_keep_alive_interval(KEEPALIVE)
                    .keep_alive_timeout(KEEPALIVE * 3)
                    .keep_alive_while_idle(true);
                WorkerClient::new(endpoint.connect().await.map_err(|e| fail(e.to_string()))?)
                    .max_decoding_message_size(MAX_CONTROL_MESSAGE)
            }
        };
        let info = tokio::time::timeout(INFO_TIMEOUT, client.info(Empty {}))
            .await
            .map_err(|_| fail(format!("no answer within {INFO_TIMEOUT:?}")))?
            .map_err(|e| fail(e.message().to_owned()))?
            .into_inner();
        if info.version != env!("CARGO_PKG_VERSION") {
            return Err(fail(format!(
                "runs version {}, this driver {}",
                info.version,
                env!("CARGO_PKG_VERSION")
            )));
        }
        self.data = info.data_address;
        self.client = Some(client);
        Ok(())
    }
}

/// The worker processes of a running job.
pub struct Pool {
    pub distributed: Distributed,
    peers: Vec<Peer>,
}

impl Pool {
    pub fn new(distributed: Distributed) -> Self {
        let count = distributed.workers.count() as usize;
        let peers = (0..count)
            .map(|i| Peer {
                control: match &distributed.workers {
                    WorkerSet::Addresses(addresses) => Some(addresses[i].clone()),
                    WorkerSet::Launch { .. } => None,
                },
                client: None,
                data: String::new(),
                child: None,
            })
            .collect();
        Pool { distributed, peers }
    }

    pub fn count(&self) -> u32 {
        self.peers.len() as u32
    }

    /// Every worker answering, each asked where its peers reach it. A
    /// launched worker that died, or that runs but does not answer (hung),
    /// is launched again.
    pub async fn ready(&mut self) -> Result<(), JobError> {
        let launched = match &self.distributed.workers {
            WorkerSet::Launch { program, args, .. } => Some((program, args)),
            WorkerSet::Addresses(_) => None,
        };
        let tls = self.distributed.tls.as_ref();
        for (index, peer) in self.peers.iter_mut().enumerate() {
            let Some((program, args)) = launched else {
                peer.answer(index, tls).await?;
                continue;
            };
            let running = peer
                .child
                .as_mut()
                .is_some_and(|child| matches!(child.try_wait(), Ok(None)));
            if running && peer.answer(index, tls).await.is_ok() {
                continue;
            }
            // Dropping a child kills it.
            let (child, control) = launch(program, args, index).await?;
            *peer = Peer {
                control: Some(control),
                client: None,
                data: String::new(),
                child: Some(child),
            };
            peer.answer(index, tls).await?;
        }
        Ok(())
    }

    /// The data addresses of the workers, by index.
    pub fn data_addresses(&self) -> Vec<String> {
        self.peers.iter().map(|p| p.data.clone()).collect()
    }

    /// Kills worker `index` as a crash would (SIGKILL); only launched
    /// workers can be.
    pub fn kill(&mut self, index: u32) {
        if let Some(child) = &mut self.peers[index as usize].child {
            tracing::info!(worker = index, pid = child.id(), "killing a worker process");
            let _ = child.start_kill();
        }
    }

    /// Opens worker `index`'s call for `run` and deploys `deploy` on it:
    /// the commands for its subtasks, and the actor that hears it.
    pub fn attach(
        &self,
        index: u32,
        deploy: Deploy,
        run: RunAttempt,
        reporting: Reporting,
    ) -> (Commands, Addr<RemoteWorker>) {
        let (commands, receiver) = Commands::channel(run);
        commands.send(ToWorker::Deploy(Box::new(deploy)));
        let client = self.peers[index as usize]
            .client
            .clone()
            .expect("a deployed worker is ready");
        let worker = RemoteWorker {
            index,
            attempt: run.attempt,
            commands: commands.clone(),
            reporting,
            call: Some((client, receiver)),
            stop: None,
            stopped: false,
            heard: Instant::now(),
        }
        .start();
        (commands, worker)
    }
}

/// Starts worker `index` of `program` and reads where it listens.
async fn launch(
    program: &PathBuf,
    args: &[String],
    index: usize,
) -> Result<(tokio::process::Child, String), JobError> {
    let fail = |problem: String| {
        JobError::Runtime(format!(
            "cannot launch worker {index} ({}): {problem}",
            program.display()
        ))
    };
    let mut child = tokio::process::Command::new(program)
        .args(args)
        // The worker exits once this pipe closes: with the driver.
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| fail(e.to_string()))?;
    let stdout = child.stdout.take().expect("piped");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let line = tokio::time::timeout(LAUNCH_TIMEOUT, lines.next_line())
        .await
        .map_err(|_| {
            fail(format!(
                "it did not say where it listens within {LAUNCH_TIMEOUT:?}"
            ))
        })?
        .map_err(|e| fail(e.to_string()))?
        .ok_or_else(|| fail("it exited before it listened".into()))?;
    let address = line
        .strip_prefix(LISTENING)
        .ok_or_else(|| fail(format!("it said {line:?}")))?
        .to_owned();
    Ok((child, address))
}

/// Where a worker's reports go on the driver: its subtasks' where a local
/// subtask's go, and its deployment to the supervisor.
#[derive(Clone)]
pub struct Reporting {
    pub reports: Reports,
    pub deployed: Recipient<WorkerDeployed>,
    pub checkpoints: Option<CheckpointReports>,
    pub metrics: Arc<JobMetrics>,
    /// The subtask a lost worker fails the attempt in the name of.
    pub blame: SubtaskId,
}

/// One worker's `Attempt` call on the driver: it sends the commands and
/// hands the worker's events to the supervisor and the coordinator. The
/// call ending before the worker said it stopped is the worker's death, a
/// failure of the attempt. Stopping it cancels the worker's share of the
/// attempt and resolves once the worker stopped its actors.
pub struct RemoteWorker {
    index: u32,
    attempt: Attempt,
    commands: Commands,
    reporting: Reporting,
    call: Option<(WorkerClient<Channel>, mpsc::UnboundedReceiver<Command>)>,
    stop: Option<oneshot::Sender<()>>,
    stopped: bool,
    /// When the worker was last heard of.
    heard: Instant,
}

impl RemoteWorker {
    fn lost(&mut self, problem: String, ctx: &mut Context<Self>) {
        if !self.stopped {
            self.reporting.reports.failed.do_send(SubtaskFailed {
                attempt: self.attempt,
                subtask: self.reporting.blame,
                error: TaskError::Remote(format!("worker {}: {problem}", self.index)),
            });
        }
        self.ended(ctx);
    }

    fn ended(&mut self, ctx: &mut Context<Self>) {
        self.stopped = true;
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        ctx.stop();
    }

    fn report(&mut self, event: FromWorker, ctx: &mut Context<Self>) {
        let attempt = self.attempt;
        let Reporting {
            reports,
            deployed,
            checkpoints,
            metrics,
            ..
        } = &self.reporting;
        match event {
            FromWorker::Deployed => deployed.do_send(WorkerDeployed(attempt)),
            FromWorker::Acknowledged(ack) => {
                if let Some(c) = checkpoints {
                    c.acknowledged
                        .do_send(AcknowledgeCheckpoint { attempt, ack: *ack });
                }
            }
            FromWorker::Declined {
                subtask,
                checkpoint,
                reason,
            } => {
                if let Some(c) = checkpoints {
                    c.declined.do_send(DeclineCheckpoint {
                        attempt,
                        checkpoint,
                        subtask,
                        reason,
                    });
                }
            }
            FromWorker::Exhausted { subtask } => {
                if let Some(c) = checkpoints {
                    c.exhausted.do_send(SourceExhausted { attempt, subtask });
                }
            }
            FromWorker::SplitRequested { subtask } => reports
                .split_requested
                .do_send(SplitRequest { attempt, subtask }),
            FromWorker::Finished { subtask } => reports
                .finished
                .do_send(SubtaskFinished { attempt, subtask }),
            FromWorker::Failed { subtask, error } => reports.failed.do_send(SubtaskFailed {
                attempt,
                subtask,
                error: TaskError::Remote(error),
            }),
            FromWorker::Progress(progress) => {
                for (subtask, records_in, records_out, backpressured_ns) in progress.subtasks {
                    let counters = metrics.subtask(subtask);
                    counters.add_records_in(records_in);
                    counters.add_records_out(records_out);
                    counters.add_backpressured(Duration::from_nanos(backpressured_ns));
                }
                for (subtask, watermark) in progress.watermarks {
                    metrics.subtask(subtask).mirror_input_watermark(watermark);
                }
                for (operator, records) in progress.sources {
                    metrics.add_records_in(operator, records);
                }
                metrics
                    .link_bytes_sent
                    .fetch_add(progress.link_bytes_sent, Ordering::Relaxed);
                metrics
                    .checkpoints
                    .restored_inflight_batches
                    .fetch_add(progress.restored_inflight_batches, Ordering::Relaxed);
                metrics.time.merge(&progress.time);
            }
            FromWorker::Stopped => self.ended(ctx),
        }
    }
}

impl Actor for RemoteWorker {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(HEARTBEAT_TIMEOUT / 15, |worker, ctx| {
            let silent = worker.heard.elapsed();
            if silent > HEARTBEAT_TIMEOUT {
                worker.lost(format!("lost: not heard of for {silent:?}"), ctx);
            }
        });
        let (mut client, receiver) = self.call.take().expect("a call opens once");
        let requests = tokio_stream::wrappers::UnboundedReceiverStream::new(receiver);
        ctx.spawn(
            async move { client.attempt(requests).await }
                .into_actor(self)
                .map(|opened, worker, ctx| match opened {
                    Ok(events) => {
                        ctx.add_stream(events.into_inner());
                    }
                    Err(status) => worker.lost(format!("lost: {}", status.message()), ctx),
                }),
        );
    }
}

impl StreamHandler<Result<Event, tonic::Status>> for RemoteWorker {
    fn handle(&mut self, event: Result<Event, tonic::Status>, ctx: &mut Context<Self>) {
        self.heard = Instant::now();
        match event
            .map_err(|s| s.message().to_owned())
            .and_then(|event| FromWorker::open(&event, self.attempt).map_err(|e| e.to_string()))
        {
            Ok(event) => self.report(event, ctx),
            Err(problem) => self.lost(problem, ctx),
        }
    }

    fn finished(&mut self, ctx: &mut Context<Self>) {
        self.lost("lost: its call ended".into(), ctx);
    }
}

impl Handler<Stop> for RemoteWorker {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: Stop, _ctx: &mut Context<Self>) -> ResponseFuture<()> {
        if self.stopped {
            return Box::pin(async {});
        }
        let (stop, stopped) = oneshot::channel();
        self.stop = Some(stop);
        self.commands.send(ToWorker::Cancel);
        // What the worker reports while it stops belongs to a finished
        // attempt; its call ending is no longer a loss.
        self.stopped = true;
        Box::pin(async move {
            let _ = stopped.await;
        })
    }
}
