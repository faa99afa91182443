//! The control plane between a job's driver (its supervisor and checkpoint
//! coordinator) and its worker processes: the gRPC service
//! `tidemark.v1.Worker` and what travels on it.
//!
//! One `Attempt` call per worker and attempt: the driver streams commands
//! (the deployment first, then triggers, notifications and the final
//! `Cancel`), the worker streams events back (acknowledgements, declines,
//! finished and failed subtasks, progress). Commands of one call reach the
//! worker's subtasks in the order they were sent, so a sink's commit is
//! handled before the stop that ends its attempt. Every envelope names its
//! attempt: a worker holds one attempt at a time and refuses older ones, so
//! a stale driver's commands never reach a newer attempt's subtasks.
//!
//! The envelopes are protobuf; what they carry is this crate's own types in
//! rmp-serde, as checkpoint state is, so that the handles of an
//! acknowledgement cross unchanged.

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use tidemark_core::checkpoint::{Ack, CompletedCheckpoint};
use tidemark_core::cluster::attempts::RunAttempt;
use tidemark_core::dataflow::source::SplitBytes;
use tidemark_core::model::event::Barrier;
use tidemark_core::model::graph::JobGraph;
use tidemark_core::model::ids::{Attempt, CheckpointId, JobId, OperatorId, SubtaskId};
use tidemark_core::time::TimeMarks;
use tokio::sync::mpsc;

/// The line a worker prints first on stdout, then its control address.
pub const LISTENING: &str = "tidemark worker listening on ";

/// How often each end of a control call checks the other is there.
pub(crate) const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(5);

/// The largest control message: a deployment carries the checkpoint it
/// restores, an acknowledgement a subtask's state handles (and inline
/// state), both above gRPC's default 4 MiB for large jobs.
pub(crate) const MAX_CONTROL_MESSAGE: usize = 1 << 30;

/// Commands for one worker's subtasks in the current attempt, in order:
/// the driver's end of the attempt's call.
#[derive(Clone)]
pub struct Commands {
    sender: mpsc::UnboundedSender<Command>,
    run: RunAttempt,
}

impl Commands {
    /// The commands of `run`'s call, and where the call takes them from.
    pub fn channel(run: RunAttempt) -> (Commands, mpsc::UnboundedReceiver<Command>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        (Commands { sender, run }, receiver)
    }

    /// Queues `command`; a call that ended ended with its attempt.
    pub fn send(&self, command: ToWorker) {
        let _ = self.sender.send(command.envelope(self.run));
    }
}

/// Nothing.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

/// What a worker tells about itself.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WorkerInfo {
    /// Where its peers open links to it.
    #[prost(string, tag = "1")]
    pub data_address: String,
    /// The build's version: a driver refuses a worker of another.
    #[prost(string, tag = "3")]
    pub version: String,
}

/// Driver → worker, within an `Attempt` call.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Command {
    #[prost(uint64, tag = "1")]
    pub job: u64,
    #[prost(uint32, tag = "2")]
    pub attempt: u32,
    /// A [`ToWorker`] in rmp-serde.
    #[prost(bytes = "vec", tag = "3")]
    pub body: Vec<u8>,
    /// The lease epoch of the driver's run, which the worker's state
    /// objects are named and fenced by.
    #[prost(uint64, tag = "4")]
    pub epoch: u64,
}

impl Command {
    /// The attempt the command is of.
    pub fn of(&self) -> RunAttempt {
        RunAttempt {
            job: JobId(self.job),
            epoch: self.epoch,
            attempt: Attempt(self.attempt),
        }
    }
}

/// Worker → driver, within an `Attempt` call.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    #[prost(uint32, tag = "1")]
    pub attempt: u32,
    /// A [`FromWorker`] in rmp-serde.
    #[prost(bytes = "vec", tag = "2")]
    pub body: Vec<u8>,
}

include!(concat!(env!("OUT_DIR"), "/tidemark.v1.Worker.rs"));

/// What the driver tells a worker.
#[derive(Debug, Serialize, Deserialize)]
pub enum ToWorker {
    /// Host this attempt's share of the job: first in every call.
    Deploy(Box<Deploy>),
    Trigger {
        subtask: SubtaskId,
        barrier: Barrier,
        suspend: bool,
    },
    Complete {
        subtask: SubtaskId,
        checkpoint: CheckpointId,
        rewrite: BTreeSet<String>,
    },
    Abort {
        subtask: SubtaskId,
        checkpoint: CheckpointId,
    },
    EndOfData {
        subtask: SubtaskId,
    },
    AddSplits {
        subtask: SubtaskId,
        splits: Vec<SplitBytes>,
    },
    NoMoreSplits {
        subtask: SubtaskId,
    },
    /// The attempt is over: stop its actors, answer `Stopped`.
    Cancel,
}

/// A worker's share of an attempt.
#[derive(Debug, Serialize, Deserialize)]
pub struct Deploy {
    /// How the worker's builder rebuilds the job: opaque to the runtime
    /// (the command line sends its arguments and `--config` text).
    pub recipe: Vec<u8>,
    /// The driver's job graph: a worker whose rebuilt job differs refuses.
    pub graph: JobGraph,
    /// This worker's index among `workers`.
    pub worker: u32,
    pub workers: u32,
    /// The data address of every worker, by index.
    pub peers: Vec<String>,
    pub restore: Option<RestoreSpec>,
}

/// The checkpoint an attempt restores from.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RestoreSpec {
    pub checkpoint: CompletedCheckpoint,
    /// Whether the job owns its files (one of its retained checkpoints).
    pub owned: bool,
    /// The savepoint directory it is in, when not the job's directory.
    pub dir: Option<String>,
}

/// What a worker tells the driver.
#[derive(Debug, Serialize, Deserialize)]
pub enum FromWorker {
    /// Its subtasks run.
    Deployed,
    Acknowledged(Box<Ack>),
    Declined {
        subtask: SubtaskId,
        checkpoint: CheckpointId,
        reason: String,
    },
    Exhausted {
        subtask: SubtaskId,
    },
    SplitRequested {
        subtask: SubtaskId,
    },
    Finished {
        subtask: SubtaskId,
    },
    Failed {
        subtask: SubtaskId,
        error: String,
    },
    /// Counters since the previous progress.
    Progress(Progress),
    /// Every actor of the attempt stopped: the last event of a call.
    Stopped,
}

/// Figures a worker counted since its previous report, added to the
/// driver's.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Progress {
    /// Records in and out, and nanoseconds backpressured, per subtask.
    pub subtasks: Vec<(SubtaskId, u64, u64, u64)>,
    /// Input watermarks (Flink's `currentInputWatermark`) that changed.
    #[serde(default)]
    pub watermarks: Vec<(SubtaskId, i64)>,
    /// Records read, per source operator.
    pub sources: Vec<(OperatorId, u64)>,
    pub link_bytes_sent: u64,
    /// In-flight batches the subtasks replayed from their restored state.
    pub restored_inflight_batches: u64,
    /// Timers, windows, joins and watermarks.
    pub time: TimeMarks,
}

/// Why a control message is refused.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("a control message does not decode: {0}")]
    Decode(#[from] rmp_serde::decode::Error),
    #[error("a command of {got}; this call serves {expected}")]
    Command {
        expected: RunAttempt,
        got: RunAttempt,
    },
    #[error("an event of attempt {}; this call serves attempt {}", .got.0, .expected.0)]
    Event { expected: Attempt, got: Attempt },
}

impl ToWorker {
    /// The envelope of this command of `run`.
    pub fn envelope(&self, run: RunAttempt) -> Command {
        Command {
            job: run.job.0,
            epoch: run.epoch,
            attempt: run.attempt.0,
            body: rmp_serde::to_vec_named(self).expect("commands are plain data"),
        }
    }

    /// The command in `envelope`, which must be of `run`.
    pub fn open(envelope: &Command, run: RunAttempt) -> Result<Self, ControlError> {
        if envelope.of() != run {
            return Err(ControlError::Command {
                expected: run,
                got: envelope.of(),
            });
        }
        Ok(rmp_serde::from_slice(&envelope.body)?)
    }
}

impl FromWorker {
    pub fn envelope(&self, attempt: Attempt) -> Event {
        Event {
            attempt: attempt.0,
            body: rmp_serde::to_vec_named(self).expect("events are plain data"),
        }
    }

    /// The event in `envelope`, which must be of `attempt`.
    pub fn open(envelope: &Event, attempt: Attempt) -> Result<Self, ControlError> {
        if envelope.attempt != attempt.0 {
            return Err(ControlError::Event {
                expected: attempt,
                got: Attempt(envelope.attempt),
            });
        }
        Ok(rmp_serde::from_slice(&envelope.body)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_of_another_job_run_or_attempt_is_refused() {
        let (attempt, run) = (
            Attempt(3),
            RunAttempt {
                job: JobId(7),
                epoch: 2,
                attempt: Attempt(3),
            },
        );
        let cancel = ToWorker::Cancel.envelope(run);
        assert!(matches!(ToWorker::open(&cancel, run), Ok(ToWorker::Cancel)));
        for other in [
            RunAttempt {
                job: JobId(8),
                ..run
            },
            RunAttempt { epoch: 1, ..run },
            RunAttempt {
                attempt: Attempt(4),
                ..run
            },
        ] {
            assert!(matches!(
                ToWorker::open(&cancel, other),
                Err(ControlError::Command { .. })
            ));
        }
        let stopped = FromWorker::Stopped.envelope(attempt);
        assert!(matches!(
            FromWorker::open(&stopped, Attempt(2)),
            Err(ControlError::Event { .. })
        ));
        let garbage = Event {
            attempt: 3,
            body: vec![0xc1],
        };
        assert!(matches!(
            FromWorker::open(&garbage, attempt),
            Err(ControlError::Decode(_))
        ));
    }
}
