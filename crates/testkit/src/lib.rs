//! What the end-to-end tests check the committed output of the example
//! topologies against, computed here from the generators' definitions,
//! independently of the runtime; and the output, checkpoint and child
//! process helpers they share. Each test binary uses a part of it.
//!
//! The test kit of the whole product: the facade's end-to-end tests and the
//! command line's tests depend on it, instead of including its files.

pub mod pki;
pub mod postgres;
pub mod storage;
pub mod zookeeper;

use std::collections::HashMap;
use std::path::Path;

/// SplitMix64, written out again so that the tests do not trust the
/// runtime's copy.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `count` records `(key, ts)` made from `seed`: keys `k0`..`k36`, event
/// times rising from `start` over `span` ms, each up to 40 ms early.
pub fn timed_records(seed: u64, count: u64, start: u64, span: u64) -> Vec<(String, u64)> {
    (0..count)
        .map(|i| {
            let r = splitmix64(seed + i);
            let ts = (start + i * span / count).saturating_sub(r % 41);
            (format!("k{}", r % 37), ts)
        })
        .collect()
}

/// Every pair of a left and a right record of one key at most `interval`
/// ms apart, bounds included, as join's `key,left ts,right ts` lines,
/// sorted.
pub fn expected_pairs(
    left: &[(String, u64)],
    right: &[(String, u64)],
    interval: u64,
) -> Vec<String> {
    let mut right_by_key: HashMap<&str, Vec<u64>> = HashMap::new();
    for (key, ts) in right {
        right_by_key.entry(key).or_default().push(*ts);
    }
    let mut pairs = Vec::new();
    for (key, ts) in left {
        for r in right_by_key.get(key.as_str()).into_iter().flatten() {
            if r.abs_diff(*ts) <= interval {
                pairs.push(format!("{key},{ts},{r}"));
            }
        }
    }
    pairs.sort_unstable();
    pairs
}

/// Runs `args` (and `stop`) until a savepoint under `root/savepoints` 300
/// ms in, before all `records` were read, then restores it at
/// `parallelism`, with checkpoints under `root/restored`, to the end.
pub fn rescale_from_savepoint(
    args: &[String],
    stop: &[String],
    root: &Path,
    parallelism: u32,
    records: u64,
) {
    let mut stop = stop.to_vec();
    stop.extend([
        format!("--savepoint-dir={}", root.join("savepoints").display()),
        "--stop-with-savepoint-after=300ms".into(),
    ]);
    let stopped = run_overriding(args.to_vec(), &stop).unwrap();
    assert!(stopped.records_in < records, "the job stopped early");
    let savepoint = stopped.savepoint.expect("the savepoint completed");
    let restore = [
        format!("--parallelism={parallelism}"),
        format!("--restore={savepoint}"),
        format!("--checkpoint-dir={}", root.join("restored").display()),
    ];
    run_overriding(args.to_vec(), &restore).unwrap_or_else(|e| panic!("p=2 → {parallelism}: {e}"));
}

/// The arguments of `topology` over records with event times up to 40 ms
/// early, at p=2 with checkpoints under `root/checkpoints` every 50 ms,
/// output into `output`, and two failures injected over `records`
/// records; `sources` and the topology's own flags come after.
pub fn event_time_args(topology: &str, root: &Path, output: &Path, records: u64) -> Vec<String> {
    vec![
        topology.to_owned(),
        "--max-disorder=40ms".into(),
        "--parallelism=2".into(),
        "--checkpoint-interval=50ms".into(),
        format!("--checkpoint-dir={}", root.join("checkpoints").display()),
        format!("--output={}", output.display()),
        format!("--records={records}"),
        "--rate=20000".into(),
        "--inject-failures=2".into(),
    ]
}

/// Join's committed lines under `output` are `expected`, each once, and
/// nothing uncommitted is left.
pub fn assert_pairs_exactly_once(output: &Path, expected: &[String], context: &str) {
    let mut got: Vec<String> = committed_lines(output)
        .into_iter()
        .map(|(_, line)| line)
        .collect();
    got.sort_unstable();
    assert!(
        got == expected,
        "{context}: {} pairs, expected {}",
        got.len(),
        expected.len()
    );
    assert_no_uncommitted_files(output, context);
}

pub fn expected_counts(records: u64, keys: u64, seed: u64) -> HashMap<u64, u64> {
    let mut counts = HashMap::new();
    for i in 0..records {
        *counts
            .entry(splitmix64(seed.wrapping_add(i)) % keys)
            .or_insert(0) += 1;
    }
    counts
}

/// Runs `tidemark run` with `args` to its successful end; a failure
/// panics naming the arguments.
pub fn run(args: &[String]) -> tidemark_cli::RunReport {
    let context = format!("{args:?}");
    run_overriding(args.to_vec(), &[]).unwrap_or_else(|e| panic!("{context}: {e}"))
}

/// Runs `tidemark run` with `args`, each argument of `extra` replacing the
/// one of the same name.
pub fn run_overriding(
    mut args: Vec<String>,
    extra: &[String],
) -> Result<tidemark_cli::RunReport, tidemark_cli::CliError> {
    let name = |arg: &str| arg.split('=').next().unwrap_or_default().to_owned();
    args.retain(|a| !extra.iter().any(|e| name(e) == name(a)));
    args.extend_from_slice(extra);
    tidemark_cli::run(&tidemark_cli::RunArgs::parse(&args).unwrap())
}

/// Runs `base` (a topology and its flags) with its checkpoints under
/// `checkpoints` and its output in `output`; a flag of `extra` replaces the
/// one of the same name.
pub fn run_in(
    base: &[&str],
    checkpoints: &Path,
    output: &Path,
    extra: &[String],
) -> Result<tidemark_cli::RunReport, tidemark_cli::CliError> {
    let mut args: Vec<String> = base.iter().map(|s| s.to_string()).collect();
    args.push(format!("--checkpoint-dir={}", checkpoints.display()));
    args.push(format!("--output={}", output.display()));
    run_overriding(args, extra)
}

/// Lines of the committed files (those directly in `dir` whose names do
/// not start with `.` or `_`), each with its file's name.
pub fn committed_lines(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        if name.starts_with('.') || name.starts_with('_') {
            continue;
        }
        for line in std::fs::read_to_string(entry.path()).unwrap().lines() {
            out.push((name.clone(), line.to_owned()));
        }
    }
    out
}

/// wordcount's committed `key,count` lines.
pub fn committed(dir: &Path) -> Vec<(u64, u64)> {
    committed_lines(dir)
        .into_iter()
        .map(|(_, line)| {
            let (k, c) = line.split_once(',').expect("key,count");
            (k.parse().unwrap(), c.parse().unwrap())
        })
        .collect()
}

/// Nothing uncommitted (hidden) is left in the output directory `dir`.
pub fn assert_no_uncommitted_files(dir: &Path, context: &str) {
    let leftovers: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(
        leftovers.is_empty(),
        "{context}: uncommitted files left: {leftovers:?}"
    );
}

/// A test binary that SIGKILLs a job runs itself again as the job's
/// process: its test `child_runs_the_job` calls this, which runs the
/// `tidemark run` arguments in the environment variable `var`, if set.
pub fn run_child_job(var: &str) {
    if let Ok(args) = std::env::var(var) {
        let args: Vec<String> = args.split('\n').map(str::to_owned).collect();
        let args = tidemark_cli::RunArgs::parse(args).unwrap();
        tidemark_cli::run(&args).unwrap();
    }
}

/// This test binary again, running `args` in its `child_runs_the_job`.
pub fn spawn_child_job(var: &str, args: &[String]) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_runs_the_job", "--nocapture"])
        .env(var, args.join("\n"))
        .spawn()
        .unwrap()
}

/// Runs the job of `args` in a child process (this test binary's
/// `child_runs_the_job`, through `var`), SIGKILLs it once a checkpoint in
/// `checkpoints` has completed and `output` holds committed lines, calls
/// `after_kill`, then runs the job again with `--restore=latest` to its
/// successful end.
pub fn kill_then_restore_latest(
    var: &str,
    args: &[String],
    output: &Path,
    checkpoints: &Path,
    after_kill: impl FnOnce(),
) {
    let committed = || !committed_lines(output).is_empty();
    kill_when_committed_then_restore_latest(var, args, checkpoints, committed, after_kill);
}

/// [`kill_then_restore_latest`] for a sink whose committed output
/// `committed` tells apart (a table, say).
pub fn kill_when_committed_then_restore_latest(
    var: &str,
    args: &[String],
    checkpoints: &Path,
    committed: impl Fn() -> bool,
    after_kill: impl FnOnce(),
) {
    use std::time::{Duration, Instant};
    let mut child = spawn_child_job(var, args);
    let deadline = Instant::now() + Duration::from_secs(60);
    while completed_checkpoints(checkpoints) == 0 || !committed() {
        assert!(
            Instant::now() < deadline,
            "no checkpoint completed within a minute"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the job ended before it could be killed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    after_kill();
    let mut resumed = args.to_vec();
    resumed.push("--restore=latest".into());
    let status = spawn_child_job(var, &resumed).wait().unwrap();
    assert!(status.success(), "the restored run failed");
}

/// Checkpoints with `_metadata` anywhere below `dir`.
pub fn completed_checkpoints(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .map(|p| match p.is_dir() {
            true => completed_checkpoints(&p),
            false => usize::from(p.ends_with("_metadata")),
        })
        .sum()
}

/// With `--emit updates`, exactly once means every key's counts are exactly
/// 1..=c(key): no duplicate, no gap, no stranger.
pub fn assert_updates_exactly_once(dir: &Path, records: u64, keys: u64, seed: u64, context: &str) {
    assert_counts_exactly_once(committed(dir), records, keys, seed, context);
}

/// [`assert_updates_exactly_once`] over the `(key, count)` updates of any
/// sink.
pub fn assert_counts_exactly_once(
    updates: Vec<(u64, u64)>,
    records: u64,
    keys: u64,
    seed: u64,
    context: &str,
) {
    let expected = expected_counts(records, keys, seed);
    let mut seen: HashMap<u64, Vec<u64>> = HashMap::new();
    for (k, c) in updates {
        seen.entry(k).or_default().push(c);
    }
    assert_eq!(seen.len(), expected.len(), "{context}: keys in the output");
    for (key, mut counts) in seen {
        counts.sort_unstable();
        let want: Vec<u64> = (1..=expected[&key]).collect();
        if counts != want {
            let dups = counts.windows(2).filter(|w| w[0] == w[1]).count();
            panic!(
                "{context}: key {key} has {} counts for {} records ({dups} duplicates)",
                counts.len(),
                want.len()
            );
        }
    }
}

/// Copies a directory tree, so that each restore works on its own copy: a
/// restored job checkpoints into its directory and may subsume, or a test
/// delete, the original.
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_tree(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

/// Bytes crossed TCP links between workers if, and only if, the run was
/// spread over more than one (`--local-workers`).
pub fn assert_links_used(report: &tidemark_cli::RunReport, workers: u32, context: &str) {
    assert_eq!(
        report.link_bytes_sent > 0,
        workers > 1,
        "{context}: {} bytes crossed links",
        report.link_bytes_sent
    );
}
