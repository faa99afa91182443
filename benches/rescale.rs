//! Rescaling a running job: wordcount at p=2 rescaled to 4 at 6 s and to
//! 1 at 9 s (`--rescale-after`), heap and RocksDB state side by side, at
//! 1,000,000 keys. The figure is the pause: from the old attempt's stop to
//! the new one running, restored from the checkpoint the rescale took.
//!
//! cargo bench --bench rescale
//!
//! `TIDEMARK_BENCH_KEYS` (default 1,000,000) and `TIDEMARK_BENCH_REPS`
//! (default 3) change the size. The input runs at 2,000,000 records/s,
//! which both backends sustain, for at least 12 s: at 6 s it has read
//! six records per key of 1,000,000 (every key exists) and 1.2 per key of
//! 10,000,000 (70 % of them do).

mod common;

use common::{env_or, median};
use tidemark_cli::{self as cli, RunArgs, RunReport};

const RATE: u64 = 2_000_000;

/// The pauses of the rescale to 4 and the rescale to 1, in ms.
fn round(state: &str, keys: u64) -> [f64; 2] {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let records = (keys * 3).max(RATE * 12);
    let mut args = vec![
        "wordcount".to_string(),
        format!("--keys={keys}"),
        format!("--records={records}"),
        format!("--rate={RATE}"),
        "--parallelism=2".to_string(),
        "--checkpoint-interval=1s".to_string(),
        "--rescale-after=6s=4".to_string(),
        "--rescale-after=9s=1".to_string(),
        format!("--state={state}"),
        format!(
            "--checkpoint-dir={}",
            dir.path().join("checkpoints").display()
        ),
    ];
    if state == "rocksdb" {
        args.push(format!(
            "--state-dir={}",
            dir.path().join("state").display()
        ));
    }
    let report: RunReport =
        cli::run(&RunArgs::parse(args).expect("valid arguments")).expect("wordcount runs");
    let pause = |i: usize| {
        let rescale = &report.rescales[i];
        assert_eq!(rescale.state, Some("COMPLETED"), "{rescale:?}");
        rescale.pause_ms.expect("a completed rescale paused") as f64
    };
    [pause(0), pause(1)]
}

fn main() {
    let keys = env_or("TIDEMARK_BENCH_KEYS", 1_000_000);
    let reps = env_or("TIDEMARK_BENCH_REPS", 3);
    let mut rounds: Vec<(&str, [f64; 2])> = Vec::new();
    for _ in 0..reps {
        for state in ["heap", "rocksdb"] {
            rounds.push((state, round(state, keys)));
        }
    }
    println!("rescaling wordcount while it runs, {keys} keys, {reps} rounds, medians");
    println!("| state | pause p=2 -> 4, ms | pause p=4 -> 1, ms |");
    println!("| --- | --- | --- |");
    for state in ["heap", "rocksdb"] {
        let of = |i: usize| {
            median(
                rounds
                    .iter()
                    .filter(|r| r.0 == state)
                    .map(|r| r.1[i])
                    .collect(),
            )
        };
        println!("| {state} | {:.0} | {:.0} |", of(0), of(1));
    }
}
