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
use crate::control::{
    Command, Empty, Event, WorkerInfo, KEEPALIVE, LISTENING, MAX_CONTROL_MESSAGE,
};
use crate::dataflow::net::LinkStream;
use crate::messages::Stop;
use crate::tls::{check_exposure, ExposedWithoutTls, MutualTls};
use actix::{
    Actor, ActorFutureExt, Addr, Arbiter, Context, Handler, Message, ResponseActFuture, WrapFuture,
};
use actix_rt::{ArbiterHandle, System};
use attempt::{AttemptActor, Open};
use std::io::Write;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use tidemark_core::cluster::attempts::{self, RunAttempt};
use tidemark_core::cluster::links::{Handover, LinkAdmission, LinkKey};
use tidemark_core::cluster::wire::{FrameDecoder, MAX_HELLO_BYTES};
use tidemark_core::job::Job;
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
pub struct WorkerConfig {
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
    /// Mutual TLS on both ports: only the driver and peers whose
    /// certificates chain to its CA get in.
    pub tls: Option<MutualTls>,
    /// Serve beyond loopback without TLS: the network is trusted.
    pub insecure: bool,
}

/// Why a worker does not serve.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// An address beyond loopback without TLS, and not `insecure`.
    #[error(transparent)]
    Exposed(#[from] ExposedWithoutTls),
    /// An address that cannot be bound.
    #[error("cannot listen at {address}: {source}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The runtime failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Runs a worker until it is killed (or, with `exit_with_stdin`, stdin
/// closes). Prints
/// `tidemark worker listening on ADDR` with its control address first.
/// Refuses to serve beyond loopback without TLS unless `insecure`.
pub fn serve(options: WorkerConfig, rebuild: Rebuild) -> Result<(), ServeError> {
    for address in [options.control, options.data] {
        check_exposure(address, options.tls.as_ref(), options.insecure)?;
    }
    let bind = |address: SocketAddr| {
        std::net::TcpListener::bind(address)
            .and_then(|listener| listener.set_nonblocking(true).map(|()| listener))
            .map_err(|source| ServeError::Bind { address, source })
    };
    let (control, data) = (bind(options.control)?, bind(options.data)?);
    let system = System::new();
    let arbiters: Vec<Arbiter> = (0..options.threads.max(1))
        .map(|_| Arbiter::new())
        .collect();
    let links = Arbiter::new();
    // Attempts deploy (and restore their subtasks' state) on a thread of
    // their own, so that the gRPC service keeps answering meanwhile.
    let attempts = Arbiter::new();
    let handles: Vec<ArbiterHandle> = arbiters.iter().map(Arbiter::handle).collect();
    let link_arbiter = links.handle();
    let attempt_arbiter = attempts.handle();
    system.block_on(async move {
        let control = tokio::net::TcpListener::from_std(control)?;
        let bound = data.local_addr()?;
        let data_address = match &options.advertise {
            Some(host) => format!("{host}:{}", bound.port()),
            None => bound.to_string(),
        };
        let host = WorkerHost {
            rebuild,
            arbiters: handles,
            links: link_arbiter.clone(),
            attempts: attempt_arbiter,
            admission: LinkAdmission::default(),
            current: None,
            tls: options.tls.clone(),
        }
        .start();
        // Links are accepted (and their TLS taken) on the arbiter their
        // actors run on, the runtime their sockets stay registered with.
        let (acceptor, tls) = (host.clone(), options.tls.clone());
        link_arbiter.spawn(async move {
            match tokio::net::TcpListener::from_std(data) {
                Ok(data) => accept(data, acceptor, tls).await,
                Err(e) => {
                    tracing::error!("the worker's data port does not register: {e}");
                    System::current().stop();
                }
            }
        });
        let service = Service {
            host: host.clone(),
            data: data_address,
        };
        let address = control.local_addr()?;
        let incoming = TcpListenerStream::new(control);
        actix_rt::spawn(serve_control(incoming, service, options.tls.clone()));
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
    for arbiter in arbiters.into_iter().chain([links, attempts]) {
        arbiter.stop();
        let _ = arbiter.join();
    }
    Ok(())
}

/// Serves the gRPC service until it fails, which stops the worker.
async fn serve_control(incoming: TcpListenerStream, service: Service, tls: Option<MutualTls>) {
    // A driver gone without closing its call (its machine died) is noticed
    // by the keepalive, which ends the call and with it the attempt's
    // actors.
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        server = match server.tls_config(tls.server()) {
            Ok(server) => server,
            Err(e) => {
                tracing::error!("the worker's gRPC service takes no TLS: {e}");
                return System::current().stop();
            }
        };
    }
    let served = server
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(KEEPALIVE))
        .http2_keepalive_timeout(Some(KEEPALIVE * 3))
        .add_service(WorkerServer::new(service).max_decoding_message_size(MAX_CONTROL_MESSAGE))
        .serve_with_incoming(incoming)
        .await;
    if let Err(e) = served {
        tracing::error!("the worker's gRPC service failed: {e}");
        System::current().stop();
    }
}

/// Accepts links from peers and hands each, with the hello it opened
/// with, to the host. At most [`GREETING`] connections wait for their
/// hello at once: one more closes the one that has waited longest, so that
/// idle strangers hold little memory and a peer, which greets at once, is
/// not shut out by them.
async fn accept(listener: tokio::net::TcpListener, host: Addr<WorkerHost>, tls: Option<MutualTls>) {
    let mut greeting = std::collections::VecDeque::new();
    let mut evicted = 0u64;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, say: try again in a while
                // rather than spin.
                tracing::warn!("accepting links failed: {e}");
                actix_rt::time::sleep(HELLO_TIMEOUT / 100).await;
                continue;
            }
        };
        greeting.retain(|(_, task): &(_, tokio::task::JoinHandle<()>)| !task.is_finished());
        if greeting.len() >= GREETING {
            let (oldest, task) = greeting.pop_front().expect("GREETING > 0");
            task.abort();
            // A flood logs a line per doubling, not one per connection.
            evicted += 1;
            if evicted.is_power_of_two() {
                tracing::warn!(last = %oldest, "{evicted} links closed before their hello, to let newer ones greet");
            }
        }
        let (host, tls) = (host.clone(), tls.clone());
        let task = actix_rt::spawn(async move {
            match tokio::time::timeout(HELLO_TIMEOUT, hello(stream, tls)).await {
                Ok(Ok((key, link))) => host.do_send(Accepted { key, link }),
                Ok(Err(e)) => tracing::warn!(%peer, "a link was refused: {e}"),
                Err(_) => tracing::warn!(%peer, "a link sent no hello within {HELLO_TIMEOUT:?}"),
            }
        });
        greeting.push_back((peer, task));
    }
}

/// Takes a link's TLS handshake, if this worker has TLS, and reads its
/// first frame, which must be a hello (whose link it is), reading no more
/// than a hello can be.
async fn hello(
    stream: tokio::net::TcpStream,
    tls: Option<MutualTls>,
) -> Result<(LinkKey, Link), String> {
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut stream: LinkStream = match tls {
        Some(tls) => Box::new(tls.accept(stream).await.map_err(|e| format!("TLS: {e}"))?),
        None => Box::new(stream),
    };
    let mut read = Vec::new();
    let mut decoder = FrameDecoder::default();
    let mut buffer = [0; 4 + MAX_HELLO_BYTES as usize];
    let hello = loop {
        let n = stream.read(&mut buffer).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("closed before its hello".into());
        }
        read.extend_from_slice(&buffer[..n]);
        decoder.feed(&buffer[..n]);
        if let Some(hello) = decoder.next_hello().map_err(|e| e.to_string())? {
            break hello;
        }
    };
    Ok(((hello.run(), hello.from), (stream, read)))
}

/// Connections that may wait for their hello at once: a deployment's
/// peers dial one link each per attempt.
const GREETING: usize = 64;

/// How long a peer has to take its TLS handshake and send its hello once
/// connected.
const HELLO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

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
}

/// The process's state: which attempt it hosts, and links that arrived.
pub(crate) struct WorkerHost {
    rebuild: Rebuild,
    arbiters: Vec<ArbiterHandle>,
    links: ArbiterHandle,
    attempts: ArbiterHandle,
    /// Which attempt runs here, and the links that arrived for it.
    admission: LinkAdmission<Link, oneshot::Sender<Link>>,
    /// The actor of the attempt that runs here.
    current: Option<Addr<AttemptActor>>,
    /// What its links dial with.
    tls: Option<MutualTls>,
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
        let resources = attempt::Resources {
            host: actix::AsyncContext::address(ctx),
            rebuild: self.rebuild.clone(),
            arbiters: self.arbiters.clone(),
            links: self.links.clone(),
            tls: self.tls.clone(),
        };
        let open = Open {
            commands: call.commands,
            events: call.events,
        };
        AttemptActor::start_in_arbiter(&self.attempts, move |_| AttemptActor::new(open, resources));
    }
}

/// An attempt's actor → host: let me run, after stopping what ran here;
/// refused as `HostedAttempt` refuses, with why.
#[derive(Message)]
#[rtype(result = "Result<(), String>")]
pub(crate) struct Claim {
    pub run: RunAttempt,
    pub actor: Addr<AttemptActor>,
}

impl Handler<Claim> for WorkerHost {
    type Result = ResponseActFuture<Self, Result<(), String>>;

    fn handle(&mut self, claim: Claim, _ctx: &mut Context<Self>) -> Self::Result {
        if let attempts::Claim::Refused { hosting } = self.admission.claim(claim.run) {
            let refused = format!("this worker hosts {hosting}");
            return Box::pin(actix::fut::ready(Err(refused)));
        }
        let replaced = self.current.replace(claim.actor);
        self.admission.forget_waits(oneshot::Sender::is_closed);
        Box::pin(
            async move {
                if let Some(actor) = replaced {
                    let _ = actor.send(Stop).await;
                }
            }
            .into_actor(self)
            .map(|(), _, _| Ok(())),
        )
    }
}

/// An attempt's actor → host: the attempt ended here.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Release {
    pub run: RunAttempt,
    pub actor: Addr<AttemptActor>,
}

impl Handler<Release> for WorkerHost {
    type Result = ();

    fn handle(&mut self, ended: Release, _ctx: &mut Context<Self>) {
        if self.current.as_ref() == Some(&ended.actor) && self.admission.release(ended.run) {
            self.current = None;
            self.admission.forget_waits(oneshot::Sender::is_closed);
        }
    }
}

/// A link as accepted: its stream, and what was read of it with the
/// hello.
type Link = (LinkStream, Vec<u8>);

/// Data acceptor → host.
#[derive(Message)]
#[rtype(result = "()")]
struct Accepted {
    key: LinkKey,
    link: Link,
}

impl Handler<Accepted> for WorkerHost {
    type Result = ();

    fn handle(&mut self, accepted: Accepted, _ctx: &mut Context<Self>) {
        let (run, from) = accepted.key;
        match self.admission.arrived(accepted.key, accepted.link) {
            Handover::Deliver(waiter, link) => {
                let _ = waiter.send(link);
            }
            Handover::Refused(_, refusal) => {
                tracing::warn!("the link from worker {from} for {run} is refused: {refusal}")
            }
            Handover::Kept | Handover::Dropped(_) => {}
        }
    }
}

/// An attempt's actor → host: the link the peer of `key` dialed, once it
/// arrives.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct AwaitLink {
    pub key: LinkKey,
    pub reply: oneshot::Sender<Link>,
}

impl Handler<AwaitLink> for WorkerHost {
    type Result = ();

    /// Dropping the reply tells an attempt that a later one replaced it.
    fn handle(&mut self, wait: AwaitLink, _ctx: &mut Context<Self>) {
        if let Handover::Deliver(waiter, link) = self.admission.awaited(wait.key, wait.reply) {
            let _ = waiter.send(link);
        }
    }
}

#[cfg(test)]
mod tests;
