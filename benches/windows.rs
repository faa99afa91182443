//! Windows against wordcount, side by side: throughput of `run windows`
//! (tumbling 1 s, heap) and `run wordcount` at 1,000,000 keys, p=2,
//! checkpoints off; then checkpoints every second with about 1,000,000 open
//! windows and their timers (10,000 records per ms of event time, so that a
//! 1 s window holds nearly every key), heap and RocksDB incremental:
//! throughput, checkpoint duration, timers per checkpoint, timers fired per
//! second.
//!
//! cargo bench --bench windows
//!
//! Each run is a child process of its own (peak memory is its VmHWM), and
//! the configurations are interleaved over the repetitions. Set
//! `TIDEMARK_BENCH_RECORDS` and `TIDEMARK_BENCH_REPS` to change the size.

mod common;

use common::{env_or, median, peak_rss_mib};
use std::process::Command;
use tidemark_cli::{self as cli, RunArgs};

const CHILD: &str = "TIDEMARK_BENCH_CHILD";

/// Name, topology, and arguments beyond records, keys and parallelism.
const CONFIGS: [(&str, &str, &[&str]); 5] = [
    (
        "wordcount, heap, no checkpoints",
        "wordcount",
        &["--checkpoint-interval=off"],
    ),
    (
        "windows 100/ms, heap, no checkpoints",
        "windows",
        &["--checkpoint-interval=off"],
    ),
    (
        "windows 10000/ms, heap, no checkpoints",
        "windows",
        &["--checkpoint-interval=off", "--events-per-ms=10000"],
    ),
    (
        "windows 10000/ms, heap, 1 s checkpoints",
        "windows",
        &["--checkpoint-interval=1s", "--events-per-ms=10000"],
    ),
    (
        "windows 10000/ms, rocksdb incremental, 1 s checkpoints",
        "windows",
        &[
            "--checkpoint-interval=1s",
            "--events-per-ms=10000",
            "--state=rocksdb",
            "--incremental",
        ],
    ),
];

fn child(config: usize, records: u64) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (_, topology, extra) = CONFIGS[config];
    let mut args = vec![
        topology.to_string(),
        format!("--records={records}"),
        "--keys=1000000".to_string(),
        "--parallelism=2".to_string(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    if !extra.contains(&"--checkpoint-interval=off") {
        let checkpoints = dir.path().join("checkpoints");
        args.push(format!("--checkpoint-dir={}", checkpoints.display()));
    }
    if extra.contains(&"--state=rocksdb") {
        args.push(format!(
            "--state-dir={}",
            dir.path().join("state").display()
        ));
    }
    let args = RunArgs::parse(args).expect("valid arguments");
    let r = cli::run(&args).expect("the topology runs");
    println!(
        "{} {} {} {} {}",
        r.throughput_rps,
        r.checkpoint_duration_ms.p50,
        r.timers_in_checkpoint_max,
        r.timers_fired as f64 / r.elapsed_s,
        peak_rss_mib()
    );
}

fn main() {
    let records = env_or("TIDEMARK_BENCH_RECORDS", 20_000_000);
    if let Ok(config) = std::env::var(CHILD) {
        return child(config.parse().expect("a configuration"), records);
    }
    let reps = env_or("TIDEMARK_BENCH_REPS", 3);
    let exe = std::env::current_exe().expect("own path");
    let mut results: Vec<(usize, Vec<f64>)> = Vec::new();
    for _ in 0..reps {
        for config in 0..CONFIGS.len() {
            let out = Command::new(&exe)
                .env(CHILD, config.to_string())
                .output()
                .expect("child runs");
            let line = String::from_utf8_lossy(&out.stdout);
            let fields: Vec<f64> = line
                .split_whitespace()
                .map(|f| f.parse::<f64>().expect("number"))
                .collect();
            assert_eq!(fields.len(), 5, "child output: {line}");
            results.push((config, fields));
        }
    }
    let median_of = |config: usize, field: usize| {
        median(
            results
                .iter()
                .filter(|r| r.0 == config)
                .map(|r| r.1[field])
                .collect(),
        )
    };
    println!(
        "1,000,000 keys, p=2, tumbling 1 s windows, {records} records, {reps} runs each (medians)"
    );
    println!("| configuration | M records/s | vs wordcount | checkpoint p50 ms | most timers in a checkpoint | timers fired/s | peak MiB |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    let wordcount = median_of(0, 0);
    for (config, (name, _, _)) in CONFIGS.iter().enumerate() {
        let rss = results
            .iter()
            .filter(|r| r.0 == config)
            .map(|r| r.1[4])
            .fold(0.0, f64::max);
        println!(
            "| {name} | {:.2} | {:.2} | {:.1} | {:.0} | {:.0} | {rss:.0} |",
            median_of(config, 0) / 1e6,
            median_of(config, 0) / wordcount,
            median_of(config, 1),
            median_of(config, 2),
            median_of(config, 3),
        );
    }
}
