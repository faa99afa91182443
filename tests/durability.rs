//! What storage damage does to a restore: a state object that does not
//! hold what its checkpoint recorded fails the restore naming the object,
//! and `--restore latest` falls back to the retained checkpoint before it.

use tidemark_testkit as common;
use tidemark_testkit::storage;

use common::expected_counts;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use storage::{job_dir, open, retained};
use tidemark::storage::faults::{FaultPlan, FaultyStore};
use tidemark_cli::{CliError, RunReport};

const RECORDS: u64 = 200_000;
const KEYS: u64 = 5_000;
const SEED: u64 = 21;

fn run(extra: &[String], checkpoints: &Path, output: &Path) -> Result<RunReport, CliError> {
    let base = [
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
    ];
    common::run_in(&base, checkpoints, output, extra)
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

/// Runs `args` on a thread of its own.
fn spawn(
    args: Vec<String>,
    checkpoints: &Path,
    output: &Path,
) -> std::thread::JoinHandle<Result<RunReport, CliError>> {
    let (checkpoints, output) = (checkpoints.to_owned(), output.to_owned());
    std::thread::spawn(move || run(&args, &checkpoints, &output))
}

/// Waits until the job under `checkpoints` has completed a checkpoint.
fn await_checkpoint(
    checkpoints: &Path,
    job: &std::thread::JoinHandle<Result<RunReport, CliError>>,
) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while common::completed_checkpoints(checkpoints) == 0 {
        assert!(
            !job.is_finished(),
            "the job ended before its first checkpoint"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint in a minute"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn a_second_run_on_a_held_directory_is_refused_and_one_that_takes_it_over_fences_the_first() {
    let checkpoints = tempfile::tempdir().unwrap();
    let slow = || vec!["--rate=100000".to_string()];

    // Refused: the first run goes on undisturbed.
    let first_output = tempfile::tempdir().unwrap();
    let first = spawn(slow(), checkpoints.path(), first_output.path());
    await_checkpoint(checkpoints.path(), &first);
    let second_output = tempfile::tempdir().unwrap();
    let err = run(&[], checkpoints.path(), second_output.path())
        .unwrap_err()
        .to_string();
    assert!(err.contains("is in use by run"), "{err}");
    assert!(
        err.contains(&format!("pid {}", std::process::id())),
        "{err}"
    );
    assert!(common::committed_lines(second_output.path()).is_empty());
    first.join().unwrap().unwrap();
    let counts: HashMap<u64, u64> = common::committed(first_output.path()).into_iter().collect();
    assert_eq!(counts, expected_counts(RECORDS, KEYS, SEED));
    let storage = open(checkpoints.path().to_str().unwrap());
    storage::assert_storage_is_exactly_the_retained_checkpoints(&storage, "after a refusal");

    // Taken over: the old run can no longer complete a checkpoint or
    // delete, and the new one's checkpoints are its own.
    let old_output = tempfile::tempdir().unwrap();
    let mut old_args = slow();
    old_args.push("--max-restarts=1".into());
    let old = spawn(old_args, checkpoints.path(), old_output.path());
    let leases = job_dir(checkpoints.path()).join(tidemark::storage::lease::LEASES);
    // Leases in place, not the staging files a local put renames.
    let held = || {
        std::fs::read_dir(&leases).unwrap().any(|lease| {
            let lease = lease.unwrap();
            let placed = lease.file_name().to_str().unwrap().parse::<u64>().is_ok();
            let text = std::fs::read_to_string(lease.path()).unwrap_or_default();
            placed && text.contains("\"released\": false")
        })
    };
    while !held() {
        assert!(!old.is_finished(), "the old run ended before it leased");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let new_output = tempfile::tempdir().unwrap();
    let taken = ["--take-over-lease".to_string()];
    run(&taken, checkpoints.path(), new_output.path()).unwrap();
    let counts: HashMap<u64, u64> = common::committed(new_output.path()).into_iter().collect();
    assert_eq!(counts, expected_counts(RECORDS, KEYS, SEED));
    let err = old.join().unwrap().unwrap_err().to_string();
    assert!(err.contains("no longer holds"), "{err}");
    let kept = retained(&storage);
    let restored = tempfile::tempdir().unwrap();
    let explicit = format!(
        "--restore={}",
        job_dir(checkpoints.path())
            .join(kept[1].id.to_string())
            .display()
    );
    run(&[explicit], checkpoints.path(), restored.path()).unwrap();
    let counts: HashMap<u64, u64> = common::committed(restored.path()).into_iter().collect();
    assert_eq!(counts, expected_counts(RECORDS, KEYS, SEED));
}

/// A `FaultyStore` over the local directory `root`, registered as
/// `store://name`.
fn faulty_store(root: &Path, name: &str, plan: FaultPlan) -> Arc<FaultyStore> {
    let local = object_store::local::LocalFileSystem::new_with_prefix(root).unwrap();
    let store = Arc::new(FaultyStore::new(Arc::new(local), plan));
    tidemark::storage::register_store(name, store.clone());
    store
}

/// Storage that fails puts (some after they landed), reads and listings
/// and is slow, by seed, the leases' objects too: every schedule ends
/// exactly once, and storage holds exactly what the retained checkpoints
/// reference.
#[test]
fn every_seeded_storage_fault_schedule_ends_exactly_once_with_nothing_unreferenced_left() {
    const SEEDS: u64 = 4;
    // Multipart uploads of 1 KiB parts for objects above 4 KiB: most of
    // what a heap or merged snapshot writes here.
    let configs: [&[&str]; 3] = [
        &[
            "--state=heap",
            "--multipart-threshold=4KiB",
            "--upload-part-size=1KiB",
        ],
        &["--state=rocksdb", "--incremental"],
        &[
            "--state=rocksdb",
            "--incremental",
            "--file-merging",
            "--multipart-threshold=4KiB",
            "--upload-part-size=1KiB",
        ],
    ];
    let (mut schedules, mut faults) = (0, 0);
    for seed in 0..SEEDS {
        for (i, config) in configs.iter().enumerate() {
            let (root, output) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
            let name = format!("durability-faults-{seed}-{i}");
            let store = faulty_store(
                root.path(),
                &name,
                FaultPlan {
                    seed,
                    fail_put: 0.03,
                    fail_put_after: 0.03,
                    fail_get: 0.03,
                    slow: 0.05,
                    slow_by: std::time::Duration::from_millis(5),
                    stale_list: 0.3,
                    list_lag: std::time::Duration::from_millis(100),
                    ..FaultPlan::default()
                },
            );
            let mut args: Vec<String> = config.iter().map(|s| s.to_string()).collect();
            args.extend([
                format!("--checkpoint-dir=store://{name}"),
                "--emit=updates".into(),
                "--tolerable-failures=1000".into(),
                "--max-restarts=100".into(),
                "--inline-threshold=0".into(),
            ]);
            let context = format!("seed {seed}, {config:?}");
            let report =
                run(&args, root.path(), output.path()).unwrap_or_else(|e| panic!("{context}: {e}"));
            tidemark::storage::unregister_store(&name);
            assert!(report.checkpoints_completed > 0, "{context}");
            common::assert_updates_exactly_once(output.path(), RECORDS, KEYS, SEED, &context);
            let storage = open(root.path().to_str().unwrap());
            storage::assert_storage_is_exactly_the_retained_checkpoints(&storage, &context);
            schedules += 1;
            faults += store.counts().total();
        }
    }
    assert_eq!(schedules, SEEDS * configs.len() as u64);
    assert!(
        faults > schedules,
        "{faults} faults in {schedules} schedules"
    );
}

/// A run that retains fewer checkpoints than the one before subsumes the
/// extra ones on recovery, after counting the shared files they have in
/// common with the one it keeps: storage ends with exactly that one and
/// everything it references.
#[test]
fn lowering_retain_between_runs_subsumes_the_extra_checkpoints_whole() {
    let (root, output) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let incremental = ["--state=rocksdb".to_string(), "--incremental".into()];
    let mut first = incremental.to_vec();
    first.push("--retain=3".into());
    run(&first, root.path(), output.path()).unwrap();
    let storage = open(root.path().to_str().unwrap());
    assert_eq!(retained(&storage).len(), 3, "the first run retains three");

    let mut second = incremental.to_vec();
    second.extend(["--retain=1".into(), "--restore=latest".into()]);
    let again = tempfile::tempdir().unwrap();
    let report = run(&second, root.path(), again.path()).unwrap();
    assert!(report.restored_checkpoint.is_some());
    let kept = storage::assert_storage_is_exactly_the_retained_checkpoints(&storage, "retain 1");
    assert_eq!(
        kept.len(),
        1,
        "{:?}",
        kept.iter().map(|c| c.id).collect::<Vec<_>>()
    );
}

/// A run stopped with a savepoint committed its output up to it; the run
/// resumed from the savepoint dies before its first checkpoint; a third
/// run with `--restore latest` (as an elected leader would) starts from
/// the savepoint again, not from the first run's older checkpoints, and
/// the output is exactly once.
#[test]
fn latest_never_goes_back_past_the_savepoint_a_run_started_from() {
    let (root, output) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let savepoints = tempfile::tempdir().unwrap();
    let updates = |extra: &[&str]| -> Vec<String> {
        let mut args = vec!["--emit=updates".to_string(), "--retain=3".into()];
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    };
    let first = updates(&[
        "--rate=100000",
        "--stop-with-savepoint-after=500ms",
        &format!("--savepoint-dir={}", savepoints.path().display()),
    ]);
    let stopped = run(&first, root.path(), output.path()).unwrap();
    let savepoint = stopped
        .savepoint
        .clone()
        .expect("the run stopped with a savepoint");
    assert!(stopped.checkpoints_completed > 1, "{stopped:?}");

    // The resumed run's first checkpoint fails its source, and with it
    // the run, before anything of the run is committed.
    let counter = job_dir(root.path()).join(tidemark::storage::COUNTER);
    let next: u64 = std::fs::read_to_string(counter)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let resumed = updates(&[
        &format!("--restore={savepoint}"),
        &format!("--inject-fault=sync-snapshot:{next}:0:0"),
        "--max-restarts=0",
    ]);
    let err = run(&resumed, root.path(), output.path()).unwrap_err();
    assert!(!err.to_string().is_empty());

    let latest = updates(&["--restore=latest"]);
    let report = run(&latest, root.path(), output.path()).unwrap();
    // The first run's retained checkpoints are older than its savepoint:
    // restoring one would write its output up to the savepoint again
    // (the file sink's names hide that; an appending sink would not).
    let dir = tidemark::storage::CheckpointStorage::open_directory(&savepoint, false).unwrap();
    let at = storage::block_on(dir.read_metadata_at(tidemark::storage::METADATA)).unwrap();
    assert_eq!(report.restored_checkpoint, Some(at.id.0), "{report:?}");
    let context = "stopped, resumed and lost, then latest";
    common::assert_updates_exactly_once(output.path(), RECORDS, KEYS, SEED, context);
}

/// Every read and write of a lease takes a fifth of the lease's time to
/// live, as 6 s would of a 30 s lease: the run renews on a beat of its
/// own, is never fenced, and no checkpoint fails.
#[test]
fn lease_calls_a_fifth_of_its_time_to_live_slow_fence_nothing() {
    let (root, output) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let name = "durability-slow-lease";
    let store = faulty_store(
        root.path(),
        name,
        FaultPlan {
            slow: 1.0,
            slow_by: std::time::Duration::from_millis(1_200),
            targets: vec![tidemark::storage::lease::LEASES.into()],
            ..FaultPlan::default()
        },
    );
    // 200,000 records at 14,000 a second: 14 s, over two times to live.
    let args = [
        format!("--checkpoint-dir=store://{name}"),
        "--lease-ttl=6s".into(),
        "--rate=14000".into(),
        "--checkpoint-interval=200ms".into(),
    ];
    let report = run(&args, root.path(), output.path()).unwrap();
    tidemark::storage::unregister_store(name);
    assert_eq!(report.checkpoints_failed, 0, "{report:?}");
    assert_eq!(report.restarts, 0, "{report:?}");
    assert!(report.checkpoints_completed >= 5, "{report:?}");
    let slowed = store
        .counts()
        .slowed
        .load(std::sync::atomic::Ordering::Relaxed);
    // A renewal (a write) every 1.2 s for over 14 s.
    assert!(slowed >= 10, "{slowed} lease calls slowed");
}

/// A power loss after a checkpoint completed drops whatever was being
/// written; the run after it (taking the dead run's lease over) restores
/// the latest checkpoint, and the output is exactly once.
#[test]
fn after_a_power_loss_the_latest_checkpoint_restores_exactly_once() {
    for config in [&["--state=heap"][..], &["--state=rocksdb", "--incremental"]] {
        let (root, output) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let name = format!("durability-power-{}", config.len());
        let store = faulty_store(root.path(), &name, FaultPlan::default());
        let mut args: Vec<String> = config.iter().map(|s| s.to_string()).collect();
        args.extend([
            format!("--checkpoint-dir=store://{name}"),
            "--emit=updates".into(),
            "--rate=100000".into(),
            "--max-restarts=2".into(),
        ]);
        let job = spawn(args.clone(), root.path(), output.path());
        // Once the sink committed a checkpoint's output, that checkpoint
        // must survive the power loss.
        await_checkpoint(root.path(), &job);
        while common::committed_lines(output.path()).is_empty() {
            assert!(!job.is_finished(), "{config:?}: the job ended early");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        store.power_loss();
        let err = job.join().unwrap().unwrap_err().to_string();
        assert!(err.contains("the power"), "{config:?}: {err}");
        store.power_on();
        args.extend(["--restore=latest".into(), "--take-over-lease".into()]);
        let report = run(&args, root.path(), output.path()).unwrap();
        tidemark::storage::unregister_store(&name);
        assert!(report.restored_checkpoint.is_some(), "{config:?}");
        let context = format!("power loss, {config:?}");
        common::assert_updates_exactly_once(output.path(), RECORDS, KEYS, SEED, &context);
        let storage = open(root.path().to_str().unwrap());
        storage::assert_storage_is_exactly_the_retained_checkpoints(&storage, &context);
    }
}

/// An object above the multipart threshold reaches S3 as a multipart upload
/// of 5 MiB parts (S3's least), written in pieces that do not line up with
/// the parts, and reads back whole.
#[test]
fn a_multipart_upload_to_s3_reads_back_whole() {
    let Some(s3) = storage::TestStorage::s3("multipart") else {
        return;
    };
    let bytes: Vec<u8> = (0..12u32 << 20).map(|i| (i % 251) as u8).collect();
    let limits = tidemark::checkpoint::merging::UploadLimits {
        multipart_threshold: 5 << 20,
        part_size: 5 << 20,
        parts_in_flight: 2,
    };
    storage::block_on(async {
        let mut writer = s3.storage.writer("chk-1/big", limits).unwrap();
        for piece in bytes.chunks(3 << 20) {
            let piece = bytes::Bytes::copy_from_slice(piece);
            writer.write(piece).await.unwrap();
        }
        writer.finish().await.unwrap();
        assert_eq!(s3.storage.get("chk-1/big").await.unwrap(), bytes);
    });
}
