//! Sinks: where a job's results leave it.

use crate::error::UserError;
use crate::ids::SubtaskIndex;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SinkContext {
    pub subtask: SubtaskIndex,
    pub parallelism: u32,
}

pub trait Sink<T>: Send {
    /// The results of one input batch.
    fn write(&mut self, records: &mut Vec<T>) -> Result<(), UserError>;

    /// End of input: make everything written durable and visible.
    fn finish(&mut self) -> Result<(), UserError>;
}
