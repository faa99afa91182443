//! Checkpoint statistics, after Flink's `CheckpointStatsTracker`: what each
//! checkpoint of a job did, per operator and per subtask, in a bounded
//! history, with counts and summaries. The coordinator records into it as
//! its checkpoints start, collect acknowledgements and end, so that the
//! figures follow the protocol's own decisions; the shells only read it.

use super::{Ack, CheckpointMetrics};
use crate::model::ids::{CheckpointId, OperatorId, SubtaskId};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Checkpoints a history keeps unless told otherwise.
pub const DEFAULT_HISTORY: usize = 100;

/// Where a checkpoint stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointStatus {
    /// Triggered, not every subtask has acknowledged or it is being made
    /// durable.
    InProgress,
    /// Durable: its `_metadata` is written (a savepoint: copied into its
    /// directory).
    Completed,
    /// Expired, declined, subsumed, aborted or not made durable.
    Failed,
}

/// What a checkpoint was taken as (Flink's REST `checkpoint_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointType {
    /// An aligned checkpoint, or aligned-with-timeout that never switched.
    Checkpoint,
    /// Unaligned from the start, or switched when its alignment timed out.
    UnalignedCheckpoint,
    /// A savepoint the job goes on after.
    Savepoint,
    /// A savepoint that stops the job.
    SyncSavepoint,
}

impl CheckpointType {
    /// Flink's name for it.
    pub fn flink_name(self) -> &'static str {
        match self {
            CheckpointType::Checkpoint => "CHECKPOINT",
            CheckpointType::UnalignedCheckpoint => "UNALIGNED_CHECKPOINT",
            CheckpointType::Savepoint => "SAVEPOINT",
            CheckpointType::SyncSavepoint => "SYNC_SAVEPOINT",
        }
    }

    /// Savepoints, stopping or not.
    pub fn is_savepoint(self) -> bool {
        matches!(
            self,
            CheckpointType::Savepoint | CheckpointType::SyncSavepoint
        )
    }
}

/// One subtask's acknowledgement of one checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubtaskStats {
    /// When the coordinator received it, Unix milliseconds.
    pub ack_timestamp: u64,
    /// What the subtask measured.
    pub metrics: CheckpointMetrics,
    /// Bytes of the whole state the subtask's snapshot references.
    pub state_size: u64,
    /// Bytes this checkpoint wrote itself for the subtask (less than
    /// `state_size` when incremental).
    pub checkpointed_size: u64,
}

/// Sums over acknowledgements: a checkpoint's, an operator's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Bytes of the whole state referenced.
    pub state_size: u64,
    /// Bytes written by the checkpoint itself.
    pub checkpointed_size: u64,
    /// Bytes processed while aligning.
    pub processed_data: u64,
    /// In-flight bytes persisted as channel state.
    pub persisted_data: u64,
}

impl Totals {
    fn add(&mut self, s: &SubtaskStats) {
        self.state_size += s.state_size;
        self.checkpointed_size += s.checkpointed_size;
        self.processed_data += s.metrics.bytes_during_alignment;
        self.persisted_data += s.metrics.persisted_inflight_bytes;
    }
}

/// One operator (a chain: one vertex of the job graph) in one checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorStats {
    /// The operator.
    pub operator: OperatorId,
    /// By subtask index; `None` until that subtask acknowledged.
    pub subtasks: Vec<Option<SubtaskStats>>,
}

impl OperatorStats {
    /// Subtasks that acknowledged.
    pub fn acknowledged(&self) -> usize {
        self.subtasks.iter().flatten().count()
    }

    /// The latest acknowledgement's time.
    pub fn latest_ack(&self) -> Option<u64> {
        self.subtasks
            .iter()
            .flatten()
            .map(|s| s.ack_timestamp)
            .max()
    }

    /// Sums over the acknowledgements.
    pub fn totals(&self) -> Totals {
        let mut totals = Totals::default();
        self.subtasks.iter().flatten().for_each(|s| totals.add(s));
        totals
    }
}

/// One checkpoint or savepoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointStats {
    /// Its id.
    pub id: CheckpointId,
    /// Where it stands.
    pub status: CheckpointStatus,
    /// What it was taken as.
    pub kind: CheckpointType,
    /// Trigger time, Unix milliseconds.
    pub trigger_timestamp: u64,
    /// When it completed or failed, Unix milliseconds.
    pub end_timestamp: Option<u64>,
    /// Its directory once durable (a savepoint's own directory).
    pub external_path: Option<String>,
    /// Why it failed.
    pub failure: Option<String>,
    /// Every operator that acknowledges, in id order.
    pub operators: Vec<OperatorStats>,
}

impl CheckpointStats {
    /// Subtasks that acknowledge it.
    pub fn num_subtasks(&self) -> usize {
        self.operators.iter().map(|o| o.subtasks.len()).sum()
    }

    /// Subtasks that acknowledged it.
    pub fn num_acknowledged(&self) -> usize {
        self.operators.iter().map(OperatorStats::acknowledged).sum()
    }

    /// The latest acknowledgement's time.
    pub fn latest_ack(&self) -> Option<u64> {
        self.operators.iter().filter_map(|o| o.latest_ack()).max()
    }

    /// Sums over every acknowledgement.
    pub fn totals(&self) -> Totals {
        let mut totals = Totals::default();
        for s in self
            .operators
            .iter()
            .flat_map(|o| o.subtasks.iter().flatten())
        {
            totals.add(s);
        }
        totals
    }

    /// Trigger to completion or failure; while in progress, to the latest
    /// acknowledgement (0 before the first).
    pub fn end_to_end_duration(&self) -> u64 {
        self.end_timestamp
            .or(self.latest_ack())
            .unwrap_or(self.trigger_timestamp)
            .saturating_sub(self.trigger_timestamp)
    }

    /// The operator `id`.
    pub fn operator(&self, id: OperatorId) -> Option<&OperatorStats> {
        self.operators.iter().find(|o| o.operator == id)
    }

    /// The subtask that acknowledged last: what held the checkpoint up.
    pub fn last_acknowledged(&self) -> Option<(SubtaskId, &SubtaskStats)> {
        self.operators
            .iter()
            .flat_map(|o| {
                o.subtasks.iter().enumerate().filter_map(move |(i, s)| {
                    let id = SubtaskId {
                        operator: o.operator,
                        index: crate::model::ids::SubtaskIndex(i as u32),
                    };
                    s.as_ref().map(|s| (id, s))
                })
            })
            .max_by_key(|(id, s)| (s.ack_timestamp, std::cmp::Reverse(*id)))
    }

    fn subtask_mut(&mut self, id: SubtaskId) -> Option<&mut Option<SubtaskStats>> {
        self.operators
            .iter_mut()
            .find(|o| o.operator == id.operator)?
            .subtasks
            .get_mut(id.index.0 as usize)
    }
}

/// How many checkpoints there were, over the job's life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Restores from a checkpoint or savepoint, the one at the start
    /// included.
    pub restored: u64,
    /// Checkpoints and savepoints triggered.
    pub total: u64,
    /// Of those, still in progress.
    pub in_progress: u64,
    /// Completed.
    pub completed: u64,
    /// Failed.
    pub failed: u64,
}

/// The checkpoint or savepoint the job last restored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoredStats {
    /// Its id.
    pub id: CheckpointId,
    /// When the restore happened, Unix milliseconds.
    pub timestamp: u64,
    /// A savepoint (or a checkpoint the job was started from) rather than
    /// one of the job's own checkpoints.
    pub is_savepoint: bool,
    /// Where it was read from.
    pub external_path: Option<String>,
}

/// Minimum, maximum, mean and percentiles of one figure (Flink's
/// `StatsSummary`); all 0 with no values.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StatsSummary {
    /// Smallest.
    pub min: u64,
    /// Largest.
    pub max: u64,
    /// Mean.
    pub avg: f64,
    /// Percentiles by nearest rank.
    pub p50: f64,
    /// 90th.
    pub p90: f64,
    /// 95th.
    pub p95: f64,
    /// 99th.
    pub p99: f64,
    /// 99.9th.
    pub p999: f64,
}

impl StatsSummary {
    /// Over `values`, in any order.
    pub fn of(mut values: Vec<u64>) -> Self {
        if values.is_empty() {
            return StatsSummary::default();
        }
        values.sort_unstable();
        let last = values.len() - 1;
        let at = |q: f64| values[((last as f64 * q).round() as usize).min(last)] as f64;
        StatsSummary {
            min: values[0],
            max: values[last],
            avg: values.iter().map(|&v| v as f64).sum::<f64>() / values.len() as f64,
            p50: at(0.5),
            p90: at(0.9),
            p95: at(0.95),
            p99: at(0.99),
            p999: at(0.999),
        }
    }
}

/// Summaries over the completed checkpoints of the history.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Summaries {
    /// Whole state referenced.
    pub state_size: StatsSummary,
    /// Trigger to completion, milliseconds.
    pub end_to_end_duration: StatsSummary,
    /// Bytes written by each checkpoint itself.
    pub checkpointed_size: StatsSummary,
    /// Bytes processed while aligning.
    pub processed_data: StatsSummary,
    /// In-flight bytes persisted.
    pub persisted_data: StatsSummary,
}

/// The statistics of one job over its life, restarts included: a history
/// of the last `capacity` checkpoints, the latest completed, savepoint and
/// failed ones (kept when they leave the history), the last restore and the
/// counts.
#[derive(Clone, Debug)]
pub struct CheckpointStatsTracker {
    capacity: usize,
    /// Oldest first.
    history: VecDeque<CheckpointStats>,
    /// Checkpoints still in progress, also those the history let go of:
    /// their end is counted all the same.
    in_progress: BTreeSet<CheckpointId>,
    counts: Counts,
    latest_completed: Option<CheckpointStats>,
    latest_savepoint: Option<CheckpointStats>,
    latest_failed: Option<CheckpointStats>,
    restored: Option<RestoredStats>,
}

/// A tracker the coordinator writes and the shells read from other threads.
pub type SharedCheckpointStats = Arc<Mutex<CheckpointStatsTracker>>;

/// What the checkpoint machines report to the statistics, in order with
/// their other actions: the shell applies them ([`CheckpointStatsTracker::apply`]),
/// so a machine never takes the lock that readers of the statistics share.
#[derive(Clone, Debug, PartialEq)]
pub enum StatsEvent {
    /// Checkpoint `id` was triggered; `subtasks` must acknowledge it.
    Pending {
        /// The checkpoint.
        id: CheckpointId,
        /// Checkpoint or savepoint.
        kind: CheckpointType,
        /// Trigger time, Unix milliseconds.
        timestamp: u64,
        /// Who must acknowledge.
        subtasks: BTreeSet<SubtaskId>,
    },
    /// A subtask acknowledged.
    Acknowledged {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// The subtask.
        subtask: SubtaskId,
        /// What its acknowledgement measured.
        stats: SubtaskStats,
    },
    /// The checkpoint is durable at `path`; reported before it completes.
    Located {
        /// The checkpoint.
        id: CheckpointId,
        /// Its location.
        path: String,
    },
    /// The checkpoint completed.
    Completed {
        /// The checkpoint.
        id: CheckpointId,
        /// When, Unix milliseconds.
        timestamp: u64,
    },
    /// The checkpoint failed.
    Failed {
        /// The checkpoint.
        id: CheckpointId,
        /// When, Unix milliseconds.
        timestamp: u64,
        /// Why.
        reason: String,
    },
}

impl StatsEvent {
    /// The statistics of `ack`, received at `timestamp`.
    pub fn acknowledged(ack: &Ack, timestamp: u64) -> Self {
        StatsEvent::Acknowledged {
            checkpoint: ack.checkpoint,
            subtask: ack.subtask,
            stats: SubtaskStats {
                ack_timestamp: timestamp,
                metrics: ack.metrics,
                state_size: ack.state.size(),
                checkpointed_size: ack.state.bytes_written_by(ack.checkpoint),
            },
        }
    }
}

/// Locks `stats`: every update leaves it consistent, so a panic elsewhere
/// while it was held spoils nothing.
pub fn lock(stats: &SharedCheckpointStats) -> MutexGuard<'_, CheckpointStatsTracker> {
    stats.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Default for CheckpointStatsTracker {
    fn default() -> Self {
        CheckpointStatsTracker::new(DEFAULT_HISTORY)
    }
}

impl CheckpointStatsTracker {
    /// Keeps the last `capacity` checkpoints (at least one).
    pub fn new(capacity: usize) -> Self {
        CheckpointStatsTracker {
            capacity: capacity.max(1),
            history: VecDeque::new(),
            in_progress: BTreeSet::new(),
            counts: Counts::default(),
            latest_completed: None,
            latest_savepoint: None,
            latest_failed: None,
            restored: None,
        }
    }

    /// A tracker to share between the coordinator and readers.
    pub fn shared(capacity: usize) -> SharedCheckpointStats {
        Arc::new(Mutex::new(CheckpointStatsTracker::new(capacity)))
    }

    /// Checkpoint `id` was triggered at `timestamp`; `subtasks` must
    /// acknowledge it.
    pub fn pending(
        &mut self,
        id: CheckpointId,
        kind: CheckpointType,
        timestamp: u64,
        subtasks: &BTreeSet<SubtaskId>,
    ) {
        let mut operators: BTreeMap<OperatorId, usize> = BTreeMap::new();
        for s in subtasks {
            let n = operators.entry(s.operator).or_default();
            *n = (*n).max(s.index.0 as usize + 1);
        }
        if self.history.len() == self.capacity {
            // The oldest that ended goes first: a long checkpoint stays
            // visible while newer ones come and go.
            let ended = self
                .history
                .iter()
                .position(|c| c.status != CheckpointStatus::InProgress);
            self.history.remove(ended.unwrap_or(0));
        }
        self.history.push_back(CheckpointStats {
            id,
            status: CheckpointStatus::InProgress,
            kind,
            trigger_timestamp: timestamp,
            end_timestamp: None,
            external_path: None,
            failure: None,
            operators: operators
                .into_iter()
                .map(|(operator, n)| OperatorStats {
                    operator,
                    subtasks: vec![None; n],
                })
                .collect(),
        });
        self.counts.total += 1;
        self.counts.in_progress += 1;
        self.in_progress.insert(id);
    }

    /// A subtask acknowledged at `timestamp`.
    pub fn acknowledged(&mut self, ack: &Ack, timestamp: u64) {
        self.apply(StatsEvent::acknowledged(ack, timestamp));
    }

    fn record_ack(&mut self, checkpoint: CheckpointId, subtask: SubtaskId, stats: SubtaskStats) {
        let Some(entry) = self.entry_mut(checkpoint) else {
            return;
        };
        if stats.metrics.unaligned && entry.kind == CheckpointType::Checkpoint {
            entry.kind = CheckpointType::UnalignedCheckpoint;
        }
        if let Some(slot) = entry.subtask_mut(subtask) {
            *slot = Some(stats);
        }
    }

    /// Records what a machine reported.
    pub fn apply(&mut self, event: StatsEvent) {
        match event {
            StatsEvent::Pending {
                id,
                kind,
                timestamp,
                subtasks,
            } => self.pending(id, kind, timestamp, &subtasks),
            StatsEvent::Acknowledged {
                checkpoint,
                subtask,
                stats,
            } => self.record_ack(checkpoint, subtask, stats),
            StatsEvent::Located { id, path } => self.located(id, path),
            StatsEvent::Completed { id, timestamp } => self.completed(id, timestamp),
            StatsEvent::Failed {
                id,
                timestamp,
                reason,
            } => self.failed(id, timestamp, reason),
        }
    }

    /// Checkpoint `id` is durable at `path`; recorded before it completes.
    pub fn located(&mut self, id: CheckpointId, path: String) {
        if let Some(entry) = self.entry_mut(id) {
            entry.external_path = Some(path);
        }
    }

    /// Checkpoint `id` completed at `timestamp`.
    pub fn completed(&mut self, id: CheckpointId, timestamp: u64) {
        if !self.in_progress.remove(&id) {
            return;
        }
        self.counts.in_progress -= 1;
        self.counts.completed += 1;
        match self.end(id, timestamp, CheckpointStatus::Completed, None) {
            Some(entry) if entry.kind.is_savepoint() => self.latest_savepoint = Some(entry),
            Some(entry) => self.latest_completed = Some(entry),
            None => {}
        }
    }

    /// Checkpoint `id` failed at `timestamp`.
    pub fn failed(&mut self, id: CheckpointId, timestamp: u64, reason: String) {
        if !self.in_progress.remove(&id) {
            return;
        }
        self.counts.in_progress -= 1;
        self.counts.failed += 1;
        if let Some(entry) = self.end(id, timestamp, CheckpointStatus::Failed, Some(reason)) {
            self.latest_failed = Some(entry);
        }
    }

    /// The job restored a checkpoint or savepoint.
    pub fn restored(&mut self, restored: RestoredStats) {
        self.counts.restored += 1;
        self.restored = Some(restored);
    }

    fn end(
        &mut self,
        id: CheckpointId,
        timestamp: u64,
        status: CheckpointStatus,
        failure: Option<String>,
    ) -> Option<CheckpointStats> {
        let entry = self.entry_mut(id)?;
        entry.status = status;
        entry.failure = failure;
        entry.end_timestamp = Some(timestamp);
        Some(entry.clone())
    }

    fn entry_mut(&mut self, id: CheckpointId) -> Option<&mut CheckpointStats> {
        self.history.iter_mut().rev().find(|c| c.id == id)
    }

    /// The history, newest first.
    pub fn history(&self) -> impl Iterator<Item = &CheckpointStats> {
        self.history.iter().rev()
    }

    /// Checkpoint `id`, from the history or the latest ones kept.
    pub fn get(&self, id: CheckpointId) -> Option<&CheckpointStats> {
        self.history.iter().rev().find(|c| c.id == id).or_else(|| {
            [
                &self.latest_completed,
                &self.latest_savepoint,
                &self.latest_failed,
            ]
            .into_iter()
            .flatten()
            .find(|c| c.id == id)
        })
    }

    /// Checkpoints the history keeps.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Counts over the job's life.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// The latest completed checkpoint (not savepoint).
    pub fn latest_completed(&self) -> Option<&CheckpointStats> {
        self.latest_completed.as_ref()
    }

    /// The latest completed savepoint.
    pub fn latest_savepoint(&self) -> Option<&CheckpointStats> {
        self.latest_savepoint.as_ref()
    }

    /// The latest failed checkpoint or savepoint.
    pub fn latest_failed(&self) -> Option<&CheckpointStats> {
        self.latest_failed.as_ref()
    }

    /// The last restore.
    pub fn latest_restored(&self) -> Option<&RestoredStats> {
        self.restored.as_ref()
    }

    /// Summaries over the completed checkpoints and savepoints of the
    /// history.
    pub fn summary(&self) -> Summaries {
        let completed: Vec<(u64, Totals)> = self
            .history
            .iter()
            .filter(|c| c.status == CheckpointStatus::Completed)
            .map(|c| (c.end_to_end_duration(), c.totals()))
            .collect();
        let of = |f: fn(&(u64, Totals)) -> u64| StatsSummary::of(completed.iter().map(f).collect());
        Summaries {
            state_size: of(|c| c.1.state_size),
            end_to_end_duration: of(|c| c.0),
            checkpointed_size: of(|c| c.1.checkpointed_size),
            processed_data: of(|c| c.1.processed_data),
            persisted_data: of(|c| c.1.persisted_data),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::SubtaskState;
    use crate::model::ids::SubtaskIndex;
    use std::time::Duration;

    fn subtask(operator: u32, index: u32) -> SubtaskId {
        SubtaskId {
            operator: OperatorId(operator),
            index: SubtaskIndex(index),
        }
    }

    fn job() -> BTreeSet<SubtaskId> {
        [subtask(0, 0), subtask(0, 1), subtask(1, 0)].into()
    }

    fn ack(checkpoint: u64, who: SubtaskId, bytes: usize, sync_ms: u64) -> Ack {
        let mut state = SubtaskState::default();
        state.operator.insert("s".into(), vec![0; bytes]);
        Ack {
            subtask: who,
            checkpoint: CheckpointId(checkpoint),
            state,
            metrics: CheckpointMetrics {
                sync: Duration::from_millis(sync_ms),
                ..CheckpointMetrics::default()
            },
        }
    }

    #[test]
    fn a_checkpoint_collects_its_acknowledgements_per_operator_and_subtask() {
        let mut t = CheckpointStatsTracker::new(10);
        t.pending(CheckpointId(1), CheckpointType::Checkpoint, 1000, &job());
        assert_eq!(t.counts().in_progress, 1);
        t.acknowledged(&ack(1, subtask(0, 1), 10, 3), 1040);
        t.acknowledged(&ack(1, subtask(1, 0), 20, 9), 1100);
        let c = t.get(CheckpointId(1)).unwrap();
        assert_eq!((c.num_subtasks(), c.num_acknowledged()), (3, 2));
        assert_eq!(
            c.end_to_end_duration(),
            100,
            "to the latest ack while in progress"
        );
        t.acknowledged(&ack(1, subtask(0, 0), 30, 1), 1070);
        t.completed(CheckpointId(1), 1150);
        let c = t.latest_completed().unwrap();
        assert_eq!(c.status, CheckpointStatus::Completed);
        assert_eq!(c.end_to_end_duration(), 150);
        assert_eq!(c.totals().state_size, 60);
        assert_eq!(
            c.totals().checkpointed_size,
            60,
            "inline state is written by each checkpoint"
        );
        assert_eq!(c.operator(OperatorId(0)).unwrap().acknowledged(), 2);
        assert_eq!(c.operator(OperatorId(0)).unwrap().latest_ack(), Some(1070));
        let (last, stats) = c.last_acknowledged().unwrap();
        assert_eq!(
            (last, stats.metrics.sync),
            (subtask(1, 0), Duration::from_millis(9))
        );
        assert_eq!(
            t.counts(),
            Counts {
                restored: 0,
                total: 1,
                in_progress: 0,
                completed: 1,
                failed: 0
            }
        );
    }

    #[test]
    fn the_history_is_bounded_and_the_latest_outlive_it() {
        let mut t = CheckpointStatsTracker::new(3);
        t.pending(CheckpointId(1), CheckpointType::Savepoint, 0, &job());
        t.completed(CheckpointId(1), 5);
        t.pending(CheckpointId(2), CheckpointType::Checkpoint, 10, &job());
        t.failed(CheckpointId(2), 20, "expired".into());
        for id in 3..=7 {
            t.pending(
                CheckpointId(id),
                CheckpointType::Checkpoint,
                id * 10,
                &job(),
            );
            t.completed(CheckpointId(id), id * 10 + id);
        }
        let ids: Vec<u64> = t.history().map(|c| c.id.0).collect();
        assert_eq!(ids, [7, 6, 5], "newest first, three kept");
        assert_eq!(t.latest_savepoint().unwrap().id, CheckpointId(1));
        assert_eq!(
            t.latest_failed().unwrap().failure.as_deref(),
            Some("expired")
        );
        assert_eq!(
            t.get(CheckpointId(2)).unwrap().status,
            CheckpointStatus::Failed
        );
        assert!(t.get(CheckpointId(3)).is_none());
        let counts = t.counts();
        assert_eq!((counts.total, counts.completed, counts.failed), (7, 6, 1));
        let durations = t.summary().end_to_end_duration;
        assert_eq!((durations.min, durations.max, durations.avg), (5, 7, 6.0));
        assert_eq!(durations.p50, 6.0);
    }

    #[test]
    fn an_ended_checkpoint_ends_once_and_late_acks_change_nothing() {
        let mut t = CheckpointStatsTracker::new(10);
        t.pending(CheckpointId(1), CheckpointType::Checkpoint, 0, &job());
        t.failed(CheckpointId(1), 10, "declined".into());
        t.failed(CheckpointId(1), 20, "again".into());
        t.completed(CheckpointId(1), 30);
        let c = t.get(CheckpointId(1)).unwrap();
        assert_eq!(
            (c.status, c.end_timestamp),
            (CheckpointStatus::Failed, Some(10))
        );
        assert_eq!(c.failure.as_deref(), Some("declined"));
        assert_eq!(
            (
                t.counts().failed,
                t.counts().completed,
                t.counts().in_progress
            ),
            (1, 0, 0)
        );
        // An ack of an unknown or evicted checkpoint is dropped.
        t.acknowledged(&ack(9, subtask(0, 0), 1, 1), 40);
        assert!(t.get(CheckpointId(9)).is_none());
    }

    #[test]
    fn a_checkpoint_that_outlasts_the_history_is_still_counted_when_it_ends() {
        let mut t = CheckpointStatsTracker::new(2);
        t.pending(CheckpointId(1), CheckpointType::Checkpoint, 0, &job());
        for id in 2..=4 {
            t.pending(CheckpointId(id), CheckpointType::Checkpoint, id, &job());
            t.completed(CheckpointId(id), id + 1);
        }
        let ids: Vec<u64> = t.history().map(|c| c.id.0).collect();
        assert_eq!(ids, [4, 1], "the one in progress is kept over ended ones");
        t.pending(CheckpointId(5), CheckpointType::Checkpoint, 5, &job());
        t.pending(CheckpointId(6), CheckpointType::Checkpoint, 6, &job());
        assert!(
            t.get(CheckpointId(1)).is_none(),
            "all in progress: the oldest goes"
        );
        t.completed(CheckpointId(1), 10);
        let c = t.counts();
        assert_eq!((c.total, c.completed, c.in_progress), (6, 4, 2));
        assert_eq!(c.total, c.completed + c.failed + c.in_progress);
    }

    #[test]
    fn an_unaligned_acknowledgement_makes_the_checkpoint_unaligned() {
        let mut t = CheckpointStatsTracker::new(10);
        t.pending(CheckpointId(1), CheckpointType::Checkpoint, 0, &job());
        let mut a = ack(1, subtask(0, 0), 1, 1);
        a.metrics.unaligned = true;
        t.acknowledged(&a, 5);
        assert_eq!(
            t.get(CheckpointId(1)).unwrap().kind,
            CheckpointType::UnalignedCheckpoint
        );
        assert_eq!(
            t.get(CheckpointId(1)).unwrap().kind.flink_name(),
            "UNALIGNED_CHECKPOINT"
        );
    }

    #[test]
    fn summaries_use_the_nearest_rank() {
        let s = StatsSummary::of((1..=1000).rev().collect());
        assert_eq!((s.min, s.max, s.avg), (1, 1000, 500.5));
        assert_eq!((s.p50, s.p90, s.p99, s.p999), (501.0, 900.0, 990.0, 999.0));
        assert_eq!(StatsSummary::of(Vec::new()), StatsSummary::default());
    }
}
