//! What a source subtask's head reads from: a [`Source`] opened at the
//! subtask's position, or the splits of a split source that the source
//! coordinator hands it ([`SourceReader`]), behind one interface.

use super::splits::{SplitBytes, SplitReader, SplitSource};
use super::{Source, SourceStatus};
use crate::checkpoint::entries::{SOURCE_POSITION, SOURCE_SPLITS};
use crate::dataflow::error::{TaskError, UserError};
use crate::model::ids::CheckpointId;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// A source subtask's input, as its chain's head drives it.
pub trait Reader<T>: Send {
    /// Appends at most `max` records to `out`.
    fn read(&mut self, out: &mut Vec<T>, max: usize) -> Result<SourceStatus, UserError>;

    /// Writes its progress at `checkpoint` into the operator-state
    /// `entries` of a snapshot.
    fn snapshot(
        &mut self,
        checkpoint: CheckpointId,
        entries: &mut BTreeMap<String, Vec<u8>>,
    ) -> Result<(), TaskError>;

    /// `checkpoint` completed: a split source learns the positions its
    /// snapshot held (Kafka commits them back as the group's offsets).
    fn notify_complete(&mut self, _checkpoint: CheckpointId) -> Result<(), UserError> {
        Ok(())
    }

    /// Before any read: resumes from the restored operator-state `entries`.
    fn restore(&mut self, entries: &BTreeMap<String, Vec<u8>>) -> Result<(), TaskError>;

    /// The source coordinator handed it `splits`.
    fn add_splits(&mut self, splits: Vec<SplitBytes>) -> Result<(), TaskError>;

    /// The source coordinator has no more splits for it.
    fn no_more_splits(&mut self) -> Result<(), TaskError>;

    /// Whether to ask the source coordinator for a split now; asked once
    /// until splits come.
    fn take_request(&mut self) -> bool;

    /// Split sources: it holds no split and waits for the coordinator,
    /// so nothing is to be read until splits come or it is told that none
    /// will.
    fn awaiting_splits(&self) -> bool {
        false
    }

    /// Split sources: the ids of the splits it holds, and of the one the
    /// last read's records came from, for watermarks per split.
    fn held_splits(&self) -> Option<(Vec<&str>, Option<&str>)> {
        None
    }
}

/// A [`Source`]: it reads the indices of the subtask's residue class, from
/// the position it was opened at.
pub struct Indexed<T>(pub Box<dyn Source<T>>);

impl<T> Reader<T> for Indexed<T> {
    fn read(&mut self, out: &mut Vec<T>, max: usize) -> Result<SourceStatus, UserError> {
        self.0.read(out, max)
    }

    fn snapshot(
        &mut self,
        _checkpoint: CheckpointId,
        entries: &mut BTreeMap<String, Vec<u8>>,
    ) -> Result<(), TaskError> {
        let position = rmp_serde::to_vec(&self.0.position())
            .map_err(|e| TaskError::Protocol(format!("cannot encode a source position: {e}")))?;
        entries.insert(SOURCE_POSITION.into(), position);
        Ok(())
    }

    /// The source was opened at the restored position already; state of a
    /// split source under its uid would be read again from the start.
    fn restore(&mut self, entries: &BTreeMap<String, Vec<u8>>) -> Result<(), TaskError> {
        match entries.contains_key(SOURCE_SPLITS) {
            true => Err(foreign_state("splits of a split source", "index source")),
            false => Ok(()),
        }
    }

    fn add_splits(&mut self, _splits: Vec<SplitBytes>) -> Result<(), TaskError> {
        Err(not_a_split_source())
    }

    fn no_more_splits(&mut self) -> Result<(), TaskError> {
        Err(not_a_split_source())
    }

    fn take_request(&mut self) -> bool {
        false
    }
}

/// A restored source state of the other kind than the source's: resuming
/// from it would read everything again.
fn foreign_state(held: &str, source: &str) -> TaskError {
    TaskError::Protocol(format!(
        "the restored state of this source holds {held}, written by another kind of source than \
         this {source} (an older build's generator, or another source under the same uid); \
         it cannot resume from it"
    ))
}

fn not_a_split_source() -> TaskError {
    TaskError::Protocol("a source coordinator wrote to a source without splits".into())
}

/// How many checkpoints' positions a reader keeps for their completion.
const MAX_PENDING_SNAPSHOTS: usize = 16;

/// A split a subtask reads: its id, and its reader.
type HeldSplit<T, S> = (String, Box<dyn SplitReader<T, S>>);

/// The splits one subtask of a split source reads: those the coordinator
/// handed it and those its restored state held. It reads them in turn, a
/// batch from each, drops a split once read, and asks for another when it
/// holds none; it ends when it holds none and the coordinator said that no
/// more will come.
pub struct SourceReader<T, S: SplitSource<T>> {
    source: Arc<S>,
    /// The splits being read, by id, the next to read from first.
    active: VecDeque<HeldSplit<T, S::Split>>,
    /// The split the last read's records came from.
    last: Option<String>,
    /// The positions each pending checkpoint's snapshot held, oldest
    /// first, for [`SplitSource::checkpoint_complete`].
    snapshots: VecDeque<(CheckpointId, Vec<S::Split>)>,
    /// It asked for a split and none came yet.
    requested: bool,
    /// It should ask now.
    request: bool,
    no_more_splits: bool,
}

impl<T, S: SplitSource<T>> SourceReader<T, S> {
    /// A reader holding no split yet.
    pub fn new(source: Arc<S>) -> Self {
        SourceReader {
            source,
            active: VecDeque::new(),
            last: None,
            snapshots: VecDeque::new(),
            requested: false,
            request: false,
            no_more_splits: false,
        }
    }

    fn open(&mut self, splits: &[SplitBytes]) -> Result<(), TaskError> {
        for split in splits {
            let typed = split.decode().map_err(TaskError::Protocol)?;
            let reader = self.source.open(typed).map_err(|e| {
                TaskError::Source(format!("cannot open split {}: {e}", split.id).into())
            })?;
            self.active.push_back((split.id.clone(), reader));
        }
        Ok(())
    }

    /// The splits it holds, at the positions read up to.
    pub fn splits(&self) -> Result<Vec<SplitBytes>, TaskError> {
        self.active
            .iter()
            .map(|(_, reader)| {
                SplitBytes::encode(&reader.split())
                    .map_err(|e| TaskError::Protocol(format!("cannot encode a split: {e}")))
            })
            .collect()
    }
}

impl<T, S: SplitSource<T>> Reader<T> for SourceReader<T, S> {
    /// A batch from the next split that has records, each split asked at
    /// most once.
    fn read(&mut self, out: &mut Vec<T>, max: usize) -> Result<SourceStatus, UserError> {
        let before = out.len();
        self.last = None;
        for _ in 0..self.active.len() {
            let Some((id, mut reader)) = self.active.pop_front() else {
                break;
            };
            let status = reader
                .read(out, max)
                .map_err(|e| -> UserError { format!("split {id}: {e}").into() })?;
            let read = out.len() > before;
            if read {
                self.last = Some(id.clone());
            }
            if status == SourceStatus::Running {
                self.active.push_back((id, reader));
            }
            if read {
                break;
            }
        }
        if !self.active.is_empty() {
            return Ok(SourceStatus::Running);
        }
        if self.no_more_splits {
            return Ok(SourceStatus::Finished);
        }
        if !self.requested {
            self.requested = true;
            self.request = true;
        }
        Ok(SourceStatus::Running)
    }

    fn snapshot(
        &mut self,
        checkpoint: CheckpointId,
        entries: &mut BTreeMap<String, Vec<u8>>,
    ) -> Result<(), TaskError> {
        let splits = rmp_serde::to_vec(&self.splits()?)
            .map_err(|e| TaskError::Protocol(format!("cannot encode source splits: {e}")))?;
        entries.insert(SOURCE_SPLITS.into(), splits);
        // Checkpoints that never complete must not pile up.
        while self.snapshots.len() >= MAX_PENDING_SNAPSHOTS {
            self.snapshots.pop_front();
        }
        let held = self.active.iter().map(|(_, reader)| reader.split());
        self.snapshots.push_back((checkpoint, held.collect()));
        Ok(())
    }

    /// Hands the source the positions of `checkpoint`'s snapshot; those of
    /// older checkpoints are superseded.
    fn notify_complete(&mut self, checkpoint: CheckpointId) -> Result<(), UserError> {
        while let Some((taken, splits)) = self.snapshots.pop_front() {
            if taken == checkpoint {
                return self.source.checkpoint_complete(&splits);
            }
            if taken > checkpoint {
                self.snapshots.push_front((taken, splits));
                break;
            }
        }
        Ok(())
    }

    fn restore(&mut self, entries: &BTreeMap<String, Vec<u8>>) -> Result<(), TaskError> {
        if entries.contains_key(SOURCE_POSITION) {
            return Err(foreign_state("an index source's position", "split source"));
        }
        let Some(bytes) = entries.get(SOURCE_SPLITS) else {
            return Ok(());
        };
        let splits: Vec<SplitBytes> = rmp_serde::from_slice(bytes)
            .map_err(|e| TaskError::Protocol(format!("malformed source splits: {e}")))?;
        self.open(&splits)
    }

    fn add_splits(&mut self, splits: Vec<SplitBytes>) -> Result<(), TaskError> {
        self.requested = false;
        self.open(&splits)
    }

    fn no_more_splits(&mut self) -> Result<(), TaskError> {
        self.no_more_splits = true;
        Ok(())
    }

    fn take_request(&mut self) -> bool {
        std::mem::take(&mut self.request)
    }

    fn awaiting_splits(&self) -> bool {
        self.active.is_empty() && !self.no_more_splits
    }

    fn held_splits(&self) -> Option<(Vec<&str>, Option<&str>)> {
        let held = self.active.iter().map(|(id, _)| id.as_str()).collect();
        Some((held, self.last.as_deref()))
    }
}

#[cfg(test)]
#[path = "reader_tests.rs"]
mod tests;
