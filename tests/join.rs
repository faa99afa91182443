//! The join topology end to end: `tidemark run join` pairs every left record
//! with every right record of its key whose timestamp is at most the
//! interval away, and each pair is committed exactly once, checked line for
//! line against the pairs this file computes from the generators'
//! definition: at parallelism 1 and 3 (with a tight and a wide interval),
//! under injected kills on heap and incremental RocksDB state, aligned and
//! unaligned, with a slow join subtask; after a SIGKILL of the process and
//! `--restore latest`; and across a savepoint taken at p=2 while records
//! wait in the join's buffers, restored at p=1 and p=3.

use tidemark_testkit as common;
use tidemark_testkit::storage;

use common::{copy_tree, splitmix64};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use tidemark::storage::CheckpointStorage;
use tidemark_actors::runtime::job_id;
use tidemark_cli::{RunReport, Topology};

/// One join job's inputs and interval.
#[derive(Clone, Copy, Debug)]
struct Spec {
    /// Records of each side.
    records: u64,
    keys: u64,
    /// The left side's seed; the right side's is `splitmix64(seed)`.
    seed: u64,
    events_per_ms: u64,
    max_disorder_ms: u64,
    interval_ms: u64,
}

/// 100 keys over 4 s of event time, about 4 pairs per record.
const JOIN: Spec = Spec {
    records: 40_000,
    keys: 100,
    seed: 1,
    events_per_ms: 10,
    max_disorder_ms: 50,
    interval_ms: 20,
};

/// An interval of 0: only records of one key with the very same timestamp
/// pair, with a disorder of 30 ms, much wider than the interval.
const TIGHT: Spec = Spec {
    records: 40_000,
    keys: 20,
    seed: 2,
    events_per_ms: 10,
    max_disorder_ms: 30,
    interval_ms: 0,
};

/// One output line: `key,left,right`, the indices of the paired records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Pair {
    key: u64,
    left: u64,
    right: u64,
}

impl Spec {
    fn with_seed(self, seed: u64) -> Spec {
        Spec { seed, ..self }
    }

    fn with_records(self, records: u64) -> Spec {
        Spec { records, ..self }
    }

    fn with_interval(self, interval_ms: u64) -> Spec {
        Spec {
            interval_ms,
            ..self
        }
    }

    /// Record i of the side with seed `seed`: (key, timestamp), as the
    /// topology's brief defines it.
    fn record(&self, seed: u64, i: u64) -> (u64, u64) {
        let s = seed.wrapping_add(i);
        let key = splitmix64(s) % self.keys;
        let lag = splitmix64(s.wrapping_add(0x9E37_79B9_7F4A_7C15)) % (self.max_disorder_ms + 1);
        (key, (i / self.events_per_ms).saturating_sub(lag))
    }

    fn left(&self, i: u64) -> (u64, u64) {
        self.record(self.seed, i)
    }

    fn right(&self, i: u64) -> (u64, u64) {
        self.record(splitmix64(self.seed), i)
    }

    /// The right records of each key, as (timestamp, index), sorted.
    fn right_by_key(&self) -> HashMap<u64, Vec<(u64, u64)>> {
        let mut by_key: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
        for j in 0..self.records {
            let (key, ts) = self.right(j);
            by_key.entry(key).or_default().push((ts, j));
        }
        for records in by_key.values_mut() {
            records.sort_unstable();
        }
        by_key
    }

    /// Every pair of a left and a right record of one key whose timestamps
    /// are at most the interval apart, bounds included; sorted.
    fn expected(&self) -> Vec<Pair> {
        let right = self.right_by_key();
        let mut pairs = Vec::new();
        for i in 0..self.records {
            let (key, ts) = self.left(i);
            let Some(candidates) = right.get(&key) else {
                continue;
            };
            let (from, to) = (ts.saturating_sub(self.interval_ms), ts + self.interval_ms);
            let start = candidates.partition_point(|&(t, _)| t < from);
            for &(_, j) in candidates[start..].iter().take_while(|&&(t, _)| t <= to) {
                pairs.push(Pair {
                    key,
                    left: i,
                    right: j,
                });
            }
        }
        pairs.sort_unstable();
        pairs
    }

    fn args(&self, parallelism: u32, output: &Path, checkpoints: &Path) -> Vec<String> {
        vec![
            "join".to_string(),
            format!("--records={}", self.records),
            format!("--keys={}", self.keys),
            format!("--seed={}", self.seed),
            format!("--events-per-ms={}", self.events_per_ms),
            format!("--max-disorder={}ms", self.max_disorder_ms),
            format!("--interval={}ms", self.interval_ms),
            format!("--parallelism={parallelism}"),
            "--checkpoint-interval=100ms".to_string(),
            format!("--checkpoint-dir={}", checkpoints.display()),
            format!("--output={}", output.display()),
        ]
    }

    /// Runs the job; an argument in `extra` replaces the default of the
    /// same name.
    fn run(
        &self,
        parallelism: u32,
        extra: &[String],
        output: &Path,
        checkpoints: &Path,
    ) -> RunReport {
        common::run_overriding(self.args(parallelism, output, checkpoints), extra)
            .unwrap_or_else(|e| panic!("{self:?} p={parallelism} {extra:?}: {e}"))
    }
}

/// The committed `key,left,right` lines, sorted.
fn committed(dir: &Path) -> Vec<Pair> {
    let mut pairs: Vec<Pair> = common::committed_lines(dir)
        .into_iter()
        .map(|(name, line)| {
            let fields: Vec<u64> = line
                .split(',')
                .map(|v| {
                    v.parse()
                        .unwrap_or_else(|e| panic!("{name}: {line:?}: {e}"))
                })
                .collect();
            let [key, left, right] = fields[..] else {
                panic!("{name}: {line:?} is not key,left,right");
            };
            Pair { key, left, right }
        })
        .collect();
    pairs.sort_unstable();
    pairs
}

/// What differs between the expected and the committed pairs: missing,
/// unexpected, and committed more than once.
fn diff(expected: &[Pair], got: &[Pair]) -> String {
    let want: BTreeSet<Pair> = expected.iter().copied().collect();
    let mut have: BTreeMap<Pair, usize> = BTreeMap::new();
    for pair in got {
        *have.entry(*pair).or_default() += 1;
    }
    let missing: Vec<_> = want.iter().filter(|p| !have.contains_key(p)).collect();
    let unexpected: Vec<_> = have.keys().filter(|p| !want.contains(p)).collect();
    let duplicated: Vec<_> = have.iter().filter(|(_, &n)| n > 1).collect();
    format!(
        "{} pairs expected, {} committed\n\
         {} pairs missing, e.g. {:?}\n\
         {} pairs unexpected, e.g. {:?}\n\
         {} pairs committed more than once (pair, times), e.g. {:?}",
        expected.len(),
        got.len(),
        missing.len(),
        &missing[..missing.len().min(8)],
        unexpected.len(),
        &unexpected[..unexpected.len().min(8)],
        duplicated.len(),
        &duplicated[..duplicated.len().min(8)],
    )
}

/// The committed output is exactly the expected pairs, each once.
fn assert_exact(output: &Path, expected: &[Pair], context: &str) {
    let got = committed(output);
    if got != expected {
        panic!("{context}: the output differs\n{}", diff(expected, &got));
    }
}

/// The committed output is some of the expected pairs, each at most once,
/// and not all of them. Returns how many.
fn assert_partial(output: &Path, expected: &[Pair], context: &str) -> usize {
    let got = committed(output);
    let want: BTreeSet<Pair> = expected.iter().copied().collect();
    for (n, pair) in got.iter().enumerate() {
        if !want.contains(pair) || (n > 0 && got[n - 1] == *pair) {
            panic!(
                "{context}: {pair:?} is not a pair, or is committed twice\n{}",
                diff(expected, &got)
            );
        }
    }
    assert!(
        got.len() < expected.len(),
        "{context}: every pair was already committed"
    );
    got.len()
}

/// The expected output is worth testing: every key pairs, there are many
/// pairs, pairs lie exactly at both bounds of the interval, and
/// records of one key one millisecond outside it exist (and must not pair).
fn assert_expectations_are_interesting(spec: &Spec, expected: &[Pair]) {
    let keys: BTreeSet<u64> = expected.iter().map(|p| p.key).collect();
    assert_eq!(keys.len() as u64, spec.keys, "{spec:?}: a key has no pair");
    assert!(
        expected.len() as u64 >= spec.records / 2,
        "{spec:?}: only {} pairs",
        expected.len()
    );
    let gap = |p: &Pair| spec.right(p.right).1 as i64 - spec.left(p.left).1 as i64;
    let x = spec.interval_ms as i64;
    assert!(expected.iter().any(|p| gap(p) == x), "{spec:?}: none at +X");
    assert!(
        expected.iter().any(|p| gap(p) == -x),
        "{spec:?}: none at -X"
    );
    assert!(
        expected.iter().all(|p| gap(p).abs() <= x),
        "{spec:?}: the test's own pairs are wrong"
    );
    // Left records with a right record of their key just outside the
    // interval, at either side.
    let right = spec.right_by_key();
    let just_outside = (0..spec.records)
        .filter(|&i| {
            let (key, ts) = spec.left(i);
            right.get(&key).is_some_and(|r| {
                r.iter()
                    .any(|&(t, _)| t == ts + spec.interval_ms + 1 || t + spec.interval_ms + 1 == ts)
            })
        })
        .count();
    assert!(just_outside > 100, "{spec:?}: {just_outside} near misses");
}

/// Both sources read all their records, and the join's buffers are empty
/// at the end of a bounded run.
fn assert_report_of_a_complete_run(spec: &Spec, report: &RunReport, context: &str) {
    let by_source: Vec<(&str, u64)> = report
        .records_in_by_source
        .iter()
        .map(|(uid, n)| (uid.as_str(), *n))
        .collect();
    if report.restarts == 0 {
        assert_eq!(report.records_in, 2 * spec.records, "{context}");
        assert_eq!(
            by_source,
            [("left", spec.records), ("right", spec.records)],
            "{context}"
        );
    } else {
        // Replays after a restore count again.
        assert!(report.records_in >= 2 * spec.records, "{context}");
        assert_eq!(by_source.len(), 2, "{context}: {by_source:?}");
        assert!(
            by_source.iter().all(|(_, n)| *n >= spec.records),
            "{context}: {by_source:?}"
        );
    }
    assert_eq!(report.join_buffered_at_end, 0, "{context}");
    assert_eq!(report.late_records, 0, "{context}: no record is late");
}

/// In one worker at p=1 and p=3, and with every subtask index on a worker
/// of its own (`--local-workers`, channels between them over loopback TCP)
/// at p=2 and p=3: the same output.
fn exact_at_p1_and_p3_and_across_workers(spec: Spec) {
    let expected = spec.expected();
    assert_expectations_are_interesting(&spec, &expected);
    for (parallelism, workers) in [(1, 0), (3, 0), (2, 2), (3, 3)] {
        let (output, checkpoints) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let flag = [format!("--local-workers={workers}")];
        let report = spec.run(parallelism, &flag, output.path(), checkpoints.path());
        common::assert_links_used(&report, workers, &format!("{flag:?}"));
        let context = format!("{spec:?} p={parallelism} {flag:?}");
        assert_eq!(report.restarts, 0, "{context}");
        assert_report_of_a_complete_run(&spec, &report, &context);
        assert_eq!(
            report.pairs_emitted,
            expected.len() as u64,
            "{context}: pairs_emitted"
        );
        assert_exact(output.path(), &expected, &context);
        common::assert_no_uncommitted_files(output.path(), &context);
        // What `--json` prints: the sources by uid.
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(
            json["records_in_by_source"],
            serde_json::json!({"left": spec.records, "right": spec.records}),
            "{context}"
        );
        assert_eq!(json["pairs_emitted"], expected.len() as u64, "{context}");
        assert_eq!(json["join_buffered_at_end"], 0, "{context}");
    }
}

#[test]
fn pairs_within_20ms_are_exact_at_p1_and_p3_and_across_workers() {
    exact_at_p1_and_p3_and_across_workers(JOIN);
}

#[test]
fn pairs_at_an_interval_of_0_are_exact_at_p1_and_p3_and_across_workers() {
    exact_at_p1_and_p3_and_across_workers(TIGHT);
}

/// The inputs the kill tests cycle through, by seed: smaller, and with the
/// interval of every other seed narrower.
fn killed_spec(seed: u64) -> Spec {
    let spec = JOIN.with_records(30_000).with_seed(seed);
    match seed % 2 {
        0 => spec,
        _ => spec.with_interval(5),
    }
}

/// A join subtask slowed: which of the two at p=2 follows the seed.
fn slow_subtask(seed: u64) -> [String; 2] {
    [
        format!("--slow-subtask={}", seed % 2),
        "--slow-ns=4000".to_string(),
    ]
}

/// Seeds `seeds` at p=2 with three seeded kills each and `extra`, the join
/// slowed in the seeds `slow` picks: every pair is committed exactly once,
/// at least one restart happened, the join's buffers end empty, no
/// uncommitted file is left, and checkpoint storage holds only the retained
/// checkpoint. Returns the reports.
fn kills(seeds: std::ops::Range<u64>, extra: &[&str], slow: fn(u64) -> bool) -> Vec<RunReport> {
    let mut reports = Vec::new();
    for seed in seeds {
        let spec = killed_spec(seed);
        let (output, checkpoints) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut args = vec![
            "--inject-failures=3".to_string(),
            // A second without the kills, a checkpoint every 50 ms: kills
            // come after completed checkpoints even on a loaded machine.
            format!("--rate={}", spec.records),
            "--checkpoint-interval=50ms".to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        if slow(seed) {
            args.extend(slow_subtask(seed));
        }
        let report = spec.run(2, &args, output.path(), checkpoints.path());
        let context = format!("{spec:?} {args:?}");
        assert!(report.restarts >= 1, "{context}: no failure was injected");
        assert_report_of_a_complete_run(&spec, &report, &context);
        let expected = spec.expected();
        assert!(
            report.pairs_emitted >= expected.len() as u64,
            "{context}: {} pairs emitted",
            report.pairs_emitted
        );
        assert_exact(output.path(), &expected, &context);
        common::assert_no_uncommitted_files(output.path(), &context);
        let storage = CheckpointStorage::open(
            checkpoints.path().to_str().unwrap(),
            job_id(Topology::Join.job_name()),
        )
        .unwrap();
        let kept = storage::assert_storage_is_exactly_the_retained_checkpoints(&storage, &context);
        assert_eq!(kept.len(), 1, "{context}");
        reports.push(report);
    }
    let restored: u64 = reports.iter().map(|r| r.restored_bytes).sum();
    assert!(
        restored > 0,
        "{extra:?}: no kill came after a completed checkpoint"
    );
    reports
}

const UNALIGNED: &str = "--mode=unaligned";
const ROCKSDB: [&str; 2] = ["--state=rocksdb", "--incremental"];

fn odd(seed: u64) -> bool {
    seed % 2 == 1
}

fn always(_: u64) -> bool {
    true
}

/// Some restore replayed in-flight batches of an unaligned checkpoint.
fn assert_inflight_replayed(reports: &[RunReport]) {
    let replayed: u64 = reports.iter().map(|r| r.restored_inflight_batches).sum();
    assert!(replayed > 0, "no restore replayed in-flight batches");
}

#[test]
fn heap_aligned_kills_are_exactly_once() {
    kills(0..5, &[], odd);
}

/// Unaligned, with a join subtask slow so that barriers overtake full
/// channels of both inputs.
#[test]
fn heap_unaligned_kills_with_a_slow_join_are_exactly_once() {
    assert_inflight_replayed(&kills(5..10, &[UNALIGNED], always));
}

#[test]
fn rocksdb_incremental_aligned_kills_are_exactly_once() {
    kills(10..15, &ROCKSDB, odd);
}

#[test]
fn rocksdb_incremental_unaligned_kills_with_a_slow_join_are_exactly_once() {
    assert_inflight_replayed(&kills(
        15..20,
        &[&ROCKSDB[..], &[UNALIGNED]].concat(),
        always,
    ));
}

/// Subtask 0 and subtask 1 of every operator on workers of their own: half
/// the channels of both inputs cross loopback TCP.
const ACROSS_WORKERS: &str = "--local-workers=2";

#[test]
fn heap_unaligned_kills_across_workers_with_a_slow_join_are_exactly_once() {
    assert_inflight_replayed(&kills(20..23, &[UNALIGNED, ACROSS_WORKERS], always));
}

#[test]
fn rocksdb_incremental_aligned_kills_across_workers_are_exactly_once() {
    kills(23..25, &[&ROCKSDB[..], &[ACROSS_WORKERS]].concat(), odd);
}

const CHILD: &str = "TIDEMARK_JOIN_SIGKILL_CHILD_ARGS";

/// The child's entry point for the SIGKILL test; a no-op when the tests run
/// normally.
#[test]
fn child_runs_the_job() {
    common::run_child_job(CHILD);
}

#[test]
fn a_killed_process_resumes_its_join_from_the_latest_checkpoint_exactly_once() {
    // About 2 pairs per record, 2 s at the rate below.
    let spec = Spec {
        keys: 200,
        ..JOIN.with_records(100_000).with_seed(99)
    };
    let expected = spec.expected();
    let (output, checkpoints) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut args = spec.args(2, output.path(), checkpoints.path());
    args.push("--rate=50000".into());
    common::kill_then_restore_latest(CHILD, &args, output.path(), checkpoints.path(), || {
        assert_partial(output.path(), &expected, "after SIGKILL");
    });
    assert_exact(
        output.path(),
        &expected,
        "after SIGKILL and --restore latest",
    );
    common::assert_no_uncommitted_files(output.path(), "after --restore latest");
}

/// Stops `spec` at p=2 with a savepoint while records wait in the join's
/// buffers, then restores it at each of `targets`, each from its own copy
/// of the savepoint and of the output, into a new checkpoint directory: the
/// output of every restored run is exact.
fn savepoint_at_p2_restores_at(spec: Spec, state: &[&str], targets: &[u32]) {
    let expected = spec.expected();
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let (output, savepoints) = (root.join("output"), root.join("savepoints"));
    let state: Vec<String> = state.iter().map(|s| s.to_string()).collect();
    let mut first = state.clone();
    first.extend([
        // A second per side: the savepoint falls inside the run.
        format!("--rate={}", spec.records),
        format!("--savepoint-dir={}", savepoints.display()),
        "--stop-with-savepoint-after=300ms".to_string(),
    ]);
    let stopped = spec.run(2, &first, &output, &root.join("checkpoints"));
    assert!(
        stopped.records_in < 2 * spec.records,
        "the job ended before the savepoint"
    );
    let savepoint = PathBuf::from(stopped.savepoint.expect("the savepoint completed"));
    let context = format!("{spec:?} {state:?}");
    let partial = assert_partial(&output, &expected, &format!("{context} at the savepoint"));
    for &p in targets {
        let (copy, out) = (
            root.join(format!("savepoint-{p}")),
            root.join(format!("out-{p}")),
        );
        copy_tree(&savepoint, &copy);
        copy_tree(&output, &out);
        let mut again = state.clone();
        again.push(format!("--restore={}", copy.display()));
        let restored = spec.run(p, &again, &out, &root.join(format!("checkpoints-{p}")));
        let context = format!(
            "{context}: savepoint at p=2 ({partial} of {} pairs committed, {:?} records read), \
             restored at p={p}",
            expected.len(),
            stopped.records_in_by_source,
        );
        assert!(restored.restored_bytes > 0, "{context}: nothing restored");
        assert!(
            restored.records_in < 2 * spec.records,
            "{context}: the restored run read everything again"
        );
        assert_eq!(restored.join_buffered_at_end, 0, "{context}");
        assert_exact(&out, &expected, &context);
        // What the stopped run's subtasks pre-committed is committed, by
        // the subtask of the same index or, for one gone at p=1, adopted;
        // what a gone subtask wrote after the savepoint stays hidden.
        assert_nothing_pending(&out, &context);
        if p >= 2 {
            common::assert_no_uncommitted_files(&out, &context);
        }
    }
}

/// No pre-committed file is left uncommitted in `dir`.
fn assert_nothing_pending(dir: &Path, context: &str) {
    let pending: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(".pending-"))
        .collect();
    assert!(
        pending.is_empty(),
        "{context}: pre-committed files never committed: {pending:?}"
    );
}

#[test]
fn a_savepoint_at_p2_restores_at_p1_and_p3_exactly() {
    savepoint_at_p2_restores_at(JOIN.with_records(60_000).with_seed(7), &[], &[1, 3]);
}

#[test]
fn a_savepoint_at_p2_on_rocksdb_restores_at_p3_exactly() {
    savepoint_at_p2_restores_at(
        JOIN.with_records(60_000).with_seed(8).with_interval(10),
        &ROCKSDB,
        &[3],
    );
}

/// `--stop-with-savepoint-after` takes a savepoint, "commits the sinks and
/// stops": what the sinks pre-committed for the savepoint is visible once
/// the run returns, without a restore, and nothing came after it.
#[test]
fn a_stop_with_a_savepoint_commits_what_the_sinks_pre_committed_for_it() {
    for seed in 30..34 {
        let spec = JOIN.with_records(60_000).with_seed(seed);
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        let (output, savepoints) = (root.join("output"), root.join("savepoints"));
        let stopped = spec.run(
            2,
            &[
                format!("--rate={}", spec.records),
                format!("--savepoint-dir={}", savepoints.display()),
                "--stop-with-savepoint-after=300ms".to_string(),
            ],
            &output,
            &root.join("checkpoints"),
        );
        let savepoint = stopped.savepoint.expect("the savepoint completed");
        assert_partial(&output, &spec.expected(), "after the stop");
        assert_nothing_pending(&output, &format!("{spec:?}: stopped at {savepoint}"));
        // The sources emitted nothing after the savepoint's barrier, so the
        // sinks hold nothing beyond what the savepoint committed.
        common::assert_no_uncommitted_files(&output, &format!("{spec:?}: after the stop"));
    }
}
