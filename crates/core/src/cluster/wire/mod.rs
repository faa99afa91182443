//! Channel events between processes, sans-IO: the frames one TCP link
//! between two workers carries, and their incremental decoder.
//!
//! A link multiplexes every channel between its two workers. What crosses
//! it is exactly what the output endpoint's `CreditSender` released (a
//! batch only against a credit, control events free but in order) and the
//! credits the input endpoint grants back, so nothing on the wire holds
//! more batches than the consumer granted, and an unaligned barrier still
//! finds the batches it overtakes in an endpoint's queue, not in a socket.
//!
//! A channel is named by its producer and consumer subtasks, which also
//! name its edge: a job graph never joins two operators by two edges
//! (`GraphError::DuplicateEdge`).
//!
//! A frame is a big-endian `u32` length (of what follows), a kind byte and
//! a body. Data frames carry a per-channel sequence number, checked on
//! arrival: a lost, repeated or reordered frame fails the attempt instead
//! of corrupting a checkpoint. A batch crosses encoded
//! once (its records as rmp-serde, as in channel state) and is decoded by
//! the consumer's operator, which alone knows the record type.

use crate::cluster::attempts::RunAttempt;
use crate::model::batch::{Batch, EncodedBatch};
use crate::model::event::{Barrier, ChannelEvent};
use crate::model::ids::{
    Attempt, ChannelId, CheckpointId, JobId, OperatorId, SubtaskId, SubtaskIndex,
};
use crate::time::WatermarkStatus;
use std::collections::HashMap;
use thiserror::Error;

/// Bytes a frame may declare; a longer one is refused before it is
/// buffered. `BatchLimits::max_bytes` counts records' in-memory size, not
/// what they own on the heap, so a batch of long strings can exceed it:
/// the sender refuses such a frame rather than the receiver.
pub const MAX_FRAME_BYTES: u32 = 256 << 20;

/// Bytes a hello frame may declare: its fields, with room to spare. An
/// acceptor reads no more than this from a peer before it knows whose
/// link it is, so that a stranger's header cannot make it buffer more.
pub const MAX_HELLO_BYTES: u32 = 64;

/// Wire format version, in every hello.
pub const VERSION: u16 = 2;

const MAGIC: [u8; 4] = *b"TDMK";

const KIND_HELLO: u8 = 0;
const KIND_DATA: u8 = 1;
const KIND_CREDIT: u8 = 2;

const EVENT_BATCH: u8 = 0;
const EVENT_BARRIER: u8 = 1;
const EVENT_CANCEL: u8 = 2;
const EVENT_WATERMARK: u8 = 3;
const EVENT_IDLE: u8 = 4;
const EVENT_ACTIVE: u8 = 5;
const EVENT_END: u8 = 6;

/// The first frame each end of a link sends: the two ends must
/// belong to the same attempt of the same job, so that no frame of an
/// older attempt ever reaches a newer one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The job.
    pub job: JobId,
    /// The lease epoch of the run of the job (attempts count from 0 in
    /// every run).
    pub epoch: u64,
    /// Its attempt.
    pub attempt: Attempt,
    /// The worker of the end that sends it.
    pub from: u32,
    /// The worker of the other end.
    pub to: u32,
}

impl Hello {
    /// The hello worker `from` sends worker `to` for `run`.
    pub fn between(run: RunAttempt, from: u32, to: u32) -> Self {
        Hello {
            job: run.job,
            epoch: run.epoch,
            attempt: run.attempt,
            from,
            to,
        }
    }

    /// The attempt the link belongs to.
    pub fn run(&self) -> RunAttempt {
        RunAttempt {
            job: self.job,
            epoch: self.epoch,
            attempt: self.attempt,
        }
    }
}

/// One decoded frame.
#[derive(Debug)]
pub enum Frame {
    /// Opens a link.
    Hello(Hello),
    /// An event of `channel`, producer to consumer.
    Data {
        /// The channel.
        channel: ChannelId,
        /// Position on the channel, from 0.
        seq: u64,
        /// The event.
        event: ChannelEvent,
    },
    /// Credits of `channel`, consumer to producer.
    Credit {
        /// The channel.
        channel: ChannelId,
        /// Batches the consumer can take beyond those granted before.
        credits: u32,
    },
}

/// A link that does not speak this protocol, or broke it, or a frame too
/// large to send: fatal to the link, never retried.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum WireError {
    /// A frame longer than [`MAX_FRAME_BYTES`].
    #[error("a frame of {0} bytes exceeds the limit of {MAX_FRAME_BYTES}")]
    Oversized(u32),
    /// A frame shorter than its kind requires.
    #[error("a truncated {0} frame")]
    Truncated(&'static str),
    /// A frame longer than its kind's fields.
    #[error("a {0} frame with bytes after its last field")]
    Trailing(&'static str),
    /// A frame of length 0, without even a kind.
    #[error("an empty frame")]
    Empty,
    /// An unknown frame kind.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// An unknown event tag in a data frame.
    #[error("unknown channel event tag {0}")]
    UnknownEvent(u8),
    /// A hello without Tidemark's magic or of another version.
    #[error("not a Tidemark link of wire version {VERSION}")]
    Foreign,
    /// A barrier that does not decode.
    #[error("a barrier does not decode: {0}")]
    Barrier(String),
    /// A hello from another job, attempt or worker than expected.
    #[error("the peer introduced itself as {got:?}, not {expected:?}")]
    Stranger {
        /// The hello that came.
        got: Hello,
        /// The one expected.
        expected: Hello,
    },
    /// A frame before the peer's hello.
    #[error("a frame before the peer's hello")]
    NoHello,
    /// A first frame longer than a hello can be.
    #[error("a first frame of {0} bytes, longer than a hello ({MAX_HELLO_BYTES})")]
    HelloOversized(u32),
    /// A data frame out of order on its channel.
    #[error("channel {channel}: frame {found} arrived where {expected} was due")]
    Sequence {
        /// The channel.
        channel: ChannelId,
        /// The next sequence number due.
        expected: u64,
        /// The one that arrived.
        found: u64,
    },
}

/// Appends the frame that opens a link.
pub fn encode_hello(hello: &Hello, out: &mut Vec<u8>) {
    let at = begin(out, KIND_HELLO);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_be_bytes());
    out.extend_from_slice(&hello.job.0.to_be_bytes());
    out.extend_from_slice(&hello.epoch.to_be_bytes());
    out.extend_from_slice(&hello.attempt.0.to_be_bytes());
    out.extend_from_slice(&hello.from.to_be_bytes());
    out.extend_from_slice(&hello.to.to_be_bytes());
    finish(out, at);
}

/// Appends the data frame of `event`, the `seq`th of `channel`. A batch
/// is encoded here, once, straight into the frame. A frame over
/// [`MAX_FRAME_BYTES`] is refused and nothing appended.
pub fn encode_data(
    channel: ChannelId,
    seq: u64,
    event: &ChannelEvent,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    let at = begin(out, KIND_DATA);
    put_channel(channel, out);
    out.extend_from_slice(&seq.to_be_bytes());
    match event {
        ChannelEvent::Batch(batch) => {
            out.push(EVENT_BATCH);
            out.extend_from_slice(&(batch.len() as u64).to_be_bytes());
            out.extend_from_slice(&(batch.bytes() as u64).to_be_bytes());
            batch.encode_into(out);
        }
        ChannelEvent::Barrier(barrier) => {
            out.push(EVENT_BARRIER);
            rmp_serde::encode::write(out, barrier).expect("a barrier serializes to memory");
        }
        ChannelEvent::CancelMarker(id) => {
            out.push(EVENT_CANCEL);
            out.extend_from_slice(&id.0.to_be_bytes());
        }
        ChannelEvent::Watermark(w) => {
            out.push(EVENT_WATERMARK);
            out.extend_from_slice(&w.to_be_bytes());
        }
        ChannelEvent::WatermarkStatus(WatermarkStatus::Idle) => out.push(EVENT_IDLE),
        ChannelEvent::WatermarkStatus(WatermarkStatus::Active) => out.push(EVENT_ACTIVE),
        ChannelEvent::EndOfPartition => out.push(EVENT_END),
    }
    let len = out.len() - at - 4;
    if len > MAX_FRAME_BYTES as usize {
        out.truncate(at);
        return Err(WireError::Oversized(len.min(u32::MAX as usize) as u32));
    }
    finish(out, at);
    Ok(())
}

/// Appends a credit frame of `channel`.
pub fn encode_credit(channel: ChannelId, credits: u32, out: &mut Vec<u8>) {
    let at = begin(out, KIND_CREDIT);
    put_channel(channel, out);
    out.extend_from_slice(&credits.to_be_bytes());
    finish(out, at);
}

/// Starts a frame of `kind`: a length to fill in by [`finish`].
fn begin(out: &mut Vec<u8>, kind: u8) -> usize {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    out.push(kind);
    at
}

fn finish(out: &mut [u8], at: usize) {
    let len = u32::try_from(out.len() - at - 4).expect("a frame within MAX_FRAME_BYTES");
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

fn put_channel(channel: ChannelId, out: &mut Vec<u8>) {
    for part in [
        channel.from.operator.0,
        channel.from.index.0,
        channel.to.operator.0,
        channel.to.index.0,
    ] {
        out.extend_from_slice(&part.to_be_bytes());
    }
}

/// Reads a frame's body front to back.
struct Body<'a> {
    bytes: &'a [u8],
    what: &'static str,
}

impl<'a> Body<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.bytes.len() < n {
            return Err(WireError::Truncated(self.what));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_be_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_be_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn channel(&mut self) -> Result<ChannelId, WireError> {
        let subtask = |operator, index| SubtaskId {
            operator: OperatorId(operator),
            index: SubtaskIndex(index),
        };
        Ok(ChannelId {
            from: subtask(self.u32()?, self.u32()?),
            to: subtask(self.u32()?, self.u32()?),
        })
    }

    /// Whatever is left: a frame's last field.
    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.bytes)
    }

    /// Refuses bytes after the last field.
    fn end(self) -> Result<(), WireError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(WireError::Trailing(self.what))
        }
    }
}

fn decode(kind: u8, bytes: &[u8]) -> Result<Frame, WireError> {
    let what = match kind {
        KIND_HELLO => "hello",
        KIND_DATA => "data",
        KIND_CREDIT => "credit",
        kind => return Err(WireError::UnknownKind(kind)),
    };
    let mut body = Body { bytes, what };
    let frame = match kind {
        KIND_HELLO => {
            if body.take(4)? != MAGIC || body.u16()? != VERSION {
                return Err(WireError::Foreign);
            }
            Frame::Hello(Hello {
                job: JobId(body.u64()?),
                epoch: body.u64()?,
                attempt: Attempt(body.u32()?),
                from: body.u32()?,
                to: body.u32()?,
            })
        }
        KIND_DATA => {
            let channel = body.channel()?;
            let seq = body.u64()?;
            let event = match body.u8()? {
                EVENT_BATCH => {
                    let len = body.u64()?;
                    let bytes = body.u64()?;
                    let data = body.rest().to_vec();
                    ChannelEvent::Batch(Batch::from(EncodedBatch { len, bytes, data }))
                }
                EVENT_BARRIER => {
                    let barrier: Barrier = rmp_serde::from_slice(body.rest())
                        .map_err(|e| WireError::Barrier(e.to_string()))?;
                    ChannelEvent::Barrier(barrier)
                }
                EVENT_CANCEL => ChannelEvent::CancelMarker(CheckpointId(body.u64()?)),
                EVENT_WATERMARK => ChannelEvent::Watermark(body.u64()?),
                EVENT_IDLE => ChannelEvent::WatermarkStatus(WatermarkStatus::Idle),
                EVENT_ACTIVE => ChannelEvent::WatermarkStatus(WatermarkStatus::Active),
                EVENT_END => ChannelEvent::EndOfPartition,
                tag => return Err(WireError::UnknownEvent(tag)),
            };
            Frame::Data {
                channel,
                seq,
                event,
            }
        }
        _ => Frame::Credit {
            channel: body.channel()?,
            credits: body.u32()?,
        },
    };
    body.end()?;
    Ok(frame)
}

/// Turns a byte stream, cut anywhere, back into frames.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buffer: Vec<u8>,
    /// Start of the first frame not yet decoded.
    start: usize,
}

impl FrameDecoder {
    /// Appends bytes read from the link.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start * 2 >= self.buffer.len() {
            self.buffer.drain(..self.start);
            self.start = 0;
        }
        self.buffer.extend_from_slice(bytes);
    }

    /// The next whole frame, if one has arrived. After an error the link
    /// is unusable.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, WireError> {
        let pending = &self.buffer[self.start..];
        let Some(header) = pending.get(..5) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes(header[..4].try_into().expect("4 bytes"));
        if len > MAX_FRAME_BYTES {
            return Err(WireError::Oversized(len));
        }
        if len == 0 {
            return Err(WireError::Empty);
        }
        let Some(frame) = pending.get(4..4 + len as usize) else {
            return Ok(None);
        };
        let decoded = decode(frame[0], &frame[1..]);
        self.start += 4 + len as usize;
        decoded.map(Some)
    }

    /// The link's first frame, which must be a hello, once it has arrived.
    /// A header that declares more than [`MAX_HELLO_BYTES`] is refused at
    /// once, before its body is waited for.
    pub fn next_hello(&mut self) -> Result<Option<Hello>, WireError> {
        let pending = &self.buffer[self.start..];
        if let Some(header) = pending.get(..4) {
            let len = u32::from_be_bytes(header.try_into().expect("4 bytes"));
            if len > MAX_HELLO_BYTES {
                return Err(WireError::HelloOversized(len));
            }
        }
        match self.next_frame()? {
            Some(Frame::Hello(hello)) => Ok(Some(hello)),
            Some(_) => Err(WireError::NoHello),
            None => Ok(None),
        }
    }

    /// Bytes received and not yet decoded: at the end of the stream, a
    /// frame cut off.
    pub fn buffered(&self) -> usize {
        self.buffer.len() - self.start
    }
}

/// What one end of a link accepts, in order: the peer's hello first, then
/// data frames in sequence on each channel, and credits.
#[derive(Debug)]
pub struct Inbound {
    expected: Hello,
    greeted: bool,
    /// The next sequence number due on each channel.
    due: HashMap<ChannelId, u64>,
}

impl Inbound {
    /// An end that waits for `expected` from its peer.
    pub fn new(expected: Hello) -> Self {
        Inbound {
            expected,
            greeted: false,
            due: HashMap::new(),
        }
    }

    /// Checks `frame` against what is due; returns it for delivery unless
    /// it was the hello.
    pub fn accept(&mut self, frame: Frame) -> Result<Option<Frame>, WireError> {
        match frame {
            Frame::Hello(got) if !self.greeted && got == self.expected => {
                self.greeted = true;
                Ok(None)
            }
            Frame::Hello(got) => Err(WireError::Stranger {
                got,
                expected: self.expected,
            }),
            _ if !self.greeted => Err(WireError::NoHello),
            Frame::Data { channel, seq, .. } => {
                let due = self.due.entry(channel).or_default();
                if *due != seq {
                    return Err(WireError::Sequence {
                        channel,
                        expected: *due,
                        found: seq,
                    });
                }
                *due += 1;
                Ok(Some(frame))
            }
            Frame::Credit { .. } => Ok(Some(frame)),
        }
    }
}

#[cfg(test)]
mod tests;
