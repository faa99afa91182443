//! Messages between the actors of a running job.

use crate::endpoint::{InputEndpoint, OutputEndpoint, Upstream};
use actix::{Addr, Message};
use tidemark::batch::Batch;
use tidemark::checkpoint::Ack;
use tidemark::error::TaskError;
use tidemark::event::{Barrier, ChannelEvent};
use tidemark::ids::{Attempt, CheckpointId, SubtaskId};

/// Output endpoint → its producer subtask: room for `credits` more batches.
#[derive(Message)]
#[rtype(result = "()")]
pub struct OutputCredit {
    pub channel: usize,
    pub credits: u32,
}

/// Producer subtask → output endpoint.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Push(pub ChannelEvent);

/// Producer subtask → output endpoint: an unaligned barrier, to send ahead of
/// every batch the endpoint holds; the reply is copies of those batches.
#[derive(Message)]
#[rtype(result = "Vec<Batch>")]
pub struct PushPriority(pub Barrier);

/// Output endpoint → input endpoint.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Transfer(pub ChannelEvent);

/// Input endpoint → output endpoint.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Credit(pub u32);

/// Input endpoint → consumer subtask.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Deliver {
    pub channel: usize,
    pub event: ChannelEvent,
}

/// Input endpoint → consumer subtask: an unaligned barrier, delivered ahead of
/// the batches the endpoint still holds (`overtaken`, copies; they follow).
#[derive(Message)]
#[rtype(result = "()")]
pub struct DeliverPriority {
    pub channel: usize,
    pub barrier: Barrier,
    pub overtaken: Vec<Batch>,
}

/// Consumer subtask → input endpoint: a delivered batch was processed.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Consumed;

/// Closes the cycle between an input endpoint and its sender.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ConnectUpstream(pub Upstream);

/// Supervisor → subtask: its endpoints exist; start.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Wire {
    pub outputs: Vec<Addr<OutputEndpoint>>,
    pub inputs: Vec<Addr<InputEndpoint>>,
}

/// Source subtask → itself: read the next batch.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Produce;

/// Subtask → supervisor: end of input processed and handed downstream.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SubtaskFinished {
    pub attempt: Attempt,
    pub subtask: SubtaskId,
}

/// Any actor of an attempt → supervisor.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SubtaskFailed {
    pub attempt: Attempt,
    pub subtask: SubtaskId,
    pub error: TaskError,
}

/// Supervisor → every actor of an attempt: the attempt is over.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Stop;

/// Coordinator → source subtask: inject this barrier.
#[derive(Message)]
#[rtype(result = "()")]
pub struct TriggerCheckpoint {
    pub barrier: Barrier,
    /// A savepoint that stops the job: emit nothing after its barrier
    /// unless it is aborted.
    pub suspend: bool,
}

/// Subtask → coordinator.
#[derive(Message)]
#[rtype(result = "()")]
pub struct AcknowledgeCheckpoint {
    pub attempt: Attempt,
    pub ack: Ack,
}

/// Subtask → coordinator: the subtask abandoned the checkpoint.
#[derive(Message)]
#[rtype(result = "()")]
pub struct DeclineCheckpoint {
    pub attempt: Attempt,
    pub checkpoint: CheckpointId,
    pub subtask: SubtaskId,
    pub reason: String,
}

/// Coordinator → subtasks: `checkpoint` completed; `rewrite` names the
/// shared files the subtask's next snapshot must upload again instead of
/// reusing (compaction of wasteful merged files).
#[derive(Message)]
#[rtype(result = "()")]
pub struct NotifyCheckpointComplete {
    pub checkpoint: CheckpointId,
    pub rewrite: std::collections::BTreeSet<String>,
}

/// Coordinator → subtasks.
#[derive(Message)]
#[rtype(result = "()")]
pub struct NotifyCheckpointAborted(pub CheckpointId);

/// Source subtask → coordinator: everything was read; the source waits for a
/// checkpoint that holds its final offset before it ends its output.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SourceExhausted {
    pub attempt: Attempt,
    pub subtask: SubtaskId,
}

/// Coordinator → source subtasks: a checkpoint holding every source's final
/// offset completed; end the output.
#[derive(Message)]
#[rtype(result = "()")]
pub struct EndInput;

/// Job handle → supervisor.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Cancel;

/// Supervisor → subtask: fail now, as a crash would (failure injection).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Kill;
