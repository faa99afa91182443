//! The data plane between workers: one TCP link per pair of workers, its
//! frames (`tidemark::wire`) multiplexing every channel between them.
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
//! them crosses a real loopback connection.

use crate::endpoint::{InputEndpoint, OutputEndpoint};
use crate::messages::{Credit, Stop, SubtaskFailed, Transfer};
use crate::supervisor::JobSupervisor;
use actix::Addr;
use actix::{Actor, ActorContext, ActorFutureExt, AsyncContext, Context, Handler, WrapFuture};
use std::collections::HashMap;
use std::sync::Arc;
use tidemark::error::TaskError;
use tidemark::event::ChannelEvent;
use tidemark::ids::{Attempt, ChannelId, JobId, SubtaskId};
use tidemark::wire::{self, Frame, FrameDecoder, Hello, Sequences};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// Bytes read from a link at a time.
const READ_BYTES: usize = 64 << 10;

/// Which worker hosts a subtask: its index modulo the number of workers,
/// so that every operator is spread over all of them.
#[derive(Clone, Copy, Debug)]
pub struct Placement {
    workers: u32,
}

impl Placement {
    /// Spreads over `workers`; 0 or 1 keeps every channel local.
    pub fn new(workers: u32) -> Self {
        Placement {
            workers: workers.max(1),
        }
    }

    pub fn worker(&self, subtask: SubtaskId) -> u32 {
        subtask.index.0 % self.workers
    }

    /// The pair of workers a channel crosses, lower first; `None` within one.
    pub fn crossing(&self, channel: ChannelId) -> Option<(u32, u32)> {
        let (a, b) = (self.worker(channel.from), self.worker(channel.to));
        (a != b).then(|| (a.min(b), a.max(b)))
    }
}

/// Frames an endpoint puts on its link. Sending never blocks: what it
/// carries is bounded by credits, not by this queue.
#[derive(Clone, Debug)]
pub struct LinkSender(mpsc::UnboundedSender<Vec<u8>>);

impl LinkSender {
    /// The `seq`th event of `channel`, encoded here, on the producer's
    /// thread. A link that is gone ended with its attempt or failed it.
    pub fn data(&self, channel: ChannelId, seq: u64, event: &ChannelEvent) {
        let mut frame = Vec::new();
        wire::encode_data(channel, seq, event, &mut frame);
        let _ = self.0.send(frame);
    }

    /// Credits of `channel` for its producer.
    pub fn credit(&self, channel: ChannelId, credits: u32) {
        let mut frame = Vec::new();
        wire::encode_credit(channel, credits, &mut frame);
        let _ = self.0.send(frame);
    }
}

/// The endpoints a link's reader delivers to, by channel.
#[derive(Default)]
pub struct Routes {
    pub inputs: HashMap<ChannelId, Addr<InputEndpoint>>,
    pub outputs: HashMap<ChannelId, Addr<OutputEndpoint>>,
}

/// One end of a link, before its actor starts: the socket, and the queue
/// its endpoints already write to.
pub struct LinkEnd {
    stream: std::net::TcpStream,
    sender: LinkSender,
    queue: mpsc::UnboundedReceiver<Vec<u8>>,
    hello: Hello,
}

impl LinkEnd {
    pub fn sender(&self) -> LinkSender {
        self.sender.clone()
    }
}

/// Connects workers `a` and `b` over loopback for `attempt`: the end of
/// `a`, which dialed, and the end of `b`.
pub fn connect_loopback(
    job: JobId,
    attempt: Attempt,
    (a, b): (u32, u32),
) -> std::io::Result<(LinkEnd, LinkEnd)> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    let dialed = std::net::TcpStream::connect(listener.local_addr()?)?;
    let (accepted, _) = listener.accept()?;
    let end = |stream: std::net::TcpStream, from, to| -> std::io::Result<LinkEnd> {
        stream.set_nodelay(true)?;
        stream.set_nonblocking(true)?;
        let (tx, queue) = mpsc::unbounded_channel();
        Ok(LinkEnd {
            stream,
            sender: LinkSender(tx),
            queue,
            hello: Hello {
                job,
                attempt,
                from,
                to,
            },
        })
    };
    Ok((end(dialed, a, b)?, end(accepted, b, a)?))
}

/// A running end of a link. It stops with its attempt; an error on the
/// link fails the attempt, in the name of a subtask the link feeds.
pub struct LinkActor {
    end: Option<LinkEnd>,
    routes: Arc<Routes>,
    supervisor: Addr<JobSupervisor>,
    blame: SubtaskId,
}

impl LinkActor {
    pub fn new(
        end: LinkEnd,
        routes: Arc<Routes>,
        supervisor: Addr<JobSupervisor>,
        blame: SubtaskId,
    ) -> Self {
        LinkActor {
            end: Some(end),
            routes,
            supervisor,
            blame,
        }
    }
}

impl Actor for LinkActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let LinkEnd {
            stream,
            sender: _,
            mut queue,
            hello,
        } = self.end.take().expect("a link starts once");
        let stream = match tokio::net::TcpStream::from_std(stream) {
            Ok(stream) => stream,
            Err(e) => return self.fail(hello, &format!("cannot register the socket: {e}"), ctx),
        };
        let (mut read, write) = stream.into_split();
        let mut write = tokio::io::BufWriter::new(write);
        let writer = async move {
            let mut first = Vec::new();
            wire::encode_hello(&hello, &mut first);
            write.write_all(&first).await?;
            write.flush().await?;
            let mut frames = Vec::new();
            while queue.recv_many(&mut frames, 256).await > 0 {
                for frame in frames.drain(..) {
                    write.write_all(&frame).await?;
                }
                if queue.is_empty() {
                    write.flush().await?;
                }
            }
            Ok::<_, std::io::Error>(())
        };
        ctx.spawn(writer.into_actor(self).map(move |result, link, ctx| {
            if let Err(e) = result {
                link.fail(hello, &format!("writing: {e}"), ctx);
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
            let mut due = Sequences::default();
            let mut greeted = false;
            let mut buffer = vec![0; READ_BYTES];
            loop {
                let n = read
                    .read(&mut buffer)
                    .await
                    .map_err(|e| format!("reading: {e}"))?;
                if n == 0 {
                    // The peer's end stopped with the attempt.
                    return Ok(());
                }
                decoder.feed(&buffer[..n]);
                while let Some(frame) = decoder.next_frame().map_err(|e| e.to_string())? {
                    match frame {
                        Frame::Hello(got) if !greeted && got == expected => greeted = true,
                        Frame::Hello(got) => {
                            return Err(format!("unexpected hello {got:?}, wanted {expected:?}"))
                        }
                        _ if !greeted => return Err("a frame before the hello".into()),
                        Frame::Data {
                            channel,
                            seq,
                            event,
                        } => {
                            due.check(channel, seq).map_err(|e| e.to_string())?;
                            let input = routes
                                .inputs
                                .get(&channel)
                                .ok_or_else(|| format!("data for channel {channel}, not ours"))?;
                            input.do_send(Transfer(event));
                        }
                        Frame::Credit { channel, credits } => {
                            let output = routes
                                .outputs
                                .get(&channel)
                                .ok_or_else(|| format!("credit for channel {channel}, not ours"))?;
                            output.do_send(Credit(credits));
                        }
                    }
                }
            }
        };
        ctx.spawn(
            reader
                .into_actor(self)
                .map(move |result, link, ctx| match result {
                    Ok(()) => ctx.stop(),
                    Err(e) => link.fail(hello, &e, ctx),
                }),
        );
    }
}

impl LinkActor {
    fn fail(&self, hello: Hello, error: &str, ctx: &mut Context<Self>) {
        self.supervisor.do_send(SubtaskFailed {
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

impl Handler<Stop> for LinkActor {
    type Result = ();

    fn handle(&mut self, _: Stop, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
