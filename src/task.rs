//! The type-erased body of a subtask: a source or an input, followed by its
//! operator chain. The subtask actor drives it without knowing record types.

use crate::batch::{Batch, BatchLimits, Data};
use crate::error::TaskError;
use crate::graph::Partitioner;
use crate::ids::SubtaskIndex;
use crate::key_group::KeyGroupRange;
use crate::operator::{Downstream, Outgoing};
use crate::source::{Source, SourceStatus};

/// Everything a subtask's chain is built from.
#[derive(Clone, Debug)]
pub struct TaskContext {
    pub subtask: SubtaskIndex,
    pub parallelism: u32,
    pub max_parallelism: u32,
    pub key_groups: KeyGroupRange,
    pub batch_limits: BatchLimits,
    /// The edge this subtask feeds, if any: its partitioner and the
    /// consumer's parallelism and max parallelism.
    pub output: Option<OutputContext>,
    /// Offset a source resumes from.
    pub source_offset: u64,
}

#[derive(Clone, Copy, Debug)]
pub struct OutputContext {
    pub partitioner: Partitioner,
    pub channels: usize,
    pub consumer_parallelism: u32,
    pub consumer_max_parallelism: u32,
}

pub trait Task: Send {
    /// Sources only: read up to `max` records and push them through the chain.
    fn produce(&mut self, max: usize, out: &mut Outgoing) -> Result<Produced, TaskError>;

    /// Subtasks with input: push one batch through the chain.
    fn process(&mut self, batch: Batch, out: &mut Outgoing) -> Result<(), TaskError>;

    fn end_of_input(&mut self, out: &mut Outgoing) -> Result<(), TaskError>;
}

/// What one `produce` call read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Produced {
    pub records: usize,
    pub status: SourceStatus,
}

pub struct SourceTask<T> {
    source: Box<dyn Source<T>>,
    buffer: Vec<T>,
    next: Box<dyn Downstream<T>>,
}

impl<T> SourceTask<T> {
    pub fn new(source: Box<dyn Source<T>>, next: Box<dyn Downstream<T>>) -> Self {
        SourceTask {
            source,
            buffer: Vec::new(),
            next,
        }
    }
}

impl<T: Data> Task for SourceTask<T> {
    fn produce(&mut self, max: usize, out: &mut Outgoing) -> Result<Produced, TaskError> {
        let status = self
            .source
            .read(&mut self.buffer, max)
            .map_err(TaskError::Source)?;
        let records = self.buffer.len();
        for record in self.buffer.drain(..) {
            self.next.push(record);
        }
        self.next.flush(out)?;
        Ok(Produced { records, status })
    }

    fn process(&mut self, _batch: Batch, _out: &mut Outgoing) -> Result<(), TaskError> {
        Err(TaskError::Protocol(
            "a source subtask received a batch".into(),
        ))
    }

    fn end_of_input(&mut self, out: &mut Outgoing) -> Result<(), TaskError> {
        self.next.end_of_input(out)
    }
}

pub struct InputTask<T> {
    next: Box<dyn Downstream<T>>,
}

impl<T> InputTask<T> {
    pub fn new(next: Box<dyn Downstream<T>>) -> Self {
        InputTask { next }
    }
}

impl<T: Data> Task for InputTask<T> {
    fn produce(&mut self, _max: usize, _out: &mut Outgoing) -> Result<Produced, TaskError> {
        Err(TaskError::Protocol(
            "a subtask with input was asked to produce".into(),
        ))
    }

    fn process(&mut self, batch: Batch, out: &mut Outgoing) -> Result<(), TaskError> {
        for record in batch.into_records::<T>()? {
            self.next.push(record);
        }
        self.next.flush(out)
    }

    fn end_of_input(&mut self, out: &mut Outgoing) -> Result<(), TaskError> {
        self.next.end_of_input(out)
    }
}
