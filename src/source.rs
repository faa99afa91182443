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

/// A replayable source over items in memory: subtask j of p reads the items
/// at positions j, j + p, j + 2p, …; its offset counts the items it read.
pub struct Items<T> {
    items: std::sync::Arc<Vec<T>>,
    next: usize,
    step: usize,
    offset: u64,
}

impl<T> Items<T> {
    pub fn new(items: std::sync::Arc<Vec<T>>, ctx: SourceContext) -> Self {
        let step = ctx.parallelism as usize;
        Items {
            next: ctx.subtask.0 as usize + ctx.start_offset as usize * step,
            items,
            step,
            offset: ctx.start_offset,
        }
    }
}

impl<T: Clone + Send + Sync> Source<T> for Items<T> {
    fn read(&mut self, out: &mut Vec<T>, max: usize) -> Result<SourceStatus, UserError> {
        for _ in 0..max {
            let Some(item) = self.items.get(self.next) else {
                break;
            };
            out.push(item.clone());
            self.next += self.step;
            self.offset += 1;
        }
        Ok(if self.next >= self.items.len() {
            SourceStatus::Finished
        } else {
            SourceStatus::Running
        })
    }

    fn offset(&self) -> u64 {
        self.offset
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
        let ctx = |subtask, start_offset| SourceContext {
            subtask: crate::ids::SubtaskIndex(subtask),
            parallelism: 3,
            start_offset,
        };
        assert_eq!(
            read_all(&mut Items::new(items.clone(), ctx(1, 0))),
            [1, 4, 7]
        );
        let mut resumed = Items::new(items.clone(), ctx(0, 2));
        assert_eq!(read_all(&mut resumed), [6, 9]);
        assert_eq!(resumed.offset(), 4);
    }
}
