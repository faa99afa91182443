//! Aligned barrier handling, after Flink's `SingleCheckpointBarrierHandler`
//! for aligned checkpoints, as a sans-IO state machine: the subtask feeds it
//! the control events its input gate delivers, with the current time, and
//! carries out the actions it returns (block or unblock gate channels, take
//! the snapshot, decline). It owns no gate, clock or channel.
//!
//! Checkpoint ids only grow, so the aligner keeps a single watermark: the
//! newest id it has heard of by any means (a barrier, a cancel marker, a
//! coordinator abort). An id above the watermark supersedes the alignment in
//! progress; an id at or below it that is not being aligned is settled and
//! ignored. That one rule makes every checkpoint resolve — snapshot or abort —
//! at most once, in increasing id order, and leaves no channel blocked once
//! nothing is being aligned.

use crate::event::Barrier;
use crate::ids::CheckpointId;
use std::time::{Duration, Instant};

/// What the subtask must do, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum AlignerAction {
    /// Take no more input from this channel until UnblockAll.
    Block(usize),
    UnblockAll,
    /// Every channel delivered the barrier or ended: take the snapshot now, then forward the barrier downstream.
    Snapshot {
        barrier: Barrier,
        alignment: Duration,
        bytes_during_alignment: u64,
    },
    /// The checkpoint is abandoned at this subtask: the shell declines it to the coordinator and forwards a cancel marker downstream. Emitted at most once per checkpoint id.
    Abort {
        checkpoint: CheckpointId,
        reason: AbortReason,
    },
}

/// Why this subtask abandoned a checkpoint; the shell reports it in the decline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbortReason {
    /// An upstream subtask abandoned the checkpoint and said so in-band.
    CancelMarker,
    /// A newer checkpoint reached this subtask — by its barrier, a cancel
    /// marker or a coordinator abort — before this one aligned; since ids
    /// only grow, the older one can no longer complete here.
    SubsumedByNewerBarrier(CheckpointId),
    /// The coordinator gave up on the checkpoint (notify abort).
    CoordinatorAborted,
}

/// The alignment in progress.
#[derive(Debug)]
struct PendingAlignment {
    /// The first barrier of the checkpoint to reach this subtask.
    barrier: Barrier,
    started: Instant,
    /// Per channel: the barrier came in on it.
    delivered: Vec<bool>,
    /// Whether a `Block` went out for this alignment, so that ending it
    /// knows whether the gate needs an `UnblockAll`.
    blocked: bool,
    bytes: u64,
}

/// Decides, for one subtask's input gate, which channels wait for the others
/// and when the snapshot of an aligned checkpoint is due.
///
/// Channel indices are those of the gate; an index out of range is a bug of
/// the caller and panics.
#[derive(Debug)]
pub struct BarrierAligner {
    ended: Vec<bool>,
    /// Newest checkpoint id heard of; every id up to it is either being
    /// aligned (then it is this one) or settled.
    newest: Option<CheckpointId>,
    alignment: Option<PendingAlignment>,
}

impl BarrierAligner {
    pub fn new(channels: usize) -> Self {
        BarrierAligner {
            ended: vec![false; channels],
            newest: None,
            alignment: None,
        }
    }

    /// A barrier came in on `channel`. A barrier on a channel that already
    /// delivered it or has ended cannot come from a well-behaved gate and is
    /// ignored.
    pub fn on_barrier(
        &mut self,
        now: Instant,
        channel: usize,
        barrier: Barrier,
    ) -> Vec<AlignerAction> {
        self.check_channel(channel);
        let mut actions = Vec::new();
        if self.ended[channel] {
            return actions;
        }
        if self.is_newer(barrier.id) {
            self.supersede(barrier.id, &mut actions);
            self.alignment = Some(PendingAlignment {
                barrier,
                started: now,
                delivered: vec![false; self.ended.len()],
                blocked: false,
                bytes: 0,
            });
        }
        // Any other id is settled (stale); a repeat on a channel changes nothing.
        let Some(alignment) = self
            .alignment
            .as_mut()
            .filter(|a| a.barrier.id == barrier.id && !a.delivered[channel])
        else {
            return actions;
        };
        alignment.delivered[channel] = true;
        if all_delivered(&alignment.delivered, &self.ended) {
            self.complete(now, &mut actions);
        } else {
            alignment.blocked = true;
            actions.push(AlignerAction::Block(channel));
        }
        actions
    }

    /// An upstream subtask abandoned `checkpoint`. The channel plays no part
    /// in the decision: one marker settles the checkpoint for the whole gate.
    pub fn on_cancel_marker(
        &mut self,
        _now: Instant,
        channel: usize,
        checkpoint: CheckpointId,
    ) -> Vec<AlignerAction> {
        self.check_channel(channel);
        let mut actions = Vec::new();
        self.abandon(checkpoint, AbortReason::CancelMarker, &mut actions);
        actions
    }

    /// End of partition counts as the barrier of every current and future checkpoint on that channel.
    pub fn on_end_of_partition(&mut self, now: Instant, channel: usize) -> Vec<AlignerAction> {
        self.check_channel(channel);
        let mut actions = Vec::new();
        self.ended[channel] = true;
        if self
            .alignment
            .as_ref()
            .is_some_and(|a| all_delivered(&a.delivered, &self.ended))
        {
            self.complete(now, &mut actions);
        }
        actions
    }

    /// A batch of `bytes` from an unblocked channel was processed; counted while an alignment is in progress.
    pub fn on_batch(&mut self, bytes: u64) {
        if let Some(alignment) = self.alignment.as_mut() {
            alignment.bytes = alignment.bytes.saturating_add(bytes);
        }
    }

    /// The coordinator aborted `checkpoint` (notify abort): end its alignment if it is the one in progress.
    ///
    /// An abort of a checkpoint newer than any seen is also answered with an
    /// `Abort`, so that the shell forwards a cancel marker and downstream
    /// does not wait for a barrier that will never come; its barriers are
    /// stale from then on.
    pub fn abort(&mut self, checkpoint: CheckpointId) -> Vec<AlignerAction> {
        let mut actions = Vec::new();
        self.abandon(checkpoint, AbortReason::CoordinatorAborted, &mut actions);
        actions
    }

    /// The checkpoint being aligned, if any.
    pub fn aligning(&self) -> Option<CheckpointId> {
        self.alignment.as_ref().map(|a| a.barrier.id)
    }

    fn check_channel(&self, channel: usize) {
        assert!(
            channel < self.ended.len(),
            "channel {channel} out of range for a gate of {} channels",
            self.ended.len()
        );
    }

    fn is_newer(&self, id: CheckpointId) -> bool {
        self.newest.is_none_or(|newest| id > newest)
    }

    /// Raises the watermark to `id`, aborting the older alignment in progress.
    fn supersede(&mut self, id: CheckpointId, actions: &mut Vec<AlignerAction>) {
        if let Some(old) = self.alignment.take() {
            end_alignment(&old, AbortReason::SubsumedByNewerBarrier(id), actions);
        }
        self.newest = Some(id);
    }

    /// Gives up `id` if it is being aligned or not yet seen; settled ids
    /// were already resolved once and stay silent.
    fn abandon(&mut self, id: CheckpointId, reason: AbortReason, actions: &mut Vec<AlignerAction>) {
        if self.aligning() == Some(id) {
            if let Some(alignment) = self.alignment.take() {
                end_alignment(&alignment, reason, actions);
            }
        } else if self.is_newer(id) {
            self.supersede(id, actions);
            actions.push(AlignerAction::Abort {
                checkpoint: id,
                reason,
            });
        }
    }

    /// Snapshots the alignment in progress and releases its channels.
    fn complete(&mut self, now: Instant, actions: &mut Vec<AlignerAction>) {
        if let Some(alignment) = self.alignment.take() {
            actions.push(AlignerAction::Snapshot {
                barrier: alignment.barrier,
                alignment: now.saturating_duration_since(alignment.started),
                bytes_during_alignment: alignment.bytes,
            });
            if alignment.blocked {
                actions.push(AlignerAction::UnblockAll);
            }
        }
    }
}

/// Every channel that has not ended delivered the barrier.
fn all_delivered(delivered: &[bool], ended: &[bool]) -> bool {
    delivered
        .iter()
        .zip(ended)
        .all(|(&delivered, &ended)| delivered || ended)
}

/// Aborts the alignment that was in progress and releases its channels.
fn end_alignment(
    alignment: &PendingAlignment,
    reason: AbortReason,
    actions: &mut Vec<AlignerAction>,
) {
    actions.push(AlignerAction::Abort {
        checkpoint: alignment.barrier.id,
        reason,
    });
    if alignment.blocked {
        actions.push(AlignerAction::UnblockAll);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Alignment, CheckpointKind, CheckpointOptions};
    use proptest::prelude::*;
    use proptest::sample::Index;
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::OnceLock;

    use AbortReason::{CancelMarker, CoordinatorAborted, SubsumedByNewerBarrier};
    use AlignerAction::{Block, UnblockAll};

    const A: usize = 0;
    const B: usize = 1;
    const C: usize = 2;

    /// Fake clock: a fixed base plus an offset; only differences matter.
    fn t(ms: u64) -> Instant {
        static BASE: OnceLock<Instant> = OnceLock::new();
        *BASE.get_or_init(Instant::now) + Duration::from_millis(ms)
    }

    fn chk(id: u64) -> CheckpointId {
        CheckpointId(id)
    }

    fn barrier(id: u64) -> Barrier {
        Barrier {
            id: chk(id),
            timestamp: 1_000 * id,
            options: CheckpointOptions {
                kind: CheckpointKind::Checkpoint,
                alignment: Alignment::Aligned,
            },
        }
    }

    fn snapshot(id: u64, alignment_ms: u64, bytes: u64) -> AlignerAction {
        AlignerAction::Snapshot {
            barrier: barrier(id),
            alignment: Duration::from_millis(alignment_ms),
            bytes_during_alignment: bytes,
        }
    }

    fn aborted(id: u64, reason: AbortReason) -> AlignerAction {
        AlignerAction::Abort {
            checkpoint: chk(id),
            reason,
        }
    }

    #[test]
    fn seed_scenario_blocks_a_and_b_until_c_delivers_barrier_1() {
        let mut aligner = BarrierAligner::new(3);
        // data1, data2 on A: before any barrier, not alignment.
        aligner.on_batch(10);
        aligner.on_batch(20);
        assert_eq!(aligner.on_barrier(t(100), A, barrier(1)), [Block(A)]);
        assert_eq!(aligner.aligning(), Some(chk(1)));
        // data4 on B, still unblocked.
        aligner.on_batch(40);
        assert_eq!(aligner.on_barrier(t(130), B, barrier(1)), [Block(B)]);
        // data6, data7, data8 on C go on being processed.
        aligner.on_batch(60);
        aligner.on_batch(70);
        aligner.on_batch(80);
        assert_eq!(
            aligner.on_barrier(t(175), C, barrier(1)),
            [snapshot(1, 75, 40 + 60 + 70 + 80), UnblockAll]
        );
        assert_eq!(aligner.aligning(), None);
    }

    #[test]
    fn single_channel_snapshots_at_once_and_never_blocks() {
        let mut aligner = BarrierAligner::new(1);
        aligner.on_batch(100);
        assert_eq!(aligner.on_barrier(t(5), A, barrier(1)), [snapshot(1, 0, 0)]);
        assert_eq!(aligner.aligning(), None);
        aligner.on_batch(100);
        assert_eq!(aligner.on_barrier(t(9), A, barrier(2)), [snapshot(2, 0, 0)]);
    }

    #[test]
    fn single_live_channel_snapshots_at_once_after_the_others_ended() {
        let mut aligner = BarrierAligner::new(3);
        assert_eq!(aligner.on_end_of_partition(t(0), A), []);
        assert_eq!(aligner.on_end_of_partition(t(1), B), []);
        assert_eq!(aligner.on_barrier(t(7), C, barrier(1)), [snapshot(1, 0, 0)]);
    }

    #[test]
    fn newer_barrier_during_alignment_subsumes_the_older_and_aligns_the_newer() {
        let mut aligner = BarrierAligner::new(3);
        assert_eq!(aligner.on_barrier(t(0), A, barrier(1)), [Block(A)]);
        aligner.on_batch(5);
        assert_eq!(
            aligner.on_barrier(t(10), B, barrier(2)),
            [
                aborted(1, SubsumedByNewerBarrier(chk(2))),
                UnblockAll,
                Block(B)
            ]
        );
        assert_eq!(aligner.aligning(), Some(chk(2)));
        aligner.on_batch(7);
        assert_eq!(aligner.on_barrier(t(15), A, barrier(2)), [Block(A)]);
        // C's barrier of the subsumed checkpoint is stale and blocks nothing.
        assert_eq!(aligner.on_barrier(t(20), C, barrier(1)), []);
        aligner.on_batch(9);
        assert_eq!(
            aligner.on_barrier(t(30), C, barrier(2)),
            [snapshot(2, 20, 7 + 9), UnblockAll]
        );
    }

    #[test]
    fn cancel_marker_during_alignment_aborts_unblocks_and_later_barriers_are_ignored() {
        let mut aligner = BarrierAligner::new(3);
        assert_eq!(aligner.on_barrier(t(0), A, barrier(1)), [Block(A)]);
        assert_eq!(
            aligner.on_cancel_marker(t(3), B, chk(1)),
            [aborted(1, CancelMarker), UnblockAll]
        );
        assert_eq!(aligner.aligning(), None);
        assert_eq!(aligner.on_barrier(t(4), C, barrier(1)), []);
        assert_eq!(aligner.aligning(), None);
        // The next checkpoint aligns as usual.
        assert_eq!(aligner.on_barrier(t(10), A, barrier(2)), [Block(A)]);
    }

    #[test]
    fn cancel_marker_for_a_future_checkpoint_makes_its_barriers_stale() {
        let mut aligner = BarrierAligner::new(2);
        assert_eq!(
            aligner.on_cancel_marker(t(0), A, chk(3)),
            [aborted(3, CancelMarker)]
        );
        assert_eq!(aligner.on_cancel_marker(t(1), B, chk(3)), []);
        assert_eq!(aligner.on_barrier(t(2), B, barrier(3)), []);
        assert_eq!(aligner.on_barrier(t(3), B, barrier(2)), []);
        assert_eq!(aligner.aligning(), None);
        assert_eq!(aligner.on_barrier(t(4), A, barrier(4)), [Block(A)]);
    }

    #[test]
    fn cancel_marker_for_a_newer_checkpoint_ends_the_alignment_in_progress() {
        let mut aligner = BarrierAligner::new(3);
        assert_eq!(aligner.on_barrier(t(0), A, barrier(1)), [Block(A)]);
        assert_eq!(
            aligner.on_cancel_marker(t(2), B, chk(2)),
            [
                aborted(1, SubsumedByNewerBarrier(chk(2))),
                UnblockAll,
                aborted(2, CancelMarker)
            ]
        );
        assert_eq!(aligner.on_barrier(t(3), C, barrier(1)), []);
        assert_eq!(aligner.on_barrier(t(4), C, barrier(2)), []);
        assert_eq!(aligner.aligning(), None);
    }

    #[test]
    fn events_of_a_snapshotted_checkpoint_are_stale() {
        let mut aligner = BarrierAligner::new(2);
        assert_eq!(aligner.on_barrier(t(0), A, barrier(1)), [Block(A)]);
        assert_eq!(
            aligner.on_barrier(t(1), B, barrier(1)),
            [snapshot(1, 1, 0), UnblockAll]
        );
        assert_eq!(aligner.on_barrier(t(2), A, barrier(1)), []);
        assert_eq!(aligner.on_cancel_marker(t(3), B, chk(1)), []);
        assert_eq!(aligner.abort(chk(1)), []);
        assert_eq!(aligner.aligning(), None);
    }

    #[test]
    fn end_of_partition_counts_as_delivered_and_completes_the_alignment() {
        let mut aligner = BarrierAligner::new(3);
        assert_eq!(aligner.on_barrier(t(0), A, barrier(1)), [Block(A)]);
        assert_eq!(aligner.on_barrier(t(4), B, barrier(1)), [Block(B)]);
        aligner.on_batch(3);
        assert_eq!(
            aligner.on_end_of_partition(t(9), C),
            [snapshot(1, 9, 3), UnblockAll]
        );
        // C counts as delivered for every later checkpoint too.
        assert_eq!(aligner.on_barrier(t(20), A, barrier(2)), [Block(A)]);
        assert_eq!(
            aligner.on_barrier(t(25), B, barrier(2)),
            [snapshot(2, 5, 0), UnblockAll]
        );
    }

    #[test]
    fn end_of_partition_of_a_channel_still_owing_the_barrier_keeps_the_wait_for_others() {
        let mut aligner = BarrierAligner::new(3);
        assert_eq!(aligner.on_barrier(t(0), A, barrier(1)), [Block(A)]);
        assert_eq!(aligner.on_end_of_partition(t(2), B), []);
        assert_eq!(aligner.aligning(), Some(chk(1)));
        assert_eq!(
            aligner.on_barrier(t(6), C, barrier(1)),
            [snapshot(1, 6, 0), UnblockAll]
        );
    }

    #[test]
    fn gate_with_every_channel_ended_aligns_nothing() {
        let mut aligner = BarrierAligner::new(2);
        assert_eq!(aligner.on_barrier(t(0), A, barrier(1)), [Block(A)]);
        assert_eq!(
            aligner.on_end_of_partition(t(1), B),
            [snapshot(1, 1, 0), UnblockAll]
        );
        assert_eq!(aligner.on_end_of_partition(t(2), A), []);
        assert_eq!(aligner.on_end_of_partition(t(3), A), []);
        aligner.on_batch(10);
        assert_eq!(aligner.aligning(), None);
        // Nothing can arrive any more; a barrier on an ended channel is ignored.
        assert_eq!(aligner.on_barrier(t(4), A, barrier(2)), []);
        assert_eq!(aligner.aligning(), None);
    }

    #[test]
    fn coordinator_abort_ends_the_alignment_in_progress() {
        let mut aligner = BarrierAligner::new(3);
        assert_eq!(aligner.on_barrier(t(0), A, barrier(1)), [Block(A)]);
        assert_eq!(aligner.on_barrier(t(1), B, barrier(1)), [Block(B)]);
        assert_eq!(
            aligner.abort(chk(1)),
            [aborted(1, CoordinatorAborted), UnblockAll]
        );
        assert_eq!(aligner.aligning(), None);
        assert_eq!(aligner.on_barrier(t(2), C, barrier(1)), []);
        assert_eq!(aligner.on_cancel_marker(t(3), C, chk(1)), []);
    }

    #[test]
    fn coordinator_abort_of_a_future_checkpoint_is_forwarded_and_its_barriers_are_stale() {
        let mut aligner = BarrierAligner::new(2);
        assert_eq!(aligner.abort(chk(2)), [aborted(2, CoordinatorAborted)]);
        assert_eq!(aligner.abort(chk(2)), []);
        assert_eq!(aligner.abort(chk(1)), []);
        assert_eq!(aligner.on_barrier(t(0), A, barrier(1)), []);
        assert_eq!(aligner.on_barrier(t(1), A, barrier(2)), []);
        assert_eq!(aligner.on_barrier(t(2), A, barrier(3)), [Block(A)]);
    }

    #[test]
    fn coordinator_abort_of_a_newer_checkpoint_ends_the_alignment_in_progress() {
        let mut aligner = BarrierAligner::new(2);
        assert_eq!(aligner.on_barrier(t(0), A, barrier(1)), [Block(A)]);
        assert_eq!(
            aligner.abort(chk(2)),
            [
                aborted(1, SubsumedByNewerBarrier(chk(2))),
                UnblockAll,
                aborted(2, CoordinatorAborted)
            ]
        );
        assert_eq!(aligner.on_barrier(t(1), B, barrier(1)), []);
        assert_eq!(aligner.aligning(), None);
    }

    #[test]
    fn abort_is_emitted_at_most_once_per_checkpoint() {
        let mut aligner = BarrierAligner::new(3);
        let mut actions = aligner.on_barrier(t(0), A, barrier(1));
        actions.extend(aligner.on_cancel_marker(t(1), B, chk(1)));
        actions.extend(aligner.on_cancel_marker(t(2), C, chk(1)));
        actions.extend(aligner.abort(chk(1)));
        actions.extend(aligner.on_barrier(t(3), C, barrier(1)));
        actions.extend(aligner.on_barrier(t(4), B, barrier(1)));
        assert_eq!(actions, [Block(A), aborted(1, CancelMarker), UnblockAll]);
    }

    #[test]
    fn bytes_during_alignment_start_from_zero_for_each_checkpoint() {
        let mut aligner = BarrierAligner::new(2);
        aligner.on_batch(100);
        assert_eq!(aligner.on_barrier(t(0), A, barrier(1)), [Block(A)]);
        aligner.on_batch(1);
        assert_eq!(
            aligner.on_barrier(t(1), B, barrier(1)),
            [snapshot(1, 1, 1), UnblockAll]
        );
        aligner.on_batch(100);
        assert_eq!(aligner.on_barrier(t(10), B, barrier(2)), [Block(B)]);
        aligner.on_batch(2);
        assert_eq!(
            aligner.on_barrier(t(12), A, barrier(2)),
            [snapshot(2, 2, 2), UnblockAll]
        );
    }

    #[test]
    fn repeated_barrier_on_a_channel_is_ignored() {
        let mut aligner = BarrierAligner::new(2);
        assert_eq!(aligner.on_barrier(t(0), A, barrier(1)), [Block(A)]);
        assert_eq!(aligner.on_barrier(t(1), A, barrier(1)), []);
        assert_eq!(aligner.aligning(), Some(chk(1)));
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn channel_out_of_range_panics() {
        BarrierAligner::new(2).on_cancel_marker(t(0), 2, chk(1));
    }

    /// What one input channel delivers, in order.
    #[derive(Clone, Debug)]
    enum Event {
        Data(u64),
        Barrier(u64),
        Cancel(u64),
        End,
    }

    #[derive(Clone, Debug)]
    struct Scenario {
        channels: Vec<Vec<Event>>,
        /// Coordinator aborts, issued in this order at times the schedule picks.
        aborts: Vec<u64>,
        /// Which possible step runs next; when exhausted, the first one.
        schedule: Vec<Index>,
    }

    /// Barriers `1..=k` in increasing order with data in between, possibly
    /// ending early; with `cancels`, some barriers are replaced by the cancel
    /// marker of their checkpoint, as an upstream that declined it sends.
    fn channel_events(k: u64, cancels: bool) -> impl Strategy<Value = Vec<Event>> {
        (
            0..=k,
            any::<bool>(),
            prop::collection::vec(prop::collection::vec(1u64..100, 0..3), k as usize + 1),
            prop::collection::vec(prop::bool::weighted(0.2), k as usize),
        )
            .prop_map(move |(delivered, ends, data, cancelled)| {
                let mut events = Vec::new();
                for id in 1..=delivered {
                    let i = id as usize - 1;
                    events.extend(data[i].iter().map(|&b| Event::Data(b)));
                    events.push(if cancels && cancelled[i] {
                        Event::Cancel(id)
                    } else {
                        Event::Barrier(id)
                    });
                }
                events.extend(data[k as usize].iter().map(|&b| Event::Data(b)));
                if delivered < k || ends {
                    events.push(Event::End);
                }
                events
            })
    }

    fn scenario(cancels: bool) -> impl Strategy<Value = Scenario> {
        (1usize..=4, 1u64..=5).prop_flat_map(move |(channels, k)| {
            let aborts = if cancels { 0..3 } else { 0..1 };
            (
                prop::collection::vec(channel_events(k, cancels), channels),
                prop::collection::vec(1..=k + 1, aborts),
                prop::collection::vec(any::<Index>(), 0..120),
            )
                .prop_map(|(channels, aborts, schedule)| Scenario {
                    channels,
                    aborts,
                    schedule,
                })
        })
    }

    /// How each checkpoint was resolved, in the order it happened.
    #[derive(Debug, Default)]
    struct Outcome {
        snapshots: Vec<u64>,
        aborts: Vec<u64>,
        /// Every barrier id some channel delivered.
        delivered: BTreeSet<u64>,
    }

    /// Runs the scenario the way a subtask shell would: events only from
    /// unblocked channels, in the order the schedule picks, with the actions
    /// applied to a model of the gate. Checks the protocol's invariants at
    /// every step and that everything drains with no channel left blocked.
    fn simulate(scenario: &Scenario) -> Result<Outcome, TestCaseError> {
        let n = scenario.channels.len();
        let mut aligner = BarrierAligner::new(n);
        let mut next = vec![0usize; n];
        let mut blocked = vec![false; n];
        let mut ended = vec![false; n];
        let mut delivered: Vec<BTreeSet<u64>> = vec![BTreeSet::new(); n];
        // Time and processed-bytes total when barrier `id` first came in.
        let mut first_barrier: BTreeMap<u64, (Instant, u64)> = BTreeMap::new();
        let mut bytes = 0u64;
        let mut aborts = scenario.aborts.iter();
        let mut pending_abort = aborts.next();
        // Newest id a cancel marker or the coordinator told the aligner to drop.
        let mut dropped = 0u64;
        let mut last_resolved = 0u64;
        let mut outcome = Outcome::default();

        for step in 0.. {
            let now = t(step);
            let ready: Vec<usize> = (0..n)
                .filter(|&c| !blocked[c] && next[c] < scenario.channels[c].len())
                .collect();
            let moves = ready.len() + usize::from(pending_abort.is_some());
            if moves == 0 {
                break;
            }
            let pick = scenario
                .schedule
                .get(step as usize)
                .map_or(0, |i| i.index(moves));
            let (channel, event, actions) = if let Some(&c) = ready.get(pick) {
                let event = scenario.channels[c][next[c]].clone();
                next[c] += 1;
                let actions = match event {
                    Event::Data(b) => {
                        bytes += b;
                        aligner.on_batch(b);
                        Vec::new()
                    }
                    Event::Barrier(id) => {
                        delivered[c].insert(id);
                        outcome.delivered.insert(id);
                        first_barrier.entry(id).or_insert((now, bytes));
                        aligner.on_barrier(now, c, barrier(id))
                    }
                    Event::Cancel(id) => {
                        dropped = dropped.max(id);
                        aligner.on_cancel_marker(now, c, chk(id))
                    }
                    Event::End => {
                        ended[c] = true;
                        aligner.on_end_of_partition(now, c)
                    }
                };
                (Some(c), Some(event), actions)
            } else {
                let id = *pending_abort.take().expect("an abort is pending");
                pending_abort = aborts.next();
                dropped = dropped.max(id);
                (None, None, aligner.abort(chk(id)))
            };

            for action in actions {
                match action {
                    AlignerAction::Block(c) => {
                        prop_assert_eq!(Some(c), channel, "only the delivering channel blocks");
                        prop_assert!(matches!(event, Some(Event::Barrier(_))));
                        prop_assert!(!blocked[c] && !ended[c]);
                        blocked[c] = true;
                    }
                    AlignerAction::UnblockAll => blocked.fill(false),
                    AlignerAction::Snapshot {
                        barrier,
                        alignment,
                        bytes_during_alignment,
                    } => {
                        let id = barrier.id.0;
                        prop_assert!(
                            id > last_resolved,
                            "{} resolved after {}",
                            id,
                            last_resolved
                        );
                        last_resolved = id;
                        prop_assert!(id > dropped, "snapshot of dropped {}", id);
                        for c in 0..n {
                            prop_assert!(ended[c] || delivered[c].contains(&id));
                        }
                        let (start, bytes_at_start) = first_barrier[&id];
                        prop_assert_eq!(alignment, now - start);
                        prop_assert_eq!(bytes_during_alignment, bytes - bytes_at_start);
                        outcome.snapshots.push(id);
                    }
                    AlignerAction::Abort { checkpoint, reason } => {
                        let id = checkpoint.0;
                        prop_assert!(
                            id > last_resolved,
                            "{} resolved after {}",
                            id,
                            last_resolved
                        );
                        last_resolved = id;
                        match reason {
                            CancelMarker => {
                                prop_assert!(matches!(event, Some(Event::Cancel(c)) if c == id))
                            }
                            CoordinatorAborted => prop_assert!(event.is_none()),
                            SubsumedByNewerBarrier(newer) => prop_assert!(newer.0 > id),
                        }
                        outcome.aborts.push(id);
                    }
                }
            }
            prop_assert_eq!(
                aligner.aligning().is_some(),
                blocked.contains(&true),
                "channels are blocked exactly while a checkpoint aligns"
            );
        }

        for (c, events) in scenario.channels.iter().enumerate() {
            prop_assert_eq!(next[c], events.len(), "channel {} stuck", c);
        }
        prop_assert!(!blocked.contains(&true));
        prop_assert_eq!(aligner.aligning(), None);
        Ok(outcome)
    }

    proptest! {
        #[test]
        fn every_delivered_checkpoint_is_snapshotted_once_in_order(scenario in scenario(false)) {
            let outcome = simulate(&scenario)?;
            prop_assert!(outcome.aborts.is_empty());
            let snapshotted: BTreeSet<u64> = outcome.snapshots.iter().copied().collect();
            prop_assert_eq!(snapshotted, outcome.delivered);
        }

        #[test]
        fn cancels_and_aborts_resolve_each_checkpoint_at_most_once(scenario in scenario(true)) {
            let outcome = simulate(&scenario)?;
            let mut resolved = outcome.snapshots.clone();
            resolved.extend(&outcome.aborts);
            let distinct: BTreeSet<u64> = resolved.iter().copied().collect();
            prop_assert_eq!(distinct.len(), resolved.len());
        }
    }
}
