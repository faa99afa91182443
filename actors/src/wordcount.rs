//! The wordcount topology: a deterministic generator of keyed records, a
//! keyed count, and a sink of `(key, count)`.

use crate::sinks::{files_or_discard, Output};
use tidemark_core::job::JobConfig;
use tidemark_core::rng::splitmix64;
use tidemark_core::split::{Split, SplitPosition};
use tidemark_core::{
    AllKeys, Collector, Job, KeyedContext, KeyedProcessFunction, ReduceFunction, ReducingState,
    Source, SourceContext, SourceStatus, StateRegistrar, UserError,
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
pub struct Counter {
    count: ReducingState<u64, Sum>,
    emit: Emit,
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

impl Counter {
    /// Registers the `count` state; for the `process` factory of a keyed
    /// stream.
    pub fn open(states: &mut StateRegistrar<'_, u64>, emit: Emit) -> Self {
        Counter {
            count: states.reducing("count", Sum),
            emit,
        }
    }
}

impl KeyedProcessFunction<u64, u64, (u64, u64)> for Counter {
    fn process(
        &mut self,
        key: u64,
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, (u64, u64)>,
    ) {
        let mut count = ctx.reducing(&self.count);
        count.add(1);
        if self.emit == Emit::Updates {
            out.collect((key, *count.get().expect("added above")));
        }
    }

    fn end_of_input(&mut self, states: AllKeys<'_, u64>, out: &mut Collector<'_, (u64, u64)>) {
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

/// The wordcount topology's parameters: generator → count by key → sink.
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
    /// Directory of committed `key,count` files; `None` discards results.
    pub output: Option<Output>,
}

impl Wordcount {
    /// The job, named [`JOB_NAME`], with operator uids `generator` and
    /// `count` (what savepoints match). With an output directory, each call
    /// names its files after a new run (from the current time), so that
    /// processes writing into one directory do not collide; a restored sink
    /// goes on with the run it was restored from.
    pub fn job(&self, config: JobConfig) -> Job {
        let Wordcount {
            records,
            keys,
            seed,
            emit,
            ..
        } = *self;
        let counted = Job::builder(JOB_NAME)
            .config(config)
            .source("generator", move |ctx| {
                Generator::new(records, keys, seed, ctx)
            })
            .uid("generator")
            .key_by(|key: &u64| *key)
            .process("count", move |states| Counter::open(states, emit))
            .uid("count");
        files_or_discard(counted, self.output.as_ref())
    }
}
