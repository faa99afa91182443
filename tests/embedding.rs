//! The embedding API end to end: string keys, chained stateless steps, every
//! kind of edge, and keyed map and list state.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tidemark::dataflow::source::Items;
use tidemark::MapState;
use tidemark_actors::prelude::*;
use tidemark_actors::sinks::Collect;

fn text() -> Arc<Vec<String>> {
    Arc::new(
        (0..2_000)
            .map(|i| format!("w{} w{} w{} skip", i % 7, i % 13, i % 3))
            .collect(),
    )
}

fn expected() -> HashMap<String, u64> {
    let mut counts = HashMap::new();
    for line in text().iter() {
        for w in line.split_whitespace().filter(|w| *w != "skip") {
            *counts.entry(w.to_string()).or_insert(0) += 1;
        }
    }
    counts
}

/// Counts per word, and per word the number of times each line parity was
/// seen, in map state.
struct Stats {
    count: ValueState<u64>,
    by_len: MapState<usize, u64>,
}

impl KeyedProcessFunction<String, String, (String, u64)> for Stats {
    fn process(
        &mut self,
        word: String,
        ctx: &mut KeyedContext<'_, String>,
        _out: &mut Collector<'_, (String, u64)>,
    ) {
        *ctx.value(&self.count).get_or_default() += 1;
        *ctx.map(&self.by_len)
            .get_or_default()
            .entry(word.len())
            .or_default() += 1;
    }

    fn end_input(&mut self, states: AllKeys<'_, String>, out: &mut Collector<'_, (String, u64)>) {
        for (word, count) in states.values(&self.count) {
            out.collect((word, count));
        }
    }
}

fn run(parallelism: u32, shape: &str) -> HashMap<String, u64> {
    let results = Arc::new(Mutex::new(Vec::new()));
    let lines = text();
    let sink_results = results.clone();
    let words = Job::builder("words")
        .parallelism(parallelism)
        .source("lines", move |ctx| Items::new(lines.clone(), ctx))
        .flat_map(|line: String| {
            line.split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|w: &String| w != "skip");
    let words = match shape {
        "rebalanced" => words
            .rebalance()
            .map(|w: String| w)
            .parallelism(parallelism + 1),
        _ => words,
    };
    let job = words
        .key_by(|w: &String| w.clone())
        .process("stats", |states| Stats {
            count: states.value("count"),
            by_len: states.map("by-len"),
        })
        .sink("collect", move |_| Collect::new(sink_results.clone()))
        .build();
    job.run().unwrap().wait().unwrap();
    let collected = results.lock().unwrap().clone();
    let mut counts = HashMap::new();
    for (w, c) in collected {
        assert!(counts.insert(w.clone(), c).is_none(), "{w} emitted twice");
    }
    counts
}

#[test]
fn string_keys_through_chained_steps_and_a_rebalance() {
    for p in [1, 3] {
        assert_eq!(run(p, "direct"), expected(), "p={p}");
        assert_eq!(run(p, "rebalanced"), expected(), "p={p} with a rebalance");
    }
}

#[test]
fn broadcast_delivers_every_record_to_every_subtask() {
    let results = Arc::new(Mutex::new(Vec::new()));
    let sink_results = results.clone();
    let items = Arc::new((0..1_000u64).collect::<Vec<_>>());
    Job::builder("broadcast")
        .parallelism(2)
        .source("numbers", move |ctx| Items::new(items.clone(), ctx))
        .broadcast()
        .parallelism(3)
        .sink("collect", move |_| Collect::new(sink_results.clone()))
        .build()
        .run()
        .unwrap()
        .wait()
        .unwrap();
    let mut got = results.lock().unwrap().clone();
    got.sort_unstable();
    let want: Vec<u64> = (0..1_000u64).flat_map(|n| [n, n, n]).collect();
    assert_eq!(got, want);
}

/// Passes numbers through and echoes each rule it learns, with the rules
/// it knew before.
#[derive(Clone)]
struct Echo {
    rules: MapStateDescriptor<u64, String>,
}

impl BroadcastProcessFunction<u64, (u64, String), String> for Echo {
    fn process_element(&mut self, n: u64, _: &BroadcastStates, out: &mut Collector<'_, String>) {
        out.collect(n.to_string());
    }

    fn process_broadcast_element(
        &mut self,
        (id, rule): (u64, String),
        broadcast: &mut BroadcastStates,
        out: &mut Collector<'_, String>,
    ) {
        let rules = broadcast.get_mut(&self.rules);
        out.collect(format!("{rule} after {}", rules.len()));
        rules.insert(id, rule);
    }
}

#[test]
fn a_broadcast_stream_reaches_every_subtask_in_the_same_order() {
    let results = Arc::new(Mutex::new(Vec::new()));
    let sink_results = results.clone();
    let numbers = Arc::new((0..1_000u64).collect::<Vec<_>>());
    let rules = Arc::new(
        (0..50u64)
            .map(|i| (i, format!("rule {i}")))
            .collect::<Vec<_>>(),
    );
    let job = Job::builder("echo").parallelism(3);
    let rules = job
        .source("rules", move |ctx| Items::new(rules.clone(), ctx))
        .parallelism(1);
    let descriptor = MapStateDescriptor::new("rules");
    job.source("numbers", move |ctx| Items::new(numbers.clone(), ctx))
        .connect(rules.broadcast_with(&descriptor))
        .process("echo", Echo { rules: descriptor })
        .sink("collect", move |_| Collect::new(sink_results.clone()))
        .build()
        .run()
        .unwrap()
        .wait()
        .unwrap();
    let mut got = results.lock().unwrap().clone();
    got.sort_unstable();
    let mut want: Vec<String> = (0..1_000u64).map(|n| n.to_string()).collect();
    // Each of the 3 subtasks learns rule i after rules 0..i.
    want.extend((0..50).flat_map(|i| vec![format!("rule {i} after {i}"); 3]));
    want.sort_unstable();
    assert_eq!(got, want);
}
