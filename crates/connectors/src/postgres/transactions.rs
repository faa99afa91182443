//! The sink's decisions, without IO: which transactions to prepare, commit
//! and roll back, when rows may be written, and the rows waiting to be.

use super::{Mode, SqlType, Value};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use tidemark_core::model::ids::CheckpointId;
use tidemark_core::SinkContext;

/// The name of the transaction `subtask` prepares at `checkpoint`'s
/// barrier.
pub(crate) fn transaction_name(prefix: &str, subtask: u32, checkpoint: CheckpointId) -> String {
    format!("{prefix}:{subtask}:{}", checkpoint.0)
}

/// The subtask and checkpoint of one of `prefix`'s transactions.
fn parse_name(prefix: &str, name: &str) -> Option<(u32, CheckpointId)> {
    let (subtask, checkpoint) = name
        .strip_prefix(prefix)?
        .strip_prefix(':')?
        .split_once(':')?;
    Some((
        subtask.parse().ok()?,
        CheckpointId(checkpoint.parse().ok()?),
    ))
}

/// What a restore does with a prepared transaction it finds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Resolution {
    Commit,
    RollBack,
}

/// Which of the prepared transactions `found` a restore of the state
/// `restored` resolves, and how. Every transaction newer than the restored
/// checkpoint rolls back, whoever prepared it (its records are replayed;
/// two subtasks may both try, the loser finds it gone). Those of the old
/// subtask that wrote the state, up to the checkpoint, commit if the
/// checkpoint lists them, and roll back if not: an attempt that outlived
/// its successor's restore prepared them. Old subtask j's are resolved by
/// new subtask j, or by subtask 0 through the state it adopts when a
/// rescale removed j. Without state (a fresh start, or a subtask the
/// checkpoint did not have) subtask `ctx.subtask` rolls back its own
/// index's, and subtask 0 those of indices past the parallelism: no
/// checkpoint lists them.
pub(crate) fn resolve<'a>(
    found: &'a [String],
    prefix: &str,
    restored: Option<&Committable>,
    ctx: SinkContext,
) -> Vec<(&'a str, Resolution)> {
    let subtask = ctx.subtask.0;
    found
        .iter()
        .filter_map(|name| {
            let (old, checkpoint) = parse_name(prefix, name)?;
            let resolution = match restored {
                Some(r) if checkpoint.0 > r.checkpoint => Resolution::RollBack,
                Some(r) if old == r.subtask && r.prepared.contains(&checkpoint.0) => {
                    Resolution::Commit
                }
                Some(r) if old == r.subtask => Resolution::RollBack,
                None if old == subtask || (subtask == 0 && old >= ctx.parallelism) => {
                    Resolution::RollBack
                }
                _ => return None,
            };
            Some((name.as_str(), resolution))
        })
        .collect()
}

/// What a sink subtask does at a barrier.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AtBarrier {
    /// Prepare the open transaction under this name.
    Prepare(String),
    /// Nothing was written since the last barrier.
    Nothing,
    /// The rows since are held (upsert mode, behind a prepared
    /// transaction): they go into the checkpoint.
    Hold,
}

/// One sink subtask's transactions.
pub(crate) struct Transactions {
    mode: Mode,
    prefix: String,
    subtask: u32,
    /// Checkpoints whose transaction is prepared, not yet committed,
    /// oldest first.
    prepared: VecDeque<CheckpointId>,
    /// Whether the open transaction holds rows.
    open: bool,
}

impl Transactions {
    pub(crate) fn new(mode: Mode, prefix: &str, subtask: u32) -> Self {
        Transactions {
            mode,
            prefix: prefix.to_owned(),
            subtask,
            prepared: VecDeque::new(),
            open: false,
        }
    }

    /// Whether rows may be written now. In upsert mode they wait while a
    /// transaction of this subtask is prepared: their keys would wait on
    /// its locks, and it commits only after the next barrier, which waits
    /// for them.
    pub(crate) fn may_write(&self) -> bool {
        self.mode == Mode::Append || self.prepared.is_empty()
    }

    /// Rows are about to be written: whether a transaction begins first.
    pub(crate) fn write(&mut self) -> bool {
        debug_assert!(
            self.may_write(),
            "rows written behind a prepared transaction"
        );
        !std::mem::replace(&mut self.open, true)
    }

    /// `checkpoint`'s barrier, after every row that may be written was.
    pub(crate) fn barrier(&mut self, checkpoint: CheckpointId) -> AtBarrier {
        if !self.may_write() {
            return AtBarrier::Hold;
        }
        if !std::mem::replace(&mut self.open, false) {
            return AtBarrier::Nothing;
        }
        self.prepared.push_back(checkpoint);
        AtBarrier::Prepare(transaction_name(&self.prefix, self.subtask, checkpoint))
    }

    /// The checkpoints of the transactions prepared and not yet committed.
    pub(crate) fn prepared(&self) -> Vec<u64> {
        self.prepared.iter().map(|c| c.0).collect()
    }

    /// `checkpoint` completed: the prepared transactions to commit, those
    /// of it and every earlier one.
    pub(crate) fn completed(&mut self, checkpoint: CheckpointId) -> Vec<String> {
        let mut due = Vec::new();
        while self.prepared.front().is_some_and(|c| *c <= checkpoint) {
            let c = self.prepared.pop_front().expect("just seen");
            due.push(transaction_name(&self.prefix, self.subtask, c));
        }
        due
    }

    /// End of input, after every prepared transaction committed and the
    /// last rows were written: whether the open transaction commits.
    pub(crate) fn close(&mut self) -> bool {
        debug_assert!(
            self.prepared.is_empty(),
            "closed with prepared transactions"
        );
        std::mem::replace(&mut self.open, false)
    }
}

/// What a sink subtask keeps in a checkpoint: what a restore commits, and
/// the rows it held back.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Committable {
    /// The sink subtask that wrote it.
    pub subtask: u32,
    pub checkpoint: u64,
    /// The checkpoints of its transactions prepared and not yet committed
    /// at the barrier, this one's included.
    pub prepared: Vec<u64>,
    /// Flat rows, as [`Rows`] keeps them.
    pub held: Vec<Value>,
}

/// The rows of a subtask not yet sent; in upsert mode one per key, the
/// latest, since one statement may not update a row twice.
pub(crate) struct Rows {
    arity: usize,
    values: Vec<Value>,
    /// Upsert mode: the key's columns, and where each key's row is.
    keys: Option<(usize, HashMap<Vec<Value>, usize>)>,
}

/// One column of rows, as a statement binds it.
#[derive(Debug, PartialEq)]
pub(crate) enum ColumnValues {
    BigInt(Vec<i64>),
    Text(Vec<String>),
}

impl Rows {
    pub(crate) fn new(arity: usize, mode: Mode, key_columns: usize) -> Self {
        Rows {
            arity,
            values: Vec::new(),
            keys: (mode == Mode::Upsert).then(|| (key_columns, HashMap::new())),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.values.len() / self.arity
    }

    /// Adds the row of the values in `row`, which it takes.
    pub(crate) fn push(&mut self, row: &mut Vec<Value>) -> Result<(), String> {
        if row.len() != self.arity {
            let found = row.len();
            row.clear();
            return Err(format!(
                "a row of {found} values for {} columns",
                self.arity
            ));
        }
        let Some((key_columns, index)) = &mut self.keys else {
            self.values.append(row);
            return Ok(());
        };
        let at = *index
            .entry(row[..*key_columns].to_vec())
            .or_insert(self.values.len() / self.arity);
        if at * self.arity == self.values.len() {
            self.values.append(row);
        } else {
            let slot = &mut self.values[at * self.arity..(at + 1) * self.arity];
            for (to, from) in slot.iter_mut().zip(row.drain(..)) {
                *to = from;
            }
        }
        Ok(())
    }

    /// Every row, flat, as a checkpoint holds them.
    pub(crate) fn flat(&self) -> &[Value] {
        &self.values
    }

    /// Takes the rows out as columns of `types`; a value of another type
    /// than its column's is a row the record's [`super::Row`] made wrong.
    pub(crate) fn take_columns(&mut self, types: &[SqlType]) -> Result<Vec<ColumnValues>, String> {
        let rows = self.len();
        let mut columns: Vec<ColumnValues> = types
            .iter()
            .map(|t| match t {
                SqlType::BigInt => ColumnValues::BigInt(Vec::with_capacity(rows)),
                SqlType::Text => ColumnValues::Text(Vec::with_capacity(rows)),
            })
            .collect();
        if let Some((_, index)) = &mut self.keys {
            index.clear();
        }
        for (i, value) in std::mem::take(&mut self.values).into_iter().enumerate() {
            match (&mut columns[i % self.arity], value) {
                (ColumnValues::BigInt(c), Value::BigInt(v)) => c.push(v),
                (ColumnValues::Text(c), Value::Text(v)) => c.push(v),
                (_, value) => {
                    return Err(format!(
                        "column {} is {} but a row has {value:?}",
                        i % self.arity,
                        types[i % self.arity].name()
                    ))
                }
            }
        }
        Ok(columns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(subtask: u32, parallelism: u32) -> SinkContext {
        SinkContext {
            subtask: tidemark_core::model::ids::SubtaskIndex(subtask),
            parallelism,
            attempt: tidemark_core::model::ids::Attempt::default(),
        }
    }

    fn restored(subtask: u32, checkpoint: u64, prepared: &[u64]) -> Committable {
        Committable {
            subtask,
            checkpoint,
            prepared: prepared.to_vec(),
            held: Vec::new(),
        }
    }

    fn names(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_restore_commits_what_its_checkpoint_lists_and_rolls_back_the_rest() {
        let found = names(&[
            "t:0:4",
            "t:0:5",
            "t:0:6",
            "t:1:5",
            "t:1:6",
            "other:0:1",
            "t:0:x",
            "t-2:0:1",
        ]);
        let r = restored(0, 5, &[4, 5]);
        assert_eq!(
            resolve(&found, "t", Some(&r), ctx(0, 2)),
            [
                ("t:0:4", Resolution::Commit),
                ("t:0:5", Resolution::Commit),
                ("t:0:6", Resolution::RollBack),
                // Newer than the checkpoint: rolled back by whoever restores.
                ("t:1:6", Resolution::RollBack),
            ]
        );
        // Subtask 1's own up to the checkpoint are its own to resolve.
        assert_eq!(
            resolve(&found, "t", Some(&restored(1, 5, &[5])), ctx(1, 2)),
            [
                ("t:0:6", Resolution::RollBack),
                ("t:1:5", Resolution::Commit),
                ("t:1:6", Resolution::RollBack)
            ]
        );
        // A fresh start rolls back what an earlier run left prepared, each
        // subtask its own index's; subtask 0 those past the parallelism.
        let fresh = |subtask, parallelism| -> Vec<&str> {
            resolve(&found, "t", None, ctx(subtask, parallelism))
                .into_iter()
                .map(|(name, r)| {
                    assert_eq!(r, Resolution::RollBack);
                    name
                })
                .collect()
        };
        assert_eq!(fresh(0, 2), ["t:0:4", "t:0:5", "t:0:6"]);
        assert_eq!(fresh(1, 2), ["t:1:5", "t:1:6"]);
        assert_eq!(fresh(0, 1), ["t:0:4", "t:0:5", "t:0:6", "t:1:5", "t:1:6"]);
        // A subtask a scale-up added leaves the others' alone.
        assert!(fresh(2, 3).is_empty());
    }

    #[test]
    fn a_transaction_the_checkpoint_does_not_list_rolls_back() {
        // Prepared at checkpoint 3 by an attempt that outlived the restore
        // that followed its failure; checkpoint 5 never saw it.
        let found = names(&["t:0:3", "t:0:5"]);
        assert_eq!(
            resolve(&found, "t", Some(&restored(0, 5, &[5])), ctx(0, 1)),
            [
                ("t:0:3", Resolution::RollBack),
                ("t:0:5", Resolution::Commit)
            ]
        );
    }

    #[test]
    fn prepared_transactions_commit_in_order_up_to_the_completed_checkpoint() {
        let mut t = Transactions::new(Mode::Append, "t", 1);
        assert_eq!(t.barrier(CheckpointId(1)), AtBarrier::Nothing);
        assert!(t.write());
        assert!(!t.write());
        assert_eq!(
            t.barrier(CheckpointId(2)),
            AtBarrier::Prepare("t:1:2".into())
        );
        // Append mode writes on behind a prepared transaction.
        assert!(t.may_write());
        assert!(t.write());
        assert_eq!(
            t.barrier(CheckpointId(3)),
            AtBarrier::Prepare("t:1:3".into())
        );
        assert!(t.write());
        assert_eq!(t.completed(CheckpointId(2)), ["t:1:2"]);
        assert_eq!(t.completed(CheckpointId(2)), Vec::<String>::new());
        assert_eq!(t.completed(CheckpointId(u64::MAX)), ["t:1:3"]);
        assert!(t.close());
        assert!(!t.close());
    }

    #[test]
    fn upsert_rows_wait_behind_a_prepared_transaction_and_a_barrier_holds_them() {
        let mut t = Transactions::new(Mode::Upsert, "t", 0);
        t.write();
        assert_eq!(
            t.barrier(CheckpointId(1)),
            AtBarrier::Prepare("t:0:1".into())
        );
        assert!(!t.may_write());
        // Checkpoint 2's barrier overtakes 1's completion: rows are held.
        assert_eq!(t.barrier(CheckpointId(2)), AtBarrier::Hold);
        assert_eq!(t.completed(CheckpointId(2)), ["t:0:1"]);
        assert!(t.may_write());
        assert!(t.write());
        assert_eq!(
            t.barrier(CheckpointId(3)),
            AtBarrier::Prepare("t:0:3".into())
        );
    }

    #[test]
    fn upsert_rows_keep_the_latest_per_key_and_leave_as_columns() {
        let mut rows = Rows::new(3, Mode::Upsert, 2);
        let row = |k: &str, w: i64, c: i64| {
            vec![Value::Text(k.into()), Value::BigInt(w), Value::BigInt(c)]
        };
        for (k, w, c) in [("a", 0, 1), ("b", 0, 1), ("a", 0, 2), ("a", 1, 1)] {
            rows.push(&mut row(k, w, c)).unwrap();
        }
        assert_eq!(rows.len(), 3);
        let types = [SqlType::Text, SqlType::BigInt, SqlType::BigInt];
        assert_eq!(
            rows.take_columns(&types).unwrap(),
            [
                ColumnValues::Text(vec!["a".into(), "b".into(), "a".into()]),
                ColumnValues::BigInt(vec![0, 0, 1]),
                ColumnValues::BigInt(vec![2, 1, 1]),
            ]
        );
        assert_eq!(rows.len(), 0);
        // The index went with the rows: a key seen before starts a row again.
        rows.push(&mut row("a", 0, 3)).unwrap();
        assert_eq!(rows.flat(), row("a", 0, 3));
        assert!(rows
            .take_columns(&[SqlType::BigInt, SqlType::BigInt, SqlType::BigInt])
            .unwrap_err()
            .contains("column 0 is bigint"));
    }

    #[test]
    fn append_rows_keep_every_record() {
        let mut rows = Rows::new(2, Mode::Append, 1);
        for c in [1, 2] {
            rows.push(&mut vec![Value::Text("a".into()), Value::BigInt(c)])
                .unwrap();
        }
        assert_eq!(rows.len(), 2);
    }
}
