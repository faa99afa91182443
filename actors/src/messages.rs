//! Messages between the actors of a running job.

use crate::control::ToWorker;
use actix::{Actor, Addr, Context, Handler, Message, Recipient};
use tidemark_core::checkpoint::Ack;
use tidemark_core::dataflow::error::TaskError;
use tidemark_core::dataflow::source::SplitBytes;
use tidemark_core::model::batch::Batch;
use tidemark_core::model::event::{Barrier, ChannelEvent};
use tidemark_core::model::ids::{Attempt, CheckpointId, SubtaskId};

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
pub struct EndOfData;

/// Split source subtask → the host of its source coordinator (through the
/// supervisor): it holds no split; hand it one.
#[derive(Clone, Copy, Debug, Message)]
#[rtype(result = "()")]
pub struct SplitRequest {
    pub attempt: Attempt,
    pub subtask: SubtaskId,
}

/// Source coordinator → split source subtask: read these splits too.
#[derive(Message)]
#[rtype(result = "()")]
pub struct AddSplits(pub Vec<SplitBytes>);

/// Source coordinator → split source subtask: no split will come; end once
/// those held are read.
#[derive(Message)]
#[rtype(result = "()")]
pub struct NoMoreSplits;

/// Job handle → supervisor.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Cancel;

/// Lease renewal → supervisor: a newer run took the job directory over,
/// which no restart mends.
#[derive(Message)]
#[rtype(result = "()")]
pub struct LeaseTakenOver(pub tidemark_storage::StorageError);

/// Coordinator → supervisor: checkpoints failed more often than tolerated.
#[derive(Message)]
#[rtype(result = "()")]
pub struct CheckpointingFailed(pub String);

/// A worker process started its share of the attempt: records flow once
/// every worker has.
#[derive(Message)]
#[rtype(result = "()")]
pub struct WorkerDeployed(pub Attempt);

/// Supervisor → subtask: fail now, as a crash would (failure injection).
#[derive(Clone, Copy, Debug, Message)]
#[rtype(result = "()")]
pub struct Kill {
    /// Which injected failure this is, from 1.
    pub failure: usize,
    /// How many the job injects in all.
    pub of: usize,
}

/// Where a subtask reports how it ended: the job's supervisor in the same
/// process, or the worker process that sends it on.
#[derive(Clone)]
pub struct Reports {
    pub failed: Recipient<SubtaskFailed>,
    pub finished: Recipient<SubtaskFinished>,
    pub split_requested: Recipient<SplitRequest>,
}

impl Reports {
    pub fn to<A>(addr: &Addr<A>) -> Self
    where
        A: Actor<Context = Context<A>>
            + Handler<SubtaskFailed>
            + Handler<SubtaskFinished>
            + Handler<SplitRequest>,
    {
        Reports {
            failed: addr.clone().recipient(),
            finished: addr.clone().recipient(),
            split_requested: addr.clone().recipient(),
        }
    }
}

/// Where a subtask reports on checkpoints: the checkpoint coordinator in
/// the same process, or the worker process that sends it on.
#[derive(Clone)]
pub struct CheckpointReports {
    pub acknowledged: Recipient<AcknowledgeCheckpoint>,
    pub declined: Recipient<DeclineCheckpoint>,
    pub exhausted: Recipient<SourceExhausted>,
}

impl CheckpointReports {
    pub fn to<A>(addr: &Addr<A>) -> Self
    where
        A: Actor<Context = Context<A>>
            + Handler<AcknowledgeCheckpoint>
            + Handler<DeclineCheckpoint>
            + Handler<SourceExhausted>,
    {
        CheckpointReports {
            acknowledged: addr.clone().recipient(),
            declined: addr.clone().recipient(),
            exhausted: addr.clone().recipient(),
        }
    }
}

/// A message for a subtask, and the command it is for one on a worker.
pub trait ToSubtask: Message<Result = ()> + Send + 'static {
    fn remote(self, subtask: SubtaskId) -> ToWorker;
}

impl ToSubtask for TriggerCheckpoint {
    fn remote(self, subtask: SubtaskId) -> ToWorker {
        ToWorker::Trigger {
            subtask,
            barrier: self.barrier,
            suspend: self.suspend,
        }
    }
}

impl ToSubtask for NotifyCheckpointComplete {
    fn remote(self, subtask: SubtaskId) -> ToWorker {
        ToWorker::Complete {
            subtask,
            checkpoint: self.checkpoint,
            rewrite: self.rewrite,
        }
    }
}

impl ToSubtask for NotifyCheckpointAborted {
    fn remote(self, subtask: SubtaskId) -> ToWorker {
        ToWorker::Abort {
            subtask,
            checkpoint: self.0,
        }
    }
}

impl ToSubtask for EndOfData {
    fn remote(self, subtask: SubtaskId) -> ToWorker {
        ToWorker::EndOfData { subtask }
    }
}

impl ToSubtask for AddSplits {
    fn remote(self, subtask: SubtaskId) -> ToWorker {
        ToWorker::AddSplits {
            subtask,
            splits: self.0,
        }
    }
}

impl ToSubtask for NoMoreSplits {
    fn remote(self, subtask: SubtaskId) -> ToWorker {
        ToWorker::NoMoreSplits { subtask }
    }
}
