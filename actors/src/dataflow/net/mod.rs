//! The data plane between workers: one TCP link per pair of workers, its
//! frames (`tidemark_core::cluster::wire`) multiplexing every channel between them.
//!
//! A link's writer sends only what output endpoints released against
//! credit and the credits input endpoints grant, so its queue, the socket
//! and the peer's decoder never hold more batches than the consumers
//! granted. Its reader hands each event straight to the channel's input
//! endpoint (an unaligned barrier overtakes what that endpoint holds there,
//! as on a local channel) and each credit to the output endpoint.
//!
//! Today the workers are virtual: `Runtime::local_workers` spreads the
//! subtasks of one process over them and every channel between two of
//! them crosses a real loopback connection. Links run on an arbiter of
//! their own, so that a slow subtask never holds up the credits, batches
//! and unaligned barriers of the other channels between its workers.

use crate::messages::{Credit, Stop, SubtaskFailed, Transfer};
use crate::metrics::JobMetrics;
use actix::{
    Actor, ActorContext, ActorFutureExt, AsyncContext, Context, Handler, Recipient, WrapFuture,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tidemark_core::cluster::attempts::RunAttempt;
use tidemark_core::cluster::wire::{self, Frame, FrameDecoder, Hello, Inbound, WireError};
use tidemark_core::dataflow::error::TaskError;
use tidemark_core::model::event::ChannelEvent;
use tidemark_core::model::graph::JobGraph;
use tidemark_core::model::ids::{Attempt, ChannelId, SubtaskId};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// Bytes read from a link at a time.
const READ_BYTES: usize = 64 << 10;

/// Which worker hosts a subtask: its index modulo the number of workers,
/// so that every operator is spread over all of them.
#[derive(Clone, Copy, Debug)]
pub struct WorkerAssignment {
    workers: u32,
}

impl WorkerAssignment {
    /// Spreads over `workers`; 0 or 1 keeps every channel local.
    pub fn new(workers: u32) -> Self {
        WorkerAssignment {
            workers: workers.max(1),
        }
    }

    /// The worker hosting `subtask`.
    pub fn worker(&self, subtask: SubtaskId) -> u32 {
        subtask.index.0 % self.workers
    }

    /// The pair of workers a channel crosses, lower first; `None` within one.
    pub fn crossing(&self, channel: ChannelId) -> Option<(u32, u32)> {
        let (a, b) = (self.worker(channel.from), self.worker(channel.to));
        (a != b).then(|| (a.min(b), a.max(b)))
    }

    /// Whether any channel can cross between workers.
    pub fn spreads(&self) -> bool {
        self.workers > 1
    }
}

/// The workers of a job in this process: where each subtask goes, and
/// the arbiter the links between them run on, if any channel crosses.
pub struct Workers {
    pub placement: WorkerAssignment,
    pub links: Option<actix_rt::ArbiterHandle>,
}

/// Why a link failed its attempt.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("reading: {0}")]
    Read(std::io::Error),
    #[error("writing: {0}")]
    Write(std::io::Error),
    #[error("the socket does not register with the runtime: {0}")]
    Register(std::io::Error),
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("a frame for channel {0}, which does not cross here")]
    NotRouted(ChannelId),
    #[error("the peer closed the link ({0} bytes of a frame pending)")]
    Closed(usize),
}

/// Frames an endpoint puts on its link. Sending never blocks: what it
/// carries is bounded by credits, not by this queue.
#[derive(Clone, Debug)]
pub struct LinkSender {
    frames: mpsc::UnboundedSender<Vec<u8>>,
    /// Where failures go: the job's supervisor.
    failures: Recipient<SubtaskFailed>,
    attempt: Attempt,
}

impl LinkSender {
    /// The `seq`th event of `channel`, encoded here, on the producer's
    /// thread. A batch too large for a frame fails the attempt in the name
    /// of its producer. A link that is gone ended with its attempt or
    /// failed it.
    pub fn data(&self, channel: ChannelId, seq: u64, event: &ChannelEvent) {
        let mut frame = Vec::new();
        if let Err(e) = wire::encode_data(channel, seq, event, &mut frame) {
            return self.failures.do_send(SubtaskFailed {
                attempt: self.attempt,
                subtask: channel.from,
                error: TaskError::Protocol(format!("channel {channel}: {e}")),
            });
        }
        let _ = self.frames.send(frame);
    }

    /// Credits of `channel` for its producer.
    pub fn credit(&self, channel: ChannelId, credits: u32) {
        let mut frame = Vec::new();
        wire::encode_credit(channel, credits, &mut frame);
        let _ = self.frames.send(frame);
    }
}

/// The endpoints a link's reader delivers to, by channel.
#[derive(Default)]
pub struct Routes {
    /// Input endpoints of the channels whose consumer is on this side.
    pub inputs: HashMap<ChannelId, Recipient<Transfer>>,
    /// Output endpoints of the channels whose producer is on this side.
    pub outputs: HashMap<ChannelId, Recipient<Credit>>,
}

/// A link's bytes once opened on the links arbiter: TCP between workers
/// on a trusted network, TLS over it otherwise.
pub trait LinkIo: AsyncRead + AsyncWrite + Send + Unpin {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin> LinkIo for T {}

/// An opened link, TLS or not.
pub type LinkStream = Box<dyn LinkIo>;

/// A link's socket before its actor starts.
enum Socket {
    /// Made by [`loopback`] outside any runtime; its actor registers it.
    Loopback(std::net::TcpStream),
    /// Opened (and its TLS handshake taken) on the links arbiter, which
    /// its actor runs on, so that it stays with the runtime it was
    /// registered with.
    Opened(LinkStream),
}

/// One end of a link, before its actor starts: the socket, what was read
/// from it already (the peer's hello, when it was accepted), and the queue
/// its endpoints already write to.
pub struct LinkEnd {
    socket: Socket,
    read: Vec<u8>,
    /// The hello went out already, as soon as the link was dialed.
    greeted: bool,
    sender: LinkSender,
    queue: mpsc::UnboundedReceiver<Vec<u8>>,
    hello: Hello,
}

impl LinkEnd {
    /// The end of a loopback `stream` on worker `hello.from`.
    fn loopback(
        stream: std::net::TcpStream,
        hello: Hello,
        failures: &Recipient<SubtaskFailed>,
    ) -> std::io::Result<Self> {
        stream.set_nodelay(true)?;
        stream.set_nonblocking(true)?;
        Ok(LinkEnd::with(
            Socket::Loopback(stream),
            Vec::new(),
            hello,
            failures,
        ))
    }

    /// The end of a link opened on the links arbiter, on worker
    /// `hello.from`, whose peer's first bytes were `read` already.
    pub fn opened(
        stream: LinkStream,
        read: Vec<u8>,
        hello: Hello,
        failures: &Recipient<SubtaskFailed>,
    ) -> Self {
        LinkEnd::with(Socket::Opened(stream), read, hello, failures)
    }

    fn with(
        socket: Socket,
        read: Vec<u8>,
        hello: Hello,
        failures: &Recipient<SubtaskFailed>,
    ) -> Self {
        let (frames, queue) = mpsc::unbounded_channel();
        LinkEnd {
            socket,
            read,
            greeted: false,
            sender: LinkSender {
                frames,
                failures: failures.clone(),
                attempt: hello.attempt,
            },
            queue,
            hello,
        }
    }

    /// The end of a link whose hello was written when it was dialed, so
    /// that the peer can hand it to its attempt before this one is ready.
    pub fn greeted(self) -> Self {
        LinkEnd {
            greeted: true,
            ..self
        }
    }

    /// What the endpoints on this end's worker send through.
    pub fn sender(&self) -> LinkSender {
        self.sender.clone()
    }
}

/// The link ends a process hosts, by the pair of workers they link (lower
/// first) and the worker they belong to.
pub type LinkEnds = BTreeMap<((u32, u32), u32), LinkEnd>;

/// The pairs of workers that a channel of `graph` crosses.
pub fn crossings(graph: &JobGraph, placement: WorkerAssignment) -> BTreeSet<(u32, u32)> {
    graph
        .subtasks()
        .flat_map(|producer| graph.outputs(producer))
        .filter_map(|channel| placement.crossing(channel))
        .collect()
}

/// Both ends of every link `graph` needs between the workers of
/// `placement`, all in this process, over loopback.
pub fn loopback(
    graph: &JobGraph,
    placement: WorkerAssignment,
    run: RunAttempt,
    failures: &Recipient<SubtaskFailed>,
) -> std::io::Result<LinkEnds> {
    let mut ends = LinkEnds::new();
    for (a, b) in crossings(graph, placement) {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
        let dialed = std::net::TcpStream::connect(listener.local_addr()?)?;
        let (accepted, _) = listener.accept()?;
        let hello = |from, to| Hello::between(run, from, to);
        ends.insert(
            ((a, b), a),
            LinkEnd::loopback(dialed, hello(a, b), failures)?,
        );
        ends.insert(
            ((a, b), b),
            LinkEnd::loopback(accepted, hello(b, a), failures)?,
        );
    }
    Ok(ends)
}

/// A running end of a link. It stops with its attempt; an error on the
/// link, or the peer closing it, fails the attempt in the name of a
/// subtask the link feeds (the supervisor ignores it once the attempt is
/// over, which is when a peer closes a link on purpose).
pub struct LinkActor {
    end: Option<LinkEnd>,
    routes: Arc<Routes>,
    metrics: Arc<JobMetrics>,
    blame: SubtaskId,
}

impl LinkActor {
    pub fn new(
        end: LinkEnd,
        routes: Arc<Routes>,
        metrics: Arc<JobMetrics>,
        blame: SubtaskId,
    ) -> Self {
        LinkActor {
            end: Some(end),
            routes,
            metrics,
            blame,
        }
    }

    fn fail(&self, sender: &LinkSender, hello: Hello, error: LinkError, ctx: &mut Context<Self>) {
        sender.failures.do_send(SubtaskFailed {
            attempt: hello.attempt,
            subtask: self.blame,
            error: TaskError::Protocol(format!(
                "link of worker {} to worker {}: {error}",
                hello.from, hello.to
            )),
        });
        ctx.stop();
    }
}

impl Actor for LinkActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let LinkEnd {
            socket,
            read: already,
            greeted,
            sender,
            mut queue,
            hello,
        } = self.end.take().expect("a link starts once");
        let stream: LinkStream = match socket {
            Socket::Loopback(stream) => match tokio::net::TcpStream::from_std(stream) {
                Ok(stream) => Box::new(stream),
                Err(e) => return self.fail(&sender, hello, LinkError::Register(e), ctx),
            },
            Socket::Opened(stream) => stream,
        };
        let (mut read, write) = tokio::io::split(stream);
        let mut write = tokio::io::BufWriter::new(write);
        let metrics = self.metrics.clone();
        let writer = async move {
            if !greeted {
                let mut first = Vec::new();
                wire::encode_hello(&hello, &mut first);
                write.write_all(&first).await?;
                write.flush().await?;
            }
            let mut frames = Vec::new();
            while queue.recv_many(&mut frames, 256).await > 0 {
                for frame in frames.drain(..) {
                    write.write_all(&frame).await?;
                    metrics
                        .link_bytes_sent
                        .fetch_add(frame.len() as u64, Ordering::Relaxed);
                }
                if queue.is_empty() {
                    write.flush().await?;
                }
            }
            Ok(())
        };
        let failed = sender.clone();
        ctx.spawn(writer.into_actor(self).map(move |result, link, ctx| {
            if let Err(e) = result {
                link.fail(&failed, hello, LinkError::Write(e), ctx);
            }
        }));
        let routes = self.routes.clone();
        let expected = Hello {
            from: hello.to,
            to: hello.from,
            ..hello
        };
        let reader = async move {
            let mut decoder = FrameDecoder::default();
            let mut inbound = Inbound::new(expected);
            let mut buffer = vec![0; READ_BYTES];
            // What the acceptor read already (the hello, and what came
            // with it) is decoded before the next read.
            decoder.feed(&already);
            loop {
                while let Some(frame) = decoder.next_frame()? {
                    match inbound.accept(frame)? {
                        None | Some(Frame::Hello(_)) => {}
                        Some(Frame::Data { channel, event, .. }) => {
                            let input = routes
                                .inputs
                                .get(&channel)
                                .ok_or(LinkError::NotRouted(channel))?;
                            input.do_send(Transfer(event));
                        }
                        Some(Frame::Credit { channel, credits }) => {
                            let output = routes
                                .outputs
                                .get(&channel)
                                .ok_or(LinkError::NotRouted(channel))?;
                            output.do_send(Credit(credits));
                        }
                    }
                }
                let n = read.read(&mut buffer).await.map_err(LinkError::Read)?;
                if n == 0 {
                    return Err(LinkError::Closed(decoder.buffered()));
                }
                decoder.feed(&buffer[..n]);
            }
        };
        ctx.spawn(
            reader
                .into_actor(self)
                .map(move |result: Result<(), LinkError>, link, ctx| {
                    if let Err(e) = result {
                        link.fail(&sender, hello, e, ctx);
                    }
                }),
        );
    }
}

impl Handler<Stop> for LinkActor {
    type Result = ();

    fn handle(&mut self, _: Stop, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

#[cfg(test)]
mod tests;
