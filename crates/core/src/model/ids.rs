//! Newtype identifiers, so that an operator index can never be passed where a
//! subtask index or a checkpoint id is expected.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident($inner:ty), $fmt:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub struct $name(pub $inner);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, $fmt, self.0)
            }
        }
    };
}

id_type!(
    /// A job, by a hash of its name, so that every run of it finds the same
    /// directory in checkpoint storage.
    JobId(u64),
    "job-{:016x}"
);
id_type!(
    /// Position of an operator in its `JobGraph`.
    OperatorId(u32),
    "op-{}"
);
id_type!(
    /// Index of a parallel instance of an operator, `0..parallelism`.
    SubtaskIndex(u32),
    "#{}"
);
id_type!(
    /// Checkpoint ids strictly increase over the life of a job.
    CheckpointId(u64),
    "chk-{}"
);
id_type!(
    /// Unit of keyed-state partitioning, `0..max_parallelism`.
    KeyGroup(u32),
    "kg-{}"
);
id_type!(
    /// Deployment generation: bumped on every restart, so that messages of an
    /// older attempt can be recognised and dropped.
    Attempt(u32),
    "attempt-{}"
);

/// One subtask of one operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SubtaskId {
    /// The operator of the `JobGraph` (which is a whole chain).
    pub operator: OperatorId,
    /// Which parallel instance.
    pub index: SubtaskIndex,
}

impl fmt::Display for SubtaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.operator, self.index)
    }
}

/// A channel of an edge: from one producer subtask to one consumer subtask.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ChannelId {
    /// The producer.
    pub from: SubtaskId,
    /// The consumer.
    pub to: SubtaskId,
}

impl fmt::Display for ChannelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}->{}", self.from, self.to)
    }
}
