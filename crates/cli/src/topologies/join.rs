//! The join topology: two inputs of timestamped keyed records, *left* and
//! *right*, joined on equal keys and timestamps at most an interval apart
//! (an interval join), and a sink of `key,left,right` lines. Two generators
//! name each pair by its records' indices; files or Kafka records, which
//! have none, by their event times.

use crate::sinks::{sink_into, Target};
use crate::topologies::windows::{timed_events, Event, Events};
use crate::topologies::wordcount::{Generator, Input, Records};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tidemark_connectors::rows::{Column, Row, SqlField, SqlType, Value};
use tidemark_core::job::JobConfig;
use tidemark_core::model::rng::splitmix64;
use tidemark_core::time::{Timestamped, WatermarkStrategy};
use tidemark_core::{Job, Key, KeyedStream, UserError};

/// A generated record of one side: its index in its side's input, its key
/// and its event time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Indexed {
    /// Record i of its side.
    pub index: u64,
    /// The key.
    pub key: u64,
    /// Event time, ms.
    pub timestamp: u64,
}

impl Timestamped for Indexed {
    fn timestamp(&self) -> u64 {
        self.timestamp
    }
}

/// A side's records: record i is record i of the windows topology's
/// [`Events`], with its index.
#[derive(Clone, Copy, Debug)]
pub struct Side(pub Events);

impl Records for Side {
    type Record = Indexed;
    fn record(&self, i: u64) -> Indexed {
        let event = self.0.record(i);
        Indexed {
            index: i,
            key: event.key,
            timestamp: event.timestamp,
        }
    }
}

/// A joined pair, as the sink writes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pair<K = u64> {
    /// The key both records have.
    pub key: K,
    /// The left record's index, or its event time when a side is not
    /// generated.
    pub left: u64,
    /// The right record's index, or its event time when a side is not
    /// generated.
    pub right: u64,
}

/// Columns `key`, `left` and `right`, all three the key in upsert mode.
impl<K: SqlField + Send + 'static> Row for Pair<K> {
    fn columns() -> Vec<Column> {
        let column = |name, sql_type| Column { name, sql_type };
        vec![
            column("key", K::SQL_TYPE),
            column("left", SqlType::BigInt),
            column("right", SqlType::BigInt),
        ]
    }

    fn key_columns() -> usize {
        3
    }

    fn values(&self, out: &mut Vec<Value>) -> Result<(), UserError> {
        out.push(self.key.value()?);
        out.push(self.left.value()?);
        out.push(self.right.value()?);
        Ok(())
    }
}

/// The join job's name, from which its id and checkpoint directory follow.
pub const JOB_NAME: &str = "join";

/// The join topology's parameters: two inputs → interval join by key →
/// sink.
#[derive(Clone, Debug)]
pub struct Join {
    /// Records each generated side makes over all its source subtasks.
    pub records: u64,
    /// How a generated left side's records are made; a generated right
    /// side's are made alike with the seed `splitmix64(seed)`. Files and
    /// Kafka records have a disorder of at most `events.max_disorder`.
    pub events: Events,
    /// The most two joined records' timestamps differ by.
    pub interval: Duration,
    /// Where the `(key, left, right)` results go.
    pub sink: Target,
    /// Where the left side's records come from.
    pub left: Input,
    /// Where the right side's records come from.
    pub right: Input,
}

impl Join {
    /// The right side's records.
    pub fn right(events: Events) -> Events {
        Events {
            seed: splitmix64(events.seed),
            ..events
        }
    }

    /// The job, named [`JOB_NAME`], with operator uids `join` and, for its
    /// sources (what savepoints match), `left` and `right` when generated,
    /// else `left-files`, `right-kafka` and so on. Sources use bounded
    /// out-of-orderness of `events.max_disorder`, so no record is late.
    /// When both sides are generated, pairs name their records' indices
    /// and keys are numbers; otherwise pairs name event times and keys are
    /// text.
    pub fn job(&self, config: JobConfig) -> Job {
        let Join {
            records, events, ..
        } = *self;
        let strategy =
            WatermarkStrategy::bounded_out_of_orderness(Duration::from_millis(events.max_disorder));
        let builder = Job::builder(JOB_NAME).config(config);
        let generated = |name: &str, events: Events| {
            builder
                .split_source_with_watermarks(name, strategy, Generator::of(records, Side(events)))
                .uid(name)
        };
        let read = |input: &Input, name: &str, events: Events| {
            timed_events(&builder, input, &format!("{name}-"), strategy).unwrap_or_else(|| {
                generated(name, events)
                    .map(|record: Indexed| Event {
                        key: record.key.to_string(),
                        timestamp: record.timestamp,
                    })
                    .key_by(|event: &Event<String>| event.key.clone())
            })
        };
        if let (Input::Generator, Input::Generator) = (&self.left, &self.right) {
            let side = |name, events| generated(name, events).key_by(|record: &Indexed| record.key);
            let (left, right) = (side("left", events), side("right", Self::right(events)));
            return self.pairs(left, right, |a, b| Pair {
                key: a.key,
                left: a.index,
                right: b.index,
            });
        }
        let left = read(&self.left, "left", events);
        let right = read(&self.right, "right", Self::right(events));
        self.pairs(left, right, |a, b| Pair {
            key: a.key.clone(),
            left: a.timestamp,
            right: b.timestamp,
        })
    }

    /// Joins `left` and `right` into the sink, each pair as `pair` makes
    /// it.
    fn pairs<K, T>(
        &self,
        left: KeyedStream<K, T>,
        right: KeyedStream<K, T>,
        pair: fn(&T, &T) -> Pair<K>,
    ) -> Job
    where
        K: Key + SqlField,
        T: tidemark_core::Data + Timestamped,
    {
        let pairs = left
            .interval_join(right)
            .between(self.interval, self.interval)
            .process("join", move |a: &T, b: &T, out| out.collect(pair(a, b)))
            .uid("join");
        sink_into(pairs, &self.sink)
    }
}
