//! The cost of the wire: wordcount at p=4 over 100,000 keys with every
//! subtask in one worker, against the same job over 2 workers in this
//! process (`--local-workers=2`: half the channels cross loopback TCP,
//! encoded once per batch, credit-based), with checkpoints off and every
//! second; and the time from a killed worker (all its subtasks, its link
//! ends closed) to the restored attempt running, against a killed subtask
//! in one worker.
//!
//! cargo bench --bench workers
//!
//! Each run is a child process of its own and the configurations are
//! interleaved over the repetitions, so that a noisy neighbour hits all
//! alike. `TIDEMARK_BENCH_RECORDS` and `TIDEMARK_BENCH_REPS` change the size.

mod common;

use common::{child_runs, env_or, median, run_in_child};

/// Name and the arguments that differ.
const CONFIGS: [(&str, &[&str]); 6] = [
    (
        "1 worker, checkpoints off",
        &["--local-workers=0", "--checkpoint-interval=off"],
    ),
    (
        "2 workers, checkpoints off",
        &["--local-workers=2", "--checkpoint-interval=off"],
    ),
    (
        "1 worker, 1 s checkpoints",
        &["--local-workers=0", "--checkpoint-interval=1s"],
    ),
    (
        "2 workers, 1 s checkpoints",
        &["--local-workers=2", "--checkpoint-interval=1s"],
    ),
    (
        "1 worker, 1 s checkpoints, a subtask killed",
        &[
            "--local-workers=0",
            "--checkpoint-interval=1s",
            "--inject-failures=1",
        ],
    ),
    (
        "2 workers, 1 s checkpoints, a worker killed",
        &[
            "--local-workers=2",
            "--checkpoint-interval=1s",
            "--inject-failures=1",
        ],
    ),
];

fn main() {
    if child_runs() {
        return;
    }
    let records = env_or("TIDEMARK_BENCH_RECORDS", 150_000_000);
    let reps = env_or("TIDEMARK_BENCH_REPS", 3);
    // (config, M records/s, checkpoint p50 ms, link bytes per record,
    // recovery p50 ms)
    let mut results: Vec<(usize, f64, f64, f64, f64)> = Vec::new();
    for _ in 0..reps {
        for (config, (_, extra)) in CONFIGS.iter().enumerate() {
            let mut args = vec![
                "wordcount".to_string(),
                format!("--records={records}"),
                "--keys=100000".to_string(),
                "--parallelism=4".to_string(),
            ];
            args.extend(extra.iter().map(|a| a.to_string()));
            let run = run_in_child(&args);
            results.push((
                config,
                run.number("/throughput_rps") / 1e6,
                run.number("/checkpoint_duration_ms/p50"),
                run.number("/link_bytes_sent") / records as f64,
                run.number("/recovery_ms/p50"),
            ));
        }
    }
    let of = |config: usize, pick: fn(&(usize, f64, f64, f64, f64)) -> f64| {
        median(results.iter().filter(|r| r.0 == config).map(pick).collect())
    };
    println!("wordcount p=4, 100,000 keys, {records} records, median of {reps} runs");
    println!(
        "| configuration | M records/s | vs 1 worker | checkpoint p50 ms | link bytes per record | recovery p50 ms |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for (config, (name, _)) in CONFIGS.iter().enumerate() {
        let rps = of(config, |r| r.1);
        let base = of(config - config % 2, |r| r.1);
        println!(
            "| {name} | {rps:.2} | {:.2} | {:.1} | {:.2} | {:.1} |",
            rps / base,
            of(config, |r| r.2),
            of(config, |r| r.3),
            of(config, |r| r.4),
        );
    }
}
