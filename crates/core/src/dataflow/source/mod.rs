//! Sources. A [`Source`] is replayable: it reads records by index as its
//! [`Split`] assigns them, reports the split's position, and a subtask can
//! open it at a position, which is how a restore rewinds it, at the same or
//! another parallelism. A [`SplitSource`] reads splits that a coordinator
//! discovers and hands out ([`splits`]).

pub mod coordinator;
pub mod reader;
pub mod splits;

pub use splits::{
    BoxFuture, Discovery, DiscoveryFuture, SourceSplit, SplitBytes, SplitEnumerator, SplitReader,
    SplitSource,
};

use crate::dataflow::error::UserError;
use crate::model::ids::SubtaskIndex;
use crate::model::split::{Split, SplitPosition};

/// Where a source subtask starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceContext {
    /// Which source subtask this is.
    pub subtask: SubtaskIndex,
    /// How many source subtasks share the records.
    pub parallelism: u32,
    /// Position to resume from: `None` on a fresh start.
    pub start: Option<SplitPosition>,
}

impl SourceContext {
    /// The indices this subtask reads, from where it starts.
    pub fn split(&self) -> Split {
        Split::new(self.subtask.0, self.parallelism, self.start.clone())
    }
}

/// What a [`Source::read`] says about the records after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceStatus {
    /// More records may follow.
    Running,
    /// The source is exhausted.
    Finished,
}

/// A replayable source of records of type `T`, one per source subtask.
/// Exactly-once rests on [`position`](Source::position): opening the source
/// at a checkpointed position must read exactly the records after it.
pub trait Source<T>: Send {
    /// Appends at most `max` records to `out`.
    fn read(&mut self, out: &mut Vec<T>, max: usize) -> Result<SourceStatus, UserError>;

    /// Position of the split after the records read so far; opening the
    /// source at it resumes exactly after them.
    fn position(&self) -> SplitPosition;
}

/// A replayable source over items in memory, item i being index i.
pub struct Items<T> {
    items: std::sync::Arc<Vec<T>>,
    split: Split,
}

impl<T> Items<T> {
    /// This subtask's share of `items`, from where `ctx` starts it.
    pub fn new(items: std::sync::Arc<Vec<T>>, ctx: SourceContext) -> Self {
        Items {
            items,
            split: ctx.split(),
        }
    }
}

impl<T: Clone + Send + Sync> Source<T> for Items<T> {
    fn read(&mut self, out: &mut Vec<T>, max: usize) -> Result<SourceStatus, UserError> {
        for _ in 0..max {
            let Some(item) = usize::try_from(self.split.peek())
                .ok()
                .and_then(|i| self.items.get(i))
            else {
                break;
            };
            out.push(item.clone());
            self.split.advance();
        }
        Ok(if self.split.peek() >= self.items.len() as u64 {
            SourceStatus::Finished
        } else {
            SourceStatus::Running
        })
    }

    fn position(&self) -> SplitPosition {
        self.split.position().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn read_all(source: &mut Items<u32>) -> Vec<u32> {
        let mut out = Vec::new();
        while source.read(&mut out, 2).unwrap() == SourceStatus::Running {}
        out
    }

    #[test]
    fn items_split_by_subtask_and_resume_at_an_offset() {
        let items = Arc::new((0..10).collect::<Vec<u32>>());
        let ctx = |subtask, start| SourceContext {
            subtask: crate::model::ids::SubtaskIndex(subtask),
            parallelism: 3,
            start,
        };
        assert_eq!(
            read_all(&mut Items::new(items.clone(), ctx(1, None))),
            [1, 4, 7]
        );
        let mut first = Items::new(items.clone(), ctx(0, None));
        first.read(&mut Vec::new(), 2).unwrap();
        let mut resumed = Items::new(items.clone(), ctx(0, Some(first.position())));
        assert_eq!(read_all(&mut resumed), [6, 9]);
        assert_eq!(resumed.position().next, 12);
    }
}
