//! What the benchmarks share: their sizes from the environment and the
//! median of repeated rounds.

/// `name` from the environment, or `default` when it is unset or not a number.
pub fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The middle of repeated rounds; not every bench repeats them.
#[allow(dead_code)]
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// This process's peak resident memory (VmHWM), in MiB.
#[allow(dead_code)]
pub fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// Set in a child process that runs one configuration: its arguments to
/// `tidemark run`, separated by newlines.
#[allow(dead_code)]
const CHILD_ARGS: &str = "TIDEMARK_BENCH_CHILD_ARGS";

/// What one run in a child process measured.
#[allow(dead_code)]
pub struct ChildRun {
    /// The run's report (`tidemark run --json`).
    pub report: serde_json::Value,
    /// The child's peak resident memory, MiB.
    pub peak_rss_mib: f64,
}

#[allow(dead_code)]
impl ChildRun {
    /// A number of the report, by its JSON pointer (`/checkpoint_duration_ms/p50`).
    pub fn number(&self, pointer: &str) -> f64 {
        self.report
            .pointer(pointer)
            .and_then(serde_json::Value::as_f64)
            .unwrap_or_else(|| panic!("no number at {pointer} in the report"))
    }
}

/// Runs `tidemark run ARGS` in a child process of this bench, so that peak
/// memory (VmHWM) belongs to one configuration. Checkpoints go to a fresh
/// temporary directory, and so does RocksDB's working directory.
#[allow(dead_code)]
pub fn run_in_child(args: &[String]) -> ChildRun {
    let exe = std::env::current_exe().expect("own path");
    let out = std::process::Command::new(exe)
        .env(CHILD_ARGS, args.join("\n"))
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("the child runs");
    assert!(out.status.success(), "tidemark run {args:?} failed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let (report, rss) = stdout
        .trim()
        .rsplit_once('\n')
        .expect("a report and a peak");
    ChildRun {
        report: serde_json::from_str(report).expect("a JSON report"),
        peak_rss_mib: rss.parse().expect("a peak in MiB"),
    }
}

/// In a child that [`run_in_child`] started: runs its configuration,
/// prints the report and the peak memory, and returns true. A child's
/// `--workers` launch this bench again as `worker`: that serves as one.
#[allow(dead_code)]
pub fn child_runs() -> bool {
    if std::env::args().nth(1).as_deref() == Some("worker") {
        use tidemark_cli::{worker, Cli, Command};
        let Command::Worker(args) = Cli::try_parse_from(std::env::args())
            .expect("worker arguments")
            .command
        else {
            unreachable!("the subcommand is `worker`")
        };
        worker::worker(&args).expect("the worker serves");
        return true;
    }
    let Ok(args) = std::env::var(CHILD_ARGS) else {
        return false;
    };
    let checkpoints = tempfile::tempdir().expect("a temporary directory");
    let state = tempfile::tempdir().expect("a temporary directory");
    let mut args: Vec<String> = args.lines().map(str::to_owned).collect();
    args.push(format!("--checkpoint-dir={}", checkpoints.path().display()));
    if args.iter().any(|a| a == "--state=rocksdb") {
        args.push(format!("--state-dir={}", state.path().display()));
    }
    let args = tidemark_cli::RunArgs::parse(args).expect("valid arguments");
    let report = tidemark_cli::run(&args).expect("the job runs");
    println!(
        "{}",
        serde_json::to_string(&report).expect("a report serializes")
    );
    println!("{}", peak_rss_mib());
    true
}

/// Runs `stream` into a discarding sink to its end: records/s.
#[allow(dead_code)]
pub fn into_discard<T: tidemark::Data>(stream: tidemark::Stream<T>) -> f64 {
    use tidemark_actors::prelude::*;
    stream
        .sink("discard", |_| tidemark_actors::sinks::Discard)
        .build()
        .run()
        .expect("the job starts")
        .wait()
        .expect("the job runs")
        .throughput()
}

/// The keys of the source benches' records: record i has
/// `splitmix64(i) % 1,000,000`, as the generator draws them.
#[allow(dead_code)]
pub fn key(i: u64) -> u64 {
    tidemark::model::rng::splitmix64(i) % 1_000_000
}

/// Writes `records` JSON lines `{"key": K}` of [`key`] into 8 files in
/// `dir`, record i into file i mod 8.
#[allow(dead_code)]
pub fn write_json_lines(dir: &std::path::Path, records: u64) {
    use std::io::Write;
    for f in 0..8 {
        let file = std::fs::File::create(dir.join(format!("{f}.jsonl"))).expect("a file");
        let mut out = std::io::BufWriter::new(file);
        for i in (f..records).step_by(8) {
            writeln!(out, "{{\"key\":{}}}", key(i)).expect("written");
        }
        out.flush().expect("flushed");
    }
}
