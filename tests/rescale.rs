//! Restoring at another parallelism end to end: wordcount stopped at p=2,
//! restored at p=1, 3 and 4 into the output of the first run, from a
//! savepoint moved elsewhere, a retained RocksDB checkpoint and an unaligned
//! checkpoint with in-flight records. The committed
//! output of both runs holds every update exactly once, which needs every
//! key group at its new owner with its count, every record read exactly once
//! by the redistributed sources, and every pre-committed file committed once.

use tidemark_testkit as common;
use tidemark_testkit::storage;

use common::{assert_updates_exactly_once, copy_tree};
use std::path::{Path, PathBuf};
use tidemark::storage::{CheckpointStorage, METADATA};
use tidemark_cli::{self as cli, RunArgs, RunReport};

const RECORDS: u64 = 200_000;
const KEYS: u64 = 1_000;
const SEED: u64 = 11;

fn args(parallelism: u32, extra: &[String], checkpoints: &Path, output: &Path) -> RunArgs {
    let mut args = vec![
        "wordcount".to_string(),
        format!("--records={RECORDS}"),
        format!("--keys={KEYS}"),
        format!("--seed={SEED}"),
        format!("--parallelism={parallelism}"),
        "--emit=updates".to_string(),
        "--checkpoint-interval=100ms".to_string(),
        format!("--checkpoint-dir={}", checkpoints.display()),
        format!("--output={}", output.display()),
    ];
    args.extend_from_slice(extra);
    RunArgs::parse(args).unwrap()
}

fn run(parallelism: u32, extra: &[String], checkpoints: &Path, output: &Path) -> RunReport {
    cli::run(&args(parallelism, extra, checkpoints, output))
        .unwrap_or_else(|e| panic!("p={parallelism} {extra:?}: {e}"))
}

/// Restores `state` at each of `parallelisms`, each from its own copy of
/// `state_dir` (where `state`, a savepoint or a checkpoint, lives) and of
/// `output`, and checks that every update is committed exactly once over
/// both runs. A checkpoint is restored within its checkpoint directory (the
/// copy); a savepoint into a new one. Returns the restored runs' reports.
fn restore_at(
    parallelisms: &[u32],
    state_dir: &Path,
    state: &Path,
    output: &Path,
    flags: &[&str],
    root: &Path,
) -> Vec<RunReport> {
    let mut reports = Vec::new();
    for &p in parallelisms {
        let (copy, out) = (
            root.join(format!("state-{p}")),
            root.join(format!("out-{p}")),
        );
        copy_tree(state_dir, &copy);
        copy_tree(output, &out);
        let mut extra: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
        let from = copy.join(state.strip_prefix(state_dir).unwrap());
        extra.push(format!("--restore={}", from.display()));
        let checkpoints = if state == state_dir {
            root.join(format!("checkpoints-{p}"))
        } else {
            copy.clone()
        };
        let restored = run(p, &extra, &checkpoints, &out);
        assert!(restored.restored_bytes > 0, "p={p}: nothing restored");
        assert!(
            restored.records_in < RECORDS,
            "p={p}: the restored run read everything again"
        );
        assert_updates_exactly_once(
            &out,
            RECORDS,
            KEYS,
            SEED,
            &format!("{flags:?} from p=2 to p={p}"),
        );
        reports.push(restored);
    }
    reports
}

#[test]
fn a_savepoint_at_p2_restores_at_p1_p3_and_p4_exactly_once() {
    let root = tempfile::tempdir().unwrap();
    let (output, savepoints) = (root.path().join("output"), root.path().join("savepoints"));
    std::fs::create_dir_all(&output).unwrap();
    let stopped = run(
        2,
        &[
            // Slow enough that the savepoint falls inside the run.
            "--rate=200000".to_string(),
            format!("--savepoint-dir={}", savepoints.display()),
            "--stop-with-savepoint-after=300ms".to_string(),
        ],
        &root.path().join("checkpoints"),
        &output,
    );
    assert!(stopped.records_in < RECORDS, "the job stopped early");
    let savepoint = PathBuf::from(stopped.savepoint.expect("the savepoint completed"));
    // Moved elsewhere, with the checkpoint directory gone.
    let elsewhere = root.path().join("elsewhere");
    copy_tree(&savepoint, &elsewhere);
    std::fs::remove_dir_all(&savepoints).unwrap();
    std::fs::remove_dir_all(root.path().join("checkpoints")).unwrap();
    restore_at(
        &[1, 3, 4],
        &elsewhere,
        &elsewhere,
        &output,
        &[],
        root.path(),
    );
}

/// A run of `flags` that fails at checkpoint 4 and gives up leaves
/// checkpoint 3 retained; returns its directory.
fn retained_checkpoint_3(flags: &[&str], checkpoints: &Path, output: &Path) -> PathBuf {
    let mut failing: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
    failing.extend([
        "--inject-fault=sync-snapshot:4:1:0".to_string(),
        "--max-restarts=0".to_string(),
    ]);
    assert!(cli::run(&args(2, &failing, checkpoints, output)).is_err());
    let retained = storage::job_dir(checkpoints).join("chk-3");
    assert!(retained.join("_metadata").exists());
    retained
}

/// A run on incremental RocksDB that fails at checkpoint 4 and gives up
/// leaves checkpoint 3 retained, its pre-committed files uncommitted and
/// files written after it hidden: restored at p=1 and p=3, the native
/// checkpoints are cut and merged by key group.
#[test]
fn a_retained_rocksdb_checkpoint_at_p2_restores_at_p1_and_p3_exactly_once() {
    let root = tempfile::tempdir().unwrap();
    let (output, checkpoints) = (root.path().join("output"), root.path().join("checkpoints"));
    std::fs::create_dir_all(&output).unwrap();
    let rocksdb = ["--state=rocksdb", "--incremental"];
    let retained = retained_checkpoint_3(
        &[rocksdb.as_slice(), &["--rate=200000"]].concat(),
        &checkpoints,
        &output,
    );
    restore_at(
        &[1, 3],
        &checkpoints,
        &retained,
        &output,
        &rocksdb,
        root.path(),
    );
}

/// An unaligned checkpoint taken while a slow counter backpressures the
/// sources holds in-flight records on both ends of the keyed edge. Restored
/// at p=1, 3 and 4, they are replayed by the new owners of their key groups
/// before any new input, each record counted exactly once.
#[test]
fn an_unaligned_checkpoint_under_backpressure_at_p2_restores_at_p1_p3_and_p4_exactly_once() {
    let root = tempfile::tempdir().unwrap();
    let (output, checkpoints) = (root.path().join("output"), root.path().join("checkpoints"));
    std::fs::create_dir_all(&output).unwrap();
    let retained = retained_checkpoint_3(
        &["--mode=unaligned", "--slow-subtask=0", "--slow-ns=20000"],
        &checkpoints,
        &output,
    );
    let storage = CheckpointStorage::open_directory(retained.to_str().unwrap(), false).unwrap();
    let metadata = storage::block_on(storage.read_metadata_at(METADATA)).unwrap();
    let inflight: u64 = metadata
        .subtasks
        .values()
        .flat_map(|s| &s.channels)
        .map(|c| u64::from(c.batches))
        .sum();
    assert!(inflight > 0, "checkpoint 3 holds no in-flight batches");
    let reports = restore_at(
        &[1, 3, 4],
        &checkpoints,
        &retained,
        &output,
        &[],
        root.path(),
    );
    for (p, report) in [1, 3, 4].iter().zip(&reports) {
        assert!(
            report.restored_inflight_batches > 0,
            "p={p}: nothing of {inflight} in-flight batches replayed"
        );
    }
}

/// A running job that cannot be rescaled says why and goes on: without
/// checkpoints there is no state to restore at the new parallelism, and
/// unaligned checkpoints hold a broadcast edge's records in flight, which
/// no restore can deal out to another number of consumers.
#[test]
fn a_job_that_cannot_be_rescaled_refuses_and_goes_on() {
    use std::sync::Arc;
    use tidemark::checkpoint::CheckpointConfig;
    use tidemark::cluster::rescale::{Requirements, RescaleError};
    use tidemark::dataflow::source::Items;
    use tidemark::model::ids::OperatorId;
    use tidemark_actors::prelude::*;
    use tidemark_actors::sinks::Discard;

    let dir = tempfile::tempdir().unwrap();
    let unaligned = CheckpointConfig::new(dir.path().to_str().unwrap()).unaligned();
    for (checkpointing, refusal) in [
        (None, RescaleError::NoCheckpointing),
        (Some(unaligned), RescaleError::UnalignedBroadcast),
    ] {
        let items = Arc::new((0..20_000u64).collect::<Vec<_>>());
        let mut builder = Job::builder("unrescalable")
            .parallelism(2)
            .source_rate(10_000.0);
        if let Some(settings) = checkpointing {
            builder = builder.checkpointing(settings);
        }
        let handle = builder
            .source("numbers", move |ctx| Items::new(items.clone(), ctx))
            .broadcast()
            .sink("discard", |_| Discard)
            .build()
            .run()
            .unwrap();
        let all: Requirements = [(OperatorId(0), 3), (OperatorId(1), 3)].into();
        let why = refusal.to_string();
        assert_eq!(handle.control().rescale(all), Err(refusal));
        handle.cancel();
        let ended = handle.wait();
        assert!(
            matches!(ended, Err(tidemark_actors::JobError::Cancelled)),
            "{why}: {ended:?}"
        );
    }
}
