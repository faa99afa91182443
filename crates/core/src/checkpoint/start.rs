//! Where a job directory's runs last started from: the rule that keeps
//! `--restore latest` (and a standby driver taking over) from going back
//! past the savepoint or checkpoint a run was started from.
//!
//! A run told where to start (`--restore X`) records it in the job
//! directory with the first checkpoint id it uses ([`StartPoint`]), once
//! restored. The
//! directory's checkpoints before that id are older runs': a run stopped
//! with a savepoint, say, whose output its sink committed up to the
//! savepoint. Restoring one of them would write that output again. So a
//! later run that continues the job takes the checkpoints since the start,
//! newest first, and the start itself when there are none.

use super::Restore;
use crate::model::ids::CheckpointId;
use serde::{Deserialize, Serialize};

/// The start a run was told, as `_start` in its job directory keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartPoint {
    /// Where the run was told to start: a checkpoint of the directory or
    /// a savepoint.
    pub from: StartFrom,
    /// The first checkpoint id the run used.
    pub first: CheckpointId,
}

/// A restore a run can be told: [`Restore`] without its fresh and latest
/// cases.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StartFrom {
    /// [`Restore::Checkpoint`].
    Checkpoint(CheckpointId),
    /// [`Restore::Savepoint`].
    Savepoint(String),
}

/// What a run restores, given what it was told and the directory's start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Start {
    /// Nothing.
    Fresh,
    /// The retained checkpoints with ids from `since` on (all, if `None`),
    /// newest first; then, if there are none, `or`.
    Continue {
        /// The first id of the run the directory last started.
        since: Option<CheckpointId>,
        /// Where that run started.
        or: Option<StartFrom>,
    },
    /// Where it was told: the run records it as the directory's start.
    At(StartFrom),
}

/// What a run told `restore` does in a directory whose last start was
/// `start`.
pub fn decide(restore: &Restore, start: Option<&StartPoint>) -> Start {
    match restore {
        Restore::Fresh => Start::Fresh,
        Restore::Latest => Start::Continue {
            since: start.map(|s| s.first),
            or: start.map(|s| s.from.clone()),
        },
        Restore::Checkpoint(id) => Start::At(StartFrom::Checkpoint(*id)),
        Restore::Savepoint(url) => Start::At(StartFrom::Savepoint(url.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started(from: StartFrom, first: u64) -> StartPoint {
        StartPoint {
            from,
            first: CheckpointId(first),
        }
    }

    #[test]
    fn latest_continues_from_the_last_start_never_before_it() {
        let savepoint = StartFrom::Savepoint("s3://b/savepoints/sp-6".into());
        let start = started(savepoint.clone(), 7);
        assert_eq!(
            decide(&Restore::Latest, Some(&start)),
            Start::Continue {
                since: Some(CheckpointId(7)),
                or: Some(savepoint)
            }
        );
        assert_eq!(
            decide(&Restore::Latest, None),
            Start::Continue {
                since: None,
                or: None
            }
        );
        assert_eq!(decide(&Restore::Fresh, Some(&start)), Start::Fresh);
    }

    #[test]
    fn a_told_start_is_a_new_start() {
        let start = started(StartFrom::Savepoint("/savepoints/sp-6".into()), 7);
        assert_eq!(
            decide(&Restore::Checkpoint(CheckpointId(3)), Some(&start)),
            Start::At(StartFrom::Checkpoint(CheckpointId(3)))
        );
        let told = Restore::Savepoint("/savepoints/sp-6".into());
        assert_eq!(
            decide(&told, Some(&start)),
            Start::At(StartFrom::Savepoint("/savepoints/sp-6".into()))
        );
    }
}
