//! The barrier handler of a two-input subtask, over the gate
//! `JobGraph::gate` lays out: the channels of both inputs, from upstream
//! operators of different parallelism. A checkpoint aligns, goes unaligned,
//! times out and ends over both inputs as over one, and the channel state
//! it captures names each channel by its place in that gate.

use super::barrier::tests::values;
use super::barrier::{BarrierAction, BarrierHandler, Polled};
use crate::model::batch::Batch;
use crate::model::event::{Alignment, Barrier, ChannelEvent, CheckpointKind, CheckpointOptions};
use crate::model::graph::{Edge, JobGraph, Partitioner};
use crate::model::ids::{ChannelId, CheckpointId, OperatorId, SubtaskId, SubtaskIndex};
use crate::time::WatermarkEvent;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const LEFT: OperatorId = OperatorId(0);
const RIGHT: OperatorId = OperatorId(1);

/// Fake clock: a fixed base plus an offset; only differences matter.
fn t(ms: u64) -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now) + Duration::from_millis(ms)
}

fn barrier(alignment: Alignment) -> Barrier {
    Barrier {
        id: CheckpointId(1),
        timestamp: 1_000,
        options: CheckpointOptions {
            kind: CheckpointKind::Checkpoint,
            alignment,
        },
    }
}

/// Checkpoint 1, aligned, in-band.
fn aligned() -> ChannelEvent {
    ChannelEvent::Barrier(barrier(Alignment::Aligned))
}

/// Checkpoint 1, aligned until it has waited 10 ms, in-band.
fn with_timeout() -> ChannelEvent {
    ChannelEvent::Barrier(barrier(Alignment::AlignedWithTimeout(
        Duration::from_millis(10),
    )))
}

/// An action, its batches turned into their values, to compare.
#[derive(Debug, PartialEq)]
enum Act {
    Snapshot {
        unaligned: bool,
        timed_out: bool,
    },
    /// The channel state, per gate channel.
    State(Vec<Vec<u64>>),
    Abort,
    EndInput,
}

fn acts(actions: Vec<BarrierAction>) -> Vec<Act> {
    actions
        .into_iter()
        .map(|action| match action {
            BarrierAction::Snapshot {
                unaligned,
                timed_out,
                ..
            } => Act::Snapshot {
                unaligned,
                timed_out,
            },
            BarrierAction::ChannelState { inputs, .. } => {
                Act::State(inputs.into_iter().map(values).collect())
            }
            BarrierAction::Abort { .. } => Act::Abort,
            BarrierAction::EndInput => Act::EndInput,
        })
        .collect()
}

const ALIGNED_SNAPSHOT: Act = Act::Snapshot {
    unaligned: false,
    timed_out: false,
};

/// What one poll gave the operator.
#[derive(Debug, PartialEq)]
enum Got {
    Batch(usize, Vec<u64>),
    Actions(Vec<Act>),
    Watermarks(Vec<WatermarkEvent>),
}

/// Join subtask 0 of left (p=2) and right (p=3) into join (p=2), over hash
/// edges into inputs 0 and 1: its gate and its barrier handler.
struct Join {
    gate: Vec<(ChannelId, u8)>,
    handler: BarrierHandler,
}

impl Join {
    fn new() -> Self {
        let mut graph = JobGraph::default();
        let left = graph.add_operator("left", 2);
        let right = graph.add_operator("right", 3);
        let join = graph.add_operator("join", 2);
        for (from, input) in [(left, 0), (right, 1)] {
            graph.edges.push(Edge {
                from,
                to: join,
                partitioner: Partitioner::Hash,
                input,
            });
        }
        graph.validate().unwrap();
        let gate = graph.gate(SubtaskId {
            operator: join,
            index: SubtaskIndex(0),
        });
        assert_eq!(gate.len(), 5);
        Join {
            handler: BarrierHandler::new(gate.len()),
            gate,
        }
    }

    /// The gate channel from subtask `index` of `operator`.
    fn channel(&self, operator: OperatorId, index: u32) -> usize {
        self.gate
            .iter()
            .position(|(c, _)| c.from.operator == operator && c.from.index.0 == index)
            .expect("an input channel")
    }

    /// The gate channels from `operator`.
    fn channels(&self, operator: OperatorId) -> Vec<usize> {
        (0..self.gate.len())
            .filter(|&c| self.gate[c].0.from.operator == operator)
            .collect()
    }

    /// A batch of one record that names its sender: 100 * operator + 10 *
    /// subtask + `n`.
    fn record(&self, channel: usize, n: u64) -> u64 {
        let from = self.gate[channel].0.from;
        100 * u64::from(from.operator.0) + 10 * u64::from(from.index.0) + n
    }

    fn data(&self, channel: usize, n: u64) -> ChannelEvent {
        ChannelEvent::Batch(Batch::new(vec![self.record(channel, n)]))
    }

    fn deliver(&mut self, now: Instant, channel: usize, event: ChannelEvent) -> Vec<Act> {
        acts(self.handler.deliver(now, channel, event))
    }

    /// `channel`'s endpoint got a priority (unaligned) barrier of
    /// checkpoint 1 ahead of records `overtaken`.
    fn priority(&mut self, now: Instant, channel: usize, overtaken: &[u64]) -> Vec<Act> {
        let overtaken = overtaken
            .iter()
            .map(|&n| Batch::new(vec![self.record(channel, n)]))
            .collect();
        let barrier = barrier(Alignment::Unaligned);
        acts(
            self.handler
                .deliver_priority(now, channel, barrier, overtaken),
        )
    }

    fn poll(&mut self, now: Instant) -> Option<Got> {
        self.handler.poll(now).map(|polled| match polled {
            Polled::Batch { channel, batch, .. } => Got::Batch(channel, values(vec![batch])),
            Polled::Actions(actions) => Got::Actions(acts(actions)),
            Polled::Watermarks(events) => Got::Watermarks(events),
        })
    }

    /// Delivers `event` on `channel`, which sets off nothing by itself, and
    /// polls once.
    fn step(&mut self, now: Instant, channel: usize, event: ChannelEvent) -> Option<Got> {
        assert_eq!(self.deliver(now, channel, event), []);
        self.poll(now)
    }

    /// Polls until nothing is pollable: the batch values per gate channel,
    /// in order, and every action.
    fn drain(&mut self, now: Instant) -> (Vec<Vec<u64>>, Vec<Act>) {
        let mut batches = vec![Vec::new(); self.gate.len()];
        let mut actions = Vec::new();
        while let Some(got) = self.poll(now) {
            match got {
                Got::Batch(channel, values) => batches[channel].extend(values),
                Got::Actions(a) => actions.extend(a),
                Got::Watermarks(_) => {}
            }
        }
        (batches, actions)
    }

    /// A channel state, per gate channel, as (sender, input, values).
    fn by_sender(&self, state: Vec<Vec<u64>>) -> Vec<(SubtaskId, u8, Vec<u64>)> {
        self.gate
            .iter()
            .zip(state)
            .map(|(&(channel, input), values)| (channel.from, input, values))
            .collect()
    }
}

fn sender(operator: OperatorId, index: u32) -> SubtaskId {
    SubtaskId {
        operator,
        index: SubtaskIndex(index),
    }
}

/// Aligned across both inputs: the left input, whose barriers came first,
/// waits (its later records are held back) while the right input goes on,
/// and the snapshot comes with the last right channel's barrier, so it
/// holds every record before the barriers and none after; then the held
/// records come out in order.
#[test]
fn an_aligned_checkpoint_holds_the_first_input_back_until_the_other_delivers_every_barrier() {
    let mut j = Join::new();
    let (left, right) = (j.channels(LEFT), j.channels(RIGHT));
    for &l in &left {
        assert_eq!(j.step(t(0), l, aligned()), Some(Got::Actions(vec![])));
        for n in [1, 2] {
            assert_eq!(j.step(t(1), l, j.data(l, n)), None, "blocked");
        }
    }
    for &r in &right {
        let record = j.record(r, 1);
        assert_eq!(
            j.step(t(2), r, j.data(r, 1)),
            Some(Got::Batch(r, vec![record]))
        );
    }
    let (last, others) = right.split_last().unwrap();
    for &r in others {
        assert_eq!(j.step(t(3), r, aligned()), Some(Got::Actions(vec![])));
        assert_eq!(j.step(t(4), r, j.data(r, 2)), None, "blocked");
    }
    let record = j.record(*last, 2);
    assert_eq!(
        j.step(t(5), *last, j.data(*last, 2)),
        Some(Got::Batch(*last, vec![record]))
    );
    assert_eq!(
        j.step(t(6), *last, aligned()),
        Some(Got::Actions(vec![ALIGNED_SNAPSHOT]))
    );
    let (batches, actions) = j.drain(t(7));
    assert_eq!(actions, []);
    assert_eq!(
        batches,
        [vec![1, 2], vec![11, 12], vec![102], vec![112], vec![]]
    );
}

/// Unaligned: the first barrier, from a right channel, snapshots at once;
/// the records in flight ahead of the barriers of the other channels, of
/// both inputs, are the channel state, each under the gate channel of the
/// subtask that sent it.
#[test]
fn an_unaligned_checkpoint_captures_the_in_flight_records_of_both_inputs_by_gate_channel() {
    let mut j = Join::new();
    for channel in 0..j.gate.len() {
        assert_eq!(j.deliver(t(0), channel, j.data(channel, 1)), []);
    }
    // The operator processed left 0's and left 1's first records.
    let (l0, l1) = (j.channel(LEFT, 0), j.channel(LEFT, 1));
    assert_eq!(j.poll(t(1)), Some(Got::Batch(l0, vec![1])));
    assert_eq!(j.poll(t(1)), Some(Got::Batch(l1, vec![11])));

    let [r0, r1, r2] = [0, 1, 2].map(|i| j.channel(RIGHT, i));
    assert_eq!(
        j.priority(t(2), r0, &[2]),
        [Act::Snapshot {
            unaligned: true,
            timed_out: false
        }]
    );
    assert_eq!(j.deliver(t(3), l0, j.data(l0, 2)), []);
    assert_eq!(j.priority(t(4), l0, &[3]), []);
    assert_eq!(j.priority(t(4), l1, &[]), []);
    assert_eq!(j.deliver(t(5), r1, j.data(r1, 2)), []);
    assert_eq!(j.priority(t(6), r1, &[3]), []);
    assert_eq!(j.deliver(t(7), r2, j.data(r2, 2)), []);
    let [Act::State(state)] = &j.priority(t(8), r2, &[])[..] else {
        panic!("the last barrier completes the channel state");
    };
    assert_eq!(
        j.by_sender(state.clone()),
        [
            (sender(LEFT, 0), 0, vec![2, 3]),
            (sender(LEFT, 1), 0, vec![]),
            (sender(RIGHT, 0), 1, vec![101, 102]),
            (sender(RIGHT, 1), 1, vec![111, 112, 113]),
            (sender(RIGHT, 2), 1, vec![121, 122]),
        ]
    );
}

/// Aligned with a timeout: once the wait for the right input's barriers
/// outlasts the timeout, the checkpoint goes unaligned, and its channel
/// state is what the right channels held ahead of their barriers; the
/// left channels, whose barriers came in time, hold nothing.
#[test]
fn an_alignment_across_both_inputs_that_times_out_captures_the_late_input() {
    let mut j = Join::new();
    let [r0, r1, r2] = [0, 1, 2].map(|i| j.channel(RIGHT, i));
    for l in j.channels(LEFT) {
        assert_eq!(j.step(t(0), l, with_timeout()), Some(Got::Actions(vec![])));
        assert_eq!(j.deliver(t(1), l, j.data(l, 1)), []);
    }
    assert_eq!(j.handler.deadline(), Some(t(10)));
    let record = j.record(r0, 1);
    assert_eq!(
        j.step(t(2), r0, j.data(r0, 1)),
        Some(Got::Batch(r0, vec![record]))
    );
    for (channel, event) in [
        (r0, j.data(r0, 2)),
        (r1, j.data(r1, 1)),
        (r1, with_timeout()),
        (r1, j.data(r1, 2)),
        (r2, j.data(r2, 1)),
    ] {
        assert_eq!(j.deliver(t(3), channel, event), []);
    }
    assert_eq!(
        j.poll(t(10)),
        Some(Got::Actions(vec![Act::Snapshot {
            unaligned: true,
            timed_out: true
        }]))
    );
    assert_eq!(j.deliver(t(11), r2, j.data(r2, 2)), []);
    assert_eq!(j.deliver(t(12), r2, with_timeout()), []);
    let [Act::State(state)] = &j.deliver(t(13), r0, with_timeout())[..] else {
        panic!("the last barrier completes the channel state");
    };
    assert_eq!(
        j.by_sender(state.clone()),
        [
            (sender(LEFT, 0), 0, vec![]),
            (sender(LEFT, 1), 0, vec![]),
            (sender(RIGHT, 0), 1, vec![102]),
            (sender(RIGHT, 1), 1, vec![111]),
            (sender(RIGHT, 2), 1, vec![121, 122]),
        ]
    );
    let (batches, actions) = j.drain(t(14));
    assert_eq!(actions, []);
    assert_eq!(
        batches,
        [vec![1], vec![11], vec![102], vec![111, 112], vec![121, 122]]
    );
}

/// One input ending (every channel of the left operator) does not end the
/// subtask's input: the right input goes on, a checkpoint aligns over its
/// channels alone, and the input ends when the right input ends too.
#[test]
fn one_input_ending_leaves_the_other_running_and_checkpointing() {
    let mut j = Join::new();
    for l in j.channels(LEFT) {
        assert_eq!(
            j.step(t(0), l, ChannelEvent::EndOfPartition),
            Some(Got::Actions(vec![]))
        );
    }
    let right = j.channels(RIGHT);
    for &r in &right {
        let record = j.record(r, 1);
        assert_eq!(
            j.step(t(1), r, j.data(r, 1)),
            Some(Got::Batch(r, vec![record]))
        );
    }
    let expected = [vec![], vec![], vec![ALIGNED_SNAPSHOT]];
    for (&r, expected) in right.iter().zip(expected) {
        assert_eq!(j.step(t(2), r, aligned()), Some(Got::Actions(expected)));
    }
    let expected = [vec![], vec![], vec![Act::EndInput]];
    for (&r, expected) in right.iter().zip(expected) {
        assert_eq!(
            j.step(t(3), r, ChannelEvent::EndOfPartition),
            Some(Got::Actions(expected))
        );
    }
}

/// The subtask's watermark is the minimum over the channels of both
/// inputs: it appears once every channel has one and follows whichever
/// channel, of either input, is behind.
#[test]
fn the_watermark_is_the_minimum_over_both_inputs() {
    use WatermarkEvent::Watermark;
    let mut j = Join::new();
    let (l0, l1) = (j.channel(LEFT, 0), j.channel(LEFT, 1));
    let [r0, r1, r2] = [0, 1, 2].map(|i| j.channel(RIGHT, i));
    let mut watermark = |channel, w| j.step(t(0), channel, ChannelEvent::Watermark(w));
    for (channel, w) in [(l0, 10), (l1, 20), (r0, 5), (r1, 30)] {
        assert_eq!(watermark(channel, w), Some(Got::Watermarks(vec![])));
    }
    assert_eq!(watermark(r2, 15), Some(Got::Watermarks(vec![Watermark(5)])));
    assert_eq!(
        watermark(r0, 40),
        Some(Got::Watermarks(vec![Watermark(10)]))
    );
    assert_eq!(
        watermark(l0, 50),
        Some(Got::Watermarks(vec![Watermark(15)]))
    );
    assert_eq!(
        watermark(r2, 60),
        Some(Got::Watermarks(vec![Watermark(20)]))
    );
}
