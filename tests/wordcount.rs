//! Wordcount's committed output against counts computed here, independently
//! of the runtime, from the generator's definition.

use tidemark_testkit as common;

use common::{assert_updates_exactly_once, committed, expected_counts};
use std::collections::HashMap;
use std::path::Path;
use tidemark_cli::{self as cli, RunArgs};

fn args(
    records: u64,
    keys: u64,
    seed: u64,
    parallelism: u32,
    emit: &str,
    output: &Path,
) -> RunArgs {
    RunArgs::parse([
        "wordcount".to_string(),
        format!("--records={records}"),
        format!("--keys={keys}"),
        format!("--seed={seed}"),
        format!("--parallelism={parallelism}"),
        format!("--emit={emit}"),
        format!("--output={}", output.display()),
        "--checkpoint-interval=off".to_string(),
    ])
    .unwrap()
}

#[test]
fn final_counts_match_at_every_parallelism() {
    let (records, keys, seed) = (300_000, 5_000, 7);
    let expected = expected_counts(records, keys, seed);
    for parallelism in [1, 2, 3, 5] {
        let dir = tempfile::tempdir().unwrap();
        let report =
            cli::run(&args(records, keys, seed, parallelism, "final", dir.path())).unwrap();
        assert_eq!(report.records_in, records);
        let lines = committed(dir.path());
        assert_eq!(
            lines.len(),
            expected.len(),
            "one line per key at p={parallelism}"
        );
        let got: HashMap<u64, u64> = lines.into_iter().collect();
        assert_eq!(got, expected, "final counts at p={parallelism}");
    }
}

#[test]
fn updates_hold_every_count_of_every_key_exactly_once() {
    let (records, keys, seed) = (200_000, 3_000, 11);
    for parallelism in [1, 2, 4] {
        let dir = tempfile::tempdir().unwrap();
        cli::run(&args(
            records,
            keys,
            seed,
            parallelism,
            "updates",
            dir.path(),
        ))
        .unwrap();
        assert_updates_exactly_once(dir.path(), records, keys, seed, &format!("p={parallelism}"));
    }
}

#[test]
fn updates_for_one_key_arrive_in_increasing_order() {
    // Hash partitioning keeps each key on one channel, which is FIFO: the
    // updates of a key are written in the order they were counted.
    let dir = tempfile::tempdir().unwrap();
    cli::run(&args(100_000, 500, 3, 3, "updates", dir.path())).unwrap();
    let mut last: HashMap<u64, u64> = HashMap::new();
    for (k, c) in committed(dir.path()) {
        let prev = last.insert(k, c).unwrap_or(0);
        assert_eq!(c, prev + 1, "key {k}");
    }
}

#[test]
fn successive_runs_into_one_directory_keep_both_results() {
    let dir = tempfile::tempdir().unwrap();
    cli::run(&args(10_000, 100, 1, 2, "final", dir.path())).unwrap();
    cli::run(&args(10_000, 100, 1, 2, "final", dir.path())).unwrap();
    let total: u64 = committed(dir.path()).iter().map(|(_, c)| c).sum();
    assert_eq!(total, 20_000);
}
