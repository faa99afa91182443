//! A worker process: hosts its share of a job's subtasks for a driver (the
//! process that runs the job's supervisor and checkpoint coordinator).
//!
//! It serves the gRPC service `tidemark.v1.Worker` and accepts links from
//! its peers on a data address of its own. For each attempt the driver
//! opens one `Attempt` call: the worker rebuilds the job from the recipe
//! the driver sends (and refuses if its graph differs from the driver's),
//! reads its subtasks' state, opens its links and starts its actors; then
//! it hands the driver's commands to its subtasks, in order, and sends
//! their reports back. One attempt runs at a time: a newer one first stops
//! the one before, an older one is refused. The call ending without a
//! `Cancel` (the driver is gone) stops the attempt's actors too.

mod attempt;

use crate::control::worker_server::{Worker, WorkerServer};
use crate::control::{Command, Empty, Event, WorkerInfo};
use crate::messages::Stop;
use crate::remote::LISTENING;
use actix::{
    Actor, ActorFutureExt, Addr, Arbiter, Context, Handler, Message, ResponseActFuture, WrapFuture,
};
use actix_rt::{ArbiterHandle, System};
use attempt::{AttemptActor, Open};
use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use tidemark::attempts::{self, HostedAttempt};
use tidemark::ids::{Attempt, JobId};
use tidemark::job::Job;
use tidemark::wire::{Frame, FrameDecoder};
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tonic::{Request, Response, Status, Streaming};

/// Rebuilds a job from the recipe its driver sends: the same closures, in
/// this process. The command line's rebuilds `tidemark run`'s jobs from
/// their arguments.
pub type Rebuild = Arc<dyn Fn(&[u8]) -> Result<Job, String> + Send + Sync>;

/// Where a worker listens, and how many threads run its actors.
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    /// The gRPC service; port 0 takes a free port.
    pub control: SocketAddr,
    /// Where peers open links; port 0 takes a free port.
    pub data: SocketAddr,
    /// The host peers reach `data` at, if not its own address.
    pub advertise: Option<String>,
    /// Arbiters for the subtasks; 0 counts as 1.
    pub threads: usize,
    /// Exit when stdin closes: a worker launched by its driver goes with it.
    pub exit_with_stdin: bool,
}

/// Runs a worker until it is shut down over gRPC (or stdin closes). Prints
/// `tidemark worker listening on ADDR` with its control address first.
pub fn serve(options: WorkerOptions, rebuild: Rebuild) -> std::io::Result<()> {
    let system = System::new();
    let arbiters: Vec<Arbiter> = (0..options.threads.max(1))
        .map(|_| Arbiter::new())
        .collect();
    let links = Arbiter::new();
    let handles: Vec<ArbiterHandle> = arbiters.iter().map(Arbiter::handle).collect();
    let link_arbiter = links.handle();
    system.block_on(async move {
        let control = tokio::net::TcpListener::bind(options.control).await?;
        let data = tokio::net::TcpListener::bind(options.data).await?;
        let bound = data.local_addr()?;
        let data_address = match &options.advertise {
            Some(host) => format!("{host}:{}", bound.port()),
            None => bound.to_string(),
        };
        let host = WorkerHost {
            rebuild,
            arbiters: handles,
            links: link_arbiter,
            hosted: HostedAttempt::default(),
            current: None,
            parked: HashMap::new(),
            waiting: HashMap::new(),
        }
        .start();
        actix_rt::spawn(accept(data, host.clone()));
        let service = Service {
            host: host.clone(),
            data: data_address,
        };
        let address = control.local_addr()?;
        let incoming = TcpListenerStream::new(control);
        actix_rt::spawn(async move {
            let served = tonic::transport::Server::builder()
                .tcp_nodelay(true)
                .add_service(WorkerServer::new(service))
                .serve_with_incoming(incoming)
                .await;
            if let Err(e) = served {
                tracing::error!("the worker's gRPC service failed: {e}");
                System::current().stop();
            }
        });
        let mut stdout = std::io::stdout();
        writeln!(stdout, "{LISTENING}{address}")?;
        stdout.flush()?;
        if options.exit_with_stdin {
            let system = System::current();
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
                system.stop();
            });
        }
        Ok::<_, std::io::Error>(())
    })?;
    system.run()?;
    for arbiter in arbiters.into_iter().chain([links]) {
        arbiter.stop();
        let _ = arbiter.join();
    }
    Ok(())
}

/// Accepts links from peers and hands each, with the hello it opened
/// with, to the host.
async fn accept(listener: tokio::net::TcpListener, host: Addr<WorkerHost>) {
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            continue;
        };
        let host = host.clone();
        actix_rt::spawn(async move {
            match hello(stream).await {
                Ok((key, stream, read)) => host.do_send(Accepted { key, stream, read }),
                Err(e) => tracing::warn!(%peer, "a link was refused: {e}"),
            }
        });
    }
}

/// Reads a link's first frame, which must be a hello: whose link it is.
async fn hello(
    mut stream: tokio::net::TcpStream,
) -> Result<(LinkKey, std::net::TcpStream, Vec<u8>), String> {
    let mut read = Vec::new();
    let mut decoder = FrameDecoder::default();
    let mut buffer = [0; 256];
    let hello = loop {
        let n = stream.read(&mut buffer).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("closed before its hello".into());
        }
        read.extend_from_slice(&buffer[..n]);
        decoder.feed(&buffer[..n]);
        match decoder.next_frame().map_err(|e| e.to_string())? {
            Some(Frame::Hello(hello)) => break hello,
            Some(_) => return Err("its first frame is not a hello".into()),
            None => {}
        }
    };
    let stream = stream.into_std().map_err(|e| e.to_string())?;
    Ok(((hello.job, hello.attempt, hello.from), stream, read))
}

/// A link of an attempt, by the worker that dialed it.
type LinkKey = (JobId, Attempt, u32);

/// The gRPC service, in front of the host.
struct Service {
    host: Addr<WorkerHost>,
    data: String,
}

type Events = Pin<Box<dyn tokio_stream::Stream<Item = Result<Event, Status>> + Send>>;

#[tonic::async_trait]
impl Worker for Service {
    async fn info(&self, _: Request<Empty>) -> Result<Response<WorkerInfo>, Status> {
        Ok(Response::new(WorkerInfo {
            data_address: self.data.clone(),
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
        }))
    }

    type AttemptStream = Events;

    async fn attempt(
        &self,
        request: Request<Streaming<Command>>,
    ) -> Result<Response<Events>, Status> {
        let (events, receiver) = mpsc::unbounded_channel();
        self.host.do_send(OpenCall {
            commands: request.into_inner(),
            events,
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(
            receiver,
        ))))
    }

    async fn shutdown(&self, _: Request<Empty>) -> Result<Response<Empty>, Status> {
        self.host.do_send(Shutdown);
        Ok(Response::new(Empty {}))
    }
}

/// The process's state: which attempt it hosts, and links that arrived.
pub(crate) struct WorkerHost {
    rebuild: Rebuild,
    arbiters: Vec<ArbiterHandle>,
    links: ArbiterHandle,
    /// Which attempt runs here, and its actor.
    hosted: HostedAttempt,
    current: Option<Addr<AttemptActor>>,
    /// Links accepted before their attempt asked for them.
    parked: HashMap<LinkKey, (std::net::TcpStream, Vec<u8>)>,
    /// Attempts waiting for a link.
    waiting: HashMap<LinkKey, oneshot::Sender<(std::net::TcpStream, Vec<u8>)>>,
}

impl Actor for WorkerHost {
    type Context = Context<Self>;
}

#[derive(Message)]
#[rtype(result = "()")]
struct OpenCall {
    commands: Streaming<Command>,
    events: mpsc::UnboundedSender<Result<Event, Status>>,
}

impl Handler<OpenCall> for WorkerHost {
    type Result = ();

    fn handle(&mut self, call: OpenCall, ctx: &mut Context<Self>) {
        AttemptActor::new(
            Open {
                commands: call.commands,
                events: call.events,
            },
            attempt::Resources {
                host: actix::AsyncContext::address(ctx),
                rebuild: self.rebuild.clone(),
                arbiters: self.arbiters.clone(),
                links: self.links.clone(),
            },
        )
        .start();
    }
}

/// An attempt's actor → host: let me run, after stopping the attempt it
/// replaces; refused (`false`) as `HostedAttempt` refuses.
#[derive(Message)]
#[rtype(result = "bool")]
pub(crate) struct Claim {
    pub job: JobId,
    pub attempt: Attempt,
    pub actor: Addr<AttemptActor>,
}

impl Handler<Claim> for WorkerHost {
    type Result = ResponseActFuture<Self, bool>;

    fn handle(&mut self, claim: Claim, _ctx: &mut Context<Self>) -> Self::Result {
        let replaced = match self.hosted.claim(claim.job, claim.attempt) {
            attempts::Claim::Refused { hosting } => {
                tracing::warn!(
                    "attempt {} of job {} is refused: this worker hosts attempt {} of job {}",
                    claim.attempt.0,
                    claim.job,
                    hosting.1 .0,
                    hosting.0
                );
                return Box::pin(actix::fut::ready(false));
            }
            attempts::Claim::Granted { .. } => self.current.replace(claim.actor),
        };
        let hosted = &self.hosted;
        self.parked
            .retain(|(job, attempt, _), _| hosted.admits(*job, *attempt));
        Box::pin(
            async move {
                if let Some(actor) = replaced {
                    let _ = actor.send(Stop).await;
                }
            }
            .into_actor(self)
            .map(|(), _, _| true),
        )
    }
}

/// An attempt's actor → host: the attempt ended here.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Release {
    pub job: JobId,
    pub attempt: Attempt,
}

impl Handler<Release> for WorkerHost {
    type Result = ();

    fn handle(&mut self, ended: Release, _ctx: &mut Context<Self>) {
        self.hosted.release(ended.job, ended.attempt);
        if self.hosted.admits(ended.job, ended.attempt) {
            self.current = None;
        }
    }
}

/// Data acceptor → host.
#[derive(Message)]
#[rtype(result = "()")]
struct Accepted {
    key: LinkKey,
    stream: std::net::TcpStream,
    read: Vec<u8>,
}

impl Handler<Accepted> for WorkerHost {
    type Result = ();

    fn handle(&mut self, link: Accepted, _ctx: &mut Context<Self>) {
        let (job, attempt, _) = link.key;
        if !self.hosted.admits(job, attempt) {
            return tracing::warn!(
                "a link of attempt {} is refused: it is over here",
                attempt.0
            );
        }
        match self.waiting.remove(&link.key) {
            Some(waiter) => {
                let _ = waiter.send((link.stream, link.read));
            }
            None => {
                self.parked.insert(link.key, (link.stream, link.read));
            }
        }
    }
}

/// An attempt's actor → host: the link the peer of `key` dialed, once it
/// arrives.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct AwaitLink {
    pub key: LinkKey,
    pub reply: oneshot::Sender<(std::net::TcpStream, Vec<u8>)>,
}

impl Handler<AwaitLink> for WorkerHost {
    type Result = ();

    fn handle(&mut self, wait: AwaitLink, _ctx: &mut Context<Self>) {
        match self.parked.remove(&wait.key) {
            Some(link) => {
                let _ = wait.reply.send(link);
            }
            None => {
                self.waiting.insert(wait.key, wait.reply);
            }
        }
    }
}

#[derive(Message)]
#[rtype(result = "()")]
struct Shutdown;

impl Handler<Shutdown> for WorkerHost {
    type Result = ();

    fn handle(&mut self, _: Shutdown, _ctx: &mut Context<Self>) {
        System::current().stop();
    }
}
