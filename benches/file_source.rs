//! What reading files costs wordcount (p=2, 1,000,000 keys, no
//! checkpoints, results discarded), side by side in one run:
//!
//! - the command line's generator (`u64` keys) against the same number of
//!   records as JSON lines (`{"key":K}`) in files on local disk, read by
//!   the split source (the keys are text then);
//! - embedded, the same text keys from memory (`Items`) against from the
//!   files, through the same steps: the cost of the file source alone.
//!
//! cargo bench --bench file_source
//!
//! `TIDEMARK_BENCH_RECORDS` (default 20,000,000) and `TIDEMARK_BENCH_REPS`
//! (default 3) change the size.

mod common;

use common::{env_or, into_discard, key, median, write_json_lines};
use std::sync::Arc;
use tidemark::connectors::files::FileSource;
use tidemark::dataflow::source::Items;
use tidemark_actors::prelude::*;
use tidemark_cli::topologies::wordcount::{Counter, Emit, KeyField};
use tidemark_cli::{self as cli, RunArgs, RunReport};

const KEYS: u64 = 1_000_000;

fn run(records: u64, extra: &[String]) -> RunReport {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut args = vec![
        "wordcount".to_string(),
        format!("--records={records}"),
        format!("--keys={KEYS}"),
        "--parallelism=2".to_string(),
        "--checkpoint-interval=off".to_string(),
        format!("--checkpoint-dir={}", dir.path().display()),
    ];
    args.extend_from_slice(extra);
    cli::run(&RunArgs::parse(args).expect("valid arguments")).expect("wordcount runs")
}

/// Counts the text keys of `keys` at p=2 into nothing: records/s.
fn count(keys: tidemark::Stream<String>) -> f64 {
    into_discard(
        keys.key_by(|key: &String| key.clone())
            .process("count", |states| Counter::open(states, Emit::Final)),
    )
}

fn main() {
    let records = env_or("TIDEMARK_BENCH_RECORDS", 20_000_000);
    let reps = env_or("TIDEMARK_BENCH_REPS", 3);
    let input = tempfile::tempdir().expect("a temporary directory");
    write_json_lines(input.path(), records);
    let url = format!("{}?format=jsonl", input.path().display());
    let texts: Arc<Vec<String>> = Arc::new((0..records).map(|i| key(i).to_string()).collect());
    let (mut generator, mut files, mut memory, mut embedded) = (vec![], vec![], vec![], vec![]);
    for _ in 0..reps {
        generator.push(run(records, &[]).throughput_rps);
        let report = run(records, &[format!("--source={url}")]);
        assert_eq!(report.records_in, records, "every line read");
        files.push(report.throughput_rps);
        let from = texts.clone();
        memory.push(count(
            Job::builder("in-memory")
                .parallelism(2)
                .source("keys", move |ctx| Items::new(from.clone(), ctx)),
        ));
        let source = FileSource::<KeyField>::from_url(&url).expect("the files");
        embedded.push(count(
            Job::builder("files")
                .parallelism(2)
                .split_source("files", source)
                .map(KeyField::into_key),
        ));
    }
    let (generator, files) = (median(generator), median(files));
    let (memory, embedded) = (median(memory), median(embedded));
    println!(
        "wordcount p=2, {records} records, {KEYS} keys, no checkpoints, {reps} runs each (medians)"
    );
    println!(
        "command line: generator (u64 keys) {:.2} M records/s, JSON lines files (text keys) {:.2} M records/s, ratio {:.3}",
        generator / 1e6,
        files / 1e6,
        files / generator
    );
    println!(
        "embedded, text keys: from memory {:.2} M records/s, from JSON lines files {:.2} M records/s, ratio {:.3}",
        memory / 1e6,
        embedded / 1e6,
        embedded / memory
    );
}
