//! The topologies writing into a real PostgreSQL server (`cargo xtask
//! test` starts one and sets `TIDEMARK_TEST_POSTGRES`) through the
//! two-phase-commit sink: every update exactly once across injected
//! failures, a fault at each step of a checkpoint, a SIGKILL and a
//! rescale, with no prepared transaction left.
#![cfg(feature = "postgres")]

use tidemark_testkit as common;
use tidemark_testkit::postgres;

use common::{expected_counts, run};
use postgres::{server, Table};
use std::collections::HashMap;
use std::path::Path;
use tidemark_cli::{self as cli, RunArgs};

const CHILD: &str = "TIDEMARK_POSTGRES_SINK_CHILD_ARGS";
const RECORDS: u64 = 100_000;
const KEYS: u64 = 1_000;

/// The sink's table, and what the tests expect of it.
struct Counts(Table);

impl Counts {
    fn new(url: &str, name: &'static str) -> Self {
        Counts(Table::new(url, name))
    }

    /// Committed `(key, count)` rows.
    fn rows(&self) -> Vec<(i64, i64)> {
        let rows = self.0.rows("key, count");
        rows.into_iter().map(|r| (r[0], r[1])).collect()
    }

    fn prepared(&self) -> Vec<String> {
        self.0.prepared()
    }

    /// In append mode every update is a row: each key's counts are
    /// exactly 1..=c(key), no duplicate, no gap; and nothing is left
    /// prepared.
    fn assert_updates_exactly_once(&self, seed: u64, context: &str) {
        let expected = expected_counts(RECORDS, KEYS, seed);
        let mut seen: HashMap<u64, Vec<u64>> = HashMap::new();
        for (key, count) in self.rows() {
            seen.entry(key as u64).or_default().push(count as u64);
        }
        assert_eq!(seen.len(), expected.len(), "{context}: keys in the table");
        for (key, mut counts) in seen {
            counts.sort_unstable();
            let want: Vec<u64> = (1..=expected[&key]).collect();
            assert!(
                counts == want,
                "{context}: key {key} has {} rows for {} records",
                counts.len(),
                want.len()
            );
        }
        assert!(
            self.prepared().is_empty(),
            "{context}: {:?} left prepared",
            self.prepared()
        );
    }

    /// In upsert mode the table holds each key's final count.
    fn assert_final_counts(&self, seed: u64, context: &str) {
        let expected = expected_counts(RECORDS, KEYS, seed);
        let got: HashMap<u64, u64> = self
            .rows()
            .into_iter()
            .map(|(k, c)| (k as u64, c as u64))
            .collect();
        assert_eq!(got, expected, "{context}");
        assert!(self.prepared().is_empty(), "{context}: left prepared");
    }
}

fn args(url: &str, table: &str, mode: &str, seed: u64, checkpoints: &Path) -> Vec<String> {
    vec![
        "wordcount".to_string(),
        format!("--records={RECORDS}"),
        format!("--keys={KEYS}"),
        format!("--seed={seed}"),
        "--parallelism=2".into(),
        // Slow enough that several checkpoints fall inside the run.
        "--rate=200000".into(),
        "--emit=updates".into(),
        "--checkpoint-interval=50ms".into(),
        format!("--checkpoint-dir={}", checkpoints.display()),
        format!("--sink={url}?table={table}&mode={mode}"),
    ]
}

/// The child's entry point; a no-op when the test runs normally.
#[test]
fn child_runs_the_job() {
    common::run_child_job(CHILD);
}

#[test]
fn appended_updates_are_exactly_once_across_injected_failures() {
    let Some(url) = server("TIDEMARK_TEST_POSTGRES") else {
        return;
    };
    let table = Counts::new(&url, "wordcount_append");
    let root = tempfile::tempdir().unwrap();
    let mut args = args(&url, &table.0.name, "append", 7, root.path());
    args.push("--inject-failures=3".into());
    let report = run(&args);
    assert!(report.restarts >= 1, "no failure was injected");
    table.assert_updates_exactly_once(7, "append, 3 failures");
}

#[test]
fn upserted_counts_are_final_across_injected_failures() {
    let Some(url) = server("TIDEMARK_TEST_POSTGRES") else {
        return;
    };
    let table = Counts::new(&url, "wordcount_upsert");
    let root = tempfile::tempdir().unwrap();
    let mut args = args(&url, &table.0.name, "upsert", 8, root.path());
    args.push("--inject-failures=3".into());
    let report = run(&args);
    assert!(report.restarts >= 1, "no failure was injected");
    table.assert_final_counts(8, "upsert, 3 failures");
}

#[test]
fn a_fault_at_each_step_of_the_two_phase_commit_is_survived() {
    let Some(url) = server("TIDEMARK_TEST_POSTGRES") else {
        return;
    };
    // Operator 1 is the counter chained to the sink. A failed commit
    // leaves checkpoint 2's transaction prepared for the restore to
    // commit; a failure after the acknowledgement leaves it for the
    // restore from checkpoint 1 to roll back.
    for (fault, name) in [
        ("sink-commit:2:1:0", "fault_sink_commit"),
        ("after-ack:2:1:1", "fault_after_ack"),
        ("sync-snapshot:2:1:0", "fault_sync_snapshot"),
    ] {
        let table = Counts::new(&url, name);
        let root = tempfile::tempdir().unwrap();
        let mut args = args(&url, name, "append", 11, root.path());
        args.push(format!("--inject-fault={fault}"));
        let report = run(&args);
        assert_eq!(report.restarts, 1, "{fault}");
        table.assert_updates_exactly_once(11, fault);
    }
}

#[test]
fn a_job_killed_with_sigkill_and_restored_from_latest_appends_each_update_once() {
    let Some(url) = server("TIDEMARK_TEST_POSTGRES") else {
        return;
    };
    let table = Counts::new(&url, "wordcount_sigkill");
    let root = tempfile::tempdir().unwrap();
    let checkpoints = root.path().join("checkpoints");
    let args = args(&url, &table.0.name, "append", 9, &checkpoints);
    // Killed with transactions committed, and likely some prepared.
    let committed = || !table.rows().is_empty();
    common::kill_when_committed_then_restore_latest(CHILD, &args, &checkpoints, committed, || {});
    table.assert_updates_exactly_once(9, "SIGKILL, then --restore latest");
}

#[test]
fn a_rescaled_job_appends_each_update_once() {
    let Some(url) = server("TIDEMARK_TEST_POSTGRES") else {
        return;
    };
    for (parallelism, name) in [(3, "wordcount_rescale_up"), (1, "wordcount_rescale_down")] {
        let table = Counts::new(&url, name);
        let root = tempfile::tempdir().unwrap();
        let args = args(&url, name, "append", 10, &root.path().join("checkpoints"));
        // Slow enough (1 s) that the savepoint falls inside the run.
        let slow = ["--rate=100000".to_string()];
        common::rescale_from_savepoint(&args, &slow, root.path(), parallelism, RECORDS);
        table.assert_updates_exactly_once(10, &format!("p=2 → {parallelism}"));
    }
}

#[test]
fn a_server_without_prepared_transactions_is_refused_naming_the_setting() {
    let Some(url) = server("TIDEMARK_TEST_POSTGRES_STOCK") else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let args = args(&url, "refused", "upsert", 1, root.path());
    let error = cli::run(&RunArgs::parse(&args).unwrap())
        .unwrap_err()
        .to_string();
    assert!(error.contains("max_prepared_transactions is 0"), "{error}");
}
