//! Wordcount throughput and peak memory: heap state at parallelism 1 and 2
//! over 100,000 keys, and heap against RocksDB state at parallelism 2 over
//! 1,000,000 keys (RocksDB with its default write-back cache, which holds
//! every key there, and with a cache of 65,536 values, which makes most
//! records read RocksDB).
//!
//! cargo bench --bench wordcount
//!
//! Each measurement runs in a child process of its own, so that peak memory
//! (VmHWM) belongs to one configuration; the configurations are interleaved
//! over the repetitions so that a noisy neighbour hits all alike. Set
//! `TIDEMARK_BENCH_RECORDS` and `TIDEMARK_BENCH_REPS` to change the size.

mod common;

use common::{child_runs, env_or, median, run_in_child};

/// Name, and arguments beyond the records and the disabled checkpoints.
const CONFIGS: [(&str, &[&str]); 5] = [
    (
        "heap, 100,000 keys, p=1",
        &["--keys=100000", "--parallelism=1"],
    ),
    (
        "heap, 100,000 keys, p=2",
        &["--keys=100000", "--parallelism=2"],
    ),
    (
        "heap, 1,000,000 keys, p=2",
        &["--keys=1000000", "--parallelism=2"],
    ),
    (
        "rocksdb, 1,000,000 keys, p=2",
        &["--keys=1000000", "--parallelism=2", "--state=rocksdb"],
    ),
    (
        "rocksdb cache 65536, 1,000,000 keys, p=2",
        &[
            "--keys=1000000",
            "--parallelism=2",
            "--state=rocksdb",
            "--state-cache-entries=65536",
        ],
    ),
];

fn main() {
    if child_runs() {
        return;
    }
    let records = env_or("TIDEMARK_BENCH_RECORDS", 20_000_000);
    let reps = env_or("TIDEMARK_BENCH_REPS", 3);
    let mut results: Vec<(usize, f64, f64)> = Vec::new();
    for _ in 0..reps {
        for (config, (_, extra)) in CONFIGS.iter().enumerate() {
            let mut args = vec![
                "wordcount".to_string(),
                format!("--records={records}"),
                "--checkpoint-interval=off".to_string(),
            ];
            args.extend(extra.iter().map(|a| a.to_string()));
            let run = run_in_child(&args);
            results.push((config, run.number("/throughput_rps"), run.peak_rss_mib));
        }
    }
    println!("wordcount, {records} records, checkpoints off, {reps} runs each");
    println!("| configuration | median M records/s | best | vs heap at the same keys | peak MiB |");
    println!("| --- | --- | --- | --- | --- |");
    let medians: Vec<f64> = (0..CONFIGS.len())
        .map(|c| median(results.iter().filter(|r| r.0 == c).map(|r| r.1).collect()))
        .collect();
    for (config, (name, args)) in CONFIGS.iter().enumerate() {
        let rps: Vec<f64> = results
            .iter()
            .filter(|r| r.0 == config)
            .map(|r| r.1)
            .collect();
        let rss = results
            .iter()
            .filter(|r| r.0 == config)
            .map(|r| r.2)
            .fold(0.0, f64::max);
        let best = rps.iter().copied().fold(0.0, f64::max);
        // The heap configuration with the same keys and parallelism.
        let heap = CONFIGS
            .iter()
            .position(|(n, a)| n.starts_with("heap") && a[..2] == args[..2])
            .expect("a heap configuration for every key count");
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {rss:.0} |",
            medians[config] / 1e6,
            best / 1e6,
            medians[config] / medians[heap],
        );
    }
    println!("heap p=2 / p=1 (medians): {:.2}", medians[1] / medians[0]);
}
