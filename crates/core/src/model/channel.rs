//! Credit-based flow control, sans-IO. A receiver grants its sender one credit
//! per batch it can hold; a sender never has more batches in flight than it
//! was granted. Control events (barriers, cancel markers, end of partition)
//! take no credit but keep their place in the order.
//!
//! The same two halves serve both links of a channel: subtask → output
//! endpoint, and output endpoint → input endpoint. Both keep their queued
//! events in the open, so that an unaligned checkpoint can take them.

use crate::model::batch::Batch;
use crate::model::event::ChannelEvent;
use std::collections::VecDeque;
use thiserror::Error;

/// Credits of each link of a channel; buffered memory per channel is bounded
/// by their sum times the batch size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelConfig {
    /// Batches the output endpoint queues for its subtask.
    pub output_credits: u32,
    /// Batches in flight to, or queued in, the input endpoint.
    pub input_credits: u32,
    /// Batches the input endpoint hands to its subtask before the first is
    /// consumed; the rest wait in the endpoint, where they can be taken.
    pub prefetch: u32,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        ChannelConfig {
            output_credits: 2,
            input_credits: 4,
            prefetch: 2,
        }
    }
}

/// A broken flow-control protocol: a bug on one side of the channel, never a
/// condition to wait out.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ChannelError {
    /// The sender sent a batch it had no credit for.
    #[error("received a batch without credit: {queued} batches held, {capacity} granted")]
    CreditOverrun {
        /// Batches the receiver held.
        queued: u32,
        /// Credits it had granted.
        capacity: u32,
    },
    /// The consumer reported a batch consumed that it was never handed.
    #[error("a batch was consumed that was never delivered")]
    NothingDelivered,
}

/// Sending half: queues events and releases them as credit allows.
#[derive(Debug, Default)]
pub struct CreditSender {
    queue: VecDeque<ChannelEvent>,
    credits: u32,
    queued_batches: u32,
}

impl CreditSender {
    /// Queues `event` behind everything queued.
    pub fn push(&mut self, event: ChannelEvent) {
        self.queued_batches += u32::from(event.is_batch());
        self.queue.push_back(event);
    }

    /// Puts `event` (an unaligned barrier) ahead of everything queued, and
    /// returns copies of the batches it overtook: they are still sent, after
    /// it, and are the channel state of its checkpoint.
    pub fn push_priority(&mut self, event: ChannelEvent) -> Vec<Batch> {
        let overtaken = self.overtaken();
        self.queued_batches += u32::from(event.is_batch());
        self.queue.push_front(event);
        overtaken
    }

    /// Copies of the queued batches, which a priority event sent around
    /// this queue overtakes.
    pub fn overtaken(&self) -> Vec<Batch> {
        queued_batches(&self.queue)
    }

    /// The receiver granted `credits` more batches.
    pub fn grant(&mut self, credits: u32) {
        self.credits += credits;
    }

    /// Next event the link may carry now.
    pub fn poll_send(&mut self) -> Option<ChannelEvent> {
        let front = self.queue.front()?;
        if front.is_batch() {
            if self.credits == 0 {
                return None;
            }
            self.credits -= 1;
            self.queued_batches -= 1;
        }
        self.queue.pop_front()
    }

    /// Events that are waiting for credit.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Batches queued, waiting for credit.
    pub fn queued_batches(&self) -> u32 {
        self.queued_batches
    }
}

/// Receiving half: holds what arrived, hands at most `prefetch` batches to
/// the consumer at a time, and returns a credit for each batch consumed.
#[derive(Debug)]
pub struct CreditReceiver {
    queue: VecDeque<ChannelEvent>,
    queued_batches: u32,
    delivered: u32,
    capacity: u32,
    prefetch: u32,
}

impl CreditReceiver {
    /// `capacity` is the number of credits granted to the sender up front.
    pub fn new(capacity: u32, prefetch: u32) -> Self {
        assert!(capacity > 0 && prefetch > 0, "credits must be positive");
        CreditReceiver {
            queue: VecDeque::new(),
            queued_batches: 0,
            delivered: 0,
            capacity,
            prefetch: prefetch.min(capacity),
        }
    }

    /// Credits to grant the sender when the channel opens.
    pub fn initial_credits(&self) -> u32 {
        self.capacity
    }

    /// Takes an event from the sender; a batch beyond the granted credit is
    /// an error.
    pub fn receive(&mut self, event: ChannelEvent) -> Result<(), ChannelError> {
        if event.is_batch() {
            if self.buffered() >= self.capacity {
                return Err(ChannelError::CreditOverrun {
                    queued: self.buffered(),
                    capacity: self.capacity,
                });
            }
            self.queued_batches += 1;
        }
        self.queue.push_back(event);
        Ok(())
    }

    /// Next event to hand to the consumer, if the prefetch window allows.
    pub fn poll_deliver(&mut self) -> Option<ChannelEvent> {
        let front = self.queue.front()?;
        if front.is_batch() {
            if self.delivered >= self.prefetch {
                return None;
            }
            self.delivered += 1;
            self.queued_batches -= 1;
        }
        self.queue.pop_front()
    }

    /// Copies of the batches a priority event overtakes when it is handed to
    /// the consumer ahead of them.
    pub fn overtaken(&self) -> Vec<Batch> {
        queued_batches(&self.queue)
    }

    /// The consumer finished a delivered batch; returns the credit to grant
    /// back to the sender.
    pub fn consumed(&mut self) -> Result<u32, ChannelError> {
        if self.delivered == 0 {
            return Err(ChannelError::NothingDelivered);
        }
        self.delivered -= 1;
        Ok(1)
    }

    /// Batches held here or by the consumer: never more than the capacity.
    pub fn buffered(&self) -> u32 {
        self.queued_batches + self.delivered
    }
}

fn queued_batches(queue: &VecDeque<ChannelEvent>) -> Vec<Batch> {
    queue
        .iter()
        .filter_map(|event| match event {
            ChannelEvent::Batch(batch) => Some(batch.clone()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::batch::Batch;
    use crate::model::ids::CheckpointId;

    fn batch(n: u64) -> ChannelEvent {
        ChannelEvent::Batch(Batch::new(vec![n]))
    }

    fn value(event: ChannelEvent) -> u64 {
        match event {
            ChannelEvent::Batch(b) => b.into_records::<u64>().unwrap()[0],
            other => panic!("expected a batch, got {other:?}"),
        }
    }

    #[test]
    fn sender_stops_at_zero_credit_and_resumes_on_grant() {
        let mut s = CreditSender::default();
        for n in 0..3 {
            s.push(batch(n));
        }
        assert!(s.poll_send().is_none());
        s.grant(2);
        assert_eq!(value(s.poll_send().unwrap()), 0);
        assert_eq!(value(s.poll_send().unwrap()), 1);
        assert!(s.poll_send().is_none());
        assert_eq!(s.queued_batches(), 1);
        s.grant(1);
        assert_eq!(value(s.poll_send().unwrap()), 2);
        assert!(s.is_empty());
    }

    #[test]
    fn control_events_take_no_credit_but_keep_order() {
        let mut s = CreditSender::default();
        s.push(ChannelEvent::CancelMarker(CheckpointId(1)));
        s.push(batch(0));
        s.push(ChannelEvent::EndOfPartition);
        assert!(matches!(s.poll_send(), Some(ChannelEvent::CancelMarker(_))));
        assert!(
            s.poll_send().is_none(),
            "end of partition must not pass the batch"
        );
        s.grant(1);
        assert_eq!(value(s.poll_send().unwrap()), 0);
        assert!(matches!(s.poll_send(), Some(ChannelEvent::EndOfPartition)));
    }

    #[test]
    fn receiver_bounds_what_it_holds_and_returns_credit_per_consumed_batch() {
        let mut r = CreditReceiver::new(3, 2);
        let mut s = CreditSender::default();
        s.grant(r.initial_credits());
        for n in 0..10 {
            s.push(batch(n));
        }
        let mut received = Vec::new();
        // A slow consumer: consume one batch per round.
        for _ in 0..40 {
            while let Some(e) = s.poll_send() {
                r.receive(e).unwrap();
            }
            assert!(r.buffered() <= 3);
            let mut delivered = Vec::new();
            while let Some(e) = r.poll_deliver() {
                delivered.push(value(e));
            }
            assert!(delivered.len() <= 2);
            received.extend(delivered);
            if r.buffered() > 0 && r.queued_batches < r.buffered() {
                s.grant(r.consumed().unwrap());
            }
        }
        assert_eq!(received, (0..10).collect::<Vec<_>>());
    }

    fn values(batches: Vec<Batch>) -> Vec<u64> {
        batches
            .into_iter()
            .flat_map(|b| b.into_records::<u64>().unwrap())
            .collect()
    }

    fn barrier() -> ChannelEvent {
        use crate::model::event::{Alignment, Barrier, CheckpointKind, CheckpointOptions};
        ChannelEvent::Barrier(Barrier {
            id: CheckpointId(7),
            timestamp: 0,
            options: CheckpointOptions {
                kind: CheckpointKind::Checkpoint,
                alignment: Alignment::Unaligned,
            },
        })
    }

    #[test]
    fn priority_barrier_overtakes_queued_batches_which_still_follow_it() {
        let mut s = CreditSender::default();
        s.grant(1);
        for n in 0..4 {
            s.push(batch(n));
        }
        assert_eq!(value(s.poll_send().unwrap()), 0);
        let overtaken = s.push_priority(barrier());
        assert_eq!(
            values(overtaken),
            [1, 2, 3],
            "exactly what was still queued"
        );
        assert!(
            matches!(s.poll_send(), Some(ChannelEvent::Barrier(_))),
            "the barrier leaves without credit, ahead of the batches"
        );
        assert!(s.poll_send().is_none());
        s.grant(3);
        let sent: Vec<u64> = std::iter::from_fn(|| s.poll_send()).map(value).collect();
        assert_eq!(sent, [1, 2, 3]);
    }

    #[test]
    fn receiver_reports_what_a_priority_event_overtakes() {
        let mut r = CreditReceiver::new(4, 1);
        for n in 0..3 {
            r.receive(batch(n)).unwrap();
        }
        assert_eq!(value(r.poll_deliver().unwrap()), 0);
        assert_eq!(
            values(r.overtaken()),
            [1, 2],
            "the delivered batch is the consumer's, not overtaken here"
        );
        assert_eq!(r.buffered(), 3, "overtaking takes nothing away");
    }

    #[test]
    fn receiver_rejects_a_batch_beyond_its_credits() {
        let mut r = CreditReceiver::new(1, 1);
        r.receive(batch(0)).unwrap();
        assert_eq!(
            r.receive(batch(1)),
            Err(ChannelError::CreditOverrun {
                queued: 1,
                capacity: 1
            })
        );
        assert_eq!(
            CreditReceiver::new(1, 1).consumed(),
            Err(ChannelError::NothingDelivered)
        );
    }
}
