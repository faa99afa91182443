//! File merging, side by side in one run:
//!
//! - objects created per checkpoint by a RocksDB incremental wordcount
//!   (p=2, `TIDEMARK_BENCH_KEYS` keys, default 1,000,000, 1 s checkpoints,
//!   nothing inline) without and with `--file-merging`;
//! - churn: hundreds of 50 ms checkpoints of the same job with retain 3,
//!   merging on and small objects inline: the space amplification of the
//!   retained checkpoints' physical files after each completed checkpoint,
//!   the last and the most seen, against `--max-space-amplification` 1.5.
//!
//! cargo bench --bench merging

mod common;

use common::env_or;
use tidemark_cli::{self as cli, RunArgs, RunReport};

fn run(keys: u64, records: u64, extra: &[&str]) -> RunReport {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut args = vec![
        "wordcount".to_string(),
        format!("--keys={keys}"),
        format!("--records={records}"),
        "--parallelism=2".to_string(),
        "--emit=updates".to_string(),
        "--state=rocksdb".to_string(),
        "--incremental".to_string(),
        format!(
            "--checkpoint-dir={}",
            dir.path().join("checkpoints").display()
        ),
        format!("--state-dir={}", dir.path().join("state").display()),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    cli::run(&RunArgs::parse(args).expect("valid arguments")).expect("wordcount runs")
}

fn main() {
    let keys = env_or("TIDEMARK_BENCH_KEYS", 1_000_000);
    println!("file merging, RocksDB incremental wordcount p=2, {keys} keys");
    println!("| configuration | checkpoints | objects created per checkpoint | state files uploaded per checkpoint |");
    println!("| --- | --- | --- | --- |");
    for (name, extra) in [
        ("one object per file", &["--inline-threshold=0"][..]),
        (
            "--file-merging",
            &["--inline-threshold=0", "--file-merging"][..],
        ),
    ] {
        let mut args = vec!["--checkpoint-interval=1s", "--rate=1000000"];
        args.extend_from_slice(extra);
        let report = run(keys, 15_000_000, &args);
        let checkpoints = report.checkpoints_completed.max(1) as f64;
        println!(
            "| {name} | {} | {:.1} | {:.1} |",
            report.checkpoints_completed,
            report.objects_created as f64 / checkpoints,
            report.files_uploaded_total as f64 / checkpoints,
        );
    }
    let report = run(
        keys,
        20_000_000,
        &[
            "--checkpoint-interval=50ms",
            "--rate=1000000",
            "--retain=3",
            "--file-merging",
            "--max-space-amplification=1.5",
        ],
    );
    println!(
        "churn: {} checkpoints with retain 3: space amplification last {:.3}, max {:.3} (threshold 1.5), {} physical files live at the end",
        report.checkpoints_completed,
        report.space_amplification,
        report.space_amplification_max,
        report.physical_files_live,
    );
}
