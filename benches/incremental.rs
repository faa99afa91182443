//! Incremental RocksDB checkpoints of a large state under a small change:
//! bytes uploaded per checkpoint against the whole state, checkpoint duration
//! against the change and against the state, and the restore speed of the
//! whole state. Side by side in one run:
//!
//! - a state of `TIDEMARK_BENCH_KEYS` keys (default 10,000,000) changed at
//!   1 % of the keys per 1 s checkpoint, and at a quarter of that;
//! - a state a quarter that size changed at the same absolute rate as the
//!   first, so that only the state size differs.
//!
//! Each state is first filled (wordcount, as many records as keys, 5 s
//! checkpoints, `--emit updates` so that the end of input does not read the
//! whole state back); each churn run then restores a copy of the fill's last
//! checkpoint and goes on for `TIDEMARK_BENCH_CHURN_S` seconds (default 20)
//! at the rate, with `--incremental` 1 s checkpoints.
//!
//! cargo bench --bench incremental

mod common;

use common::env_or;
use std::path::{Path, PathBuf};
use tidemark_cli::{self as cli, RunArgs, RunReport};

fn run(args: Vec<String>) -> RunReport {
    let mut all = vec!["wordcount".to_string(), "--parallelism=2".to_string()];
    all.extend(args);
    all.extend(["--state=rocksdb".into(), "--incremental".into()]);
    cli::run(&RunArgs::parse(all).expect("valid arguments")).expect("wordcount runs")
}

/// A state of `keys` keys, checkpointed under `dir`: its newest checkpoint.
fn fill(dir: &Path, keys: u64) -> PathBuf {
    run(vec![
        format!("--keys={keys}"),
        format!("--records={keys}"),
        "--checkpoint-interval=5s".into(),
        "--emit=updates".into(),
        format!("--checkpoint-dir={}", dir.join("checkpoints").display()),
        format!("--state-dir={}", dir.join("state").display()),
    ]);
    let job = std::fs::read_dir(dir.join("checkpoints"))
        .expect("the fill wrote checkpoints")
        .map(|e| e.expect("a directory entry").path())
        .next()
        .expect("one job directory");
    let newest = std::fs::read_dir(&job)
        .expect("the job directory")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_prefix("chk-")?.parse::<u64>().ok()
        })
        .max()
        .expect("a completed checkpoint");
    job.join(format!("chk-{newest}"))
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("creates the copy");
    for entry in std::fs::read_dir(from).expect("reads the checkpoints") {
        let entry = entry.expect("a directory entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("a file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("copies a file");
        }
    }
}

struct Churn {
    keys: u64,
    rate: u64,
    report: RunReport,
}

/// Restores a copy of the filled state, claiming its files so that the
/// first checkpoint is incremental on them, and
/// changes it at `rate` records/s for `seconds`.
fn churn(filled: &Path, keys: u64, rate: u64, seconds: u64) -> Churn {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let job = filled.parent().expect("the job directory");
    let copy = dir
        .path()
        .join("checkpoints")
        .join(job.file_name().expect("a job id"));
    copy_dir(job, &copy);
    let checkpoint = copy.join(filled.file_name().expect("chk-N"));
    let report = run(vec![
        format!("--keys={keys}"),
        format!("--records={}", keys + rate * seconds),
        format!("--rate={rate}"),
        "--checkpoint-interval=1s".into(),
        "--emit=updates".into(),
        format!("--restore={}", checkpoint.display()),
        "--restore-mode=claim".into(),
        format!(
            "--checkpoint-dir={}",
            dir.path().join("checkpoints").display()
        ),
        format!("--state-dir={}", dir.path().join("state").display()),
    ]);
    Churn { keys, rate, report }
}

fn mib(bytes: f64) -> f64 {
    bytes / (1024.0 * 1024.0)
}

fn main() {
    let keys = env_or("TIDEMARK_BENCH_KEYS", 10_000_000);
    let seconds = env_or("TIDEMARK_BENCH_CHURN_S", 20);
    let small = keys / 4;
    let large_dir = tempfile::tempdir().expect("a temporary directory");
    let small_dir = tempfile::tempdir().expect("a temporary directory");
    let large = fill(large_dir.path(), keys);
    let small_filled = fill(small_dir.path(), small);
    let rate = keys / 100;
    let runs = [
        churn(&large, keys, rate, seconds),
        churn(&large, keys, rate / 4, seconds),
        churn(&small_filled, small, rate, seconds),
    ];
    println!(
        "incremental checkpoints, wordcount p=2, RocksDB, 1 s checkpoints, {seconds} s of churn each"
    );
    println!(
        "| keys | records/s | full state MiB | uploaded per checkpoint p50 / mean / max MiB | mean / full | duration p50 / max ms | restore MiB/s |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for Churn { keys, rate, report } in &runs {
        let full = report.checkpointed_bytes_full as f64;
        let mean = report.bytes_uploaded_total as f64 / report.checkpoints_completed.max(1) as f64;
        let uploads = &report.bytes_uploaded_per_checkpoint;
        println!(
            "| {keys} | {rate} | {:.1} | {:.2} / {:.2} / {:.2} | {:.2} % | {:.0} / {:.0} | {:.0} |",
            mib(full),
            mib(uploads.p50),
            mib(mean),
            mib(uploads.max),
            100.0 * mean / full,
            report.checkpoint_duration_ms.p50,
            report.checkpoint_duration_ms.max,
            mib(report.restored_bytes as f64) / (report.restore_ms / 1e3),
        );
    }
}
