//! The interval join against wordcount, side by side in one run, and its
//! checkpoints under backpressure.
//!
//! 1. `run join` (two sources, interval join ±20 ms, 100 records per ms of
//!    event time) and `run wordcount`, both at 100,000 keys and p=2, without
//!    checkpoints and with 1 s checkpoints: input records per second (over
//!    both sources of the join), the checkpoint duration p50, the pairs the
//!    join emitted. Wordcount reads more records, so that both run for
//!    seconds and take periodic checkpoints.
//! 2. The join with subtask 0 of the join operator slow (`--slow-subtask 0
//!    --slow-ns`), so that its input channels from both sources are full when
//!    the barriers come, 1 s checkpoints, aligned against unaligned:
//!    checkpoint duration, throughput and the in-flight bytes persisted.
//!
//! cargo bench --bench join
//!
//! Each run is a child process of its own, and the configurations are
//! interleaved over the repetitions. `TIDEMARK_BENCH_RECORDS` (records per
//! join side in part 1, default 3,000,000), `TIDEMARK_BENCH_WORDCOUNT_RECORDS`
//! (default 40,000,000), `TIDEMARK_BENCH_SLOW_RECORDS`
//! (per side in part 2, default 400,000), `TIDEMARK_BENCH_SLOW_NS` (default
//! 10,000 ns per record at the slow subtask) and `TIDEMARK_BENCH_REPS`
//! (default 3) change the size.

mod common;

use common::{env_or, median};
use std::process::Command;
use tidemark_cli::{self as cli, RunArgs};

const CHILD: &str = "TIDEMARK_BENCH_CHILD";

/// Part 1: name, topology, checkpoints.
const THROUGHPUT: [(&str, &str, bool); 4] = [
    ("wordcount, no checkpoints", "wordcount", false),
    ("join, no checkpoints", "join", false),
    ("wordcount, 1 s checkpoints", "wordcount", true),
    ("join, 1 s checkpoints", "join", true),
];

/// `--records` of part 1: per side for the join, in all for wordcount.
fn records(topology: &str) -> u64 {
    match topology {
        "join" => env_or("TIDEMARK_BENCH_RECORDS", 3_000_000),
        _ => env_or("TIDEMARK_BENCH_WORDCOUNT_RECORDS", 40_000_000),
    }
}

/// Part 2: the checkpoint modes compared.
const MODES: [&str; 2] = ["--mode=aligned", "--mode=unaligned"];

/// The figures a child prints, in this order.
const FIELDS: usize = 8;

/// Runs configuration `config` (part 1 first, then part 2) once and prints
/// its figures on one line.
fn child(config: usize) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut args = vec!["--keys=100000".to_string(), "--parallelism=2".to_string()];
    let checkpoints = if let Some(&(_, topology, checkpoints)) = THROUGHPUT.get(config) {
        args.extend([
            topology.to_string(),
            format!("--records={}", records(topology)),
        ]);
        checkpoints
    } else {
        let records = env_or("TIDEMARK_BENCH_SLOW_RECORDS", 400_000);
        let slow_ns = env_or("TIDEMARK_BENCH_SLOW_NS", 10_000);
        args.extend([
            "join".to_string(),
            format!("--records={records}"),
            "--slow-subtask=0".to_string(),
            format!("--slow-ns={slow_ns}"),
            MODES[config - THROUGHPUT.len()].to_string(),
        ]);
        true
    };
    if checkpoints {
        args.push("--checkpoint-interval=1s".to_string());
        args.push(format!("--checkpoint-dir={}", dir.path().display()));
    } else {
        args.push("--checkpoint-interval=off".to_string());
    }
    let r = cli::run(&RunArgs::parse(args).expect("valid arguments")).expect("the topology runs");
    assert_eq!(
        r.join_buffered_at_end, 0,
        "the final watermark empties the join"
    );
    println!(
        "{} {} {} {} {} {} {} {}",
        r.throughput_rps,
        r.checkpoint_duration_ms.p50,
        r.checkpoint_duration_ms.max,
        r.checkpoints_completed,
        r.pairs_emitted,
        r.persisted_inflight_bytes.max,
        r.persisted_inflight_batches_per_channel_max,
        r.elapsed_s,
    );
}

fn main() {
    if let Ok(config) = std::env::var(CHILD) {
        return child(config.parse().expect("a configuration"));
    }
    let slow_records = env_or("TIDEMARK_BENCH_SLOW_RECORDS", 400_000);
    let slow_ns = env_or("TIDEMARK_BENCH_SLOW_NS", 10_000);
    let reps = env_or("TIDEMARK_BENCH_REPS", 3);
    let exe = std::env::current_exe().expect("own path");
    let configs = THROUGHPUT.len() + MODES.len();
    let mut results: Vec<(usize, Vec<f64>)> = Vec::new();
    for _ in 0..reps {
        for config in 0..configs {
            let out = Command::new(&exe)
                .env(CHILD, config.to_string())
                .output()
                .expect("child runs");
            let line = String::from_utf8_lossy(&out.stdout);
            let fields: Vec<f64> = line
                .split_whitespace()
                .map(|f| f.parse::<f64>().expect("number"))
                .collect();
            assert_eq!(
                fields.len(),
                FIELDS,
                "child output: {line}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            results.push((config, fields));
        }
    }
    let of = |config: usize, field: usize| -> Vec<f64> {
        results
            .iter()
            .filter(|r| r.0 == config)
            .map(|r| r.1[field])
            .collect()
    };
    let median_of = |config: usize, field: usize| median(of(config, field));
    let max_of = |config: usize, field: usize| of(config, field).into_iter().fold(0.0, f64::max);

    println!(
        "100,000 keys, p=2, join {} input records ({} per side), wordcount {}, {reps} runs each (medians)",
        2 * records("join"),
        records("join"),
        records("wordcount"),
    );
    println!("| configuration | M input records/s | join / wordcount | checkpoint p50 ms | checkpoints | pairs | run s |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for (config, &(name, topology, checkpoints)) in THROUGHPUT.iter().enumerate() {
        let rps = median_of(config, 0);
        let ratio = if topology == "join" {
            format!("{:.2}", rps / median_of(config - 1, 0))
        } else {
            String::new()
        };
        let p50 = if checkpoints {
            format!("{:.1}", median_of(config, 1))
        } else {
            "-".to_string()
        };
        println!(
            "| {name} | {:.2} | {ratio} | {p50} | {:.0} | {:.0} | {:.1} |",
            rps / 1e6,
            median_of(config, 3),
            median_of(config, 4),
            median_of(config, 7),
        );
    }
    println!();
    println!(
        "join, 100,000 keys, p=2, {slow_records} records per side, subtask 0 of the join at {slow_ns} ns/record, 1 s checkpoints, {reps} runs per mode (medians)"
    );
    println!("| mode | checkpoint p50 ms | vs aligned | checkpoint max ms | checkpoints | records/s | persisted in flight max bytes | batches per channel max | run s |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let aligned = THROUGHPUT.len();
    for (i, mode) in MODES.iter().enumerate() {
        let config = aligned + i;
        println!(
            "| {mode} | {:.1} | {:.3} | {:.1} | {:.0} | {:.0} | {:.0} | {:.0} | {:.1} |",
            median_of(config, 1),
            median_of(config, 1) / median_of(aligned, 1),
            median_of(config, 2),
            median_of(config, 3),
            median_of(config, 0),
            max_of(config, 5),
            max_of(config, 6),
            median_of(config, 7),
        );
    }
}
