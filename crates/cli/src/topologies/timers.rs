//! The timers topology: the windows topology's timed keyed records, one
//! event-time timer a record at its timestamp plus a delay (Flink's
//! `registerEventTimeTimer` in a `KeyedProcessFunction`, as a timeout
//! does), and a sink of `key,timestamp` lines, one a timer fired. A delay
//! longer than the input's event time holds every timer until the input
//! ends: what a job holding many timers costs.

use crate::sinks::{sink_into, Target};
use crate::topologies::windows::{events_job, Event, Events, OverEvents};
use crate::topologies::wordcount::Input;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tidemark_connectors::rows::{Column, Row, SqlField, SqlType, Value};
use tidemark_core::dataflow::operator::{Collector, KeyedProcessFunction};
use tidemark_core::job::JobConfig;
use tidemark_core::state::KeyedContext;
use tidemark_core::{Job, Key, KeyedStream, UserError};

/// A timer that fired, as the sink writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fired<K = u64> {
    /// The key that set it.
    pub key: K,
    /// Its event time, ms.
    pub timestamp: u64,
}

/// Columns `key` and `timestamp`, both the key in upsert mode.
impl<K: SqlField + Send + 'static> Row for Fired<K> {
    fn columns() -> Vec<Column> {
        let column = |name, sql_type| Column { name, sql_type };
        vec![
            column("key", K::SQL_TYPE),
            column("timestamp", SqlType::BigInt),
        ]
    }

    fn key_columns() -> usize {
        2
    }

    fn values(&self, out: &mut Vec<Value>) -> Result<(), UserError> {
        out.push(self.key.value()?);
        out.push(self.timestamp.value()?);
        Ok(())
    }
}

/// Sets a keyed event-time timer `delay` ms after each record's timestamp
/// and emits it when it fires: a key's records at one time set one timer.
struct Timeouts {
    delay: u64,
}

impl<K: Key> KeyedProcessFunction<K, Event<K>, Fired<K>> for Timeouts {
    fn process(
        &mut self,
        event: Event<K>,
        ctx: &mut KeyedContext<'_, K>,
        _out: &mut Collector<'_, Fired<K>>,
    ) {
        ctx.register_event_time_timer(event.timestamp.saturating_add(self.delay));
    }

    fn on_timer(
        &mut self,
        timestamp: u64,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Collector<'_, Fired<K>>,
    ) {
        out.collect(Fired {
            key: ctx.key().clone(),
            timestamp,
        });
    }
}

/// The timers job's name, from which its id and checkpoint directory
/// follow.
pub const JOB_NAME: &str = "timers";

/// The timers topology's parameters: generator → a timer a record → sink.
#[derive(Clone, Debug)]
pub struct Timers {
    /// Records generated over all source subtasks.
    pub records: u64,
    /// How records are made.
    pub events: Events,
    /// How long after a record's timestamp its timer fires.
    pub delay: Duration,
    /// Where the `(key, timestamp)` of each timer fired goes.
    pub sink: Target,
    /// Where the records come from, as the windows topology's.
    pub input: Input,
}

impl Timers {
    /// The job, named [`JOB_NAME`], with operator uids `generator` and
    /// `timers`.
    pub fn job(&self, config: JobConfig) -> Job {
        events_job(
            JOB_NAME,
            config,
            self.records,
            self.events,
            &self.input,
            self,
        )
    }
}

impl OverEvents for Timers {
    /// Sets the timers of `keyed`'s records; their firings go to the sink.
    fn over<K: Key + SqlField>(&self, keyed: KeyedStream<K, Event<K>>) -> Job {
        let delay = u64::try_from(self.delay.as_millis()).unwrap_or(u64::MAX);
        let fired = keyed
            .process("timers", move |_| Timeouts { delay })
            .uid("timers");
        sink_into(fired, &self.sink)
    }
}
