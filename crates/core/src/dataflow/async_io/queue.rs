//! The rules of an async operator's output, free of IO: which results and
//! watermarks go out when (Flink's `StreamElementQueue`). Ordered, results
//! leave in input order. Unordered, a result leaves as soon as it is in,
//! but never across a watermark: the records before a watermark all leave
//! before it, and those after it only after it.

use rustc_hash::FxHashMap;
use std::collections::VecDeque;

/// In which order an async operator emits its results.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputMode {
    /// In the order of the input (Flink's `orderedWait`).
    Ordered,
    /// As they complete, within the records between two watermarks
    /// (Flink's `unorderedWait`).
    Unordered,
}

/// A record the operator took, by the order it came in.
pub type RequestId = u64;

/// Records between two watermarks, and the watermark that closes them.
#[derive(Debug, Default)]
struct Segment {
    /// Records of the segment not yet emitted.
    open: usize,
    /// Unordered: requests complete before the segment came to the front.
    held: Vec<RequestId>,
    /// The watermark after the segment's records; none for the last.
    closed_by: Option<u64>,
}

struct Slot<I, O> {
    input: I,
    segment: u64,
    result: Option<Vec<O>>,
}

/// What leaves the queue, in order.
#[derive(Debug, PartialEq, Eq)]
pub enum Released<O> {
    /// The results of one record.
    Results(Vec<O>),
    /// A watermark every record before which has left.
    Watermark(u64),
}

/// The records an async operator holds, from when it takes them until
/// their results leave: requests in flight, and results waiting for
/// earlier ones (ordered) or for a watermark to pass (unordered).
pub struct AsyncQueue<I, O> {
    mode: OutputMode,
    capacity: usize,
    /// By request, in input order (ordered mode reads it front to back).
    order: VecDeque<RequestId>,
    slots: FxHashMap<RequestId, Slot<I, O>>,
    /// The front segment is the one whose results may leave.
    segments: VecDeque<Segment>,
    /// The sequence number of the front segment.
    front: u64,
    next_id: RequestId,
    released: Vec<Released<O>>,
}

impl<I, O> AsyncQueue<I, O> {
    /// An empty queue of at most `capacity` records (at least 1).
    pub fn new(mode: OutputMode, capacity: usize) -> Self {
        AsyncQueue {
            mode,
            capacity: capacity.max(1),
            order: VecDeque::new(),
            slots: FxHashMap::default(),
            segments: VecDeque::from([Segment {
                open: 0,
                held: Vec::new(),
                closed_by: None,
            }]),
            front: 0,
            next_id: 0,
            released: Vec::new(),
        }
    }

    /// Whether it can take another record.
    pub fn has_room(&self) -> bool {
        self.slots.len() < self.capacity
    }

    /// Whether it holds neither records nor watermarks.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty() && self.segments.len() == 1
    }

    /// Takes `input`, whose request the caller issues under the id
    /// returned. The caller checks [`has_room`](Self::has_room) first.
    pub fn push(&mut self, input: I) -> RequestId {
        let id = self.next_id;
        self.next_id += 1;
        let segment = self.front + self.segments.len() as u64 - 1;
        self.segments.back_mut().expect("one segment is open").open += 1;
        if self.mode == OutputMode::Ordered {
            self.order.push_back(id);
        }
        self.slots.insert(
            id,
            Slot {
                input,
                segment,
                result: None,
            },
        );
        id
    }

    /// A watermark came after the records taken so far: it leaves once they
    /// all have.
    pub fn watermark(&mut self, watermark: u64) {
        self.segments
            .back_mut()
            .expect("one segment is open")
            .closed_by = Some(watermark);
        self.segments.push_back(Segment {
            open: 0,
            held: Vec::new(),
            closed_by: None,
        });
        self.release();
    }

    /// The input of request `id`, for its timeout handler; `None` once it
    /// completed.
    pub fn input(&self, id: RequestId) -> Option<&I> {
        self.slots
            .get(&id)
            .filter(|s| s.result.is_none())
            .map(|s| &s.input)
    }

    /// Request `id` completed with `results`; a second completion (a late
    /// one, after its timeout) is ignored. Returns whether it counted.
    pub fn complete(&mut self, id: RequestId, results: Vec<O>) -> bool {
        let Some(slot) = self.slots.get_mut(&id).filter(|s| s.result.is_none()) else {
            return false;
        };
        match self.mode {
            OutputMode::Ordered => slot.result = Some(results),
            OutputMode::Unordered => {
                let segment = slot.segment;
                if segment == self.front {
                    self.slots.remove(&id);
                    self.released.push(Released::Results(results));
                    self.segments[0].open -= 1;
                } else {
                    // Kept whole until it leaves: a snapshot requests it
                    // again.
                    slot.result = Some(results);
                    self.segment_mut(segment).held.push(id);
                }
            }
        }
        self.release();
        true
    }

    fn segment_mut(&mut self, seq: u64) -> &mut Segment {
        &mut self.segments[(seq - self.front) as usize]
    }

    /// Moves what may leave now to `released`.
    fn release(&mut self) {
        if self.mode == OutputMode::Ordered {
            while let Some(id) = self.order.front() {
                let Some(results) = self.slots.get_mut(id).and_then(|s| s.result.take()) else {
                    break;
                };
                self.slots.remove(id);
                self.order.pop_front();
                self.segments[0].open -= 1;
                self.released.push(Released::Results(results));
                self.close_front_segments();
            }
        }
        self.close_front_segments();
    }

    /// Front segments whose records have all left let their watermark go.
    fn close_front_segments(&mut self) {
        while self.segments.len() > 1 && self.segments[0].open == 0 {
            let done = self.segments.pop_front().expect("more than one");
            let watermark = done.closed_by.expect("only the last segment is open");
            self.released.push(Released::Watermark(watermark));
            self.front += 1;
            for id in std::mem::take(&mut self.segments[0].held) {
                let slot = self.slots.remove(&id).expect("a held request has a slot");
                let results = slot.result.expect("a held request completed");
                self.released.push(Released::Results(results));
                self.segments[0].open -= 1;
            }
        }
    }

    /// What may leave, in order, since the last call.
    pub fn take_released(&mut self) -> std::vec::Drain<'_, Released<O>> {
        self.released.drain(..)
    }

    /// The inputs of every record whose results have not left, in input
    /// order: what a snapshot keeps, to request again after a restore.
    pub fn inputs(&self) -> Vec<&I> {
        let mut held: Vec<(&RequestId, &Slot<I, O>)> = self.slots.iter().collect();
        held.sort_unstable_by_key(|(id, _)| **id);
        held.into_iter().map(|(_, s)| &s.input).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Released::{Results, Watermark};

    fn drain(q: &mut AsyncQueue<u32, u32>) -> Vec<Released<u32>> {
        q.take_released().collect()
    }

    #[test]
    fn ordered_results_leave_in_input_order_with_their_watermarks() {
        let mut q = AsyncQueue::new(OutputMode::Ordered, 10);
        let a = q.push(1);
        let b = q.push(2);
        q.watermark(100);
        let c = q.push(3);
        assert!(q.complete(c, vec![30]));
        assert!(q.complete(b, vec![20]));
        assert_eq!(drain(&mut q), []);
        assert!(q.complete(a, vec![10, 11]));
        assert_eq!(
            drain(&mut q),
            [
                Results(vec![10, 11]),
                Results(vec![20]),
                Watermark(100),
                Results(vec![30])
            ]
        );
        assert!(q.is_empty());
    }

    #[test]
    fn unordered_results_leave_at_once_but_never_across_a_watermark() {
        let mut q = AsyncQueue::new(OutputMode::Unordered, 10);
        let a = q.push(1);
        let b = q.push(2);
        q.watermark(100);
        let c = q.push(3);
        q.watermark(200);
        let d = q.push(4);
        q.complete(b, vec![20]);
        q.complete(d, vec![40]);
        q.complete(c, vec![30]);
        assert_eq!(drain(&mut q), [Results(vec![20])]);
        q.complete(a, vec![10]);
        assert_eq!(
            drain(&mut q),
            [
                Results(vec![10]),
                Watermark(100),
                Results(vec![30]),
                Watermark(200),
                Results(vec![40])
            ]
        );
        assert!(q.is_empty());
    }

    #[test]
    fn a_watermark_with_nothing_before_it_leaves_at_once() {
        for mode in [OutputMode::Ordered, OutputMode::Unordered] {
            let mut q = AsyncQueue::<u32, u32>::new(mode, 1);
            q.watermark(5);
            assert_eq!(drain(&mut q), [Watermark(5)], "{mode:?}");
            assert!(q.is_empty());
        }
    }

    #[test]
    fn capacity_counts_records_until_their_results_leave() {
        let mut q = AsyncQueue::new(OutputMode::Ordered, 2);
        let a = q.push(1);
        let b = q.push(2);
        assert!(!q.has_room());
        q.complete(b, vec![2]);
        // Done, but waiting behind the first: still held.
        assert!(!q.has_room());
        assert_eq!(q.inputs(), [&1, &2]);
        q.complete(a, vec![1]);
        assert!(q.has_room());
        assert!(q.inputs().is_empty());
    }

    #[test]
    fn a_second_completion_of_a_request_is_ignored() {
        for mode in [OutputMode::Ordered, OutputMode::Unordered] {
            let mut q = AsyncQueue::new(mode, 4);
            let a = q.push(1);
            assert_eq!(q.input(a), Some(&1));
            assert!(q.complete(a, vec![1]));
            assert!(!q.complete(a, vec![9]), "{mode:?}");
            assert_eq!(q.input(a), None);
            assert_eq!(drain(&mut q), [Results(vec![1])]);
        }
    }

    #[test]
    fn unordered_inputs_are_those_not_yet_emitted_in_input_order() {
        let mut q = AsyncQueue::new(OutputMode::Unordered, 10);
        let ids: Vec<_> = (0..4).map(|i| q.push(i)).collect();
        q.watermark(10);
        let late = q.push(4);
        q.complete(late, vec![4]);
        q.complete(ids[1], vec![1]);
        // 4's result waits for the watermark, so it is requested again.
        assert_eq!(q.inputs(), [&0, &2, &3, &4]);
    }
}
