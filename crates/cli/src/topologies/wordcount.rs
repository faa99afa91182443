//! The wordcount topology: a deterministic generator of keyed records, a
//! keyed count, and a sink of `(key, count)`.

use crate::sinks::{sink_into, Target};
use serde::{Deserialize, Serialize};
use std::marker::PhantomData;
use std::time::Duration;
use tidemark_connectors::files::{FileSource, Format};
#[cfg(feature = "kafka")]
use tidemark_connectors::kafka::{KafkaSource, ValueFormat};
use tidemark_connectors::rows::Row;
use tidemark_core::dataflow::source::{
    Discovery, DiscoveryFuture, SourceSplit, SplitEnumerator, SplitReader, SplitSource,
};
use tidemark_core::job::JobConfig;
use tidemark_core::model::rng::splitmix64;
use tidemark_core::{
    AllKeys, Collector, Job, Key, KeyedContext, KeyedProcessFunction, ReduceFunction,
    ReducingState, SourceStatus, StateRegistrar, StateTtlConfig, Stream, UserError,
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

/// A generated input as a split source: record i of `0..records`, made by
/// `make`, is in split i mod W, W being the source's parallelism when the
/// job first starts. Split r goes to subtask r, which reads its indices in
/// increasing order: what each subtask read before sources had splits,
/// byte for byte. A restore at another parallelism deals the W splits out
/// again, as Kafka's partitions; beyond W, subtasks read nothing (as
/// Flink's `NumberSequenceSource`). A run restored from a checkpoint of a
/// run that made fewer records goes on to its own `records` (splits of the
/// rest, again by i mod W); a split goes to the end its run gave it.
#[derive(Clone, Copy, Debug)]
pub struct Generator<R = Keys> {
    records: u64,
    make: R,
}

impl Generator {
    /// Wordcount's records `0..records`, with keys in `0..keys` (`keys`
    /// must not be 0).
    pub fn new(records: u64, keys: u64, seed: u64) -> Self {
        Generator::of(records, Keys { keys, seed })
    }
}

impl<R: Records> Generator<R> {
    /// Records `0..records` made by `make`.
    pub fn of(records: u64, make: R) -> Self {
        Generator { records, make }
    }
}

/// A generator's split: the indices i ≡ `residue` (mod `width`) from
/// `next` on, below `end`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GeneratedSplit {
    residue: u32,
    width: u32,
    next: u64,
    end: u64,
}

impl SourceSplit for GeneratedSplit {
    fn split_id(&self) -> String {
        format!("{}/{}@{}", self.residue, self.width, self.end)
    }
}

/// What a generator's splits cover: the indices below `records`, split
/// `width` ways.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Made {
    width: u32,
    records: u64,
}

impl<R: Records + Clone + Sync> SplitEnumerator for Generator<R> {
    type Split = GeneratedSplit;
    type State = Made;

    /// The splits of the indices from what `made` covers up to `records`.
    fn discover(&self, made: Made, parallelism: u32) -> DiscoveryFuture<GeneratedSplit, Made> {
        let width = match made.width {
            0 => parallelism.max(1),
            width => width,
        };
        let step = u64::from(width);
        let splits = (0..width)
            .map(|residue| GeneratedSplit {
                residue,
                width,
                // The first index of the residue class from `made.records`.
                next: made.records + (u64::from(residue) + step - made.records % step) % step,
                end: self.records,
            })
            .filter(|split| split.next < split.end)
            .collect();
        let state = Made {
            width,
            records: made.records.max(self.records),
        };
        Box::pin(std::future::ready(Ok(Discovery { splits, state })))
    }

    fn monitor_interval(&self) -> Option<Duration> {
        None
    }

    fn discovers_on_restore(&self) -> bool {
        true
    }

    fn owner(&self, split: &GeneratedSplit, _parallelism: u32) -> Option<u32> {
        Some(split.residue)
    }
}

impl<R: Records + Clone + Sync> SplitSource<R::Record> for Generator<R> {
    fn open(
        &self,
        split: GeneratedSplit,
    ) -> Result<Box<dyn SplitReader<R::Record, GeneratedSplit>>, UserError> {
        Ok(Box::new(Generated {
            make: self.make.clone(),
            split,
        }))
    }
}

/// Reads one split of a [`Generator`].
struct Generated<R> {
    make: R,
    split: GeneratedSplit,
}

impl<R: Records> SplitReader<R::Record, GeneratedSplit> for Generated<R> {
    fn read(&mut self, out: &mut Vec<R::Record>, max: usize) -> Result<SourceStatus, UserError> {
        let step = u64::from(self.split.width);
        for _ in 0..max {
            if self.split.next >= self.split.end {
                break;
            }
            out.push(self.make.record(self.split.next));
            self.split.next = self.split.next.saturating_add(step);
        }
        Ok(if self.split.next >= self.split.end {
            SourceStatus::Finished
        } else {
            SourceStatus::Running
        })
    }

    fn split(&self) -> GeneratedSplit {
        self.split.clone()
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

    /// [`open`](Self::open), with counts that expire `ttl` after their
    /// key was last seen: the key's next record counts from 1 again.
    pub fn with_ttl(states: &mut StateRegistrar<'_, K>, emit: Emit, ttl: StateTtlConfig) -> Self {
        Counter {
            count: states.reducing_with_ttl("count", Sum, ttl),
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

    fn end_input(&mut self, states: AllKeys<'_, K>, out: &mut Collector<'_, (K, u64)>) {
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
    /// How long a key's count lives after its last record, if not for
    /// ever (processing time).
    pub state_ttl: Option<Duration>,
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
                    .split_source("generator", Generator::new(records, keys, seed))
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
        let ttl = self.state_ttl.map(StateTtlConfig::new);
        let counted = keys
            .key_by(|key: &K| key.clone())
            .process("count", move |states| match ttl {
                Some(ttl) => Counter::with_ttl(states, emit, ttl),
                None => Counter::open(states, emit),
            })
            .uid("count");
        sink_into(counted, &self.sink)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::{Context, Poll, Waker};

    /// Record i is i.
    #[derive(Clone, Copy)]
    struct Index;

    impl Records for Index {
        type Record = u64;
        fn record(&self, i: u64) -> u64 {
            i
        }
    }

    fn discover(records: u64, made: Made, parallelism: u32) -> (Vec<GeneratedSplit>, Made) {
        let mut future = Generator::of(records, Index).discover(made, parallelism);
        let Poll::Ready(Ok(found)) = future
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        else {
            panic!("the generator discovers at once");
        };
        (found.splits, found.state)
    }

    /// Each split's records, read 3 at a time.
    fn read(splits: &[GeneratedSplit]) -> Vec<Vec<u64>> {
        splits
            .iter()
            .map(|split| {
                let mut reader = Generator::of(u64::MAX, Index).open(split.clone()).unwrap();
                let mut out = Vec::new();
                while reader.read(&mut out, 3).unwrap() == SourceStatus::Running {}
                out
            })
            .collect()
    }

    #[test]
    fn split_r_of_the_first_parallelism_holds_the_indices_of_residue_r() {
        let (splits, made) = discover(10, Made::default(), 3);
        assert_eq!(
            read(&splits),
            [vec![0, 3, 6, 9], vec![1, 4, 7], vec![2, 5, 8]]
        );
        let source = Generator::of(10, Index);
        let owners: Vec<_> = splits.iter().map(|s| source.owner(s, 3)).collect();
        assert_eq!(owners, [Some(0), Some(1), Some(2)]);
        assert_eq!(
            made,
            Made {
                width: 3,
                records: 10
            }
        );
    }

    #[test]
    fn a_longer_run_makes_splits_of_the_rest_only_and_a_shorter_none() {
        let made = Made {
            width: 3,
            records: 10,
        };
        // Restored at another parallelism: still split the first run's way.
        let (splits, after) = discover(20, made, 2);
        assert_eq!(
            read(&splits),
            [vec![12, 15, 18], vec![10, 13, 16, 19], vec![11, 14, 17]]
        );
        assert_eq!(after.records, 20);
        for records in [5, 10] {
            let (splits, after) = discover(records, made, 3);
            assert!(splits.is_empty(), "{records}: {splits:?}");
            assert_eq!(after, made);
        }
    }
}
