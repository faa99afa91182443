//! The Kafka sink: each row a record, its key columns the key and the row
//! as a JSON object the value. At least once, it sends as rows come and
//! waits at every barrier until the broker has them all; exactly once, it
//! writes ahead ([`super::epochs`]) and sends each checkpoint's records in
//! one transaction when the checkpoint completes.

use super::epochs::{self, Epochs, Marker, Message};
use super::{unknown, Endpoint, KafkaError};
use crate::rows::{JsonObjects, Row};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tidemark_core::model::ids::CheckpointId;
use tidemark_core::{Sink, SinkContext, UserError};

/// What the sink promises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Every row reaches Kafka; after a restore, those since the restored
    /// checkpoint reach it again.
    AtLeastOnce,
    /// Every row is visible to `read_committed` consumers exactly once.
    ExactlyOnce,
}

/// A Kafka sink's settings.
#[derive(Clone, Debug)]
pub struct KafkaSinkOptions {
    /// The cluster and topic.
    pub endpoint: Endpoint,
    /// What it promises.
    pub delivery: Delivery,
    /// Exactly once: subtask i's producer is `PREFIX-i`, and its marker
    /// the offset of group `PREFIX-i`. Unique per job writing into the
    /// cluster (default `tidemark-TOPIC`).
    pub transactional_id_prefix: String,
}

impl KafkaSinkOptions {
    /// `kafka://HOST:PORT/TOPIC[?delivery=at-least-once|exactly-once]`
    /// `[&transactional-id-prefix=PREFIX]`.
    pub fn from_url(url: &str) -> Result<Self, KafkaError> {
        let (endpoint, query) = Endpoint::parse(url)?;
        let mut options = KafkaSinkOptions {
            transactional_id_prefix: format!("tidemark-{}", endpoint.topic),
            endpoint,
            delivery: Delivery::AtLeastOnce,
        };
        for (key, value) in query {
            match key.as_str() {
                "delivery" => {
                    options.delivery = match value.as_str() {
                        "at-least-once" => Delivery::AtLeastOnce,
                        "exactly-once" => Delivery::ExactlyOnce,
                        _ => {
                            return Err(KafkaError::Url {
                                url: url.to_owned(),
                                problem: format!(
                                    "delivery={value}: expected at-least-once or exactly-once"
                                ),
                            })
                        }
                    }
                }
                "transactional-id-prefix" => options.transactional_id_prefix = value,
                _ => return Err(unknown(url, &key, "delivery, transactional-id-prefix")),
            }
        }
        Ok(options)
    }
}

/// Keeps the first failed delivery, which the next flush reports.
#[derive(Default)]
struct Deliveries {
    failed: Mutex<Option<String>>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            let mut failed = self.failed.lock().unwrap_or_else(PoisonError::into_inner);
            failed.get_or_insert_with(|| e.to_string());
        }
    }
}

type KafkaProducer = BaseProducer<Deliveries>;

const NOT_RESTORED: &str = "the Kafka sink was used before it was restored";

/// One sink subtask's producer.
pub struct KafkaSink<T> {
    options: Arc<KafkaSinkOptions>,
    transactional_id: String,
    encoder: JsonObjects,
    /// Made when the subtask restores or starts.
    producer: Option<KafkaProducer>,
    /// Exactly once: reads and writes the marker.
    marker: Option<BaseConsumer>,
    epochs: Epochs,
    rows: PhantomData<fn(T)>,
}

impl<T: Row> KafkaSink<T> {
    /// Connects when the job starts or restores, not here.
    pub fn new(options: Arc<KafkaSinkOptions>, ctx: SinkContext) -> Self {
        let transactional_id = format!("{}-{}", options.transactional_id_prefix, ctx.subtask.0);
        KafkaSink {
            epochs: Epochs::new(&transactional_id, 0),
            transactional_id,
            options,
            encoder: JsonObjects::new::<T>(),
            producer: None,
            marker: None,
            rows: PhantomData,
        }
    }

    fn endpoint(&self) -> &Endpoint {
        &self.options.endpoint
    }

    fn producer(&self) -> Result<&KafkaProducer, UserError> {
        Ok(self.producer.as_ref().ok_or(NOT_RESTORED)?)
    }

    /// A producer; a transactional one under `transactional_id`, ready:
    /// any transaction its predecessor left open is aborted (fenced).
    fn connect(&self, transactional_id: Option<&str>) -> Result<KafkaProducer, KafkaError> {
        let endpoint = self.endpoint();
        let mut settings = vec![("enable.idempotence", "true"), ("acks", "all")];
        if let Some(id) = transactional_id {
            settings.push(("transactional.id", id));
        }
        let producer: KafkaProducer = endpoint
            .config(&settings)
            .create_with_context(Deliveries::default())
            .map_err(endpoint.error("cannot create a producer"))?;
        if let Some(id) = transactional_id {
            producer
                .init_transactions(endpoint.timeout)
                .map_err(endpoint.error(format!("cannot start transactional producer {id}")))?;
        }
        Ok(producer)
    }

    /// A consumer of group `transactional_id`, whose committed offset of
    /// partition 0 is the marker.
    fn marker_consumer(&self, transactional_id: &str) -> Result<BaseConsumer, KafkaError> {
        let endpoint = self.endpoint();
        endpoint
            .config(&[
                ("group.id", transactional_id),
                ("enable.auto.commit", "false"),
                ("isolation.level", "read_committed"),
            ])
            .create()
            .map_err(endpoint.error("cannot create the marker's consumer"))
    }

    /// Partition 0 of the topic, at `marker` if given: where the marker
    /// is kept.
    fn marker_partition(&self, marker: Option<Marker>) -> TopicPartitionList {
        let mut partitions = TopicPartitionList::new();
        let offset = marker.map_or(Offset::Invalid, |m| Offset::Offset(m.offset()));
        partitions
            .add_partition_offset(&self.endpoint().topic, 0, offset)
            .expect("an offset of a partition in a list is valid");
        partitions
    }

    /// What the marker of `consumer`'s group says.
    fn read_marker(&self, consumer: &BaseConsumer) -> Result<Option<Marker>, KafkaError> {
        let endpoint = self.endpoint();
        let committed = consumer
            .committed_offsets(self.marker_partition(None), endpoint.timeout)
            .map_err(endpoint.error("cannot read the sink's marker"))?;
        Ok(committed
            .find_partition(&endpoint.topic, 0)
            .and_then(|p| match p.offset() {
                Offset::Offset(n) if n > 0 => Some(Marker::from_offset(n)),
                _ => None,
            }))
    }

    /// Sends `messages` in one transaction, with the marker of `epoch` (its
    /// checkpoint, by its run) if given.
    fn send_transaction(
        &self,
        producer: &KafkaProducer,
        messages: &[Message],
        epoch: Option<(&BaseConsumer, Marker)>,
    ) -> Result<(), UserError> {
        let endpoint = self.endpoint();
        let of = epoch.map_or("the last rows".into(), |(_, m)| {
            format!("checkpoint {}", m.checkpoint.0)
        });
        let failed = |what: &str| endpoint.error(format!("{of}: {what}"));
        producer
            .begin_transaction()
            .map_err(failed("cannot begin its transaction"))?;
        for message in messages {
            send(producer, &endpoint.topic, message)?;
        }
        if let Some((consumer, marker)) = epoch {
            let group = consumer
                .group_metadata()
                .ok_or("the marker's consumer has no group")?;
            let offsets = self.marker_partition(Some(marker));
            producer
                .send_offsets_to_transaction(&offsets, &group, endpoint.timeout)
                .map_err(failed("cannot add the marker to its transaction"))?;
        }
        producer
            .commit_transaction(endpoint.timeout)
            .map_err(failed("cannot commit its transaction"))?;
        tracing::debug!(topic = %endpoint.topic, rows = messages.len(), "committed {of}");
        Ok(())
    }

    /// Sends the sealed epochs up to `checkpoint`, oldest first, each
    /// forgotten as soon as it is in Kafka: a later failure must not send
    /// it again.
    fn send_due(&mut self, checkpoint: CheckpointId) -> Result<(), UserError> {
        let producer = self.producer.as_ref().ok_or(NOT_RESTORED)?;
        let marker = self.marker.as_ref().ok_or(NOT_RESTORED)?;
        for due in self.epochs.due(checkpoint) {
            let epoch = Marker {
                checkpoint: due,
                run: self.epochs.run(),
            };
            self.send_transaction(producer, self.epochs.messages(due), Some((marker, epoch)))?;
            self.epochs.sent(due);
        }
        Ok(())
    }

    /// Sends the epochs of a restored `state` that Kafka lacks, under the
    /// transactional id that sealed them (fencing whatever producer of it
    /// may still run).
    fn recover(&self, state: epochs::SinkState) -> Result<(), UserError> {
        let id = state.transactional_id.clone();
        let (adopted_producer, adopted_marker);
        let (producer, marker) = if id == self.transactional_id {
            let marker = self.marker.as_ref().ok_or(NOT_RESTORED)?;
            (self.producer()?, marker)
        } else {
            adopted_producer = self.connect(Some(&id))?;
            adopted_marker = self.marker_consumer(&id)?;
            (&adopted_producer, &adopted_marker)
        };
        let last = self.read_marker(marker)?;
        tracing::debug!(transactional_id = %id, ?last, "restored");
        let run = state.run;
        for (checkpoint, messages) in epochs::unsent(state, last) {
            let epoch = Marker { checkpoint, run };
            self.send_transaction(producer, &messages, Some((marker, epoch)))?;
        }
        Ok(())
    }

    /// Waits until the broker has every record sent, or says why not.
    fn flush(&self) -> Result<(), UserError> {
        let producer = self.producer()?;
        let endpoint = self.endpoint();
        producer
            .flush(endpoint.timeout)
            .map_err(endpoint.error("cannot flush the records sent"))?;
        let failed = producer
            .context()
            .failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match failed {
            Some(e) => {
                Err(format!("kafka {}: a record was not delivered: {e}", endpoint.topic).into())
            }
            None => Ok(()),
        }
    }
}

/// A fresh start's run: 31 bits drawn from the clock, so that two starts
/// share one with a chance of one in two billion.
fn new_run() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mixed = tidemark_core::model::rng::splitmix64(nanos as u64);
    ((mixed >> 33) as u32).max(1)
}

/// Sends one record, waiting while the producer's queue is full.
fn send(producer: &KafkaProducer, topic: &str, message: &Message) -> Result<(), UserError> {
    let mut record = BaseRecord::to(topic)
        .key(message.key.as_slice())
        .payload(message.value.as_slice());
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((e, back)) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) => {
                producer.poll(Duration::from_millis(10));
                record = back;
            }
            Err((e, _)) => return Err(format!("kafka {topic}: cannot send a record: {e}").into()),
        }
    }
}

impl<T: Row> Sink<T> for KafkaSink<T> {
    fn write(&mut self, records: &mut Vec<T>) -> Result<(), UserError> {
        for record in records.drain(..) {
            let mut message = Message {
                key: Vec::new(),
                value: Vec::new(),
            };
            self.encoder.write(&record, &mut message.value)?;
            self.encoder.write_key(&mut message.key)?;
            match self.options.delivery {
                Delivery::AtLeastOnce => send(self.producer()?, &self.endpoint().topic, &message)?,
                Delivery::ExactlyOnce => self.epochs.push(message),
            }
        }
        if let Some(producer) = &self.producer {
            producer.poll(Duration::ZERO);
        }
        Ok(())
    }

    /// The input ended: at least once, everything is delivered. Exactly
    /// once, every sealed epoch goes out, then the rows since the last
    /// barrier in a transaction without a marker, as the PostgreSQL sink
    /// commits its last rows in one phase: a failure after this and before
    /// the job ends replays them from the last checkpoint, and they appear
    /// twice.
    fn finish(&mut self) -> Result<(), UserError> {
        if self.options.delivery == Delivery::ExactlyOnce {
            self.send_due(CheckpointId(u64::MAX))?;
            let last = self.epochs.take_open();
            if !last.is_empty() {
                self.send_transaction(self.producer()?, &last, None)?;
            }
        }
        self.flush()
    }

    fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<Vec<u8>, UserError> {
        match self.options.delivery {
            Delivery::AtLeastOnce => self.flush().map(|()| Vec::new()),
            Delivery::ExactlyOnce => self.epochs.seal(checkpoint),
        }
    }

    fn commit(&mut self, checkpoint: CheckpointId) -> Result<(), UserError> {
        if self.options.delivery == Delivery::AtLeastOnce {
            return Ok(());
        }
        self.send_due(checkpoint)
    }

    fn restore(&mut self, state: Option<&[u8]>) -> Result<(), UserError> {
        match self.options.delivery {
            Delivery::AtLeastOnce => self.producer = Some(self.connect(None)?),
            Delivery::ExactlyOnce => {
                self.producer = Some(self.connect(Some(&self.transactional_id))?);
                self.marker = Some(self.marker_consumer(&self.transactional_id)?);
                // A restored subtask goes on with the run it was restored
                // from; a fresh one draws a run of its own.
                let state = state.map(epochs::decode).transpose()?;
                let run = state.as_ref().map_or_else(new_run, |state| state.run);
                self.epochs = Epochs::new(&self.transactional_id, run);
                if let Some(state) = state {
                    self.recover(state)?;
                }
            }
        }
        Ok(())
    }

    /// A removed subtask's epochs go out under its own transactional id.
    fn adopt(&mut self, state: &[u8]) -> Result<(), UserError> {
        match self.options.delivery {
            Delivery::AtLeastOnce => Ok(()),
            Delivery::ExactlyOnce => self.recover(epochs::decode(state)?),
        }
    }
}
