//! A savepoint of 1,000,000 keys and a restore from it, heap and RocksDB
//! state side by side: wordcount p=2 stopped with a savepoint once every key
//! exists, then restored from the savepoint directory.
//!
//! cargo bench --bench savepoint
//!
//! `TIDEMARK_BENCH_KEYS` (default 1,000,000) and `TIDEMARK_BENCH_REPS`
//! (default 3) change the size.

mod common;

use common::{env_or, median};
use tidemark_cli::{self as cli, RunArgs, RunReport};

fn run(args: Vec<String>) -> RunReport {
    cli::run(&RunArgs::parse(args).expect("valid arguments")).expect("wordcount runs")
}

/// (savepoint ms, restore ms, restored bytes) of one round.
fn round(state: &str, keys: u64) -> (f64, f64, u64) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let common = |extra: &[String]| {
        let mut args = vec![
            "wordcount".to_string(),
            format!("--keys={keys}"),
            // Every key exists before the savepoint at 6 s (9 records per
            // key), and the input outlasts it. The rate is one both backends
            // sustain: under backpressure an aligned savepoint also waits
            // for its barriers to pass the full channels.
            format!("--records={}", keys * 10),
            format!("--rate={}", keys * 3 / 2),
            "--parallelism=2".to_string(),
            // No periodic checkpoint within the runs.
            "--checkpoint-interval=1h".to_string(),
            format!("--state={state}"),
            format!("--state-dir={}", dir.path().join("state").display()),
            format!(
                "--checkpoint-dir={}",
                dir.path().join("checkpoints").display()
            ),
            format!(
                "--savepoint-dir={}",
                dir.path().join("savepoints").display()
            ),
        ];
        args.extend_from_slice(extra);
        args
    };
    let stopped = run(common(&["--stop-with-savepoint-after=6s".to_string()]));
    let savepoint = stopped.savepoint.expect("the savepoint completed");
    let restored = run(common(&[format!("--restore={savepoint}")]));
    (
        stopped.savepoint_ms,
        restored.restore_ms,
        restored.restored_bytes,
    )
}

fn main() {
    let keys = env_or("TIDEMARK_BENCH_KEYS", 1_000_000);
    let reps = env_or("TIDEMARK_BENCH_REPS", 3);
    let mut rounds: Vec<(&str, f64, f64, u64)> = Vec::new();
    for _ in 0..reps {
        for state in ["heap", "rocksdb"] {
            let (savepoint, restore, bytes) = round(state, keys);
            rounds.push((state, savepoint, restore, bytes));
        }
    }
    println!("savepoint and restore, wordcount p=2, {keys} keys, {reps} rounds, medians");
    println!("| state | savepoint ms | restore ms | restored MiB |");
    println!("| --- | --- | --- | --- |");
    for state in ["heap", "rocksdb"] {
        let of = |f: fn(&(&str, f64, f64, u64)) -> f64| {
            median(rounds.iter().filter(|r| r.0 == state).map(f).collect())
        };
        println!(
            "| {state} | {:.0} | {:.0} | {:.1} |",
            of(|r| r.1),
            of(|r| r.2),
            of(|r| r.3 as f64) / (1024.0 * 1024.0),
        );
    }
}
