//! The cost of the wire: wordcount at p=4 over 100,000 keys with every
//! subtask in one process, against the same job over 2 workers in this
//! process (`--local-workers=2`: half the channels cross loopback TCP,
//! encoded once per batch, credit-based) and over 2 worker processes
//! (`--workers=2`: the same links, and the driver's commands and the
//! workers' reports over gRPC), with checkpoints off and every second; the
//! worker processes again with mutual TLS on the links and gRPC (against
//! the same over plain TCP), for wordcount and for the interval join
//! (`run join`, 100,000 keys, a tenth of the records); and
//! the time from a failure to the restored attempt running: a killed
//! subtask in one process, a killed worker in this process (all its
//! subtasks, its link ends closed), and a SIGKILLed worker process, which
//! is launched again and reads its state before records flow again.
//!
//! cargo bench --bench workers
//!
//! Each run is a child process of its own and the configurations are
//! interleaved over the repetitions, so that a noisy neighbour hits all
//! alike. `TIDEMARK_BENCH_RECORDS` and `TIDEMARK_BENCH_REPS` change the size.

mod common;

use common::{child_runs, env_or, median, run_in_child};

/// A configuration: its job, its name, the arguments that differ,
/// whether it runs over mutual TLS, and the configuration its throughput
/// is compared with (the same in one worker; over TLS, the same over
/// plain TCP).
struct Config {
    job: Job,
    name: &'static str,
    args: &'static [&'static str],
    tls: bool,
    baseline: usize,
}

/// The topology a configuration runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Job {
    Wordcount,
    /// The interval join, on a tenth of the records (it is slower).
    Join,
}

impl Job {
    fn args(self, records: u64) -> Vec<String> {
        let (topology, records) = match self {
            Job::Wordcount => ("wordcount", records),
            Job::Join => ("join", records / 10),
        };
        [
            topology,
            &format!("--records={records}"),
            "--keys=100000",
            "--parallelism=4",
        ]
        .map(str::to_string)
        .to_vec()
    }
}

const CONFIGS: [Config; 15] = [
    Config {
        job: Job::Wordcount,
        name: "1 worker, checkpoints off",
        args: &["--local-workers=0", "--checkpoint-interval=off"],
        tls: false,
        baseline: 0,
    },
    Config {
        job: Job::Wordcount,
        name: "2 workers, checkpoints off",
        args: &["--local-workers=2", "--checkpoint-interval=off"],
        tls: false,
        baseline: 0,
    },
    Config {
        job: Job::Wordcount,
        name: "2 worker processes, checkpoints off",
        args: &["--workers=2", "--checkpoint-interval=off"],
        tls: false,
        baseline: 0,
    },
    Config {
        job: Job::Wordcount,
        name: "1 worker, 1 s checkpoints",
        args: &["--local-workers=0", "--checkpoint-interval=1s"],
        tls: false,
        baseline: 3,
    },
    Config {
        job: Job::Wordcount,
        name: "2 workers, 1 s checkpoints",
        args: &["--local-workers=2", "--checkpoint-interval=1s"],
        tls: false,
        baseline: 3,
    },
    Config {
        job: Job::Wordcount,
        name: "2 worker processes, 1 s checkpoints",
        args: &["--workers=2", "--checkpoint-interval=1s"],
        tls: false,
        baseline: 3,
    },
    Config {
        job: Job::Wordcount,
        name: "1 worker, 1 s checkpoints, a subtask killed",
        args: &[
            "--local-workers=0",
            "--checkpoint-interval=1s",
            "--inject-failures=1",
        ],
        tls: false,
        baseline: 6,
    },
    Config {
        job: Job::Wordcount,
        name: "2 workers, 1 s checkpoints, a worker killed",
        args: &[
            "--local-workers=2",
            "--checkpoint-interval=1s",
            "--inject-failures=1",
        ],
        tls: false,
        baseline: 6,
    },
    Config {
        job: Job::Wordcount,
        name: "2 worker processes, 1 s checkpoints, one SIGKILLed",
        args: &[
            "--workers=2",
            "--checkpoint-interval=1s",
            "--inject-failures=1",
        ],
        tls: false,
        baseline: 6,
    },
    Config {
        job: Job::Wordcount,
        name: "2 worker processes over TLS, checkpoints off",
        args: &["--workers=2", "--checkpoint-interval=off"],
        tls: true,
        baseline: 2,
    },
    Config {
        job: Job::Wordcount,
        name: "2 worker processes over TLS, 1 s checkpoints",
        args: &["--workers=2", "--checkpoint-interval=1s"],
        tls: true,
        baseline: 5,
    },
    Config {
        job: Job::Join,
        name: "join: 2 worker processes, checkpoints off",
        args: &["--workers=2", "--checkpoint-interval=off"],
        tls: false,
        baseline: 11,
    },
    Config {
        job: Job::Join,
        name: "join: 2 worker processes over TLS, checkpoints off",
        args: &["--workers=2", "--checkpoint-interval=off"],
        tls: true,
        baseline: 11,
    },
    Config {
        job: Job::Join,
        name: "join: 2 worker processes, 1 s checkpoints",
        args: &["--workers=2", "--checkpoint-interval=1s"],
        tls: false,
        baseline: 13,
    },
    Config {
        job: Job::Join,
        name: "join: 2 worker processes over TLS, 1 s checkpoints",
        args: &["--workers=2", "--checkpoint-interval=1s"],
        tls: true,
        baseline: 13,
    },
];

/// What one run measured.
struct Run {
    config: usize,
    m_records_per_s: f64,
    checkpoint_p50_ms: f64,
    link_bytes_per_record: f64,
    /// From the supervisor hearing of the failure to the restored attempt
    /// running (with worker processes: every worker reported its subtasks
    /// started); 0 without a failure.
    recovery_p50_ms: f64,
}

fn main() {
    if child_runs() {
        return;
    }
    let records = env_or("TIDEMARK_BENCH_RECORDS", 150_000_000);
    let reps = env_or("TIDEMARK_BENCH_REPS", 3).max(1);
    let pki = tempfile::tempdir().expect("a temporary directory");
    let tls = tidemark_testkit::pki::TestCa::new(pki.path(), "bench").flags("bench");
    let mut runs: Vec<Run> = Vec::new();
    for _ in 0..reps {
        for (config, c) in CONFIGS.iter().enumerate() {
            let mut args = c.job.args(records);
            args.extend(c.args.iter().map(|a| a.to_string()));
            if c.tls {
                args.extend(tls.iter().cloned());
            }
            let run = run_in_child(&args);
            runs.push(Run {
                config,
                m_records_per_s: run.number("/throughput_rps") / 1e6,
                checkpoint_p50_ms: run.number("/checkpoint_duration_ms/p50"),
                link_bytes_per_record: run.number("/link_bytes_sent") / run.number("/records_in"),
                recovery_p50_ms: run.number("/recovery_ms/p50"),
            });
        }
    }
    let of = |config: usize, pick: fn(&Run) -> f64| {
        median(
            runs.iter()
                .filter(|r| r.config == config)
                .map(pick)
                .collect(),
        )
    };
    println!(
        "p=4, 100,000 keys, wordcount {records} records, join {} records, median of {reps} runs",
        records / 10
    );
    println!(
        "| configuration | M records/s | vs the same in 1 process (over TLS: over TCP) | checkpoint p50 ms | link bytes per record | recovery p50 ms |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for (config, c) in CONFIGS.iter().enumerate() {
        let rps = of(config, |r| r.m_records_per_s);
        let recovery = of(config, |r| r.recovery_p50_ms);
        let recovery = if c.args.iter().any(|a| a.starts_with("--inject-failures")) {
            format!("{recovery:.1}")
        } else {
            "-".to_owned()
        };
        println!(
            "| {} | {rps:.2} | {:.2} | {:.1} | {:.2} | {recovery} |",
            c.name,
            rps / of(c.baseline, |r| r.m_records_per_s),
            of(config, |r| r.checkpoint_p50_ms),
            of(config, |r| r.link_bytes_per_record),
        );
    }
}
