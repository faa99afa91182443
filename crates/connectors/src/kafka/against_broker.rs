//! The source and sink against a real Kafka-API broker (`cargo xtask test`
//! starts one and sets `TIDEMARK_TEST_KAFKA` to its `HOST:PORT`), driven
//! call by call as subtasks and checkpoints drive them, with crashes as
//! dropped sinks.

use super::testkit::{broker, produce, read_committed, topic};
use super::*;
use std::sync::Arc;
use std::time::Instant;
use tidemark_core::dataflow::source::{SourceStatus, SplitEnumerator, SplitSource};
use tidemark_core::model::ids::{CheckpointId, SubtaskIndex};
use tidemark_core::{Sink, SinkContext};

fn counts(rows: &[(&str, u64)]) -> Vec<serde_json::Value> {
    rows.iter()
        .map(|(key, count)| serde_json::json!({"key": key, "count": count}))
        .collect()
}

fn sink_options(brokers: &str, topic: &str, delivery: &str) -> Arc<KafkaSinkOptions> {
    let url = format!("kafka://{brokers}/{topic}?delivery={delivery}");
    Arc::new(KafkaSinkOptions::from_url(&url).unwrap())
}

fn sink(options: &Arc<KafkaSinkOptions>, subtask: u32) -> KafkaSink<(String, u64)> {
    KafkaSink::new(
        options.clone(),
        SinkContext {
            subtask: SubtaskIndex(subtask),
            parallelism: 2,
            attempt: tidemark_core::model::ids::Attempt::default(),
        },
    )
}

fn write(sink: &mut KafkaSink<(String, u64)>, rows: &[(&str, u64)]) {
    let mut records = rows.iter().map(|(k, c)| (k.to_string(), *c)).collect();
    sink.write(&mut records).unwrap();
}

#[test]
fn partitions_are_splits_read_from_their_offsets_to_a_bounded_end() {
    let Some(brokers) = broker() else { return };
    let topic = topic(&brokers, "source", 3);
    let records: Vec<_> = (0..30)
        .map(|i| (i % 3, format!(r#"{{"key":"k{i}","n":{i}}}"#)))
        .collect();
    produce(&brokers, &topic, &records);
    let url = format!("kafka://{brokers}/{topic}?bounded=latest");
    let source = KafkaSource::<serde_json::Value>::from_url(&url).unwrap();
    let found =
        futures::executor::block_on(source.discover(KnownPartitions::default(), 2)).unwrap();
    assert_eq!(found.state.partitions.len(), 3);
    assert_eq!(source.monitor_interval(), None, "bounded: one discovery");
    let mut keys = Vec::new();
    for split in found.splits {
        assert_eq!((split.offset, split.end), (0, Some(10)));
        // Read four, then resume a reader from the position it reports.
        let mut first = source.open(split).unwrap();
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while out.len() < 4 {
            assert!(Instant::now() < deadline);
            let wanted = 4 - out.len();
            first.read(&mut out, wanted).unwrap();
        }
        let mut rest = source.open(first.split()).unwrap();
        while rest.read(&mut out, 100).unwrap() == SourceStatus::Running {
            assert!(Instant::now() < deadline, "the split never ended");
        }
        assert_eq!(out.len(), 10);
        assert!(
            out.iter().all(|v| v["ts"].is_u64()),
            "ts from the record: {out:?}"
        );
        keys.extend(out.iter().map(|v| v["n"].as_u64().unwrap()));
    }
    keys.sort_unstable();
    assert_eq!(keys, (0..30).collect::<Vec<_>>());
}

#[test]
fn a_topic_that_does_not_exist_fails_the_discovery_naming_it() {
    let Some(brokers) = broker() else { return };
    let source =
        KafkaSource::<String>::from_url(&format!("kafka://{brokers}/no-such-topic")).unwrap();
    let error = futures::executor::block_on(source.discover(KnownPartitions::default(), 2))
        .err()
        .expect("no topic")
        .to_string();
    assert!(
        error.contains("no-such-topic") && error.contains("does not exist"),
        "{error}"
    );
}

#[test]
fn exactly_once_rows_appear_when_their_checkpoint_completes_and_never_twice() {
    let Some(brokers) = broker() else { return };
    let topic = topic(&brokers, "exactly-once", 1);
    let options = sink_options(&brokers, &topic, "exactly-once");
    let mut first = sink(&options, 0);
    first.restore(None).unwrap();
    write(&mut first, &[("a", 1), ("b", 1)]);
    let one = first.pre_commit(CheckpointId(1)).unwrap();
    assert!(
        read_committed(&brokers, &topic, 1).is_empty(),
        "not before completion"
    );
    first.commit(CheckpointId(1)).unwrap();
    assert_eq!(
        read_committed(&brokers, &topic, 1),
        counts(&[("a", 1), ("b", 1)])
    );

    // Crash after checkpoint 2 completed but before the sink committed
    // it, with rows of checkpoint 3 written.
    write(&mut first, &[("a", 2)]);
    let two = first.pre_commit(CheckpointId(2)).unwrap();
    write(&mut first, &[("c", 1)]);
    drop(first);
    let mut second = sink(&options, 0);
    second.restore(Some(&two)).unwrap();
    let expected = counts(&[("a", 1), ("b", 1), ("a", 2)]);
    assert_eq!(read_committed(&brokers, &topic, 1), expected);

    // Restored from 1 again (2 was committed): nothing is sent twice.
    drop(second);
    let mut third = sink(&options, 0);
    third.restore(Some(&one)).unwrap();
    third.restore(Some(&two)).unwrap();
    assert_eq!(read_committed(&brokers, &topic, 1), expected);
}

#[test]
fn exactly_once_a_removed_subtasks_rows_go_out_under_its_own_producer() {
    let Some(brokers) = broker() else { return };
    let topic = topic(&brokers, "adopt", 1);
    let options = sink_options(&brokers, &topic, "exactly-once");
    let (mut kept, mut removed) = (sink(&options, 0), sink(&options, 1));
    kept.restore(None).unwrap();
    removed.restore(None).unwrap();
    write(&mut kept, &[("a", 1)]);
    write(&mut removed, &[("b", 1)]);
    let kept_state = kept.pre_commit(CheckpointId(1)).unwrap();
    let removed_state = removed.pre_commit(CheckpointId(1)).unwrap();
    drop((kept, removed));
    // Rescaled to one subtask from checkpoint 1.
    let mut only = sink(&options, 0);
    only.restore(Some(&kept_state)).unwrap();
    only.adopt(&removed_state).unwrap();
    let mut seen = read_committed(&brokers, &topic, 1);
    seen.sort_by_key(|v| v["key"].to_string());
    assert_eq!(seen, counts(&[("a", 1), ("b", 1)]));
}

#[test]
fn at_least_once_every_row_is_in_kafka_when_the_barrier_passes() {
    let Some(brokers) = broker() else { return };
    let topic = topic(&brokers, "at-least-once", 1);
    let options = sink_options(&brokers, &topic, "at-least-once");
    let mut sink = sink(&options, 0);
    sink.restore(None).unwrap();
    write(&mut sink, &[("a", 1), ("b", 2)]);
    assert!(sink.pre_commit(CheckpointId(1)).unwrap().is_empty());
    assert_eq!(
        read_committed(&brokers, &topic, 1),
        counts(&[("a", 1), ("b", 2)])
    );
}

#[test]
fn exactly_once_a_new_job_under_the_same_id_is_not_hidden_by_the_old_ones_marker() {
    let Some(brokers) = broker() else { return };
    let topic = topic(&brokers, "new-run", 1);
    let options = sink_options(&brokers, &topic, "exactly-once");
    let mut old = sink(&options, 0);
    old.restore(None).unwrap();
    write(&mut old, &[("a", 1)]);
    old.pre_commit(CheckpointId(5)).unwrap();
    old.commit(CheckpointId(5)).unwrap();
    drop(old);
    // A fresh job numbers its checkpoints from 1 again; its first one
    // completes, then it crashes before committing it.
    let mut new = sink(&options, 0);
    new.restore(None).unwrap();
    write(&mut new, &[("b", 1)]);
    let one = new.pre_commit(CheckpointId(1)).unwrap();
    drop(new);
    let mut restored = sink(&options, 0);
    restored.restore(Some(&one)).unwrap();
    assert_eq!(
        read_committed(&brokers, &topic, 1),
        counts(&[("a", 1), ("b", 1)])
    );
}
