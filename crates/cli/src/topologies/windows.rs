//! The windows topology: a generator of timestamped keyed records with
//! bounded disorder (or files of records with a `key` and a `ts`), a
//! per-key window count in event time, and a sink of
//! `key,window_start,window_end,count` lines.

use crate::sinks::{sink_into, Target};
use crate::topologies::wordcount::{key_text, Generator, Input, Records};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tidemark_connectors::rows::{Column, Row, SqlField, SqlType, Value};
use tidemark_core::job::JobBuilder;
use tidemark_core::job::JobConfig;
use tidemark_core::model::rng::splitmix64;
use tidemark_core::time::{Count, TimeWindow, Timestamped, WatermarkStrategy, WindowAssigner};
use tidemark_core::{Job, UserError};
use tidemark_core::{Key, KeyedStream};

/// A record: a key and its event time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event<K = u64> {
    /// The key.
    pub key: K,
    /// Event time, ms.
    pub timestamp: u64,
}

impl<K> Timestamped for Event<K> {
    fn timestamp(&self) -> u64 {
        self.timestamp
    }
}

/// The windows topology's records: record i has wordcount's key and the
/// timestamp `(i / events_per_ms).saturating_sub(splitmix64(seed + i +
/// 0x9E3779B97F4A7C15) % (max_disorder + 1))`, all additions wrapping.
#[derive(Clone, Copy, Debug)]
pub struct Events {
    /// Distinct keys; not 0.
    pub keys: u64,
    /// Seed of keys and disorder.
    pub seed: u64,
    /// Records per ms of event time; not 0.
    pub events_per_ms: u64,
    /// The most a timestamp lags behind its index's time, ms.
    pub max_disorder: u64,
}

impl Records for Events {
    type Record = Event;
    fn record(&self, i: u64) -> Event {
        let s = self.seed.wrapping_add(i);
        let lag =
            splitmix64(s.wrapping_add(0x9E37_79B9_7F4A_7C15)) % self.max_disorder.saturating_add(1);
        Event {
            key: splitmix64(s) % self.keys,
            timestamp: (i / self.events_per_ms).saturating_sub(lag),
        }
    }
}

/// The records of a file or Kafka `input`, with fields `key` and `ts`, as
/// events keyed by their key as text, from a source whose name and uid are
/// `prefix` and the input's kind (`files`, `kafka`): what savepoints match.
/// `None` for the generator, whose records are made otherwise.
pub fn timed_events(
    builder: &JobBuilder,
    input: &Input,
    prefix: &str,
    strategy: WatermarkStrategy,
) -> Option<KeyedStream<String, Event<String>>> {
    let source = |kind: &str| format!("{prefix}{kind}");
    let records = match input {
        Input::Generator => return None,
        Input::Files(files) => {
            let name = source("files");
            builder
                .split_source_with_watermarks(&name, strategy, files.records::<TimedKey>())
                .uid(&name)
        }
        #[cfg(feature = "kafka")]
        Input::Kafka(topic) => {
            let name = source("kafka");
            builder
                .split_source_with_watermarks(&name, strategy, topic.records::<TimedKey>())
                .uid(&name)
        }
    };
    Some(
        records
            .map(TimedKey::into_event)
            .key_by(|event: &Event<String>| event.key.clone()),
    )
}

/// A record of a file: a `key` of any JSON or CSV type and its event time
/// `ts`, in ms.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TimedKey {
    key: serde_json::Value,
    ts: u64,
}

impl Timestamped for TimedKey {
    fn timestamp(&self) -> u64 {
        self.ts
    }
}

impl TimedKey {
    /// The record with its key as text.
    pub fn into_event(self) -> Event<String> {
        Event {
            key: key_text(self.key),
            timestamp: self.ts,
        }
    }
}

/// One window's count, as the sink writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowCount<K = u64> {
    /// The key.
    pub key: K,
    /// The window.
    pub window: TimeWindow,
    /// Records of the key in it.
    pub count: u64,
}

/// Columns `key`, `window_start`, `window_end` (the key in upsert mode)
/// and `count`.
impl<K: SqlField + Send + 'static> Row for WindowCount<K> {
    fn columns() -> Vec<Column> {
        let column = |name, sql_type| Column { name, sql_type };
        vec![
            column("key", K::SQL_TYPE),
            column("window_start", SqlType::BigInt),
            column("window_end", SqlType::BigInt),
            column("count", SqlType::BigInt),
        ]
    }

    fn key_columns() -> usize {
        3
    }

    fn values(&self, out: &mut Vec<Value>) -> Result<(), UserError> {
        out.push(self.key.value()?);
        out.push(self.window.start.value()?);
        out.push(self.window.end.value()?);
        out.push(self.count.value()?);
        Ok(())
    }
}

/// The most sliding windows a record may belong to: each costs state and a
/// firing.
pub const MAX_WINDOWS_PER_RECORD: u128 = 1000;

/// Parses `tumbling:SIZE`, `sliding:SIZE/SLIDE` or `session:GAP`, each a
/// duration with its unit (`tumbling:1s`) from 1 ms to a year. A record
/// belongs to SIZE/SLIDE sliding windows, at most [`MAX_WINDOWS_PER_RECORD`].
pub fn parse_window(s: &str) -> Result<WindowAssigner, String> {
    let usage = || format!("expected tumbling:SIZE, sliding:SIZE/SLIDE or session:GAP, got {s:?}");
    let (kind, spec) = s.split_once(':').ok_or_else(usage)?;
    let duration = |d: &str| -> Result<Duration, String> {
        let d = crate::config::values::flag_duration(d.trim())?;
        if d.as_millis() == 0 {
            return Err(format!("a window length must be at least 1 ms, got {s:?}"));
        }
        Ok(d)
    };
    match kind {
        "tumbling" => Ok(WindowAssigner::tumbling(duration(spec)?)),
        "sliding" => {
            let (size, slide) = spec.split_once('/').ok_or_else(usage)?;
            let (size, slide) = (duration(size)?, duration(slide)?);
            if size.as_millis() / slide.as_millis() > MAX_WINDOWS_PER_RECORD {
                return Err(format!(
                    "a record would belong to more than {MAX_WINDOWS_PER_RECORD} windows (SIZE/SLIDE), got {s:?}"
                ));
            }
            Ok(WindowAssigner::sliding(size, slide))
        }
        "session" => Ok(WindowAssigner::session(duration(spec)?)),
        _ => Err(usage()),
    }
}

/// The windows job's name, from which its id and checkpoint directory follow.
pub const JOB_NAME: &str = "windows";

/// The windows topology's parameters: generator → window count by key → sink.
#[derive(Clone, Debug)]
pub struct Windows {
    /// Records generated over all source subtasks.
    pub records: u64,
    /// How records are made.
    pub events: Events,
    /// The windows.
    pub window: WindowAssigner,
    /// Where the `(key, window_start, window_end, count)` results go.
    pub sink: Target,
    /// Where the records come from: the generator (of `records` records
    /// made by `events`) or files of JSON lines or CSV with `key` and
    /// `ts`, whose disorder is at most `events.max_disorder`.
    pub input: Input,
}

impl Windows {
    /// The job, named [`JOB_NAME`], with operator uids `generator` and
    /// `window` (what savepoints match). Output files are named as
    /// wordcount's (`Wordcount::job`).
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

impl OverEvents for Windows {
    /// Counts the events of `keyed` per key and window into the sink.
    fn over<K: Key + SqlField>(&self, keyed: KeyedStream<K, Event<K>>) -> Job {
        let counted = keyed
            .window(self.window)
            .aggregate("window", Count, |key: &K, window, count, out| {
                out.collect(WindowCount {
                    key: key.clone(),
                    window: *window,
                    count,
                })
            })
            .uid("window");
        sink_into(counted, &self.sink)
    }
}

/// What a job makes of keyed events, whatever type their keys are (text
/// from files or Kafka, numbers from the generator).
pub trait OverEvents {
    /// The rest of the job, from `keyed`.
    fn over<K: Key + SqlField>(&self, keyed: KeyedStream<K, Event<K>>) -> Job;
}

/// The job `name` over the events of `input` or, for the generator,
/// `records` events made by `events` from a source with uid `generator`,
/// keyed by their keys; `rest` makes the rest. Sources use bounded
/// out-of-orderness of the generator's disorder, so no record is late.
pub fn events_job(
    name: &str,
    config: JobConfig,
    records: u64,
    events: Events,
    input: &Input,
    rest: &impl OverEvents,
) -> Job {
    let strategy =
        WatermarkStrategy::bounded_out_of_orderness(Duration::from_millis(events.max_disorder));
    let builder = Job::builder(name).config(config);
    match timed_events(&builder, input, "", strategy) {
        Some(keyed) => rest.over(keyed),
        None => rest.over(
            builder
                .split_source_with_watermarks("generator", strategy, Generator::of(records, events))
                .uid("generator")
                .key_by(|event: &Event| event.key),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_flags_parse_with_their_units() {
        assert_eq!(
            parse_window("tumbling:1s"),
            Ok(WindowAssigner::tumbling(Duration::from_secs(1)))
        );
        assert_eq!(
            parse_window("sliding:2s/500ms"),
            Ok(WindowAssigner::sliding(
                Duration::from_secs(2),
                Duration::from_millis(500)
            ))
        );
        assert_eq!(
            parse_window("session:300ms"),
            Ok(WindowAssigner::session(Duration::from_millis(300)))
        );
        for bad in [
            "tumbling",
            "tumbling:1000",
            "sliding:1s",
            "hopping:1s",
            "session:0ms",
        ] {
            assert!(parse_window(bad).is_err(), "{bad} was accepted");
        }
    }
}
