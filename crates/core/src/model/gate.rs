//! The input gate of a subtask: the events its input endpoints delivered, one
//! queue per channel, polled fairly, with the restored channel state of every
//! channel ahead of all of them. The barrier handler decides which channels are
//! blocked and what the queues hold for a checkpoint; the gate only honours
//! and answers that.

use crate::model::batch::Batch;
use crate::model::event::{Barrier, ChannelEvent, CheckpointKind};
use crate::model::ids::CheckpointId;
use std::collections::VecDeque;

/// What the gate gives out, and where it came from.
#[derive(Debug)]
pub enum Input {
    /// Channel state of the restored checkpoint: the input endpoint never
    /// held it, so it is owed no credit for it.
    Replayed(Batch),
    /// An event the input endpoint delivered.
    Delivered(ChannelEvent),
}

/// An event that needs nothing of the operator but its snapshot, which
/// [`InputGate::poll_control`] gives out.
#[derive(Debug)]
pub enum Control {
    /// A barrier, in band.
    Barrier(Barrier),
    /// A cancel marker.
    Cancel(CheckpointId),
}

#[derive(Debug, Default)]
struct InputChannel {
    replay: VecDeque<Batch>,
    queue: VecDeque<ChannelEvent>,
    blocked: bool,
}

/// The per-channel input queues of one subtask (Flink's `InputGate`).
/// Channels are numbered `0..channels` in the order of
/// `JobGraph::input_channels`.
#[derive(Debug)]
pub struct InputGate {
    channels: Vec<InputChannel>,
    next: usize,
}

impl InputGate {
    /// A gate of `channels` empty, unblocked channels.
    pub fn new(channels: usize) -> Self {
        InputGate {
            channels: (0..channels).map(|_| InputChannel::default()).collect(),
            next: 0,
        }
    }

    /// Number of channels.
    pub fn channels(&self) -> usize {
        self.channels.len()
    }

    /// Queues restored channel state. It polls before anything delivered on
    /// any channel: after a rescale, the records of one old channel may be
    /// replayed on another channel than the one their successors arrive on.
    pub fn replay(&mut self, channel: usize, batches: Vec<Batch>) {
        self.channels[channel].replay.extend(batches);
    }

    /// Queues an event the input endpoint of `channel` delivered.
    pub fn push(&mut self, channel: usize, event: ChannelEvent) {
        self.channels[channel].queue.push_back(event);
    }

    /// Stops or resumes polling `channel` (alignment); its events stay
    /// queued.
    pub fn set_blocked(&mut self, channel: usize, blocked: bool) {
        self.channels[channel].blocked = blocked;
    }

    #[cfg(test)]
    pub(crate) fn is_blocked(&self, channel: usize) -> bool {
        self.channels[channel].blocked
    }

    /// Resumes every channel: the alignment ended.
    pub fn unblock_all(&mut self) {
        for c in &mut self.channels {
            c.blocked = false;
        }
    }

    /// Copies of the batches `channel` holds, replayed ones first, up to the
    /// in-band barrier of `checkpoint`; and whether that barrier is queued.
    /// They stay queued.
    pub fn batches_before(&self, channel: usize, checkpoint: CheckpointId) -> (Vec<Batch>, bool) {
        let c = &self.channels[channel];
        let mut batches: Vec<Batch> = c.replay.iter().cloned().collect();
        for event in &c.queue {
            match event {
                ChannelEvent::Batch(batch) => batches.push(batch.clone()),
                ChannelEvent::Barrier(b) if b.id == checkpoint => return (batches, true),
                _ => {}
            }
        }
        (batches, false)
    }

    /// A checkpoint's barrier or a cancel marker at the head of an
    /// unblocked channel, and its channel, round robin as [`Self::poll`]:
    /// what can be taken while the operator takes nothing else. Nothing
    /// while restored channel state is left, which comes before anything
    /// delivered. A savepoint's barrier waits for `poll`: a job stopped
    /// with it must have emitted what it holds, and nothing after.
    pub fn poll_control(&mut self) -> Option<(usize, Control)> {
        if self.channels.iter().any(|c| !c.replay.is_empty()) {
            return None;
        }
        let n = self.channels.len();
        let channel = (0..n).map(|step| (self.next + step) % n).find(|&channel| {
            let c = &self.channels[channel];
            !c.blocked && c.queue.front().is_some_and(passes_control)
        })?;
        let control = match self.channels[channel].queue.pop_front()? {
            ChannelEvent::Barrier(barrier) => Control::Barrier(barrier),
            ChannelEvent::CancelMarker(checkpoint) => Control::Cancel(checkpoint),
            _ => unreachable!("the head was found to pass control"),
        };
        self.next = (channel + 1) % n;
        Some((channel, control))
    }

    /// Next input and its channel, from an unblocked channel, round robin so
    /// that one fast channel cannot starve the others.
    pub fn poll(&mut self) -> Option<(usize, Input)> {
        let replaying = self.channels.iter().any(|c| !c.replay.is_empty());
        let n = self.channels.len();
        for step in 0..n {
            let channel = (self.next + step) % n;
            let c = &mut self.channels[channel];
            if c.blocked {
                continue;
            }
            let input = match c.replay.pop_front() {
                Some(batch) => Input::Replayed(batch),
                None if replaying => continue,
                None => match c.queue.pop_front() {
                    Some(event) => Input::Delivered(event),
                    None => continue,
                },
            };
            self.next = (channel + 1) % n;
            return Some((channel, input));
        }
        None
    }
}

/// Whether [`InputGate::poll_control`] takes `event`.
fn passes_control(event: &ChannelEvent) -> bool {
    match event {
        ChannelEvent::Barrier(barrier) => barrier.options.kind == CheckpointKind::Checkpoint,
        ChannelEvent::CancelMarker(_) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::event::{Alignment, Barrier, CheckpointKind, CheckpointOptions};

    fn batch(n: u64) -> Batch {
        Batch::new(vec![n])
    }

    fn barrier(id: u64) -> ChannelEvent {
        ChannelEvent::Barrier(Barrier {
            id: CheckpointId(id),
            timestamp: 0,
            options: CheckpointOptions {
                kind: CheckpointKind::Checkpoint,
                alignment: Alignment::Aligned,
            },
        })
    }

    fn values(batches: Vec<Batch>) -> Vec<u64> {
        batches
            .into_iter()
            .flat_map(|b| b.into_records::<u64>().unwrap())
            .collect()
    }

    /// Channel, whether replayed, and the value of a batch or the event's name.
    fn drain(gate: &mut InputGate) -> Vec<(usize, bool, String)> {
        std::iter::from_fn(|| gate.poll())
            .map(|(channel, input)| match input {
                Input::Replayed(b) => (channel, true, format!("{:?}", values(vec![b]))),
                Input::Delivered(ChannelEvent::Batch(b)) => {
                    (channel, false, format!("{:?}", values(vec![b])))
                }
                Input::Delivered(event) => (channel, false, format!("{event:?}")),
            })
            .collect()
    }

    #[test]
    fn round_robin_across_channels_and_blocked_channels_wait() {
        let mut gate = InputGate::new(3);
        for c in 0..3 {
            gate.push(c, ChannelEvent::Batch(batch(c as u64)));
            gate.push(c, ChannelEvent::Batch(batch(c as u64)));
        }
        gate.set_blocked(1, true);
        assert!(gate.is_blocked(1));
        let order: Vec<usize> = drain(&mut gate).into_iter().map(|(c, ..)| c).collect();
        assert_eq!(order, [0, 2, 0, 2]);
        gate.unblock_all();
        assert!(!gate.is_blocked(1));
        let order: Vec<usize> = drain(&mut gate).into_iter().map(|(c, ..)| c).collect();
        assert_eq!(order, [1, 1]);
    }

    #[test]
    fn replayed_batches_of_every_channel_poll_before_anything_delivered() {
        let mut gate = InputGate::new(3);
        gate.push(0, ChannelEvent::Batch(batch(3)));
        gate.replay(0, vec![batch(1), batch(2)]);
        gate.push(1, ChannelEvent::Batch(batch(10)));
        gate.replay(2, vec![batch(20)]);
        assert_eq!(
            drain(&mut gate),
            [
                (0, true, "[1]".to_string()),
                (2, true, "[20]".to_string()),
                (0, true, "[2]".to_string()),
                (1, false, "[10]".to_string()),
                (0, false, "[3]".to_string()),
            ]
        );
    }

    #[test]
    fn control_polls_only_checkpoint_barriers_and_cancel_markers_at_the_head() {
        let mut gate = InputGate::new(4);
        gate.push(0, ChannelEvent::Batch(batch(1)));
        gate.push(0, barrier(1));
        gate.push(1, barrier(1));
        gate.push(1, ChannelEvent::Batch(batch(2)));
        gate.push(2, ChannelEvent::CancelMarker(CheckpointId(2)));
        gate.push(3, ChannelEvent::Watermark(5));
        gate.push(3, barrier(1));
        let polled: Vec<_> = std::iter::from_fn(|| gate.poll_control())
            .map(|(channel, control)| match control {
                Control::Barrier(b) => (channel, b.id),
                Control::Cancel(checkpoint) => (channel, checkpoint),
            })
            .collect();
        assert_eq!(polled, [(1, CheckpointId(1)), (2, CheckpointId(2))]);
        assert_eq!(
            drain(&mut gate)
                .into_iter()
                .map(|(c, ..)| c)
                .collect::<Vec<_>>(),
            [3, 0, 1, 3, 0],
            "the rest stays queued, in order"
        );

        let mut savepoint = barrier(3);
        if let ChannelEvent::Barrier(b) = &mut savepoint {
            b.options.kind = CheckpointKind::Savepoint;
        }
        gate.push(2, savepoint);
        assert!(gate.poll_control().is_none(), "a savepoint's barrier waits");
        assert_eq!(drain(&mut gate).len(), 1);
        gate.push(0, barrier(3));
        gate.set_blocked(0, true);
        assert!(gate.poll_control().is_none(), "a blocked channel waits");
        gate.unblock_all();
        gate.replay(1, vec![batch(4)]);
        assert!(gate.poll_control().is_none(), "replayed state comes first");
        assert_eq!(drain(&mut gate).len(), 2);
    }

    #[test]
    fn batches_before_a_barrier_are_copied_and_stay_queued() {
        let mut gate = InputGate::new(1);
        gate.replay(0, vec![batch(1)]);
        gate.push(0, ChannelEvent::Batch(batch(2)));
        gate.push(0, barrier(1));
        gate.push(0, ChannelEvent::Batch(batch(3)));
        gate.push(0, barrier(2));
        gate.push(0, ChannelEvent::Batch(batch(4)));

        let (before_1, found) = gate.batches_before(0, CheckpointId(1));
        assert_eq!((values(before_1), found), (vec![1, 2], true));
        let (before_2, found) = gate.batches_before(0, CheckpointId(2));
        assert_eq!((values(before_2), found), (vec![1, 2, 3], true));
        let (before_3, found) = gate.batches_before(0, CheckpointId(3));
        assert_eq!((values(before_3), found), (vec![1, 2, 3, 4], false));
        assert_eq!(drain(&mut gate).len(), 6);
    }
}
