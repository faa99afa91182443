//! What checkpoints cost wordcount (p=2), side by side in one run:
//! throughput with 1 s checkpoints against none, checkpoint duration at
//! 100,000 and 1,000,000 keys, and the time from an injected failure to the
//! restored attempt running, at 1,000,000 keys.
//!
//! cargo bench --bench checkpoints
//!
//! `TIDEMARK_BENCH_RECORDS` (default 200,000,000) and `TIDEMARK_BENCH_REPS`
//! (default 3) change the size.

mod common;

use common::{env_or, median};
use tidemark_cli::{self as cli, RunArgs, RunReport};

fn run(records: u64, keys: u64, extra: &[&str]) -> RunReport {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut args = vec![
        "wordcount".to_string(),
        format!("--records={records}"),
        format!("--keys={keys}"),
        "--parallelism=2".to_string(),
        format!("--checkpoint-dir={}", dir.path().display()),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    cli::run(&RunArgs::parse(args).expect("valid arguments")).expect("wordcount runs")
}

fn main() {
    let records = env_or("TIDEMARK_BENCH_RECORDS", 200_000_000);
    let reps = env_or("TIDEMARK_BENCH_REPS", 3);
    let (mut off, mut on, mut d100k, mut d1m, mut recovery) =
        (vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..reps {
        off.push(run(records, 100_000, &["--checkpoint-interval=off"]).throughput_rps);
        let r = run(records, 100_000, &["--checkpoint-interval=1s"]);
        on.push(r.throughput_rps);
        d100k.push(r.checkpoint_duration_ms.p50);
        let r = run(records, 1_000_000, &["--checkpoint-interval=1s"]);
        d1m.push(r.checkpoint_duration_ms.p50);
        let r = run(
            records,
            1_000_000,
            &["--checkpoint-interval=1s", "--inject-failures=3"],
        );
        recovery.push(r.recovery_ms.max);
    }
    let (off, on) = (median(off), median(on));
    println!("wordcount p=2, {records} records, {reps} runs each (medians)");
    println!("throughput, 100,000 keys: checkpoints off {:.1} M records/s, 1 s checkpoints {:.1} M records/s, ratio {:.3}", off / 1e6, on / 1e6, on / off);
    println!(
        "checkpoint duration p50: {:.1} ms at 100,000 keys, {:.1} ms at 1,000,000 keys",
        median(d100k),
        median(d1m)
    );
    println!(
        "failure to restored attempt running, 1,000,000 keys (worst of 3 failures): {:.1} ms",
        median(recovery)
    );
}
