//! What each source reads per second at p=2 into a discarding sink (no
//! checkpoints), side by side in one run, records `{"key": K}` with K a
//! `u64`:
//!
//! - from memory (`Items`, an index source): the runtime's own cost;
//! - the generator (`Generator`, a split source of a split per subtask)
//!   of the same records, and the same generator as an index source (a
//!   `Source` on `Split`, as the generator was before it had splits): what
//!   splits cost;
//! - JSON lines files and Parquet files (one `key` column, row groups of
//!   1,000,000 rows) on local disk, read by the file source;
//! - a Kafka topic of two partitions, when `TIDEMARK_TEST_KAFKA` names a
//!   broker (`cargo xtask test` starts one; so may you), read by the Kafka
//!   source bounded at its end; and, as the baseline, by one plain
//!   librdkafka consumer of both partitions (`testkit::read_committed`,
//!   which parses each value as JSON) in the same process.
//!
//! cargo bench --bench sources
//!
//! `TIDEMARK_BENCH_RECORDS` (default 10,000,000), `TIDEMARK_BENCH_KAFKA_RECORDS`
//! (default 2,000,000) and `TIDEMARK_BENCH_REPS` (default 3) change the size.

mod common;

use arrow_array::{ArrayRef, Int64Array, RecordBatch};
use common::{env_or, into_discard, key, median, write_json_lines};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use tidemark::connectors::files::FileSource;
use tidemark::connectors::kafka::{testkit, KafkaSource};
use tidemark::dataflow::source::{Items, SplitSource};
use tidemark::model::split::{Split, SplitPosition};
use tidemark_actors::prelude::*;
use tidemark_cli::topologies::wordcount::{Generator, Records};

/// Parquet files, as many as `common::write_json_lines` writes.
const FILES: u64 = 8;
const ROW_GROUP: usize = 1_000_000;

/// A record of every source.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Keyed {
    key: u64,
}

/// The generator as an index source: subtask j of P makes the records
/// i ≡ j (mod P).
struct Indexed {
    records: u64,
    split: Split,
}

impl Source<Keyed> for Indexed {
    fn read(&mut self, out: &mut Vec<Keyed>, max: usize) -> Result<SourceStatus, UserError> {
        for _ in 0..max {
            let i = self.split.peek();
            if i >= self.records {
                break;
            }
            out.push(Made.record(i));
            self.split.advance();
        }
        Ok(match self.split.peek() >= self.records {
            true => SourceStatus::Finished,
            false => SourceStatus::Running,
        })
    }

    fn position(&self) -> SplitPosition {
        self.split.position().clone()
    }
}

/// The records again, made by the generator.
#[derive(Clone, Copy)]
struct Made;

impl Records for Made {
    type Record = Keyed;
    fn record(&self, i: u64) -> Keyed {
        Keyed { key: key(i) }
    }
}

fn write_parquet(dir: &Path, records: u64) {
    let props = parquet::file::properties::WriterProperties::builder()
        .set_max_row_group_row_count(Some(ROW_GROUP))
        .build();
    for f in 0..FILES {
        let keys: Vec<i64> = (f..records)
            .step_by(FILES as usize)
            .map(|i| key(i) as i64)
            .collect();
        let column: ArrayRef = Arc::new(Int64Array::from(keys));
        let batch = RecordBatch::try_from_iter([("key", column)]).expect("a batch");
        let file = std::fs::File::create(dir.join(format!("{f}.parquet"))).expect("a file");
        let mut writer =
            parquet::arrow::ArrowWriter::try_new(file, batch.schema(), Some(props.clone()))
                .expect("a writer");
        writer.write(&batch).expect("written");
        writer.close().expect("closed");
    }
}

/// Reads `source` at p=2 into nothing: records/s.
fn read<S: SplitSource<Keyed>>(name: &str, source: S) -> f64 {
    into_discard(Job::builder(name).parallelism(2).split_source(name, source))
}

fn main() {
    let records = env_or("TIDEMARK_BENCH_RECORDS", 10_000_000);
    let kafka_records = env_or("TIDEMARK_BENCH_KAFKA_RECORDS", 2_000_000);
    let reps = env_or("TIDEMARK_BENCH_REPS", 3);
    let (jsonl, parquet) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write_json_lines(jsonl.path(), records);
    write_parquet(parquet.path(), records);
    let jsonl = format!("{}?format=jsonl", jsonl.path().display());
    let parquet = format!("{}?format=parquet", parquet.path().display());
    let items: Arc<Vec<Keyed>> = Arc::new((0..records).map(|i| Keyed { key: key(i) }).collect());
    let kafka = testkit::broker().map(|brokers| {
        let topic = testkit::topic(&brokers, "bench", 2);
        let values: Vec<(i32, String)> = (0..kafka_records)
            .map(|i| ((i % 2) as i32, format!("{{\"key\":{}}}", key(i))))
            .collect();
        testkit::produce(&brokers, &topic, &values);
        (brokers, topic)
    });
    let (mut memory, mut generated, mut indexed) = (vec![], vec![], vec![]);
    let (mut lines, mut columns) = (vec![], vec![]);
    let (mut topic, mut consumer) = (vec![], vec![]);
    for _ in 0..reps {
        let from = items.clone();
        memory.push(into_discard(
            Job::builder("memory")
                .parallelism(2)
                .source("memory", move |ctx| Items::new(from.clone(), ctx)),
        ));
        generated.push(read("generator", Generator::of(records, Made)));
        indexed.push(into_discard(Job::builder("indexed").parallelism(2).source(
            "indexed",
            move |ctx| Indexed {
                records,
                split: ctx.split(),
            },
        )));
        lines.push(read(
            "jsonl",
            FileSource::<Keyed>::from_url(&jsonl).unwrap(),
        ));
        columns.push(read(
            "parquet",
            FileSource::<Keyed>::from_url(&parquet).unwrap(),
        ));
        if let Some((brokers, name)) = &kafka {
            let url = format!("kafka://{brokers}/{name}?bounded=latest");
            topic.push(read("kafka", KafkaSource::<Keyed>::from_url(&url).unwrap()));
            let start = Instant::now();
            let read = testkit::read_committed(brokers, name, 2).len();
            assert_eq!(read as u64, kafka_records, "the plain consumer's records");
            consumer.push(read as f64 / start.elapsed().as_secs_f64());
        }
    }
    let memory = median(memory);
    println!(
        "sources p=2 into discard, {records} records, no checkpoints, {reps} runs each (medians)"
    );
    println!("from memory {:.2} M records/s", memory / 1e6);
    for (name, rates) in [
        ("the generator as an index source", indexed),
        ("the generator as a split source", generated),
        ("JSON lines files", lines),
        ("Parquet files", columns),
    ] {
        let rate = median(rates);
        println!(
            "{name} {:.2} M records/s, {:.3} of memory",
            rate / 1e6,
            rate / memory
        );
    }
    match kafka {
        Some(_) => {
            let (rate, plain) = (median(topic), median(consumer));
            println!(
                "Kafka topic ({kafka_records} records, 2 partitions) {:.2} M records/s, {:.3} of memory; \
                 a plain consumer {:.2} M records/s, the source {:.3} of it",
                rate / 1e6,
                rate / memory,
                plain / 1e6,
                rate / plain
            );
        }
        None => println!("Kafka: skipped (TIDEMARK_TEST_KAFKA is not set)"),
    }
}
