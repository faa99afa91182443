//! End-to-end exactly-once: wordcount with `--emit updates` under injected
//! failures, checked from the committed files alone.

use tidemark_testkit as common;
use tidemark_testkit::storage;

use common::assert_updates_exactly_once;
use std::path::Path;
use storage::{
    assert_storage_is_exactly_the_retained_checkpoints, block_on, retained, TestStorage,
};
use tidemark::model::ids::{OperatorId, SubtaskId, SubtaskIndex};
use tidemark::storage::CheckpointStorage;
use tidemark_cli::RunReport;

const RECORDS: u64 = 300_000;
const KEYS: u64 = 2_000;

/// `checkpoints`: the checkpoint storage URL.
fn run(seed: u64, extra: &[String], output: &Path, checkpoints: &str) -> RunReport {
    let args = vec![
        "wordcount".to_string(),
        format!("--records={RECORDS}"),
        format!("--keys={KEYS}"),
        format!("--seed={seed}"),
        "--parallelism=2".to_string(),
        // Slow enough that several checkpoints fall inside the run.
        "--rate=1000000".to_string(),
        "--emit=updates".to_string(),
        "--checkpoint-interval=100ms".to_string(),
        format!("--checkpoint-dir={checkpoints}"),
        format!("--output={}", output.display()),
    ];
    // An argument in `extra` replaces the default of the same name.
    common::run_overriding(args, extra).unwrap_or_else(|e| panic!("seed {seed}: {e}"))
}

/// Runs seeds `0..seeds` with `extra` (which injects the failures), each on
/// its own storage from `storage`, and checks what every run must leave:
/// every update committed exactly once, at least one restart, no uncommitted
/// output file, and only the retained checkpoint in storage. Returns the
/// reports.
fn kills(seeds: u64, extra: &[&str], storage: impl Fn() -> TestStorage) -> Vec<RunReport> {
    let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    (0..seeds)
        .map(|seed| {
            let (output, checkpoints) = (tempfile::tempdir().unwrap(), storage());
            let report = run(seed, &extra, output.path(), &checkpoints.url);
            let context = format!("{extra:?} {} seed {seed}", checkpoints.url);
            assert_updates_exactly_once(output.path(), RECORDS, KEYS, seed, &context);
            assert!(report.restarts >= 1, "{context}: no failure was injected");
            common::assert_no_uncommitted_files(output.path(), &context);
            assert_only_the_retained_checkpoint_remains(&checkpoints.storage, seed);
            report
        })
        .collect()
}

/// Five random kills per seed over `seeds`.
fn random_kills(seeds: u64, storage: impl Fn() -> TestStorage) {
    let restarts: u64 = kills(seeds, &["--inject-failures=5"], storage)
        .iter()
        .map(|r| r.restarts)
        .sum();
    assert!(
        restarts >= 4 * seeds,
        "only {restarts} restarts over {seeds} seeds of 5 kills"
    );
}

#[test]
fn random_kills_lose_and_duplicate_nothing_over_twenty_seeds() {
    random_kills(20, TestStorage::local);
}

#[test]
fn random_kills_on_memory_storage_lose_and_duplicate_nothing() {
    random_kills(5, TestStorage::memory);
}

#[test]
fn random_kills_on_s3_lose_and_duplicate_nothing() {
    const TEST: &str = "random_kills_on_s3";
    if TestStorage::s3(TEST).is_some() {
        random_kills(5, || TestStorage::s3(TEST).unwrap());
    }
}

/// The kills of the test above with the counter's subtask 0 slow, so that
/// the sources are backpressured and the channels are full when barriers
/// pass. Returns the in-flight batches that restores replayed and the
/// checkpoints that switched to unaligned, over 20 seeds.
fn kills_under_backpressure(mode: &str) -> (u64, u64) {
    let reports = kills(
        20,
        &[
            "--inject-failures=3",
            "--slow-subtask=0",
            "--slow-ns=4000",
            mode,
        ],
        TestStorage::local,
    );
    (
        reports.iter().map(|r| r.restored_inflight_batches).sum(),
        reports
            .iter()
            .map(|r| r.checkpoints_switched_to_unaligned)
            .sum(),
    )
}

#[test]
fn unaligned_checkpoints_under_backpressure_and_kills_are_exactly_once() {
    let (replayed, switched) = kills_under_backpressure("--mode=unaligned");
    assert!(
        replayed > 0,
        "no restore replayed in-flight batches in 20 seeds"
    );
    assert_eq!(switched, 0, "nothing to switch: unaligned from the start");
}

/// Subtask 0 and subtask 1 on workers of their own: the channels between
/// them cross loopback TCP, and barriers overtake what credit let onto it.
#[test]
fn kills_across_workers_are_exactly_once_aligned_and_unaligned() {
    for mode in ["--mode=aligned", "--mode=unaligned"] {
        let reports = kills(
            4,
            &[
                "--inject-failures=3",
                "--slow-subtask=0",
                "--slow-ns=4000",
                "--local-workers=2",
                mode,
            ],
            TestStorage::local,
        );
        assert!(reports.iter().all(|r| r.link_bytes_sent > 0), "{mode}");
        if mode == "--mode=unaligned" {
            let replayed: u64 = reports.iter().map(|r| r.restored_inflight_batches).sum();
            assert!(replayed > 0, "no restore replayed in-flight batches");
        }
    }
}

#[test]
fn rocksdb_incremental_unaligned_kills_across_workers_are_exactly_once() {
    kills(
        3,
        &[
            "--state=rocksdb",
            "--incremental",
            "--inject-failures=3",
            "--mode=unaligned",
            "--local-workers=2",
        ],
        TestStorage::local,
    );
}

#[test]
fn aligned_timeout_zero_under_backpressure_and_kills_is_exactly_once() {
    let (_, switched) = kills_under_backpressure("--aligned-timeout=0s");
    assert!(switched > 0, "no checkpoint switched to unaligned");
}

/// Both sources' barriers reach the slow subtask at about the same depth,
/// so alignments rarely last 50 ms here: this run checks that whatever each
/// subtask decides, the result is exactly once. The switch at exactly the
/// timeout is tested in `checkpoint::barrier`.
#[test]
fn aligned_timeout_50ms_under_backpressure_and_kills_is_exactly_once() {
    kills_under_backpressure("--aligned-timeout=50ms");
}

/// Random kills on RocksDB state with incremental checkpoints: restores
/// download native checkpoints whose shared files earlier checkpoints
/// uploaded.
fn rocksdb_kills(seeds: u64, extra: &[&str], storage: impl Fn() -> TestStorage) {
    let rocksdb = ["--inject-failures=3", "--state=rocksdb", "--incremental"];
    kills(seeds, &[&rocksdb[..], extra].concat(), storage);
}

#[test]
fn rocksdb_incremental_aligned_under_kills_is_exactly_once() {
    rocksdb_kills(20, &[], TestStorage::local);
}

#[test]
fn rocksdb_incremental_unaligned_under_backpressure_and_kills_is_exactly_once() {
    rocksdb_kills(
        20,
        &["--mode=unaligned", "--slow-subtask=0", "--slow-ns=4000"],
        TestStorage::local,
    );
}

/// Shared files uploaded to and downloaded from S3 by restores.
#[test]
fn rocksdb_incremental_kills_on_s3_are_exactly_once() {
    const TEST: &str = "rocksdb_incremental_kills_on_s3";
    if TestStorage::s3(TEST).is_some() {
        rocksdb_kills(3, &[], || TestStorage::s3(TEST).unwrap());
    }
}

/// Merged files: the SSTs, private files and (unaligned) channel state of a
/// subtask's checkpoint are segments of few physical files, shared between
/// checkpoints through the registry.
#[test]
fn rocksdb_incremental_with_file_merging_under_kills_is_exactly_once() {
    rocksdb_kills(
        10,
        &["--file-merging", "--inline-threshold=1KiB"],
        TestStorage::local,
    );
    rocksdb_kills(
        5,
        &[
            "--file-merging",
            "--inline-threshold=0",
            "--mode=unaligned",
            "--slow-subtask=0",
            "--slow-ns=4000",
        ],
        TestStorage::local,
    );
}

#[test]
fn heap_state_with_file_merging_and_nothing_inline_under_kills_is_exactly_once() {
    kills(
        5,
        &[
            "--inject-failures=3",
            "--file-merging",
            "--inline-threshold=0",
        ],
        TestStorage::local,
    );
}

#[test]
fn rocksdb_incremental_with_file_merging_on_s3_is_exactly_once() {
    const TEST: &str = "rocksdb_merging_on_s3";
    if TestStorage::s3(TEST).is_some() {
        rocksdb_kills(3, &["--file-merging", "--inline-threshold=1KiB"], || {
            TestStorage::s3(TEST).unwrap()
        });
    }
}

/// Checkpoints written without file merging restore with it, and the other
/// way round: a job runs half its input, then goes on from its latest
/// checkpoint with merging switched, under kills, into the same output.
#[test]
fn checkpoints_restore_across_a_change_of_file_merging() {
    for (first, second) in [(false, true), (true, false)] {
        let (output, checkpoints) = (tempfile::tempdir().unwrap(), TestStorage::local());
        let merging = |on: bool| on.then(|| "--file-merging".to_string());
        let half = format!("--records={}", RECORDS / 2);
        let mut args = vec![
            "--state=rocksdb".to_string(),
            "--incremental".to_string(),
            half,
        ];
        args.extend(merging(first));
        run(11, &args, output.path(), &checkpoints.url);
        let mut args = vec![
            "--state=rocksdb".to_string(),
            "--incremental".to_string(),
            "--restore=latest".to_string(),
            "--inject-failures=2".to_string(),
        ];
        args.extend(merging(second));
        let report = run(11, &args, output.path(), &checkpoints.url);
        let context = format!("merging {first} then {second}");
        assert!(report.restored_bytes > 0, "{context}: nothing restored");
        assert_updates_exactly_once(output.path(), RECORDS, KEYS, 11, &context);
        assert_only_the_retained_checkpoint_remains(&checkpoints.storage, 11);
    }
}

/// A run restored from the final checkpoint of a run that read less goes on
/// reading, and checkpoints as usual: that checkpoint holds every source as
/// exhausted, but only in the run that took it does that end the input.
#[test]
fn a_run_restored_from_the_final_checkpoint_of_a_shorter_run_checkpoints() {
    let (output, checkpoints) = (tempfile::tempdir().unwrap(), TestStorage::local());
    let half = format!("--records={}", RECORDS / 2);
    let first = run(17, &[half], output.path(), &checkpoints.url);
    assert!(first.checkpoints_completed > 0);
    let args = [
        "--restore=latest".to_string(),
        "--inject-failures=2".to_string(),
    ];
    let report = run(17, &args, output.path(), &checkpoints.url);
    assert!(report.restored_bytes > 0, "nothing restored");
    assert!(
        report.checkpoints_completed > 0,
        "the restored run took no checkpoint"
    );
    assert_updates_exactly_once(
        output.path(),
        RECORDS,
        KEYS,
        17,
        "after the final checkpoint",
    );
    assert_only_the_retained_checkpoint_remains(&checkpoints.storage, 17);
}

/// A checkpoint that times out while a subtask's upload is still running
/// cancels that upload, which deletes what it wrote: nothing of the
/// checkpoint is left, though its subtask never acknowledged.
#[test]
fn an_aborted_checkpoint_cancels_the_running_upload_and_deletes_its_files() {
    for merging in [&[][..], &["--file-merging".to_string()][..]] {
        let (output, checkpoints) = (tempfile::tempdir().unwrap(), TestStorage::local());
        let mut args = vec![
            "--state=rocksdb".to_string(),
            "--incremental".to_string(),
            "--inline-threshold=0".to_string(),
            "--inject-fault=stall-after-write:3:1:0".to_string(),
            "--timeout=500ms".to_string(),
            "--tolerable-failures=1".to_string(),
        ];
        args.extend_from_slice(merging);
        let report = run(13, &args, output.path(), &checkpoints.url);
        let context = format!("{merging:?}");
        assert_eq!(report.restarts, 0, "{context}: the stall is no failure");
        assert!(
            report.checkpoints_failed >= 1,
            "{context}: chk-3 did not expire"
        );
        assert_updates_exactly_once(output.path(), RECORDS, KEYS, 13, &context);
        let kept =
            assert_storage_is_exactly_the_retained_checkpoints(&checkpoints.storage, &context);
        assert!(kept[0].id.0 > 3, "{context}");
    }
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
        let (output, checkpoints) = (tempfile::tempdir().unwrap(), TestStorage::local());
        let report = run(
            7,
            &[format!("--inject-fault={fault}")],
            output.path(),
            &checkpoints.url,
        );
        assert_eq!(report.restarts, 1, "{fault}");
        assert_updates_exactly_once(output.path(), RECORDS, KEYS, 7, fault);
    }
}

/// A failed upload declines its checkpoint instead of failing the subtask:
/// within the tolerable failures the job goes on without a restart, later
/// checkpoints complete, and the output is exactly once.
#[test]
fn a_failed_upload_declines_its_checkpoint_and_processing_goes_on() {
    for fault in ["async-write:2:1:1", "async-write:2:0:0"] {
        let (output, checkpoints) = (tempfile::tempdir().unwrap(), TestStorage::local());
        let report = run(
            7,
            &[
                format!("--inject-fault={fault}"),
                "--tolerable-failures=1".to_string(),
            ],
            output.path(),
            &checkpoints.url,
        );
        assert_eq!(report.restarts, 0, "{fault}");
        assert!(report.checkpoints_failed >= 1, "{fault}");
        assert!(report.checkpoints_completed >= 1, "{fault}");
        assert_updates_exactly_once(output.path(), RECORDS, KEYS, 7, fault);
        assert_storage_is_exactly_the_retained_checkpoints(&checkpoints.storage, fault);
    }
}

#[test]
fn ids_keep_increasing_when_the_job_is_run_again_on_its_checkpoints() {
    let (output, checkpoints) = (tempfile::tempdir().unwrap(), TestStorage::local());
    run(1, &[], output.path(), &checkpoints.url);
    let first = newest_checkpoint(&checkpoints.storage);
    let output = tempfile::tempdir().unwrap();
    run(1, &[], output.path(), &checkpoints.url);
    assert!(newest_checkpoint(&checkpoints.storage) > first);
}

/// After the run, storage holds the id counter and the one retained
/// checkpoint with exactly the objects it references, the counter's keyed
/// state among them.
fn assert_only_the_retained_checkpoint_remains(storage: &CheckpointStorage, seed: u64) {
    let context = format!("seed {seed}");
    let kept = assert_storage_is_exactly_the_retained_checkpoints(storage, &context);
    assert_eq!(kept.len(), 1, "{context}");
    let counter = SubtaskId {
        operator: OperatorId(1),
        index: SubtaskIndex(0),
    };
    assert!(kept[0].subtasks[&counter].keyed.is_some(), "{context}");
}

fn newest_checkpoint(storage: &CheckpointStorage) -> u64 {
    retained(storage).last().unwrap().id.0
}

#[test]
fn a_fresh_run_fails_over_to_its_own_checkpoints_not_an_earlier_runs() {
    let checkpoints = TestStorage::local();
    let earlier = tempfile::tempdir().unwrap();
    run(5, &[], earlier.path(), &checkpoints.url);
    // The next run's first checkpoint fails: nothing of its own completed
    // yet, so it restarts from the beginning, not from the earlier run's end.
    let first = newest_checkpoint(&checkpoints.storage) + 1;
    let output = tempfile::tempdir().unwrap();
    let report = run(
        5,
        &[format!("--inject-fault=sync-snapshot:{first}:1:0")],
        output.path(),
        &checkpoints.url,
    );
    assert_eq!(report.restarts, 1);
    assert_updates_exactly_once(output.path(), RECORDS, KEYS, 5, "second run");
}

/// Without failures, every object a run created is deleted or still in
/// storage, and every byte in storage was counted as uploaded.
fn storage_counters_match_what_storage_holds(checkpoints: TestStorage, extra: &[&str]) {
    let output = tempfile::tempdir().unwrap();
    // Slow enough for several checkpoints whatever storage latency costs.
    let mut args = vec!["--retain=2".to_string(), "--rate=300000".to_string()];
    args.extend(extra.iter().map(|s| s.to_string()));
    let report = run(3, &args, output.path(), &checkpoints.url);
    let context = &checkpoints.url;
    assert!(report.checkpoints_completed >= 3, "{context}: {report:?}");
    let listed = block_on(checkpoints.storage.objects()).unwrap();
    assert!(report.objects_deleted > 0, "{context}: nothing subsumed");
    assert_eq!(
        report.objects_created - report.objects_deleted,
        listed.len() as u64,
        "{context}: {listed:?}"
    );
    let stored: u64 = listed.iter().map(|o| o.size).sum();
    assert!(report.bytes_uploaded >= stored, "{context}");
    assert!(
        report.bytes_uploaded >= report.bytes_uploaded_total,
        "{context}"
    );
}

#[test]
fn storage_counters_match_local_storage() {
    storage_counters_match_what_storage_holds(TestStorage::local(), &[]);
}

#[test]
fn storage_counters_match_memory_storage() {
    storage_counters_match_what_storage_holds(TestStorage::memory(), &[]);
}

/// Subsumed RocksDB checkpoints leave private files in their directories
/// that the registry also releases: each is counted deleted once.
#[test]
fn storage_counters_match_memory_storage_with_incremental_rocksdb() {
    storage_counters_match_what_storage_holds(
        TestStorage::memory(),
        &["--state=rocksdb", "--incremental", "--inline-threshold=0"],
    );
}

#[test]
fn storage_counters_match_s3_storage() {
    if let Some(storage) = TestStorage::s3("storage_counters") {
        storage_counters_match_what_storage_holds(storage, &[]);
    }
}
