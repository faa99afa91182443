//! The input gate of a subtask: the events its input endpoints delivered, one
//! queue per channel, polled fairly. The barrier handlers of the checkpoint
//! protocol decide which channels are blocked; the gate only honours that.

use crate::event::ChannelEvent;
use std::collections::VecDeque;

#[derive(Debug)]
struct InputChannel {
    queue: VecDeque<ChannelEvent>,
    blocked: bool,
    ended: bool,
}

#[derive(Debug)]
pub struct InputGate {
    channels: Vec<InputChannel>,
    next: usize,
}

impl InputGate {
    pub fn new(channels: usize) -> Self {
        InputGate {
            channels: (0..channels)
                .map(|_| InputChannel {
                    queue: VecDeque::new(),
                    blocked: false,
                    ended: false,
                })
                .collect(),
            next: 0,
        }
    }

    pub fn channels(&self) -> usize {
        self.channels.len()
    }

    pub fn push(&mut self, channel: usize, event: ChannelEvent) {
        self.channels[channel].queue.push_back(event);
    }

    pub fn set_blocked(&mut self, channel: usize, blocked: bool) {
        self.channels[channel].blocked = blocked;
    }

    pub fn unblock_all(&mut self) {
        for c in &mut self.channels {
            c.blocked = false;
        }
    }

    /// Next event and its channel, from an unblocked channel, round robin so
    /// that one fast channel cannot starve the others.
    pub fn poll(&mut self) -> Option<(usize, ChannelEvent)> {
        let n = self.channels.len();
        for step in 0..n {
            let channel = (self.next + step) % n;
            let c = &mut self.channels[channel];
            if c.blocked {
                continue;
            }
            if let Some(event) = c.queue.pop_front() {
                if matches!(event, ChannelEvent::EndOfPartition) {
                    c.ended = true;
                }
                self.next = (channel + 1) % n;
                return Some((channel, event));
            }
        }
        None
    }

    pub fn all_ended(&self) -> bool {
        self.channels.iter().all(|c| c.ended)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Batch;

    fn batch(n: u64) -> ChannelEvent {
        ChannelEvent::Batch(Batch::new(vec![n]))
    }

    fn drain(gate: &mut InputGate) -> Vec<(usize, String)> {
        std::iter::from_fn(|| gate.poll())
            .map(|(channel, event)| (channel, format!("{event:?}")))
            .collect()
    }

    #[test]
    fn round_robin_across_channels_and_blocked_channels_wait() {
        let mut gate = InputGate::new(3);
        for c in 0..3 {
            gate.push(c, batch(c as u64));
            gate.push(c, batch(c as u64));
        }
        gate.set_blocked(1, true);
        let order: Vec<usize> = drain(&mut gate).into_iter().map(|(c, _)| c).collect();
        assert_eq!(order, [0, 2, 0, 2]);
        gate.unblock_all();
        let order: Vec<usize> = drain(&mut gate).into_iter().map(|(c, _)| c).collect();
        assert_eq!(order, [1, 1]);
    }

    #[test]
    fn end_of_input_only_after_every_channel_ended() {
        let mut gate = InputGate::new(2);
        gate.push(0, ChannelEvent::EndOfPartition);
        gate.push(1, batch(1));
        assert_eq!(drain(&mut gate).len(), 2);
        assert!(!gate.all_ended());
        gate.push(1, ChannelEvent::EndOfPartition);
        drain(&mut gate);
        assert!(gate.all_ended());
    }
}
