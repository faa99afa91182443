//! What storage damage does to a restore: a state object that does not
//! hold what its checkpoint recorded fails the restore naming the object,
//! and `--restore latest` falls back to the retained checkpoint before it.

mod common;
#[path = "common/storage.rs"]
mod storage;

use common::expected_counts;
use std::collections::HashMap;
use std::path::Path;
use storage::{job_dir, open, retained};
use tidemark_actors::cli::{self, CliError, RunArgs, RunReport};

const RECORDS: u64 = 200_000;
const KEYS: u64 = 5_000;
const SEED: u64 = 21;

fn run(extra: &[String], checkpoints: &Path, output: &Path) -> Result<RunReport, CliError> {
    let mut args: Vec<String> = [
        "wordcount",
        "--records=200000",
        "--keys=5000",
        "--seed=21",
        "--parallelism=2",
        "--rate=400000",
        "--retain=2",
        "--inline-threshold=0",
        "--emit=final",
        "--checkpoint-interval=20ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(format!("--checkpoint-dir={}", checkpoints.display()));
    args.push(format!("--output={}", output.display()));
    args.extend_from_slice(extra);
    cli::run(&RunArgs::parse(args).unwrap())
}

#[test]
fn a_corrupted_state_object_is_named_and_latest_falls_back_to_the_checkpoint_before() {
    for state in ["--state=heap", "--state=rocksdb"] {
        let (checkpoints, output) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let state = [state.to_string()];
        run(&state, checkpoints.path(), output.path()).unwrap();
        let kept = retained(&open(checkpoints.path().to_str().unwrap()));
        assert_eq!(kept.len(), 2, "{state:?}");
        let (older, newest) = (&kept[0], &kept[1]);
        // One byte of the newest checkpoint's largest object flips: same
        // length, other content.
        let victim = newest
            .subtasks
            .values()
            .flat_map(|s| s.handles())
            .filter(|h| h.physical().is_some_and(|p| p.starts_with("chk-")))
            .max_by_key(|h| h.size())
            .unwrap()
            .physical()
            .unwrap()
            .to_owned();
        let job = job_dir(checkpoints.path());
        let file = job.join(&victim);
        let mut bytes = std::fs::read(&file).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x20;
        std::fs::write(&file, bytes).unwrap();

        let explicit = format!("--restore={}", job.join(newest.id.to_string()).display());
        let refused = tempfile::tempdir().unwrap();
        let err = run(
            &[state[0].clone(), explicit],
            checkpoints.path(),
            refused.path(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains(&victim) && err.contains("corrupted"),
            "{state:?}: {err}"
        );
        assert!(common::committed_lines(refused.path()).is_empty());

        let resumed = tempfile::tempdir().unwrap();
        let latest = [state[0].clone(), "--restore=latest".to_string()];
        let report = run(&latest, checkpoints.path(), resumed.path()).unwrap();
        assert_eq!(report.restored_checkpoint, Some(older.id.0), "{state:?}");
        let counts: HashMap<u64, u64> = common::committed(resumed.path()).into_iter().collect();
        assert_eq!(counts, expected_counts(RECORDS, KEYS, SEED), "{state:?}");
    }
}
