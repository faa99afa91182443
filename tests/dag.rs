//! A DAG job through the embedding API, exactly once under seeded kills:
//!
//! ```text
//! evens ─┐                        ┌─ main (key, count) ─▶ groups (keyed by key % GROUPS) ─┬─▶ updates (files)
//!        ├─ union ─▶ count (keyed) ┤                                                       └─▶ finals  (files)
//! odds ──┘                        └─ side output "sevens" ─┐
//! marks ─────────────────────────────────────────────────── connect (not keyed) ─▶ side (files)
//! ```
//!
//! Two sources of the even and the odd record indices meet in a union that
//! gives each record its key; a keyed count emits (key, count after the
//! record) for every record and sends every 7th record to a side output; a
//! second keyed stage, keyed by another function of the key, numbers what
//! reaches each group and sums the counts, with two file sinks chained to
//! it; the side output is connected with a third source into a two-input
//! function that is not keyed, at another parallelism. Every output is
//! checked line for line against what this file computes from the input's
//! definition.

use tidemark_testkit as common;

use common::splitmix64;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tidemark::checkpoint::CheckpointConfig;
use tidemark::cluster::fault::KillSchedule;
use tidemark::connectors::files::sink::{Encoder, FileSink, FileSinkConfig};
use tidemark::dataflow::operator::OutputTag;
use tidemark::dataflow::two_input::CoProcessFunction;
use tidemark::JobBuilder;
use tidemark_actors::prelude::*;
use tidemark_cli::sinks::run_name;
use tidemark_cli::topologies::wordcount::{Generator, Records};

/// Numbered records over both halves.
const RECORDS: u64 = 40_000;
/// Records of the third source.
const MARKS: u64 = 20_000;
const KEYS: u64 = 60;
/// Stage 2's keys: a record's key modulo this.
const GROUPS: u64 = 7;
/// Every record whose index is a multiple of this goes to the side output.
const SEVENTH: u64 = 7;

/// Record `index`'s key.
fn key_of(seed: u64, index: u64) -> u64 {
    splitmix64(seed.wrapping_add(index)) % KEYS
}

/// A numbered record, keyed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Rec {
    index: u64,
    key: u64,
}

/// The even (`parity` 0) or odd (1) indices of `0..RECORDS`: record i of
/// this source is index 2i + parity.
#[derive(Clone, Copy)]
struct Half {
    parity: u64,
}

impl Records for Half {
    type Record = u64;
    fn record(&self, i: u64) -> u64 {
        2 * i + self.parity
    }
}

/// The third source: record i is i.
#[derive(Clone, Copy)]
struct Marks;

impl Records for Marks {
    type Record = u64;
    fn record(&self, i: u64) -> u64 {
        i
    }
}

/// Stage 1: counts records per key, emits (key, count) for each, and sends
/// every 7th record to the side output.
struct Count {
    count: ValueState<u64>,
    sevens: OutputTag<Rec>,
}

impl KeyedProcessFunction<u64, Rec, (u64, u64)> for Count {
    fn process(
        &mut self,
        rec: Rec,
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, (u64, u64)>,
    ) {
        let mut entry = ctx.value(&self.count);
        let count = entry.get_or_default();
        *count += 1;
        out.collect((rec.key, *count));
        if rec.index.is_multiple_of(SEVENTH) {
            out.output(&self.sevens, rec);
        }
    }
}

/// What stage 2 emits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
enum Grouped {
    /// The group's n-th (key, count) arrived: `group,n`.
    Update { group: u64, n: u64 },
    /// At the end of input: `group,records,sum of the counts`.
    Final { group: u64, records: u64, sum: u64 },
}

/// Writes this test's records as lines of comma-separated fields.
struct Lines;

impl Encoder<Grouped> for Lines {
    fn encode(&mut self, record: &Grouped, out: &mut Vec<u8>) -> Result<(), UserError> {
        match record {
            Grouped::Update { group, n } => writeln!(out, "{group},{n}")?,
            Grouped::Final {
                group,
                records,
                sum,
            } => writeln!(out, "{group},{records},{sum}")?,
        }
        Ok(())
    }
}

/// Stage 2, keyed by group: numbers the (key, count) pairs of each group
/// as they arrive, whatever their order, and sums their counts.
struct Group {
    seen: ValueState<(u64, u64)>,
}

impl KeyedProcessFunction<u64, (u64, u64), Grouped> for Group {
    fn process(
        &mut self,
        (key, count): (u64, u64),
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, Grouped>,
    ) {
        let mut entry = ctx.value(&self.seen);
        let (n, sum) = entry.get_or_default();
        *n += 1;
        *sum += count;
        out.collect(Grouped::Update {
            group: key % GROUPS,
            n: *n,
        });
    }

    fn end_input(&mut self, states: AllKeys<'_, u64>, out: &mut Collector<'_, Grouped>) {
        for (group, (records, sum)) in states.values(&self.seen) {
            out.collect(Grouped::Final {
                group,
                records,
                sum,
            });
        }
    }
}

/// What the two-input function writes: `s,index,key` for a side-output
/// record, `m,i` for a mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Side {
    Seventh(Rec),
    Mark(u64),
}

impl Encoder<Side> for Lines {
    fn encode(&mut self, record: &Side, out: &mut Vec<u8>) -> Result<(), UserError> {
        match record {
            Side::Seventh(rec) => writeln!(out, "s,{},{}", rec.index, rec.key)?,
            Side::Mark(i) => writeln!(out, "m,{i}")?,
        }
        Ok(())
    }
}

/// The two-input function that is not keyed: each input's records, tagged.
#[derive(Clone)]
struct Tag;

impl CoProcessFunction<Rec, u64, Side> for Tag {
    fn process_left(&mut self, rec: Rec, out: &mut Collector<'_, Side>) {
        out.collect(Side::Seventh(rec))
    }

    fn process_right(&mut self, mark: u64, out: &mut Collector<'_, Side>) {
        out.collect(Side::Mark(mark))
    }
}

/// The three output directories.
struct Outputs {
    updates: tempfile::TempDir,
    finals: tempfile::TempDir,
    side: tempfile::TempDir,
}

impl Outputs {
    fn new() -> Self {
        Outputs {
            updates: tempfile::tempdir().unwrap(),
            finals: tempfile::tempdir().unwrap(),
            side: tempfile::tempdir().unwrap(),
        }
    }

    fn dirs(&self) -> [(&str, &Path); 3] {
        [
            ("updates", self.updates.path()),
            ("finals", self.finals.path()),
            ("side", self.side.path()),
        ]
    }
}

/// A file sink of each subtask into `dir`, in one run.
fn files<T: Send + 'static>(dir: &Path) -> impl Fn(SinkContext) -> FileSink<T> + Send + Sync
where
    Lines: Encoder<T>,
{
    let config = FileSinkConfig::from_url(dir.to_str().unwrap()).unwrap();
    let run = run_name();
    move |ctx| FileSink::with_encoder(&config, &run, ctx, Arc::new(|| Box::new(Lines)))
}

/// The job at `parallelism` (the two-input operator at one more), over the
/// records of `seed`.
fn job(seed: u64, parallelism: u32, outputs: &Outputs) -> JobBuilder {
    let job = Job::builder("dag").parallelism(parallelism);
    let half = |parity| {
        job.split_source(
            &format!("half-{parity}"),
            Generator::of(RECORDS / 2, Half { parity }),
        )
        .uid(&format!("half-{parity}"))
    };
    let (evens, odds) = (half(0), half(1));
    let sevens = OutputTag::<Rec>::new("sevens");
    let tag = sevens.clone();
    let counted = evens
        .union([odds])
        .map(move |index: u64| Rec {
            index,
            key: key_of(seed, index),
        })
        .uid("union")
        .key_by(|rec: &Rec| rec.key)
        .process("count", move |states| Count {
            count: states.value("count"),
            sevens: tag.clone(),
        })
        .uid("count");
    let side = counted.side_output(&sevens);
    let grouped = counted
        .key_by(|&(key, _): &(u64, u64)| key % GROUPS)
        .process("groups", |states| Group {
            seen: states.value("seen"),
        })
        .uid("groups");
    grouped
        .clone()
        .filter(|g: &Grouped| matches!(g, Grouped::Update { .. }))
        .sink("updates", files(outputs.updates.path()));
    grouped
        .filter(|g: &Grouped| matches!(g, Grouped::Final { .. }))
        .sink("finals", files(outputs.finals.path()));
    let marks = job
        .split_source("marks", Generator::of(MARKS, Marks))
        .uid("marks");
    side.connect(marks)
        .process("tag", Tag)
        .uid("tag")
        .parallelism(parallelism + 1)
        .sink("side", files(outputs.side.path()))
}

/// The committed lines of `dir`, sorted.
fn committed(dir: &Path) -> Vec<String> {
    let mut lines: Vec<String> = common::committed_lines(dir)
        .into_iter()
        .map(|(_, line)| line)
        .collect();
    lines.sort_unstable();
    lines
}

/// The lines each output must hold exactly, sorted, by output.
fn expected(seed: u64) -> BTreeMap<&'static str, Vec<String>> {
    let mut per_key: HashMap<u64, u64> = HashMap::new();
    for index in 0..RECORDS {
        *per_key.entry(key_of(seed, index)).or_default() += 1;
    }
    // Per group: records, and the sum of the counts 1..=n of each key.
    let mut per_group: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for (&key, &n) in &per_key {
        let (records, sum) = per_group.entry(key % GROUPS).or_default();
        *records += n;
        *sum += n * (n + 1) / 2;
    }
    assert_eq!(
        per_key.len() as u64,
        KEYS,
        "seed {seed}: a key has no record"
    );
    assert_eq!(per_group.len() as u64, GROUPS, "seed {seed}");
    let updates: Vec<String> = per_group
        .iter()
        .flat_map(|(&group, &(records, _))| (1..=records).map(move |n| format!("{group},{n}")))
        .collect();
    let finals: Vec<String> = per_group
        .iter()
        .map(|(group, (records, sum))| format!("{group},{records},{sum}"))
        .collect();
    let side: Vec<String> = (0..RECORDS)
        .filter(|i| i % SEVENTH == 0)
        .map(|i| format!("s,{i},{}", key_of(seed, i)))
        .chain((0..MARKS).map(|i| format!("m,{i}")))
        .collect();
    let mut out = BTreeMap::from([("updates", updates), ("finals", finals), ("side", side)]);
    for lines in out.values_mut() {
        lines.sort_unstable();
    }
    out
}

/// Each output holds exactly its expected lines, and nothing uncommitted.
fn assert_outputs_exact(outputs: &Outputs, seed: u64, context: &str) {
    let expected = expected(seed);
    for (name, dir) in outputs.dirs() {
        let (want, got) = (&expected[name], committed(dir));
        if *want != got {
            fn count(lines: &[String]) -> HashMap<&str, usize> {
                let mut counts = HashMap::new();
                for line in lines {
                    *counts.entry(line.as_str()).or_default() += 1;
                }
                counts
            }
            let (w, g) = (count(want), count(&got));
            let missing: Vec<_> = w.keys().filter(|l| !g.contains_key(*l)).take(8).collect();
            let extra: Vec<_> = g
                .iter()
                .filter(|(l, n)| w.get(*l).is_none_or(|m| *n > m))
                .take(8)
                .collect();
            panic!(
                "{context}: {name}: {} lines expected, {} committed; missing e.g. {missing:?}; \
                 unexpected or repeated e.g. {extra:?}",
                want.len(),
                got.len()
            );
        }
        common::assert_no_uncommitted_files(dir, &format!("{context}: {name}"));
    }
}

#[test]
fn the_dag_without_failures_is_exact_at_p1_and_p3() {
    for parallelism in [1, 3] {
        let outputs = Outputs::new();
        let report = job(1, parallelism, &outputs)
            .build()
            .run()
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(report.records_in, RECORDS + MARKS, "p={parallelism}");
        assert_outputs_exact(&outputs, 1, &format!("p={parallelism}"));
    }
}

/// Seed `seed` at p=2 with three seeded kills: unaligned checkpoints in odd
/// seeds, RocksDB with incremental checkpoints in every third. Returns the
/// restarts and whether the last restore read state.
fn killed(seed: u64) -> (u64, bool) {
    let (outputs, checkpoints, state) = (
        Outputs::new(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let mut settings = CheckpointConfig::new(checkpoints.path().to_str().unwrap())
        .interval(Duration::from_millis(50));
    if seed % 2 == 1 {
        settings = settings.unaligned();
    }
    let mut builder = job(seed, 2, &outputs)
        .checkpointing(settings.clone())
        // Half a second per source without the kills (each source's
        // subtasks share the rate).
        .source_rate(RECORDS as f64);
    if seed.is_multiple_of(3) {
        builder = builder
            .state_backend(tidemark::rocksdb::RocksDb::backend(
                Some(state.path().to_owned()),
                None,
            ))
            .checkpointing(settings.incremental(true));
    }
    let mut job = builder.build();
    let subtasks: u32 = job.graph.operators.iter().map(|op| op.parallelism).sum();
    job.config.kills = Some(KillSchedule::new(
        seed,
        3,
        RECORDS + MARKS,
        subtasks as usize,
    ));
    let context = format!("seed {seed}: {:?}", job.config.checkpointing);
    let handle = job.run().unwrap();
    let metrics = handle.metrics().clone();
    let report = handle.wait().unwrap_or_else(|e| panic!("{context}: {e}"));
    let restarts = metrics.checkpoints.restarts.load(Ordering::Relaxed);
    assert!(restarts >= 1, "{context}: no failure was injected");
    assert!(report.records_in >= RECORDS + MARKS, "{context}");
    assert_outputs_exact(&outputs, seed, &context);
    let restored = metrics
        .checkpoints
        .restored_bytes_last
        .load(Ordering::Relaxed)
        > 0;
    (restarts, restored)
}

#[test]
fn the_dag_under_kills_is_exactly_once_over_six_seeds() {
    let runs: Vec<(u64, bool)> = (0..6).map(killed).collect();
    assert!(
        runs.iter().any(|&(_, restored)| restored),
        "no kill came after a completed checkpoint: {runs:?}"
    );
}
