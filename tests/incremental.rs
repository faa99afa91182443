//! RocksDB state with incremental checkpoints, end to end: what storage
//! holds after a chain of checkpoints, restores from each retained one, and
//! what an aborted checkpoint leaves behind.

use tidemark_testkit as common;
use tidemark_testkit::storage;

use common::{assert_updates_exactly_once, copy_tree, expected_counts};
use std::collections::HashMap;
use std::path::Path;
use storage::{assert_storage_is_exactly_the_retained_checkpoints, job_dir, open, retained};
use tidemark_cli::{self as cli, RunArgs, RunReport};

const RECORDS: u64 = 400_000;
/// Enough keys that a checkpoint changes a small part of them: universal
/// compaction (size amplification at most 50 %) rewrites the whole state
/// once a flush holds half of it, and then no file outlives a checkpoint.
/// At 50,000 keys the longer checkpoint cycles of a loaded machine crossed
/// that line for all three retained checkpoints (6 of 141 runs).
const KEYS: u64 = 200_000;

fn run(extra: &[&str], checkpoints: &Path, output: &Path) -> RunReport {
    let (records, keys) = (format!("--records={RECORDS}"), format!("--keys={KEYS}"));
    let base = [
        "wordcount",
        &records,
        &keys,
        "--seed=11",
        "--parallelism=2",
        "--rate=500000",
        "--state=rocksdb",
        "--incremental",
        "--retain=3",
        "--checkpoint-interval=20ms",
    ];
    let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    common::run_in(&base, checkpoints, output, &extra).unwrap_or_else(|e| panic!("{extra:?}: {e}"))
}

#[test]
fn an_incremental_chain_keeps_exactly_what_the_retained_checkpoints_reference() {
    let (checkpoints, output) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let report = run(&["--emit=updates"], checkpoints.path(), output.path());
    assert_updates_exactly_once(output.path(), RECORDS, KEYS, 11, "rocksdb incremental");
    assert!(
        report.checkpoints_completed >= 6,
        "only {} checkpoints",
        report.checkpoints_completed
    );
    let storage = open(checkpoints.path().to_str().unwrap());
    let kept = assert_storage_is_exactly_the_retained_checkpoints(&storage, "chain");
    assert_eq!(kept.len(), 3);
    // Incremental: a retained checkpoint references shared files that an
    // older one uploaded. (Not necessarily the newest: a compaction can
    // rewrite every file between two checkpoints.)
    assert!(kept.iter().any(|c| c
        .subtasks
        .values()
        .flat_map(|s| s.shared_files())
        .any(|f| f.uploaded_by < c.id)));
    assert!(report.bytes_uploaded_total > 0);
    assert!(report.files_uploaded_total > 0);
}

#[test]
fn every_retained_checkpoint_restores_the_right_state() {
    let (checkpoints, output) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    run(&["--emit=final"], checkpoints.path(), output.path());
    let kept = retained(&open(checkpoints.path().to_str().unwrap()));
    assert_eq!(kept.len(), 3);
    let expected: HashMap<u64, u64> = expected_counts(RECORDS, KEYS, 11);
    for checkpoint in &kept {
        let copy = tempfile::tempdir().unwrap();
        copy_tree(checkpoints.path(), copy.path());
        let copied_job = job_dir(copy.path());
        let output = tempfile::tempdir().unwrap();
        let restore = format!(
            "--restore={}",
            copied_job.join(checkpoint.id.to_string()).display()
        );
        run(&["--emit=final", &restore], copy.path(), output.path());
        let counts: HashMap<u64, u64> = common::committed(output.path()).into_iter().collect();
        assert_eq!(counts, expected, "restored from {}", checkpoint.id);
    }
}

#[test]
fn an_aborted_checkpoints_uploads_are_deleted_and_never_become_a_base() {
    let (checkpoints, output) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let state_dir = tempfile::tempdir().unwrap();
    let state = format!("--state-dir={}", state_dir.path().display());
    // Checkpoint 4 fails in the asynchronous part of one counter subtask;
    // the other subtasks' uploads for it are discarded.
    let report = run(
        &["--emit=updates", "--inject-fault=async-write:4:1:1", &state],
        checkpoints.path(),
        output.path(),
    );
    assert_eq!(report.restarts, 1);
    // The declined snapshot's local native checkpoint went with it, as
    // did every database of the run.
    let left: Vec<_> = std::fs::read_dir(state_dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left in --state-dir: {left:?}");
    assert_updates_exactly_once(output.path(), RECORDS, KEYS, 11, "aborted checkpoint 4");
    let storage = open(checkpoints.path().to_str().unwrap());
    let kept = assert_storage_is_exactly_the_retained_checkpoints(&storage, "after the abort");
    for checkpoint in &kept {
        for file in checkpoint.subtasks.values().flat_map(|s| s.shared_files()) {
            assert_ne!(
                file.uploaded_by.0, 4,
                "{:?} in {}",
                file.handle, checkpoint.id
            );
        }
    }
}

/// A restore that fails while downloading (an SST object of the checkpoint
/// is gone) or after it (the SST is garbage, so the database does not open)
/// fails the job naming what is wrong, and leaves nothing of what it had
/// downloaded in `--state-dir`.
#[test]
fn a_failed_restore_leaves_no_downloads_behind() {
    let (checkpoints, output) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    run(&["--emit=final"], checkpoints.path(), output.path());
    let newest = retained(&open(checkpoints.path().to_str().unwrap()))
        .pop()
        .unwrap();
    let sst = newest
        .subtasks
        .values()
        .flat_map(|s| s.shared_files())
        .filter_map(|f| f.handle.physical())
        .max()
        .unwrap()
        .to_owned();
    let job = job_dir(checkpoints.path());
    let path = job.join(&sst);
    let size = std::fs::metadata(&path).unwrap().len() as usize;
    type Damage = fn(&Path, usize);
    let damages: [(Damage, &str); 2] = [
        (|path, _| std::fs::remove_file(path).unwrap(), sst.as_str()),
        (
            |path, size| std::fs::write(path, vec![0x5a; size]).unwrap(),
            "is corrupted",
        ),
    ];
    for (damage, named) in damages {
        let state_dir = tempfile::tempdir().unwrap();
        damage(&path, size);
        let mut args: Vec<String> = [
            "wordcount",
            &format!("--records={RECORDS}"),
            &format!("--keys={KEYS}"),
            "--parallelism=3",
            "--state=rocksdb",
            "--max-restarts=0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend([
            format!("--checkpoint-dir={}", checkpoints.path().display()),
            format!("--state-dir={}", state_dir.path().display()),
            format!("--restore={}", job.join(newest.id.to_string()).display()),
        ]);
        let error = cli::run(&RunArgs::parse(args).unwrap()).unwrap_err();
        assert!(error.to_string().contains(named), "{error}");
        let left: Vec<_> = std::fs::read_dir(state_dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "{named}: {left:?}");
    }
}
