//! Timers and windows driven through a keyed operator, step by step, on both
//! backends: what survives a snapshot, where it goes on a rescale, and how
//! windows fire, merge and treat late records.

use super::*;
use crate::dataflow::operator::{
    Collector, Downstream, KeyedFunctionFactory, KeyedProcess, KeyedProcessFunction, Outgoing,
    Output, RecordWriter, Route, Step,
};
use crate::dataflow::task::{decoder, ChainTask, KeyedSnapshot, RestoreState, Task, TaskSnapshot};
use crate::job::window_operator::{WindowConfig, WindowOperator};
use crate::model::batch::Data;
use crate::model::ids::{CheckpointId, KeyGroup, SubtaskIndex};
use crate::model::key_group::{key_group_of, KeyGroupRange};
use crate::state::{KeyedContext, KeyedStateBackend, StateBackend};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

pub(super) const MAX_P: u32 = 128;

/// A keyed record with its event time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Ev {
    pub(super) key: u64,
    pub(super) ts: u64,
}

impl Timestamped for Ev {
    fn timestamp(&self) -> u64 {
        self.ts
    }
}

fn ev(key: u64, ts: u64) -> Ev {
    Ev { key, ts }
}

/// The directory of a native checkpoint, once made.
fn native_dir(pending: crate::state::snapshot::PendingNative) -> std::path::PathBuf {
    pending.wait().expect("the native checkpoint is made").dir
}

fn range(p: u32, index: u32) -> KeyGroupRange {
    KeyGroupRange::for_subtask(MAX_P, p, SubtaskIndex(index))
}

fn operator<O: Data>(
    backend: KeyedStateBackend<u64>,
    factory: &KeyedFunctionFactory<u64, Ev, O>,
    metrics: Arc<TimeMetrics>,
) -> KeyedProcess<u64, Ev, O> {
    let writer = RecordWriter::<O>::new(Route::Forward, 0, 1, 1 << 20);
    KeyedProcess::new(
        Arc::new(|e: &Ev| e.key),
        factory,
        backend,
        metrics,
        Output::from(Box::new(writer) as Box<dyn Downstream<O>>),
    )
}

fn output<O: Data>(out: Outgoing) -> Vec<O> {
    out.into_iter()
        .flat_map(|(_, b)| b.into_records::<O>().unwrap())
        .collect()
}

/// Sets an event-time timer at each record's timestamp and a
/// processing-time timer at `ts + 1_000_000`; emits what fires.
struct Echo;

impl KeyedProcessFunction<u64, Ev, (u64, u64, bool)> for Echo {
    fn process(
        &mut self,
        e: Ev,
        ctx: &mut KeyedContext<'_, u64>,
        _: &mut Collector<'_, (u64, u64, bool)>,
    ) {
        ctx.register_event_time_timer(e.ts);
        ctx.register_processing_time_timer(e.ts + 1_000_000);
    }

    fn on_timer(
        &mut self,
        ts: u64,
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, (u64, u64, bool)>,
    ) {
        let event_time = ctx.timer_domain() == Some(TimeDomain::EventTime);
        out.collect((*ctx.key(), ts, event_time));
    }
}

fn echo() -> KeyedFunctionFactory<u64, Ev, (u64, u64, bool)> {
    Arc::new(|_| Box::new(Echo))
}

/// Everything a snapshot of `process` holds, as restore states of the
/// subtasks of parallelism `p`.
fn restore_states<O: Data>(
    process: &mut KeyedProcess<u64, Ev, O>,
    checkpoint: u64,
    p: u32,
) -> (Vec<RestoreState>, u64) {
    let mut take = |id: u64| {
        let mut snapshot = TaskSnapshot::default();
        process
            .snapshot(CheckpointId(id), &mut Vec::new(), &mut snapshot)
            .unwrap();
        snapshot
    };
    let snapshot = take(checkpoint);
    let states = match snapshot.keyed.expect("a keyed snapshot") {
        KeyedSnapshot::Heap(heap) => {
            let mut bytes = Vec::new();
            let offsets = heap.write(&mut bytes);
            let group = |g: KeyGroup| {
                let start = offsets[g.0 as usize] as usize;
                let end = offsets
                    .get(g.0 as usize + 1)
                    .map_or(bytes.len(), |o| *o as usize);
                bytes::Bytes::copy_from_slice(&bytes[start..end])
            };
            (0..p)
                .map(|i| RestoreState {
                    key_groups: range(p, i).iter().map(|g| (g, group(g))).collect(),
                    ..RestoreState::default()
                })
                .collect()
        }
        // A restore takes a native checkpoint's files over: one each.
        KeyedSnapshot::Native(first) => std::iter::once(native_dir(first))
            .chain((1..p).map(|i| match take(checkpoint + u64::from(i)).keyed {
                Some(KeyedSnapshot::Native(native)) => native_dir(native),
                _ => panic!("a copy of the cache where a native checkpoint was expected"),
            }))
            .map(|dir| RestoreState {
                native: Some(dir),
                ..RestoreState::default()
            })
            .collect(),
    };
    (states, snapshot.timers)
}

fn backends(dir: &tempfile::TempDir, range: KeyGroupRange) -> Vec<KeyedStateBackend<u64>> {
    let mut backends = vec![KeyedStateBackend::new(
        &StateBackend::Heap,
        "test",
        range,
        MAX_P,
    )];
    // The default cache, and one that holds a single value: firing reads
    // its keys ahead as batches do, and must not rely on them staying.
    for (i, cache_entries) in [StateBackend::DEFAULT_CACHE_ENTRIES, 1]
        .into_iter()
        .enumerate()
    {
        let store = crate::testkit::store::MemoryStore::new(dir.path().join(i.to_string()));
        backends.push(KeyedStateBackend::new(
            &StateBackend::Embedded {
                store: Arc::new(store),
                cache_entries,
            },
            &format!("op-{}-{}", range.start, range.end),
            range,
            MAX_P,
        ));
    }
    backends
}

#[test]
fn timers_survive_a_snapshot_and_follow_their_key_groups_to_another_parallelism() {
    let dir = tempfile::tempdir().unwrap();
    let backends_of = |p: u32, i: u32| backends(&dir, range(p, i));
    for (kind, backend) in backends_of(1, 0).into_iter().enumerate() {
        let metrics = Arc::new(TimeMetrics::default());
        let mut process = operator(backend, &echo(), metrics.clone());
        process.restore(&RestoreState::default()).unwrap();
        for key in 0..200u64 {
            // Twice the same timer per key: set semantics keep one.
            process.push(ev(key, 100 + key));
            process.push(ev(key, 100 + key));
        }
        let mut out = Vec::new();
        process.advance_watermark(149, &mut out).unwrap();
        let fired: Vec<(u64, u64, bool)> = output(out);
        assert_eq!(fired.len(), 50, "keys 0..50 fire at 100..=149");
        let (states, timers) = restore_states(&mut process, 1, 2);
        assert_eq!(
            timers,
            150 + 200,
            "150 event-time and 200 processing-time timers"
        );
        // After the snapshot: neither in it nor restored.
        process.push(ev(500, 500));

        let mut restored_fired = Vec::new();
        let mut next_processing = Vec::new();
        for (i, state) in states.iter().enumerate() {
            let backend = backends_of(2, i as u32).remove(kind);
            let mut restored = operator(backend, &echo(), metrics.clone());
            restored.restore(state).unwrap();
            let mut out = Vec::new();
            next_processing.push(restored.advance_processing_time(0, &mut out).unwrap());
            restored.advance_watermark(u64::MAX, &mut out).unwrap();
            // Processing-time timers that fell due while the job was down.
            restored
                .advance_processing_time(2_000_000, &mut out)
                .unwrap();
            for (key, ts, event_time) in output::<(u64, u64, bool)>(out) {
                assert!(range(2, i as u32).contains(key_group_of(&key, MAX_P)));
                restored_fired.push((key, ts, event_time));
            }
        }
        restored_fired.sort();
        let mut expected: Vec<(u64, u64, bool)> = (50..200)
            .map(|k| (k, 100 + k, true))
            .chain((0..200).map(|k| (k, 1_000_100 + k, false)))
            .collect();
        expected.sort();
        assert_eq!(restored_fired, expected, "backend {kind}");
        assert!(next_processing
            .iter()
            .all(|n| n.is_some_and(|n| n >= 1_000_100)));
    }
}

/// The records and outputs of one check of firing in turns: `records`,
/// each of its own key, that make as many timers due at `watermark`, fired
/// once each as `fired` says.
struct Turns<O> {
    factory: KeyedFunctionFactory<u64, Ev, O>,
    records: Vec<Ev>,
    watermark: u64,
    /// The output of each key's timer.
    fired: fn(u64) -> O,
    /// Timers the snapshot counts besides the event-time ones left.
    others: u64,
}

/// Calls `fire_due` until no timer is due, as the subtask does after each
/// yield of its thread.
pub(super) fn fire_remaining(process: &mut impl Step, out: &mut Outgoing) {
    while process.timers_due() {
        process.fire_due(out).unwrap();
    }
}

fn fires_in_turns<O: Data + Ord + std::fmt::Debug>(turns: Turns<O>) {
    let turn = KeyedProcess::<u64, Ev, O>::FIRED_PER_TURN;
    let dir = tempfile::tempdir().unwrap();
    let mut expected: Vec<O> = turns.records.iter().map(|e| (turns.fired)(e.key)).collect();
    expected.sort();
    for (kind, backend) in backends(&dir, range(1, 0)).into_iter().enumerate() {
        let metrics = Arc::new(TimeMetrics::default());
        let mut process = operator(backend, &turns.factory, metrics.clone());
        process.restore(&RestoreState::default()).unwrap();
        for &e in &turns.records {
            process.push(e);
        }
        let mut out = Vec::new();
        process
            .advance_watermark(turns.watermark, &mut out)
            .unwrap();
        let before: Vec<O> = output(out);
        assert_eq!(before.len(), turn, "one turn's worth, backend {kind}");
        let mut released = Vec::new();
        process.take_watermarks(&mut released);
        assert!(released.is_empty() && process.timers_due());

        let (states, timers) = restore_states(&mut process, 1, 2);
        let left = (turns.records.len() - turn) as u64;
        assert_eq!(timers, left + turns.others, "backend {kind}");

        let mut out = Vec::new();
        fire_remaining(&mut process, &mut out);
        process.take_watermarks(&mut released);
        assert_eq!(released, [turns.watermark], "once all fired");
        let mut all: Vec<O> = before.iter().cloned().chain(output(out)).collect();
        all.sort();
        assert_eq!(all, expected, "backend {kind}");

        // Restored from between the turns: what had not fired, once, here
        // fired by the end of input.
        let mut restored_fired = before;
        let mut ended_firing = 0;
        for (i, state) in states.iter().enumerate() {
            let backend = backends(&dir, range(2, i as u32)).remove(kind);
            let mut restored = operator(backend, &turns.factory, metrics.clone());
            restored.restore(state).unwrap();
            let mut out = Vec::new();
            restored
                .advance_watermark(turns.watermark, &mut out)
                .unwrap();
            ended_firing += usize::from(restored.timers_due());
            restored.end_input(&mut out).unwrap();
            assert!(!restored.timers_due());
            restored_fired.extend(output::<O>(out));
        }
        assert!(ended_firing > 0, "more than a turn left in a subtask");
        restored_fired.sort();
        assert_eq!(restored_fired, expected, "restored, backend {kind}");
    }
}

/// A watermark that makes more timers due than a turn fires holds itself
/// back until the last has fired; a snapshot between two turns holds those
/// yet to fire, and they fire once after a restore. Keyed and implied
/// timers alike.
#[test]
fn due_timers_fire_in_turns_and_a_snapshot_between_them_keeps_the_rest() {
    // More than two turns left after the first: more than one in a
    // subtask of two.
    let keys = 3 * KeyedProcess::<u64, Ev, Out>::FIRED_PER_TURN as u64 + 100;
    fires_in_turns(Turns {
        factory: echo(),
        // Three timer times, so that a turn ends within one.
        records: (0..keys).map(|k| ev(k, k % 3)).collect(),
        watermark: 10,
        fired: |k| (k, k % 3, true),
        others: keys,
    });
    fires_in_turns(Turns {
        factory: windows::<Out>(
            WindowAssigner::tumbling(Duration::from_millis(10)),
            WindowConfig::default(),
            false,
        ),
        records: (0..keys).map(|k| ev(k, k % 3)).collect(),
        watermark: 10,
        fired: |k| Out::Fired(k, 0, 10, 1),
        others: 0,
    });
}

/// On an embedded backend whose cache misses them, the keys of due timers
/// are read ahead of firing, a slice of a chunk each turn, in key-group
/// order (`dataflow::due_reads`): a store sorted by key then reads the
/// keys near each other together, not one turn's keys spread over all key
/// groups. Each key is read once, and every timer fires.
#[test]
fn due_keys_are_read_ahead_a_slice_a_turn_in_key_group_order() {
    let slice = crate::dataflow::due_reads::DueReads::<u64>::SLICE;
    let keys = 3 * slice as u64;
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(crate::testkit::store::MemoryStore::new(dir.path()));
    let embedded = || {
        let config = StateBackend::Embedded {
            store: store.clone(),
            cache_entries: StateBackend::DEFAULT_CACHE_ENTRIES,
        };
        KeyedStateBackend::new(&config, "op-0-128", range(1, 0), MAX_P)
    };
    // Timers due in key-group order, so that firing takes the slices in
    // the order they are read.
    let mut by_group: Vec<u64> = (0..keys).collect();
    by_group.sort_by_key(|k| key_group_of(k, MAX_P));
    let metrics = Arc::new(TimeMetrics::default());
    let mut process = operator(embedded(), &echo(), metrics.clone());
    process.restore(&RestoreState::default()).unwrap();
    for (ts, &key) in by_group.iter().enumerate() {
        process.push(ev(key, ts as u64));
    }
    // Restored from a native checkpoint, the cache holds nothing.
    let (states, _) = restore_states(&mut process, 1, 1);
    let mut restored = operator(embedded(), &echo(), metrics);
    restored.restore(&states[0]).unwrap();
    // A record first, as one would come: the cache reads ahead only the
    // states that records use. Its timer is set already.
    restored.push(ev(by_group[0], 0));
    store.take_multi_gets(timers::TIMERS_STATE);

    let mut out = Vec::new();
    restored.advance_watermark(u64::MAX, &mut out).unwrap();
    fire_remaining(&mut restored, &mut out);
    let fired: Vec<(u64, u64, bool)> = output(out);
    assert_eq!(fired.len(), keys as usize);
    let reads = store.take_multi_gets(timers::TIMERS_STATE);
    // Each key once: the record's key was cached already.
    let lens: Vec<usize> = reads.iter().map(Vec::len).collect();
    assert_eq!(lens, [slice - 1, slice, slice]);
    let groups: Vec<u16> = reads.concat();
    assert!(groups.is_sorted(), "read in key-group order");
}

/// A watermark status change that comes behind a watermark whose timers
/// still fire goes on after their last turn, behind the watermark: a
/// subtask downstream never sees this input idle (or active) ahead of a
/// watermark it came behind. With no timers due it goes on at once.
#[test]
fn a_status_change_waits_behind_the_watermark_whose_timers_fire() {
    let keys = 2 * KeyedProcess::<u64, Ev, Out>::FIRED_PER_TURN as u64 + 1;
    let factory = windows::<Out>(
        WindowAssigner::tumbling(Duration::from_millis(10)),
        WindowConfig::default(),
        false,
    );
    let taken = |task: &mut ChainTask<Ev>| {
        let mut events = Vec::new();
        task.take_watermarks(&mut events);
        events
    };
    let dir = tempfile::tempdir().unwrap();
    for backend in backends(&dir, range(1, 0)) {
        let mut process = operator(backend, &factory, Arc::default());
        process.restore(&RestoreState::default()).unwrap();
        for key in 0..keys {
            process.push(ev(key, 1));
        }
        let mut out = Vec::new();
        process.flush(&mut out).unwrap();
        let mut task = ChainTask::input(vec![decoder(|e: Ev| e)], Vec::new(), Box::new(process));

        task.pass_status(WatermarkStatus::Idle);
        assert_eq!(
            taken(&mut task),
            [WatermarkEvent::Status(WatermarkStatus::Idle)]
        );

        task.advance_watermark(10, &mut out).unwrap();
        task.pass_status(WatermarkStatus::Active);
        let mut turns = 1;
        while task.timers_due() {
            assert_eq!(taken(&mut task), [], "turn {turns}");
            task.fire_due(&mut out).unwrap();
            turns += 1;
        }
        assert_eq!(turns, 3);
        assert_eq!(
            taken(&mut task),
            [
                WatermarkEvent::Watermark(10),
                WatermarkEvent::Status(WatermarkStatus::Active)
            ]
        );
        assert_eq!(output::<Out>(out).len() as u64, keys);
    }
}

fn windows<O>(
    assigner: WindowAssigner,
    settings: WindowConfig,
    late: bool,
) -> KeyedFunctionFactory<u64, Ev, O>
where
    O: Data + From<(u64, TimeWindow, u64)> + From<Ev>,
{
    Arc::new(move |states| {
        let late: Option<crate::job::window_operator::LateData<Ev, O>> = late
            .then(|| Arc::new(|e: Ev, out: &mut Collector<'_, O>| out.collect(O::from(e))) as _);
        Box::new(WindowOperator::open(
            states,
            assigner,
            settings,
            Arc::new(Count),
            Arc::new(
                |k: &u64, w: &TimeWindow, n: u64, out: &mut Collector<'_, O>| {
                    out.collect(O::from((*k, *w, n)))
                },
            ),
            late,
        ))
    })
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
enum Out {
    Fired(u64, i64, i64, u64),
    Late(u64, u64),
}

impl From<(u64, TimeWindow, u64)> for Out {
    fn from((k, w, n): (u64, TimeWindow, u64)) -> Self {
        Out::Fired(k, w.start, w.end, n)
    }
}

impl From<Ev> for Out {
    fn from(e: Ev) -> Self {
        Out::Late(e.key, e.ts)
    }
}

struct Driver {
    process: KeyedProcess<u64, Ev, Out>,
    metrics: Arc<TimeMetrics>,
}

impl Driver {
    fn new(backend: KeyedStateBackend<u64>, factory: &KeyedFunctionFactory<u64, Ev, Out>) -> Self {
        let metrics = Arc::new(TimeMetrics::default());
        let mut process = operator(backend, factory, metrics.clone());
        process.restore(&RestoreState::default()).unwrap();
        Driver { process, metrics }
    }

    fn records(&mut self, records: &[Ev]) -> Vec<Out> {
        for &r in records {
            self.process.push(r);
        }
        let mut out = Vec::new();
        self.process.flush(&mut out).unwrap();
        output(out)
    }

    fn watermark(&mut self, watermark: u64) -> Vec<Out> {
        let mut out = Vec::new();
        self.process.advance_watermark(watermark, &mut out).unwrap();
        fire_remaining(&mut self.process, &mut out);
        output(out)
    }

    fn processing_time(&mut self, now: u64) -> Vec<Out> {
        let mut out = Vec::new();
        self.process.advance_processing_time(now, &mut out).unwrap();
        output(out)
    }
}

#[test]
fn session_windows_merge_and_a_late_record_bridges_two_sessions_within_lateness() {
    let dir = tempfile::tempdir().unwrap();
    for backend in backends(&dir, range(1, 0)) {
        let settings = WindowConfig {
            allowed_lateness: 100,
            early_firing: None,
        };
        let factory = windows::<Out>(
            WindowAssigner::session(Duration::from_millis(10)),
            settings,
            true,
        );
        let mut d = Driver::new(backend, &factory);
        assert_eq!(d.records(&[ev(1, 0), ev(1, 5), ev(1, 20), ev(2, 3)]), []);
        let mut fired = d.watermark(35);
        fired.sort_by_key(|o| format!("{o:?}"));
        assert_eq!(
            fired,
            [
                Out::Fired(1, 0, 15, 2),
                Out::Fired(1, 20, 30, 1),
                Out::Fired(2, 3, 13, 1)
            ]
        );
        // Late but within the lateness: [10, 20) touches both sessions of
        // key 1, which merge into one that fires at once with every record.
        assert_eq!(d.records(&[ev(1, 10)]), [Out::Fired(1, 0, 30, 4)]);
        // Its timers moved to the merged session: nothing fires twice.
        assert_eq!(d.watermark(120), [], "cleanup of key 2's session only");
        assert_eq!(d.records(&[ev(1, 25)]), [Out::Fired(1, 0, 35, 5)]);
        assert_eq!(d.watermark(200), []);
        // Past the lateness: late data, to the late output.
        assert_eq!(d.records(&[ev(1, 50)]), [Out::Late(1, 50)]);
        assert_eq!(d.metrics.counters().late_records, 1);
    }
}

#[test]
fn tumbling_and_sliding_windows_fire_once_at_the_watermark_and_drop_late_records() {
    let dir = tempfile::tempdir().unwrap();
    for backend in backends(&dir, range(1, 0)) {
        let factory = windows::<Out>(
            WindowAssigner::sliding(Duration::from_millis(10), Duration::from_millis(5)),
            WindowConfig::default(),
            false,
        );
        let mut d = Driver::new(backend, &factory);
        d.records(&[ev(7, 3), ev(7, 6), ev(7, 12)]);
        assert_eq!(d.watermark(8), [Out::Fired(7, -5, 5, 1)]);
        let mut fired = d.watermark(20);
        fired.sort_by_key(|o| format!("{o:?}"));
        assert_eq!(
            fired,
            [
                Out::Fired(7, 0, 10, 2),
                Out::Fired(7, 10, 20, 1),
                Out::Fired(7, 5, 15, 2)
            ]
        );
        // Late: its windows are gone and it is dropped, not emitted.
        assert_eq!(d.records(&[ev(7, 14)]), []);
        assert_eq!(d.watermark(u64::MAX), []);
        assert_eq!(d.metrics.counters().late_records, 1);
    }
}

/// What the subtasks of p=2 restored from `states` on backend `kind` fire
/// when the watermark passes everything.
fn fire_restored(
    dir: &tempfile::TempDir,
    kind: usize,
    factory: &KeyedFunctionFactory<u64, Ev, Out>,
    states: &[RestoreState],
) -> Vec<Out> {
    let mut fired = Vec::new();
    for (i, state) in states.iter().enumerate() {
        let backend = backends(dir, range(2, i as u32)).remove(kind);
        let mut restored = operator(backend, factory, Arc::new(TimeMetrics::default()));
        restored.restore(state).unwrap();
        let mut out = Vec::new();
        restored.advance_watermark(u64::MAX, &mut out).unwrap();
        fire_remaining(&mut restored, &mut out);
        fired.extend(output::<Out>(out));
    }
    fired
}

/// Tumbling and sliding windows without lateness keep no keyed timers:
/// their timers are implied by the windows, named again from the restored
/// windows. Each window still fires exactly once across a snapshot, in the
/// subtask its key moved to.
#[test]
fn windows_with_implied_timers_fire_once_across_a_restore_at_another_parallelism() {
    let dir = tempfile::tempdir().unwrap();
    let factory = windows::<Out>(
        WindowAssigner::sliding(Duration::from_millis(10), Duration::from_millis(5)),
        WindowConfig::default(),
        false,
    );
    let records: Vec<Ev> = (0..100).map(|k| ev(k, k % 20)).collect();
    let mut expected: Vec<Out> = records
        .iter()
        .flat_map(|e| {
            let start = (e.ts - e.ts % 5) as i64;
            [start, start - 5].map(|s| Out::Fired(e.key, s, s + 10, 1))
        })
        .collect();
    expected.sort_by_key(|o| format!("{o:?}"));
    for kind in 0..3 {
        let mut d = Driver::new(backends(&dir, range(1, 0)).remove(kind), &factory);
        d.records(&records);
        let mut fired = d.watermark(9);
        let (states, timers) = restore_states(&mut d.process, 1, 2);
        assert_eq!(
            timers as usize,
            expected.len() - fired.len(),
            "one per open window"
        );
        fired.extend(fire_restored(&dir, kind, &factory, &states));
        fired.sort_by_key(|o| format!("{o:?}"));
        assert_eq!(fired, expected, "backend {kind}");
    }
}

/// What a driven run takes in, one at a time: a record, or a watermark.
#[derive(Clone, Copy, Debug)]
enum Input {
    Record(Ev),
    Watermark(u64),
}

/// Drives `steps` through a subtask of `before` on backend `kind`,
/// restoring its snapshot after `restore_at` steps into the two subtasks of
/// p=2 of `after`; what every subtask emits, sorted, once the watermark
/// passes all.
fn drive_across_a_restore(
    kind: usize,
    [before, after]: [&KeyedFunctionFactory<u64, Ev, Out>; 2],
    steps: &[Input],
    restore_at: usize,
) -> Vec<Out> {
    let dir = tempfile::tempdir().unwrap();
    let mut first = Driver::new(backends(&dir, range(1, 0)).remove(kind), before);
    let mut out = Vec::new();
    let apply = |d: &mut Driver, step: &Input, out: &mut Vec<Out>| match step {
        Input::Record(e) => out.extend(d.records(&[*e])),
        Input::Watermark(w) => out.extend(d.watermark(*w)),
    };
    for step in &steps[..restore_at] {
        apply(&mut first, step, &mut out);
    }
    let (states, _) = restore_states(&mut first.process, 1, 2);
    let mut subtasks: Vec<Driver> = states
        .iter()
        .enumerate()
        .map(|(i, state)| {
            let backend = backends(&dir, range(2, i as u32)).remove(kind);
            let metrics = Arc::new(TimeMetrics::default());
            let mut process = operator(backend, after, metrics.clone());
            process.restore(state).unwrap();
            Driver { process, metrics }
        })
        .collect();
    for step in steps[restore_at..]
        .iter()
        .chain([&Input::Watermark(u64::MAX)])
    {
        for (i, d) in subtasks.iter_mut().enumerate() {
            let owns = |e: &Ev| range(2, i as u32).contains(key_group_of(&e.key, MAX_P));
            if matches!(step, Input::Record(e) if !owns(e)) {
                continue;
            }
            apply(d, step, &mut out);
        }
    }
    out.sort_by_key(|o| format!("{o:?}"));
    out
}

/// Sliced windows fire what windows kept whole fire: windows of several
/// shapes (a slide that does not divide the size; windows shorter than
/// their slide), records out of order with some late for some of their
/// windows, and a restore at another parallelism half way. Each window
/// fires once with the records that came before the watermark passed it;
/// records late for all their windows go to the late output. An early
/// firing that never comes keeps the model's windows whole; a snapshot of
/// whole windows (as before slices) restores into slices, and one of
/// slices into whole windows.
#[test]
fn sliced_windows_fire_what_whole_windows_fire() {
    let shapes = [(10, 10), (10, 5), (1000, 400), (7, 3), (6, 4), (5, 10)];
    for (seed, (size, slide)) in shapes.into_iter().enumerate() {
        let assigner =
            WindowAssigner::sliding(Duration::from_millis(size), Duration::from_millis(slide));
        let sliced = windows::<Out>(assigner, WindowConfig::default(), true);
        let whole = WindowConfig {
            allowed_lateness: 0,
            early_firing: Some(u64::MAX / 2),
        };
        let whole = windows::<Out>(assigner, whole, true);
        let mut steps = Vec::new();
        let mut latest = 0;
        for i in 0..600u64 {
            let r = crate::model::rng::splitmix64(seed as u64 * 1000 + i);
            let ts = (i * size / 40).saturating_sub(r % (size + 2));
            latest = latest.max(ts);
            steps.push(Input::Record(ev(r % 13, ts)));
            if i % 7 == 0 {
                // Behind the latest by less than the disorder: some records
                // come after some of their windows fired.
                steps.push(Input::Watermark(latest.saturating_sub(size / 4)));
            }
        }
        for kind in 0..3 {
            let half = steps.len() / 2;
            let fired = drive_across_a_restore(kind, [&sliced; 2], &steps, half);
            let expected = drive_across_a_restore(kind, [&whole; 2], &steps, half);
            assert!(
                fired.iter().any(|o| matches!(o, Out::Late(..))),
                "no late record, {size}/{slide}"
            );
            let merged = |o: &Out| matches!(o, Out::Fired(.., n) if *n > 2);
            assert!(fired.iter().filter(|o| merged(o)).count() > 20, "{fired:?}");
            assert_eq!(
                fired, expected,
                "size {size}, slide {slide}, backend {kind}"
            );
            let upgraded = drive_across_a_restore(kind, [&whole, &sliced], &steps, half);
            assert_eq!(
                upgraded, expected,
                "whole to sliced, {size}/{slide}, {kind}"
            );
            let whole_again = drive_across_a_restore(kind, [&sliced, &whole], &steps, half);
            assert_eq!(
                whole_again, expected,
                "sliced to whole, {size}/{slide}, {kind}"
            );
        }
    }
}

/// A window that fired and waited for late records (allowed lateness),
/// restored where windows are sliced, goes with its cleanup timer: a later
/// snapshot does not fire it again.
#[test]
fn a_window_kept_for_late_records_restored_into_slices_fires_no_more() {
    let tumbling = |allowed_lateness| {
        let settings = WindowConfig {
            allowed_lateness,
            early_firing: None,
        };
        windows::<Out>(
            WindowAssigner::tumbling(Duration::from_millis(10)),
            settings,
            false,
        )
    };
    for kind in 0..3 {
        let mut dirs = vec![tempfile::tempdir().unwrap()];
        let mut d = Driver::new(backends(&dirs[0], range(1, 0)).remove(kind), &tumbling(100));
        d.records(&(0..20).map(|k| ev(k, 3)).collect::<Vec<_>>());
        assert_eq!(d.watermark(9).len(), 20);
        for round in 0..2 {
            let (states, _) = restore_states(&mut d.process, round + 1, 1);
            dirs.push(tempfile::tempdir().unwrap());
            let backend = backends(dirs.last().unwrap(), range(1, 0)).remove(kind);
            let metrics = Arc::new(TimeMetrics::default());
            let mut process = operator(backend, &tumbling(0), metrics.clone());
            process.restore(&states[0]).unwrap();
            d = Driver { process, metrics };
            assert_eq!(
                d.watermark(120 * (round + 1)),
                [],
                "backend {kind}, round {round}"
            );
        }
    }
}

/// A window at the end of time (its end clamped to the largest timestamp)
/// fires once, across a restore too, sliced as whole.
#[test]
fn windows_at_the_end_of_time_fire_once() {
    let last = i64::MAX as u64 - 3;
    let steps = [Input::Record(ev(1, last)), Input::Watermark(u64::MAX)];
    for late in [
        WindowConfig::default(),
        WindowConfig {
            allowed_lateness: 0,
            early_firing: Some(u64::MAX / 2),
        },
    ] {
        let factory = windows::<Out>(
            WindowAssigner::tumbling(Duration::from_millis(10)),
            late,
            false,
        );
        for kind in 0..3 {
            let fired = drive_across_a_restore(kind, [&factory; 2], &steps, steps.len());
            let start = (last - last % 10) as i64;
            assert_eq!(fired, [Out::Fired(1, start, i64::MAX, 1)], "backend {kind}");
        }
    }
}

/// Sessions without lateness imply their timers too: a session lengthened
/// or merged leaves its old timer, which fires to no effect, before and
/// after a restore.
#[test]
fn sessions_with_implied_timers_fire_once_however_they_merged() {
    let dir = tempfile::tempdir().unwrap();
    let factory = windows::<Out>(
        WindowAssigner::session(Duration::from_millis(10)),
        WindowConfig::default(),
        false,
    );
    for kind in 0..3 {
        let mut d = Driver::new(backends(&dir, range(1, 0)).remove(kind), &factory);
        for key in 0..50 {
            // [0, 15) lengthened to [0, 22); [30, 40) and [45, 55) merged
            // by 38 into [30, 55).
            d.records(&[ev(key, 0), ev(key, 5), ev(key, 12), ev(key, 30)]);
            d.records(&[ev(key, 45), ev(key, 38)]);
        }
        let mut fired = d.watermark(25);
        assert_eq!(fired.len(), 50, "{fired:?}");
        assert!(fired.iter().all(|o| matches!(o, Out::Fired(_, 0, 22, 3))));
        let (states, timers) = restore_states(&mut d.process, 1, 2);
        // [30, 55)'s two, one of which moves on when it fires: lengthening
        // a session sets no timer.
        assert_eq!(timers, 2 * 50);
        fired.extend(fire_restored(&dir, kind, &factory, &states));
        fired.sort_by_key(|o| format!("{o:?}"));
        let mut expected: Vec<Out> = (0..50)
            .flat_map(|k| [Out::Fired(k, 0, 22, 3), Out::Fired(k, 30, 55, 3)])
            .collect();
        expected.sort_by_key(|o| format!("{o:?}"));
        assert_eq!(fired, expected, "backend {kind}");
    }
}

/// A savepoint restored into a job with other allowed lateness fires each
/// window once: windows of a snapshot with implied timers get keyed ones,
/// and keyed timers of windows that fired and waited for late records
/// clean them up without firing them again.
#[test]
fn windows_fire_once_when_a_restore_changes_their_lateness() {
    let dir = tempfile::tempdir().unwrap();
    let tumbling = |allowed_lateness| {
        windows::<Out>(
            WindowAssigner::tumbling(Duration::from_millis(10)),
            WindowConfig {
                allowed_lateness,
                early_firing: None,
            },
            false,
        )
    };
    let records: Vec<Ev> = (0..50).flat_map(|k| [ev(k, 3), ev(k, 13)]).collect();
    for kind in 0..3 {
        for (before, after) in [(0, 100), (100, 0)] {
            let mut d = Driver::new(backends(&dir, range(1, 0)).remove(kind), &tumbling(before));
            d.records(&records);
            let mut fired = d.watermark(9);
            assert_eq!(fired.len(), 50);
            let (states, _) = restore_states(&mut d.process, 1, 2);
            fired.extend(fire_restored(&dir, kind, &tumbling(after), &states));
            fired.sort_by_key(|o| format!("{o:?}"));
            let mut expected: Vec<Out> = (0..50)
                .flat_map(|k| [Out::Fired(k, 0, 10, 1), Out::Fired(k, 10, 20, 1)])
                .collect();
            expected.sort_by_key(|o| format!("{o:?}"));
            assert_eq!(
                fired, expected,
                "backend {kind}, lateness {before} -> {after}"
            );
        }
    }
}

#[test]
fn early_firings_emit_open_windows_every_interval_of_processing_time() {
    let dir = tempfile::tempdir().unwrap();
    for backend in backends(&dir, range(1, 0)) {
        let settings = WindowConfig {
            allowed_lateness: 0,
            early_firing: Some(100),
        };
        let factory = windows::<Out>(
            WindowAssigner::tumbling(Duration::from_millis(1000)),
            settings,
            false,
        );
        let mut d = Driver::new(backend, &factory);
        d.processing_time(1_050);
        d.records(&[ev(1, 10), ev(1, 20)]);
        assert_eq!(d.processing_time(1_099), []);
        assert_eq!(d.processing_time(1_100), [Out::Fired(1, 0, 1000, 2)]);
        d.records(&[ev(1, 30)]);
        assert_eq!(d.processing_time(1_200), [Out::Fired(1, 0, 1000, 3)]);
        assert_eq!(d.watermark(999), [Out::Fired(1, 0, 1000, 3)]);
        assert_eq!(d.processing_time(1_300), [], "a fired window is gone");
    }
}

#[test]
fn processing_time_windows_follow_the_clock() {
    let dir = tempfile::tempdir().unwrap();
    for backend in backends(&dir, range(1, 0)) {
        let factory = windows::<Out>(
            WindowAssigner::tumbling(Duration::from_millis(100)).processing_time(),
            WindowConfig::default(),
            false,
        );
        let mut d = Driver::new(backend, &factory);
        d.processing_time(1_010);
        // The records' own timestamps do not matter.
        d.records(&[ev(4, 0), ev(4, 5_000)]);
        assert_eq!(d.processing_time(1_098), []);
        assert_eq!(d.processing_time(1_099), [Out::Fired(4, 1000, 1100, 2)]);
    }
}

fn source_task(
    items: &Arc<Vec<Ev>>,
    strategy: Option<WatermarkStrategy>,
) -> crate::dataflow::task::ChainTask<Ev> {
    use crate::dataflow::source::{Items, SourceContext};
    use crate::dataflow::task::ChainTask;
    let ctx = SourceContext {
        subtask: SubtaskIndex(0),
        parallelism: 1,
        start: None,
    };
    let source = Box::new(crate::dataflow::source::reader::Indexed(Box::new(
        Items::new(items.clone(), ctx),
    )));
    let writer = Box::new(RecordWriter::<Ev>::new(Route::Forward, 0, 1, 1 << 10));
    match strategy {
        Some(strategy) => {
            ChainTask::source_with_watermarks(source, strategy, Arc::default(), writer)
        }
        None => ChainTask::source(source, writer),
    }
}

#[test]
fn a_restored_source_sends_its_watermark_again_and_every_source_ends_with_the_final_one() {
    use crate::dataflow::task::Task;
    let items = Arc::new(vec![ev(1, 100), ev(2, 300), ev(3, 200), ev(4, 400)]);
    let strategy = WatermarkStrategy::bounded_out_of_orderness(Duration::from_millis(50));
    let mut task = source_task(&items, Some(strategy));
    let mut events = Vec::new();
    task.produce(3, 0, &mut Vec::new()).unwrap();
    task.take_watermarks(&mut events);
    assert_eq!(events, [WatermarkEvent::Watermark(249)]);
    let snapshot = task.snapshot(CheckpointId(1), &mut Vec::new()).unwrap();

    // The watermark may have been in flight at the snapshot: the restored
    // source sends it first, before anything it reads.
    let mut restored = source_task(&items, Some(strategy));
    restored
        .restore(&RestoreState {
            operator: snapshot.operator,
            ..RestoreState::default()
        })
        .unwrap();
    events.clear();
    restored.take_watermarks(&mut events);
    assert_eq!(events, [WatermarkEvent::Watermark(249)]);

    // A source without timestamps ends with the final watermark too.
    let mut plain = source_task(&items, None);
    assert_eq!(plain.watermark_interval(), None);
    let produced = plain.produce(10, 0, &mut Vec::new()).unwrap();
    assert_eq!(
        produced.status,
        crate::dataflow::source::SourceStatus::Finished
    );
    events.clear();
    plain.take_watermarks(&mut events);
    assert_eq!(events, [WatermarkEvent::Watermark(u64::MAX)]);
}
