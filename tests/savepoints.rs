//! Savepoints end to end: self-contained directories that outlive the
//! checkpoint directory, restore from a copy anywhere, and keep the
//! committed output exactly once across a stop and a restore.

use tidemark_testkit as common;
use tidemark_testkit::storage;

use common::{assert_updates_exactly_once, copy_tree};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use storage::{assert_storage_is_exactly_the_retained_checkpoints, block_on, open};
use tidemark::checkpoint::metadata;
use tidemark::checkpoint::{CompletedCheckpoint, SnapshotFormat};
use tidemark::model::event::CheckpointKind;
use tidemark::storage::{CheckpointStorage, METADATA};
use tidemark_cli::{self as cli, RunArgs, RunReport};

const RECORDS: u64 = 300_000;
const KEYS: u64 = 2_000;
const SEED: u64 = 5;

/// Wordcount at p=2 with 100 ms checkpoints; an argument in `extra`
/// replaces the default of the same name.
fn args(extra: &[String], checkpoints: &Path, output: &Path) -> RunArgs {
    let mut args = vec![
        "wordcount".to_string(),
        format!("--records={RECORDS}"),
        format!("--keys={KEYS}"),
        format!("--seed={SEED}"),
        "--parallelism=2".to_string(),
        "--emit=updates".to_string(),
        "--checkpoint-interval=100ms".to_string(),
        format!("--checkpoint-dir={}", checkpoints.display()),
        format!("--output={}", output.display()),
    ];
    let name = |arg: &str| arg.split('=').next().unwrap_or_default().to_owned();
    args.retain(|a| !extra.iter().any(|e| name(e) == name(a)));
    args.extend_from_slice(extra);
    RunArgs::parse(args).unwrap()
}

fn run(extra: &[String], checkpoints: &Path, output: &Path) -> RunReport {
    cli::run(&args(extra, checkpoints, output)).unwrap_or_else(|e| panic!("{extra:?}: {e}"))
}

/// The savepoint's metadata, after checking that its directory holds
/// exactly `_metadata` and the objects it references, all plain objects.
fn assert_self_contained(dir: &Path) -> CompletedCheckpoint {
    let storage = CheckpointStorage::open_directory(dir.to_str().unwrap(), false).unwrap();
    let savepoint = block_on(storage.read_metadata_at(METADATA)).unwrap();
    assert_eq!(savepoint.kind, CheckpointKind::Savepoint);
    assert_eq!(savepoint.format, SnapshotFormat::SelfContained);
    assert!(!savepoint.operators.is_empty());
    let mut referenced: BTreeSet<String> =
        savepoint.objects().into_iter().map(str::to_owned).collect();
    referenced.insert(METADATA.to_owned());
    let held: BTreeSet<String> = block_on(storage.objects())
        .unwrap()
        .into_iter()
        .map(|o| o.path)
        .collect();
    assert_eq!(held, referenced, "{}", dir.display());
    savepoint
}

/// Stopped with a savepoint, the checkpoint directory and the savepoint's
/// original directory deleted, restored from a copy into the same output:
/// every update of both runs is committed exactly once.
fn stop_copy_delete_restore(state: &[&str]) {
    let (checkpoints, output, savepoints, elsewhere) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let mut first: Vec<String> = state.iter().map(|s| s.to_string()).collect();
    first.extend([
        // Slow enough that the savepoint falls inside the run.
        "--rate=200000".to_string(),
        format!("--savepoint-dir={}", savepoints.path().display()),
        "--stop-with-savepoint-after=400ms".to_string(),
    ]);
    let stopped = run(&first, checkpoints.path(), output.path());
    let location = PathBuf::from(stopped.savepoint.expect("the savepoint completed"));
    assert!(location.starts_with(savepoints.path()), "{location:?}");
    assert!(stopped.records_in < RECORDS, "the job stopped early");
    assert_eq!(stopped.savepoints_completed, 1);
    assert_self_contained(&location);
    // Nothing of the savepoint stays in the checkpoint directory.
    assert_storage_is_exactly_the_retained_checkpoints(
        &open(checkpoints.path().to_str().unwrap()),
        "after the stop",
    );

    let copy = elsewhere.path().join("moved");
    copy_tree(&location, &copy);
    std::fs::remove_dir_all(checkpoints.path()).unwrap();
    std::fs::remove_dir_all(savepoints.path()).unwrap();
    let mut second: Vec<String> = state.iter().map(|s| s.to_string()).collect();
    second.push(format!("--restore={}", copy.display()));
    let restored = run(&second, checkpoints.path(), output.path());
    assert!(restored.restored_bytes > 0, "nothing restored");
    assert_updates_exactly_once(
        output.path(),
        RECORDS,
        KEYS,
        SEED,
        &format!("{state:?} across a stop with a savepoint"),
    );
    assert_self_contained(&copy);
}

#[test]
fn heap_state_stopped_with_a_savepoint_restores_from_a_copy_exactly_once() {
    stop_copy_delete_restore(&[]);
}

#[test]
fn merged_heap_state_with_nothing_inline_restores_from_a_copy_exactly_once() {
    stop_copy_delete_restore(&["--file-merging", "--inline-threshold=0"]);
}

#[test]
fn incremental_rocksdb_with_file_merging_restores_from_a_copy_exactly_once() {
    stop_copy_delete_restore(&["--state=rocksdb", "--incremental", "--file-merging"]);
}

/// A savepoint taken on the way neither stops the job nor commits anything
/// on its own, and leaves nothing in the checkpoint directory.
#[test]
fn an_intermediate_savepoint_leaves_the_run_exactly_once() {
    let (checkpoints, output, savepoints) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let report = run(
        &[
            "--rate=300000".to_string(),
            "--state=rocksdb".to_string(),
            "--incremental".to_string(),
            format!("--savepoint-dir={}", savepoints.path().display()),
            "--savepoint-after=300ms".to_string(),
        ],
        checkpoints.path(),
        output.path(),
    );
    assert_eq!(report.records_in, RECORDS);
    let location = PathBuf::from(report.savepoint.expect("the savepoint completed"));
    let savepoint = assert_self_contained(&location);
    assert_updates_exactly_once(output.path(), RECORDS, KEYS, SEED, "intermediate");
    let kept = assert_storage_is_exactly_the_retained_checkpoints(
        &open(checkpoints.path().to_str().unwrap()),
        "after an intermediate savepoint",
    );
    // Checkpoints after the savepoint never referenced its files.
    for checkpoint in &kept {
        assert!(checkpoint.id > savepoint.id);
        for file in checkpoint.subtasks.values().flat_map(|s| s.shared_files()) {
            assert_ne!(file.uploaded_by, savepoint.id, "{:?}", file.handle);
        }
    }
}

/// A savepoint of a short run whose state is all in objects, none inline:
/// (its directory, the output the run committed to).
fn small_savepoint(root: &Path) -> (PathBuf, PathBuf) {
    let output = root.join("output");
    let report = run(
        &[
            "--rate=200000".to_string(),
            "--inline-threshold=0".to_string(),
            format!("--savepoint-dir={}", root.join("savepoints").display()),
            "--stop-with-savepoint-after=200ms".to_string(),
        ],
        &root.join("checkpoints"),
        &output,
    );
    (PathBuf::from(report.savepoint.unwrap()), output)
}

/// Every file under `dir` with its bytes.
fn snapshot_tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(snapshot_tree(&path));
        } else {
            out.push((path.clone(), std::fs::read(&path).unwrap()));
        }
    }
    out.sort();
    out
}

/// A failure before the restored job completed a checkpoint of its own
/// restores the savepoint again, from the savepoint's directory.
#[test]
fn a_failover_before_the_first_own_checkpoint_restores_the_savepoint_again() {
    let root = tempfile::tempdir().unwrap();
    let (savepoint, output) = small_savepoint(root.path());
    let name = savepoint.file_name().unwrap().to_str().unwrap();
    let id: u64 = name.rsplit('-').next().unwrap().parse().unwrap();
    let restored = run(
        &[
            format!("--restore={}", savepoint.display()),
            format!("--inject-fault=sync-snapshot:{}:1:0", id + 1),
        ],
        &root.path().join("restored"),
        &output,
    );
    assert_eq!(restored.restarts, 1);
    assert_updates_exactly_once(&output, RECORDS, KEYS, SEED, "failover to the savepoint");
}

/// Restores from `savepoint` into `output` and checks that it is refused
/// with `exit_code` and a message naming each of `naming`, and that neither
/// the savepoint nor the output changed.
fn assert_refused(root: &Path, savepoint: &Path, output: &Path, exit_code: i32, naming: &[&str]) {
    let before = (snapshot_tree(savepoint), snapshot_tree(output));
    let restore = [format!("--restore={}", savepoint.display())];
    let error = cli::run(&args(&restore, &root.join("restored"), output))
        .expect_err("the restore is refused");
    assert_eq!(
        (snapshot_tree(savepoint), snapshot_tree(output)),
        before,
        "nothing was touched"
    );
    assert_eq!(error.exit_code(), exit_code, "{error}");
    for name in naming {
        assert!(error.to_string().contains(name), "{error}");
    }
}

/// A job restored from a savepoint need not take periodic checkpoints: with
/// only `--savepoint-dir` it still restores, and commits with the final
/// checkpoint at the end of its input.
#[test]
fn a_savepoint_restores_into_a_job_without_periodic_checkpoints() {
    let root = tempfile::tempdir().unwrap();
    let (savepoint, output) = small_savepoint(root.path());
    let restored = run(
        &[
            "--parallelism=3".to_string(),
            "--checkpoint-interval=off".to_string(),
            format!(
                "--savepoint-dir={}",
                root.path().join("savepoints").display()
            ),
            format!("--restore={}", savepoint.display()),
        ],
        &root.path().join("restored"),
        &output,
    );
    assert!(restored.restored_bytes > 0, "nothing restored");
    assert_updates_exactly_once(&output, RECORDS, KEYS, SEED, "without checkpoints");
}

fn rewrite_metadata(dir: &Path, change: impl FnOnce(&mut CompletedCheckpoint)) {
    let path = dir.join(METADATA);
    let mut metadata = metadata::decode(&std::fs::read(&path).unwrap()).unwrap();
    change(&mut metadata);
    std::fs::write(&path, metadata::encode(&metadata)).unwrap();
}

#[test]
fn a_directory_without_metadata_is_not_a_savepoint() {
    let root = tempfile::tempdir().unwrap();
    let (savepoint, output) = small_savepoint(root.path());
    std::fs::remove_file(savepoint.join(METADATA)).unwrap();
    let named = ["--restore", savepoint.to_str().unwrap(), "no _metadata"];
    assert_refused(root.path(), &savepoint, &output, 2, &named);
}

#[test]
fn foreign_metadata_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let (savepoint, output) = small_savepoint(root.path());
    std::fs::write(savepoint.join(METADATA), b"{\"savepoint\": true}").unwrap();
    let named = [savepoint.to_str().unwrap(), "not checkpoint metadata"];
    assert_refused(root.path(), &savepoint, &output, 1, &named);
}

#[test]
fn corrupted_and_truncated_metadata_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let (savepoint, output) = small_savepoint(root.path());
    let path = savepoint.join(METADATA);
    let good = std::fs::read(&path).unwrap();
    let mut flipped = good.clone();
    flipped[good.len() / 2] ^= 0x40;
    for bad in [flipped, good[..good.len() - 7].to_vec()] {
        std::fs::write(&path, &bad).unwrap();
        let named = [path.to_str().unwrap(), "checksum"];
        assert_refused(root.path(), &savepoint, &output, 1, &named);
    }
}

#[test]
fn a_savepoint_of_another_max_parallelism_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let (savepoint, output) = small_savepoint(root.path());
    rewrite_metadata(&savepoint, |m| {
        for op in &mut m.operators {
            op.max_parallelism = 64;
        }
    });
    assert_refused(root.path(), &savepoint, &output, 1, &["max parallelism 64"]);
}

/// Crafted metadata naming objects outside the savepoint directory, where
/// a planted copy of the very bytes it expects would let the restore
/// succeed if it were read: the restore is refused before reading
/// anything, and the planted file stays as it was.
#[test]
fn references_outside_the_directory_are_refused_and_never_read() {
    let root = tempfile::tempdir().unwrap();
    let (savepoint, output) = small_savepoint(root.path());
    let metadata = metadata::decode(&std::fs::read(savepoint.join(METADATA)).unwrap()).unwrap();
    let victim = metadata
        .objects()
        .into_iter()
        .next()
        .expect("state in objects")
        .to_owned();
    let planted_dir = root.path().join("planted");
    std::fs::create_dir(&planted_dir).unwrap();
    let planted = planted_dir.join(&victim);
    std::fs::copy(savepoint.join(&victim), &planted).unwrap();
    let planted_bytes = std::fs::read(&planted).unwrap();
    for reference in [
        format!("../planted/{victim}"),
        planted.to_str().unwrap().to_owned(),
        format!("file://{}", planted.display()),
        format!("s3://another-bucket/{victim}"),
    ] {
        rewrite_metadata(&savepoint, |m| {
            for state in m.subtasks.values_mut() {
                for handle in state.handles_mut() {
                    if handle.physical() == Some(victim.as_str()) {
                        *handle = handle.relocated(reference.clone());
                    }
                }
            }
        });
        std::fs::remove_file(savepoint.join(&victim)).unwrap();
        let named = [reference.as_str(), "outside its directory"];
        assert_refused(root.path(), &savepoint, &output, 1, &named);
        assert_eq!(std::fs::read(&planted).unwrap(), planted_bytes);
        // Back to the real object for the next reference.
        std::fs::copy(&planted, savepoint.join(&victim)).unwrap();
        rewrite_metadata(&savepoint, |m| {
            for state in m.subtasks.values_mut() {
                for handle in state.handles_mut() {
                    if handle.physical() == Some(reference.as_str()) {
                        *handle = handle.relocated(victim.clone());
                    }
                }
            }
        });
    }
    // Restored as it was, it restores.
    let restored = run(
        &[format!("--restore={}", savepoint.display())],
        &root.path().join("restored"),
        &output,
    );
    assert!(restored.restored_bytes > 0);
    assert_updates_exactly_once(&output, RECORDS, KEYS, SEED, "after the refusals");
}

/// A run that fails at checkpoint 4 and gives up, leaving checkpoint 3
/// retained, restored in `mode` into the same directories: the committed
/// output is exactly once. Returns checkpoint 3, what checkpoint storage
/// held after the restored run, and what the new run's retained
/// checkpoints account for of that.
fn restore_checkpoint_3(mode: &str) -> (CompletedCheckpoint, BTreeSet<String>, BTreeSet<String>) {
    let (checkpoints, output) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let rocksdb = ["--state=rocksdb".to_string(), "--incremental".to_string()];
    let mut failing = rocksdb.to_vec();
    failing.extend([
        "--rate=300000".to_string(),
        "--inject-fault=sync-snapshot:4:1:0".to_string(),
        "--max-restarts=0".to_string(),
    ]);
    assert!(cli::run(&args(&failing, checkpoints.path(), output.path())).is_err());
    let storage = open(checkpoints.path().to_str().unwrap());
    let kept = assert_storage_is_exactly_the_retained_checkpoints(&storage, "after the failure");
    let restored = kept.last().unwrap().clone();
    assert_eq!(restored.id.0, 3);

    let mut again = rocksdb.to_vec();
    again.extend([
        "--rate=300000".to_string(),
        format!(
            "--restore={}",
            storage::job_dir(checkpoints.path()).join("chk-3").display()
        ),
        format!("--restore-mode={mode}"),
    ]);
    let report = run(&again, checkpoints.path(), output.path());
    assert!(
        report.checkpoints_completed > 2,
        "the new run subsumed checkpoints"
    );
    assert_updates_exactly_once(output.path(), RECORDS, KEYS, SEED, mode);
    let held = storage::objects(&storage);
    // The new run's checkpoints never reference checkpoint 3's files.
    let newest = storage::retained(&storage).pop().unwrap();
    assert!(newest.id.0 > 3);
    if mode == "no-claim" {
        for file in newest.subtasks.values().flat_map(|s| s.shared_files()) {
            assert!(file.uploaded_by.0 > 3, "{:?}", file.handle);
        }
    }
    let (_, own) = storage::retained_objects(&storage);
    (restored, held, own)
}

#[test]
fn no_claim_never_deletes_the_restored_checkpoints_files() {
    let (restored, held, own) = restore_checkpoint_3("no-claim");
    let mut expected: BTreeSet<String> =
        restored.objects().into_iter().map(str::to_owned).collect();
    expected.insert(CheckpointStorage::metadata_path(restored.id));
    let missing: Vec<_> = expected.difference(&held).collect();
    assert!(missing.is_empty(), "deleted: {missing:?}");
    // And nothing else stays behind.
    expected.extend(own);
    assert_eq!(held, expected);
}

#[test]
fn claim_takes_the_restored_checkpoint_over_and_subsumes_it() {
    let (restored, held, own) = restore_checkpoint_3("claim");
    assert!(!held.contains(&CheckpointStorage::metadata_path(restored.id)));
    // Its files went too, but for those the new checkpoints still reference.
    assert_eq!(held, own);
}
