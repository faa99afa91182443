//! What tests of Kafka jobs need of a real broker: its address from the
//! environment (`cargo xtask test` starts one), new topics, records written
//! into them and what a `read_committed` consumer sees.

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message as _;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// The broker's `HOST:PORT`; `None` skips the test, unless
/// `TIDEMARK_REQUIRE_KAFKA` says the Kafka cases must run.
pub fn broker() -> Option<String> {
    match std::env::var("TIDEMARK_TEST_KAFKA") {
        Ok(brokers) => Some(brokers),
        Err(_) => {
            let required =
                std::env::var("TIDEMARK_REQUIRE_KAFKA").is_ok_and(|v| !v.is_empty() && v != "0");
            assert!(
                !required,
                "TIDEMARK_REQUIRE_KAFKA is set but TIDEMARK_TEST_KAFKA is not"
            );
            eprintln!("skipped: TIDEMARK_TEST_KAFKA is not set (cargo xtask test sets it)");
            None
        }
    }
}

/// A new topic of `partitions` partitions, named after `test` and the time.
pub fn topic(brokers: &str, test: &str, partitions: i32) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let name = format!("{test}-{nanos:x}");
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let topics = [NewTopic::new(&name, partitions, TopicReplication::Fixed(1))];
    let created =
        futures::executor::block_on(admin.create_topics(&topics, &AdminOptions::new())).unwrap();
    for result in created {
        result.unwrap();
    }
    name
}

/// Writes `(partition, value)` records without a transaction.
///
/// Each partition's last record goes alone, in a later millisecond than
/// the others: nisshi 0.7 answers `ListOffsets(latest)` (what a bounded
/// source ends at) with the base offset of the batch it stored last, by
/// time to the millisecond, plus one.
pub fn produce(brokers: &str, topic: &str, records: &[(i32, String)]) {
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let mut last = BTreeMap::new();
    for (i, (partition, _)) in records.iter().enumerate() {
        last.insert(*partition, i);
    }
    let send = |(partition, value): &(i32, String)| {
        let record = BaseRecord::<(), _>::to(topic)
            .partition(*partition)
            .payload(value);
        producer.send(record).map_err(|(e, _)| e).unwrap();
    };
    for (i, record) in records.iter().enumerate() {
        if last.get(&record.0) != Some(&i) {
            send(record);
            producer.poll(Duration::ZERO);
        }
    }
    producer.flush(Duration::from_secs(30)).unwrap();
    let written = std::time::SystemTime::now();
    while written.elapsed().unwrap_or_default() < Duration::from_millis(2) {
        std::hint::spin_loop();
    }
    for &i in last.values() {
        send(&records[i]);
        producer.flush(Duration::from_secs(30)).unwrap();
    }
}

/// Every value a `read_committed` consumer sees in the topic's first
/// `partitions` partitions, as JSON, by partition in offset order, up to
/// the last stable offset: transactions still open hide what follows.
pub fn read_committed(brokers: &str, topic: &str, partitions: i32) -> Vec<serde_json::Value> {
    read(brokers, topic, partitions, false)
}

/// [`read_committed`] once every transaction in the topic has ended: the
/// consumer reads to the high watermark, waiting for the markers of the
/// last transactions. For a topic whose writer has finished; a read that
/// stops at the last stable offset may miss a commit whose markers are
/// still being written.
pub fn read_settled(brokers: &str, topic: &str, partitions: i32) -> Vec<serde_json::Value> {
    read(brokers, topic, partitions, true)
}

fn read(brokers: &str, topic: &str, partitions: i32, settled: bool) -> Vec<serde_json::Value> {
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "tidemark-test-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .create()
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    for partition in 0..partitions {
        assignment
            .add_partition_offset(topic, partition, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let (mut values, mut ended) = (BTreeMap::<i32, Vec<_>>::new(), BTreeSet::new());
    let deadline = Instant::now() + Duration::from_secs(60);
    while ended.len() < partitions as usize {
        assert!(Instant::now() < deadline, "the topic {topic} never ended");
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(message)) => values
                .entry(message.partition())
                .or_default()
                .push(serde_json::from_slice(message.payload().unwrap()).unwrap()),
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(partition)))
                if !settled || at_high_watermark(&consumer, topic, partition) =>
            {
                ended.insert(partition);
            }
            // At the last stable offset, before the high watermark.
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => {}
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            None => {}
        }
    }
    values.into_values().flatten().collect()
}

/// Whether `consumer` has read `partition` up to its high watermark.
fn at_high_watermark(consumer: &BaseConsumer, topic: &str, partition: i32) -> bool {
    let (_, high) = consumer
        .fetch_watermarks(topic, partition, Duration::from_secs(10))
        .unwrap();
    let position = consumer.position().unwrap();
    let at = position
        .find_partition(topic, partition)
        .and_then(|p| p.offset().to_raw());
    at.is_some_and(|at| at >= high)
}
