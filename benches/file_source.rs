//! What reading files costs wordcount (p=2, 1,000,000 keys, no
//! checkpoints, results discarded), side by side in one run: the generator
//! against the same number of records as JSON lines (`{"key":K}`) in files
//! on local disk, read by the split source.
//!
//! cargo bench --bench file_source
//!
//! `TIDEMARK_BENCH_RECORDS` (default 20,000,000) and `TIDEMARK_BENCH_REPS`
//! (default 3) change the size.

mod common;

use common::{env_or, median};
use std::io::Write;
use std::path::Path;
use tidemark_actors::cli::{self, RunArgs, RunReport};

const KEYS: u64 = 1_000_000;
const FILES: u64 = 8;

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

/// `records` JSON lines over `FILES` files, keys as the generator draws
/// them.
fn write_json_lines(dir: &Path, records: u64) {
    for f in 0..FILES {
        let file = std::fs::File::create(dir.join(format!("{f}.jsonl"))).expect("a file");
        let mut out = std::io::BufWriter::new(file);
        for i in (f..records).step_by(FILES as usize) {
            let key = tidemark::rng::splitmix64(i) % KEYS;
            writeln!(out, "{{\"key\":{key}}}").expect("written");
        }
        out.flush().expect("flushed");
    }
}

fn main() {
    let records = env_or("TIDEMARK_BENCH_RECORDS", 20_000_000);
    let reps = env_or("TIDEMARK_BENCH_REPS", 3);
    let input = tempfile::tempdir().expect("a temporary directory");
    write_json_lines(input.path(), records);
    let source = format!("--source={}?format=jsonl", input.path().display());
    let (mut generator, mut files) = (vec![], vec![]);
    for _ in 0..reps {
        generator.push(run(records, &[]).throughput_rps);
        let report = run(records, std::slice::from_ref(&source));
        assert_eq!(report.records_in, records, "every line read");
        files.push(report.throughput_rps);
    }
    let (generator, files) = (median(generator), median(files));
    println!(
        "wordcount p=2, {records} records, {KEYS} keys, no checkpoints, {reps} runs each (medians)"
    );
    println!(
        "generator {:.2} M records/s, JSON lines files {:.2} M records/s, ratio {:.3}",
        generator / 1e6,
        files / 1e6,
        files / generator
    );
}
