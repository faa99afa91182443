//! SIGKILL of the whole process mid-run, then the same command with
//! `--restore latest`: the committed output is exactly once. The process is
//! this test binary itself, re-run as a child that runs the job.

use tidemark_testkit as common;

use common::assert_updates_exactly_once;
use std::path::Path;

const CHILD: &str = "TIDEMARK_SIGKILL_CHILD_ARGS";
const RECORDS: u64 = 2_000_000;
const KEYS: u64 = 5_000;
const SEED: u64 = 99;

fn job_args(output: &Path, checkpoints: &Path) -> Vec<String> {
    vec![
        "wordcount".into(),
        format!("--records={RECORDS}"),
        format!("--keys={KEYS}"),
        format!("--seed={SEED}"),
        "--parallelism=2".into(),
        "--rate=1000000".into(),
        "--emit=updates".into(),
        "--checkpoint-interval=100ms".into(),
        format!("--checkpoint-dir={}", checkpoints.display()),
        format!("--output={}", output.display()),
    ]
}

/// The child's entry point; a no-op when the test runs normally.
#[test]
fn child_runs_the_job() {
    common::run_child_job(CHILD);
}

#[test]
fn a_killed_process_resumes_from_the_latest_checkpoint_exactly_once() {
    let (output, checkpoints) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let args = job_args(output.path(), checkpoints.path());
    common::kill_then_restore_latest(CHILD, &args, output.path(), checkpoints.path(), || {
        let partial = common::committed(output.path()).len() as u64;
        assert!(partial < RECORDS, "the kill came after the end");
    });
    assert_updates_exactly_once(
        output.path(),
        RECORDS,
        KEYS,
        SEED,
        "after SIGKILL and --restore latest",
    );
}
