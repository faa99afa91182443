//! State TTL end to end: `tidemark run wordcount --state-ttl D`. Counts
//! with a TTL longer than the run count exactly once across injected
//! failures, and through savepoints taken with and without a TTL and
//! restored the other way (the TTL migration), on both state backends. A
//! TTL shorter than the gaps between a key's records restarts its counts.

use tidemark_testkit as common;

use std::path::Path;

const RECORDS: u64 = 200_000;
const KEYS: u64 = 1_000;
const SEED: u64 = 11;

/// Wordcount emitting every update at p=2 into `output`, checkpointing
/// every 50 ms under `root`, slow enough (about 1 s) for several
/// checkpoints and a savepoint to fall inside.
fn args(root: &Path, output: &Path) -> Vec<String> {
    vec![
        "wordcount".to_string(),
        format!("--records={RECORDS}"),
        format!("--keys={KEYS}"),
        format!("--seed={SEED}"),
        "--emit=updates".into(),
        "--parallelism=2".into(),
        "--rate=200000".into(),
        "--checkpoint-interval=50ms".into(),
        format!("--checkpoint-dir={}", root.join("checkpoints").display()),
        format!("--output={}", output.display()),
    ]
}

#[test]
fn counts_with_a_ttl_are_exactly_once_across_injected_failures() {
    for state in ["--state=heap", "--state=rocksdb"] {
        let root = tempfile::tempdir().unwrap();
        let output = root.path().join("out");
        let extra = [
            state.to_string(),
            "--state-ttl=1h".into(),
            "--inject-failures=3".into(),
        ];
        let report = common::run_overriding(args(root.path(), &output), &extra)
            .unwrap_or_else(|e| panic!("{state}: {e}"));
        assert_eq!(report.restarts, 3, "{state}");
        common::assert_updates_exactly_once(&output, RECORDS, KEYS, SEED, state);
    }
}

/// A savepoint of counts without TTL restores into counts with one, whose
/// savepoint restores into counts without again: every update once.
#[test]
fn savepoints_restore_into_counts_with_a_ttl_and_back() {
    for state in ["--state=heap", "--state=rocksdb"] {
        let root = tempfile::tempdir().unwrap();
        let output = root.path().join("out");
        let base = args(root.path(), &output);
        let savepoints = format!("--savepoint-dir={}", root.path().join("sp").display());
        let mut restore: Vec<String> = Vec::new();
        for (step, ttl) in ["", "--state-ttl=1h"].into_iter().enumerate() {
            let mut extra = restore.clone();
            extra.extend([
                state.to_string(),
                savepoints.clone(),
                "--stop-with-savepoint-after=300ms".into(),
                format!(
                    "--checkpoint-dir={}",
                    root.path().join(format!("run-{step}")).display()
                ),
            ]);
            extra.extend((!ttl.is_empty()).then(|| ttl.to_string()));
            let stopped = common::run_overriding(base.clone(), &extra)
                .unwrap_or_else(|e| panic!("{state} {ttl}: {e}"));
            assert!(stopped.records_in < RECORDS, "{state} {ttl}: ended early");
            let savepoint = stopped.savepoint.expect("the savepoint completed");
            restore = vec![format!("--restore={savepoint}")];
        }
        restore.extend([
            state.to_string(),
            format!("--checkpoint-dir={}", root.path().join("run-2").display()),
        ]);
        common::run_overriding(base, &restore).unwrap_or_else(|e| panic!("{state}: {e}"));
        common::assert_updates_exactly_once(&output, RECORDS, KEYS, SEED, state);
    }
}

/// At 200,000 records/s over 1,000 keys a key comes back every 5 ms on
/// average: with a TTL of 1 ms its count restarts at 1 over and over (all
/// records of a batch see one processing time), where without a TTL each
/// key counts 1 once and goes on to about 200.
#[test]
fn a_short_ttl_restarts_the_counts_of_keys_not_seen_for_that_long() {
    let root = tempfile::tempdir().unwrap();
    let output = root.path().join("out");
    let extra = ["--state-ttl=1ms".to_string()];
    common::run_overriding(args(root.path(), &output), &extra).unwrap();
    let updates = common::committed(&output);
    assert_eq!(updates.len() as u64, RECORDS);
    let restarts = updates.iter().filter(|(_, count)| *count == 1).count() as u64;
    assert!(
        restarts > 10 * KEYS,
        "{restarts} of {RECORDS} updates counted 1 (without a TTL: {KEYS})"
    );
}
