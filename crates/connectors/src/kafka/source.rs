//! The Kafka source, as Flink's `KafkaSource`: a topic's partitions are the
//! splits, which the enumerator finds (and finds again every discovery
//! interval, for partitions added later) and pins to subtasks, without
//! consumer-group rebalancing. A split's position is the next offset to
//! read, so checkpoints hold the offsets; a completed checkpoint's offsets
//! are committed back to the consumer group, for monitoring only.

use super::{unknown, Endpoint, KafkaError};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError as ClientError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tidemark_core::dataflow::source::{
    Discovery, DiscoveryFuture, SourceSplit, SourceStatus, SplitEnumerator, SplitReader,
    SplitSource,
};
use tidemark_core::UserError;

/// How a record's value becomes a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueFormat {
    /// A JSON value; an object without a `ts` field gets the Kafka
    /// record's timestamp as `ts`, so event time defaults to it.
    Json,
    /// UTF-8 text, as a string.
    Text,
}

/// Where the partitions found at the first discovery start; partitions
/// added later start at their beginning, as in Flink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartAt {
    /// The oldest record the broker still has.
    Earliest,
    /// After the records there at the first discovery.
    Latest,
}

/// A Kafka source's settings.
#[derive(Clone, Debug)]
pub struct KafkaSourceOptions {
    /// How values are records.
    pub format: ValueFormat,
    /// Where the first partitions start.
    pub start: StartAt,
    /// Stop at the records there at the first discovery (Flink's
    /// `setBounded(OffsetsInitializer.latest())`): the job ends.
    pub bounded: bool,
    /// How often to look for new partitions (unbounded only).
    pub discovery_interval: Duration,
    /// The consumer group completed checkpoints' offsets are committed to.
    pub group: String,
}

impl KafkaSourceOptions {
    /// The defaults for `topic`: JSON, from the earliest records,
    /// unbounded, partitions looked for every 30 s, group `tidemark-TOPIC`.
    pub fn new(topic: &str) -> Self {
        KafkaSourceOptions {
            format: ValueFormat::Json,
            start: StartAt::Earliest,
            bounded: false,
            discovery_interval: Duration::from_secs(30),
            group: format!("tidemark-{topic}"),
        }
    }
}

/// A partition, read up to `offset`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaSplit {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The next offset to read.
    pub offset: i64,
    /// Bounded: the offset it ends before.
    pub end: Option<i64>,
}

impl SourceSplit for KafkaSplit {
    fn split_id(&self) -> String {
        format!("{}-{}", self.topic, self.partition)
    }
}

/// The enumerator's state: the partitions it has found, as few as the
/// topic has.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KnownPartitions {
    /// Partition numbers.
    pub partitions: BTreeSet<i32>,
}

/// A topic's records as records `T`: the split source.
pub struct KafkaSource<T> {
    endpoint: Arc<Endpoint>,
    options: Arc<KafkaSourceOptions>,
    /// Commits completed checkpoints' offsets; made at the first.
    committer: Arc<Mutex<Option<BaseConsumer>>>,
    records: PhantomData<fn() -> T>,
}

impl<T> Clone for KafkaSource<T> {
    fn clone(&self) -> Self {
        self.records()
    }
}

impl<T> KafkaSource<T> {
    /// The topic of `endpoint`.
    pub fn new(endpoint: Endpoint, options: KafkaSourceOptions) -> Self {
        KafkaSource {
            endpoint: Arc::new(endpoint),
            options: Arc::new(options),
            committer: Arc::default(),
            records: PhantomData,
        }
    }

    /// `kafka://HOST:PORT/TOPIC?format=json|text&start=earliest|latest`
    /// `[&bounded=latest][&discovery-interval=30s][&group=NAME]`.
    pub fn from_url(url: &str) -> Result<Self, KafkaError> {
        let (endpoint, query) = Endpoint::parse(url)?;
        let mut options = KafkaSourceOptions::new(&endpoint.topic);
        let problem = |problem: String| KafkaError::Url {
            url: url.to_owned(),
            problem,
        };
        for (key, value) in query {
            let wrong = |expected: &str| problem(format!("{key}={value}: expected {expected}"));
            match key.as_str() {
                "format" => {
                    options.format = match value.as_str() {
                        "json" => ValueFormat::Json,
                        "text" => ValueFormat::Text,
                        _ => return Err(wrong("json or text")),
                    }
                }
                "start" => {
                    options.start = match value.as_str() {
                        "earliest" => StartAt::Earliest,
                        "latest" => StartAt::Latest,
                        _ => return Err(wrong("earliest or latest")),
                    }
                }
                "bounded" if value == "latest" => options.bounded = true,
                "bounded" => return Err(wrong("latest")),
                "discovery-interval" => {
                    options.discovery_interval = humantime::parse_duration(&value)
                        .ok()
                        .filter(|d| !d.is_zero())
                        .ok_or_else(|| wrong("a duration such as 30s"))?
                }
                "group" => options.group = value,
                _ => {
                    return Err(unknown(
                        url,
                        &key,
                        "format, start, bounded, discovery-interval, group",
                    ))
                }
            }
        }
        Ok(Self::new(endpoint, options))
    }

    /// Its settings.
    pub fn options(&self) -> &KafkaSourceOptions {
        &self.options
    }

    /// The same topic, read as records `U`.
    pub fn records<U>(&self) -> KafkaSource<U> {
        KafkaSource {
            endpoint: self.endpoint.clone(),
            options: self.options.clone(),
            committer: self.committer.clone(),
            records: PhantomData,
        }
    }

    fn consumer(&self, settings: &[(&str, &str)]) -> Result<BaseConsumer, KafkaError> {
        let mut base = vec![
            ("group.id", self.options.group.as_str()),
            ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"),
            ("isolation.level", "read_committed"),
        ];
        base.extend_from_slice(settings);
        self.endpoint
            .config(&base)
            .create()
            .map_err(self.endpoint.error("cannot create a consumer"))
    }
}

impl<T: Send + 'static> SplitEnumerator for KafkaSource<T> {
    type Split = KafkaSplit;
    type State = KnownPartitions;

    fn discover(
        &self,
        known: KnownPartitions,
        _parallelism: u32,
    ) -> DiscoveryFuture<KafkaSplit, KnownPartitions> {
        let source = self.records::<()>();
        Box::pin(async move {
            crate::io::spawn_blocking(move || source.find_partitions(known))
                .await
                .map_err(|e| -> UserError { format!("a partition discovery stopped: {e}").into() })?
                .map_err(UserError::from)
        })
    }

    fn monitor_interval(&self) -> Option<Duration> {
        (!self.options.bounded).then_some(self.options.discovery_interval)
    }

    /// Partition p goes to subtask p mod parallelism, as Flink's does
    /// (up to its topic-dependent start), so a partition's records always
    /// come through one reader.
    fn owner(&self, split: &KafkaSplit, _parallelism: u32) -> Option<u32> {
        Some(split.partition.unsigned_abs())
    }
}

impl KafkaSource<()> {
    /// Partitions of the topic not in `known`, at their start offsets.
    fn find_partitions(
        &self,
        mut known: KnownPartitions,
    ) -> Result<Discovery<KafkaSplit, KnownPartitions>, KafkaError> {
        let Endpoint { topic, timeout, .. } = &*self.endpoint;
        let consumer = self.consumer(&[])?;
        let metadata = consumer
            .fetch_metadata(Some(topic), *timeout)
            .map_err(self.endpoint.error("cannot read the topic's metadata"))?;
        let found = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .filter(|t| t.error().is_none() && !t.partitions().is_empty())
            .ok_or_else(|| KafkaError::Url {
                url: format!("kafka://{}/{topic}", self.endpoint.brokers),
                problem: "the topic does not exist".into(),
            })?;
        let first = known.partitions.is_empty();
        let mut splits = Vec::new();
        for partition in found.partitions().iter().map(|p| p.id()) {
            if !known.partitions.insert(partition) {
                continue;
            }
            let (low, high) = consumer
                .fetch_watermarks(topic, partition, *timeout)
                .map_err(
                    self.endpoint
                        .error(format!("cannot read partition {partition}'s offsets")),
                )?;
            let offset = match self.options.start {
                StartAt::Latest if first => high,
                _ => low,
            };
            splits.push(KafkaSplit {
                topic: topic.clone(),
                partition,
                offset,
                end: self.options.bounded.then_some(high),
            });
        }
        Ok(Discovery {
            splits,
            state: known,
        })
    }
}

impl<T: DeserializeOwned + Send + 'static> SplitSource<T> for KafkaSource<T> {
    fn open(&self, split: KafkaSplit) -> Result<Box<dyn SplitReader<T, KafkaSplit>>, UserError> {
        // An offset the broker no longer has fails the job, naming it,
        // rather than skipping records.
        let consumer = self.consumer(&[
            ("enable.partition.eof", "true"),
            ("auto.offset.reset", "error"),
        ])?;
        let mut assignment = TopicPartitionList::new();
        assignment
            .add_partition_offset(&split.topic, split.partition, Offset::Offset(split.offset))
            .and_then(|()| consumer.assign(&assignment))
            .map_err(
                self.endpoint
                    .error(format!("cannot read partition {}", split.partition)),
            )?;
        Ok(Box::new(PartitionReader {
            consumer,
            split,
            format: self.options.format,
            records: PhantomData,
        }))
    }

    /// Commits the offsets to the group, for tools that watch its lag.
    fn checkpoint_complete(&self, splits: &[KafkaSplit]) -> Result<(), UserError> {
        let mut offsets = TopicPartitionList::new();
        for split in splits {
            offsets
                .add_partition_offset(&split.topic, split.partition, Offset::Offset(split.offset))
                .map_err(|e| format!("kafka {}: {e}", split.topic))?;
        }
        let mut committer = self
            .committer
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if committer.is_none() {
            *committer = Some(self.consumer(&[])?);
        }
        let committer = committer.as_ref().expect("made above");
        // Serves the callbacks of earlier commits; a failed one is only
        // logged: the offsets are for monitoring.
        committer.poll(Duration::ZERO);
        if let Err(e) = committer.commit(&offsets, CommitMode::Async) {
            tracing::warn!(topic = %self.endpoint.topic, "cannot commit offsets: {e}");
        }
        Ok(())
    }
}

/// Reads one partition through a consumer of its own.
struct PartitionReader<T> {
    consumer: BaseConsumer,
    split: KafkaSplit,
    format: ValueFormat,
    records: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> PartitionReader<T> {
    fn ended(&self) -> bool {
        self.split.end.is_some_and(|end| self.split.offset >= end)
    }

    fn fail(&self, offset: i64, problem: impl std::fmt::Display) -> UserError {
        let KafkaSplit {
            topic, partition, ..
        } = &self.split;
        format!("kafka {topic} partition {partition} offset {offset}: {problem}").into()
    }

    fn decode(&self, message: &rdkafka::message::BorrowedMessage<'_>) -> Result<T, UserError> {
        let offset = message.offset();
        let payload = message
            .payload()
            .ok_or_else(|| self.fail(offset, "a record without a value"))?;
        let value = match self.format {
            ValueFormat::Text => std::str::from_utf8(payload)
                .map(|text| serde_json::Value::String(text.to_owned()))
                .map_err(|e| self.fail(offset, e))?,
            ValueFormat::Json => {
                let mut value: serde_json::Value =
                    serde_json::from_slice(payload).map_err(|e| self.fail(offset, e))?;
                if let (serde_json::Value::Object(fields), Some(ts)) =
                    (&mut value, message.timestamp().to_millis())
                {
                    fields.entry("ts").or_insert(ts.into());
                }
                value
            }
        };
        serde_json::from_value(value).map_err(|e| self.fail(offset, e))
    }

    /// The end of the partition for now: past the end of a bounded split,
    /// transaction markers included, it is read.
    fn at_end_of_partition(&mut self) -> Result<SourceStatus, UserError> {
        if self.split.end.is_some() {
            let position = self
                .consumer
                .position()
                .map_err(|e| self.fail(self.split.offset, e))?;
            let reached = position
                .find_partition(&self.split.topic, self.split.partition)
                .and_then(|p| match p.offset() {
                    Offset::Offset(offset) => Some(offset),
                    _ => None,
                });
            if let Some(offset) = reached.filter(|&o| o > self.split.offset) {
                self.split.offset = offset;
            }
        }
        Ok(if self.ended() {
            SourceStatus::Finished
        } else {
            SourceStatus::Running
        })
    }
}

impl<T: DeserializeOwned> SplitReader<T, KafkaSplit> for PartitionReader<T> {
    fn read(&mut self, out: &mut Vec<T>, max: usize) -> Result<SourceStatus, UserError> {
        for _ in 0..max {
            if self.ended() {
                return Ok(SourceStatus::Finished);
            }
            match self.consumer.poll(Duration::ZERO) {
                None => break,
                Some(Ok(message)) => {
                    out.push(self.decode(&message)?);
                    self.split.offset = message.offset() + 1;
                }
                Some(Err(ClientError::PartitionEOF(_))) => return self.at_end_of_partition(),
                Some(Err(e)) => return Err(self.fail(self.split.offset, e)),
            }
        }
        Ok(if self.ended() {
            SourceStatus::Finished
        } else {
            SourceStatus::Running
        })
    }

    fn split(&self) -> KafkaSplit {
        self.split.clone()
    }
}
