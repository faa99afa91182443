//! Event time through the embedding API: allowed lateness and the late-data
//! output behave as Flink's, with a source that sends a watermark after
//! every record (one record per batch), so that what is late is decided by
//! the input alone; a keyed process function's event-time timers fire
//! once each, at the final watermark for those still pending; and an
//! aligned checkpoint does not wait for the timers a watermark made due.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tidemark::checkpoint::{CheckpointConfig, CheckpointPolicy};
use tidemark::dataflow::source::Items;
use tidemark::model::event::CheckpointKind;
use tidemark::model::ids::CheckpointId;
use tidemark::time::{Count, TimeWindow, Timestamped, WatermarkStrategy, WindowAssigner};
use tidemark::BatchLimits;
use tidemark_actors::prelude::*;
use tidemark_actors::sinks::Collect;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Ev {
    key: String,
    ts: u64,
}

impl Timestamped for Ev {
    fn timestamp(&self) -> u64 {
        self.ts
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Out {
    Window(String, i64, i64, u64),
    Late(String, u64),
}

fn events(ts: &[u64]) -> Arc<Vec<Ev>> {
    Arc::new(
        ts.iter()
            .map(|&ts| Ev {
                key: "a".into(),
                ts,
            })
            .collect(),
    )
}

fn one_record_per_batch() -> BatchLimits {
    BatchLimits {
        max_records: 1,
        ..BatchLimits::default()
    }
}

#[test]
fn allowed_lateness_refires_a_window_and_later_records_go_to_the_late_output() {
    // Watermark = largest timestamp - 1 after each record.
    let input = events(&[1, 4, 12, 8, 20, 9, 25, 27]);
    let results = Arc::new(Mutex::new(Vec::new()));
    let collected = results.clone();
    Job::builder("lateness")
        .parallelism(1)
        .batch_limits(one_record_per_batch())
        .source_with_watermarks(
            "events",
            WatermarkStrategy::bounded_out_of_orderness(Duration::ZERO),
            move |ctx| Items::new(input.clone(), ctx),
        )
        .key_by(|e: &Ev| e.key.clone())
        .window(WindowAssigner::tumbling(Duration::from_millis(10)))
        .allowed_lateness(Duration::from_millis(5))
        .aggregate_with_late_data(
            "count",
            Count,
            |key: &String, w: &TimeWindow, n: u64, out| {
                out.collect(Out::Window(key.clone(), w.start, w.end, n))
            },
            |e: Ev, out| out.collect(Out::Late(e.key, e.ts)),
        )
        .sink("collect", move |_| Collect::new(collected.clone()))
        .build()
        .run()
        .unwrap()
        .wait()
        .unwrap();
    let a = || "a".to_string();
    assert_eq!(
        *results.lock().unwrap(),
        [
            // Watermark 11 passes [0, 10).
            Out::Window(a(), 0, 10, 2),
            // 8 is late but within 5 ms of lateness: the window fires again.
            Out::Window(a(), 0, 10, 3),
            // Watermark 19 passes [10, 20) and cleans [0, 10) up (at 14).
            Out::Window(a(), 10, 20, 1),
            // 9 + 5 <= 19: too late for its window, to the late output.
            Out::Late(a(), 9),
            // The final watermark fires the last window: 20, 25 and 27.
            Out::Window(a(), 20, 30, 3),
        ]
    );
}

/// Sets a timer 10 ms after the first record of its key (none is set);
/// emits (key, timer, records seen) when it fires and forgets the key.
struct Timeout {
    pending: ValueState<(u64, u64)>,
}

impl KeyedProcessFunction<String, Ev, (String, u64, u64)> for Timeout {
    fn process(
        &mut self,
        e: Ev,
        ctx: &mut KeyedContext<'_, String>,
        _out: &mut Collector<'_, (String, u64, u64)>,
    ) {
        let old = ctx.value(&self.pending).get().copied();
        let (at, seen) = old.unwrap_or((e.ts + 10, 0));
        if old.is_none() {
            ctx.register_event_time_timer(at);
            // Set twice: still one timer.
            ctx.register_event_time_timer(at);
        }
        ctx.value(&self.pending).set((at, seen + 1));
    }

    fn on_timer(
        &mut self,
        ts: u64,
        ctx: &mut KeyedContext<'_, String>,
        out: &mut Collector<'_, (String, u64, u64)>,
    ) {
        assert_eq!(
            ctx.timer_domain(),
            Some(tidemark::time::TimeDomain::EventTime)
        );
        assert!(ctx.current_watermark() >= Some(ts));
        let (_, seen) = ctx.value(&self.pending).clear().expect("a pending key");
        out.collect((ctx.key().clone(), ts, seen));
    }
}

#[test]
fn event_time_timers_fire_once_at_their_watermark_and_the_rest_at_the_end() {
    let input = Arc::new(
        [
            ("a", 0),
            ("b", 3),
            ("a", 5),
            ("a", 20),
            ("c", 21),
            ("b", 40),
        ]
        .iter()
        .map(|&(key, ts)| Ev {
            key: key.into(),
            ts,
        })
        .collect::<Vec<_>>(),
    );
    let results = Arc::new(Mutex::new(Vec::new()));
    let collected = results.clone();
    Job::builder("timeouts")
        .parallelism(1)
        .batch_limits(one_record_per_batch())
        .source_with_watermarks("events", WatermarkStrategy::monotonous(), move |ctx| {
            Items::new(input.clone(), ctx)
        })
        .key_by(|e: &Ev| e.key.clone())
        .process("timeout", |states| Timeout {
            pending: states.value("pending"),
        })
        .sink("collect", move |_| Collect::new(collected.clone()))
        .build()
        .run()
        .unwrap()
        .wait()
        .unwrap();
    let s = |k: &str| k.to_string();
    assert_eq!(
        *results.lock().unwrap(),
        [
            // a@20 arrives before the watermark it raises (19): seen by a@10.
            (s("a"), 10, 3),
            (s("b"), 13, 1),
            (s("c"), 31, 1),
            // Pending at the end: the final watermark fires it.
            (s("b"), 50, 1),
        ]
    );
}

/// Emits `first` once, then nothing (but is not finished) until `until`
/// holds, then finishes; fails the job after 60 s.
struct HoldOpen {
    first: Option<Vec<Ev>>,
    until: Arc<dyn Fn() -> bool + Send + Sync>,
    started: Instant,
}

impl Source<Ev> for HoldOpen {
    fn read(&mut self, out: &mut Vec<Ev>, _max: usize) -> Result<SourceStatus, UserError> {
        if let Some(first) = self.first.take() {
            out.extend(first);
        }
        if self.started.elapsed() > Duration::from_secs(60) {
            return Err("nothing happened downstream within 60 s".into());
        }
        Ok(if (self.until)() {
            SourceStatus::Finished
        } else {
            SourceStatus::Running
        })
    }

    fn position(&self) -> tidemark::model::split::SplitPosition {
        tidemark::model::split::SplitPosition::start(0)
    }
}

#[test]
fn processing_time_windows_fire_on_the_clock_while_no_input_comes() {
    let results = Arc::new(Mutex::new(Vec::new()));
    let (collected, seen) = (results.clone(), results.clone());
    let until: Arc<dyn Fn() -> bool + Send + Sync> =
        Arc::new(move || !seen.lock().unwrap().is_empty());
    Job::builder("clock")
        .parallelism(1)
        .source("events", move |_| HoldOpen {
            first: Some(vec![
                Ev {
                    key: "a".into(),
                    ts: 0,
                },
                Ev {
                    key: "a".into(),
                    ts: 0,
                },
            ]),
            until: until.clone(),
            started: Instant::now(),
        })
        .key_by(|e: &Ev| e.key.clone())
        .window(WindowAssigner::tumbling(Duration::from_millis(20)).processing_time())
        .aggregate(
            "count",
            Count,
            |key: &String, _: &TimeWindow, n: u64, out| out.collect((key.clone(), n)),
        )
        .sink("collect", move |_| Collect::new(collected.clone()))
        .build()
        .run()
        .unwrap()
        .wait()
        .unwrap();
    // Without a wake-up at the window's end it would never fire: no record
    // follows, and the end of input fires no processing-time timer.
    assert_eq!(*results.lock().unwrap(), [("a".to_string(), 2)]);
}

/// Sets a timer 10 ms after each record; when one fires, sets it again at
/// the same time (due at once, so it fires again, a turn of timers at a
/// time) until `done` holds or 30 s have passed, and then emits (key, timer,
/// times fired, whether `done` ended it). The first firing sends on
/// `firing`.
struct Refire {
    fired: u64,
    firing: Mutex<std::sync::mpsc::Sender<()>>,
    done: Arc<AtomicBool>,
    since: Option<Instant>,
}

impl KeyedProcessFunction<String, Ev, (String, u64, u64, bool)> for Refire {
    fn process(
        &mut self,
        e: Ev,
        ctx: &mut KeyedContext<'_, String>,
        _out: &mut Collector<'_, (String, u64, u64, bool)>,
    ) {
        ctx.register_event_time_timer(e.ts + 10);
    }

    fn on_timer(
        &mut self,
        ts: u64,
        ctx: &mut KeyedContext<'_, String>,
        out: &mut Collector<'_, (String, u64, u64, bool)>,
    ) {
        self.fired += 1;
        let since = *self.since.get_or_insert_with(|| {
            let _ = self.firing.lock().unwrap().send(());
            Instant::now()
        });
        let done = self.done.load(Ordering::SeqCst);
        if !done && since.elapsed() < Duration::from_secs(30) {
            return ctx.register_event_time_timer(ts);
        }
        out.collect((ctx.key().clone(), ts, std::mem::take(&mut self.fired), done));
        self.since = None;
    }
}

/// An aligned checkpoint whose barrier comes while the watermark before it
/// keeps timers due completes between two turns of them: it does not wait
/// for the last to fire (here, they fire until it completes).
#[test]
fn an_aligned_checkpoint_completes_while_timers_are_due() {
    let dir = tempfile::tempdir().unwrap();
    let results = Arc::new(Mutex::new(Vec::new()));
    let collected = results.clone();
    let done = Arc::new(AtomicBool::new(false));
    let (firing, fired) = std::sync::mpsc::channel();
    let (until, ended) = (done.clone(), done.clone());
    let handle = Job::builder("refire")
        .parallelism(1)
        .checkpointing(CheckpointConfig {
            policy: CheckpointPolicy {
                interval: None,
                ..CheckpointPolicy::default()
            },
            ..CheckpointConfig::new(dir.path().to_str().unwrap())
        })
        .source_with_watermarks("events", WatermarkStrategy::monotonous(), move |_| {
            HoldOpen {
                first: Some(Arc::unwrap_or_clone(events(&[0, 100]))),
                until: Arc::new({
                    let until = until.clone();
                    move || until.load(Ordering::SeqCst)
                }),
                started: Instant::now(),
            }
        })
        .key_by(|e: &Ev| e.key.clone())
        .process("refire", move |_| Refire {
            fired: 0,
            firing: Mutex::new(firing.clone()),
            done: ended.clone(),
            since: None,
        })
        .sink("collect", move |_| Collect::new(collected.clone()))
        .build()
        .run()
        .unwrap();
    fired
        .recv_timeout(Duration::from_secs(30))
        .expect("the timer fires");
    let checkpoint = handle.trigger_checkpoint(CheckpointKind::Checkpoint);
    done.store(true, Ordering::SeqCst);
    assert_eq!(checkpoint, Ok(CheckpointId(1)));
    handle.wait().unwrap();
    let results = results.lock().unwrap();
    let [(key, 10, times, true), (_, 110, 1, true)] = results.as_slice() else {
        panic!("the checkpoint completed only once the timer stopped firing: {results:?}");
    };
    assert_eq!(key, "a");
    assert!(*times > 1, "fired {times} times");
}
