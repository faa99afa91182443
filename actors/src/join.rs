//! The join topology: two generators of timestamped keyed records, *left*
//! and *right*, joined on equal keys and timestamps at most an interval
//! apart (an interval join), and a sink of `key,left,right` lines naming
//! each pair by its records' indices.

use crate::sinks::{sink_into, Target};
use crate::windows::Events;
use crate::wordcount::{Generator, Records};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tidemark_connectors::rows::{Column, Row, SqlField, SqlType, Value};
use tidemark_core::job::JobConfig;
use tidemark_core::rng::splitmix64;
use tidemark_core::time::{Timestamped, WatermarkStrategy};
use tidemark_core::{Job, UserError};

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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pair {
    /// The key both records have.
    pub key: u64,
    /// The left record's index.
    pub left: u64,
    /// The right record's index.
    pub right: u64,
}

/// Columns `key`, `left` and `right`, all three the key in upsert mode.
impl Row for Pair {
    fn columns() -> Vec<Column> {
        ["key", "left", "right"]
            .map(|name| Column {
                name,
                sql_type: SqlType::BigInt,
            })
            .into()
    }

    fn key_columns() -> usize {
        3
    }

    fn values(&self, out: &mut Vec<Value>) -> Result<(), UserError> {
        for field in [self.key, self.left, self.right] {
            out.push(field.value()?);
        }
        Ok(())
    }
}

/// The join job's name, from which its id and checkpoint directory follow.
pub const JOB_NAME: &str = "join";

/// The join topology's parameters: two generators → interval join by key →
/// sink.
#[derive(Clone, Debug)]
pub struct Join {
    /// Records each side generates over all its source subtasks.
    pub records: u64,
    /// How the left side's records are made; the right side's are made
    /// alike with the seed `splitmix64(seed)`.
    pub events: Events,
    /// The most two joined records' timestamps differ by.
    pub interval: Duration,
    /// Where the `(key, left, right)` results go.
    pub sink: Target,
}

impl Join {
    /// The right side's records.
    pub fn right(events: Events) -> Events {
        Events {
            seed: splitmix64(events.seed),
            ..events
        }
    }

    /// The job, named [`JOB_NAME`], with operator uids `left`, `right` and
    /// `join` (what savepoints match). Sources use bounded out-of-orderness
    /// of the generators' disorder, so no record is late.
    pub fn job(&self, config: JobConfig) -> Job {
        let Join {
            records,
            events,
            interval,
            ..
        } = *self;
        let strategy =
            WatermarkStrategy::bounded_out_of_orderness(Duration::from_millis(events.max_disorder));
        let job = Job::builder(JOB_NAME).config(config);
        let side = |name: &str, events: Events| {
            job.source_with_watermarks(name, strategy, move |ctx| {
                Generator::of(records, Side(events), ctx)
            })
            .uid(name)
            .key_by(|record: &Indexed| record.key)
        };
        let (left, right) = (side("left", events), side("right", Self::right(events)));
        let pairs = left
            .interval_join(right)
            .between(interval, interval)
            .process("join", |a: &Indexed, b: &Indexed, out| {
                out.collect(Pair {
                    key: a.key,
                    left: a.index,
                    right: b.index,
                })
            })
            .uid("join");
        sink_into(pairs, &self.sink)
    }
}
