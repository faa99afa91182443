//! The interval join driven step by step as the builder wires it: a
//! `KeyedProcess` over `Either<L, R>` running `Sides(IntervalJoin)`, on the
//! heap backend. Which pairs it emits, when the watermark empties its
//! buffers, what happens to late records, and a snapshot and restore in
//! the middle of a stream.

use super::TimeMetrics;
use crate::dataflow::operator::{
    Collector, Downstream, KeyedFunctionFactory, KeyedProcess, Output, RecordWriter, Route, Step,
};
use crate::dataflow::task::{KeyedSnapshot, RestoreState, TaskSnapshot};
use crate::dataflow::two_input::{Either, Sides};
use crate::job::join::{IntervalJoin, JoinFunction};
use crate::model::ids::{CheckpointId, SubtaskIndex};
use crate::model::key_group::KeyGroupRange;
use crate::state::{KeyedStateBackend, StateBackend};
use bytes::Bytes;
use std::sync::Arc;

use super::tests::{fire_remaining, Ev, MAX_P};

/// A joined pair: the key, the left record's time, the right record's.
type Pair = (u64, u64, u64);

/// What the join is fed, in order: (key, time) of a left or right record,
/// or a watermark.
#[derive(Clone, Copy, Debug)]
enum In {
    L(u64, u64),
    R(u64, u64),
    Watermark(u64),
}

use In::{Watermark, L, R};

/// The join of one subtask that owns every key group.
struct Driver {
    process: KeyedProcess<u64, Either<Ev, Ev>, Pair>,
    metrics: Arc<TimeMetrics>,
}

impl Driver {
    /// Pairs a left record at `t` with the right records of its key from
    /// `t + lower` to `t + upper`; starts from `state`.
    fn new(lower: i64, upper: i64, metrics: &Arc<TimeMetrics>, state: &RestoreState) -> Self {
        let pair: JoinFunction<Ev, Ev, Pair> =
            Arc::new(|l: &Ev, r: &Ev, out: &mut Collector<'_, Pair>| {
                out.collect((l.key, l.ts, r.ts))
            });
        let join_metrics = metrics.clone();
        let factory: KeyedFunctionFactory<u64, Either<Ev, Ev>, Pair> = Arc::new(move |states| {
            let join = IntervalJoin::open(states, lower, upper, pair.clone(), join_metrics.clone());
            Box::new(Sides(join))
        });
        let range = KeyGroupRange::for_subtask(MAX_P, 1, SubtaskIndex(0));
        let backend = KeyedStateBackend::new(&StateBackend::Heap, "join", range, MAX_P);
        let writer = RecordWriter::<Pair>::new(Route::Forward, 0, 1, 1 << 20);
        let mut process = KeyedProcess::new(
            Arc::new(|r: &Either<Ev, Ev>| match r {
                Either::Left(e) | Either::Right(e) => e.key,
            }),
            &factory,
            backend,
            metrics.clone(),
            Output::from(Box::new(writer) as Box<dyn Downstream<Pair>>),
        );
        process.restore(state).unwrap();
        Driver {
            process,
            metrics: metrics.clone(),
        }
    }

    /// Feeds `input`: the pairs emitted.
    fn feed(&mut self, input: &[In]) -> Vec<Pair> {
        let mut out = Vec::new();
        for &i in input {
            match i {
                L(key, ts) => self.process.push(Either::Left(Ev { key, ts })),
                R(key, ts) => self.process.push(Either::Right(Ev { key, ts })),
                Watermark(w) => {
                    self.process.advance_watermark(w, &mut out).unwrap();
                    fire_remaining(&mut self.process, &mut out);
                }
            }
        }
        self.process.flush(&mut out).unwrap();
        out.into_iter()
            .flat_map(|(_, b)| b.into_records::<Pair>().unwrap())
            .collect()
    }

    /// The keyed state, as a restore of the same key groups gets it.
    fn snapshot(&mut self) -> RestoreState {
        let mut snapshot = TaskSnapshot::default();
        self.process
            .snapshot(CheckpointId(1), &mut Vec::new(), &mut snapshot)
            .unwrap();
        let Some(KeyedSnapshot::Heap(heap)) = snapshot.keyed else {
            unreachable!("a heap backend snapshots on the heap")
        };
        let mut bytes = Vec::new();
        let range = heap.key_groups();
        let offsets = heap.write(&mut bytes);
        let ends = offsets.iter().skip(1).copied().chain([bytes.len() as u64]);
        let key_groups = range
            .iter()
            .zip(offsets.iter().zip(ends))
            .map(|(g, (&start, end))| {
                (
                    g,
                    Bytes::copy_from_slice(&bytes[start as usize..end as usize]),
                )
            })
            .collect();
        RestoreState {
            key_groups,
            ..RestoreState::default()
        }
    }

    /// Ends the input: how many records were still buffered.
    fn end(mut self) -> u64 {
        self.process.end_input(&mut Vec::new()).unwrap();
        self.metrics.join_buffered()
    }
}

fn fresh(lower: i64, upper: i64) -> Driver {
    Driver::new(lower, upper, &Arc::default(), &RestoreState::default())
}

/// `between(5 ms before, 10 ms after)`: a left record at t pairs with the
/// right records of its key from t - 5 to t + 10, bounds included, and with
/// nothing of another key, whichever side arrives first.
#[test]
fn pairs_exactly_the_records_of_a_key_within_asymmetric_bounds() {
    let mut join = fresh(-5, 10);
    let rights = [94, 95, 100, 110, 111];
    let mut input = vec![L(1, 100)];
    input.extend(rights.map(|ts| R(1, ts)));
    input.push(R(2, 100));
    input.extend(rights.map(|ts| R(3, ts)));
    input.push(L(3, 100));
    let mut pairs = join.feed(&input);
    pairs.sort();
    assert_eq!(
        pairs,
        [
            (1, 100, 95),
            (1, 100, 100),
            (1, 100, 110),
            (3, 100, 95),
            (3, 100, 100),
            (3, 100, 110)
        ]
    );
    assert_eq!(join.metrics.counters().join_pairs, 6);
}

/// A record waits as long as a record of the other side can still pair
/// with it, up to the key's cleanup timer, rounded to a multiple of the
/// interval's length: with `between(5 ms before, 10 ms after)` (15 ms), a
/// left record at 100 can pair until 110 and is cleared at 120, a right one
/// at 120 until 125 and is cleared at 135; once the watermark is at its
/// end, nothing is buffered.
#[test]
fn the_watermark_empties_the_buffers() {
    let records = [L(1, 100), R(1, 120)];
    for (watermark, buffered) in [(119, 2), (120, 1), (134, 1), (135, 0), (u64::MAX, 0)] {
        let mut join = fresh(-5, 10);
        assert_eq!(join.feed(&records), []);
        assert_eq!(join.feed(&[Watermark(watermark)]), []);
        assert_eq!(join.end(), buffered, "at watermark {watermark}");
    }
    // Still buffered below its end: a right record in time pairs.
    let mut join = fresh(-5, 10);
    let input = [L(1, 100), Watermark(109), R(1, 110)];
    assert_eq!(join.feed(&input), [(1, 100, 110)]);
}

/// A record behind the watermark is dropped: it pairs with nothing, is not
/// buffered, and is counted as late.
#[test]
fn a_record_behind_the_watermark_is_dropped_and_counted() {
    let mut join = fresh(-5, 10);
    let input = [R(1, 150), Watermark(150), L(1, 149), L(1, 151)];
    assert_eq!(join.feed(&input), [(1, 151, 150)]);
    assert_eq!(join.metrics.counters().late_records, 1);
    assert_eq!(join.end(), 2, "the right record and the left one in time");
}

/// Both sides over 3 keys, out of order by up to 60 ms, with a watermark
/// every 10 records, each followed by a late record.
fn stream() -> Vec<In> {
    let mut input = Vec::new();
    for i in 0..120u64 {
        let (key, ts) = (i % 3, 10 * i + (i * 37) % 60);
        input.push(if i % 2 == 0 { R(key, ts) } else { L(key, ts) });
        if i % 10 == 9 {
            input.extend([Watermark(10 * i - 50), R(key, 10 * i - 60)]);
        }
    }
    input
}

/// A join restored from a snapshot taken mid-stream emits exactly the pairs
/// and drops exactly the late records of a run without the failure: its
/// buffers and cleanup timers are in the snapshot. The restored join gets
/// the last watermark again first, as a restored source sends it.
#[test]
fn a_join_restored_mid_stream_pairs_as_an_uninterrupted_one() {
    let (lower, upper) = (-40, 60);
    let mut input = stream();
    input.push(Watermark(u64::MAX));
    let (before, after) = input.split_at(input.len() / 2);
    let resent = before.iter().rev().find_map(|i| match i {
        Watermark(w) => Some(Watermark(*w)),
        _ => None,
    });
    let after = [resent.into_iter().collect(), after.to_vec()].concat();

    let mut whole = fresh(lower, upper);
    let mut expected = whole.feed(&input);
    expected.sort();

    let metrics = Arc::default();
    let mut first = Driver::new(lower, upper, &metrics, &RestoreState::default());
    let mut pairs = first.feed(before);
    let state = first.snapshot();
    let mut restored = Driver::new(lower, upper, &metrics, &state);
    pairs.extend(restored.feed(&after));
    pairs.sort();
    assert_eq!(pairs, expected);
    let counters = |d: &Driver| {
        let c = d.metrics.counters();
        (c.join_pairs, c.late_records)
    };
    assert_eq!(counters(&restored), counters(&whole));
    assert_eq!(counters(&whole), (99, 12));
    assert_eq!(restored.end(), 0);
    assert_eq!(whole.end(), 0);

    // Without the snapshot, the pairs across the cut would be lost.
    let mut lost = fresh(lower, upper).feed(before);
    lost.extend(fresh(lower, upper).feed(&after));
    assert_eq!(expected.len() - lost.len(), 3);
}
