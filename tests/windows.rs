//! The windows topology end to end: per key and event-time window counts
//! (tumbling, sliding, session) checked line for line against what this file
//! computes from the generator's definition, with its own window assignment
//! and session merging. Every window of every key is committed exactly once,
//! with its exact count: at parallelism 1 and 3, under injected kills on heap
//! and incremental RocksDB state, aligned and unaligned, after a SIGKILL of
//! the process and `--restore latest`, and across a savepoint taken at p=2
//! while windows are open and restored at p=1 and p=3.

use tidemark_testkit as common;
#[cfg(feature = "postgres")]
use tidemark_testkit::postgres;
use tidemark_testkit::storage;

use common::{copy_tree, splitmix64};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use tidemark::storage::CheckpointStorage;
use tidemark_actors::runtime::job_id;
use tidemark_cli::{RunReport, Topology};

/// Window lengths in ms.
#[derive(Clone, Copy, Debug)]
enum Window {
    Tumbling(i64),
    Sliding(i64, i64),
    Session(i64),
}

impl Window {
    fn flag(self) -> String {
        match self {
            Window::Tumbling(size) => format!("--window=tumbling:{size}ms"),
            Window::Sliding(size, slide) => format!("--window=sliding:{size}ms/{slide}ms"),
            Window::Session(gap) => format!("--window=session:{gap}ms"),
        }
    }
}

/// One windows job's input and windows.
#[derive(Clone, Copy, Debug)]
struct Spec {
    records: u64,
    keys: u64,
    seed: u64,
    events_per_ms: u64,
    max_disorder_ms: u64,
    window: Window,
}

/// 100 keys over 10 s of event time in 1 s windows.
const TUMBLING: Spec = Spec {
    records: 100_000,
    keys: 100,
    seed: 1,
    events_per_ms: 10,
    max_disorder_ms: 80,
    window: Window::Tumbling(1000),
};

/// 50 keys over 6 s of event time, a window of 1 s every 300 ms (3 or 4
/// windows per record, the first ones starting before 0).
const SLIDING: Spec = Spec {
    records: 60_000,
    keys: 50,
    seed: 2,
    events_per_ms: 10,
    max_disorder_ms: 120,
    window: Window::Sliding(1000, 300),
};

/// 20 keys, each with a record every 20 ms on average, sessions closed by
/// 40 ms of inactivity: many sessions per key, and a disorder of 60 ms makes
/// late-arriving records bridge sessions that were apart. One record per ms
/// of event time: a source never emits a record after a watermark that
/// already closed a session the record would touch (with several records
/// per ms, one lagging by the whole disorder could follow its bucket's
/// first in another batch, and whether it merges with a session ending at
/// its timestamp would depend on timing).
const SESSION: Spec = Spec {
    records: 40_000,
    keys: 20,
    seed: 3,
    events_per_ms: 1,
    max_disorder_ms: 60,
    window: Window::Session(40),
};

impl Spec {
    fn with_seed(self, seed: u64) -> Spec {
        Spec { seed, ..self }
    }

    fn with_records(self, records: u64) -> Spec {
        Spec { records, ..self }
    }

    /// Record i: (key, timestamp), as the brief of the topology defines it.
    fn record(&self, i: u64) -> (u64, u64) {
        let s = self.seed.wrapping_add(i);
        let key = splitmix64(s) % self.keys;
        let lag = splitmix64(s.wrapping_add(0x9E37_79B9_7F4A_7C15)) % (self.max_disorder_ms + 1);
        (key, (i / self.events_per_ms).saturating_sub(lag))
    }

    /// The windows of every key with their counts, sorted.
    fn expected(&self) -> Vec<Line> {
        let mut counts: HashMap<(u64, i64, i64), u64> = HashMap::new();
        let mut sessions: HashMap<u64, Vec<i64>> = HashMap::new();
        for i in 0..self.records {
            let (key, ts) = self.record(i);
            let ts = i64::try_from(ts).unwrap();
            let (size, slide) = match self.window {
                Window::Tumbling(size) => (size, size),
                Window::Sliding(size, slide) => (size, slide),
                Window::Session(_) => {
                    sessions.entry(key).or_default().push(ts);
                    continue;
                }
            };
            // The windows [n * slide, n * slide + size) that hold ts.
            let first = (ts - size).div_euclid(slide) + 1;
            let last = ts.div_euclid(slide);
            for n in first..=last {
                *counts
                    .entry((key, n * slide, n * slide + size))
                    .or_default() += 1;
            }
        }
        if let Window::Session(gap) = self.window {
            for (key, mut stamps) in sessions {
                stamps.sort_unstable();
                // (start, end, count) of the session being built.
                let mut open: Option<(i64, i64, u64)> = None;
                for ts in stamps {
                    open = match open {
                        // [ts, ts + gap) overlaps or touches [start, end).
                        Some((start, end, n)) if ts <= end => {
                            Some((start, end.max(ts + gap), n + 1))
                        }
                        closed => {
                            if let Some((start, end, n)) = closed {
                                counts.insert((key, start, end), n);
                            }
                            Some((ts, ts + gap, 1))
                        }
                    };
                }
                let (start, end, n) = open.unwrap();
                counts.insert((key, start, end), n);
            }
        }
        let mut lines: Vec<Line> = counts
            .into_iter()
            .map(|((key, start, end), count)| Line {
                key,
                start,
                end,
                count,
            })
            .collect();
        lines.sort_unstable();
        lines
    }

    fn args(&self, parallelism: u32, output: &Path, checkpoints: &Path) -> Vec<String> {
        vec![
            "windows".to_string(),
            format!("--records={}", self.records),
            format!("--keys={}", self.keys),
            format!("--seed={}", self.seed),
            format!("--events-per-ms={}", self.events_per_ms),
            format!("--max-disorder={}ms", self.max_disorder_ms),
            self.window.flag(),
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

/// One output line: `key,window_start,window_end,count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Line {
    key: u64,
    start: i64,
    end: i64,
    count: u64,
}

impl Line {
    fn window(&self) -> (u64, i64, i64) {
        (self.key, self.start, self.end)
    }
}

/// The committed `key,window_start,window_end,count` lines, sorted.
fn committed(dir: &Path) -> Vec<Line> {
    let mut lines: Vec<Line> = common::committed_lines(dir)
        .into_iter()
        .map(|(name, line)| {
            let fields: Vec<&str> = line.split(',').collect();
            let [key, start, end, count] = fields[..] else {
                panic!("{name}: {line:?} is not key,window_start,window_end,count");
            };
            let parse = |what: &str, v: &str| -> i64 {
                v.parse()
                    .unwrap_or_else(|e| panic!("{name}: {what} of {line:?}: {e}"))
            };
            Line {
                key: key.parse().unwrap(),
                start: parse("start", start),
                end: parse("end", end),
                count: u64::try_from(parse("count", count)).unwrap(),
            }
        })
        .collect();
    lines.sort_unstable();
    lines
}

/// What differs between the expected and the committed lines, by window:
/// missing, unexpected, emitted more than once, or with another count.
fn diff(expected: &[Line], got: &[Line]) -> String {
    let want: HashMap<_, _> = expected.iter().map(|l| (l.window(), l.count)).collect();
    let mut have: BTreeMap<(u64, i64, i64), Vec<u64>> = BTreeMap::new();
    for line in got {
        have.entry(line.window()).or_default().push(line.count);
    }
    let mut missing: Vec<_> = expected
        .iter()
        .filter(|l| !have.contains_key(&l.window()))
        .collect();
    missing.sort_unstable();
    let (mut unexpected, mut duplicated, mut wrong) = (Vec::new(), Vec::new(), Vec::new());
    for (window, counts) in &have {
        match want.get(window) {
            None => unexpected.push((window, counts)),
            Some(_) if counts.len() > 1 => duplicated.push((window, counts)),
            Some(&n) if counts[0] != n => wrong.push((window, n, counts[0])),
            Some(_) => {}
        }
    }
    let sum = |lines: &[Line]| lines.iter().map(|l| l.count).sum::<u64>();
    format!(
        "{} lines expected, {} committed; counts sum to {} expected, {} committed\n\
         {} windows missing, e.g. {:?}\n\
         {} windows unexpected (key, start, end) [counts], e.g. {:?}\n\
         {} windows emitted more than once, e.g. {:?}\n\
         {} windows with another count (window, expected, committed), e.g. {:?}",
        expected.len(),
        got.len(),
        sum(expected),
        sum(got),
        missing.len(),
        &missing[..missing.len().min(8)],
        unexpected.len(),
        &unexpected[..unexpected.len().min(8)],
        duplicated.len(),
        &duplicated[..duplicated.len().min(8)],
        wrong.len(),
        &wrong[..wrong.len().min(8)],
    )
}

/// The committed output is exactly the expected lines.
fn assert_exact(output: &Path, expected: &[Line], context: &str) {
    let got = committed(output);
    if got != expected {
        panic!("{context}: the output differs\n{}", diff(expected, &got));
    }
}

/// The committed output is some of the expected lines, each at most once,
/// and not all of them: windows were still open.
fn assert_partial(output: &Path, expected: &[Line], context: &str) -> usize {
    let got = committed(output);
    let mut rest: HashMap<Line, u32> = expected.iter().map(|l| (*l, 1)).collect();
    for line in &got {
        match rest.get_mut(line) {
            Some(n) if *n > 0 => *n -= 1,
            _ => panic!(
                "{context}: {line:?} is not a final result, or is committed twice\n{}",
                diff(expected, &got)
            ),
        }
    }
    assert!(
        got.len() < expected.len(),
        "{context}: every window was already committed"
    );
    got.len()
}

/// The expected output is worth testing: several windows per key, and for
/// each kind what makes it what it is.
fn assert_expectations_are_interesting(spec: &Spec, expected: &[Line]) {
    let keys = expected
        .iter()
        .map(|l| l.key)
        .collect::<std::collections::BTreeSet<_>>();
    assert_eq!(
        keys.len() as u64,
        spec.keys,
        "{spec:?}: a key has no record"
    );
    assert!(
        expected.len() as u64 >= 5 * spec.keys,
        "{spec:?}: only {} windows",
        expected.len()
    );
    match spec.window {
        Window::Tumbling(_) => {}
        Window::Sliding(..) => assert!(expected.iter().any(|l| l.start < 0), "{spec:?}"),
        Window::Session(gap) => {
            assert!(
                expected.iter().any(|l| l.end - l.start > 4 * gap),
                "{spec:?}"
            );
            assert!(expected.iter().any(|l| l.count == 1), "{spec:?}");
        }
    }
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
        assert_eq!(report.records_in, spec.records);
        assert_exact(
            output.path(),
            &expected,
            &format!("{spec:?} p={parallelism} {flag:?}"),
        );
    }
}

#[test]
fn tumbling_windows_are_exact_at_p1_and_p3_and_across_workers() {
    exact_at_p1_and_p3_and_across_workers(TUMBLING);
}

#[test]
fn sliding_windows_are_exact_at_p1_and_p3_and_across_workers() {
    exact_at_p1_and_p3_and_across_workers(SLIDING);
}

#[test]
fn session_windows_are_exact_at_p1_and_p3_and_across_workers() {
    exact_at_p1_and_p3_and_across_workers(SESSION);
}

/// The window kinds the kill tests cycle through, by seed; smaller inputs,
/// slowed down so that checkpoints complete between the kills.
fn killed_spec(seed: u64) -> Spec {
    let spec = match seed % 3 {
        0 => TUMBLING.with_records(60_000),
        1 => SLIDING,
        _ => SESSION.with_records(30_000),
    };
    spec.with_seed(seed)
}

/// Seeds `seeds` at p=2 with three seeded kills each and `extra`: every
/// window is committed exactly once with its count, at least one restart
/// happened, no uncommitted file is left, and checkpoint storage holds only
/// the retained checkpoint. Returns the reports.
fn kills(seeds: std::ops::Range<u64>, extra: &[&str]) -> Vec<RunReport> {
    kills_of(seeds.map(killed_spec), extra)
}

/// [`kills`] of `specs`.
fn kills_of(specs: impl Iterator<Item = Spec>, extra: &[&str]) -> Vec<RunReport> {
    let mut reports = Vec::new();
    for spec in specs {
        let (output, checkpoints) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut args = vec![
            "--inject-failures=3".to_string(),
            // Half a second without the kills: several checkpoints.
            format!("--rate={}", spec.records * 2),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let report = spec.run(2, &args, output.path(), checkpoints.path());
        let context = format!("{spec:?} {args:?}");
        assert!(report.restarts >= 1, "{context}: no failure was injected");
        assert_exact(output.path(), &spec.expected(), &context);
        common::assert_no_uncommitted_files(output.path(), &context);
        let storage = CheckpointStorage::open(
            checkpoints.path().to_str().unwrap(),
            job_id(Topology::Windows.job_name()),
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

/// The windows of a tumbling, a sliding and a session spec appended to a
/// PostgreSQL table under three seeded kills each: every window's row is
/// committed exactly once with its count, none is left prepared.
#[cfg(feature = "postgres")]
#[test]
fn windows_appended_to_postgres_are_exact_across_kills() {
    let Some(url) = postgres::server("TIDEMARK_TEST_POSTGRES") else {
        return;
    };
    for seed in 0..3 {
        let spec = killed_spec(seed);
        let table = postgres::Table::new(&url, &format!("windows_{seed}"));
        let checkpoints = tempfile::tempdir().unwrap();
        let mut args = spec.args(2, Path::new("-"), checkpoints.path());
        args.retain(|a| !a.starts_with("--output="));
        args.push(format!("--sink={url}?table={}&mode=append", table.name));
        let kills = [
            "--inject-failures=3".into(),
            format!("--rate={}", spec.records * 2),
        ];
        let report = common::run_overriding(args, &kills).unwrap();
        let context = format!("{spec:?} into PostgreSQL");
        assert!(report.restarts >= 1, "{context}: no failure was injected");
        let mut got: Vec<Line> = table
            .rows("key, window_start, window_end, count")
            .into_iter()
            .map(|r| Line {
                key: r[0] as u64,
                start: r[1],
                end: r[2],
                count: r[3] as u64,
            })
            .collect();
        got.sort_unstable();
        let expected = spec.expected();
        assert!(got == expected, "{context}: {}", diff(&expected, &got));
        assert!(table.prepared().is_empty(), "{context}: left prepared");
    }
}

/// Unaligned, with the window operator's subtask 0 slow so that barriers
/// overtake full channels.
const UNALIGNED: [&str; 3] = ["--mode=unaligned", "--slow-subtask=0", "--slow-ns=4000"];
const ROCKSDB: [&str; 2] = ["--state=rocksdb", "--incremental"];

/// Some restore replayed in-flight batches of an unaligned checkpoint.
fn assert_inflight_replayed(reports: &[RunReport]) {
    let replayed: u64 = reports.iter().map(|r| r.restored_inflight_batches).sum();
    assert!(replayed > 0, "no restore replayed in-flight batches");
}

#[test]
fn heap_aligned_kills_are_exactly_once() {
    kills(0..5, &[]);
}

#[test]
fn heap_unaligned_kills_are_exactly_once() {
    assert_inflight_replayed(&kills(5..10, &UNALIGNED));
}

/// 100,000 keys in three 1 s windows: each window end makes about 30,000
/// timers due in each subtask, some 30 turns' worth, so that unaligned
/// barriers can come between the turns.
#[test]
fn heap_unaligned_kills_while_windows_fire_in_turns_are_exactly_once() {
    let spec = Spec {
        records: 300_000,
        keys: 100_000,
        events_per_ms: 100,
        ..TUMBLING
    };
    assert_inflight_replayed(&kills_of(
        (30..32).map(|seed| spec.with_seed(seed)),
        &UNALIGNED,
    ));
}

#[test]
fn rocksdb_incremental_aligned_kills_are_exactly_once() {
    kills(10..15, &ROCKSDB);
}

#[test]
fn rocksdb_incremental_unaligned_kills_are_exactly_once() {
    assert_inflight_replayed(&kills(15..20, &[&ROCKSDB[..], &UNALIGNED[..]].concat()));
}

/// Subtask 0 and subtask 1 of every operator on workers of their own: half
/// the channels cross loopback TCP.
const ACROSS_WORKERS: &str = "--local-workers=2";

#[test]
fn heap_unaligned_kills_across_workers_are_exactly_once() {
    assert_inflight_replayed(&kills(
        20..23,
        &[&UNALIGNED[..], &[ACROSS_WORKERS]].concat(),
    ));
}

#[test]
fn rocksdb_incremental_aligned_kills_across_workers_are_exactly_once() {
    kills(23..25, &[&ROCKSDB[..], &[ACROSS_WORKERS]].concat());
}

const CHILD: &str = "TIDEMARK_WINDOWS_SIGKILL_CHILD_ARGS";

/// The child's entry point for the SIGKILL test; a no-op when the tests run
/// normally.
#[test]
fn child_runs_the_job() {
    common::run_child_job(CHILD);
}

#[test]
fn a_killed_process_resumes_its_windows_from_the_latest_checkpoint_exactly_once() {
    let spec = SLIDING.with_records(200_000).with_seed(99);
    let expected = spec.expected();
    let (output, checkpoints) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut args = spec.args(2, output.path(), checkpoints.path());
    args.push("--rate=100000".into());
    common::kill_then_restore_latest(CHILD, &args, output.path(), checkpoints.path(), || {
        assert_partial(output.path(), &expected, "after SIGKILL");
    });
    assert_exact(
        output.path(),
        &expected,
        "after SIGKILL and --restore latest",
    );
}

/// Stops `spec` at p=2 with a savepoint while windows are open, then
/// restores it at p=1 and p=3, each from its own copy of the savepoint and
/// of the output, into a new checkpoint directory: the output of both runs
/// is exact.
fn savepoint_at_p2_restores_at_p1_and_p3(spec: Spec, flags: &[&str]) {
    let expected = spec.expected();
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let (output, savepoints) = (root.join("output"), root.join("savepoints"));
    let flags: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
    let mut first = flags.clone();
    first.extend([
        // Slow enough that the savepoint falls inside the run.
        format!("--rate={}", spec.records),
        format!("--savepoint-dir={}", savepoints.display()),
        "--stop-with-savepoint-after=300ms".to_string(),
    ]);
    let stopped = spec.run(2, &first, &output, &root.join("checkpoints"));
    assert!(
        stopped.records_in < spec.records,
        "the job ended before the savepoint"
    );
    let workers = if flags.iter().any(|f| f == ACROSS_WORKERS) {
        2
    } else {
        0
    };
    common::assert_links_used(&stopped, workers, "the run to the savepoint");
    let savepoint = PathBuf::from(stopped.savepoint.expect("the savepoint completed"));
    let context = format!("{spec:?} {flags:?}");
    let partial = assert_partial(&output, &expected, &format!("{context} at the savepoint"));
    for p in [1, 3] {
        let (copy, out) = (
            root.join(format!("savepoint-{p}")),
            root.join(format!("out-{p}")),
        );
        copy_tree(&savepoint, &copy);
        copy_tree(&output, &out);
        let mut again = flags.clone();
        again.push(format!("--restore={}", copy.display()));
        let restored = spec.run(p, &again, &out, &root.join(format!("checkpoints-{p}")));
        assert!(restored.restored_bytes > 0, "p={p}: nothing restored");
        assert!(
            restored.records_in < spec.records,
            "p={p}: the restored run read everything again"
        );
        assert_exact(
            &out,
            &expected,
            &format!("{context}: savepoint at p=2 ({} of {} windows committed, {} records read), restored at p={p}", partial, expected.len(), stopped.records_in),
        );
    }
}

#[test]
fn a_savepoint_at_p2_with_open_sessions_restores_at_p1_and_p3_exactly() {
    savepoint_at_p2_restores_at_p1_and_p3(SESSION.with_records(60_000), &[]);
}

#[test]
fn a_savepoint_at_p2_with_open_sliding_windows_on_rocksdb_restores_at_p1_and_p3_exactly() {
    savepoint_at_p2_restores_at_p1_and_p3(SLIDING.with_records(80_000), &ROCKSDB);
}

#[test]
fn a_savepoint_at_p2_with_open_tumbling_windows_restores_at_p1_and_p3_exactly() {
    savepoint_at_p2_restores_at_p1_and_p3(TUMBLING.with_records(80_000), &[]);
}

/// Taken with subtask 0 and 1 on workers of their own, restored at p=1 (one
/// worker hosts all) and at p=3 over the same two workers: placement is not
/// part of a savepoint.
#[test]
fn a_savepoint_across_workers_restores_at_p1_and_p3_exactly() {
    savepoint_at_p2_restores_at_p1_and_p3(SESSION.with_records(60_000), &[ACROSS_WORKERS]);
}
