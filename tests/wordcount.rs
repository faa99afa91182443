//! Wordcount's committed output against counts computed here, independently
//! of the runtime, from the generator's definition.

use std::collections::HashMap;
use std::path::Path;
use tidemark_actors::cli::{self, CheckpointInterval, RunArgs, Topology};
use tidemark_actors::wordcount::Emit;

/// SplitMix64, written out again so that the test does not trust the
/// runtime's copy.
fn mix(seed: u64, i: u64) -> u64 {
    let mut z = seed.wrapping_add(i).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn expected_counts(records: u64, keys: u64, seed: u64) -> HashMap<u64, u64> {
    let mut counts = HashMap::new();
    for i in 0..records {
        *counts.entry(mix(seed, i) % keys).or_insert(0) += 1;
    }
    counts
}

/// Lines of the committed files: those directly in `dir` whose names do not
/// start with `.` or `_`.
fn committed(dir: &Path) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        if name.starts_with('.') || name.starts_with('_') {
            continue;
        }
        for line in std::fs::read_to_string(entry.path()).unwrap().lines() {
            let (k, c) = line.split_once(',').expect("key,count");
            out.push((k.parse().unwrap(), c.parse().unwrap()));
        }
    }
    out
}

fn args(
    records: u64,
    keys: u64,
    seed: u64,
    parallelism: u32,
    emit: Emit,
    output: &Path,
) -> RunArgs {
    RunArgs {
        topology: Topology::Wordcount,
        records,
        keys,
        seed,
        parallelism: Some(parallelism),
        rate: None,
        emit,
        output: Some(output.to_path_buf()),
        checkpoint_interval: CheckpointInterval::Off,
        json: true,
    }
}

#[test]
fn final_counts_match_at_every_parallelism() {
    let (records, keys, seed) = (300_000, 5_000, 7);
    let expected = expected_counts(records, keys, seed);
    for parallelism in [1, 2, 3, 5] {
        let dir = tempfile::tempdir().unwrap();
        let report = cli::run(&args(
            records,
            keys,
            seed,
            parallelism,
            Emit::Final,
            dir.path(),
        ))
        .unwrap();
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
    let expected = expected_counts(records, keys, seed);
    for parallelism in [1, 2, 4] {
        let dir = tempfile::tempdir().unwrap();
        cli::run(&args(
            records,
            keys,
            seed,
            parallelism,
            Emit::Updates,
            dir.path(),
        ))
        .unwrap();
        let mut seen: HashMap<u64, Vec<u64>> = HashMap::new();
        for (k, c) in committed(dir.path()) {
            seen.entry(k).or_default().push(c);
        }
        assert_eq!(seen.len(), expected.len());
        for (key, mut counts) in seen {
            counts.sort_unstable();
            let want: Vec<u64> = (1..=expected[&key]).collect();
            assert_eq!(counts, want, "key {key} at p={parallelism}");
        }
    }
}

#[test]
fn updates_for_one_key_arrive_in_increasing_order() {
    // Hash partitioning keeps each key on one channel, which is FIFO: the
    // updates of a key are written in the order they were counted.
    let dir = tempfile::tempdir().unwrap();
    cli::run(&args(100_000, 500, 3, 3, Emit::Updates, dir.path())).unwrap();
    let mut last: HashMap<u64, u64> = HashMap::new();
    for (k, c) in committed(dir.path()) {
        let prev = last.insert(k, c).unwrap_or(0);
        assert_eq!(c, prev + 1, "key {k}");
    }
}

#[test]
fn successive_runs_into_one_directory_keep_both_results() {
    let dir = tempfile::tempdir().unwrap();
    cli::run(&args(10_000, 100, 1, 2, Emit::Final, dir.path())).unwrap();
    cli::run(&args(10_000, 100, 1, 2, Emit::Final, dir.path())).unwrap();
    let total: u64 = committed(dir.path()).iter().map(|(_, c)| c).sum();
    assert_eq!(total, 20_000);
}
