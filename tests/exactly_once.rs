//! End-to-end exactly-once: wordcount with `--emit updates` under injected
//! failures, checked from the committed files alone.

mod common;

use common::assert_updates_exactly_once;
use std::path::Path;
use tidemark_actors::cli::{self, RunArgs, RunReport};

const RECORDS: u64 = 300_000;
const KEYS: u64 = 2_000;

fn run(seed: u64, extra: &[String], output: &Path, checkpoints: &Path) -> RunReport {
    let mut args = vec![
        "wordcount".to_string(),
        format!("--records={RECORDS}"),
        format!("--keys={KEYS}"),
        format!("--seed={seed}"),
        "--parallelism=2".to_string(),
        // Slow enough that several checkpoints fall inside the run.
        "--rate=1000000".to_string(),
        "--emit=updates".to_string(),
        "--checkpoint-interval=100ms".to_string(),
        format!("--checkpoint-dir={}", checkpoints.display()),
        format!("--output={}", output.display()),
    ];
    args.extend_from_slice(extra);
    cli::run(&RunArgs::parse(args).unwrap()).unwrap_or_else(|e| panic!("seed {seed}: {e}"))
}

#[test]
fn random_kills_lose_and_duplicate_nothing_over_twenty_seeds() {
    let mut restarts = 0;
    for seed in 0..20 {
        let (output, checkpoints) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let report = run(
            seed,
            &["--inject-failures=5".into()],
            output.path(),
            checkpoints.path(),
        );
        assert_updates_exactly_once(output.path(), RECORDS, KEYS, seed, &format!("seed {seed}"));
        assert!(report.restarts >= 1, "seed {seed}: no failure was injected");
        restarts += report.restarts;
        let leftovers: Vec<_> = std::fs::read_dir(output.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(
            leftovers.is_empty(),
            "seed {seed}: uncommitted files left: {leftovers:?}"
        );
        assert_only_the_retained_checkpoint_remains(checkpoints.path(), seed);
    }
    assert!(
        restarts >= 80,
        "only {restarts} restarts over 20 seeds of 5 kills"
    );
}

#[test]
fn a_fault_at_every_step_of_a_checkpoint_is_survived() {
    // Operator 0 is the source, operator 1 the counter chained to the sink.
    for fault in [
        "sync-snapshot:2:1:0",
        "async-write:2:1:1",
        "after-ack:2:1:0",
        "sink-commit:2:1:1",
        "sync-snapshot:2:0:1",
        "async-write:2:0:0",
        "after-ack:2:0:1",
    ] {
        let (output, checkpoints) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let report = run(
            7,
            &[format!("--inject-fault={fault}")],
            output.path(),
            checkpoints.path(),
        );
        assert_eq!(report.restarts, 1, "{fault}");
        assert_updates_exactly_once(output.path(), RECORDS, KEYS, 7, fault);
    }
}

#[test]
fn ids_keep_increasing_when_the_job_is_run_again_on_its_checkpoints() {
    let (output, checkpoints) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    run(1, &[], output.path(), checkpoints.path());
    let first = newest_checkpoint(checkpoints.path());
    let output = tempfile::tempdir().unwrap();
    run(1, &[], output.path(), checkpoints.path());
    assert!(newest_checkpoint(checkpoints.path()) > first);
}

/// Sorted names in a directory.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// The job's directory in checkpoint storage: the only entry of the root.
fn job_dir(root: &Path) -> std::path::PathBuf {
    root.join(&names(root)[0])
}

/// After the run, storage holds the id counter and the one retained
/// checkpoint: the state of aborted, subsumed and abandoned checkpoints is
/// gone.
fn assert_only_the_retained_checkpoint_remains(root: &Path, seed: u64) {
    let job = job_dir(root);
    let entries = names(&job);
    let listing: Vec<String> = entries
        .iter()
        .map(|n| {
            format!(
                "{n}: {:?}",
                std::fs::read_dir(job.join(n))
                    .map(|_| names(&job.join(n)))
                    .unwrap_or_default()
            )
        })
        .collect();
    assert_eq!(entries.len(), 2, "seed {seed}: {listing:?}");
    assert_eq!(entries[0], "checkpoint-id-counter", "seed {seed}");
    assert_eq!(
        names(&job.join(&entries[1])),
        ["_metadata", "op-1-0-keyed", "op-1-1-keyed"],
        "seed {seed}"
    );
}

fn newest_checkpoint(root: &Path) -> u64 {
    names(&job_dir(root))
        .iter()
        .filter_map(|n| n.strip_prefix("chk-")?.parse().ok())
        .max()
        .unwrap()
}

#[test]
fn a_fresh_run_fails_over_to_its_own_checkpoints_not_an_earlier_runs() {
    let checkpoints = tempfile::tempdir().unwrap();
    let earlier = tempfile::tempdir().unwrap();
    run(5, &[], earlier.path(), checkpoints.path());
    // The next run's first checkpoint fails: nothing of its own completed
    // yet, so it restarts from the beginning, not from the earlier run's end.
    let first = newest_checkpoint(checkpoints.path()) + 1;
    let output = tempfile::tempdir().unwrap();
    let report = run(
        5,
        &[format!("--inject-fault=sync-snapshot:{first}:1:0")],
        output.path(),
        checkpoints.path(),
    );
    assert_eq!(report.restarts, 1);
    assert_updates_exactly_once(output.path(), RECORDS, KEYS, 5, "second run");
}
