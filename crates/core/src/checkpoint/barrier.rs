//! Barrier handling, after Flink's `SingleCheckpointBarrierHandler` with its
//! aligned, unaligned and alternating (aligned with timeout) states, as a
//! sans-IO state machine that owns the subtask's input gate: the shell hands
//! it what the input endpoints deliver and polls it for the operator's next
//! input, with the current time, and carries out the actions it returns (take
//! the snapshot, write the channel state, decline, end the input). It owns no
//! clock, thread or channel.
//!
//! Checkpoint ids only grow, so the handler keeps a single watermark: the
//! newest id it has heard of by any means (a barrier, a cancel marker, a
//! coordinator abort). An id above the watermark supersedes the checkpoint in
//! progress; an id at or below it that is not pending is settled and
//! ignored. That one rule makes every checkpoint resolve — snapshot or abort —
//! at most once, in increasing id order, and leaves no channel blocked once
//! nothing is being aligned.
//!
//! An unaligned snapshot is taken before the operator has processed all the
//! input that precedes the barrier on every channel; that input is the
//! checkpoint's channel state. Per channel it is what the gate holds ahead of
//! the barrier when the snapshot is taken, then what the channel delivers
//! until its barrier (or its end) is delivered. The handler records copies:
//! the batches themselves are still processed as usual, after the snapshot.

use crate::model::batch::Batch;
use crate::model::event::{Alignment, Barrier, ChannelEvent};
use crate::model::gate::{Control, Input, InputGate};
use crate::model::ids::CheckpointId;
use crate::time::{WatermarkEvent, WatermarkValve};
use std::time::{Duration, Instant};

/// What `poll` found for the operator.
#[derive(Debug)]
pub enum Polled {
    /// A batch for the operator. `credited`: it came through the input
    /// endpoint, which must be told when it is consumed; replayed channel
    /// state is not.
    Batch {
        /// The gate channel it came from.
        channel: usize,
        /// The records.
        batch: Batch,
        /// Whether consuming it returns a credit to the input endpoint.
        credited: bool,
    },
    /// The gate held a control event (or the timeout fired); carry out these
    /// actions, possibly none.
    Actions(Vec<BarrierAction>),
    /// A watermark or status reached the operator and changed the subtask's
    /// watermark or status: advance the operator, then forward these.
    Watermarks(Vec<WatermarkEvent>),
}

/// What the subtask must do, in order.
#[derive(Clone, Debug)]
pub enum BarrierAction {
    /// Take the snapshot now, then forward `barrier` downstream. An unaligned
    /// one (`unaligned`) is forwarded ahead of queued output: its
    /// `options.alignment` is `Unaligned`, and exactly one `ChannelState` or
    /// `Abort` of its checkpoint follows. `timed_out`: it began aligned and
    /// switched because the alignment here outlasted the barrier's timeout.
    Snapshot {
        /// The barrier to forward (options as taken here).
        barrier: Barrier,
        /// Whether the snapshot is unaligned.
        unaligned: bool,
        /// Whether an aligned-with-timeout checkpoint switched to unaligned.
        timed_out: bool,
        /// From the first barrier of the checkpoint here to the snapshot
        /// (Flink's alignment duration).
        alignment: Duration,
        /// Bytes of the batches the operator processed meanwhile (Flink's
        /// bytes processed during alignment).
        bytes_during_alignment: u64,
    },
    /// The input channel state of an unaligned snapshot, indexed by channel,
    /// each in channel order; `alignment` runs from the first barrier to the
    /// last.
    ChannelState {
        /// The unaligned checkpoint.
        checkpoint: CheckpointId,
        /// Per gate channel, the batches that belong to the channel state.
        inputs: Vec<Vec<Batch>>,
        /// From the first barrier to the last.
        alignment: Duration,
    },
    /// The checkpoint is abandoned at this subtask: the shell declines it to
    /// the coordinator and forwards a cancel marker downstream. Emitted at
    /// most once per checkpoint id.
    Abort {
        /// The abandoned checkpoint.
        checkpoint: CheckpointId,
        /// Why.
        reason: AbortReason,
    },
    /// Every channel ended and the operator has seen all its input. Emitted once.
    EndInput,
}

/// Why this subtask abandoned a checkpoint; the shell reports it in the decline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbortReason {
    /// An upstream subtask abandoned the checkpoint and said so in-band.
    CancelMarker,
    /// A newer checkpoint reached this subtask — by its barrier, a cancel
    /// marker or a coordinator abort — before this one resolved; since ids
    /// only grow, the older one can no longer complete here.
    SubsumedByNewerBarrier(CheckpointId),
    /// The coordinator gave up on the checkpoint (notify abort).
    CoordinatorAborted,
}

/// The checkpoint in progress.
#[derive(Debug)]
struct Pending {
    /// The first barrier of the checkpoint to reach this subtask.
    barrier: Barrier,
    started: Instant,
    phase: Phase,
}

#[derive(Debug)]
enum Phase {
    /// Channels that delivered the barrier are blocked until every channel has.
    Aligning {
        /// Per channel: its barrier was polled.
        delivered: Vec<bool>,
        bytes: u64,
        /// When an alignment with a timeout switches to unaligned.
        deadline: Option<Instant>,
    },
    /// Snapshotted unaligned; recording each channel's state until it is done.
    Collecting {
        inputs: Vec<Vec<Batch>>,
        /// Per channel: nothing more of it belongs to the channel state.
        done: Vec<bool>,
    },
}

/// Decides, for one subtask's input gate, what the operator gets next, which
/// channels wait for the others and when the snapshot of a checkpoint is due.
///
/// Channel indices are those of the gate; an index out of range is a bug of
/// the caller and panics.
#[derive(Debug)]
pub struct BarrierHandler {
    gate: InputGate,
    /// Per channel: its end of partition was polled.
    ended: Vec<bool>,
    /// Per channel: its end of partition was delivered; nothing follows it.
    closed: Vec<bool>,
    /// Newest checkpoint id heard of; every id up to it is either pending
    /// (then it is this one) or settled.
    newest: Option<CheckpointId>,
    pending: Option<Pending>,
    /// Watermarks pass the gate like batches (blocked with their channel),
    /// so the operator never sees a watermark from after a barrier before
    /// the snapshot of that barrier.
    valve: WatermarkValve,
}

impl BarrierHandler {
    /// A handler for a gate of `channels` input channels.
    pub fn new(channels: usize) -> Self {
        BarrierHandler {
            gate: InputGate::new(channels),
            ended: vec![false; channels],
            closed: vec![false; channels],
            newest: None,
            pending: None,
            valve: WatermarkValve::new(channels),
        }
    }

    /// Number of input channels.
    pub fn channels(&self) -> usize {
        self.gate.channels()
    }

    /// Channel state of the restored checkpoint: polled before anything
    /// delivered on any channel, without credit.
    pub fn replay(&mut self, channel: usize, batches: Vec<Batch>) {
        self.check_channel(channel);
        self.gate.replay(channel, batches);
    }

    /// The input endpoint of `channel` delivered `event`, in order. Barriers
    /// and cancel markers take effect when `poll` (or `poll_control`)
    /// reaches them, except that a
    /// barrier or end of partition ends its channel's part of the channel
    /// state being recorded the moment it is delivered.
    pub fn deliver(
        &mut self,
        now: Instant,
        channel: usize,
        event: ChannelEvent,
    ) -> Vec<BarrierAction> {
        self.check_channel(channel);
        let mut actions = Vec::new();
        if let Some(Pending {
            barrier,
            phase: Phase::Collecting { inputs, done },
            ..
        }) = self.pending.as_mut()
        {
            if !done[channel] {
                match &event {
                    ChannelEvent::Batch(batch) => inputs[channel].push(batch.clone()),
                    ChannelEvent::Barrier(b) if b.id == barrier.id => done[channel] = true,
                    ChannelEvent::EndOfPartition => done[channel] = true,
                    _ => {}
                }
            }
        }
        if matches!(event, ChannelEvent::EndOfPartition) {
            self.closed[channel] = true;
        }
        self.gate.push(channel, event);
        self.complete_collection(now, &mut actions);
        actions
    }

    /// An unaligned barrier came in on `channel` ahead of `overtaken`, the
    /// batches its input endpoint still held (copies: they are delivered
    /// afterwards as usual). It takes effect at once. A barrier on a channel
    /// that already delivered it or has ended cannot come from a well-behaved
    /// endpoint and is ignored.
    pub fn deliver_priority(
        &mut self,
        now: Instant,
        channel: usize,
        barrier: Barrier,
        overtaken: Vec<Batch>,
    ) -> Vec<BarrierAction> {
        self.check_channel(channel);
        let mut actions = Vec::new();
        if self.closed[channel] {
            return actions;
        }
        let id = barrier.id;
        if self.is_newer(id) {
            self.supersede(id, &mut actions);
            self.start(now, barrier, None);
            self.snapshot_unaligned(now, false, &mut actions);
        } else if self.aligning() == Some(id) {
            // Its upstream already went unaligned: waiting here gains nothing.
            self.snapshot_unaligned(now, false, &mut actions);
        }
        if let Some(Pending {
            barrier,
            phase: Phase::Collecting { inputs, done },
            ..
        }) = self.pending.as_mut()
        {
            if barrier.id == id && !done[channel] {
                inputs[channel].extend(overtaken);
                done[channel] = true;
            }
        }
        self.complete_collection(now, &mut actions);
        actions
    }

    /// Next thing for the operator; `None` when nothing is pollable (empty
    /// or blocked). A due alignment timeout is acted on first.
    pub fn poll(&mut self, now: Instant) -> Option<Polled> {
        let timed_out = self.on_timeout(now);
        if !timed_out.is_empty() {
            return Some(Polled::Actions(timed_out));
        }
        let (channel, input) = self.gate.poll()?;
        let mut actions = Vec::new();
        match input {
            Input::Replayed(batch) => return Some(self.batch(channel, batch, false)),
            Input::Delivered(ChannelEvent::Batch(batch)) => {
                return Some(self.batch(channel, batch, true))
            }
            Input::Delivered(ChannelEvent::Barrier(barrier)) => {
                self.on_control(now, channel, Control::Barrier(barrier), &mut actions)
            }
            Input::Delivered(ChannelEvent::CancelMarker(checkpoint)) => {
                self.on_control(now, channel, Control::Cancel(checkpoint), &mut actions)
            }
            Input::Delivered(ChannelEvent::EndOfPartition) => {
                self.on_end_of_partition(now, channel, &mut actions)
            }
            Input::Delivered(ChannelEvent::Watermark(watermark)) => {
                let mut events = Vec::new();
                self.valve.on_watermark(channel, watermark, &mut events);
                return Some(Polled::Watermarks(events));
            }
            Input::Delivered(ChannelEvent::WatermarkStatus(status)) => {
                let mut events = Vec::new();
                self.valve.on_status(channel, status, &mut events);
                return Some(Polled::Watermarks(events));
            }
        }
        Some(Polled::Actions(actions))
    }

    /// While the operator takes no input (it fires the timers a watermark
    /// made due, in turns), the actions of a checkpoint's barrier or a
    /// cancel marker that nothing is queued ahead of on its channel
    /// (`InputGate::poll_control`), or of a due alignment timeout; `None`
    /// when there is none. The operator's state between two turns is as
    /// consistent as after the last: the keyed timers yet to fire are in
    /// it, implied ones in the function's state that names them again on
    /// restore, and they fire once the watermark comes again (a restored
    /// source sends its own first). So an aligned checkpoint need not wait
    /// for millions of timers, as an unaligned one does not.
    pub fn poll_control(&mut self, now: Instant) -> Option<Vec<BarrierAction>> {
        let timed_out = self.on_timeout(now);
        if !timed_out.is_empty() {
            return Some(timed_out);
        }
        let (channel, control) = self.gate.poll_control()?;
        let mut actions = Vec::new();
        self.on_control(now, channel, control, &mut actions);
        Some(actions)
    }

    /// A barrier or cancel marker reached the operator's side of the gate.
    fn on_control(
        &mut self,
        now: Instant,
        channel: usize,
        control: Control,
        actions: &mut Vec<BarrierAction>,
    ) {
        match control {
            Control::Barrier(barrier) => self.on_barrier(now, channel, barrier, actions),
            // One marker settles the checkpoint for the whole gate.
            Control::Cancel(checkpoint) => {
                self.abandon(checkpoint, AbortReason::CancelMarker, actions)
            }
        }
    }

    /// The coordinator aborted `checkpoint` (notify abort): end it if it is
    /// the one in progress.
    ///
    /// An abort of a checkpoint newer than any seen is also answered with an
    /// `Abort`, so that the shell forwards a cancel marker and downstream
    /// does not wait for a barrier that will never come; its barriers are
    /// stale from then on.
    pub fn abort(&mut self, checkpoint: CheckpointId) -> Vec<BarrierAction> {
        let mut actions = Vec::new();
        self.abandon(checkpoint, AbortReason::CoordinatorAborted, &mut actions);
        actions
    }

    /// When the alignment in progress times out; the shell calls `on_timeout`
    /// then unless `poll` got there first.
    pub fn deadline(&self) -> Option<Instant> {
        match self.pending.as_ref()?.phase {
            Phase::Aligning { deadline, .. } => deadline,
            Phase::Collecting { .. } => None,
        }
    }

    /// Switches an alignment that has lasted its timeout to unaligned.
    pub fn on_timeout(&mut self, now: Instant) -> Vec<BarrierAction> {
        let mut actions = Vec::new();
        if self.deadline().is_some_and(|deadline| now >= deadline) {
            self.snapshot_unaligned(now, true, &mut actions);
            self.complete_collection(now, &mut actions);
        }
        actions
    }

    /// The checkpoint being aligned or collecting channel state.
    pub fn pending(&self) -> Option<CheckpointId> {
        self.pending.as_ref().map(|p| p.barrier.id)
    }

    fn aligning(&self) -> Option<CheckpointId> {
        self.pending
            .as_ref()
            .filter(|p| matches!(p.phase, Phase::Aligning { .. }))
            .map(|p| p.barrier.id)
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

    fn batch(&mut self, channel: usize, batch: Batch, credited: bool) -> Polled {
        if let Some(Pending {
            phase: Phase::Aligning { bytes, .. },
            ..
        }) = self.pending.as_mut()
        {
            *bytes = bytes.saturating_add(batch.bytes() as u64);
        }
        Polled::Batch {
            channel,
            batch,
            credited,
        }
    }

    /// A barrier reached the operator's side of the gate on `channel`.
    fn on_barrier(
        &mut self,
        now: Instant,
        channel: usize,
        barrier: Barrier,
        actions: &mut Vec<BarrierAction>,
    ) {
        if self.ended[channel] {
            return;
        }
        if self.is_newer(barrier.id) {
            self.supersede(barrier.id, actions);
            let deadline = match barrier.options.alignment {
                Alignment::AlignedWithTimeout(timeout) => now.checked_add(timeout),
                Alignment::Aligned | Alignment::Unaligned => None,
            };
            self.start(now, barrier, deadline);
        }
        // Any other id is settled (stale), and so is the barrier of a
        // checkpoint already collecting: its channel was done when the
        // barrier was delivered. A repeat on a channel changes nothing.
        let Some(Pending {
            barrier: pending,
            phase: Phase::Aligning { delivered, .. },
            ..
        }) = self.pending.as_mut()
        else {
            return;
        };
        if pending.id != barrier.id || delivered[channel] {
            return;
        }
        delivered[channel] = true;
        if all_delivered(delivered, &self.ended) {
            self.snapshot_aligned(now, actions);
        } else if barrier.options.alignment == Alignment::Unaligned {
            // The endpoint sends these ahead of the data; one found in-band
            // has nothing left to overtake, but the other channels may.
            self.snapshot_unaligned(now, false, actions);
            self.complete_collection(now, actions);
        } else {
            self.gate.set_blocked(channel, true);
            actions.extend(self.on_timeout(now));
        }
    }

    /// End of partition counts as the barrier of every current and future
    /// checkpoint on that channel.
    fn on_end_of_partition(
        &mut self,
        now: Instant,
        channel: usize,
        actions: &mut Vec<BarrierAction>,
    ) {
        if self.ended[channel] {
            return;
        }
        self.ended[channel] = true;
        if let Some(Pending {
            phase: Phase::Aligning { delivered, .. },
            ..
        }) = &self.pending
        {
            if all_delivered(delivered, &self.ended) {
                self.snapshot_aligned(now, actions);
            }
        }
        if self.ended.iter().all(|&ended| ended) {
            actions.push(BarrierAction::EndInput);
        }
    }

    /// Begins aligning the checkpoint of `barrier`, its first barrier here.
    fn start(&mut self, now: Instant, barrier: Barrier, deadline: Option<Instant>) {
        self.pending = Some(Pending {
            barrier,
            started: now,
            phase: Phase::Aligning {
                delivered: vec![false; self.ended.len()],
                bytes: 0,
                deadline,
            },
        });
    }

    /// Raises the watermark to `id`, aborting the older checkpoint in progress.
    fn supersede(&mut self, id: CheckpointId, actions: &mut Vec<BarrierAction>) {
        self.end_pending(AbortReason::SubsumedByNewerBarrier(id), actions);
        self.newest = Some(id);
    }

    /// Gives up `id` if it is pending or not yet seen; settled ids were
    /// already resolved once and stay silent.
    fn abandon(&mut self, id: CheckpointId, reason: AbortReason, actions: &mut Vec<BarrierAction>) {
        if self.pending() == Some(id) {
            self.end_pending(reason, actions);
        } else if self.is_newer(id) {
            self.supersede(id, actions);
            actions.push(BarrierAction::Abort {
                checkpoint: id,
                reason,
            });
        }
    }

    /// Aborts the checkpoint in progress, if any, dropping what it recorded
    /// and releasing its channels.
    fn end_pending(&mut self, reason: AbortReason, actions: &mut Vec<BarrierAction>) {
        if let Some(pending) = self.pending.take() {
            actions.push(BarrierAction::Abort {
                checkpoint: pending.barrier.id,
                reason,
            });
            self.gate.unblock_all();
        }
    }

    /// Snapshots the alignment in progress and releases its channels.
    fn snapshot_aligned(&mut self, now: Instant, actions: &mut Vec<BarrierAction>) {
        if let Some(Pending {
            barrier,
            started,
            phase: Phase::Aligning { bytes, .. },
        }) = self.pending.take()
        {
            actions.push(BarrierAction::Snapshot {
                barrier,
                unaligned: false,
                timed_out: false,
                alignment: now.saturating_duration_since(started),
                bytes_during_alignment: bytes,
            });
            self.gate.unblock_all();
        }
    }

    /// Snapshots the alignment in progress unaligned and starts recording its
    /// channel state: nothing waits any more. A channel that delivered the
    /// barrier is done with nothing (what it holds comes after the barrier);
    /// any other starts with what the gate holds ahead of the barrier, and
    /// is done if the barrier or its end is already there.
    fn snapshot_unaligned(
        &mut self,
        now: Instant,
        timed_out: bool,
        actions: &mut Vec<BarrierAction>,
    ) {
        let Some(pending) = self.pending.as_mut() else {
            return;
        };
        let Phase::Aligning {
            delivered, bytes, ..
        } = &pending.phase
        else {
            return;
        };
        let bytes_during_alignment = *bytes;
        let (inputs, done) = delivered
            .iter()
            .enumerate()
            .map(|(channel, &delivered)| {
                if delivered {
                    (Vec::new(), true)
                } else {
                    let (batches, found) = self.gate.batches_before(channel, pending.barrier.id);
                    (batches, found || self.closed[channel])
                }
            })
            .unzip();
        pending.phase = Phase::Collecting { inputs, done };
        self.gate.unblock_all();
        let mut barrier = pending.barrier;
        barrier.options.alignment = Alignment::Unaligned;
        actions.push(BarrierAction::Snapshot {
            barrier,
            unaligned: true,
            timed_out,
            alignment: now.saturating_duration_since(pending.started),
            bytes_during_alignment,
        });
    }

    /// Hands over the channel state once every channel is done.
    fn complete_collection(&mut self, now: Instant, actions: &mut Vec<BarrierAction>) {
        let collected = self.pending.take_if(
            |p| matches!(&p.phase, Phase::Collecting { done, .. } if done.iter().all(|&d| d)),
        );
        if let Some(Pending {
            barrier,
            started,
            phase: Phase::Collecting { inputs, .. },
        }) = collected
        {
            actions.push(BarrierAction::ChannelState {
                checkpoint: barrier.id,
                inputs,
                alignment: now.saturating_duration_since(started),
            });
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::model::event::{CheckpointKind, CheckpointOptions};
    use proptest::prelude::*;
    use proptest::sample::Index;
    use std::collections::{BTreeMap, BTreeSet, VecDeque};
    use std::sync::OnceLock;

    use AbortReason::{CancelMarker, CoordinatorAborted, SubsumedByNewerBarrier};

    const A: usize = 0;
    const B: usize = 1;
    const C: usize = 2;

    /// Fake clock: a fixed base plus an offset; only differences matter.
    fn t(ms: u64) -> Instant {
        static BASE: OnceLock<Instant> = OnceLock::new();
        *BASE.get_or_init(Instant::now) + Duration::from_millis(ms)
    }

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    fn chk(id: u64) -> CheckpointId {
        CheckpointId(id)
    }

    fn barrier_with(id: u64, alignment: Alignment) -> Barrier {
        Barrier {
            id: chk(id),
            timestamp: 1_000 * id,
            options: CheckpointOptions {
                kind: CheckpointKind::Checkpoint,
                alignment,
            },
        }
    }

    fn barrier(id: u64) -> Barrier {
        barrier_with(id, Alignment::Aligned)
    }

    /// Unaligned: always delivered as a priority barrier.
    fn unaligned(id: u64) -> Barrier {
        barrier_with(id, Alignment::Unaligned)
    }

    fn with_timeout(id: u64, timeout_ms: u64) -> Barrier {
        barrier_with(id, Alignment::AlignedWithTimeout(ms(timeout_ms)))
    }

    fn in_band(barrier: Barrier) -> ChannelEvent {
        ChannelEvent::Barrier(barrier)
    }

    fn cancel(id: u64) -> ChannelEvent {
        ChannelEvent::CancelMarker(chk(id))
    }

    fn batch(value: u64) -> Batch {
        Batch::new(vec![value])
    }

    fn batches(values: &[u64]) -> Vec<Batch> {
        values.iter().map(|&v| batch(v)).collect()
    }

    fn data(value: u64) -> ChannelEvent {
        ChannelEvent::Batch(batch(value))
    }

    /// A batch of `n` records: `8 * n` bytes.
    fn records(n: usize) -> ChannelEvent {
        ChannelEvent::Batch(Batch::new(vec![0u64; n]))
    }

    /// The values of `u64` batches, in order.
    pub(in crate::checkpoint) fn values(batches: Vec<Batch>) -> Vec<u64> {
        batches
            .into_iter()
            .flat_map(|b| b.into_records::<u64>().expect("u64 records"))
            .collect()
    }

    /// An action with its batches turned into their values, to compare.
    #[derive(Debug, PartialEq)]
    enum Seen {
        Snapshot {
            barrier: Barrier,
            unaligned: bool,
            timed_out: bool,
            alignment: Duration,
            bytes: u64,
        },
        State {
            checkpoint: CheckpointId,
            inputs: Vec<Vec<u64>>,
            alignment: Duration,
        },
        Abort(CheckpointId, AbortReason),
        EndInput,
    }

    fn seen(actions: Vec<BarrierAction>) -> Vec<Seen> {
        actions
            .into_iter()
            .map(|action| match action {
                BarrierAction::Snapshot {
                    barrier,
                    unaligned,
                    timed_out,
                    alignment,
                    bytes_during_alignment,
                } => Seen::Snapshot {
                    barrier,
                    unaligned,
                    timed_out,
                    alignment,
                    bytes: bytes_during_alignment,
                },
                BarrierAction::ChannelState {
                    checkpoint,
                    inputs,
                    alignment,
                } => Seen::State {
                    checkpoint,
                    inputs: inputs.into_iter().map(values).collect(),
                    alignment,
                },
                BarrierAction::Abort { checkpoint, reason } => Seen::Abort(checkpoint, reason),
                BarrierAction::EndInput => Seen::EndInput,
            })
            .collect()
    }

    /// The aligned snapshot of `barrier(id)`.
    fn snapshot(id: u64, alignment_ms: u64, bytes: u64) -> Seen {
        Seen::Snapshot {
            barrier: barrier(id),
            unaligned: false,
            timed_out: false,
            alignment: ms(alignment_ms),
            bytes,
        }
    }

    /// An unaligned snapshot; the barrier to forward is always `unaligned(id)`.
    fn unaligned_snapshot(id: u64, timed_out: bool, alignment_ms: u64, bytes: u64) -> Seen {
        Seen::Snapshot {
            barrier: unaligned(id),
            unaligned: true,
            timed_out,
            alignment: ms(alignment_ms),
            bytes,
        }
    }

    fn state<const N: usize>(id: u64, inputs: [&[u64]; N], alignment_ms: u64) -> Seen {
        Seen::State {
            checkpoint: chk(id),
            inputs: inputs.iter().map(|i| i.to_vec()).collect(),
            alignment: ms(alignment_ms),
        }
    }

    fn aborted(id: u64, reason: AbortReason) -> Seen {
        Seen::Abort(chk(id), reason)
    }

    /// What `poll` gave, comparable.
    #[derive(Debug, PartialEq)]
    enum Got {
        Batch {
            channel: usize,
            values: Vec<u64>,
            credited: bool,
        },
        Actions(Vec<Seen>),
        Watermarks(Vec<crate::time::WatermarkEvent>),
    }

    fn poll(h: &mut BarrierHandler, now: Instant) -> Option<Got> {
        h.poll(now).map(|polled| match polled {
            Polled::Batch {
                channel,
                batch,
                credited,
            } => Got::Batch {
                channel,
                values: values(vec![batch]),
                credited,
            },
            Polled::Actions(actions) => Got::Actions(seen(actions)),
            Polled::Watermarks(events) => Got::Watermarks(events),
        })
    }

    fn got(channel: usize, value: u64, credited: bool) -> Got {
        Got::Batch {
            channel,
            values: vec![value],
            credited,
        }
    }

    fn drain(h: &mut BarrierHandler, now: Instant) -> Vec<Got> {
        std::iter::from_fn(|| poll(h, now)).collect()
    }

    /// The batch values each channel gave the operator while draining, in
    /// order, with their credit; and every action drained.
    fn drain_by_channel(
        h: &mut BarrierHandler,
        now: Instant,
    ) -> (Vec<Vec<(u64, bool)>>, Vec<Seen>) {
        let mut batches = vec![Vec::new(); h.channels()];
        let mut actions = Vec::new();
        for got in drain(h, now) {
            match got {
                Got::Batch {
                    channel,
                    values,
                    credited,
                } => batches[channel].extend(values.into_iter().map(|v| (v, credited))),
                Got::Actions(a) => actions.extend(a),
                Got::Watermarks(_) => {}
            }
        }
        (batches, actions)
    }

    fn credited(values: &[u64]) -> Vec<(u64, bool)> {
        values.iter().map(|&v| (v, true)).collect()
    }

    /// Delivers `event` in-band on `channel` and polls it straight through
    /// (these tests keep every other pollable queue empty): its actions.
    fn step(
        h: &mut BarrierHandler,
        now: Instant,
        channel: usize,
        event: ChannelEvent,
    ) -> Vec<Seen> {
        let mut actions = seen(h.deliver(now, channel, event));
        match poll(h, now) {
            Some(Got::Actions(a)) => actions.extend(a),
            Some(Got::Batch {
                channel: c,
                credited,
                ..
            }) => assert_eq!((c, credited), (channel, true)),
            Some(Got::Watermarks(_)) => {}
            None => panic!("nothing to poll after a delivery on channel {channel}"),
        }
        actions
    }

    fn deliver(
        h: &mut BarrierHandler,
        now: Instant,
        channel: usize,
        event: ChannelEvent,
    ) -> Vec<Seen> {
        seen(h.deliver(now, channel, event))
    }

    fn blocked(h: &BarrierHandler) -> Vec<usize> {
        (0..h.channels())
            .filter(|&c| h.gate.is_blocked(c))
            .collect()
    }

    // Aligned checkpoints (the former aligner's cases).

    #[test]
    fn seed_scenario_blocks_a_and_b_until_c_delivers_barrier_1() {
        let mut h = BarrierHandler::new(3);
        // data1, data2 on A: before any barrier, not alignment.
        assert_eq!(step(&mut h, t(0), A, records(1)), []);
        assert_eq!(step(&mut h, t(0), A, records(2)), []);
        assert_eq!(step(&mut h, t(100), A, in_band(barrier(1))), []);
        assert_eq!(blocked(&h), [A]);
        assert_eq!(h.pending(), Some(chk(1)));
        // data3 on A waits behind the barrier.
        assert_eq!(deliver(&mut h, t(101), A, data(3)), []);
        // data4 on B, still unblocked.
        assert_eq!(step(&mut h, t(110), B, records(4)), []);
        assert_eq!(step(&mut h, t(130), B, in_band(barrier(1))), []);
        assert_eq!(blocked(&h), [A, B]);
        // data6, data7, data8 on C go on being processed.
        assert_eq!(step(&mut h, t(140), C, records(6)), []);
        assert_eq!(step(&mut h, t(150), C, records(7)), []);
        assert_eq!(step(&mut h, t(160), C, records(8)), []);
        assert_eq!(
            step(&mut h, t(175), C, in_band(barrier(1))),
            [snapshot(1, 75, 8 * (4 + 6 + 7 + 8))]
        );
        assert_eq!(blocked(&h), Vec::<usize>::new());
        assert_eq!(h.pending(), None);
        assert_eq!(drain(&mut h, t(176)), [got(A, 3, true)]);
    }

    #[test]
    fn watermarks_take_the_minimum_and_wait_behind_a_barrier_being_aligned() {
        use crate::time::WatermarkEvent::Watermark;
        let mut h = BarrierHandler::new(2);
        deliver(&mut h, t(0), A, ChannelEvent::Watermark(5));
        deliver(&mut h, t(0), B, ChannelEvent::Watermark(7));
        assert_eq!(
            drain(&mut h, t(1)),
            [Got::Watermarks(vec![]), Got::Watermarks(vec![Watermark(5)])]
        );
        deliver(&mut h, t(2), A, in_band(barrier(1)));
        deliver(&mut h, t(2), A, ChannelEvent::Watermark(20));
        deliver(&mut h, t(2), B, ChannelEvent::Watermark(30));
        deliver(&mut h, t(2), B, in_band(barrier(1)));
        let got = drain(&mut h, t(3));
        let snapshot_at = got
            .iter()
            .position(|g| matches!(g, Got::Actions(a) if !a.is_empty()))
            .expect("the alignment completes");
        let advanced_at = got
            .iter()
            .position(|g| *g == Got::Watermarks(vec![Watermark(20)]))
            .expect("the watermark advances to the minimum, 20");
        assert!(
            snapshot_at < advanced_at,
            "a watermark behind a barrier reached the operator before the snapshot: {got:?}"
        );
    }

    /// What `poll_control` gave until it gave nothing, comparable.
    fn drain_control(h: &mut BarrierHandler, now: Instant) -> Vec<Vec<Seen>> {
        std::iter::from_fn(|| h.poll_control(now).map(seen)).collect()
    }

    /// While the operator fires timers, a barrier with nothing ahead of it
    /// is taken and aligned, and the alignment completes once every
    /// channel's barrier is at its head; a barrier behind a record or a
    /// watermark waits for `poll`, and nothing else is taken.
    #[test]
    fn barriers_at_the_head_pass_while_the_operator_takes_no_input() {
        let mut h = BarrierHandler::new(3);
        deliver(&mut h, t(0), A, in_band(barrier(1)));
        deliver(&mut h, t(0), A, records(1));
        deliver(&mut h, t(0), B, records(2));
        deliver(&mut h, t(0), B, in_band(barrier(1)));
        deliver(&mut h, t(0), C, ChannelEvent::Watermark(4));
        deliver(&mut h, t(0), C, in_band(barrier(1)));
        assert_eq!(drain_control(&mut h, t(1)), [vec![]]);
        assert_eq!(blocked(&h), [A]);
        assert_eq!(h.pending(), Some(chk(1)));

        let b = Got::Batch {
            channel: B,
            values: vec![0, 0],
            credited: true,
        };
        assert_eq!(poll(&mut h, t(2)), Some(b));
        assert_eq!(drain_control(&mut h, t(3)), [vec![]]);
        assert_eq!(blocked(&h), [A, B]);
        assert!(matches!(poll(&mut h, t(4)), Some(Got::Watermarks(_))));
        assert_eq!(drain_control(&mut h, t(5)), [vec![snapshot(1, 4, 16)]]);
        assert_eq!(blocked(&h), Vec::<usize>::new());
        assert_eq!(drain_control(&mut h, t(6)), Vec::<Vec<Seen>>::new());
        assert_eq!(drain(&mut h, t(7)).len(), 1, "A's record stays queued");

        // A cancel marker at the head settles the checkpoint.
        deliver(&mut h, t(8), A, in_band(barrier(2)));
        deliver(&mut h, t(8), B, cancel(2));
        assert_eq!(
            drain_control(&mut h, t(9)),
            [vec![aborted(2, CancelMarker)], vec![]]
        );
        assert_eq!(blocked(&h), Vec::<usize>::new());
    }

    /// An alignment that outlasts its timeout while the operator fires
    /// timers switches to unaligned there too.
    #[test]
    fn an_alignment_times_out_while_the_operator_takes_no_input() {
        let mut h = BarrierHandler::new(2);
        deliver(&mut h, t(0), A, in_band(with_timeout(1, 10)));
        deliver(&mut h, t(0), B, records(3));
        deliver(&mut h, t(0), B, in_band(with_timeout(1, 10)));
        assert_eq!(drain_control(&mut h, t(1)), [vec![]]);
        assert_eq!(
            drain_control(&mut h, t(11)),
            [vec![
                unaligned_snapshot(1, true, 10, 0),
                state(1, [&[], &[0, 0, 0]], 10)
            ]]
        );
    }

    #[test]
    fn single_channel_snapshots_at_once_and_never_blocks() {
        let mut h = BarrierHandler::new(1);
        assert_eq!(step(&mut h, t(0), A, records(1)), []);
        assert_eq!(
            step(&mut h, t(5), A, in_band(barrier(1))),
            [snapshot(1, 0, 0)]
        );
        assert_eq!(h.pending(), None);
        assert_eq!(blocked(&h), Vec::<usize>::new());
        assert_eq!(step(&mut h, t(6), A, records(1)), []);
        assert_eq!(
            step(&mut h, t(9), A, in_band(barrier(2))),
            [snapshot(2, 0, 0)]
        );
    }

    #[test]
    fn single_live_channel_snapshots_at_once_after_the_others_ended() {
        let mut h = BarrierHandler::new(3);
        assert_eq!(step(&mut h, t(0), A, ChannelEvent::EndOfPartition), []);
        assert_eq!(step(&mut h, t(1), B, ChannelEvent::EndOfPartition), []);
        assert_eq!(
            step(&mut h, t(7), C, in_band(barrier(1))),
            [snapshot(1, 0, 0)]
        );
    }

    #[test]
    fn newer_barrier_during_alignment_subsumes_the_older_and_aligns_the_newer() {
        let mut h = BarrierHandler::new(3);
        assert_eq!(step(&mut h, t(0), A, in_band(barrier(1))), []);
        assert_eq!(step(&mut h, t(5), B, records(1)), []);
        assert_eq!(
            step(&mut h, t(10), B, in_band(barrier(2))),
            [aborted(1, SubsumedByNewerBarrier(chk(2)))]
        );
        assert_eq!(blocked(&h), [B]);
        assert_eq!(h.pending(), Some(chk(2)));
        assert_eq!(step(&mut h, t(12), C, records(1)), []);
        assert_eq!(step(&mut h, t(15), A, in_band(barrier(2))), []);
        assert_eq!(blocked(&h), [A, B]);
        // C's barrier of the subsumed checkpoint is stale and blocks nothing.
        assert_eq!(step(&mut h, t(20), C, in_band(barrier(1))), []);
        assert_eq!(blocked(&h), [A, B]);
        assert_eq!(step(&mut h, t(25), C, records(2)), []);
        assert_eq!(
            step(&mut h, t(30), C, in_band(barrier(2))),
            [snapshot(2, 20, 8 + 16)]
        );
        assert_eq!(blocked(&h), Vec::<usize>::new());
    }

    #[test]
    fn cancel_marker_during_alignment_aborts_unblocks_and_later_barriers_are_ignored() {
        let mut h = BarrierHandler::new(3);
        assert_eq!(step(&mut h, t(0), A, in_band(barrier(1))), []);
        assert_eq!(step(&mut h, t(3), B, cancel(1)), [aborted(1, CancelMarker)]);
        assert_eq!(blocked(&h), Vec::<usize>::new());
        assert_eq!(h.pending(), None);
        assert_eq!(step(&mut h, t(4), C, in_band(barrier(1))), []);
        assert_eq!(h.pending(), None);
        // The next checkpoint aligns as usual.
        assert_eq!(step(&mut h, t(10), A, in_band(barrier(2))), []);
        assert_eq!(blocked(&h), [A]);
    }

    #[test]
    fn cancel_marker_for_a_future_checkpoint_makes_its_barriers_stale() {
        let mut h = BarrierHandler::new(2);
        assert_eq!(step(&mut h, t(0), A, cancel(3)), [aborted(3, CancelMarker)]);
        assert_eq!(step(&mut h, t(1), B, cancel(3)), []);
        assert_eq!(step(&mut h, t(2), B, in_band(barrier(3))), []);
        assert_eq!(step(&mut h, t(3), B, in_band(barrier(2))), []);
        assert_eq!(seen(h.deliver_priority(t(3), B, unaligned(3), vec![])), []);
        assert_eq!(h.pending(), None);
        assert_eq!(step(&mut h, t(4), A, in_band(barrier(4))), []);
        assert_eq!(blocked(&h), [A]);
    }

    #[test]
    fn cancel_marker_for_a_newer_checkpoint_ends_the_alignment_in_progress() {
        let mut h = BarrierHandler::new(3);
        assert_eq!(step(&mut h, t(0), A, in_band(barrier(1))), []);
        assert_eq!(
            step(&mut h, t(2), B, cancel(2)),
            [
                aborted(1, SubsumedByNewerBarrier(chk(2))),
                aborted(2, CancelMarker)
            ]
        );
        assert_eq!(blocked(&h), Vec::<usize>::new());
        assert_eq!(step(&mut h, t(3), C, in_band(barrier(1))), []);
        assert_eq!(step(&mut h, t(4), C, in_band(barrier(2))), []);
        assert_eq!(h.pending(), None);
    }

    #[test]
    fn events_of_a_snapshotted_checkpoint_are_stale() {
        let mut h = BarrierHandler::new(2);
        assert_eq!(step(&mut h, t(0), A, in_band(barrier(1))), []);
        assert_eq!(
            step(&mut h, t(1), B, in_band(barrier(1))),
            [snapshot(1, 1, 0)]
        );
        assert_eq!(step(&mut h, t(2), A, in_band(barrier(1))), []);
        assert_eq!(step(&mut h, t(3), B, cancel(1)), []);
        assert_eq!(seen(h.abort(chk(1))), []);
        assert_eq!(h.pending(), None);
    }

    #[test]
    fn end_of_partition_counts_as_delivered_and_completes_the_alignment() {
        let mut h = BarrierHandler::new(3);
        assert_eq!(step(&mut h, t(0), A, in_band(barrier(1))), []);
        assert_eq!(step(&mut h, t(4), B, in_band(barrier(1))), []);
        assert_eq!(step(&mut h, t(5), C, records(1)), []);
        assert_eq!(
            step(&mut h, t(9), C, ChannelEvent::EndOfPartition),
            [snapshot(1, 9, 8)]
        );
        // C counts as delivered for every later checkpoint too.
        assert_eq!(step(&mut h, t(20), A, in_band(barrier(2))), []);
        assert_eq!(
            step(&mut h, t(25), B, in_band(barrier(2))),
            [snapshot(2, 5, 0)]
        );
    }

    #[test]
    fn end_of_partition_of_a_channel_still_owing_the_barrier_keeps_the_wait_for_others() {
        let mut h = BarrierHandler::new(3);
        assert_eq!(step(&mut h, t(0), A, in_band(barrier(1))), []);
        assert_eq!(step(&mut h, t(2), B, ChannelEvent::EndOfPartition), []);
        assert_eq!(h.pending(), Some(chk(1)));
        assert_eq!(
            step(&mut h, t(6), C, in_band(barrier(1))),
            [snapshot(1, 6, 0)]
        );
    }

    #[test]
    fn gate_with_every_channel_ended_aligns_nothing_and_ends_the_input_once() {
        let mut h = BarrierHandler::new(2);
        assert_eq!(step(&mut h, t(0), A, in_band(barrier(1))), []);
        assert_eq!(
            step(&mut h, t(1), B, ChannelEvent::EndOfPartition),
            [snapshot(1, 1, 0)]
        );
        assert_eq!(
            step(&mut h, t(2), A, ChannelEvent::EndOfPartition),
            [Seen::EndInput]
        );
        assert_eq!(step(&mut h, t(3), A, ChannelEvent::EndOfPartition), []);
        assert_eq!(h.pending(), None);
        // Nothing can arrive any more; a barrier on an ended channel is ignored.
        assert_eq!(step(&mut h, t(4), A, in_band(barrier(2))), []);
        assert_eq!(seen(h.deliver_priority(t(4), B, unaligned(2), vec![])), []);
        assert_eq!(h.pending(), None);
    }

    #[test]
    fn coordinator_abort_ends_the_alignment_in_progress() {
        let mut h = BarrierHandler::new(3);
        assert_eq!(step(&mut h, t(0), A, in_band(barrier(1))), []);
        assert_eq!(step(&mut h, t(1), B, in_band(barrier(1))), []);
        assert_eq!(blocked(&h), [A, B]);
        assert_eq!(seen(h.abort(chk(1))), [aborted(1, CoordinatorAborted)]);
        assert_eq!(blocked(&h), Vec::<usize>::new());
        assert_eq!(h.pending(), None);
        assert_eq!(step(&mut h, t(2), C, in_band(barrier(1))), []);
        assert_eq!(step(&mut h, t(3), C, cancel(1)), []);
    }

    #[test]
    fn coordinator_abort_of_a_future_checkpoint_is_forwarded_and_its_barriers_are_stale() {
        let mut h = BarrierHandler::new(2);
        assert_eq!(seen(h.abort(chk(2))), [aborted(2, CoordinatorAborted)]);
        assert_eq!(seen(h.abort(chk(2))), []);
        assert_eq!(seen(h.abort(chk(1))), []);
        assert_eq!(step(&mut h, t(0), A, in_band(barrier(1))), []);
        assert_eq!(step(&mut h, t(1), A, in_band(barrier(2))), []);
        assert_eq!(blocked(&h), Vec::<usize>::new());
        assert_eq!(step(&mut h, t(2), A, in_band(barrier(3))), []);
        assert_eq!(blocked(&h), [A]);
    }

    #[test]
    fn coordinator_abort_of_a_newer_checkpoint_ends_the_alignment_in_progress() {
        let mut h = BarrierHandler::new(2);
        assert_eq!(step(&mut h, t(0), A, in_band(barrier(1))), []);
        assert_eq!(
            seen(h.abort(chk(2))),
            [
                aborted(1, SubsumedByNewerBarrier(chk(2))),
                aborted(2, CoordinatorAborted)
            ]
        );
        assert_eq!(blocked(&h), Vec::<usize>::new());
        assert_eq!(step(&mut h, t(1), B, in_band(barrier(1))), []);
        assert_eq!(h.pending(), None);
    }

    #[test]
    fn abort_is_emitted_at_most_once_per_checkpoint() {
        let mut h = BarrierHandler::new(3);
        let mut actions = step(&mut h, t(0), A, in_band(barrier(1)));
        actions.extend(step(&mut h, t(1), B, cancel(1)));
        actions.extend(step(&mut h, t(2), C, cancel(1)));
        actions.extend(seen(h.abort(chk(1))));
        actions.extend(step(&mut h, t(3), C, in_band(barrier(1))));
        actions.extend(step(&mut h, t(4), B, in_band(barrier(1))));
        actions.extend(seen(h.deliver_priority(t(5), B, unaligned(1), vec![])));
        assert_eq!(actions, [aborted(1, CancelMarker)]);
    }

    #[test]
    fn bytes_during_alignment_start_from_zero_for_each_checkpoint() {
        let mut h = BarrierHandler::new(2);
        assert_eq!(step(&mut h, t(0), A, records(12)), []);
        assert_eq!(step(&mut h, t(0), A, in_band(barrier(1))), []);
        assert_eq!(step(&mut h, t(0), B, records(1)), []);
        assert_eq!(
            step(&mut h, t(1), B, in_band(barrier(1))),
            [snapshot(1, 1, 8)]
        );
        assert_eq!(step(&mut h, t(5), B, records(12)), []);
        assert_eq!(step(&mut h, t(10), B, in_band(barrier(2))), []);
        assert_eq!(step(&mut h, t(11), A, records(2)), []);
        assert_eq!(
            step(&mut h, t(12), A, in_band(barrier(2))),
            [snapshot(2, 2, 16)]
        );
    }

    #[test]
    fn repeated_barrier_on_a_channel_is_ignored() {
        let mut h = BarrierHandler::new(2);
        assert_eq!(step(&mut h, t(0), A, in_band(barrier(1))), []);
        // The repeat waits behind the block, then is stale.
        assert_eq!(deliver(&mut h, t(1), A, in_band(barrier(1))), []);
        assert_eq!(poll(&mut h, t(1)), None);
        assert_eq!(h.pending(), Some(chk(1)));
        assert_eq!(
            step(&mut h, t(2), B, in_band(barrier(1))),
            [snapshot(1, 2, 0)]
        );
        assert_eq!(drain(&mut h, t(3)), [Got::Actions(vec![])]);

        // A repeated priority barrier adds nothing to the channel state.
        assert_eq!(
            seen(h.deliver_priority(t(10), A, unaligned(2), batches(&[1]))),
            [unaligned_snapshot(2, false, 0, 0)]
        );
        assert_eq!(
            seen(h.deliver_priority(t(11), A, unaligned(2), batches(&[2]))),
            []
        );
        assert_eq!(
            seen(h.deliver_priority(t(12), B, unaligned(2), vec![])),
            [state(2, [&[1], &[]], 2)]
        );
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn channel_out_of_range_panics() {
        BarrierHandler::new(2).deliver(t(0), 2, cancel(1));
    }

    // Unaligned checkpoints.

    #[test]
    fn unaligned_barrier_snapshots_at_once_and_records_exactly_the_input_before_it() {
        let mut h = BarrierHandler::new(3);
        for (channel, value) in [(A, 1), (A, 2), (B, 10), (B, 11), (C, 20)] {
            assert_eq!(deliver(&mut h, t(0), channel, data(value)), []);
        }
        assert_eq!(poll(&mut h, t(1)), Some(got(A, 1, true)));
        assert_eq!(poll(&mut h, t(1)), Some(got(B, 10, true)));

        // A's endpoint still held 3 and 4 when barrier 1 came: it overtook them.
        assert_eq!(
            seen(h.deliver_priority(t(100), A, unaligned(1), batches(&[3, 4]))),
            [unaligned_snapshot(1, false, 0, 0)]
        );
        assert_eq!(h.pending(), Some(chk(1)));
        assert_eq!(blocked(&h), Vec::<usize>::new());
        // A is done: the overtaken batches, and 5 after the barrier, are not recorded again.
        for value in [3, 4, 5] {
            assert_eq!(deliver(&mut h, t(101), A, data(value)), []);
        }
        // The operator goes on processing meanwhile.
        assert_eq!(poll(&mut h, t(102)), Some(got(C, 20, true)));
        assert_eq!(poll(&mut h, t(102)), Some(got(A, 2, true)));
        assert_eq!(blocked(&h), Vec::<usize>::new());
        // B delivers 12 before its own priority barrier overtakes 13; 14 comes after.
        assert_eq!(deliver(&mut h, t(110), B, data(12)), []);
        assert_eq!(
            seen(h.deliver_priority(t(130), B, unaligned(1), batches(&[13]))),
            []
        );
        for value in [13, 14] {
            assert_eq!(deliver(&mut h, t(131), B, data(value)), []);
        }
        // C's upstream stayed aligned: its in-band barrier ends C's state when delivered.
        assert_eq!(deliver(&mut h, t(140), C, data(21)), []);
        assert_eq!(
            deliver(&mut h, t(175), C, in_band(with_timeout(1, 1_000))),
            [state(1, [&[2, 3, 4], &[11, 12, 13], &[20, 21]], 75)]
        );
        assert_eq!(h.pending(), None);
        assert_eq!(deliver(&mut h, t(176), C, data(22)), []);

        // Everything is still processed, in channel order; C's barrier is stale.
        let (processed, actions) = drain_by_channel(&mut h, t(200));
        assert_eq!(
            processed,
            [
                credited(&[3, 4, 5]),
                credited(&[11, 12, 13, 14]),
                credited(&[21, 22])
            ]
        );
        assert_eq!(actions, []);
        assert_eq!(blocked(&h), Vec::<usize>::new());
    }

    #[test]
    fn replayed_batches_are_channel_state_and_poll_first_without_credit() {
        let mut h = BarrierHandler::new(2);
        h.replay(A, batches(&[1, 2]));
        h.replay(B, batches(&[10]));
        assert_eq!(deliver(&mut h, t(0), A, data(3)), []);
        assert_eq!(deliver(&mut h, t(0), B, data(11)), []);
        assert_eq!(poll(&mut h, t(0)), Some(got(A, 1, false)));

        assert_eq!(
            seen(h.deliver_priority(t(0), B, unaligned(1), batches(&[12]))),
            [unaligned_snapshot(1, false, 0, 0)]
        );
        assert_eq!(deliver(&mut h, t(1), B, data(12)), []);
        assert_eq!(deliver(&mut h, t(2), A, data(4)), []);
        assert_eq!(
            seen(h.deliver_priority(t(5), A, unaligned(1), vec![])),
            [state(1, [&[2, 3, 4], &[10, 11, 12]], 5)]
        );

        let (processed, actions) = drain_by_channel(&mut h, t(6));
        assert_eq!(
            processed,
            [
                vec![(2, false), (3, true), (4, true)],
                vec![(10, false), (11, true), (12, true)]
            ]
        );
        assert_eq!(actions, []);
    }

    #[test]
    fn cancel_marker_during_unaligned_collection_aborts_without_channel_state() {
        let mut h = BarrierHandler::new(2);
        assert_eq!(deliver(&mut h, t(0), A, data(1)), []);
        assert_eq!(
            seen(h.deliver_priority(t(1), B, unaligned(1), batches(&[2]))),
            [unaligned_snapshot(1, false, 0, 0)]
        );
        // A's upstream declined checkpoint 1: the marker takes effect when polled.
        assert_eq!(deliver(&mut h, t(2), A, cancel(1)), []);
        assert_eq!(deliver(&mut h, t(2), A, data(3)), []);
        assert_eq!(poll(&mut h, t(3)), Some(got(A, 1, true)));
        assert_eq!(
            poll(&mut h, t(4)),
            Some(Got::Actions(vec![aborted(1, CancelMarker)]))
        );
        assert_eq!(h.pending(), None);
        assert_eq!(deliver(&mut h, t(5), A, ChannelEvent::EndOfPartition), []);
        assert_eq!(seen(h.deliver_priority(t(5), A, unaligned(1), vec![])), []);
        assert_eq!(seen(h.abort(chk(1))), []);
        let (_, actions) = drain_by_channel(&mut h, t(6));
        assert_eq!(actions, []);
    }

    #[test]
    fn newer_priority_barrier_during_unaligned_collection_aborts_it_and_proceeds() {
        let mut h = BarrierHandler::new(2);
        assert_eq!(deliver(&mut h, t(0), A, data(1)), []);
        assert_eq!(
            seen(h.deliver_priority(t(0), B, unaligned(1), vec![])),
            [unaligned_snapshot(1, false, 0, 0)]
        );
        assert_eq!(deliver(&mut h, t(1), A, data(2)), []);
        assert_eq!(
            seen(h.deliver_priority(t(2), B, unaligned(2), batches(&[3]))),
            [
                aborted(1, SubsumedByNewerBarrier(chk(2))),
                unaligned_snapshot(2, false, 0, 0)
            ]
        );
        // A's barrier 1 is stale now; everything A held is before barrier 2.
        assert_eq!(seen(h.deliver_priority(t(3), A, unaligned(1), vec![])), []);
        assert_eq!(
            seen(h.deliver_priority(t(4), A, unaligned(2), batches(&[4]))),
            [state(2, [&[1, 2, 4], &[3]], 2)]
        );
    }

    #[test]
    fn newer_in_band_barrier_during_unaligned_collection_aborts_it_when_polled() {
        let mut h = BarrierHandler::new(2);
        assert_eq!(
            seen(h.deliver_priority(t(0), B, unaligned(1), vec![])),
            [unaligned_snapshot(1, false, 0, 0)]
        );
        assert_eq!(deliver(&mut h, t(1), B, in_band(barrier(2))), []);
        assert_eq!(deliver(&mut h, t(1), A, data(1)), []);
        assert_eq!(h.pending(), Some(chk(1)));
        assert_eq!(poll(&mut h, t(2)), Some(got(A, 1, true)));
        assert_eq!(
            poll(&mut h, t(3)),
            Some(Got::Actions(vec![aborted(
                1,
                SubsumedByNewerBarrier(chk(2))
            )]))
        );
        assert_eq!(blocked(&h), [B]);
        assert_eq!(
            step(&mut h, t(8), A, in_band(barrier(2))),
            [snapshot(2, 5, 0)]
        );
        // Checkpoint 1 never writes channel state.
        assert_eq!(seen(h.deliver_priority(t(9), A, unaligned(1), vec![])), []);
    }

    #[test]
    fn coordinator_abort_during_unaligned_collection_drops_its_channel_state() {
        let mut h = BarrierHandler::new(2);
        assert_eq!(
            seen(h.deliver_priority(t(0), A, unaligned(1), batches(&[1]))),
            [unaligned_snapshot(1, false, 0, 0)]
        );
        assert_eq!(seen(h.abort(chk(1))), [aborted(1, CoordinatorAborted)]);
        assert_eq!(h.pending(), None);
        assert_eq!(deliver(&mut h, t(1), B, data(2)), []);
        assert_eq!(seen(h.deliver_priority(t(2), B, unaligned(1), vec![])), []);
        assert_eq!(seen(h.abort(chk(1))), []);

        // An abort of a newer id ends the collection too.
        assert_eq!(
            seen(h.deliver_priority(t(3), A, unaligned(3), vec![])),
            [unaligned_snapshot(3, false, 0, 0)]
        );
        assert_eq!(
            seen(h.abort(chk(4))),
            [
                aborted(3, SubsumedByNewerBarrier(chk(4))),
                aborted(4, CoordinatorAborted)
            ]
        );
        assert_eq!(seen(h.deliver_priority(t(4), B, unaligned(3), vec![])), []);
        assert_eq!(seen(h.deliver_priority(t(4), B, unaligned(4), vec![])), []);
        assert_eq!(h.pending(), None);
    }

    #[test]
    fn end_of_partition_during_unaligned_collection_completes_its_channel() {
        let mut h = BarrierHandler::new(2);
        assert_eq!(deliver(&mut h, t(0), B, data(10)), []);
        assert_eq!(
            seen(h.deliver_priority(t(0), A, unaligned(1), vec![])),
            [unaligned_snapshot(1, false, 0, 0)]
        );
        assert_eq!(deliver(&mut h, t(3), B, data(11)), []);
        assert_eq!(
            deliver(&mut h, t(7), B, ChannelEvent::EndOfPartition),
            [state(1, [&[], &[10, 11]], 7)]
        );
        assert_eq!(deliver(&mut h, t(8), A, ChannelEvent::EndOfPartition), []);
        assert_eq!(
            drain(&mut h, t(9)),
            [
                Got::Actions(vec![]),
                got(B, 10, true),
                got(B, 11, true),
                Got::Actions(vec![Seen::EndInput]),
            ]
        );
    }

    #[test]
    fn end_of_input_is_emitted_once_and_never_for_a_gate_without_channels() {
        let mut h = BarrierHandler::new(2);
        assert_eq!(step(&mut h, t(0), B, ChannelEvent::EndOfPartition), []);
        assert_eq!(
            step(&mut h, t(1), A, ChannelEvent::EndOfPartition),
            [Seen::EndInput]
        );
        assert_eq!(poll(&mut h, t(2)), None);

        let mut none = BarrierHandler::new(0);
        assert_eq!(none.channels(), 0);
        assert_eq!(poll(&mut none, t(0)), None);
        assert_eq!(seen(none.on_timeout(t(0))), []);
    }

    #[test]
    fn unaligned_barrier_found_in_band_goes_unaligned_when_polled() {
        let mut h = BarrierHandler::new(2);
        assert_eq!(deliver(&mut h, t(0), B, data(1)), []);
        assert_eq!(deliver(&mut h, t(0), A, in_band(unaligned(1))), []);
        assert_eq!(deliver(&mut h, t(0), A, data(2)), []);
        assert_eq!(
            poll(&mut h, t(3)),
            Some(Got::Actions(vec![unaligned_snapshot(1, false, 0, 0)]))
        );
        assert_eq!(blocked(&h), Vec::<usize>::new());
        // What A holds is after its barrier; B's is before.
        assert_eq!(
            seen(h.deliver_priority(t(5), B, unaligned(1), vec![])),
            [state(1, [&[], &[1]], 2)]
        );
    }

    // Aligned with a timeout.

    #[test]
    fn alignment_switches_to_unaligned_exactly_at_the_timeout_via_poll() {
        let mut h = BarrierHandler::new(3);
        assert_eq!(step(&mut h, t(100), A, in_band(with_timeout(1, 10))), []);
        assert_eq!(h.deadline(), Some(t(110)));
        assert_eq!(step(&mut h, t(101), B, data(10)), []);
        // Queued but not yet processed: A's after its barrier, B's around its barrier.
        for (channel, event) in [
            (A, data(1)),
            (B, data(11)),
            (B, in_band(with_timeout(1, 10))),
            (B, data(12)),
            (C, data(20)),
            (C, data(21)),
        ] {
            assert_eq!(deliver(&mut h, t(102), channel, event), []);
        }
        assert_eq!(poll(&mut h, t(109)), Some(got(C, 20, true)));
        assert_eq!(h.pending(), Some(chk(1)));
        assert_eq!(blocked(&h), [A]);

        assert_eq!(
            poll(&mut h, t(110)),
            Some(Got::Actions(vec![unaligned_snapshot(1, true, 10, 16)]))
        );
        assert_eq!(blocked(&h), Vec::<usize>::new());
        assert_eq!(h.deadline(), None);
        assert_eq!(h.pending(), Some(chk(1)));
        // A aligned: nothing. B: up to its queued barrier. C: what it holds and delivers until its barrier.
        assert_eq!(deliver(&mut h, t(115), C, data(22)), []);
        assert_eq!(
            deliver(&mut h, t(120), C, in_band(with_timeout(1, 10))),
            [state(1, [&[], &[11], &[21, 22]], 20)]
        );

        let (processed, actions) = drain_by_channel(&mut h, t(121));
        assert_eq!(
            processed,
            [credited(&[1]), credited(&[11, 12]), credited(&[21, 22])]
        );
        assert_eq!(actions, []);
    }

    #[test]
    fn alignment_switches_to_unaligned_exactly_at_the_timeout_via_on_timeout() {
        let mut h = BarrierHandler::new(2);
        assert_eq!(step(&mut h, t(0), A, in_band(with_timeout(1, 10))), []);
        assert_eq!(h.deadline(), Some(t(10)));
        assert_eq!(seen(h.on_timeout(t(9))), []);
        assert_eq!(h.deadline(), Some(t(10)));
        assert_eq!(
            seen(h.on_timeout(t(10))),
            [unaligned_snapshot(1, true, 10, 0)]
        );
        assert_eq!(seen(h.on_timeout(t(11))), []);
        assert_eq!(deliver(&mut h, t(12), B, data(5)), []);
        assert_eq!(
            deliver(&mut h, t(13), B, in_band(with_timeout(1, 10))),
            [state(1, [&[], &[5]], 13)]
        );
        assert_eq!(h.deadline(), None);
    }

    #[test]
    fn zero_timeout_switches_at_the_first_barrier_unless_it_aligns_at_once() {
        let mut h = BarrierHandler::new(2);
        assert_eq!(deliver(&mut h, t(0), A, in_band(with_timeout(1, 0))), []);
        assert_eq!(deliver(&mut h, t(0), B, data(1)), []);
        assert_eq!(
            poll(&mut h, t(0)),
            Some(Got::Actions(vec![unaligned_snapshot(1, true, 0, 0)]))
        );
        assert_eq!(blocked(&h), Vec::<usize>::new());
        assert_eq!(
            deliver(&mut h, t(4), B, in_band(with_timeout(1, 0))),
            [state(1, [&[], &[1]], 4)]
        );

        // With a single channel the first barrier is also the last.
        let mut single = BarrierHandler::new(1);
        assert_eq!(
            step(&mut single, t(0), A, in_band(with_timeout(1, 0))),
            [Seen::Snapshot {
                barrier: with_timeout(1, 0),
                unaligned: false,
                timed_out: false,
                alignment: ms(0),
                bytes: 0,
            }]
        );
    }

    #[test]
    fn alignment_finished_before_the_timeout_writes_no_channel_state() {
        let mut h = BarrierHandler::new(2);
        assert_eq!(step(&mut h, t(0), A, in_band(with_timeout(1, 10))), []);
        assert_eq!(step(&mut h, t(5), B, data(1)), []);
        assert_eq!(
            step(&mut h, t(9), B, in_band(with_timeout(1, 10))),
            [Seen::Snapshot {
                barrier: with_timeout(1, 10),
                unaligned: false,
                timed_out: false,
                alignment: ms(9),
                bytes: 8,
            }]
        );
        assert_eq!(h.deadline(), None);
        assert_eq!(h.pending(), None);
        assert_eq!(seen(h.on_timeout(t(10))), []);
        assert_eq!(poll(&mut h, t(10)), None);
    }

    #[test]
    fn priority_barrier_during_alignment_switches_at_once() {
        let mut h = BarrierHandler::new(3);
        assert_eq!(step(&mut h, t(0), A, in_band(with_timeout(1, 100))), []);
        assert_eq!(deliver(&mut h, t(1), A, data(1)), []);
        assert_eq!(deliver(&mut h, t(1), B, data(10)), []);
        assert_eq!(deliver(&mut h, t(1), B, data(11)), []);
        // B's upstream timed out and sent barrier 1 ahead of 12.
        assert_eq!(
            seen(h.deliver_priority(t(5), B, unaligned(1), batches(&[12]))),
            [unaligned_snapshot(1, false, 5, 0)]
        );
        assert_eq!(blocked(&h), Vec::<usize>::new());
        assert_eq!(h.deadline(), None);
        assert_eq!(deliver(&mut h, t(6), C, data(20)), []);
        assert_eq!(
            seen(h.deliver_priority(t(8), C, unaligned(1), batches(&[21]))),
            [state(1, [&[], &[10, 11, 12], &[20, 21]], 8)]
        );
    }

    #[test]
    fn deadline_is_the_first_barrier_plus_the_timeout_while_aligning() {
        let mut h = BarrierHandler::new(2);
        assert_eq!(h.deadline(), None);
        assert_eq!(step(&mut h, t(0), A, in_band(barrier(1))), []);
        assert_eq!((h.pending(), h.deadline()), (Some(chk(1)), None));
        assert_eq!(
            step(&mut h, t(1), B, in_band(barrier(1))),
            [snapshot(1, 1, 0)]
        );
        assert_eq!(step(&mut h, t(50), A, in_band(with_timeout(2, 30))), []);
        assert_eq!(h.deadline(), Some(t(80)));
        // Deliveries do not move it.
        assert_eq!(deliver(&mut h, t(60), A, data(1)), []);
        assert_eq!(h.deadline(), Some(t(80)));
        assert_eq!(seen(h.abort(chk(2))), [aborted(2, CoordinatorAborted)]);
        assert_eq!(h.deadline(), None);
        assert_eq!(
            seen(h.deliver_priority(t(90), A, unaligned(3), vec![])),
            [unaligned_snapshot(3, false, 0, 0)]
        );
        assert_eq!(h.deadline(), None);
    }

    // Random schedules.

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
                prop::collection::vec(any::<Index>(), 0..200),
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

    /// Runs an aligned scenario the way a subtask shell would: the endpoints
    /// deliver in the order the schedule picks, interleaved with polls and
    /// coordinator aborts. Checks the protocol's invariants at every step
    /// and that everything drains with no channel left blocked.
    fn simulate(scenario: &Scenario) -> Result<Outcome, TestCaseError> {
        let n = scenario.channels.len();
        let mut h = BarrierHandler::new(n);
        let mut next = vec![0usize; n];
        // What the handler holds per channel, to know what a poll took.
        let mut queued: Vec<VecDeque<Event>> = vec![VecDeque::new(); n];
        let mut round_robin = 0;
        let mut ended = vec![false; n];
        // Barrier ids polled per channel.
        let mut polled: Vec<BTreeSet<u64>> = vec![BTreeSet::new(); n];
        // Time and processed-bytes total when barrier `id` was first polled.
        let mut first_barrier: BTreeMap<u64, (Instant, u64)> = BTreeMap::new();
        let mut bytes = 0u64;
        let mut aborts = scenario.aborts.iter();
        let mut pending_abort = aborts.next();
        // Newest id a cancel marker or the coordinator told the handler to drop.
        let mut dropped = 0u64;
        let mut last_resolved = 0u64;
        let mut outcome = Outcome::default();

        for step in 0.. {
            let now = t(step);
            let deliverable: Vec<usize> = (0..n)
                .filter(|&c| next[c] < scenario.channels[c].len())
                .collect();
            // Deliveries, then the abort, then a poll.
            let moves = deliverable.len() + usize::from(pending_abort.is_some()) + 1;
            let pick = scenario
                .schedule
                .get(step as usize)
                .map_or(0, |i| i.index(moves));
            let (event, actions) = if let Some(&c) = deliverable.get(pick) {
                let event = scenario.channels[c][next[c]].clone();
                next[c] += 1;
                queued[c].push_back(event.clone());
                let delivered = match event {
                    Event::Data(b) => ChannelEvent::Batch(Batch::new(vec![0u8; b as usize])),
                    Event::Barrier(id) => in_band(barrier(id)),
                    Event::Cancel(id) => cancel(id),
                    Event::End => ChannelEvent::EndOfPartition,
                };
                let actions = h.deliver(now, c, delivered);
                prop_assert!(actions.is_empty(), "in-band deliveries act when polled");
                continue;
            } else if pick == deliverable.len() && pending_abort.is_some() {
                let id = *pending_abort.take().expect("an abort is pending");
                pending_abort = aborts.next();
                dropped = dropped.max(id);
                (None, h.abort(chk(id)))
            } else {
                // The gate polls its unblocked channels round robin.
                let expected = (0..n)
                    .map(|s| (round_robin + s) % n)
                    .find(|&c| !h.gate.is_blocked(c) && !queued[c].is_empty());
                let Some(polled) = h.poll(now) else {
                    prop_assert_eq!(expected, None);
                    if deliverable.is_empty() && pending_abort.is_none() {
                        break;
                    }
                    continue;
                };
                let c = expected.expect("the gate had something to poll");
                round_robin = (c + 1) % n;
                let event = queued[c].pop_front().expect("queued");
                match polled {
                    Polled::Batch {
                        channel,
                        batch,
                        credited,
                    } => {
                        prop_assert_eq!(channel, c);
                        prop_assert!(credited);
                        prop_assert!(
                            matches!(event, Event::Data(b) if b as usize == batch.bytes())
                        );
                        bytes += batch.bytes() as u64;
                        continue;
                    }
                    Polled::Actions(actions) => (Some((c, event)), actions),
                    Polled::Watermarks(_) => unreachable!("no watermarks are sent"),
                }
            };
            if let Some((c, event)) = &event {
                match *event {
                    Event::Barrier(id) => {
                        polled[*c].insert(id);
                        outcome.delivered.insert(id);
                        first_barrier.entry(id).or_insert((now, bytes));
                    }
                    Event::Cancel(id) => dropped = dropped.max(id),
                    Event::End => ended[*c] = true,
                    Event::Data(_) => prop_assert!(false, "a batch polled as a control event"),
                }
            }

            for action in actions {
                match action {
                    BarrierAction::Snapshot {
                        barrier,
                        unaligned,
                        timed_out,
                        alignment,
                        bytes_during_alignment,
                    } => {
                        prop_assert!(!unaligned && !timed_out);
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
                            prop_assert!(ended[c] || polled[c].contains(&id));
                        }
                        let (start, bytes_at_start) = first_barrier[&id];
                        prop_assert_eq!(alignment, now - start);
                        prop_assert_eq!(bytes_during_alignment, bytes - bytes_at_start);
                        outcome.snapshots.push(id);
                    }
                    BarrierAction::Abort { checkpoint, reason } => {
                        let id = checkpoint.0;
                        prop_assert!(
                            id > last_resolved,
                            "{} resolved after {}",
                            id,
                            last_resolved
                        );
                        last_resolved = id;
                        match reason {
                            CancelMarker => prop_assert!(
                                matches!(event, Some((_, Event::Cancel(c))) if c == id)
                            ),
                            CoordinatorAborted => prop_assert!(event.is_none()),
                            SubsumedByNewerBarrier(newer) => prop_assert!(newer.0 > id),
                        }
                        outcome.aborts.push(id);
                    }
                    BarrierAction::ChannelState { .. } => {
                        prop_assert!(false, "channel state of an aligned checkpoint")
                    }
                    BarrierAction::EndInput => {
                        prop_assert!(ended.iter().all(|&e| e));
                        prop_assert!(matches!(event, Some((_, Event::End))));
                    }
                }
            }
            let blocked = blocked(&h);
            prop_assert_eq!(
                h.pending().is_some(),
                !blocked.is_empty(),
                "channels are blocked exactly while a checkpoint aligns"
            );
            for c in blocked {
                let pending = h.pending().expect("aligning").0;
                prop_assert!(polled[c].contains(&pending) && !ended[c]);
            }
        }

        for (c, events) in scenario.channels.iter().enumerate() {
            prop_assert_eq!(next[c], events.len(), "channel {} not delivered", c);
            prop_assert!(queued[c].is_empty(), "channel {} stuck", c);
        }
        prop_assert_eq!(blocked(&h), Vec::<usize>::new());
        prop_assert_eq!(h.pending(), None);
        Ok(outcome)
    }

    /// What an upstream subtask sends on one channel, in order.
    #[derive(Clone, Debug)]
    enum Up {
        Data(u64),
        /// `priority`: sent unaligned, ahead of what the endpoint still holds.
        Barrier {
            id: u64,
            priority: bool,
        },
        Cancel(u64),
        End,
    }

    #[derive(Clone, Debug)]
    struct Flow {
        /// `None`: unaligned checkpoints. `Some(ms)`: aligned with this
        /// timeout, some barriers sent unaligned by upstreams that timed out.
        timeout: Option<u64>,
        /// Restored channel state per channel.
        replayed: Vec<Vec<u64>>,
        channels: Vec<Vec<Up>>,
        aborts: Vec<u64>,
        schedule: Vec<Index>,
    }

    /// Distinct values on every channel, so that each can be traced.
    fn flow() -> impl Strategy<Value = Flow> {
        (
            1usize..=4,
            1u64..=4,
            prop::option::of(0u64..=10),
            any::<bool>(),
        )
            .prop_flat_map(|(n, k, timeout, cancels)| {
                (
                    prop::collection::vec(channel_events(k, cancels), n),
                    prop::collection::vec(
                        prop::collection::vec(prop::bool::weighted(0.3), k as usize),
                        n,
                    ),
                    prop::collection::vec(0u64..3, n),
                    prop::collection::vec(1..=k + 1, 0..2),
                    prop::collection::vec(any::<Index>(), 0..400),
                )
                    .prop_map(
                        move |(events, converted, replayed, aborts, schedule)| {
                            let mut value = 0;
                            let mut replays = Vec::new();
                            for count in replayed {
                                replays.push((value + 1..=value + count).collect());
                                value += count;
                            }
                            let mut channels = Vec::new();
                            for (events, converted) in events.iter().zip(&converted) {
                                let mut ups = Vec::new();
                                for event in events {
                                    ups.push(match *event {
                                        Event::Data(_) => {
                                            value += 1;
                                            Up::Data(value)
                                        }
                                        Event::Barrier(id) => Up::Barrier {
                                            id,
                                            priority: timeout.is_none()
                                                || converted[id as usize - 1],
                                        },
                                        Event::Cancel(id) => Up::Cancel(id),
                                        Event::End => Up::End,
                                    });
                                }
                                channels.push(ups);
                            }
                            Flow {
                                timeout,
                                replayed: replays,
                                channels,
                                aborts,
                                schedule,
                            }
                        },
                    )
            })
    }

    /// Values `channel` sends ahead of barrier `id`, replayed ones first;
    /// all of them if it sends no barrier `id`.
    fn sent_before(flow: &Flow, channel: usize, id: u64) -> Vec<u64> {
        let mut values = flow.replayed[channel].clone();
        for up in &flow.channels[channel] {
            match *up {
                Up::Data(v) => values.push(v),
                Up::Barrier { id: b, .. } if b == id => break,
                _ => {}
            }
        }
        values
    }

    /// Checks every action against what the operator processed so far.
    struct Checker<'a> {
        flow: &'a Flow,
        /// Values the operator processed, per channel, in order.
        processed: Vec<Vec<u64>>,
        /// The unaligned snapshot awaiting its channel state, with how many
        /// values of each channel had been processed when it was taken.
        open: Option<(u64, Vec<usize>)>,
        last_resolved: u64,
        end_input: bool,
        channel_states: usize,
    }

    impl Checker<'_> {
        fn check(&mut self, actions: Vec<BarrierAction>) -> Result<(), TestCaseError> {
            for action in actions {
                match action {
                    BarrierAction::Snapshot {
                        barrier,
                        unaligned,
                        timed_out,
                        alignment,
                        ..
                    } => {
                        let id = barrier.id.0;
                        prop_assert!(
                            id > self.last_resolved,
                            "{} after {}",
                            id,
                            self.last_resolved
                        );
                        prop_assert!(self.open.is_none(), "{} while {:?} is open", id, self.open);
                        prop_assert_eq!(
                            barrier.options.alignment == Alignment::Unaligned,
                            unaligned
                        );
                        match self.flow.timeout {
                            None => prop_assert!(unaligned && !timed_out),
                            Some(timeout) => {
                                prop_assert!(!timed_out || (unaligned && alignment >= ms(timeout)));
                                prop_assert!(
                                    unaligned || alignment < ms(timeout) || alignment.is_zero()
                                );
                            }
                        }
                        if unaligned {
                            let lens = self.processed.iter().map(Vec::len).collect();
                            self.open = Some((id, lens));
                        } else {
                            for (c, processed) in self.processed.iter().enumerate() {
                                prop_assert_eq!(
                                    processed,
                                    &sent_before(self.flow, c, id),
                                    "aligned {} on channel {}",
                                    id,
                                    c
                                );
                            }
                            self.last_resolved = id;
                        }
                    }
                    BarrierAction::ChannelState {
                        checkpoint, inputs, ..
                    } => {
                        let id = checkpoint.0;
                        let Some((open, lens)) = self.open.take() else {
                            return Err(TestCaseError::fail(format!("state of {id} unopened")));
                        };
                        prop_assert_eq!(open, id);
                        prop_assert_eq!(inputs.len(), self.processed.len());
                        for (c, input) in inputs.into_iter().enumerate() {
                            let mut covered = self.processed[c][..lens[c]].to_vec();
                            covered.extend(values(input));
                            prop_assert_eq!(
                                covered,
                                sent_before(self.flow, c, id),
                                "unaligned {} on channel {}",
                                id,
                                c
                            );
                        }
                        self.last_resolved = id;
                        self.channel_states += 1;
                    }
                    BarrierAction::Abort { checkpoint, .. } => {
                        let id = checkpoint.0;
                        prop_assert!(
                            id > self.last_resolved,
                            "{} after {}",
                            id,
                            self.last_resolved
                        );
                        if let Some((open, _)) = self.open.take() {
                            prop_assert_eq!(
                                open,
                                id,
                                "abort of another checkpoint than the open one"
                            );
                        }
                        self.last_resolved = id;
                    }
                    BarrierAction::EndInput => {
                        prop_assert!(!self.end_input, "end of input twice");
                        self.end_input = true;
                    }
                }
            }
            Ok(())
        }
    }

    #[derive(Clone, Copy, Debug)]
    enum Move {
        Send(usize),
        Deliver(usize),
        Abort,
        Poll,
        Timer,
        Tick(u64),
    }

    /// Upstreams send into their endpoints, which deliver to the handler (a
    /// priority barrier overtakes what its endpoint holds), while the
    /// operator polls and the clock and the shell's timer run, all in the
    /// order the schedule picks. Returns how many channel states were checked.
    fn run_flow(flow: &Flow) -> Result<usize, TestCaseError> {
        let n = flow.channels.len();
        let mut h = BarrierHandler::new(n);
        for (c, values) in flow.replayed.iter().enumerate() {
            h.replay(c, batches(values));
        }
        let mut checker = Checker {
            flow,
            processed: vec![Vec::new(); n],
            open: None,
            last_resolved: 0,
            end_input: false,
            channel_states: 0,
        };
        let mut next = vec![0usize; n];
        let mut held: Vec<VecDeque<ChannelEvent>> = vec![VecDeque::new(); n];
        let mut aborts = flow.aborts.iter().copied();
        let mut pending_abort = aborts.next();
        let mut clock = 0;

        for step in 0.. {
            let now = t(clock);
            let mut moves: Vec<Move> = (0..n)
                .filter(|&c| next[c] < flow.channels[c].len())
                .map(Move::Send)
                .collect();
            moves.extend((0..n).filter(|&c| !held[c].is_empty()).map(Move::Deliver));
            moves.extend(pending_abort.map(|_| Move::Abort));
            moves.push(Move::Poll);
            if h.deadline().is_some_and(|deadline| now >= deadline) {
                moves.push(Move::Timer);
            }
            moves.extend([Move::Tick(1), Move::Tick(4)]);
            let exhausted = step >= flow.schedule.len();
            let pick = flow.schedule.get(step).map_or(0, |i| i.index(moves.len()));

            let actions = match moves[pick] {
                Move::Send(c) => {
                    let up = flow.channels[c][next[c]].clone();
                    next[c] += 1;
                    match up {
                        Up::Data(v) => held[c].push_back(data(v)),
                        Up::Barrier { id, priority: true } => {
                            let overtaken = held[c]
                                .iter()
                                .filter_map(|e| match e {
                                    ChannelEvent::Batch(b) => Some(b.clone()),
                                    _ => None,
                                })
                                .collect();
                            let actions = h.deliver_priority(now, c, unaligned(id), overtaken);
                            checker.check(actions)?;
                        }
                        Up::Barrier {
                            id,
                            priority: false,
                        } => {
                            let timeout = flow.timeout.expect("in-band only with a timeout");
                            held[c].push_back(in_band(with_timeout(id, timeout)));
                        }
                        Up::Cancel(id) => held[c].push_back(cancel(id)),
                        Up::End => held[c].push_back(ChannelEvent::EndOfPartition),
                    }
                    continue;
                }
                Move::Deliver(c) => {
                    let event = held[c].pop_front().expect("held");
                    h.deliver(now, c, event)
                }
                Move::Abort => {
                    let id = pending_abort.take().expect("an abort is pending");
                    pending_abort = aborts.next();
                    h.abort(chk(id))
                }
                Move::Poll => {
                    let polled = h.poll(now);
                    prop_assert!(
                        h.deadline().is_none_or(|deadline| deadline > now),
                        "poll acts on a due timeout"
                    );
                    match polled {
                        None if exhausted => break,
                        None => continue,
                        Some(Polled::Batch {
                            channel,
                            batch,
                            credited,
                        }) => {
                            let replayed = flow.replayed[channel].len();
                            prop_assert_eq!(credited, checker.processed[channel].len() >= replayed);
                            checker.processed[channel].extend(values(vec![batch]));
                            continue;
                        }
                        Some(Polled::Actions(actions)) => actions,
                        Some(Polled::Watermarks(_)) => unreachable!("no watermarks are sent"),
                    }
                }
                Move::Timer => {
                    let actions = h.on_timeout(now);
                    prop_assert!(!actions.is_empty(), "a due timeout switches");
                    actions
                }
                Move::Tick(ms) => {
                    clock += ms;
                    continue;
                }
            };
            checker.check(actions)?;
        }

        for c in 0..n {
            prop_assert_eq!(next[c], flow.channels[c].len(), "channel {} not sent", c);
            prop_assert!(held[c].is_empty(), "channel {} not delivered", c);
            prop_assert_eq!(
                &checker.processed[c],
                &sent_before(flow, c, u64::MAX),
                "channel {} not processed",
                c
            );
        }
        prop_assert_eq!(h.pending(), None);
        prop_assert_eq!(checker.open, None);
        prop_assert_eq!(blocked(&h), Vec::<usize>::new());
        let every_channel_ends = flow
            .channels
            .iter()
            .all(|ups| matches!(ups.last(), Some(Up::End)));
        prop_assert_eq!(checker.end_input, every_channel_ends);
        Ok(checker.channel_states)
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

        #[test]
        fn processed_input_and_channel_state_are_exactly_what_came_before_each_barrier(
            flow in flow()
        ) {
            run_flow(&flow)?;
        }
    }
}
