//! Sources. A source is replayable: it reports the offset it has reached, and
//! a subtask can open it at a given offset, which is how a restore rewinds it.

use crate::error::UserError;
use crate::ids::SubtaskIndex;

/// Where a source subtask starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourceContext {
    pub subtask: SubtaskIndex,
    pub parallelism: u32,
    /// Offset to resume from: 0 on a fresh start.
    pub start_offset: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceStatus {
    /// More records may follow.
    Running,
    /// The source is exhausted.
    Finished,
}

pub trait Source<T>: Send {
    /// Appends at most `max` records to `out`.
    fn read(&mut self, out: &mut Vec<T>, max: usize) -> Result<SourceStatus, UserError>;

    /// Offset of the next record to read; opening the source at this offset
    /// resumes exactly after the records read so far.
    fn offset(&self) -> u64;
}
