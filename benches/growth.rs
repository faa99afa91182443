//! How the cost of wordcount (p=2) grows with its state: throughput with
//! checkpoints off and every second, checkpoint duration p50, the state a
//! checkpoint references, what one uploads (p50), and peak memory, at
//! 100,000, 1,000,000 and 10,000,000 keys, for heap state and for RocksDB
//! with incremental checkpoints (its default write-back cache of 1,048,576
//! values per subtask). Prints the Markdown table docs/cost-of-state.md shows.
//!
//! cargo bench --bench growth
//!
//! Every run is a child process of its own, so that peak memory belongs to
//! one configuration. `TIDEMARK_BENCH_RECORDS` (default 100,000,000) sets
//! the records of a run; a run has at least ten per key.

mod common;

use common::{child_runs, env_or, run_in_child};

const KEYS: [u64; 3] = [100_000, 1_000_000, 10_000_000];

const BACKENDS: [(&str, &[&str]); 2] = [
    ("heap", &[]),
    ("RocksDB incremental", &["--state=rocksdb", "--incremental"]),
];

fn main() {
    if child_runs() {
        return;
    }
    let records = env_or("TIDEMARK_BENCH_RECORDS", 100_000_000);
    println!("wordcount p=2, {records} records or ten per key, one run per cell");
    println!(
        "| state | keys | M records/s, checkpoints off | M records/s, 1 s checkpoints | ratio | checkpoint p50 ms | state MB | upload p50 MB | peak RSS MiB |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (backend, extra) in BACKENDS {
        for keys in KEYS {
            let run = |interval: &str| {
                let mut args = vec![
                    "wordcount".to_string(),
                    format!("--records={}", records.max(10 * keys)),
                    format!("--keys={keys}"),
                    "--parallelism=2".to_string(),
                    format!("--checkpoint-interval={interval}"),
                ];
                args.extend(extra.iter().map(|a| a.to_string()));
                run_in_child(&args)
            };
            let off = run("off");
            let on = run("1s");
            let (off_rps, on_rps) = (off.number("/throughput_rps"), on.number("/throughput_rps"));
            println!(
                "| {backend} | {keys} | {:.2} | {:.2} | {:.2} | {:.1} | {:.1} | {:.2} | {:.0} |",
                off_rps / 1e6,
                on_rps / 1e6,
                on_rps / off_rps,
                on.number("/checkpoint_duration_ms/p50"),
                on.number("/checkpointed_bytes_full") / 1e6,
                on.number("/bytes_uploaded_per_checkpoint/p50") / 1e6,
                off.peak_rss_mib.max(on.peak_rss_mib),
            );
        }
    }
}
