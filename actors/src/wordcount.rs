//! The wordcount topology: a deterministic generator of keyed records, a
//! keyed count, and a sink of `(key, count)`.

use crate::sinks::{sink_into, Target};
use std::marker::PhantomData;
use tidemark_connectors::files::{FileSource, Format};
#[cfg(feature = "kafka")]
use tidemark_connectors::kafka::{KafkaSource, ValueFormat};
use tidemark_connectors::rows::Row;
use tidemark_core::job::JobConfig;
use tidemark_core::rng::splitmix64;
use tidemark_core::split::{Split, SplitPosition};
use tidemark_core::{
    AllKeys, Collector, Job, Key, KeyedContext, KeyedProcessFunction, ReduceFunction,
    ReducingState, Source, SourceContext, SourceStatus, StateRegistrar, Stream, UserError,
};

/// Record i of a generated input, a pure function of i: replaying an index
/// replays its record.
pub trait Records: Send + 'static {
    /// What a record is.
    type Record;
    /// Record `i`.
    fn record(&self, i: u64) -> Self::Record;
}

/// Wordcount's records: record i is the key `splitmix64(seed + i) % keys`.
#[derive(Clone, Copy, Debug)]
pub struct Keys {
    /// Distinct keys; not 0.
    pub keys: u64,
    /// Seed of the keys.
    pub seed: u64,
}

impl Records for Keys {
    type Record = u64;
    fn record(&self, i: u64) -> u64 {
        splitmix64(self.seed.wrapping_add(i)) % self.keys
    }
}

/// Emits records 0..N as its split assigns them (source subtask j of P:
/// i mod P == j, in increasing i, on a fresh start).
pub struct Generator<R = Keys> {
    records: u64,
    make: R,
    split: Split,
}

impl Generator {
    /// Source subtask `ctx` of wordcount's records `0..records`, with keys
    /// in `0..keys` (`keys` must not be 0), starting where `ctx` says: at
    /// the beginning, or at a restored position.
    pub fn new(records: u64, keys: u64, seed: u64, ctx: SourceContext) -> Self {
        Generator::of(records, Keys { keys, seed }, ctx)
    }
}

impl<R: Records> Generator<R> {
    /// Source subtask `ctx` of records `0..records` made by `make`.
    pub fn of(records: u64, make: R, ctx: SourceContext) -> Self {
        Generator {
            records,
            make,
            split: ctx.split(),
        }
    }
}

impl<R: Records> Source<R::Record> for Generator<R> {
    fn read(&mut self, out: &mut Vec<R::Record>, max: usize) -> Result<SourceStatus, UserError> {
        for _ in 0..max {
            let i = self.split.peek();
            if i >= self.records {
                return Ok(SourceStatus::Finished);
            }
            out.push(self.make.record(i));
            self.split.advance();
        }
        Ok(if self.split.peek() >= self.records {
            SourceStatus::Finished
        } else {
            SourceStatus::Running
        })
    }

    fn position(&self) -> SplitPosition {
        self.split.position().clone()
    }
}

/// What [`Counter`] emits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Emit {
    /// One (key, count after this record) per record.
    Updates,
    /// One (key, final count) per key at the end of input.
    Final,
}

/// Counts records per key in keyed reducing state named `count`: adding
/// needs no read, so with `Emit::Final` a RocksDB backend only writes.
pub struct Counter<K = u64> {
    count: ReducingState<u64, Sum>,
    emit: Emit,
    keys: PhantomData<fn(K)>,
}

/// Counts add up.
#[derive(Clone, Copy)]
pub struct Sum;

impl ReduceFunction<u64> for Sum {
    #[inline]
    fn reduce(&self, count: &mut u64, n: u64) {
        *count += n;
    }
}

impl<K: Key> Counter<K> {
    /// Registers the `count` state; for the `process` factory of a keyed
    /// stream.
    pub fn open(states: &mut StateRegistrar<'_, K>, emit: Emit) -> Self {
        Counter {
            count: states.reducing("count", Sum),
            emit,
            keys: PhantomData,
        }
    }
}

impl<K: Key> KeyedProcessFunction<K, K, (K, u64)> for Counter<K> {
    fn process(
        &mut self,
        key: K,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Collector<'_, (K, u64)>,
    ) {
        let mut count = ctx.reducing(&self.count);
        count.add(1);
        if self.emit == Emit::Updates {
            out.collect((key, *count.get().expect("added above")));
        }
    }

    fn end_of_input(&mut self, states: AllKeys<'_, K>, out: &mut Collector<'_, (K, u64)>) {
        if self.emit == Emit::Final {
            for (key, count) in states.values(&self.count) {
                out.collect((key, count));
            }
        }
    }
}

/// The wordcount job's name, from which its id and checkpoint directory
/// follow: runs of it find each other's checkpoints.
pub const JOB_NAME: &str = "wordcount";

/// Where a topology's records come from (`--source`).
#[derive(Clone)]
pub enum Input {
    /// The topology's deterministic generator (`gen`).
    Generator,
    /// Files, read as each topology reads them.
    Files(FileSource<String>),
    /// A Kafka topic, whose values each topology reads as it reads files.
    #[cfg(feature = "kafka")]
    Kafka(KafkaSource<String>),
}

impl Input {
    /// `gen`, a Kafka topic (see `KafkaSource::from_url`) or the URL of a
    /// file source (see `FileSource::from_url`).
    pub fn from_url(url: &str) -> Result<Self, String> {
        if url == "gen" {
            return Ok(Input::Generator);
        }
        if url.starts_with("kafka://") {
            #[cfg(feature = "kafka")]
            return KafkaSource::from_url(url)
                .map(Input::Kafka)
                .map_err(|e| e.to_string());
            #[cfg(not(feature = "kafka"))]
            return Err("this tidemark was built without Kafka (cargo feature `kafka`)".into());
        }
        FileSource::from_url(url)
            .map(Input::Files)
            .map_err(|e| e.to_string())
    }

    /// Whether its records are text lines rather than records with fields.
    pub fn is_text(&self) -> bool {
        match self {
            Input::Generator => false,
            Input::Files(files) => files.options().format == Format::Text,
            #[cfg(feature = "kafka")]
            Input::Kafka(topic) => topic.options().format == ValueFormat::Text,
        }
    }
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Input::Generator => f.write_str("Generator"),
            Input::Files(files) => write!(f, "Files({:?})", files.options()),
            #[cfg(feature = "kafka")]
            Input::Kafka(topic) => write!(f, "Kafka({:?})", topic.options()),
        }
    }
}

/// A text line's words: wordcount's keys.
fn split_words(line: String) -> Vec<String> {
    line.split_whitespace().map(str::to_owned).collect()
}

/// A record's `key` field, whatever its JSON or CSV type.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct KeyField {
    key: serde_json::Value,
}

impl KeyField {
    /// The key as text.
    pub fn into_key(self) -> String {
        key_text(self.key)
    }
}

/// A key read from a file as text: a string as it is, anything else as
/// JSON.
pub fn key_text(key: serde_json::Value) -> String {
    match key {
        serde_json::Value::String(key) => key,
        other => other.to_string(),
    }
}

/// The wordcount topology's parameters: source → count by key → sink.
#[derive(Clone, Debug)]
pub struct Wordcount {
    /// Records generated over all source subtasks.
    pub records: u64,
    /// Distinct keys; must not be 0.
    pub keys: u64,
    /// Seed of the keys: the same seed gives the same records.
    pub seed: u64,
    /// What the count emits.
    pub emit: Emit,
    /// Where the `(key, count)` results go.
    pub sink: Target,
    /// Where the records come from: the generator (of `records` records
    /// with `keys` keys) or files.
    pub input: Input,
}

impl Wordcount {
    /// The job, named [`JOB_NAME`], with operator uids `generator` and
    /// `count` (what savepoints match). Into files, each run names its
    /// files after itself (`Output::run`), so that processes writing into
    /// one directory do not collide; a restored sink goes on with the run
    /// it was restored from.
    pub fn job(&self, config: JobConfig) -> Job {
        let Wordcount {
            records,
            keys,
            seed,
            ..
        } = *self;
        let builder = Job::builder(JOB_NAME).config(config);
        match &self.input {
            Input::Generator => self.count(
                builder
                    .source("generator", move |ctx| {
                        Generator::new(records, keys, seed, ctx)
                    })
                    .uid("generator"),
            ),
            Input::Files(lines) if lines.options().format == Format::Text => self.count(
                builder
                    .split_source("files", lines.clone())
                    .uid("files")
                    .flat_map(split_words),
            ),
            Input::Files(files) => self.count(
                builder
                    .split_source("files", files.records::<KeyField>())
                    .uid("files")
                    .map(KeyField::into_key),
            ),
            #[cfg(feature = "kafka")]
            Input::Kafka(lines) if lines.options().format == ValueFormat::Text => self.count(
                builder
                    .split_source("kafka", lines.clone())
                    .uid("kafka")
                    .flat_map(split_words),
            ),
            #[cfg(feature = "kafka")]
            Input::Kafka(topic) => self.count(
                builder
                    .split_source("kafka", topic.records::<KeyField>())
                    .uid("kafka")
                    .map(KeyField::into_key),
            ),
        }
    }

    /// Counts the keys of `keys` into the sink.
    fn count<K: Key>(&self, keys: Stream<K>) -> Job
    where
        (K, u64): Row,
    {
        let emit = self.emit;
        let counted = keys
            .key_by(|key: &K| key.clone())
            .process("count", move |states| Counter::open(states, emit))
            .uid("count");
        sink_into(counted, &self.sink)
    }
}
